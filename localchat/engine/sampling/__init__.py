"""Sampling: sampling params, the sampler, penalties, logits processors, stops, detokenizing."""
