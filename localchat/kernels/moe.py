"""The experts of a mixture-of-experts MLP, stacked: each token's top-k experts' gated MLPs, summed
with its routing weights.

    out[t] = sum_j weights[t, j] * down_e(act(gate_up_e(hidden[t])))    with e = ids[t, j]

gate_up_e(x) = x @ w13[e].T (+ b13[e]) gives [gate | up] (gate first), act(gate) * up is one of
kernels/activation.py's gated activations, and down_e(a) = a @ w2[e].T (+ b2[e]). The torch
reference groups the (token, slot) pairs by expert and runs each expert on its rows; the Triton
version (triton_moe.py) is a grouped GEMM over the same groups.

The expert weights are dense tensors in hidden's dtype, or quantized experts stacked as
PackedExperts (W4A16/W8A16: the GPU's form of a PackedWeight, one per expert, in one layout;
moe_experts.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from localchat.kernels.activation import act_and_mul_ref
from localchat.kernels.dispatch import use_triton
from localchat.kernels.moe_experts import Experts, PackedExperts, check_moe_shapes


def fused_moe_ref(
    hidden: torch.Tensor,
    weights: torch.Tensor,
    ids: torch.Tensor,
    w13: Experts,
    w2: Experts,
    b13: torch.Tensor | None = None,
    b2: torch.Tensor | None = None,
    activation: str = "silu",
    limit: float = 7.0,
    alpha: float = 1.702,
) -> torch.Tensor:
    """[T, H] in hidden's dtype. Each expert's projections run in that dtype (as a dense MLP's
    do; quantized experts dequantized to it); the weighted outputs add up in float32."""
    check_moe_shapes(hidden, weights, ids, w13, w2, b13, b2)
    if isinstance(w13, PackedExperts):
        w13 = w13.dequantize(hidden.dtype)
    if isinstance(w2, PackedExperts):
        w2 = w2.dequantize(hidden.dtype)
    top_k = ids.shape[1]
    out = torch.zeros(hidden.shape, dtype=torch.float32, device=hidden.device)
    flat = ids.reshape(-1)
    slot_weights = weights.reshape(-1).to(torch.float32)
    for expert in flat.unique().tolist():
        pairs = (flat == expert).nonzero().squeeze(1)
        tokens = pairs // top_k
        gate_up = F.linear(hidden[tokens], w13[expert], None if b13 is None else b13[expert])
        activated = act_and_mul_ref(gate_up, activation, limit, alpha)
        down = F.linear(activated, w2[expert], None if b2 is None else b2[expert])
        out.index_add_(0, tokens, down.to(torch.float32) * slot_weights[pairs, None])
    return out.to(hidden.dtype)


def fused_moe(
    hidden: torch.Tensor,
    weights: torch.Tensor,
    ids: torch.Tensor,
    w13: Experts,
    w2: Experts,
    b13: torch.Tensor | None = None,
    b2: torch.Tensor | None = None,
    activation: str = "silu",
    limit: float = 7.0,
    alpha: float = 1.702,
) -> torch.Tensor:
    """The stacked experts' output for hidden [T, H] routed by (weights, ids) [T, k]: Triton on
    CUDA, the reference on the CPU (see the module docstring)."""
    if use_triton(hidden):
        from localchat.kernels.triton_moe import fused_moe_triton

        return fused_moe_triton(hidden, weights, ids, w13, w2, b13, b2, activation, limit, alpha)
    return fused_moe_ref(hidden, weights, ids, w13, w2, b13, b2, activation, limit, alpha)
