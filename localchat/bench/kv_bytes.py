"""The KV cache's bytes for a context, from a GGUF model's shape: what C7 records beside its timings
(issue 43: with `--kv-cache-dtype q8_0`, the KV bytes at most 0.55x of float16's).

Keys and values of `tokens` tokens in every layer: 2 x layers x KV heads x tokens x the bytes of one
head's row of head_dim values, which kernels/kv_quant.py defines for every pool dtype (q8_0: 34
bytes a block of 32 values, so 34 / 64 of float16's).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localchat.models.gguf_header import read_header

if TYPE_CHECKING:
    import torch

Q8_0_TARGET = 0.55  # issue 43, C7: q8_0 KV bytes at most this many times float16's


@dataclass(frozen=True, slots=True)
class KVShape:
    """What a token's keys and values span: layers, KV heads and the head dimension."""

    layers: int
    kv_heads: int
    head_dim: int

    def bytes(self, tokens: int, dtype: torch.dtype) -> int:
        """The bytes of `tokens` tokens' keys and values in a pool of `dtype`."""
        from localchat.kernels.kv_quant import kv_row_bytes

        return 2 * self.layers * self.kv_heads * tokens * kv_row_bytes(dtype, self.head_dim)


def gguf_kv_shape(path: Path) -> KVShape:
    """The KV shape of the GGUF model at `path`, from its `{arch}.*` metadata."""
    header = read_header(path)
    heads = header.arch_field("attention.head_count")
    head_dim = (
        header.arch_field("attention.key_length") or header.arch_field("embedding_length") // heads
    )
    return KVShape(
        header.arch_field("block_count"),
        header.arch_field("attention.head_count_kv") or heads,
        head_dim,
    )


def kv_record(shape: KVShape, tokens: int, run_dtype: torch.dtype, flag: str) -> dict[str, Any]:
    """The KV figures of a run's context: its own dtype's bytes (`flag`: the --kv-cache-dtype it
    was given), float16's and q8_0's, and q8_0 / float16 with issue 43's bound."""
    import torch

    from localchat.kernels.kv_quant import Q8_0, kv_dtype_name

    float16, q8_0 = shape.bytes(tokens, torch.float16), shape.bytes(tokens, Q8_0)
    run = shape.bytes(tokens, run_dtype)
    return {
        "tokens": tokens,
        "layers": shape.layers,
        "kv_heads": shape.kv_heads,
        "head_dim": shape.head_dim,
        "kv_cache_dtype_flag": flag,
        "run_dtype": kv_dtype_name(run_dtype),
        "run_bytes": run,
        "run_over_float16": run / float16,
        "float16_bytes": float16,
        "q8_0_bytes": q8_0,
        "q8_0_over_float16": q8_0 / float16,
        "q8_0_over_float16_max": Q8_0_TARGET,
    }


def kv_note(record: dict[str, Any]) -> str:
    """The record as one line of the report: the run's KV bytes, and q8_0 / float16 against issue
    43's bound (met or missed where the run used q8_0, else what q8_0 would hold)."""
    from localchat.utils import format_bytes

    q8_0, bound = record["q8_0_over_float16"], record["q8_0_over_float16_max"]
    shape = (
        f"KV cache for {record['tokens']:,} tokens ({record['layers']} layers x "
        f"{record['kv_heads']} KV heads x head dim {record['head_dim']})"
    )
    float16 = format_bytes(record["float16_bytes"])
    if record["run_dtype"] == "q8_0":
        verdict = "met" if q8_0 <= bound else "missed"
        return (
            f"{shape}: the run used --kv-cache-dtype q8_0, {format_bytes(record['q8_0_bytes'])}, "
            f"{q8_0:.3f}x of float16's {float16} (target <= {bound}x, {verdict})"
        )
    return (
        f"{shape}: the run used {record['run_dtype']} (--kv-cache-dtype "
        f"{record['kv_cache_dtype_flag']}), {format_bytes(record['run_bytes'])}; "
        f"--kv-cache-dtype q8_0 would hold {format_bytes(record['q8_0_bytes'])}, {q8_0:.3f}x of "
        f"float16's {float16} (target <= {bound}x)"
    )
