"""Scheduler: continuous batching with a token budget, chunked prefill and preemption by
recompute."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from localchat.engine.core.block_manager import BlockManager
from localchat.engine.core.multimodal import whole_images
from localchat.engine.core.sequence import Sequence, SequenceStatus


@dataclass
class ScheduledBatch:
    """The sequences to run this step and how many of their tokens each computes.

    A sequence samples a token when its scheduled tokens reach its end (`samples[i]`); a partial
    prefill chunk does not.
    """

    seqs: list[Sequence] = field(default_factory=list)
    num_new_tokens: list[int] = field(default_factory=list)
    num_preempted: int = 0

    @property
    def num_tokens(self) -> int:
        return sum(self.num_new_tokens)

    def __bool__(self) -> bool:
        return bool(self.seqs)


class Scheduler:
    """Decides, each step, which sequences advance and by how many tokens.

    Running sequences go first, oldest first, so decodes keep advancing while a long prompt is
    prefilled in chunks from what is left of the budget. When the pool runs dry the newest running
    sequence is preempted: its blocks are freed and it is recomputed later (its cached blocks often
    survive). Waiting sequences are admitted in arrival order while budget, sequence slots and
    blocks last. Embedding requests are sequences too: they take part in the same budget and are
    prefilled (in chunks if need be) alongside the decodes, but never take the prefix cache, whose
    tokens they would have no hidden states of.
    """

    def __init__(self, block_manager: BlockManager, max_num_seqs: int, max_num_batched_tokens: int):
        self.block_manager = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        self.last_batch: ScheduledBatch | None = None  # what schedule() returned last
        # a prefill chunk never ends inside an image (image tokens that attend both ways: Gemma 3)
        self.whole_images = False

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> ScheduledBatch:
        batch = ScheduledBatch()
        budget = self.max_num_batched_tokens
        index = 0
        while index < len(self.running) and budget > 0:
            seq = self.running[index]
            if self.block_manager.must_recompute(seq):
                self._recompute(seq)
                continue
            own = seq.num_tokens - seq.num_computed_tokens
            num_new = min(own + len(seq.draft_token_ids), budget)
            if num_new - own < len(seq.draft_token_ids):  # drafts past the budget are dropped
                seq.draft_token_ids = seq.draft_token_ids[: max(num_new - own, 0)]
            if seq.draft_token_ids and not self.block_manager.allocate(seq, num_new):
                seq.draft_token_ids = []  # no sequence is preempted to make room for guesses
                num_new = min(own, budget)
            if seq.request.images and self.whole_images:
                num_new = whole_images(seq.request.images, seq.num_computed_tokens, num_new)
                if num_new == 0:  # the rest of an image waits for a step with room for it
                    index += 1
                    continue
            if not self._allocate_or_preempt(seq, num_new, batch):
                break  # seq itself was preempted: it was the newest, so nothing after it is left
            batch.seqs.append(seq)
            batch.num_new_tokens.append(num_new)
            budget -= num_new
            index += 1
        if batch.num_preempted == 0:
            self._admit_waiting(batch, budget)
        self.last_batch = batch
        return batch

    def _allocate_or_preempt(self, seq: Sequence, num_new: int, batch: ScheduledBatch) -> bool:
        while not self.block_manager.allocate(seq, num_new):
            victim = self.running.pop()
            self._preempt(victim)
            batch.num_preempted += 1
            if victim is seq:
                return False
        return True

    def _admit_waiting(self, batch: ScheduledBatch, budget: int) -> None:
        skipped: list[Sequence] = []
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting.popleft()
            if self._waits_for_sibling(seq) or _waits_for_grammar(seq):
                skipped.append(seq)
                continue
            embedding = seq.request.pooling is not None
            cached = None if embedding else self.block_manager.find_cached_prefix(seq)
            num_cached = len(cached or ()) * self.block_manager.block_size
            num_new = min(seq.num_tokens - num_cached, budget)
            if seq.request.images and self.whole_images:
                num_new = whole_images(seq.request.images, num_cached, num_new)
            if num_new == 0 or not self.block_manager.allocate(seq, num_new, cached):
                if num_new == 0 and cached:
                    seq.block_hashes = []
                self.waiting.appendleft(seq)
                break
            if embedding:
                seq.num_cached_tokens = 0
            elif seq.num_cached_tokens is None:
                seq.num_cached_tokens = num_cached
                self.block_manager.record_prefix_query(seq.num_prompt_tokens, num_cached)
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            batch.seqs.append(seq)
            batch.num_new_tokens.append(num_new)
            budget -= num_new
        self.waiting.extendleft(reversed(skipped))

    def _waits_for_sibling(self, seq: Sequence) -> bool:
        """Samples 2..n of a request wait until the first has its prompt's full blocks scheduled
        (and so registered in the prefix cache), then share them instead of computing the prompt
        again."""
        if seq.index == 0 or seq.num_output_tokens:
            return False
        first = seq.request.seqs[0]
        num_full_blocks = first.num_prompt_tokens // self.block_manager.block_size
        return not first.is_finished and len(first.block_hashes) < num_full_blocks

    def _preempt(self, seq: Sequence) -> None:
        self.block_manager.free(seq)
        seq.draft_token_ids = []
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)

    def _recompute(self, seq: Sequence) -> None:
        """Send a running sequence back to be computed again from its first token (not a
        preemption: memory is not short)."""
        self.running.remove(seq)
        self.block_manager.free(seq)
        seq.draft_token_ids = []
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)

    def finish(self, seq: Sequence) -> None:
        """Take a finished or aborted sequence out of the queues and free its blocks."""
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
        elif seq.status is SequenceStatus.WAITING:
            self.waiting.remove(seq)
        self.block_manager.free(seq)
        seq.status = SequenceStatus.FINISHED


def _waits_for_grammar(seq: Sequence) -> bool:
    """A constrained request waits until its grammar has compiled (off the engine thread) and the
    engine has given the sequence its matcher."""
    constraints = seq.request.constraints
    return constraints is not None and constraints.grammar is not None and seq.grammar is None
