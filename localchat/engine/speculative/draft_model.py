"""DraftModel: the draft_model method. A small model with the model's tokenizer, loaded as the
model is (EngineRuntime), drafts each sequence's next tokens greedily through a ModelRunner of its
own on the same device, with a paged KV pool and a BlockManager of its own (whose prefix cache
serves a request's samples and the next turn of a chat).

The draft model follows each sequence with a shadow sequence: the sequence's tokens as the draft
model has them, and how many of them are in its KV pool (`num_computed_tokens`). Before a step's
drafts, each shadow is brought back to the sequence: its tokens past the longest prefix they share
(drafts the model rejected) are dropped and its computed count is set back to at most that prefix
(their keys and values are overwritten later). Then one forward for all drafting sequences computes
what each shadow has not seen (the prompt the first time, in chunks within the token budget; then
the tokens accepted and sampled since) and samples its first draft, and each further forward (one
per draft position, all drafting sequences in one batch) feeds the previous draft and samples the
next. A shadow's blocks are freed when its sequence finishes, is preempted or aborted, or the
speculative config changes.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable

from localchat.engine.core.block_manager import BlockManager
from localchat.engine.core.runtime import EngineRuntime
from localchat.engine.core.scheduler import ScheduledBatch
from localchat.engine.core.sequence import Request, Sequence, SequenceStatus
from localchat.engine.modeling.model_runner import ModelRunner
from localchat.engine.sampling.sampling_params import SamplingParams
from localchat.engine.speculative.config import SpeculativeConfig, config_error
from localchat.errors import InvalidParameterError
from localchat.utils import format_bytes

logger = logging.getLogger("localchat.engine")
KV_SHARE = 4  # the draft's KV pool: a quarter of the model's KV bytes (at least one sequence)
# strings whose token ids the two tokenizers must agree on
PROBES = (
    "Hello, world! How are you today?",
    "def merge(left, right):\n    return sorted(left + right)  # 42",
    "Ünïcödé, 数字 and émojis 🙂 in\ttabs",
)
_GREEDY = SamplingParams(temperature=0.0)


def draft_key(config: SpeculativeConfig) -> tuple:
    """What identifies a loaded draft model (a config that differs only otherwise reuses it)."""
    return (config.model, config.quantization, config.load_format)


class DraftModel:
    """A loaded draft model, its KV pool, and the shadow of each sequence it drafts for."""

    def __init__(
        self,
        key: tuple,
        runtime: EngineRuntime,
        runner: ModelRunner,
        block_manager: BlockManager,
        max_num_batched_tokens: int,
    ) -> None:
        self.key = key
        self.runtime = runtime
        self.runner = runner
        self.block_manager = block_manager
        self.max_num_batched_tokens = max_num_batched_tokens
        self.shadows: dict[int, _Shadow] = {}  # by the sequence's seq_id

    @classmethod
    def load(
        cls,
        config: SpeculativeConfig,
        main: EngineRuntime,
        vocab_size: int,
        kv_bytes: int,
        progress: Callable[[str], None] | None = None,
    ) -> DraftModel:
        """Load `config.model` on the main runtime's device, for its context and batch limits;
        its vocabulary must be the model's (`vocab_size` tokens, the same ids for PROBES), and its
        KV pool takes 1/KV_SHARE of the model's `kv_bytes`. Raises InvalidParameterError naming
        speculative_config's field that is wrong."""
        assert config.model is not None
        draft_config = dataclasses.replace(
            main.config,
            model=config.model,
            tokenizer=None,
            quantization=config.quantization,
            load_format=config.load_format,
            dtype=str(main.dtype).removeprefix("torch."),
            device=main.device.type,
            max_model_len=None,  # its own context; drafting stops past it (or the model's)
            kv_cache_memory=None,
            max_num_seqs=main.max_num_seqs,
            max_num_batched_tokens=main.max_num_batched_tokens,
            chat_template=None,
            speculative_config=None,
        )
        say = progress or (lambda message: None)
        say(f"loading the draft model {config.model}")
        try:
            runtime = EngineRuntime.load(draft_config, progress)
        except InvalidParameterError as exc:
            raise config_error(f"{config.model}: {exc.message}", "model") from exc
        max_model_len = min(runtime.max_model_len, main.max_model_len)
        runner = ModelRunner(
            runtime.model,
            runtime.hf_config,
            device=runtime.device,
            dtype=runtime.dtype,
            kv_cache_dtype=runtime.kv_cache_dtype,
            block_size=main.config.block_size,
            max_model_len=max_model_len,
            eos_token_ids=runtime.eos_token_ids,
            max_num_seqs=main.max_num_seqs,
        )
        check_vocabulary(
            config.model, runner.spec.vocab_size, runtime.tokenizer, vocab_size, main.tokenizer
        )
        if runner.rotary.depends_on_length:
            raise config_error(
                f"{config.model}: a length-dependent rope scaling (longrope, dynamic NTK) is not "
                "supported for a draft model",
                "model",
            )
        if any(window is not None for window in runner.kv_layout.windows):
            raise config_error(
                f"{config.model}: a draft model with sliding-window layers is not supported yet",
                "model",
            )
        block_size = main.config.block_size
        per_block = runner.bytes_per_block()
        needed = runner.kv_layout.blocks_per_sequence(
            max_model_len, block_size, main.max_num_batched_tokens
        )
        num_blocks = max(needed, kv_bytes // KV_SHARE // per_block)
        runner.allocate_kv_cache(num_blocks)
        logger.info(
            "draft model %s: KV cache of %d blocks (%s)",
            config.model,
            num_blocks,
            format_bytes(num_blocks * per_block),
        )
        # its prefix cache holds the sequences' own tokens only: a step registers the full blocks
        # before its drafts, and a shadow is set back to no earlier than that
        block_manager = BlockManager(num_blocks, block_size)
        return cls(draft_key(config), runtime, runner, block_manager, main.max_num_batched_tokens)

    @property
    def max_model_len(self) -> int:
        """The longest sequence it drafts for (its context, at most the model's)."""
        return self.runner.max_model_len

    # --- shadows ----------------------------------------------------------------------------------
    def _shadow(self, seq: Sequence) -> Sequence:
        """The shadow of `seq`, brought back to its tokens: what the two share is kept, and at most
        that (and never the last token, whose logits the first draft comes from) counts as
        computed."""
        entry = self.shadows.get(seq.seq_id)
        if entry is None:
            entry = self.shadows[seq.seq_id] = _Shadow(seq)
        shadow, mine, theirs = entry.shadow, entry.shadow.token_ids, seq.token_ids
        # the shadow's tokens up to `synced` were the sequence's then: compare the rest
        common = min(len(mine), len(theirs), entry.synced)
        end = min(len(mine), len(theirs))
        while common < end and mine[common] == theirs[common]:
            common += 1
        del mine[common:]
        mine.extend(theirs[common:])
        entry.synced = len(theirs)
        shadow.num_computed_tokens = min(shadow.num_computed_tokens, common, len(theirs) - 1)
        return shadow

    def release(self, seq: Sequence) -> None:
        """Free the blocks of `seq`'s shadow (it finished, was preempted or aborted)."""
        entry = self.shadows.pop(seq.seq_id, None)
        if entry is not None:
            self.block_manager.free(entry.shadow)

    def release_all(self) -> None:
        for entry in list(self.shadows.values()):
            self.release(entry.seq)

    def _sweep(self) -> None:
        """Free the shadows of sequences that are no longer running (finished, aborted, or
        preempted: one that comes back is prefilled again)."""
        for entry in list(self.shadows.values()):
            if entry.seq.status is not SequenceStatus.RUNNING:
                self.release(entry.seq)

    # --- drafting ---------------------------------------------------------------------------------
    def propose(self, wanted: list[tuple[Sequence, int]]) -> None:
        """Set each sequence's `draft_token_ids` to the draft model's greedy continuation of it,
        `k` tokens long (none where its prompt is still being prefilled into the draft's pool
        within the token budget, the pool has no room for it, it is longer than the draft's
        context, or it has images)."""
        self._sweep()
        budget = self.max_num_batched_tokens
        batch = ScheduledBatch()
        drafts: dict[int, tuple[Sequence, int, list[int]]] = {}  # id(shadow): (seq, k, drafts)
        for seq, k in wanted:
            seq.draft_token_ids = []
            if (
                seq.request.images  # the draft model never sees images
                or budget <= 0
                or seq.num_tokens + k - 1 > self.max_model_len
            ):
                continue
            shadow = self._shadow(seq)
            # a new shadow starts from the draft's prefix cache (n > 1, the next turn of a chat)
            cached = None if shadow.block_tables else self.block_manager.find_cached_prefix(shadow)
            start = len(cached) * self.block_manager.block_size if cached else 0
            own = shadow.num_tokens - max(shadow.num_computed_tokens, start)
            num_new = min(own, budget)
            # room for its own tokens and all but the last draft (whose keys are never needed)
            extra = k - 1 if num_new == own else 0
            if not self.block_manager.allocate(shadow, num_new + extra, cached):
                continue
            batch.seqs.append(shadow)
            batch.num_new_tokens.append(num_new)
            drafts[id(shadow)] = (seq, k, seq.draft_token_ids)
            budget -= num_new
        while batch:  # one forward per draft position, for every sequence still drafting
            results = self.runner.run(batch)
            going = ScheduledBatch()
            for shadow, num_new, result in zip(
                batch.seqs, batch.num_new_tokens, results, strict=True
            ):
                shadow.num_computed_tokens += num_new
                if not isinstance(result, tuple):
                    continue  # a prefill chunk short of its end
                _, k, draft = drafts[id(shadow)]
                draft.append(result[0])
                shadow.token_ids.append(result[0])
                if len(draft) < k:
                    going.seqs.append(shadow)
                    going.num_new_tokens.append(1)
            batch = going


def check_vocabulary(
    name: str, draft_vocab: int, draft_tokenizer, vocab_size: int, tokenizer
) -> None:
    """Refuse a draft model whose vocabulary is not the model's: another size, or other token ids
    for any of PROBES (where both have a tokenizer)."""
    if draft_vocab != vocab_size:
        raise config_error(
            f"{name} has a vocabulary of {draft_vocab} tokens, the model one of {vocab_size}: a "
            "draft model must share the model's tokenizer",
            "model",
        )
    if tokenizer is None or draft_tokenizer is None:
        return
    for probe in PROBES:
        mine = draft_tokenizer.encode(probe, add_special_tokens=False)
        if mine != tokenizer.encode(probe, add_special_tokens=False):
            raise config_error(
                f"{name}'s tokenizer gives {probe!r} other token ids than the model's: a draft "
                "model must share the model's tokenizer",
                "model",
            )


class _Shadow:
    """A sequence, and its shadow: its tokens as the draft model has them (and this step's drafts
    after them), the shadow's num_computed_tokens counting those in the draft's KV pool; the
    sequence's first `synced` tokens were the shadow's when it was last brought back to it."""

    __slots__ = ("seq", "shadow", "synced")

    def __init__(self, seq: Sequence) -> None:
        self.seq = seq
        self.shadow = Request(f"draft-{seq.seq_id}", list(seq.token_ids), _GREEDY).seqs[0]
        self.shadow.status = SequenceStatus.RUNNING
        self.synced = seq.num_tokens
