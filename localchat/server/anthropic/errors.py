"""Anthropic's error shape, `{"type": "error", "error": {"type", "message"}}`, for every failure of
the Messages routes (the status and message are the server's usual ones, the field named at the
start of the message), and their API key check: `x-api-key` or `Authorization: Bearer`."""

from __future__ import annotations

import hmac

from litestar import Request, Response
from litestar.connection import ASGIConnection
from litestar.exceptions import NotAuthorizedException
from litestar.handlers import BaseRouteHandler

from localchat.errors import QueueFullError
from localchat.server.errors import error_from_exception, handle_exception

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
}


def error_type(status: int, exc: BaseException | None = None) -> str:
    if isinstance(exc, QueueFullError):
        return "overloaded_error"
    return ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")


def anthropic_body(openai_body: dict, status: int, exc: BaseException | None = None) -> dict:
    """The server's OpenAI-shaped error body in Anthropic's shape."""
    error = openai_body["error"]
    message, param = error["message"], error.get("param")
    if param and param not in message:
        message = f"{param}: {message}"
    return {"type": "error", "error": {"type": error_type(status, exc), "message": message}}


def error_event(exc: BaseException) -> dict:
    """The body of a stream's `error` event."""
    body, status = error_from_exception(exc)
    return anthropic_body(body, status, exc)


def handle_anthropic_exception(request: Request, exc: Exception) -> Response:
    """The server's usual error response (status, Retry-After, ...) with Anthropic's body."""
    response = handle_exception(request, exc)
    response.content = anthropic_body(response.content, response.status_code or 500, exc)
    return response


def require_anthropic_key(connection: ASGIConnection, _handler: BaseRouteHandler) -> None:
    """Litestar guard: with --api-key, `x-api-key: KEY` (Anthropic's header) or `Authorization:
    Bearer KEY` (what Claude Code sends with ANTHROPIC_AUTH_TOKEN), compared in constant time."""
    expected = connection.app.state.server.api_key
    if expected is None:
        return
    scheme, _, bearer = connection.headers.get("authorization", "").partition(" ")
    offered = [connection.headers.get("x-api-key", "")]
    if scheme.lower() == "bearer":
        offered.append(bearer.strip())
    if not any(hmac.compare_digest(key.encode(), expected.encode()) for key in offered):
        raise NotAuthorizedException(
            "invalid or missing API key: send 'x-api-key: <key>' or 'Authorization: Bearer <key>'"
        )
