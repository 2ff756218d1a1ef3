"""OpenAI-style error bodies {"error": {message, type, param, code}} for every failure the server
reports.

Bad input is a 4xx with a message naming the field; only a bug in the server itself is a 500. `code`
carries the HTTP status, as vLLM's server does.
"""

from __future__ import annotations

import logging

import msgspec
from litestar import Request, Response
from litestar.exceptions import (
    HTTPException,
    NotAuthorizedException,
    SerializationException,
    ValidationException,
)

from localchat.errors import LocalchatError, QueueFullError
from localchat.server.generation import ClientDisconnected

logger = logging.getLogger("localchat.server")

RETRY_AFTER_SECONDS = 1
_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    503: "service_unavailable",
}


def error_body(
    message: str, status: int, error_type: str | None = None, param: str | None = None
) -> dict:
    return {
        "error": {
            "message": message,
            "type": error_type or _TYPES.get(status, "server_error"),
            "param": param,
            "code": status,
        }
    }


def error_from_exception(exc: BaseException) -> tuple[dict, int]:
    """The body and status for any exception (the same in a JSON response and in a stream's error
    chunk)."""
    if isinstance(exc, LocalchatError):
        return error_body(exc.message, exc.http_status, exc.error_type, exc.param), exc.http_status
    if isinstance(exc, ValidationException):
        return _validation_error(exc), 400
    if isinstance(exc, ClientDisconnected):
        return error_body("the client disconnected", 499, "client_closed_request"), 499
    if isinstance(exc, RecursionError) or _caused_by(exc, RecursionError):
        # msgspec decodes a body's free-form fields (a tool's parameters, a JSON schema) by
        # recursion: a body nested thousands deep ends it
        return error_body("the request body nests too deep", 400), 400
    if isinstance(exc, HTTPException):
        status = exc.status_code
        message = exc.detail
        if status == 400 and _caused_by_bad_json(exc):
            message = f"the request body is not valid JSON: {exc.detail}"
        return error_body(message, status), status
    logger.error("internal error", exc_info=exc)
    return error_body(f"internal server error: {type(exc).__name__}", 500, "server_error"), 500


def validation_problem(exc: ValidationException) -> tuple[str | None, str] | None:
    """The field of a body that failed decoding (its path, e.g. `messages[0].content[1].text`;
    None for the body as a whole) and what is wrong with it; None when Litestar says nothing."""
    problems = exc.extra if isinstance(exc.extra, list) else []
    if not problems:
        return None
    key, message = problems[0].get("key"), problems[0].get("message", "")
    missing = None
    if message.startswith("Object missing required field") and "`" in message:
        missing = message.split("`")[1]
    if key == "data":  # the body as a whole: not an object, or a field missing
        return missing, message
    return (f"{key}.{missing}" if missing and key else key), message


def _validation_error(exc: ValidationException) -> dict:
    problem = validation_problem(exc)
    if problem is None:
        return error_body(str(exc.detail), 400)
    field, message = problem
    if field is None:
        return error_body(f"the request body must be a JSON object: {message}", 400)
    if field.isidentifier() and message.startswith("Object missing"):
        return error_body(message, 400, param=field)
    return error_body(f"invalid value for {field!r}: {message}", 400, param=field)


def _caused_by(exc: BaseException, kinds: type | tuple[type, ...]) -> bool:
    seen = exc.__cause__ or exc.__context__
    while seen is not None:
        if isinstance(seen, kinds):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _caused_by_bad_json(exc: BaseException) -> bool:
    return _caused_by(exc, (msgspec.DecodeError, SerializationException))


def error_response(exc: BaseException) -> Response:
    body, status = error_from_exception(exc)
    headers = {"Retry-After": str(RETRY_AFTER_SECONDS)} if isinstance(exc, QueueFullError) else None
    if isinstance(exc, NotAuthorizedException):
        headers = {"WWW-Authenticate": "Bearer"}
    return Response(body, status_code=status, headers=headers)


def handle_exception(request: Request, exc: Exception) -> Response:
    """Litestar exception handler for everything: the OpenAI error shape, never Litestar's own."""
    if isinstance(exc, HTTPException) and exc.status_code in (404, 405):
        exc.detail = f"{exc.detail}: {request.method} {request.url.path}"
    return error_response(exc)
