"""POST /v1/embeddings: pooled final hidden states of our own forward pass (`--pooling last|mean`),
L2-normalized, as floats or base64 of little-endian float32."""

from __future__ import annotations

import base64
from typing import Annotated

import numpy as np
from litestar import Request, post

from localchat.engine.sampling.request_limits import LIMITS
from localchat.errors import InvalidParameterError, LocalchatError
from localchat.server.protocol import JSON_BODY, EmbeddingRequest
from localchat.server.routes_completions import parse_prompts
from localchat.server.state import require_api_key, server_for

ENCODINGS = ("float", "base64")


def _inputs(data: EmbeddingRequest, tokenize) -> list[list[int]]:
    try:
        prompts = parse_prompts(data.input)
    except InvalidParameterError as exc:
        raise InvalidParameterError(exc.message.replace("prompt", "input"), param="input") from None
    if len(prompts) > LIMITS.embedding_inputs:  # before tokenizing any
        raise InvalidParameterError(
            f"input holds at most {LIMITS.embedding_inputs} entries, got {len(prompts)}",
            param="input",
        )
    return [tokenize(p) if isinstance(p, str) else list(p) for p in prompts]


@post("/v1/embeddings", status_code=200, guards=[require_api_key], summary="Create embeddings")
async def create_embeddings(request: Request, data: Annotated[EmbeddingRequest, JSON_BODY]) -> dict:
    server = server_for(request, data.model)
    if data.encoding_format not in ENCODINGS:
        raise InvalidParameterError(
            f"encoding_format must be float or base64, got {data.encoding_format!r}",
            param="encoding_format",
        )
    if data.dimensions is not None and data.dimensions < 1:
        raise InvalidParameterError("dimensions must be at least 1", param="dimensions")
    prompts = _inputs(data, server.engine.tokenize)
    try:
        vectors = await server.engine.embed(prompts, server.pooling)
    except LocalchatError as exc:
        if exc.http_status != 400:
            raise
        raise InvalidParameterError(exc.message, param="input") from None
    size = len(vectors[0])
    if data.dimensions is not None and data.dimensions != size:
        raise InvalidParameterError(
            f"this model's embeddings have {size} dimensions; others are not supported",
            param="dimensions",
        )
    items = []
    for index, vector in enumerate(vectors):
        embedding: list[float] | str = vector
        if data.encoding_format == "base64":
            embedding = base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode()
        items.append({"object": "embedding", "index": index, "embedding": embedding})
    tokens = sum(len(p) for p in prompts)
    return {
        "object": "list",
        "data": items,
        "model": server.model_name,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }
