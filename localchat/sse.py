"""Reading OpenAI-style server-sent event streams (`data: {json}` lines ending with `data: [DONE]`)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

DONE = "[DONE]"


def sse_chunk(line: str) -> dict | str | None:
    """The JSON chunk carried by one SSE line, DONE at the end of the stream, None for any other line."""
    if not line.startswith("data:"):
        return None
    data = line[5:].strip()
    return DONE if data == DONE else json.loads(data)


def error_message(chunk: dict) -> str | None:
    """The message of an error chunk (`{"error": {...}}`), or None for a normal chunk."""
    error = chunk.get("error")
    if not error:
        return None
    return str(error.get("message", error)) if isinstance(error, dict) else str(error)


async def aiter_chunks(response) -> AsyncIterator[dict]:
    """The JSON chunks of a streamed httpx response, up to [DONE] (error chunks included)."""
    async for line in response.aiter_lines():
        chunk = sse_chunk(line)
        if chunk == DONE:
            return
        if chunk is not None:
            yield chunk
