"""Projections with PackedWeight weights: the C++ kernels on the CPU (kernels/csrc/quant/: the
CPU's vector kernels, AVX-512 VNNI, AVX2 or NEON, and the generic ones), Triton on CUDA, torch
otherwise.

A fused projection (q/k/v, gate/up) whose parts came in different layouts (Q4_K_M files store attn_v
as Q6_K next to Q4_K q/k), or whose parts are large (an 8B model's), is a tuple of PackedWeights:
each runs on its own and the outputs are concatenated.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from localchat import envs
from localchat.kernels.activation import silu_and_mul_ref
from localchat.kernels.cpu_extension import compiler, cpu_kernels
from localchat.kernels.dispatch import use_triton
from localchat.kernels.packed_weight import FILE_BLOCKS, ROWS_PER_BLOCK, PackedWeight

QuantWeight = PackedWeight | tuple[PackedWeight, ...]
logger = logging.getLogger("localchat.kernels")


@dataclass(frozen=True)
class GemmChoices:
    """Which paths a projection on the CPU kernels takes, from the LOCALCHAT_* settings below."""

    bf16_min_rows: int | None  # from this many rows the bfloat16 GEMM (None: never)
    dense_min_rows: int | None  # from this many rows the dequantized float32 GEMM (None: never)
    int8_activations: bool | None  # one int8 code (True) or two everywhere; None: by width


# The CPU kernel computes every row of a decode or a small batch with the same integer arithmetic
# (bit for bit, whatever the batch). Where the CPU has bfloat16 instructions, a projection with at
# least BF16_GEMM_MIN_FEATURES inputs (a 1B model's and up) takes another path from
# bf16_min_rows rows on (a prefill chunk, a large batch): each band of weight rows is restored
# into bfloat16 for one oneDNN GEMM, about 3x the integer panel's throughput at 128 rows, at
# bfloat16's rounding (about 0.3% of the largest output; a row's result then depends on its
# batch). Small models keep the exact integer path: their prefill is already quick.
# LOCALCHAT_BF16_GEMM_MIN_ROWS=0 keeps the integer kernel for every batch;
# LOCALCHAT_DENSE_MIN_ROWS=N dequantizes the whole weight for one float32 GEMM from N rows on.
BF16_GEMM_MIN_FEATURES = 2048
# Activations enter the CPU kernel as int8 codes per group of 32 values. A projection with fewer
# than INT8_ACTIVATION_MIN_FEATURES inputs (a small model's: the default one's) takes two codes per
# activation (~16 bits), so its logits follow the float32 path's: with one code, the default model's
# top token differs from the float32 path's at 4.3% of positions, though its perplexity equals
# llama.cpp's (2026-12-03, docs/benchmarks-history.md). Larger projections (a 1B model's and up)
# take one code, llama.cpp's own precision (its activations are int8 per 256 values): the second
# code took about a fifth of an 8B model's decode time on AVX2 (240 against 184-196 ms a token).
# A mixture-of-experts layer's experts take their model's precision, its hidden size's
# (modeling/cpu_parts.py): a 30B model's 768-wide experts are not a small model's projections.
# LOCALCHAT_INT8_ACTIVATIONS=1 takes one code everywhere, =0 two everywhere.
INT8_ACTIVATION_MIN_FEATURES = 2048


@functools.cache
def gemm_choices() -> GemmChoices:
    """The settings, read at first use and kept: the decode hot path projects ~120 times a token
    (a test that changes them calls gemm_choices.cache_clear())."""
    bf16 = envs.BF16_GEMM_MIN_ROWS.get()
    if bf16 is None:
        bf16 = 64 if torch.ops.mkldnn._is_mkldnn_bf16_supported() else None
    return GemmChoices(bf16 or None, envs.DENSE_MIN_ROWS.get() or None, envs.INT8_ACTIVATIONS.get())


def precise_activations(in_features: int) -> bool:
    """Whether a projection with `in_features` inputs takes two int8 codes per activation."""
    int8 = gemm_choices().int8_activations
    if int8 is not None:
        return not int8
    return in_features < INT8_ACTIVATION_MIN_FEATURES


def integer_rows_below(weight: QuantWeight) -> int | None:
    """From how many rows on quant_linear leaves the integer kernels for this weight on the CPU
    (for the dense or the bfloat16 GEMM); None: never."""
    choices = gemm_choices()
    parts = weight if isinstance(weight, tuple) else (weight,)
    limits = [choices.dense_min_rows]
    if any(part.shape[1] >= BF16_GEMM_MIN_FEATURES for part in parts):
        limits.append(choices.bf16_min_rows)
    found = [limit for limit in limits if limit is not None]
    return min(found) if found else None


def quant_linear_reference(
    x: torch.Tensor, weight: PackedWeight, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """x @ dequantize(weight).T + bias in float32: the exact result every kernel approximates."""
    return _dense_product(x, weight.dequantize(), bias)


def _dense_product(x: torch.Tensor, dense: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    out = x.to(torch.float32) @ dense.T
    return out if bias is None else out + bias.to(torch.float32)


# Without the C++ kernels (no compiler, a failed build, LOCALCHAT_NO_CPU_KERNELS), a CPU weight is
# dequantized once, at its first product, and kept (PackedWeight.dense): dequantizing the whole
# weight at every call made each decode step dequantize the model (a [1536, 576] Q4 projection of
# one row: 3.0 ms a call, against 0.12 ms for the kept weight's product; 1 thread, 2026-12). The
# copy stays float32, so its products are quant_linear_reference's bit for bit: a bfloat16 copy
# (about 0.3% of the largest output off) took as long for a decode's row (0.12 ms) and was faster
# only for 64 rows (0.26 against 0.75 ms, on AMX). It takes 8x a 4-bit weight's memory: logged at
# load (warn_dense_fallback).
def dequantized_once(weight: PackedWeight) -> torch.Tensor:
    """The weight as float32 [out, in], dequantized at its first call and kept on it."""
    dense = weight.dense
    if dense is None:
        dense = weight.dequantize()
        object.__setattr__(weight, "dense", dense)  # frozen: a cache, not a field's value
    return dense


def dense_fallback_bytes(weights: Iterable[object]) -> int:
    """The memory dequantized_once's float32 copies of the quantized CPU weights among `weights`
    (PackedWeights, tuples of them, anything else: not counted) take once each has run."""
    parts = [p for w in weights for p in (w if isinstance(w, tuple) else (w,))]
    return sum(
        4 * p.shape[0] * p.shape[1]
        for p in parts
        if isinstance(p, PackedWeight) and p.device.type == "cpu"
    )


def warn_dense_fallback(weights: Iterable[object]) -> None:
    """Log what dequantized_once will cost for a model's weights where no C++ kernel multiplies
    them (nothing where the kernels are here)."""
    size = dense_fallback_bytes(weights)
    if not size or cpu_kernels() is not None:
        return
    if envs.NO_CPU_KERNELS.get():
        reason = f"{envs.NO_CPU_KERNELS.name} is set"
    elif compiler() is None:
        reason = "no C++ compiler"
    else:
        reason = "the C++ CPU kernels did not build"
    logger.warning(
        "%s: quantized weights are kept dequantized in memory (float32, from their first use), "
        "up to %.1f MiB more",
        reason,
        size / 2**20,
    )


def _one(
    x: torch.Tensor,
    weight: PackedWeight,
    bias: torch.Tensor | None,
    silu_and_mul: bool,
    into: torch.Tensor | None = None,
) -> torch.Tensor:
    """One PackedWeight's product; the bf16 GEMM path writes it into `into` where that is given
    (and returns `into`), the others return a new tensor."""
    ext = cpu_kernels() if x.device.type == "cpu" and not use_triton(x) else None
    bits = weight.bits
    choices = gemm_choices()
    dense_rows, bf16_rows = choices.dense_min_rows, choices.bf16_min_rows
    if ext is not None and dense_rows is not None and x.shape[0] >= dense_rows:
        dense = ext.dequantize(
            weight.qweight,
            weight.scales,
            weight.mins,
            weight.super_scales,
            bits,
            weight.group_size,
            weight.zero_point,
            weight.arrangement,
        )
        x = silu_and_mul_ref(x) if silu_and_mul else x
        return F.linear(x.to(torch.float32), dense, None if bias is None else bias.float()).to(
            x.dtype
        )
    if (
        ext is not None
        and bf16_rows is not None
        and x.shape[0] >= bf16_rows
        and weight.shape[1] >= BF16_GEMM_MIN_FEATURES
    ):
        x = silu_and_mul_ref(x) if silu_and_mul else x
        direct = into if bias is None and x.dtype == torch.float32 else None
        out = ext.dense_linear_bf16(
            x,
            weight.qweight,
            weight.scales,
            weight.mins,
            weight.super_scales,
            bits,
            weight.group_size,
            weight.zero_point,
            weight.arrangement,
            direct,
        )
        if direct is not None:
            return direct
        out = out if bias is None else out + bias.to(torch.float32)
        return out if x.dtype == torch.float32 else out.to(x.dtype)
    if ext is not None:
        out = ext.quant_linear(
            x,
            weight.qweight,
            weight.scales,
            weight.mins,
            weight.super_scales,
            bias,
            bits,
            weight.group_size,
            weight.zero_point,
            precise_activations(weight.shape[1]),
            silu_and_mul,
            True,
            weight.arrangement,
        )
        return out if x.dtype == torch.float32 else out.to(x.dtype)
    if silu_and_mul:
        x = silu_and_mul_ref(x)
    if use_triton(x):
        from localchat.kernels.triton_quant_linear import triton_quant_linear

        return triton_quant_linear(
            x, weight.row_major().with_float16_scales().with_byte_codes(), bias
        )
    if x.device.type == "cpu":
        return _dense_product(x, dequantized_once(weight), bias).to(x.dtype)
    return quant_linear_reference(x, weight, bias).to(x.dtype)


def quant_linear(
    x: torch.Tensor,
    weight: QuantWeight,
    bias: torch.Tensor | None = None,
    *,
    silu_and_mul: bool = False,
) -> torch.Tensor:
    """x [..., in] @ W.T (+ bias) for a PackedWeight or a tuple of them (outputs concatenated); with
    `silu_and_mul`, x is a fused [gate | up] and silu(gate) * up is multiplied instead."""
    if (
        type(weight) is PackedWeight and x.dim() == 2
    ):  # the decode hot path (~120 calls a token): no reshapes
        return _one(x, weight, bias, silu_and_mul)
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    if silu_and_mul and not isinstance(weight, PackedWeight):
        x2, silu_and_mul = silu_and_mul_ref(x2), False
    if isinstance(weight, PackedWeight):
        out = _one(x2, weight, bias, silu_and_mul)
    else:
        # each part into its columns of one output: a prefill's products are large, and a
        # concatenation faulted in a second copy of them
        sizes = [part.shape[0] for part in weight]
        biases = [None] * len(weight) if bias is None else bias.split(sizes)
        out = torch.empty(x2.shape[0], sum(sizes), dtype=x2.dtype, device=x2.device)
        for part, b, columns in zip(weight, biases, out.split(sizes, dim=1), strict=True):
            result = _one(x2, part, b, False, into=columns)
            if result is not columns:
                columns.copy_(result)
    return out.reshape(*lead, out.shape[-1])


def embedding_rows(weight: PackedWeight, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Rows `ids` of a packed embedding as dense `dtype` [*ids.shape, in]: one C++ call on the
    CPU (reading only those rows, in either layout), PackedWeight.dequantize elsewhere. Both give
    the same floats."""
    ext = cpu_kernels() if weight.device.type == "cpu" else None
    if ext is None:
        return weight.dequantize(ids, dtype=dtype)
    out = ext.dequantize_rows(
        weight.qweight,
        weight.scales,
        weight.mins,
        weight.super_scales,
        weight.bits,
        weight.group_size,
        weight.zero_point,
        weight.arrangement,
        ids,
    )
    return out if dtype == torch.float32 else out.to(dtype)


