"""Reading OpenAI-style server-sent event streams (`data: {json}` lines ending with `data: [DONE]`)."""

from __future__ import annotations

import json

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
