"""The small endpoints: models, health, version, tokenize, detokenize and Prometheus metrics."""

from __future__ import annotations

from typing import Annotated

from litestar import Request, Response, get, post
from prometheus_client import CONTENT_TYPE_LATEST

from localchat import __version__
from localchat.errors import InvalidParameterError
from localchat.server.protocol import JSON_BODY, DetokenizeRequest, TokenizeRequest
from localchat.server.state import require_api_key, require_metrics_key, server_for, server_of
from localchat.server.tools import check_tools


@get("/v1/models", guards=[require_api_key], summary="List the served model")
async def list_models(request: Request) -> dict:
    server = server_of(request)
    info = server.engine.model_info
    return {
        "object": "list",
        "data": [
            {
                "id": server.model_name,
                "object": "model",
                "created": server.created,
                "owned_by": "localchat",
                "root": info.name,
                "parent": None,
                "max_model_len": info.max_model_len,
            }
        ],
    }


@get("/health", summary="200 when the engine serves, 503 when it has stopped")
async def health(request: Request) -> Response:
    engine = server_of(request).engine
    if engine.is_ready:
        return Response({"status": "ok"}, status_code=200)
    reason = (
        f"the engine stopped after an error: {engine.error}"
        if engine.is_dead
        else "the engine is not ready"
    )
    return Response({"status": "unavailable", "detail": reason}, status_code=503)


@get("/version", summary="The localchat version")
async def version() -> dict:
    return {"version": __version__}


@post(
    "/tokenize",
    status_code=200,
    guards=[require_api_key],
    summary="Token ids of a prompt or conversation",
)
async def tokenize(request: Request, data: Annotated[TokenizeRequest, JSON_BODY]) -> dict:
    server = server_for(request, data.model)
    if (data.prompt is None) == (data.messages is None):
        raise InvalidParameterError("give exactly one of prompt and messages", param="prompt")
    if data.messages is not None:
        check_tools(data.tools)
        tokens = server.render_chat(data, data.tools)
    else:
        assert data.prompt is not None  # exactly one of the two, as checked above
        tokens = server.engine.tokenize(data.prompt, add_special_tokens=data.add_special_tokens)
    body = {
        "tokens": tokens,
        "count": len(tokens),
        "max_model_len": server.engine.model_info.max_model_len,
    }
    if data.return_token_strs:
        body["token_strs"] = [server.token_str(t) for t in tokens]
    return body


@post("/detokenize", status_code=200, guards=[require_api_key], summary="Text of token ids")
async def detokenize(request: Request, data: Annotated[DetokenizeRequest, JSON_BODY]) -> dict:
    server = server_for(request, data.model)
    vocab_size = len(server.engine.tokenizer) if server.engine.tokenizer is not None else None
    bad = next((t for t in data.tokens if t >= vocab_size), None) if vocab_size else None
    if bad is not None:
        raise InvalidParameterError(
            f"token id {bad} is outside the vocabulary [0, {vocab_size})", param="tokens"
        )
    return {"prompt": server.engine.detokenize(data.tokens, skip_special_tokens=False)}


@get(
    "/metrics",
    summary="Prometheus metrics",
    include_in_schema=False,
    guards=[require_metrics_key],
)
async def metrics(request: Request) -> Response:
    return Response(server_of(request).metrics.render(), media_type=CONTENT_TYPE_LATEST)


ROUTES = [list_models, health, version, tokenize, detokenize, metrics]
