"""What an engine client and its EngineCore (engine_core.py) say to each other, whatever carries it:
a queue to the engine thread (AsyncEngine) or a pipe to a data-parallel replica's process.

Commands go to the core and are run between steps; events come back, a list of them at a time (a
step's events together, in order: acceptances, the requests a failed step ended, then the step's
deltas and stats, then finished embeddings). A replica process also reports its own life:
started, ready or failed to load, and an engine that failed. Every message is a plain dataclass,
so it pickles over a pipe.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from localchat.engine.core.llm_engine import EngineStats
from localchat.engine.core.multimodal import ImageInput
from localchat.engine.core.outputs import RequestOutput
from localchat.engine.core.text_codec import TextCodec
from localchat.engine.loading.model_info import ModelInfo
from localchat.engine.sampling.sampling_params import SamplingParams
from localchat.errors import LocalchatError

# --- commands (client -> core) --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AddRequest:
    """Queue a request; answered by an Accepted event."""

    request_id: str
    prompt: str | list[int]
    params: SamplingParams
    images: tuple[ImageInput, ...] = ()  # the prompt's pictures (engine/core/multimodal.py)


@dataclass(frozen=True, slots=True)
class AbortRequest:
    """Abort a request (or one prompt of an embedding call) if the engine still has it."""

    request_id: str


@dataclass(frozen=True, slots=True)
class EmbedPrompts:
    """Queue one embedding request per prompt (ids `embed_request_ids`); answered by Embedded."""

    embed_id: int
    prompts: list[list[int]]
    pooling: str


@dataclass(frozen=True, slots=True)
class SetSpeculative:
    """Speculate by this config from the next step on (a checked SpeculativeConfig's dict; None:
    off)."""

    config: dict | None


@dataclass(frozen=True, slots=True)
class Shutdown:
    """Abort everything and end the drive loop."""


EngineCommand = AddRequest | AbortRequest | EmbedPrompts | SetSpeculative | Shutdown


def embed_request_ids(embed_id: int, count: int) -> list[str]:
    """The engine's request ids of an EmbedPrompts call's `count` prompts."""
    return [f"embed-{embed_id}-{index}" for index in range(count)]


# --- events (core -> client) ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Accepted:
    """A request is in the engine (`error` None) or refused. `prompt_token_ids` is set only for an
    accepted text prompt (a client that sent token ids has them)."""

    request_id: str
    prompt_token_ids: list[int] | None
    error: LocalchatError | None


@dataclass(frozen=True, slots=True)
class StepDone:
    """A step's deltas (or an abort's), the engine's stats after it, and the cached blocks the
    engine evicted since its last report (only when the core reports evictions)."""

    outputs: list[RequestOutput]
    stats: EngineStats
    evicted: list[int]


@dataclass(frozen=True, slots=True)
class Failed:
    """Requests that end with `error` instead of a last delta (the step that ran them failed)."""

    request_ids: list[str]
    error: LocalchatError


@dataclass(frozen=True, slots=True)
class Embedded:
    """An EmbedPrompts call's vectors ([prompts, hidden] float32, in its prompts' order), or its
    error."""

    embed_id: int
    result: np.ndarray | LocalchatError


@dataclass(frozen=True, slots=True)
class CoreReady:
    """What a replica reports once loaded."""

    pid: int
    model_info: ModelInfo
    codec: TextCodec | None
    max_num_seqs: int
    stats: EngineStats


@dataclass(frozen=True, slots=True)
class Started:
    """A replica process is running (before it loads)."""

    pid: int


@dataclass(frozen=True, slots=True)
class LoadFailed:
    """A replica's loading raised `error`."""

    error: BaseException


@dataclass(frozen=True, slots=True)
class CoreFailed:
    """A replica's engine failed in a step (`why`: the exception's type and text)."""

    why: str


EngineEvent = (
    Accepted | StepDone | Failed | Embedded | CoreReady | Started | LoadFailed | CoreFailed
)
