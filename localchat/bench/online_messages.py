"""Anthropic's Messages API, streamed (POST /v1/messages): the prompt as one user message; a
`content_block_delta` with a `text_delta` is a token's arrival, `message_delta` carries the usage.
`ignore_eos` (localchat's extension, as vLLM's) asks for max_tokens tokens; a server without it
may stop a reply at end-of-sequence."""

from __future__ import annotations

from typing import Any

from localchat.bench.online_text import TEXT, TextProtocol
from localchat.bench.records import RequestRecord
from localchat.client import APIError


def body(model: str | None, prompt: str, max_tokens: int) -> dict[str, Any]:
    return {
        "model": model or "",
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream": True,
        "ignore_eos": True,
    }


def read(event: dict[str, Any], record: RequestRecord) -> str | None:
    kind = event.get("type")
    if kind == "content_block_delta":
        delta = event["delta"]
        return TEXT if delta.get("type") == "text_delta" and delta.get("text") else None
    if kind == "message_delta":
        usage = event["usage"]
        record.num_output_tokens = usage["output_tokens"]
        # input_tokens leaves out what the prefix cache served
        record.prompt_len = usage["input_tokens"] + (usage.get("cache_read_input_tokens") or 0)
    elif kind == "error":
        error = event.get("error") or {}
        raise APIError(0, str(error.get("message", event))[:300], error.get("type"))
    return None


PROTOCOL = TextProtocol("/v1/messages", body, read)
