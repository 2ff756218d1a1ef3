"""Online mode over a text endpoint: the workload's prompt as text, streamed back as events.

Each protocol (`online_messages`, `online_responses`) says where to POST, what body to send and
how to read one event: a text delta (a token's arrival, timed), the usage (output and input tokens
as the server counts them), or an error. These endpoints take text, so the server renders its
chat template around the prompt and tokenizes it again: the input tokens are the server's count,
not the workload's.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from localchat.bench.offline import Advance
from localchat.bench.records import RequestRecord
from localchat.client import APIError, AsyncClient

TEXT = "text"  # what `read` answers for an event that carried output text


@dataclass(frozen=True)
class TextProtocol:
    """One streaming text endpoint: its path, its request body and its event reader."""

    path: str  # e.g. /v1/messages
    # (model, prompt, max_tokens) -> the JSON body of a greedy streamed request
    body: Callable[[str | None, str, int], dict[str, Any]]
    # reads one event into the record (usage); TEXT for a text delta; raises APIError on an error
    read: Callable[[dict[str, Any], RequestRecord], str | None]


async def send_text(
    client: AsyncClient,
    protocol: TextProtocol,
    prompt: str,
    max_tokens: int,
    record: RequestRecord,
    advance: Advance,
) -> None:
    """One streamed request; every text delta's arrival is timed into `record` (the usage sets
    its token counts), a failure kept in `record.error`."""
    record.start = time.perf_counter()
    try:
        async for event in client.events(
            protocol.path, protocol.body(client.model, prompt, max_tokens)
        ):
            if protocol.read(event, record) == TEXT:
                record.token_times.append(time.perf_counter())
                advance(1)
    except APIError as exc:
        record.error = (f"HTTP {exc.status}: {exc.message}" if exc.status else exc.message)[:300]
        return
    except (ValueError, KeyError, TypeError) as exc:  # an event that is not the protocol's
        record.error = f"{type(exc).__name__}: {exc}"[:300]
        return
    # a reply that is only the end-of-sequence token has no text, and is no failure
    if record.num_output_tokens is None:
        record.error = "the stream ended without its usage"
