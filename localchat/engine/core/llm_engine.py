"""LLMEngine: the synchronous core. add_request / abort / step, one thread, owns the device."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import itertools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from localchat.config import EngineConfig
from localchat.engine.core.block_manager import BlockManager
from localchat.engine.core.memory import cache_cpu_blocks, fix_mmap_threshold
from localchat.engine.core.multimodal import EncoderCache, ImageInput
from localchat.engine.core.outputs import CompletionOutput, RequestMetrics, RequestOutput
from localchat.engine.core.runtime import EngineRuntime, prefault_kv_memory
from localchat.engine.core.scheduler import Scheduler
from localchat.engine.core.sequence import Request, Sequence
from localchat.engine.core.speculation import Speculator
from localchat.engine.core.step_failure import recoverable, step_error
from localchat.engine.core.text_codec import TextCodec
from localchat.engine.distributed.tp_runner import TensorParallelRunner
from localchat.engine.loading.model_info import ModelInfo
from localchat.engine.loading.vision import load_vision_encoder
from localchat.engine.modeling.model_runner import ModelRunner, Verification
from localchat.engine.modeling.registry import family_name
from localchat.engine.sampling.detokenizer import IncrementalDetokenizer
from localchat.engine.sampling.guided_decoding import GrammarCompiler
from localchat.engine.sampling.logits_processors import attach_grammar
from localchat.engine.sampling.request_constraints import RequestConstraints
from localchat.engine.sampling.sampling_params import SamplingParams
from localchat.engine.speculative.config import SpeculativeConfig
from localchat.engine.speculative.draft_model import DraftModel, draft_key
from localchat.errors import (
    EmptyPromptError,
    EngineStepError,
    InvalidParameterError,
    PromptTooLongError,
)

logger = logging.getLogger("localchat.engine")
POOLING = ("last", "mean")  # how embed() turns a prompt's hidden states into one vector
EMBED_PARAMS = SamplingParams(max_tokens=1)  # an embedding's prompt must fit as a prompt does
_embed_ids = itertools.count()


@dataclass
class EngineStats:
    """A snapshot for the status bar, /metrics and benchmarks."""

    num_running: int
    num_waiting: int
    kv_cache_usage: float
    num_blocks: int
    prefix_cache_queries: int
    prefix_cache_hits: int
    num_preemptions: int
    prompt_tokens_total: int
    generation_tokens_total: int
    # speculative decoding: drafted tokens, and those the model agreed with
    spec_draft_tokens_total: int = 0
    spec_accepted_tokens_total: int = 0


class LLMEngine:
    """Continuous batching over one model: requests join and leave between steps.

    `step()` schedules a batch, runs it, samples, detokenizes, checks stops and returns a delta
    RequestOutput for every request that advanced (or finished) in that step.
    """

    def __init__(
        self,
        config: EngineConfig | None = None,
        *,
        progress: Callable[[str], None] | None = None,
        **kwargs,
    ):
        self.config = config = config or EngineConfig.from_kwargs(**kwargs)
        fix_mmap_threshold()  # before the weights and the first steps: see memory.py
        kv_memory = prefault_kv_memory(config)  # resident while the model loads
        self.runtime = runtime = EngineRuntime.load(config, progress)
        self.tokenizer = runtime.tokenizer
        # used by this engine's thread only
        self.codec = TextCodec(runtime.tokenizer, runtime.chat_template)
        self.max_model_len = runtime.max_model_len
        self.eos_token_ids = runtime.eos_token_ids
        runner_class: Callable[..., ModelRunner] = ModelRunner
        if config.tensor_parallel_size > 1:  # rank 0 of a group it spawns (engine/distributed/)
            runner_class = functools.partial(TensorParallelRunner, runtime=runtime)
        self.runner = runner_class(
            runtime.model,
            runtime.hf_config,
            device=runtime.device,
            dtype=runtime.dtype,
            kv_cache_dtype=runtime.kv_cache_dtype,
            block_size=config.block_size,
            max_model_len=self.max_model_len,
            eos_token_ids=self.eos_token_ids,
            max_num_seqs=runtime.max_num_seqs,
        )
        if progress is not None:
            progress("allocating the KV cache")
        num_blocks = runtime.num_kv_blocks(self.runner)
        self.runner.allocate_kv_cache(num_blocks, kv_memory)
        if runtime.device.type == "cpu":  # after loading: the load's temporaries are not kept
            width = self.runner.spec.intermediate_size  # the MLP's activations, float32
            cache_cpu_blocks(runtime.max_num_batched_tokens * width * 4)
        graphs = None if config.enforce_eager else self.runner.capture_cuda_graphs()
        if graphs is not None:
            logger.info("captured CUDA graphs for decode batches up to %d", graphs.max_batch_size)
        self.model_info = _model_info(runtime, self.runner.spec.vocab_size)
        rotary = self.runner.rotary
        self.block_manager = BlockManager(
            num_blocks,
            config.block_size,
            config.enable_prefix_caching,
            length_salt=rotary.kv_salt if rotary.depends_on_length else None,
            recompute_on_salt_change=rotary.recomputes_on_switch,
            windows=self.runner.kv_layout.windows,
        )
        self.scheduler = Scheduler(
            self.block_manager, runtime.max_num_seqs, runtime.max_num_batched_tokens
        )
        # a vision-language model's image encoder (engine/core/multimodal.py), behind a cache;
        # under tensor parallelism here on rank 0 only (engine/distributed/step_transfer.py)
        vision = load_vision_encoder(
            runtime.files,
            dtype=runtime.dtype,
            device=runtime.device,
            load_format=config.load_format,
            mmproj=config.mmproj,
            text_config=runtime.hf_config,
            tokenizer=runtime.tokenizer,
            progress=progress,
        )
        self.image_encoder = None if vision is None else vision.encoder
        if vision is not None:
            self.runner.encoder_cache = EncoderCache(vision.encoder)
            self.runner.bidirectional_images = vision.encoder.bidirectional
            self.scheduler.whole_images = vision.encoder.bidirectional
            self.model_info = dataclasses.replace(
                self.model_info, takes_images=True, processor_dir=vision.processor_dir
            )
        self.grammar_compiler: GrammarCompiler | None = None
        if self.tokenizer is not None:
            self.grammar_compiler = GrammarCompiler(
                self.tokenizer, self.runner.spec.vocab_size, self.eos_token_ids
            )
        self.runner.grammar_compiler = self.grammar_compiler
        self.speculator: Speculator | None = None
        self._spec_before = (0, 0)  # drafted and kept tokens under earlier speculative configs
        self.set_speculative(config.speculative_config, progress=progress)
        self._compiling: list[Request] = []  # requests whose grammar is compiling
        self.requests: dict[str, Request] = {}
        self._embedded: list[Request] = []  # embedding requests done, until take_embedded()
        self._held_outputs: list[RequestOutput] = []  # steps run by embed(), for the next step()
        self._prompt_tokens_total = 0
        self._generation_tokens_total = 0

    def check_speculative(self, value: dict | str | None) -> SpeculativeConfig | None:
        """The speculative config `value` asks for, checked against this model; raises
        InvalidParameterError naming what is wrong."""
        speculative = SpeculativeConfig.parse(value)
        if speculative is not None and self.runner.rotary.depends_on_length:
            raise InvalidParameterError(
                "speculative decoding does not support this model's length-dependent rope "
                "scaling (longrope, dynamic NTK)",
                param="speculative_config",
            )
        if (
            speculative is not None
            and speculative.method == "draft_model"
            and self.config.tensor_parallel_size > 1
        ):
            raise InvalidParameterError(
                "speculative_config.method: draft_model is not supported with tensor parallelism "
                "yet",
                param="speculative_config",
            )
        return speculative

    def set_speculative(
        self, value: dict | str | None, *, progress: Callable[[str], None] | None = None
    ) -> None:
        """Speculate by `value` (vLLM's speculative config; None: not at all) from the next step;
        the drafted and kept counts go on. A draft model is loaded here (kept while the next config
        names the same one); one that cannot be loaded leaves the config as it was."""
        speculative = self.check_speculative(value)
        old = self.speculator.draft_model if self.speculator is not None else None
        draft = None
        if speculative is not None and speculative.method == "draft_model":
            if old is not None and old.key == draft_key(speculative):
                draft = old
            else:
                kv_bytes = self.block_manager.num_blocks * self.runner.bytes_per_block()
                draft = DraftModel.load(
                    speculative, self.runtime, self.runner.spec.vocab_size, kv_bytes, progress
                )
        if old is not None:
            old.release_all()  # its shadows start again
        self._spec_before = self.spec_counts()
        self.speculator = (
            None if speculative is None else Speculator(speculative, self.max_model_len, draft)
        )
        for seq in [*self.scheduler.running, *self.scheduler.waiting]:
            seq.drafter, seq.draft_token_ids = None, []

    def spec_counts(self) -> tuple[int, int]:
        """Tokens drafted, and of those kept, since the engine started (under every config)."""
        drafted, kept = self._spec_before
        if self.speculator is not None:
            drafted += self.speculator.num_draft_tokens
            kept += self.speculator.num_accepted_tokens
        return drafted, kept

    # --- requests ---------------------------------------------------------------------------------
    def tokenize(self, prompt: str, add_special_tokens: bool = True) -> list[int]:
        return self.codec.tokenize(prompt, add_special_tokens)

    def detokenize(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.codec.detokenize(token_ids, skip_special_tokens)

    def render_chat(self, messages: list[dict], **kwargs) -> list[int]:
        """Token ids of a conversation rendered with the chat template (kwargs as
        TextCodec.render_chat)."""
        return self.codec.render_chat(messages, **kwargs)

    def add_request(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams | None = None,
        images: tuple[ImageInput, ...] = (),
    ) -> Request:
        """Queue a prompt (text or token ids, with the images whose placeholder tokens it holds);
        raises a LocalchatError naming what is wrong with it."""
        params = params or SamplingParams()
        if request_id in self.requests:
            raise InvalidParameterError(
                f"request id {request_id!r} is already in use", param="request_id"
            )
        text = prompt if isinstance(prompt, str) else None
        token_ids = self.tokenize(prompt) if isinstance(prompt, str) else list(prompt)
        self._validate_prompt(token_ids, params)
        if images:
            self._validate_images(token_ids, images)
        request = Request(request_id, token_ids, params, prompt=text, images=tuple(images))
        if params.has_logits_processors:
            request.constraints = self._constraints(params)
            if request.constraints.grammar is not None:
                self._compiling.append(request)
        for seq in request.seqs:
            if self.tokenizer is not None:
                seq.detokenizer = IncrementalDetokenizer(self.tokenizer, token_ids, params)
            self.scheduler.add(seq)
        self.requests[request_id] = request
        self._prompt_tokens_total += len(token_ids)
        return request

    def _constraints(self, params: SamplingParams) -> RequestConstraints:
        vocab = self.model_info.vocab_size
        for name, ids in (
            ("logit_bias", list(params.logit_bias or {})),
            ("allowed_token_ids", params.allowed_token_ids or []),
        ):
            if any(t >= vocab for t in ids):
                raise InvalidParameterError(
                    f"{name} token ids must be below the vocabulary size {vocab}", param=name
                )
        bad_words_ids: list[list[int]] = []
        for word in params.bad_words or []:
            for variant in (word, " " + word.lstrip()):  # as a word of its own, and mid-text
                ids = self.tokenize(variant, add_special_tokens=False)
                if ids and ids not in bad_words_ids:
                    bad_words_ids.append(ids)
        constraints = RequestConstraints(params, bad_words_ids)
        if params.grammar is not None:
            if self.grammar_compiler is None:
                raise InvalidParameterError(
                    "constrained decoding needs a tokenizer; this model was loaded without one",
                    param="response_format",
                )
            constraints.grammar = self.grammar_compiler.compile(params.grammar)
        return constraints

    def _settle_grammars(self) -> list[RequestOutput]:
        """Give the sequences of requests whose grammar compiled their matchers; a grammar that
        failed, or ran past the grammar_seconds bound, aborts its request."""
        if self.grammar_compiler is not None:
            self.grammar_compiler.expire()
        outputs = []
        still = []
        for request in self._compiling:
            future = request.constraints.grammar if request.constraints else None
            if future is None or request.request_id not in self.requests:
                continue
            if not future.done():
                still.append(request)
            elif future.exception() is not None:
                logger.warning("grammar of %s failed: %s", request.request_id, future.exception())
                output = self.abort(request.request_id)
                if output is not None:
                    outputs.append(output)
            else:
                for seq in request.seqs:
                    attach_grammar(seq)
        self._compiling = still
        return outputs

    def _validate_prompt(self, token_ids: list[int], params: SamplingParams) -> None:
        if not token_ids:
            raise EmptyPromptError("the prompt is empty", param="prompt")
        vocab = self.model_info.vocab_size
        if any(not isinstance(t, int) or t < 0 or t >= vocab for t in token_ids):
            raise InvalidParameterError(
                f"prompt token ids must be integers in [0, {vocab})", param="prompt"
            )
        limit = self.max_model_len
        if params.max_tokens is None and len(token_ids) >= limit:
            raise PromptTooLongError(
                f"the prompt has {len(token_ids)} tokens, but the context holds {limit} "
                "(max_model_len), leaving no room for output",
                param="prompt",
            )
        if params.max_tokens is not None and len(token_ids) + params.max_tokens > limit:
            raise PromptTooLongError(
                f"the prompt ({len(token_ids)} tokens) plus max_tokens ({params.max_tokens}) is "
                f"{len(token_ids) + params.max_tokens} tokens, beyond the context of {limit} "
                "(max_model_len)",
                param="max_tokens",
            )

    def _validate_images(self, token_ids: list[int], images: tuple[ImageInput, ...]) -> None:
        encoder = self.image_encoder
        if encoder is None:
            raise InvalidParameterError(
                f"{self.model_info.name} takes no images (not a vision-language model we run, "
                "a GGUF without its mmproj file, or random weights)",
                param="images",
            )
        budget = self.scheduler.max_num_batched_tokens
        for image in images:
            placed = token_ids[image.offset : image.end]
            if image.offset < 0 or placed != [encoder.image_token_id] * image.length:
                raise InvalidParameterError(
                    f"an image's {image.length} placeholder tokens are not at {image.offset}",
                    param="images",
                )
            if image.length != encoder.tokens_per_image:
                raise InvalidParameterError(
                    f"an image takes {encoder.tokens_per_image} tokens, not {image.length}",
                    param="images",
                )
            size, shape = encoder.image_size, tuple(image.pixel_values.shape)
            if len(shape) != 3 or shape[1:] != (size, size):
                raise InvalidParameterError(
                    f"an image's pixel values are {list(shape)}, not the "
                    f"[channels, {size}, {size}] this model's image encoder takes",
                    param="images",
                )
            if self.scheduler.whole_images and image.length > budget:
                raise InvalidParameterError(
                    f"an image's {image.length} tokens exceed --max-num-batched-tokens {budget}",
                    param="images",
                )

    def abort(self, request_id: str) -> RequestOutput | None:
        """Stop a request now and free its blocks; returns its final (delta) output, or None if
        unknown."""
        request = self.requests.pop(request_id, None)
        if request is None:
            return None
        outputs = []
        for seq in request.seqs:
            if not seq.is_finished:
                self.scheduler.finish(seq)
                seq.finish_reason = "abort"
                outputs.append(
                    CompletionOutput(seq.index, self._take_text(seq, True), [], None, "abort")
                )
        return self._request_output(request, outputs)

    def has_unfinished(self) -> bool:
        """Whether step() has work or outputs to give (those of steps embed() ran count)."""
        return bool(self._held_outputs) or self.scheduler.has_unfinished()

    # --- the step ---------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """One step's delta outputs. A step that fails once its batch is made ends the batch's
        requests and raises EngineStepError naming them; the engine can go on stepping
        (step_failure.py says which failures it cannot survive: those are raised as they are)."""
        outputs = self._guarded_step()
        if self._held_outputs:  # generation that advanced while embed() stepped
            outputs, self._held_outputs = [*self._held_outputs, *outputs], []
        return outputs

    def _guarded_step(self) -> list[RequestOutput]:
        self.scheduler.last_batch = None
        try:
            return self._step()
        except Exception as exc:
            failure = self._fail_step(exc)
            if failure is None:
                raise
            raise failure from exc
        finally:
            self.scheduler.last_batch = None  # its sequences are not kept alive

    def _fail_step(self, exc: Exception) -> EngineStepError | None:
        """End the requests of the batch whose step raised `exc` and free their blocks, with the
        blocks the step never wrote out of the prefix cache; the error they end with, or None
        where the engine cannot go on (a failure before the batch was made, or see
        step_failure.recoverable)."""
        batch = self.scheduler.last_batch
        tensor_parallel = isinstance(self.runner, TensorParallelRunner)
        if batch is None or not recoverable(exc, tensor_parallel):
            return None
        request_ids = list(dict.fromkeys(seq.request.request_id for seq in batch.seqs))
        logger.error("a step failed; ending its %d request(s)", len(request_ids), exc_info=exc)
        for seq in batch.seqs:
            self.block_manager.forget_unwritten(seq)
        for request_id in request_ids:
            self.abort(request_id)
        return step_error(exc, request_ids)

    def _step(self) -> list[RequestOutput]:
        failed = self._settle_grammars() if self._compiling else []
        if self.speculator is not None:
            self.speculator.draft(self.scheduler.running)
        batch = self.scheduler.schedule()
        if not batch:
            if self._compiling:  # everything waits for a grammar: don't spin
                futures = [r.constraints.grammar for r in self._compiling if r.constraints]
                concurrent.futures.wait(
                    [f for f in futures if f is not None],
                    timeout=0.005,
                    return_when=concurrent.futures.FIRST_COMPLETED,
                )
            return failed
        now = time.monotonic()
        for seq in batch.seqs:
            if seq.request.first_scheduled_time is None:
                seq.request.first_scheduled_time = now
        results = self.runner.run(batch)
        deltas: dict[str, list[CompletionOutput]] = {}
        verifying: list[tuple[Sequence, Verification]] = []
        for seq, num_new, result in zip(batch.seqs, batch.num_new_tokens, results, strict=True):
            # drafted tokens count as computed only once the model agrees with them
            seq.num_computed_tokens += num_new - len(seq.draft_token_ids)
            if seq.request.pooling is not None:
                if seq.num_computed_tokens >= seq.num_tokens:
                    self._finish_embedding(seq)
                continue
            if result is None:
                continue
            if isinstance(result, Verification):
                verifying.append((seq, result))
                token_id, logprob = result.token_id, result.logprob
            else:
                token_id, logprob = result
            deltas.setdefault(seq.request.request_id, []).append(
                self._advance(seq, token_id, logprob)
            )
        if verifying:
            self._verify(verifying, deltas)
        outputs = failed
        for request_id, pieces in deltas.items():
            request = self.requests[request_id]
            outputs.append(self._request_output(request, pieces))
            if request.is_finished:
                del self.requests[request_id]
        return outputs

    def _verify(
        self,
        verifying: list[tuple[Sequence, Verification]],
        deltas: dict[str, list[CompletionOutput]],
    ) -> None:
        """Keep each sequence's drafted tokens while they equal what is sampled at their positions,
        one position at a time for all of them (engine/core/speculation.py); the first sampled
        token (already advanced) was the first draft's position's."""
        assert self.speculator is not None
        active, position = verifying, 0
        while active:
            going_on = []
            for seq, verification in active:
                drafts = seq.draft_token_ids
                if (
                    position < len(drafts)
                    and not seq.is_finished
                    and seq.token_ids[-1] == drafts[position]
                ):
                    seq.num_computed_tokens += 1  # the draft's keys and values are the token's
                    going_on.append((seq, verification))
                else:  # the token differed (or ended the sequence), or every draft held
                    self.speculator.record(seq, len(drafts), position)
                    seq.draft_token_ids = []
            if not going_on:
                break
            # the position after the draft that held
            rows = torch.stack(
                [verification.later_logits[position] for _, verification in going_on]
            )
            sampled = self.runner.sample(rows, [seq for seq, _ in going_on])
            for (seq, _), (token_id, logprob) in zip(going_on, sampled, strict=True):
                deltas[seq.request.request_id].append(self._advance(seq, token_id, logprob))
            active, position = going_on, position + 1
        for pieces in deltas.values():
            if len(pieces) > 1:
                pieces[:] = _merged(pieces)

    def _advance(self, seq: Sequence, token_id: int, logprob) -> CompletionOutput:
        """Append a sampled token, check every stop condition, and return the sequence's delta."""
        seq.append_token(token_id)
        self._generation_tokens_total += 1
        if logprob is not None:
            seq.logprobs.append(logprob)
        params = seq.params
        grammar_done = seq.grammar is not None and seq.grammar.accept(token_id)
        may_stop = seq.num_output_tokens >= params.min_tokens
        finish_reason: str | None = None
        stop_reason: int | str | None = None
        stop_token_ids = params.stop_token_ids or ()
        stop_token = may_stop and (
            token_id in stop_token_ids or (not params.ignore_eos and token_id in self.eos_token_ids)
        )
        if stop_token:
            finish_reason = "stop"
            stop_reason = token_id if token_id in stop_token_ids else None
        if seq.detokenizer is not None and not (
            stop_token and not params.include_stop_str_in_output
        ):
            stop_string = seq.detokenizer.add_token(token_id)
            if stop_string is not None and may_stop and finish_reason is None:
                finish_reason, stop_reason = "stop", stop_string
        if finish_reason is None and grammar_done:
            finish_reason = "stop"
        if finish_reason is None and (
            (params.max_tokens is not None and seq.num_output_tokens >= params.max_tokens)
            or seq.num_tokens >= self.max_model_len
        ):
            finish_reason = "length"
        if finish_reason is not None:
            seq.finish_reason, seq.stop_reason = finish_reason, stop_reason
            self.scheduler.finish(seq)
            if self.speculator is not None:
                self.speculator.finished(seq)
        return CompletionOutput(
            seq.index,
            self._take_text(seq, finish_reason is not None),
            [token_id],
            [logprob] if logprob is not None else None,
            finish_reason,
            stop_reason,
        )

    @staticmethod
    def _take_text(seq: Sequence, finished: bool) -> str:
        return seq.detokenizer.take_delta(finished) if seq.detokenizer is not None else ""

    def _request_output(self, request: Request, pieces: list[CompletionOutput]) -> RequestOutput:
        metrics = RequestMetrics(
            request.arrival_time,
            request.first_scheduled_time,
            min((s.first_token_time for s in request.seqs if s.first_token_time), default=None),
        )
        finished = request.is_finished
        if finished:
            metrics.finished_time = time.monotonic()
        first = request.seqs[0]
        prompt_logprobs = None
        # the whole prompt is computed once a token is sampled (a finished sequence's count of
        # computed tokens is back at 0: with max_tokens=1, the step that ends the prompt ends it)
        if first.prompt_logprobs is not None and (
            first.num_output_tokens > 0 or first.num_computed_tokens >= first.num_prompt_tokens
        ):
            prompt_logprobs, first.prompt_logprobs = first.prompt_logprobs, None  # handed over once
        return RequestOutput(
            request.request_id,
            request.prompt,
            request.prompt_token_ids,
            pieces,
            finished,
            request.num_cached_tokens,
            metrics,
            prompt_logprobs,
        )

    # --- embeddings -------------------------------------------------------------------------------
    def add_embeddings(
        self, request_ids: list[str], prompts: list[list[int]], pooling: str = "last"
    ) -> list[Request]:
        """Queue one embedding request per prompt (all checked before any is queued). Each is a
        sequence of the scheduler like any other, prefilled within the step's token budget next to
        the running decodes (in chunks if need be); it never samples, and its blocks are freed once
        its prompt is computed. Its L2-normalized float32 vector, of the final hidden states pooled
        over its tokens (`mean`) or taken at its last (`last`), is then in `request.embedding`, and
        the request among those take_embedded() returns."""
        if pooling not in POOLING:
            raise InvalidParameterError(
                f"pooling must be one of {', '.join(POOLING)}", param="pooling"
            )
        for token_ids in prompts:
            self._validate_prompt(token_ids, EMBED_PARAMS)
        taken = [i for i in request_ids if i in self.requests]
        if taken or len(set(request_ids)) != len(request_ids):
            raise InvalidParameterError(
                f"request id {(taken or request_ids)[0]!r} is already in use", param="request_id"
            )
        requests = []
        for request_id, token_ids in zip(request_ids, prompts, strict=True):
            params = SamplingParams(max_tokens=1)
            request = Request(request_id, list(token_ids), params, pooling=pooling)
            self.scheduler.add(request.seqs[0])
            self.requests[request_id] = request
            requests.append(request)
            self._prompt_tokens_total += len(token_ids)  # as vLLM counts pooling requests'
        return requests

    def _finish_embedding(self, seq: Sequence) -> None:
        request = seq.request
        self.scheduler.finish(seq)
        pooled, seq.pooled = seq.pooled, None
        assert pooled is not None  # the runner pooled every chunk
        if request.pooling == "mean":
            pooled = pooled / seq.num_tokens
        request.embedding = torch.nn.functional.normalize(pooled, dim=0).cpu()
        del self.requests[request.request_id]
        self._embedded.append(request)

    def take_embedded(self) -> list[Request]:
        """The embedding requests finished since the last call (their vectors in `embedding`)."""
        done, self._embedded = self._embedded, []
        return done

    def embed(self, prompts: list[list[int]], pooling: str = "last") -> list[torch.Tensor]:
        """The embeddings of `prompts` (as add_embeddings computes them), stepping the engine until
        they are done. Requests generating meanwhile advance in the same steps; their outputs come
        from the next step()."""
        ids = [f"embed-{next(_embed_ids)}" for _ in prompts]
        requests = self.add_embeddings(ids, prompts, pooling)
        mine = {id(request) for request in requests}
        try:
            while any(request.embedding is None for request in requests):
                self._held_outputs.extend(self._guarded_step())
        except BaseException:
            for request_id in ids:
                self.abort(request_id)
            raise
        finally:
            self._embedded = [r for r in self._embedded if id(r) not in mine]
        return [request.embedding for request in requests if request.embedding is not None]

    def prompt_logits(self, token_ids: list[int]) -> torch.Tensor:
        """[len(token_ids), vocab] float32 logits of one prompt, computed outside the batch (parity
        checks)."""
        request = Request("prompt-logits", list(token_ids), SamplingParams(max_tokens=1))
        seq = request.seqs[0]
        if not self.block_manager.allocate(seq, len(token_ids)):
            raise InvalidParameterError("not enough free KV blocks for this prompt", param="prompt")
        try:
            return self.runner.prompt_logits(seq)
        finally:
            self.block_manager.free(seq)

    # --- introspection ----------------------------------------------------------------------------
    def stats(self) -> EngineStats:
        bm = self.block_manager
        spec = self.spec_counts()
        return EngineStats(
            num_running=len({s.request.request_id for s in self.scheduler.running}),
            num_waiting=len({s.request.request_id for s in self.scheduler.waiting}),
            kv_cache_usage=bm.usage,
            num_blocks=bm.num_blocks,
            prefix_cache_queries=bm.prefix_cache_queries,
            prefix_cache_hits=bm.prefix_cache_hits,
            num_preemptions=self.scheduler.num_preemptions,
            prompt_tokens_total=self._prompt_tokens_total,
            generation_tokens_total=self._generation_tokens_total,
            spec_draft_tokens_total=spec[0],
            spec_accepted_tokens_total=spec[1],
        )


def _model_info(runtime: EngineRuntime, vocab_size: int) -> ModelInfo:
    """The one place that reads where the model came from (the runtime's files and config)."""
    source = runtime.files.source
    return ModelInfo(
        name=runtime.model_name,
        source_kind=source.kind,
        source_path=source.path,
        config_dir=runtime.files.directory,
        load_format=runtime.config.load_format,
        vocab_size=vocab_size,
        max_model_len=runtime.max_model_len,
        dtype=runtime.dtype,
        device=runtime.device.type,
        eos_token_ids=tuple(sorted(runtime.eos_token_ids)),
        family=family_name(runtime.hf_config),
    )


def _merged(pieces: list[CompletionOutput]) -> list[CompletionOutput]:
    """One delta per sample, in order of first appearance (a speculative step advances a sample by
    several tokens)."""
    merged: dict[int, CompletionOutput] = {}
    for piece in pieces:
        if piece.index in merged:
            merged[piece.index].merge(piece)
        else:
            merged[piece.index] = piece
    return list(merged.values())
