"""The sparse mixture-of-experts MLP: a router picks top_k experts per token; each expert (a gated
MLP, models/layers.MLP) runs only on the tokens routed to it, and their outputs are summed with the
routing weights.

Each expert is its own MLP module, so its weights load, quantize, pack and run like any dense MLP's:
a GGUF file's expert blocks stay in the file's memory map, one PackedWeight per expert. On the CPU
the experts run one after the other, each on its rows. Where the Triton kernels run (CUDA), dense
experts run as one fused MoE (kernels/triton_moe.py) over their weights stacked [E, 2W, H] and
[E, H, W]: stacked once, at the first such forward, after which each expert's parameters are views
into the stacks (no second copy). Quantized experts run one after the other there too.
"""

from __future__ import annotations

import torch
from torch import nn

from localchat.engine.models.layers import MLP
from localchat.engine.models.spec import DecoderSpec, MoESpec
from localchat.kernels.dispatch import use_triton
from localchat.kernels.linear import linear
from localchat.kernels.moe import fused_moe


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
        self.stacked: tuple[torch.Tensor | None, ...] | None = None
        self._unstackable = False  # an expert's weights are not plain tensors: known once

    @torch.no_grad()
    def stack_experts(self) -> bool:
        """Stack the experts' dense weights (and biases) into [E, ...] tensors for the fused
        kernel, once, and make each expert's parameters views into them, so the memory is not
        doubled. False (and nothing changes) where an expert's weight is not a plain tensor (a
        PackedWeight, a oneDNN-packed weight)."""
        if self.stacked is not None or self._unstackable:
            return not self._unstackable
        names = ("gate_up_weight", "down_weight", "gate_up_bias", "down_bias")
        values = [[getattr(expert, name) for expert in self.experts] for name in names]
        self._unstackable = not all(
            type(v) is nn.Parameter and not v.is_mkldnn for group in values[:2] for v in group
        )
        if self._unstackable:
            return False
        stacked: list[torch.Tensor | None] = []
        for name, group in zip(names, values, strict=True):
            if group[0] is None:
                stacked.append(None)
                continue
            tensor = torch.stack([v.detach() for v in group])
            for i, expert in enumerate(self.experts):
                expert._parameters[name] = nn.Parameter(tensor[i], requires_grad=False)
            stacked.append(tensor)
        self.stacked = tuple(stacked)
        return True

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = linear(hidden, self.router_weight, self.router_bias)
        weights, ids = route(logits, self.moe)
        if use_triton(hidden) and self.stack_experts():
            assert self.stacked is not None
            w13, w2, b13, b2 = self.stacked
            assert w13 is not None and w2 is not None
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

    def _experts_in_turn(
        self, hidden: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor
    ) -> torch.Tensor:
        """Each expert's MLP on the rows routed to it, one expert after the other."""
        out = torch.zeros_like(hidden)
        # group the (token, slot) pairs by expert: one sort, then each expert's rows in one gather
        flat = ids.flatten()
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=self.moe.num_experts).tolist()
        tokens = order // self.moe.top_k
        start = 0
        for expert, count in enumerate(counts):
            if not count:
                continue
            rows = order[start : start + count]
            token_rows = tokens[start : start + count]
            start += count
            expert_out = self.experts[expert](hidden[token_rows])
            slot_weights = weights.flatten()[rows, None]
            out.index_add_(0, token_rows, (expert_out * slot_weights).to(hidden.dtype))
        return out
