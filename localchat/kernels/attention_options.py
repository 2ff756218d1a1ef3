"""The options every paged attention path takes (the torch reference in attention.py, the Triton
kernels in triton_attention.py, the CPU's fused decode in decode_attention.py): the check they
share. What each option means: attention.py."""

from __future__ import annotations


def check_options(sliding_window, softcap, sinks, num_heads: int) -> None:
    """Raise ValueError for an option no attention path can take."""
    if sliding_window is not None and sliding_window < 1:
        raise ValueError(f"sliding_window must be at least 1, not {sliding_window}")
    if softcap is not None and not softcap > 0:
        raise ValueError(f"softcap must be positive, not {softcap}")
    if sinks is not None and sinks.shape != (num_heads,):
        raise ValueError(f"sinks must be one logit per query head, [{num_heads}]")
