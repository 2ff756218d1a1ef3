"""Serve an ASGI app with uvicorn on a socket the command already bound: `serve` and
`serve --models` start the same way, with the same connection limits (ConnectionLimits)."""

from __future__ import annotations

import asyncio
import signal
import socket
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from localchat import envs

if TYPE_CHECKING:
    import uvicorn

HEAD_MAX_BYTES = 16 << 10  # a request line and headers larger than this are a 400 (h11's default)


@dataclass(frozen=True)
class ConnectionLimits:
    """What one client can hold of the server (docs/security.md).

    `max_connections`: open connections (and requests) at once; beyond it uvicorn answers 503.
    `header_timeout`: seconds a connection has to send a whole request line and headers, from
    when it opens or sends the first byte of its next request; then it is closed.
    `body_timeout`: seconds a request has to send its whole body; then 408.
    `keep_alive_timeout`: seconds an idle kept-alive connection stays open.
    """

    max_connections: int = 2048
    header_timeout: float = envs.HEADER_TIMEOUT.default
    body_timeout: float = envs.BODY_TIMEOUT.default
    keep_alive_timeout: int = 5


def socket_url(sock: socket.socket) -> str:
    """http://HOST:PORT of a bound socket (an IPv6 host in brackets)."""
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def uvicorn_server(
    app: Any,
    *,
    log_level: str,
    grace_period: float,
    limits: ConnectionLimits | None = None,
) -> uvicorn.Server:
    """A uvicorn server for `app` (our own access log; no lifespan) under `limits`. Built before
    the command logs that it is serving, so that the log line is followed by the listening socket
    at once."""
    import uvicorn

    limits = limits or ConnectionLimits()
    config = uvicorn.Config(
        body_deadline(app, limits.body_timeout),
        log_config=None,
        access_log=False,
        log_level=log_level,
        timeout_graceful_shutdown=grace_period,  # type: ignore[arg-type]  # a float works
        lifespan="off",
        http=_head_timed_protocol(limits.header_timeout),
        limit_concurrency=limits.max_connections,
        timeout_keep_alive=limits.keep_alive_timeout,
        h11_max_incomplete_event_size=HEAD_MAX_BYTES,
    )
    return uvicorn.Server(config)


def _head_timed_protocol(timeout: float) -> type[asyncio.Protocol]:
    """uvicorn's h11 protocol with a deadline on each request's head (uvicorn has none: a client
    trickling its headers would hold the connection for good)."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class HeadTimedH11(H11Protocol):
        _head_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._head_timer = self.loop.call_later(timeout, self._head_timed_out)

        def data_received(self, data: bytes) -> None:
            if self._head_timer is None and self.conn.their_state is h11.IDLE:
                self._head_timer = self.loop.call_later(timeout, self._head_timed_out)
            super().data_received(data)
            if self.conn.their_state is not h11.IDLE:
                self._stop_head_timer()

        def connection_lost(self, exc: Exception | None) -> None:
            self._stop_head_timer()
            super().connection_lost(exc)

        def _stop_head_timer(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_timed_out(self) -> None:
            self._head_timer = None
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                self.transport.close()

    return HeadTimedH11


def body_deadline(app: Any, timeout: float) -> Any:
    """ASGI middleware: a POST, PUT or PATCH body is read here, whole, before the app sees it: it
    must arrive within `timeout` seconds (else 408 and the connection is closed) and hold at most
    MAX_BODY_BYTES (else 413, nothing more read). The app then reads it at once, and waits on the
    client's own receive() for a disconnect."""
    from localchat.server import request_guard as guard

    async def middleware(scope, receive, send):
        if scope["type"] != "http" or scope.get("method") not in ("POST", "PUT", "PATCH"):
            return await app(scope, receive, send)
        try:
            body = await asyncio.wait_for(guard.read_body(scope, receive), timeout)
        except guard.BodyTooLarge:
            return await guard.send_too_large(scope, send)
        except guard.ClientGone:
            return None
        except TimeoutError:
            return await _send_408(scope, send, timeout)
        await app(scope, guard.replay(body, receive), send)

    return middleware


async def _send_408(scope: Any, send: Any, timeout: float) -> None:
    import json

    from localchat.server.request_guard import error_body

    path = scope.get("path", "")
    message = f"the request body did not arrive within {timeout:g} s"
    data = json.dumps(error_body(path, message, 408, "invalid_request_error")).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(data)).encode()),
        (b"connection", b"close"),
    ]
    await send({"type": "http.response.start", "status": 408, "headers": headers})
    await send({"type": "http.response.body", "body": data})


async def serve_until_signal(server: uvicorn.Server, sock: socket.socket) -> None:
    """Serve on `sock` until SIGINT or SIGTERM."""
    # uvicorn re-raises the signal that stopped it once it is done; a no-op handler makes that a
    # clean exit
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: None)
    await server.serve(sockets=[sock])
