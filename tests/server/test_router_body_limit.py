"""A several-model server's router reads at most the single-model server's body limit (413 past
it, announced or streamed) and decodes a large body off the event loop (a fake pool: no model)."""

from __future__ import annotations

import asyncio
import json

from localchat.errors import ModelNotFoundError
from localchat.server.multimodel import router as router_module
from localchat.server.multimodel.router import ModelRouter
from localchat.server.request_guard import MAX_BODY_BYTES


class _Pool:
    names, loaded, keep_alive, evictions = ["m"], {}, {"m": None}, 0

    def __init__(self):
        self.asked: list = []

    async def acquire(self, name, keep_alive):
        self.asked.append((name, keep_alive))
        raise ModelNotFoundError(f"the model {name!r} does not exist", param="model")


def _scope(headers: list[tuple[bytes, bytes]]) -> dict:
    return {
        "type": "http",
        "method": "POST",
        "path": "/v1/chat/completions",
        "headers": [(b"content-type", b"application/json"), *headers],
    }


async def _call(router, scope, chunks: list[bytes]) -> tuple[int, dict, int]:
    """Status, JSON body, and how many body chunks the router asked for."""
    pending = list(chunks)
    asked = 0
    sent: list[dict] = []

    async def receive():
        nonlocal asked
        asked += 1
        if not pending:
            return {"type": "http.disconnect"}
        chunk = pending.pop(0)
        return {"type": "http.request", "body": chunk, "more_body": bool(pending)}

    async def send(message):
        sent.append(message)

    await router(scope, receive, send)
    return sent[0]["status"], json.loads(sent[1]["body"]), asked


async def test_an_announced_body_over_the_limit_is_refused_before_it_is_read():
    pool = _Pool()
    length = str(MAX_BODY_BYTES + 1).encode()
    status, body, asked = await _call(
        ModelRouter(pool), _scope([(b"content-length", length)]), [b"{}"]
    )
    assert status == 413 and str(MAX_BODY_BYTES) in body["error"]["message"]
    assert asked == 0 and pool.asked == []


async def test_a_streamed_body_over_the_limit_stops_being_read():
    pool = _Pool()
    chunk = b" " * (1 << 20)
    chunks = [chunk] * (MAX_BODY_BYTES // len(chunk) + 5)
    status, _, asked = await _call(ModelRouter(pool), _scope([]), chunks)
    assert status == 413 and asked < len(chunks) and pool.asked == []


async def test_a_large_body_is_decoded_off_the_event_loop(monkeypatch):
    threaded: list = []
    real = asyncio.to_thread

    async def to_thread(func, *args, **kwargs):
        threaded.append(func)
        return await real(func, *args, **kwargs)

    monkeypatch.setattr(router_module.asyncio, "to_thread", to_thread)
    pool = _Pool()
    big = json.dumps({"model": "x", "keep_alive": "5m", "prompt": "a" * (1 << 20)}).encode()
    status, _, _ = await _call(ModelRouter(pool), _scope([]), [big])
    assert status == 404 and pool.asked == [("x", 300.0)] and len(threaded) == 1
    small = json.dumps({"messages": []}).encode()
    status, body, _ = await _call(ModelRouter(pool), _scope([]), [small])
    assert pool.asked[-1][0] == "m" and len(threaded) == 1  # a small one is decoded in place
    status, body, _ = await _call(ModelRouter(pool), _scope([]), [b"[1, 2]"])
    assert status == 400 and "not a JSON object" in body["error"]["message"]
