"""Logits processors run before the sampler: grammar masks, logit_bias, allowed_token_ids and
bad_words, per row of the batch.

A request with any of them carries a `RequestConstraints` (request_constraints.py); a batch where
no row has one costs a host-side check per row and no tensor work.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from localchat.engine.sampling.guided_decoding import GrammarCompiler, GrammarState, bitmask_to_bool

if TYPE_CHECKING:
    from localchat.engine.core.sequence import Sequence


def banned_next_tokens(seq: Sequence, bad_words_ids: list[list[int]]) -> list[int]:
    """Tokens that would complete one of the bad words after what `seq` has generated."""
    banned = []
    output = seq.token_ids[seq.num_prompt_tokens :] if bad_words_ids else []
    for word in bad_words_ids:
        prefix = word[:-1]
        if not prefix or (len(output) >= len(prefix) and output[-len(prefix) :] == prefix):
            banned.append(word[-1])
    return banned


def apply_constraints(
    logits: torch.Tensor, seqs: list[Sequence], compiler: GrammarCompiler | None
) -> torch.Tensor:
    """Mask and bias `logits` ([len(seqs), vocab]) in place for the rows whose requests constrain
    them; returns `logits`."""
    rows = [row for row, seq in enumerate(seqs) if seq.request.constraints is not None]
    if not rows:
        return logits
    vocab = logits.shape[1]
    device = logits.device
    bias_rows, biases, grammar_rows, matchers, bans = [], [], [], [], []
    for row in rows:
        seq = seqs[row]
        constraints = seq.request.constraints
        assert constraints is not None
        if constraints.has_bias:
            bias_rows.append(row)
            biases.append(constraints.bias_row(vocab, device))
        if seq.grammar is not None:
            grammar_rows.append(row)
            matchers.append(seq.grammar.matcher)
        for token_id in banned_next_tokens(seq, constraints.bad_words_ids):
            bans.append((row, token_id))
    if bias_rows:
        index = torch.tensor(bias_rows, device=device)
        logits.index_add_(0, index, torch.stack(biases).to(logits.dtype))
    if bans:
        ban_rows, ban_tokens = zip(*bans, strict=True)
        logits[list(ban_rows), list(ban_tokens)] = float("-inf")
    if grammar_rows:
        assert compiler is not None
        bitmask = torch.zeros((len(grammar_rows), (vocab + 31) // 32), dtype=torch.int32)
        compiler.fill_bitmask(matchers, bitmask)
        allowed = bitmask_to_bool(bitmask, vocab).to(device)
        index = torch.tensor(grammar_rows, device=device)
        masked = logits.index_select(0, index).masked_fill_(~allowed, float("-inf"))
        logits.index_copy_(0, index, masked)
    return logits


def attach_grammar(seq: Sequence) -> None:
    """Give a sequence its own matcher once its request's grammar has compiled."""
    constraints = seq.request.constraints
    if constraints is None or constraints.grammar is None or seq.grammar is not None:
        return
    base = constraints.grammar.result()
    seq.grammar = GrammarState(base.deep_copy())
