"""Speculation: each step, drafts for the running sequences that are decoding, and the count of
drafted and accepted tokens.

A sequence's drafts are scheduled after its last token and computed in the same forward
(ModelRunner.run hands back a Verification). The engine then samples position by position, each
time as it would without speculation (penalties, grammar and stop checks see the tokens accepted so
far), and keeps a draft only while it equals the token sampled at its position: the first token that
differs is sampled from the model's distribution there and ends the step. Drafts from prompt lookup
are certain guesses (a draft distribution of one token), for which this is Leviathan et al.'s
rejection sampling: a draft d is kept with probability p(d), and otherwise the token comes from p
without d, renormalized, which together is p. So greedy output is token for token the same, sampled
output follows the same distribution, and a seeded request draws the same numbers in the same order.
Keys and values computed for rejected drafts are left in the sequence's blocks, past its computed
tokens, and are overwritten as it goes on; they are never registered in the prefix cache.
A draft model's drafts are its greedy tokens: certain guesses too
(engine/speculative/draft_model.py).
"""

from __future__ import annotations

from localchat.engine.core.sequence import Sequence, SequenceStatus
from localchat.engine.speculative.config import SpeculativeConfig
from localchat.engine.speculative.draft_length import DraftLength
from localchat.engine.speculative.draft_model import DraftModel
from localchat.engine.speculative.ngram import NgramIndex
from localchat.engine.speculative.suffix import SuffixCache, SuffixDrafter


class _Drafter:
    __slots__ = ("index", "length")

    def __init__(self, config: SpeculativeConfig, cache: SuffixCache | None) -> None:
        self.index: NgramIndex | SuffixDrafter | None = None  # None: a draft model's
        if config.method == "ngram":
            self.index = NgramIndex(config.prompt_lookup_min, config.prompt_lookup_max)
        elif cache is not None:
            self.index = SuffixDrafter(
                cache, config.suffix_decoding_max_spec_factor, config.suffix_decoding_min_token_prob
            )
        self.length = DraftLength(config.num_speculative_tokens, config.adaptive)


class Speculator:
    """Drafts tokens for decoding sequences by the configured method and counts how they fare."""

    def __init__(
        self, config: SpeculativeConfig, max_model_len: int, draft_model: DraftModel | None = None
    ) -> None:
        self.config = config
        self.draft_model = draft_model  # the draft_model method's
        self.max_model_len = max_model_len
        self.num_drafts = 0  # verifications (steps of a sequence with drafts)
        self.num_draft_tokens = 0
        self.num_accepted_tokens = 0
        self.cache: SuffixCache | None = None
        if config.method == "suffix":
            self.cache = SuffixCache(
                config.suffix_decoding_max_tree_depth, config.suffix_decoding_max_cached_requests
            )

    def draft(self, running: list[Sequence]) -> None:
        """Set each running sequence's `draft_token_ids` for the next step (empty where it is not
        decoding, has no room left, or its lookup finds nothing); a draft model drafts for all of
        them at once."""
        wanted: list[tuple[Sequence, int]] = []
        for seq in running:
            seq.draft_token_ids = []
            if (
                seq.status is not SequenceStatus.RUNNING
                or seq.request.pooling is not None
                or seq.num_computed_tokens != seq.num_tokens - 1
            ):
                continue
            room = self.max_model_len - seq.num_tokens - 1
            max_tokens = seq.params.max_tokens
            if max_tokens is not None:  # the token sampled after the drafts counts too
                room = min(room, max_tokens - seq.num_output_tokens - 1)
            if room <= 0:
                continue
            drafter = seq.drafter
            if not isinstance(drafter, _Drafter):
                drafter = seq.drafter = _Drafter(self.config, self.cache)
            k = min(drafter.length.next(), room)
            if k > 0 and drafter.index is not None:
                seq.draft_token_ids = drafter.index.propose(seq.token_ids, k)
            elif k > 0:
                wanted.append((seq, k))
        if self.draft_model is not None:
            self.draft_model.propose(wanted)

    def record(self, seq: Sequence, drafted: int, accepted: int) -> None:
        """The outcome of a sequence's verified drafts: the first `accepted` of `drafted` held."""
        self.num_drafts += 1
        self.num_draft_tokens += drafted
        self.num_accepted_tokens += accepted
        if isinstance(seq.drafter, _Drafter):
            seq.drafter.length.record(drafted, accepted)

    def finished(self, seq: Sequence) -> None:
        """A sequence ended: its output joins the suffix method's shared tree, and a draft model
        frees its blocks."""
        if self.draft_model is not None:
            self.draft_model.release(seq)
        if self.cache is not None and seq.request.pooling is None:
            self.cache.add_output(seq.seq_id, seq.output_token_ids)
