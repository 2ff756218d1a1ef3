"""OpenAI-style server-sent events: `data: {json}` lines, ending with `data: [DONE]`.

The one definition of the end marker: the client reads it with `sse_chunk`, the server writes
`DONE_EVENT`.
"""

from __future__ import annotations

import json

DONE = "[DONE]"
DONE_EVENT = f"data: {DONE}\n\n".encode()


def sse_chunk(line: str) -> dict | str | None:
    """The JSON chunk carried by one SSE line, DONE at the end of the stream, None for any other
    line."""
    if not line.startswith("data:"):
        return None
    data = line[5:].strip()
    return DONE if data == DONE else json.loads(data)
