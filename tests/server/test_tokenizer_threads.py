"""The event loop tokenizes while the engine thread encodes prompts and steps DecodeStreams: neither
may disturb the other (a shared Rust tokenizer can fail with "Already borrowed" or mix up state)."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from .conftest import API_KEY

pytestmark = pytest.mark.slow
AUTH = {"Authorization": f"Bearer {API_KEY}"}
ANIMALS = ["cat", "dog", "fox", "owl", "bee", "cow", "elk", "yak"]
PROMPTS = [f"Story {i}: once upon a time, a {animal} " for i, animal in enumerate(ANIMALS)]
PARAMS = {"max_tokens": 20, "temperature": 0, "ignore_eos": True}
HAMMER_TEXT = "Tokenizers are shared state; é, ü and 日本語 take several bytes. " * 8


async def _stream_text(client: httpx.AsyncClient, prompt: str) -> str:
    text = ""
    async with client.stream(
        "POST", "/v1/completions", json={"prompt": prompt, "stream": True, **PARAMS}
    ) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                text += json.loads(line[6:])["choices"][0]["text"]
    return text


async def _hammer(client: httpx.AsyncClient, expected: list[int], done: asyncio.Event) -> int:
    """/tokenize, /tokenize with messages and /detokenize in a loop until `done`; returns the rounds
    made."""
    rounds = 0
    messages = [{"role": "user", "content": HAMMER_TEXT}]
    while not done.is_set():
        tokens = (
            await client.post("/tokenize", json={"prompt": HAMMER_TEXT, "return_token_strs": True})
        ).json()
        assert tokens["tokens"] == expected and len(tokens["token_strs"]) == len(expected)
        chat = await client.post("/tokenize", json={"messages": messages})
        assert chat.status_code == 200 and chat.json()["count"] > len(expected)
        text = (await client.post("/detokenize", json={"tokens": expected})).json()["prompt"]
        assert text == HAMMER_TEXT
        rounds += 1
    return rounds


async def test_tokenize_hammered_while_16_streams_decode(http, base_url, wait_idle):
    # 16 streams: each of the 8 prompts twice, each checked against that prompt run alone
    solo = [
        http.post("/v1/completions", json={"prompt": p, **PARAMS}).json()["choices"][0]["text"]
        for p in PROMPTS
    ]
    expected = http.post("/tokenize", json={"prompt": HAMMER_TEXT}).json()["tokens"]
    done = asyncio.Event()
    limits = httpx.Limits(max_connections=32)
    async with httpx.AsyncClient(
        base_url=base_url, headers=AUTH, timeout=120, limits=limits
    ) as client:
        hammers = [asyncio.create_task(_hammer(client, expected, done)) for _ in range(2)]
        try:
            streamed = await asyncio.gather(*(_stream_text(client, p) for p in PROMPTS * 2))
        finally:
            done.set()
            rounds = await asyncio.gather(*hammers)
    assert streamed == solo * 2
    assert sum(rounds) >= 2  # the hammering overlapped the decoding
    wait_idle()