def interleave_for_kernel(weight: QuantWeight) -> QuantWeight:
    """The weight in the C++ kernels' interleaved layout (packed_weight.py), rearranged in place,
    when those kernels will multiply it (wherever they are built: every ISA's and the generic ones
    read it); otherwise the weight as it is. The old PackedWeight must not be used afterwards: its
    tensors are the new one's."""
    if isinstance(weight, tuple):
        return tuple(interleave_for_kernel(part) for part in weight)  # type: ignore[misc]
    ext = cpu_kernels()
    if (
        ext is None
        or weight.interleaved
        or weight.layout in FILE_BLOCKS  # read in its own blocks
        or weight.device.type != "cpu"
    ):
        return weight
    ext.interleave_weight(weight.qweight, weight.scales, weight.mins, weight.super_scales, False)
    return replace(weight, interleaved=True)


# Parts larger than this together stay a tuple: stacking copies them (seconds of an 8B model's
# load), and one kernel call per part costs nothing next to their arithmetic.
FUSE_MAX_BYTES = 32 << 20


def fuse(parts: Sequence[PackedWeight]) -> QuantWeight:
    """One PackedWeight with the parts' rows stacked, when their layouts allow it, they are small
    and none is read in the file's blocks; otherwise a tuple."""
    first = parts[0]
    if len(parts) == 1:
        return first
    if sum(p.nbytes for p in parts) > FUSE_MAX_BYTES:
        return tuple(parts)
    if any(p.layout in FILE_BLOCKS for p in parts):
        # the file's own blocks, read in its memory map: stacking would copy them into memory (a
        # MoE model's thousands of small experts: most of the file)
        return tuple(parts)
    # interleaved parts stack as they are when each is whole blocks of rows; otherwise row-major
    interleaved = all(p.interleaved and p.shape[0] % ROWS_PER_BLOCK == 0 for p in parts)
    if not interleaved:
        parts = [p.row_major() for p in parts]
        first = parts[0]
    same = all(
        p.layout == first.layout
        and p.group_size == first.group_size
        and p.in_features == first.in_features
        and (p.super_scales is None) == (first.super_scales is None)
        for p in parts
    )
    if not same:
        return tuple(parts)
    symmetric = all(p.mins is None and p.zero_point == first.zero_point for p in parts)
    supers: torch.Tensor | None = None
    mins: torch.Tensor | None
    if first.super_scales is not None:  # K-quant sub-scales, sub-mins and pairs stack as they are
        supers = torch.cat([p.super_scales for p in parts])  # type: ignore[misc]
        mins = torch.cat([p.mins for p in parts])  # type: ignore[misc]
    else:
        mins = None if symmetric else torch.cat([p.offsets() for p in parts])
    kinds = sorted({p.source_type for p in parts})
    return PackedWeight(
        first.layout,
        torch.cat([p.qweight for p in parts]),
        torch.cat([p.scales for p in parts]),
        mins,
        first.group_size,
        first.zero_point if symmetric else 0,
        "+".join(kinds),
        super_scales=supers,
        interleaved=interleaved,
    )
