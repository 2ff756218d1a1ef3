"""The sparse mixture-of-experts MLP: a router picks top_k experts per token; each expert (a gated
MLP, modeling/layers.MLP) runs only on the tokens routed to it, and their outputs are summed with
the routing weights.

Each expert is its own MLP module, so its weights load, quantize, pack and run like any dense MLP's:
a GGUF file's expert blocks stay in the file's memory map, one PackedWeight per expert. On the CPU
with the C++ kernels, quantized experts run in one call (kernels/csrc/moe_prefill.h: every chosen
expert's rows on the integer panel kernels, the threads sharing all the experts' work), except an
expert with enough rows for quant_linear's bfloat16 GEMM, which runs on its own as before; without
the kernels the experts run one after the other, each on its rows. Where the Triton kernels run
(CUDA), dense and W4A16/W8A16 experts run as one fused MoE (kernels/triton_moe.py) over their
weights stacked [E, 2W, H] and [E, H, W]: stacked once, at load (DecoderForCausalLM.pack_weights;
else at the first such forward), after which each expert's weights are views into the stacks (no
second copy). Experts that do not stack (quantized in several forms) run one after the other there
too.
"""

from __future__ import annotations

from typing import cast

import torch
from torch import nn

from localchat.engine.modeling.layers import MLP
from localchat.engine.modeling.spec import DecoderSpec, MoESpec
from localchat.kernels.dispatch import use_triton
from localchat.kernels.linear import linear
from localchat.kernels.moe import fused_moe
from localchat.kernels.moe_experts import Experts, PackedExperts
from localchat.kernels.packed_weight import PackedWeight
from localchat.kernels.quant_linear import QuantWeight, integer_rows_below


def route(logits: torch.Tensor, moe: MoESpec) -> tuple[torch.Tensor, torch.Tensor]:
    """(routing weights [T, k] in the logits' dtype, expert ids [T, k]) of each token, as
    transformers computes them for the family (see MoESpec.routing)."""
    if moe.routing == "topk_softmax":
        top, ids = torch.topk(logits, moe.top_k, dim=-1)
        return torch.softmax(top, dim=-1, dtype=top.dtype), ids
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
    top, ids = torch.topk(probs, moe.top_k, dim=-1)
    if moe.normalize_topk:
        top = top / top.sum(dim=-1, keepdim=True)
    return top.to(logits.dtype), ids


