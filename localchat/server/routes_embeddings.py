"""POST /v1/embeddings: pooled final hidden states of our own forward pass (`--pooling last|mean`),
L2-normalized, as floats or base64 of little-endian float32.

The vectors come from the engine as one float32 matrix, and each is written straight from it
(orjson's numpy support: each float32's shortest decimal text, no Python float per value). A
client that disconnects aborts the call's requests in the engine.
"""

from __future__ import annotations

import base64
from typing import Annotated

import msgspec
import numpy as np
import orjson
from litestar import Request, post

from localchat.engine.sampling.request_limits import check_most
from localchat.errors import InvalidParameterError, LocalchatError
from localchat.server.generation import until_disconnect
from localchat.server.protocol import JSON_BODY, EmbeddingRequest
from localchat.server.routes_completions import parse_prompts
from localchat.server.state import require_api_key, server_for

ENCODINGS = ("float", "base64")


def _inputs(data: EmbeddingRequest, tokenize) -> list[list[int]]:
    try:
        prompts = parse_prompts(data.input)
    except InvalidParameterError as exc:
        raise InvalidParameterError(exc.message.replace("prompt", "input"), param="input") from None
    check_most("input", len(prompts), "embedding_inputs")  # before tokenizing any
    inputs = [tokenize(p) if isinstance(p, str) else list(p) for p in prompts]
    check_most("input", sum(map(len, inputs)), "embedding_tokens", "tokens in all")
    return inputs


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
        vectors = await until_disconnect(
            request.receive, server.engine.embed(prompts, server.pooling)
        )
    except LocalchatError as exc:
        if exc.http_status != 400:
            raise
        raise InvalidParameterError(exc.message, param="input") from None
    size = vectors.shape[1]
    if data.dimensions is not None and data.dimensions != size:
        raise InvalidParameterError(
            f"this model's embeddings have {size} dimensions; others are not supported",
            param="dimensions",
        )
    encode = _base64 if data.encoding_format == "base64" else _floats
    items = [
        {"object": "embedding", "index": index, "embedding": encode(vector)}
        for index, vector in enumerate(vectors)
    ]
    tokens = sum(len(p) for p in prompts)
    return {
        "object": "list",
        "data": items,
        "model": server.model_name,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


def _floats(vector: np.ndarray) -> msgspec.Raw:
    """A float32 vector as a JSON array, written by orjson from the array's memory."""
    return msgspec.Raw(orjson.dumps(vector, option=orjson.OPT_SERIALIZE_NUMPY))


def _base64(vector: np.ndarray) -> str:
    """A float32 vector's little-endian bytes in base64."""
    return base64.b64encode(vector.astype("<f4", copy=False).tobytes()).decode()
