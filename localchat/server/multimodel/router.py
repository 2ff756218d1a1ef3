"""The ASGI front of a several-model server: `/v1/models` lists every configured model, `/metrics`
reports every loaded one under its `model_name` label, and a POST to the generation endpoints goes
to the single-model app of the engine its `model` names (its `keep_alive`, if any, is read here)."""

from __future__ import annotations

import asyncio
import hmac
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from localchat import __version__
from localchat.errors import InvalidParameterError, LocalchatError
from localchat.server.keep_alive import parse_keep_alive
from localchat.server.metrics import MultiModelMetrics
from localchat.server.multimodel.pool import UNSET, EnginePool
from localchat.server.request_guard import (
    BodyTooLarge,
    ClientGone,
    read_body,
    replay,
    send_too_large,
)

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict]]
Send = Callable[[dict], Awaitable[None]]
ROUTED = (
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
    "/tokenize",
    "/detokenize",
    "/v1/messages",
    "/v1/messages/count_tokens",
    "/v1/responses",
)
ANTHROPIC = "/v1/messages"  # Anthropic's error shape on these paths
STORED = "/v1/responses/"  # stored responses, shared by every model's app
# a body this big or bigger is decoded in a thread, so the event loop keeps serving the others
THREAD_DECODE_BYTES = 64 << 10


class _Target(msgspec.Struct):
    """The two fields the router reads of a body; the rest is skipped (the model's app decodes
    it)."""

    model: Any = None
    keep_alive: Any = None


class ModelRouter:
    def __init__(
        self,
        pool: EnginePool,
        api_key: str | None = None,
        stored: Any = None,
        metrics_without_key: bool = False,
    ):
        """`stored` serves GET and DELETE /v1/responses/... (an ASGI app on the store that
        every model's app keeps its responses in); `metrics_without_key` opens /metrics."""
        self.pool, self.api_key, self.stored = pool, api_key, stored
        self.metrics_without_key = metrics_without_key
        self.created = int(time.time())
        self.metrics = MultiModelMetrics(
            lambda: [e.server.metrics for e in pool.loaded.values() if e.server is not None],
            self._pool_families,
        )

    def _pool_families(self):
        loaded = GaugeMetricFamily(
            "localchat_models_loaded", "Engines loaded now.", value=len(self.pool.loaded)
        )
        evictions = CounterMetricFamily(
            "localchat_model_unloads",
            "Engines unloaded (evicted or past keep_alive).",
            value=self.pool.evictions,
        )
        memory = GaugeMetricFamily(
            "localchat_model_memory_bytes",
            "Estimated memory of each loaded engine (weights and KV cache).",
            labels=["model_name"],
        )
        for name, entry in self.pool.loaded.items():
            memory.add_metric([name], entry.memory_bytes)
        return [loaded, evictions, memory]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        path, method = scope["path"], scope["method"]
        open_metrics = self.metrics_without_key and method == "GET" and path == "/metrics"
        if not open_metrics and not self._authorized(scope):
            return await _json(send, 401, _error("invalid or missing API key", 401, path=path))
        if method == "GET" and path == "/v1/models":
            return await _json(send, 200, {"object": "list", "data": self._cards()})
        if method == "GET" and path.startswith("/v1/models/"):
            card = next((c for c in self._cards() if c["id"] == path[len("/v1/models/") :]), None)
            missing = _error(f"the model {path[11:]!r} does not exist", 404, "model")
            return await _json(send, 200, card) if card else await _json(send, 404, missing)
        if method == "GET" and path == "/health":
            return await _json(send, 200, {"status": "ok"})
        if method == "GET" and path == "/version":
            return await _json(send, 200, {"version": __version__})
        if method == "GET" and path == "/metrics":
            return await _send(send, 200, self.metrics.render(), CONTENT_TYPE_LATEST.encode())
        if method in ("GET", "DELETE") and path.startswith(STORED) and self.stored is not None:
            return await self.stored(scope, receive, send)
        if method != "POST" or path not in ROUTED:
            return await _json(send, 404, _error(f"no route {method} {path}", 404))
        try:
            body = await read_body(scope, receive)
        except BodyTooLarge:
            return await send_too_large(scope, send)
        except ClientGone:
            return
        try:
            name, keep_alive = await _target_of(body, self.pool.names[0])
            entry = await self.pool.acquire(name, keep_alive)
        except LocalchatError as exc:
            status = exc.http_status
            return await _json(send, status, _error(exc.message, status, exc.param, path))
        try:
            await entry.app(scope, replay(body, receive), send)
        finally:
            await self.pool.release(entry)

    def _authorized(self, scope: Scope) -> bool:
        if self.api_key is None:
            return True
        headers = dict(scope.get("headers") or [])
        given = headers.get(b"authorization", b"")
        key = self.api_key.encode()
        return hmac.compare_digest(given, b"Bearer " + key) or (  # Anthropic's header too
            scope["path"].startswith(ANTHROPIC)
            and hmac.compare_digest(headers.get(b"x-api-key", b""), key)
        )

    def _cards(self) -> list[dict]:
        now = time.monotonic()
        cards = []
        for name in self.pool.names:
            entry = self.pool.loaded.get(name)
            card = {"id": name, "object": "model", "created": self.created, "owned_by": "localchat"}
            card["loaded"] = entry is not None
            keep = self.pool.keep_alive[name]
            card["keep_alive_seconds"] = keep  # null: stays loaded
            if entry is not None:
                card["max_model_len"] = entry.engine.model_info.max_model_len
                card["idle_seconds"] = round(now - entry.last_used, 1) if not entry.active else 0
                card["memory_bytes"] = entry.memory_bytes
                unloads = self.pool.unloads_in(entry, now)
                card["unloads_in_seconds"] = None if unloads is None else round(unloads, 1)
                card["busy"] = entry.active > 0
            cards.append(card)
        return cards


def _error(message: str, status: int, param: str | None = None, path: str = "") -> dict:
    from localchat.server.errors import error_body

    body = error_body(message, status, param=param)
    if path.startswith(ANTHROPIC):
        from localchat.server.anthropic.errors import anthropic_body

        return anthropic_body(body, status)
    return body


async def _target_of(body: bytes, default: str) -> tuple[Any, Any]:
    """The model a request names (`default` when none) and its keep_alive (UNSET when none); a
    large body is decoded in a thread."""
    try:
        if len(body) >= THREAD_DECODE_BYTES:
            target = await asyncio.to_thread(msgspec.json.decode, body or b"{}", type=_Target)
        else:
            target = msgspec.json.decode(body or b"{}", type=_Target)
    except (msgspec.DecodeError, RecursionError):
        raise InvalidParameterError("the body is not a JSON object") from None
    raw = target.keep_alive
    keep_alive = UNSET if raw is None else parse_keep_alive(raw)
    return target.model or default, keep_alive


async def _json(send: Send, status: int, payload: dict) -> None:
    await _send(send, status, json.dumps(payload).encode(), b"application/json")


async def _send(send: Send, status: int, body: bytes, content_type: bytes) -> None:
    headers = [(b"content-type", content_type), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
