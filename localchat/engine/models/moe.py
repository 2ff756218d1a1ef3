"""The sparse mixture-of-experts MLP: a router picks top_k experts per token; each expert (a gated
MLP, models/layers.MLP) runs only on the tokens routed to it, and their outputs are summed with the
routing weights.

Each expert is its own MLP module, so its weights load, quantize, pack and run like any dense MLP's:
a GGUF file's expert blocks stay in the file's memory map, one PackedWeight per expert.
"""

from __future__ import annotations

import torch
from torch import nn

from localchat.engine.models.layers import MLP
from localchat.engine.models.spec import DecoderSpec, MoESpec
from localchat.kernels.linear import linear


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
        self.router_weight = nn.Parameter(torch.empty(moe.num_experts, spec.hidden_size))
        self.router_bias = nn.Parameter(torch.zeros(moe.num_experts)) if moe.router_bias else None
        self.experts = nn.ModuleList(
            MLP(spec, moe.intermediate_size, bias=moe.expert_bias) for _ in range(moe.num_experts)
        )
        self.shared_expert = MLP(spec, moe.shared_expert_size) if moe.shared_expert_size else None
        self.shared_expert_gate = (
            nn.Parameter(torch.empty(1, spec.hidden_size)) if moe.shared_expert_gate else None
        )

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = linear(hidden, self.router_weight, self.router_bias)
        weights, ids = route(logits, self.moe)
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
        if self.shared_expert is not None:
            shared = self.shared_expert(hidden)
            if self.shared_expert_gate is not None:
                shared = torch.sigmoid(linear(hidden, self.shared_expert_gate)) * shared
            out = out + shared
        return out
