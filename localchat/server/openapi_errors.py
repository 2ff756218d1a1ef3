"""The error responses the routes document in the OpenAPI schema (/docs/openapi.json): the bodies
handle_exception and the request guards send (OpenAI's shape; Anthropic's on /v1/messages), where
Litestar would document its own `{status_code, detail, extra}` for a 400, which no route sends."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

import msgspec
from litestar.handlers import HTTPRouteHandler
from litestar.openapi.datastructures import ResponseSpec

ERROR_STATUSES = {
    400: "Bad input: the message (and `param`) names the field",
    401: "A missing or wrong API key",
    403: "A Host header the server does not answer",
    404: "An unknown model or stored response",
    413: "A body over the size limit",
    415: "A body that is not application/json",
    503: "The waiting queue is full, or the engine has stopped",
}


class OpenAIErrorDetail(msgspec.Struct):
    message: str
    type: str
    param: str | None
    code: int


class OpenAIError(msgspec.Struct):
    """`{"error": {message, type, param, code}}` (server/errors.py)."""

    error: OpenAIErrorDetail


class AnthropicErrorDetail(msgspec.Struct):
    type: str
    message: str


class AnthropicError(msgspec.Struct):
    """`{"type": "error", "error": {type, message}}` (server/anthropic/errors.py)."""

    type: Literal["error"]
    error: AnthropicErrorDetail


def document_errors(
    handlers: Iterable[object], body: type[OpenAIError] | type[AnthropicError] = OpenAIError
) -> None:
    """Give each route handler the error responses of ERROR_STATUSES with `body` (a response it
    declares itself is kept)."""
    specs = {
        status: ResponseSpec(data_container=body, description=text, generate_examples=False)
        for status, text in ERROR_STATUSES.items()
    }
    for handler in handlers:
        if isinstance(handler, HTTPRouteHandler):
            handler.responses = {**specs, **(handler.responses or {})}
