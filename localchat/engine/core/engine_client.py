"""EngineClient: what the server, the TUI and Python callers use of an engine, whichever runs it
(AsyncEngine: one engine in a thread of this process; DataParallelEngine: replicas in processes of
their own), and TextFront, the event loop's text side both share (tokenizing and chat rendering on
a tokenizer of the loop's own, never the engine's).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from typing import TYPE_CHECKING, Any, Protocol, Self

import numpy as np

from localchat.config import EngineConfig
from localchat.engine.core.chat_template import ChatTemplate
from localchat.engine.core.llm_engine import EngineStats
from localchat.engine.core.multimodal import ImageInput
from localchat.engine.core.outputs import RequestOutput
from localchat.engine.core.request_stream import RequestStream
from localchat.engine.core.text_codec import TextCodec
from localchat.engine.loading.model_info import ModelInfo
from localchat.engine.sampling.sampling_params import SamplingParams
from localchat.errors import EngineDeadError

if TYPE_CHECKING:
    from prometheus_client.core import Metric


class EngineClient(Protocol):
    """A started engine, as the server's handlers, the chat and Python callers see it. AsyncEngine
    and DataParallelEngine subclass it, so what it defines (`generate`, `replica_metrics`) is
    theirs unless they override it: callers use each capability, never probe for it."""

    config: EngineConfig
    error: BaseException | None  # why it failed, once it has

    async def start(self) -> Self: ...

    async def shutdown(self) -> None: ...

    @property
    def is_ready(self) -> bool: ...

    @property
    def is_dead(self) -> bool: ...

    @property
    def model_info(self) -> ModelInfo: ...

    @property
    def model_name(self) -> str: ...

    @property
    def max_model_len(self) -> int: ...

    @property
    def tokenizer(self) -> Any: ...

    @property
    def chat_template(self) -> ChatTemplate | None: ...

    def tokenize(self, text: str, add_special_tokens: bool = True) -> list[int]: ...

    def detokenize(self, token_ids: list[int], skip_special_tokens: bool = True) -> str: ...

    def render_chat(self, messages: list[dict], **kwargs: Any) -> list[int]: ...

    async def add_request(
        self,
        prompt: str | list[int],
        params: SamplingParams | None = None,
        request_id: str | None = None,
        *,
        stream_interval: float = 0.0,
        images: tuple[ImageInput, ...] = (),
    ) -> RequestStream: ...

    async def generate(
        self,
        prompt: str | list[int],
        params: SamplingParams | None = None,
        request_id: str | None = None,
    ) -> AsyncIterator[RequestOutput]:
        """add_request's deltas, for `async for`: leaving the loop early aborts the request."""
        stream = await self.add_request(prompt, params, request_id)
        try:
            async for delta in stream:
                yield delta
        finally:
            await stream.aclose()

    def abort(self, request_id: str) -> None: ...

    async def embed(self, prompts: list[list[int]], pooling: str) -> np.ndarray:
        """[prompts, hidden] float32: one pooled, L2-normalized vector per prompt."""
        ...

    def stats(self) -> EngineStats | None: ...

    def set_speculative(self, config: dict | str | None) -> None:
        """Speculate by vLLM's speculative config (a dict or its JSON; None: not at all) from the
        next step on; raises InvalidParameterError naming what is wrong, changing nothing."""
        ...

    def replica_metrics(self) -> Iterable[Metric]:
        """The /metrics families of each replica (data parallelism's `localchat_replica_*`);
        an engine of one process has none."""
        return ()


class TextFront:
    """Model facts and text for the event loop, from `model_info` and the loop's own codec
    (`_codec`, set once the engine has loaded)."""

    _codec: TextCodec | None = None

    @property
    def model_info(self) -> ModelInfo:
        raise NotImplementedError

    @property
    def model_name(self) -> str:
        return self.model_info.name

    @property
    def max_model_len(self) -> int:
        return self.model_info.max_model_len

    @property
    def tokenizer(self) -> Any:
        """The event loop's tokenizer (never the one the engine is using)."""
        return self._loop_codec().tokenizer

    @property
    def chat_template(self) -> ChatTemplate | None:
        return self._loop_codec().chat_template

    def tokenize(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._loop_codec().tokenize(text, add_special_tokens)

    def detokenize(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._loop_codec().detokenize(token_ids, skip_special_tokens)

    def render_chat(self, messages: list[dict], **kwargs: Any) -> list[int]:
        """Prompt token ids for a conversation (kwargs as TextCodec.render_chat)."""
        return self._loop_codec().render_chat(messages, **kwargs)

    def _loop_codec(self) -> TextCodec:
        if self._codec is None:
            raise EngineDeadError("the engine is not started")
        return self._codec
