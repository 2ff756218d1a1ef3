"""`localchat serve --speculative-config`: the official openai client gets the same greedy text,
streamed or not, and /metrics counts drafted and kept tokens."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.serve_process import serve_process

pytestmark = pytest.mark.slow

SPEC = '{"method": "ngram", "num_speculative_tokens": 4}'
PROMPT = (
    "Repeat this code exactly:\n\ndef area(width, height):\n    if width < 0 or height < 0:\n"
    "        raise ValueError('negative size')\n    return width * height\n"
)


def reply(client: openai.OpenAI, stream: bool) -> str:
    params = dict(
        model="SmolLM2-135M-Instruct",
        messages=[{"role": "user", "content": PROMPT}],
        temperature=0,
        max_tokens=60,
    )
    if not stream:
        return client.chat.completions.create(**params).choices[0].message.content or ""
    chunks = client.chat.completions.create(**params, stream=True)
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def metric(base_url: str, name: str) -> float:
    for line in httpx.get(f"{base_url}/metrics").text.splitlines():
        if line.startswith(name + "_total"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in /metrics")


def test_speculative_serve_answers_as_without(tmp_path, default_gguf):
    texts = {}
    for label, extra in (("plain", []), ("spec", ["--speculative-config", SPEC])):
        args = ["--max-model-len", "512", "--kv-cache-memory", "64MiB", "--threads", "1", *extra]
        with serve_process(tmp_path / f"{label}.log", *args, timeout=180) as server:
            client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="none")
            texts[label] = (reply(client, stream=False), reply(client, stream=True))
            if label == "spec":
                drafted = metric(server.base_url, "localchat_spec_decode_num_draft_tokens")
                kept = metric(server.base_url, "localchat_spec_decode_num_accepted_tokens")
                assert drafted > 0 and 0 < kept <= drafted
    assert texts["spec"] == texts["plain"]
    assert texts["plain"][0] == texts["plain"][1] and "width" in texts["plain"][0]
