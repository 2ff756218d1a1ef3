"""POST /v1/responses, and the stored responses: GET and DELETE /v1/responses/{id}, GET
/v1/responses/{id}/input_items. Errors are the server's usual OpenAI-shaped ones, naming this API's
fields; an unknown (or evicted, or never stored) response is a 404."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Annotated, Any

from litestar import Litestar, Request, Response, delete, get, post
from litestar.datastructures import State
from litestar.params import FromPath, FromQuery

from localchat.errors import InvalidParameterError, LocalchatError
from localchat.server.chat_run import start_chat
from localchat.server.errors import handle_exception
from localchat.server.generation import until_disconnect
from localchat.server.protocol import JSON_BODY
from localchat.server.reply_blocks import ReplyBlocks, whole_reply
from localchat.server.responses.protocol import ResponsesRequest
from localchat.server.responses.reply import ResponseReply, echo_fields, new_response_id
from localchat.server.responses.store import ResponseStore
from localchat.server.responses.translate import (
    chat_request,
    fetch_images,
    field_names,
    input_items,
)
from localchat.server.state import require_api_key, server_for
from localchat.server.streaming import sse_response


class ResponseNotFoundError(LocalchatError):
    http_status = 404
    error_type = "not_found_error"


def store_of(request: Request) -> ResponseStore:
    return request.app.state.responses


async def stored(store: ResponseStore, response_id: str, param: str | None = None) -> dict:
    record = await asyncio.to_thread(store.get, response_id)
    if record is None:
        raise ResponseNotFoundError(
            f"no response with id {response_id!r}: it was never stored (store: false), was "
            "deleted, or was evicted from the store",
            param=param,
        )
    return record


@post(
    "/v1/responses",
    status_code=200,
    guards=[require_api_key],
    summary="Create a response (OpenAI's Responses API)",
)
async def create_response(
    request: Request, data: Annotated[ResponsesRequest, JSON_BODY]
) -> Response:
    server = server_for(request, data.model)
    store = store_of(request)
    history: list[dict[str, Any]] = []
    if data.previous_response_id is not None:
        record = await stored(store, data.previous_response_id, "previous_response_id")
        history = record["history"]
    response_id = new_response_id()
    with field_names():
        takes_images = server.engine.model_info.takes_images
        items = input_items(data, takes_images)
        # http(s) images fetched (--allowed-media-domains): input_items keeps their URLs, the
        # conversation their files, which a response continuing it is about
        fetched = await fetch_images(items, server.media_domains)
        chat = chat_request(data, history, fetched, takes_images)
        run = await start_chat(request, server, chat, response_id, max_tokens_ceiling=True)

    async def keep(response: dict[str, Any]) -> None:
        if data.store:
            conversation = [*history, *fetched, *response["output"]]
            record = {"response": response, "input_items": items, "history": conversation}
            await asyncio.to_thread(store.put, response_id, record)

    reply = ResponseReply(
        response_id,
        server.model_name,
        echo_fields(data),
        run.generation,
        ReplyBlocks(run.new_parser()),
        keep,
    )
    if data.stream:
        return sse_response(reply.events(), run.generation)
    await until_disconnect(request.receive, whole_reply(run.generation, reply.reply))
    return Response(await reply.finish())


@get("/v1/responses/{response_id:str}", guards=[require_api_key], summary="A stored response")
async def get_response(request: Request, response_id: FromPath[str]) -> dict:
    return (await stored(store_of(request), response_id))["response"]


@delete(
    "/v1/responses/{response_id:str}",
    status_code=200,
    guards=[require_api_key],
    summary="Delete a stored response",
)
async def delete_response(request: Request, response_id: FromPath[str]) -> dict:
    if not await asyncio.to_thread(store_of(request).delete, response_id):
        await stored(store_of(request), response_id)  # the 404
    return {"id": response_id, "object": "response", "deleted": True}


@get(
    "/v1/responses/{response_id:str}/input_items",
    guards=[require_api_key],
    summary="The input items of a stored response",
)
async def list_input_items(
    request: Request,
    response_id: FromPath[str],
    limit: FromQuery[int] = 20,
    order: FromQuery[str] = "desc",
    after: FromQuery[str | None] = None,
) -> dict:
    """A page of the response's own input items (not those of the responses it continues), newest
    first unless `order=asc`, `limit` (1-100) after the item `after`."""
    if not 1 <= limit <= 100:
        raise InvalidParameterError(f"limit must be in [1, 100], got {limit}", param="limit")
    if order not in ("asc", "desc"):
        raise InvalidParameterError(f"order must be asc or desc, got {order!r}", param="order")
    items = (await stored(store_of(request), response_id))["input_items"]
    if order == "desc":
        items = items[::-1]
    if after is not None:
        ids = [item.get("id") for item in items]
        if after not in ids:
            raise InvalidParameterError(f"no input item {after!r} in this response", param="after")
        items = items[ids.index(after) + 1 :]
    page = items[:limit]
    return {
        "object": "list",
        "data": page,
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
        "has_more": len(items) > limit,
    }


ROUTES = [create_response, get_response, delete_response, list_input_items]


def stored_responses_app(store: ResponseStore) -> Litestar:
    """GET and DELETE of the stored responses alone, on `store`: for a several-model server's
    router, which checked the API key already."""
    return Litestar(
        route_handlers=[get_response, delete_response, list_input_items],
        state=State({"server": _NO_KEY, "responses": store}),
        exception_handlers={Exception: handle_exception},
        openapi_config=None,
        logging_config=None,
    )


_NO_KEY = SimpleNamespace(api_key=None)  # what require_api_key reads
