"""A deterministic chat backend: scripted replies streamed word by word, fixed timings and stats."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator

from localchat.tui.backends import BackendStats, ChatBackend, ChatRequest, ReplyDelta
from localchat.tui.thinking import ThinkSplitter

CODE_REPLY = """Here is a function that adds two numbers:

```python
def add(a: int, b: int) -> int:
    return a + b
```

Call it as `add(2, 3)`."""


class FakeBackend(ChatBackend):
    """Answers with the next scripted reply (or echoes the last message); counts 1 token per 4
    characters.

    `delay` seconds pass between pieces; `hold` (an Event) makes the stream wait before each piece,
    and `stall_after=N` stops it after N pieces until it is closed, so a test can stop a reply
    midway. Every request is kept in `requests`."""

    def __init__(
        self,
        replies: list[str] | None = None,
        *,
        max_model_len: int = 4096,
        delay: float = 0.0,
        hold: asyncio.Event | None = None,
        fail: str | None = None,
        stall_after: int | None = None,
    ):
        self.model_name = "fake-model"
        self.description = "fake backend"
        self.max_model_len = max_model_len
        self.replies = list(replies or [])
        self.delay, self.hold, self.fail, self.stall_after = delay, hold, fail, stall_after
        self.requests: list[ChatRequest] = []
        self.running = 0
        self.closed = False

    async def render_prompt(self, request: ChatRequest) -> str:
        return self._text(request)

    async def count_prompt_tokens(self, request: ChatRequest) -> int:
        return len(self._text(request)) // 4

    @staticmethod
    def _text(request: ChatRequest) -> str:
        return "\n".join(f"<{m['role']}>{m['content']}" for m in request.messages) + "\n<assistant>"

    async def stream(self, request: ChatRequest) -> AsyncGenerator[ReplyDelta, None]:
        self.requests.append(request)
        if self.fail:
            raise RuntimeError(self.fail)
        reply = (
            self.replies.pop(0) if self.replies else "You said: " + request.messages[-1]["content"]
        )
        prompt_tokens = await self.count_prompt_tokens(request)
        splitter = ThinkSplitter()
        pieces = [w + " " for w in reply.split(" ")]
        pieces[-1] = pieces[-1][:-1]
        self.running += 1
        try:
            for i, piece in enumerate(pieces):
                if i == self.stall_after:
                    await asyncio.Event().wait()
                if self.hold is not None:
                    await self.hold.wait()
                await asyncio.sleep(self.delay)
                last = i == len(pieces) - 1
                thinking, text = splitter.feed(piece)
                if last:
                    rest = splitter.flush()
                    thinking, text = thinking + rest[0], text + rest[1]
                yield ReplyDelta(
                    text,
                    thinking,
                    "stop" if last else None,
                    i + 1,
                    prompt_tokens,
                    (prompt_tokens // 16) * 16,
                    0.05,
                    42.0,
                )
        finally:
            self.running -= 1

    def stats(self) -> BackendStats:
        return BackendStats(0.01, 0, self.running, 0)

    async def close(self) -> None:
        self.closed = True


def request_json(request: ChatRequest) -> str:
    return json.dumps({"messages": request.messages, "sampling": request.sampling})
