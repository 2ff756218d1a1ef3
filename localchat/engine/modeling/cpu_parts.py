"""PackedWeights as the C++ CPU layers take them (kernels/csrc/decode_projection.h): four tensors
and four format fields per part, and a mixture-of-experts layer's experts as one MoeMlp (used by
the decode stack, modeling/cpu_decode.py, and by the prefill's grouped experts, modeling/moe.py)."""

from __future__ import annotations

import torch

from localchat.kernels.packed_weight import PackedWeight
from localchat.kernels.quant_linear import precise_activations


def parts(weight: PackedWeight | tuple[PackedWeight, ...]) -> list[PackedWeight]:
    """A projection's PackedWeights: one, or several whose rows stack (q, k, v stored in different
    types)."""
    return list(weight) if isinstance(weight, tuple) else [weight]


def is_packed(weight: object) -> bool:
    found = weight if isinstance(weight, tuple) else (weight,)
    return all(type(p) is PackedWeight for p in found)


def _or_empty(t: torch.Tensor | None) -> torch.Tensor:
    """The C++ layer takes four tensors per part; an absent one is empty."""
    return torch.empty(0) if t is None else t


def tensors(packed: list[PackedWeight]) -> tuple[list[list[torch.Tensor]], list[int]]:
    """The C++ layer's description of PackedWeights: four tensors and four format fields each."""
    described = [
        [p.qweight, p.scales, _or_empty(p.mins), _or_empty(p.super_scales)] for p in packed
    ]
    formats = [f for p in packed for f in (p.bits, p.group_size, p.zero_point, p.arrangement)]
    return described, formats


def moe_mlp(ext, router: torch.Tensor, experts, top_k: int, normalize: bool):
    """The C++ MoeMlp of quantized experts (modules with gate_up_weight and down_weight: gate and
    up fused, [2W, H] and [H, W]), routed by `router` [E, H] (top_k, renormalized when
    `normalize`, for the decode stack); None unless every expert weight is packed."""
    weights = [(e.gate_up_weight, e.down_weight) for e in experts]
    if not all(is_packed(w) for pair in weights for w in pair):
        return None
    projections = [parts(w) for pair in weights for w in pair]
    described, formats = tensors([p for projection in projections for p in projection])
    # Both projections take the model's activation precision, its hidden size's: a fine-grained
    # expert's narrow input (768 for Qwen3-30B-A3B's down projection) is not a small model's,
    # and its second code cost a tenth of the prefill (kernels/quant_linear.py).
    precise = precise_activations(router.shape[1])
    return ext.MoeMlp(
        router.float(),
        described,
        [len(projection) for projection in projections],
        formats,
        top_k,
        normalize,
        [precise, precise],
    )
