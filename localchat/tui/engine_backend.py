"""The chat backend on the in-process AsyncEngine: exact prompts, cached-token counts, live engine
stats."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable
from dataclasses import replace
from pathlib import Path

import msgspec

from localchat.config import EngineConfig
from localchat.engine.core.async_engine import AsyncEngine
from localchat.engine.core.engine_client import EngineClient
from localchat.engine.core.multimodal import ImageInput
from localchat.engine.sampling.sampling_params import SamplingParams
from localchat.errors import InvalidParameterError
from localchat.harmony import HarmonySplitter, harmony_stop_ids
from localchat.models import source
from localchat.reasoning import HARMONY, new_splitter, reply_thinking
from localchat.server.chat_reply import ReplyParser
from localchat.server.parser_choice import chat_parsers
from localchat.server.protocol import ChatCompletionRequest, ChatMessage
from localchat.server.tool_parsers import ToolParser
from localchat.server.tools import ToolPlan, template_messages
from localchat.server.vision_prompt import image_parts, render_images_with
from localchat.tui.backends import (
    BackendStats,
    ChatBackend,
    ChatRequest,
    ReplyDelta,
    ReplyTimer,
)
from localchat.tui.reply_tools import client_deltas, tool_plan, wire_to_template
from localchat.tui.thinking import OPEN, ThinkSplitter

# The engine hands a reply's tokens over at most this often (the first and the last at once): the
# chat paints every few hundred milliseconds anyway, and a wake-up of the event loop per token is
# time taken from the engine's threads on a small machine.
STREAM_INTERVAL_S = 0.05


class EngineBackend(ChatBackend):
    """Drive an AsyncEngine in this process. Pass a config to own the engine (started by `start()`,
    shut down by `close()`), or an engine shared with others (started if need be, never shut down
    here)."""

    def __init__(self, config: EngineConfig | None = None, *, engine: EngineClient | None = None):
        self._on_progress: Callable[[str], None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.owns_engine = engine is None
        self.engine: EngineClient = engine or AsyncEngine(
            config or EngineConfig(), on_load_progress=self._progress
        )
        model = self.engine.config.model
        if model:
            self.model_name = Path(model.rstrip("/")).name
        else:
            from localchat.models.default_model import DEFAULT_MODEL_NAME

            self.model_name = DEFAULT_MODEL_NAME
        self.description = "in-process engine"
        # harmony for gpt-oss's template, qwen3 when the chat template has <think> (as serve);
        # the tool-call format the template implies (Hermes when it says nothing), as serve's
        self.reasoning: str | None = None
        self.tool_parser: ToolParser | None = None

    def _progress(self, message: str) -> None:  # called from the engine thread while loading
        if self._on_progress is not None and self._loop is not None:
            self._loop.call_soon_threadsafe(self._on_progress, message)

    async def start(self, on_progress: Callable[[str], None] | None = None) -> None:
        self._on_progress, self._loop = on_progress, asyncio.get_running_loop()
        if not self.engine.is_ready:
            await self.engine.start()
        self.model_name = self.engine.model_name
        self.max_model_len = self.engine.max_model_len
        template = self.engine.chat_template
        self.tool_parser, self.reasoning = chat_parsers(
            None, None, template.source if template else None
        )

    def _tool_plan(self, request: ChatRequest) -> ToolPlan:
        """What the request's tools make of this reply (as serve plans it): the tools the template
        shows, whether the reply is parsed for calls, and the grammar of a forced call."""
        assert self.tool_parser is not None, "start() first"
        return tool_plan(request, self.tool_parser, self._special_token_id)

    @property
    def takes_images(self) -> bool | None:
        return self.engine.model_info.takes_images if self.engine.is_ready else None

    def prompt_token_ids(self, request: ChatRequest) -> list[int]:
        return self._prompt(request)[0]

    def _prompt(self, request: ChatRequest) -> tuple[list[int], tuple[ImageInput, ...]]:
        """The prompt's token ids and its pictures (`/image`), made as serve makes a chat
        completion's: the model's own processor expands each image part into its tokens."""
        tools = self._tool_plan(request).template_tools

        def render(messages: list[dict]) -> list[int]:
            return self.engine.render_chat(
                messages,
                chat_template_kwargs=request.chat_template_kwargs,
                add_generation_prompt=True,
                tools=tools,
            )

        if not any(isinstance(m.get("content"), list) for m in request.messages):
            return render(wire_to_template(request.messages)), ()
        data = ChatCompletionRequest(
            messages=[msgspec.convert(m, ChatMessage) for m in request.messages]
        )
        parts = image_parts(data)
        if not parts:
            return render(template_messages(data.messages)), ()
        return render_images_with(
            self.engine, lambda marked: render(template_messages(marked.messages)), data, parts
        )

    async def count_prompt_tokens(self, request: ChatRequest) -> int:
        return len(self.prompt_token_ids(request))

    async def render_prompt(self, request: ChatRequest) -> str:
        return self.engine.detokenize(self.prompt_token_ids(request), skip_special_tokens=False)

    async def stream(self, request: ChatRequest) -> AsyncGenerator[ReplyDelta, None]:
        token_ids, images = self._prompt(request)
        tail = self.engine.detokenize(token_ids[-8:], skip_special_tokens=False)
        params = SamplingParams(**request.sampling, grammar=self._grammar(request, tail))
        tools = self.tool_parser if self._tool_plan(request).parse else None
        splitter: ThinkSplitter | HarmonySplitter
        if self.reasoning == HARMONY:  # gpt-oss: the reply's channels are its special tokens
            splitter = new_splitter(HARMONY, tail)
            params.skip_special_tokens = False
            params.stop_token_ids = harmony_stop_ids(
                params.stop_token_ids, self._special_token_id, self.engine.model_info.eos_token_ids
            )
        else:
            splitter = ThinkSplitter(in_thinking=tail.rstrip().endswith(OPEN))
            if tools is not None and not tools.skip_special_tokens:
                params.skip_special_tokens = False  # the call marker is a special token
        parser = ReplyParser(splitter, tools)  # the thinking, the answer and the calls, as serve's
        timer = ReplyTimer()
        stream = await self.engine.add_request(
            token_ids, params, stream_interval=STREAM_INTERVAL_S, images=images
        )
        try:
            async for output in stream:
                piece = output.outputs[0]
                timer.add(len(piece.token_ids))
                reply = parser.feed(piece.text, final=piece.finish_reason is not None)
                ttft = timer.ttft
                metrics = output.metrics
                if metrics is not None and metrics.first_token_time is not None:
                    ttft = metrics.first_token_time - metrics.arrival_time
                yield ReplyDelta(
                    reply.content,
                    reply.reasoning,
                    parser.finish_reason(piece.finish_reason),
                    timer.tokens,
                    len(output.prompt_token_ids),
                    output.num_cached_tokens,
                    ttft,
                    timer.tokens_per_s,
                    client_deltas(reply.calls),
                )
        finally:
            await stream.aclose()

    def _grammar(self, request: ChatRequest, prompt_tail: str) -> str | None:
        """The /json grammar or the grammar of a forced tool call, applied after the reply's
        thinking (which stays free) when the template thinks, as `serve` does (a harmony call's
        grammar is the whole reply already)."""
        tool_grammar = self._tool_plan(request).grammar
        if request.json_mode is not None and tool_grammar is not None:
            raise InvalidParameterError(
                "/json cannot be combined with a forced tool call", param="json"
            )
        grammar = request.json_mode.grammar if request.json_mode is not None else tool_grammar
        if grammar is None:
            return None
        thinking = reply_thinking(self.reasoning, prompt_tail)
        if thinking is not None and not (thinking == HARMONY and tool_grammar is not None):
            from localchat.server.structured import after_reasoning

            grammar = after_reasoning(grammar, thinking, self._special_token_id)
        return grammar

    def _special_token_id(self, text: str) -> int | None:
        tokenizer = self.engine.tokenizer
        return None if tokenizer is None else tokenizer.get_added_vocab().get(text)

    def set_speculative(self, value: str) -> str:
        word = value.strip().lower()
        config: dict | str | None = {"method": word} if word in ("ngram", "suffix") else value
        if word in ("off", "none"):
            config = None
        elif not isinstance(config, dict) and not word.startswith("{"):
            raise InvalidParameterError(
                f"speculative must be ngram, suffix, off or a JSON object, got {value.strip()!r}",
                param="speculative",
            )
        self.engine.set_speculative(config)
        return "off" if config is None else str(config)

    def stats(self) -> BackendStats | None:
        stats = self.engine.stats()
        if stats is None:
            return None
        return BackendStats(
            stats.kv_cache_usage,
            stats.prefix_cache_hits,
            stats.num_running,
            stats.num_waiting,
            stats.spec_draft_tokens_total,
            stats.spec_accepted_tokens_total,
        )

    def for_model(self, name: str) -> EngineBackend:
        """An engine of its own for `name` (a registry name or a path), with this one's flags."""
        # Looked up on the module when called, so a patched resolve_model (the tests' guard) holds.
        source.resolve_model(name, pull=False)  # an unknown name fails now, before anything unloads
        # an --mmproj file is this model's image encoder; the next takes the one beside it
        mmproj = "none" if self.engine.config.mmproj == "none" else None
        return EngineBackend(replace(self.engine.config, model=name, mmproj=mmproj))

    async def model_choices(self) -> list[tuple[str, str]]:
        """The installed models, as `localchat list` shows them."""
        from localchat.models.facts import facts_of, format_parameters
        from localchat.models.registry import entries
        from localchat.utils import format_bytes

        choices = []
        for entry in await asyncio.to_thread(entries):
            try:
                facts = await asyncio.to_thread(facts_of, entry.kind, entry.path)
            except (OSError, ValueError):
                choices.append((entry.name, entry.format))
                continue
            about = [facts.family_label, format_parameters(facts.parameters), facts.quantization]
            about.append(format_bytes(facts.size_bytes))
            choices.append((entry.name, " · ".join(a for a in about if a and a != "-")))
        return choices

    async def close(self) -> None:
        if self.owns_engine:
            await self.engine.shutdown()
