"""Serve an ASGI app with uvicorn on a socket the command already bound: `serve` and
`serve --models` start the same way."""

from __future__ import annotations

import signal
import socket
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import uvicorn


def socket_url(sock: socket.socket) -> str:
    """http://HOST:PORT of a bound socket (an IPv6 host in brackets)."""
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def uvicorn_server(app: Any, *, log_level: str, grace_period: float) -> uvicorn.Server:
    """A uvicorn server for `app` (our own access log; no lifespan). Built before the command logs
    that it is serving, so that the log line is followed by the listening socket at once."""
    import uvicorn

    config = uvicorn.Config(
        app,
        log_config=None,
        access_log=False,
        log_level=log_level,
        timeout_graceful_shutdown=grace_period,  # type: ignore[arg-type]  # a float works
        lifespan="off",
    )
    return uvicorn.Server(config)


async def serve_until_signal(server: uvicorn.Server, sock: socket.socket) -> None:
    """Serve on `sock` until SIGINT or SIGTERM."""
    # uvicorn re-raises the signal that stopped it once it is done; a no-op handler makes that a
    # clean exit
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: None)
    await server.serve(sockets=[sock])