class SparseMoE(nn.Module):
    """Router, experts, and (Qwen2-MoE) a shared expert every token takes, gated by a sigmoid."""

    def __init__(self, spec: DecoderSpec):
        super().__init__()
        moe = spec.moe
        assert moe is not None
        self.moe = moe
        self.activation, self.limit, self.alpha = (
            spec.activation,
            spec.swiglu_limit,
            spec.swiglu_alpha,
        )
        self.router_weight = nn.Parameter(torch.empty(moe.num_experts, spec.hidden_size))
        self.router_bias = nn.Parameter(torch.zeros(moe.num_experts)) if moe.router_bias else None
        self.experts = nn.ModuleList(
            MLP(spec, moe.intermediate_size, bias=moe.expert_bias) for _ in range(moe.num_experts)
        )
        self.shared_expert = (
            MLP(spec, moe.shared_expert_size, bias=False) if moe.shared_expert_size else None
        )
        self.shared_expert_gate = (
            nn.Parameter(torch.empty(1, spec.hidden_size)) if moe.shared_expert_gate else None
        )
        # (w13, w2, b13, b2): the experts' weights stacked for the fused kernel (stack_experts)
        self.stacked: tuple[Experts, Experts, torch.Tensor | None, torch.Tensor | None] | None = (
            None
        )
        self._unstackable = False  # the experts' weights do not stack: known once
        self._cpu_experts: object = None  # the C++ MoeMlp (cpu_experts), False where there is none

    @torch.no_grad()
    def stack_experts(self) -> bool:
        """Stack the experts' weights and biases into [E, ...] tensors for the fused kernel, once,
        and make each expert's weights views into them, so the memory is not doubled: dense
        parameters as they are, quantized ones (a PackedWeight each) in the GPU's form
        (PackedExperts). False (and nothing changes) where they do not stack: oneDNN-packed
        weights, tuples of PackedWeights, experts quantized in different forms."""
        if self.stacked is not None or self._unstackable:
            return not self._unstackable
        names = ("gate_up_weight", "down_weight", "gate_up_bias", "down_bias")
        values = [[getattr(expert, name) for expert in self.experts] for name in names]
        weights: list[Experts | None] = []
        for group in values[:2]:
            if all(type(v) is nn.Parameter and not v.is_mkldnn for v in group):
                weights.append(torch.stack([v.detach() for v in group]))
            elif all(type(v) is PackedWeight for v in group):
                weights.append(PackedExperts.stack(group))
            else:
                weights.append(None)
        w13, w2 = weights
        self._unstackable = w13 is None or w2 is None
        if w13 is None or w2 is None:
            return False
        b13, b2 = (
            None if g[0] is None else torch.stack([v.detach() for v in g]) for g in values[2:]
        )
        for name, stack in zip(names, (w13, w2, b13, b2), strict=True):
            for i, expert in enumerate(self.experts):
                if isinstance(stack, PackedExperts):
                    setattr(expert, name, stack.expert(i))
                elif stack is not None:
                    expert._parameters[name] = nn.Parameter(stack[i], requires_grad=False)
        self.stacked = (w13, w2, b13, b2)
        return True

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = linear(hidden, self.router_weight, self.router_bias)
        weights, ids = route(logits, self.moe)
        if use_triton(hidden) and self.stack_experts():
            assert self.stacked is not None
            w13, w2, b13, b2 = self.stacked
            out = fused_moe(
                hidden, weights, ids, w13, w2, b13, b2, self.activation, self.limit, self.alpha
            )
        else:
            out = self._experts_in_turn(hidden, weights, ids)
        if self.shared_expert is not None:
            shared = self.shared_expert(hidden)
            if self.shared_expert_gate is not None:
                shared = torch.sigmoid(linear(hidden, self.shared_expert_gate)) * shared
            out = out + shared
        return out

    def cpu_experts(self):
        """The experts as one C++ MoeMlp (modeling/cpu_parts.py), built once; None unless every
        expert is a quantized gated SiLU MLP without biases, in float32 on a CPU with the C++
        kernels."""
        if self._cpu_experts is None:
            self._cpu_experts = self._build_cpu_experts() or False
        return self._cpu_experts or None

    def _build_cpu_experts(self):
        from localchat.engine.modeling.cpu_parts import moe_mlp
        from localchat.kernels.cpu_extension import cpu_kernels

        router = self.router_weight
        if (
            self.activation != "silu"
            or self.moe.expert_bias
            or router.device.type != "cpu"
            or router.dtype != torch.float32
            or use_triton(router)
        ):
            return None
        ext = cpu_kernels()
        if ext is None or not hasattr(ext, "MoeMlp"):
            return None
        return moe_mlp(ext, router.detach(), self.experts, self.moe.top_k, self.moe.normalize_topk)

    def _grouped_rows_below(self) -> int | None:
        """From how many rows on an expert leaves the integer kernels (for quant_linear's dense or
        bfloat16 GEMM) and so runs on its own; None: never."""
        expert = self.experts[0]  # packed, as cpu_experts found them all
        limits = [
            integer_rows_below(cast(QuantWeight, expert.gate_up_weight)),
            integer_rows_below(cast(QuantWeight, expert.down_weight)),
        ]
        return min((limit for limit in limits if limit is not None), default=None)

    def _experts_in_turn(
        self, hidden: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor
    ) -> torch.Tensor:
        """Each expert's MLP on the rows routed to it: those on the integer kernels in one C++
        call where it exists (cpu_experts), the others one after the other."""
        flat = ids.flatten()
        counts = torch.bincount(flat, minlength=self.moe.num_experts)
        grouped = self.cpu_experts() if hidden.dtype == torch.float32 else None
        if grouped is None or not grouped.batchable():
            out, alone = torch.zeros_like(hidden), counts > 0
        else:
            limit = self._grouped_rows_below()
            alone = (
                counts >= limit if limit is not None else torch.zeros_like(counts, dtype=torch.bool)
            )
            out = grouped.forward_batch(hidden, ids, weights, (counts > 0) & ~alone)
        if not bool(alone.any()):
            return out
        # group the (token, slot) pairs by expert: one sort, then each expert's rows in one gather
        order = torch.argsort(flat, stable=True)
        tokens = order // self.moe.top_k
        start = 0
        for expert, (count, own) in enumerate(zip(counts.tolist(), alone.tolist(), strict=True)):
            rows = order[start : start + count]
            token_rows = tokens[start : start + count]
            start += count
            if not own:
                continue
            expert_out = self.experts[expert](hidden[token_rows])
            slot_weights = weights.flatten()[rows, None]
            out.index_add_(0, token_rows, (expert_out * slot_weights).to(hidden.dtype))
        return out
