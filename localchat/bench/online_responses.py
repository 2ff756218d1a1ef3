"""OpenAI's Responses API, streamed (POST /v1/responses, `store: false`): the prompt as the input
text; `response.output_text.delta` is a token's arrival, the final `response.completed` (or
`response.incomplete`, when max_output_tokens cut the reply) carries the usage. `ignore_eos`
(localchat's extension, as vLLM's) asks for max_output_tokens tokens; a server without it may stop
a reply at end-of-sequence."""

from __future__ import annotations

from typing import Any

from localchat.bench.online_text import TEXT, TextProtocol
from localchat.bench.records import RequestRecord
from localchat.client import APIError

_FINAL = ("response.completed", "response.incomplete")


def body(model: str | None, prompt: str, max_tokens: int) -> dict[str, Any]:
    return {
        "model": model,
        "input": prompt,
        "max_output_tokens": max_tokens,
        "temperature": 0.0,
        "stream": True,
        "store": False,
        "ignore_eos": True,
    }


def read(event: dict[str, Any], record: RequestRecord) -> str | None:
    kind = event.get("type")
    if kind == "response.output_text.delta":
        return TEXT if event.get("delta") else None
    if kind in _FINAL:
        usage = event["response"]["usage"]
        record.num_output_tokens = usage["output_tokens"]
        record.prompt_len = usage["input_tokens"]  # cached tokens included
    elif kind in ("error", "response.failed"):
        error = event.get("response", {}).get("error") or event
        raise APIError(0, str(error.get("message", event))[:300], error.get("code"))
    return None


PROTOCOL = TextProtocol("/v1/responses", body, read)
