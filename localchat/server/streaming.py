"""Server-sent events for streamed completions: `data: {chunk}` lines, then `data: [DONE]`.

The part of a chunk shared by every chunk of a response (id, object, created, model) is encoded
once; per delta only the choice is encoded, and all choices that advanced in one engine step go out
in one write. Each choice's first chunk is marked `first` (chat puts the role there); the engine
reports a finish_reason exactly once per choice, in its last delta, so it reaches the client exactly
once.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Protocol

import msgspec
from litestar import Request, Response
from litestar.background_tasks import BackgroundTask
from litestar.response import Stream

from localchat.engine.core.multimodal import ImageInput
from localchat.engine.core.outputs import CompletionOutput, RequestOutput
from localchat.engine.sampling.guided_decoding import GRAMMAR_ERROR_PREFIX
from localchat.errors import InvalidParameterError
from localchat.server.errors import error_from_exception
from localchat.server.generation import Generation, until_disconnect
from localchat.sse import DONE_EVENT

if TYPE_CHECKING:
    from localchat.engine.sampling.sampling_params import SamplingParams
    from localchat.server.protocol import SamplingFields
    from localchat.server.state import ServerState

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
_encode = msgspec.json.Encoder().encode


class Dialect(Protocol):
    """How one endpoint (chat or completions) words its choices."""

    def stream_choice(
        self, index: int, position: int, delta: RequestOutput, out: CompletionOutput, first: bool
    ) -> dict | None:
        """The choice object of one sample's piece `out` of a delta, or None when there is nothing
        to send."""

    def final_choice(
        self, index: int, position: int, output: RequestOutput, out: CompletionOutput
    ) -> dict:
        """The choice object of one sample `out` of a whole (non-streamed) output."""


class ChunkEncoder:
    """Encodes chunks of one response: a fixed prefix and suffix around the per-delta choice."""

    def __init__(
        self, response_id: str, object_name: str, created: int, model: str, include_usage: bool
    ):
        head = _encode(
            {"id": response_id, "object": object_name, "created": created, "model": model}
        )
        self._prefix = b"data: " + head[:-1] + b',"choices":['
        self._suffix = b'],"usage":null}\n\n' if include_usage else b"]}\n\n"

    def chunk(self, choice: dict) -> bytes:
        return self._prefix + _encode(choice) + self._suffix

    def usage_chunk(self, usage: dict) -> bytes:
        return self._prefix + b'],"usage":' + _encode(usage) + b"}\n\n"


def error_event(exc: BaseException) -> bytes:
    body, _ = error_from_exception(exc)
    return b"data: " + _encode(body) + b"\n\n"


async def sse_events(
    generation: Generation, dialect: Dialect, encoder: ChunkEncoder, include_usage: bool
) -> AsyncIterator[bytes]:
    """The whole event stream of one response. An engine failure mid-stream becomes an error event,
    and the stream still ends with [DONE]; a client disconnect cancels this and aborts the engine
    requests."""
    n = generation.params.n
    started: set[int] = set()
    try:
        async for position, delta in generation.deltas():
            parts = []
            for out in delta.outputs:
                index = position * n + out.index
                first = index not in started
                if first:
                    started.add(index)
                choice = dialect.stream_choice(index, position, delta, out, first)
                if choice is not None:
                    parts.append(encoder.chunk(choice))
            if parts:
                yield b"".join(parts)
        if include_usage:
            yield encoder.usage_chunk(generation.usage())
    except Exception as exc:
        yield error_event(exc)
    finally:
        await generation.close()
    yield DONE_EVENT


async def start_generation(
    request: Request,
    server: ServerState,
    id_prefix: str,
    params: SamplingParams,
    prompts: list[str | list[int]],
    grammar_param: str | None = None,
    *,
    request_id: str | None = None,
    images: tuple[ImageInput, ...] = (),
) -> Generation:
    """Queue the prompts as one Generation under a new response id (`{id_prefix}-...`, or
    `request_id` when given), and hand it to the access log line. `grammar_param` is the request's
    field that gave `params.grammar`."""
    request_id = request_id or server.new_id(id_prefix)
    generation = Generation(server.engine, server.metrics, request_id, params)
    try:
        await generation.start(prompts, images)
    except InvalidParameterError as exc:
        # the engine's compile for the model's tokenizer (after checked_grammar's tokenizer-free
        # check) names its error "grammar": name the client's field instead
        if grammar_param is None or exc.param != "grammar":
            raise
        detail = exc.message.removeprefix(GRAMMAR_ERROR_PREFIX)
        raise InvalidParameterError(
            f"invalid {grammar_param}: {detail}", param=grammar_param
        ) from None
    request.state.localchat_generation = generation
    return generation


def sse_response(events: AsyncIterator[bytes], generation: Generation) -> Stream:
    """A response streaming `events` (server-sent events of `generation`), which closes the
    generation when it ends (aborting it if the client left first)."""
    return Stream(
        events,
        media_type="text/event-stream",
        headers=SSE_HEADERS,
        background=BackgroundTask(generation.close),
    )


async def respond(
    request: Request,
    generation: Generation,
    dialect: Dialect,
    body: SamplingFields,
    *,
    model: str,
    object_name: str,
) -> Response:
    """The HTTP response of a started generation: an SSE stream of `{object_name}.chunk`-style
    chunks when `body` asks for a stream, else the whole `object_name` object once every choice has
    finished (aborted if the client leaves first)."""
    response_id = generation.request_id
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    created = int(time.time())
    if body.stream:
        chunk_object = (
            "text_completion" if object_name == "text_completion" else f"{object_name}.chunk"
        )
        encoder = ChunkEncoder(response_id, chunk_object, created, model, include_usage)
        return sse_response(sse_events(generation, dialect, encoder, include_usage), generation)
    outputs = await until_disconnect(request.receive, generation.collect())
    n = generation.params.n
    choices = [
        dialect.final_choice(position * n + out.index, position, output, out)
        for position, output in sorted(outputs.items())
        for out in output.outputs
    ]
    return Response(
        {
            "id": response_id,
            "object": object_name,
            "created": created,
            "model": model,
            "choices": choices,
            "usage": generation.usage(),
        }
    )
