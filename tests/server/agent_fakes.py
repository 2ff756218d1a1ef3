"""A scripted engine for the fast tests of /v1/messages and /v1/responses: the app's real code from
the request to the reply, with replies the test writes (no model)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from litestar.testing import AsyncTestClient

from localchat.engine.core.outputs import CompletionOutput, RequestOutput
from localchat.server.app import build_app
from localchat.server.state import ServerState

from .test_units import FakeEngine as FakeChatEngine

MODEL = "fake"
PROMPT = [1, 2, 3, 4]


@dataclass
class Reply:
    """What the engine answers next: text pieces (one delta each, one token each), how it ends,
    and an error after the pieces instead of an end."""

    pieces: list[str]
    finish: str = "stop"
    stop_reason: str | int | None = None
    error: Exception | None = None
    cached: int = 0


class FakeStream:
    def __init__(self, request_id: str, reply: Reply):
        self.request_id, self.reply = request_id, reply
        self.prompt_token_ids = PROMPT
        self.closed = False

    async def _deltas(self):
        reply = self.reply
        for position, text in enumerate(reply.pieces):
            last = position == len(reply.pieces) - 1 and reply.error is None
            out = CompletionOutput(
                0,
                text,
                [7],
                finish_reason=reply.finish if last else None,
                stop_reason=reply.stop_reason if last else None,
            )
            yield RequestOutput(
                self.request_id, None, PROMPT, [out], finished=last, num_cached_tokens=reply.cached
            )
        if reply.error is not None:
            raise reply.error

    def __aiter__(self):
        return self._deltas()

    async def aclose(self):
        self.closed = True


@dataclass
class FakeEngine:
    """Enough of AsyncEngine for the app. `replies` are answered in turn (the last one again when
    they run out); `rendered` keeps every conversation rendered and `params` every request's
    SamplingParams."""

    replies: list[Reply] = field(default_factory=lambda: [Reply(["Hi", "!"])])
    rendered: list[tuple[list[dict], dict]] = field(default_factory=list)
    params: list = field(default_factory=list)
    streams: list[FakeStream] = field(default_factory=list)
    tokenizer = chat_template = None
    is_ready, is_dead, error = True, False, None
    model_info = FakeChatEngine.model_info  # 64 tokens of context, EOS 0

    async def add_request(self, prompt, params, request_id):
        reply = self.replies[min(len(self.streams), len(self.replies) - 1)]
        self.params.append(params)
        stream = FakeStream(request_id, reply)
        self.streams.append(stream)
        return stream

    def render_chat(self, messages, **kwargs):
        self.rendered.append((messages, kwargs))
        return PROMPT

    def detokenize(self, token_ids, skip_special_tokens=True):
        return ""

    def stats(self):
        return None

    def replica_metrics(self):
        return ()


def client(engine: FakeEngine, api_key: str | None = None, **state) -> AsyncTestClient:
    """An in-process client of the app on `engine` (`state`: ServerState's options)."""
    return AsyncTestClient(app=build_app(ServerState(engine, MODEL, api_key, **state)))


# a Qwen3-style reply: thinking, a sentence, then a Hermes tool call (one token per piece)
THINK_CALL = Reply(
    [
        "<think>",
        "hmm",
        "</think>",
        "Sure.",
        "\n<tool_call>\n",
        '{"name": "f", ',
        '"arguments": {"a": ',
        "1}}",
        "\n</tool_call>",
    ]
)
F_SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}}
# every kind of JSON value, for the fields that expect another
WRONG_VALUES = [None, 7, -1, 0.5, "x", [], [1], {}, {"type": 1}, True]


def sse(text: str) -> list[tuple[str, dict]]:
    """(event name, data) of each server-sent event."""
    events = []
    for chunk in text.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in chunk.splitlines())
        events.append((lines["event"], json.loads(lines["data"])))
    return events


async def post(engine: FakeEngine, path: str, body: dict, **state):
    """One request to the app on `engine`."""
    async with client(engine, **state) as http:
        return await http.post(path, json=body)


def changed(base: dict, changes: dict) -> dict:
    """`base` with `changes` (a None value removes the field)."""
    body = {**base, **changes}
    return {k: v for k, v in body.items() if v is not None}


def with_field(base: dict, path: str, value) -> dict:
    """A copy of `base` with the field at `path` ("tools.0.name") set to `value`."""
    body = json.loads(json.dumps(base))
    *parents, last = path.split(".")
    node = body
    for key in parents:
        node = node[int(key)] if key.isdigit() else node[key]
    node[int(last) if last.isdigit() else last] = value
    return body
