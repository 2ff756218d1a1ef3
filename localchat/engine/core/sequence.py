"""Sequence: one sample being generated (a request with n > 1 has n of them); Request groups
them."""

from __future__ import annotations

import enum
import itertools
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from localchat.engine.sampling.sampling_params import SamplingParams

if TYPE_CHECKING:
    from localchat.engine.core.multimodal import ImageInput
    from localchat.engine.sampling.detokenizer import IncrementalDetokenizer
    from localchat.engine.sampling.guided_decoding import GrammarState
    from localchat.engine.sampling.request_constraints import RequestConstraints


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(slots=True)
class TokenLogprob:
    """The chosen token's logprob and the most likely alternatives at that step (token id,
    logprob)."""

    token_id: int
    logprob: float
    rank: int
    top: list[tuple[int, float]]


_seq_counter = itertools.count()


class Sequence:
    """Token ids, KV block tables and progress of one sample.

    `num_computed_tokens` counts tokens whose keys/values are in the pool; the sequence needs
    compute until it reaches `num_tokens`, and samples a new token each step that ends there.
    `num_cached_tokens` is the prefix-cache hit of its first scheduling.
    """

    def __init__(self, request: Request, index: int, prompt_token_ids: list[int]):
        self.seq_id = next(_seq_counter)
        self.request = request
        self.index = index
        self.params: SamplingParams = request.params
        self.token_ids: list[int] = list(prompt_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        self.num_computed_tokens = 0
        self.num_cached_tokens: int | None = None
        # one block table per KV group (engine/core/kv_groups.py; -1 where a sliding window's block
        # was given back), set by the BlockManager; the hash of each full block, as registered
        self.block_tables: list[list[int]] = []
        self.block_hashes: list[int] = []
        self.status = SequenceStatus.WAITING
        self.finish_reason: str | None = None
        self.stop_reason: int | str | None = None
        self.logprobs: list[TokenLogprob] = []
        # filled by the model runner as prefill chunks are computed (position 0 has none); the first
        # sample of a request alone computes them, and hands them over with its first token
        self.prompt_logprobs: list[TokenLogprob | None] | None = None
        if self.params.prompt_logprobs is not None and index == 0:
            self.prompt_logprobs = [None] * self.num_prompt_tokens
        self.num_preemptions = 0
        self.kv_salt: object = None  # see BlockManager.length_salt
        self.generator: torch.Generator | None = None
        if self.params.seed is not None:
            self.generator = torch.Generator().manual_seed(
                (self.params.seed + index * 1_000_003) % 2**63
            )
        # set by the engine when it has a tokenizer
        self.detokenizer: IncrementalDetokenizer | None = None
        # its own grammar matcher, once the request's grammar has compiled
        self.grammar: GrammarState | None = None
        # an embedding request's pooled float32 hidden state so far (the sum of the chunks computed
        # with mean pooling, the last token's with last pooling), filled by the model runner
        self.pooled: torch.Tensor | None = None
        self.first_token_time: float | None = None
        # speculative decoding: this step's drafted tokens, computed after token_ids and kept only
        # where the model agrees (engine/core/speculation.py), and the drafter's state
        self.draft_token_ids: list[int] = []
        self.drafter: object | None = None

    @property
    def block_table(self) -> list[int]:
        """The first KV group's blocks (a model without windows has no other)."""
        return self.block_tables[0] if self.block_tables else []

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def append_token(self, token_id: int) -> None:
        self.token_ids.append(token_id)
        if self.first_token_time is None:
            self.first_token_time = time.monotonic()

    def __repr__(self) -> str:
        return (
            f"Sequence(id={self.seq_id}, request={self.request.request_id!r}, "
            f"tokens={self.num_tokens}, computed={self.num_computed_tokens}, "
            f"blocks={len(self.block_table)}, {self.status.value})"
        )


@dataclass(eq=False)
class Request:
    """A user's request: its prompt, parameters and the n sequences sampled for it."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    prompt: str | None = None
    arrival_time: float = field(default_factory=time.monotonic)
    first_scheduled_time: float | None = None
    seqs: list[Sequence] = field(default_factory=list)
    # grammar, logit_bias, allowed_token_ids, bad_words: set by the engine when params ask for any
    constraints: RequestConstraints | None = None
    # an embedding request (prefill only, never samples): how its hidden states are pooled, and its
    # L2-normalized vector once the prompt is computed
    pooling: str | None = None
    embedding: torch.Tensor | None = None
    # the prompt's images, in order (engine/core/multimodal.py)
    images: tuple[ImageInput, ...] = ()

    def __post_init__(self) -> None:
        self.seqs = [Sequence(self, i, self.prompt_token_ids) for i in range(self.params.n)]

    @property
    def is_finished(self) -> bool:
        return all(seq.is_finished for seq in self.seqs)

    @property
    def num_cached_tokens(self) -> int:
        return self.seqs[0].num_cached_tokens or 0
