"""Refuse what a web page in the user's browser could send to a server on their machine.

A page cannot read a loopback server's answers unless CORS allows it, but it can still get requests
through in two ways:

- DNS rebinding: the page's own name is made to resolve to 127.0.0.1, so its requests are
  same-origin. They carry the page's name in `Host`: on a loopback bind, `HostGuard` answers 403 to
  a Host that is not localhost, 127.0.0.1 or [::1] (any port) or one of --allowed-hosts
  (CVE-2024-28224 was this in ollama).
- "Simple" cross-origin POSTs (text/plain, form bodies) that the browser sends without asking the
  server first: `require_json` answers 415 to a body that is not declared application/json, which
  a page can only send after a CORS preflight that the server refuses unless --cors-origin allows
  the page.

Errors come in the API's shape: Anthropic's on /v1/messages, OpenAI's elsewhere.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

# ASGI's three arguments, loosely: Litestar, uvicorn and our own wrappers each type them their way
Scope = Any
Receive = Any
Send = Any
ASGIApp = Callable[..., Awaitable[None]]

# the largest request body either server reads (Litestar's default, set explicitly in app.py so the
# several-model router in server/multimodel/router.py can use the same); a larger one is a 413
MAX_BODY_BYTES = 10_000_000
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
ANTHROPIC_PATH = "/v1/messages"
BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


def is_loopback(bind_host: str) -> bool:
    """Whether `--host` listens on loopback only (localhost, 127.0.0.0/8, ::1)."""
    if bind_host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(bind_host.strip("[]")).is_loopback
    except ValueError:
        return False


def host_name(host: str) -> str:
    """A Host header's name, lowercased, without its port or a trailing dot (`[::1]:8000` ->
    `::1`)."""
    host = host.strip().lower()
    if host.startswith("["):
        host = host[1:].partition("]")[0]
    elif host.count(":") == 1:
        host = host.partition(":")[0]
    return host.rstrip(".")


def allowed_hosts(bind_host: str, extra: Iterable[str] | None) -> frozenset[str] | None:
    """The Host names the server answers: the loopback names and `extra` (--allowed-hosts); None
    (any Host) on a bind beyond loopback with no --allowed-hosts, or with `*` among them."""
    names = {host_name(h) for h in extra or ()}
    if "*" in names or (not names and not is_loopback(bind_host)):
        return None
    return frozenset(LOOPBACK_NAMES | names)


def error_body(path: str, message: str, status: int, error_type: str) -> dict:
    """An error body in the shape of the API at `path`."""
    from localchat.server.errors import error_body as openai_body

    body = openai_body(message, status, error_type)
    if path.startswith(ANTHROPIC_PATH):
        from localchat.server.anthropic.errors import anthropic_body

        return anthropic_body(body, status)
    return body


async def send_error(scope: Scope, send: Send, message: str, status: int, error_type: str) -> None:
    body = json.dumps(error_body(scope.get("path", ""), message, status, error_type)).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return value.decode("latin-1")
    return None


class HostGuard:
    """ASGI middleware: 403 for an HTTP request whose Host names none of `hosts` (a request with
    no Host at all, which no browser sends, passes)."""

    def __init__(self, app: ASGIApp, hosts: frozenset[str]):
        self.app, self.hosts = app, hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            host = _header(scope, b"host")
            if host is not None and host_name(host) not in self.hosts:
                await send_error(
                    scope,
                    send,
                    f"Host {host!r} is not allowed: name this server by localhost, 127.0.0.1 or "
                    "[::1], or start it with --allowed-hosts",
                    403,
                    "permission_error",
                )
                return
        await self.app(scope, receive, send)


def guard_hosts(app: ASGIApp, hosts: frozenset[str] | None) -> ASGIApp:
    """`app` behind a HostGuard; `app` itself when `hosts` is None (any Host)."""
    return app if hosts is None else HostGuard(app, hosts)


def require_json(app: ASGIApp) -> ASGIApp:
    """ASGI middleware (a Litestar middleware factory): a POST, PUT or PATCH must say
    `Content-Type: application/json` (charset and other parameters allowed), else 415."""

    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope.get("method") in BODY_METHODS:
            content_type = _header(scope, b"content-type") or ""
            if content_type.partition(";")[0].strip().lower() != "application/json":
                await send_error(
                    scope,
                    send,
                    f"Content-Type must be application/json, got {content_type or 'none'!r}",
                    415,
                    "invalid_request_error",
                )
                return
        await app(scope, receive, send)

    return middleware


class BodyTooLarge(Exception):
    """A request body over MAX_BODY_BYTES (announced or received)."""


class ClientGone(Exception):
    """The client disconnected before its body was in."""


async def read_body(scope: Scope, receive: Receive, limit: int = MAX_BODY_BYTES) -> bytes:
    """The whole body, or BodyTooLarge as soon as its Content-Length or the bytes received pass
    `limit` (nothing more is read), or ClientGone."""
    announced = _header(scope, b"content-length")
    if announced is not None and announced.strip().isdigit() and int(announced) > limit:
        raise BodyTooLarge
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge
        chunks.append(chunk)
        if not message.get("more_body"):
            return b"".join(chunks)


def replay(body: bytes, receive: Receive) -> Receive:
    """A receive() that hands the app the body read already, then the client's own messages (a
    disconnect)."""
    sent = False

    async def replayed() -> dict:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed


async def send_too_large(scope: Scope, send: Send) -> None:
    """413 in the API's shape."""
    message = f"the request body is larger than {MAX_BODY_BYTES} bytes"
    await send_error(scope, send, message, 413, "invalid_request_error")
