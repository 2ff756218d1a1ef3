"""The shape of a decoder-only model, as our forward pass reads it: one DecoderSpec per model (built
from its HF config by modeling/families.py), with a LayerSpec per layer where layers differ (sliding
windows, rotary tables, mixture-of-experts MLPs).

Every family we run is a variation on the Llama layer; the variations are fields here, so one
forward pass (modeling/decoder.py) serves them all, and the fast paths can tell at a glance whether
a model is plain enough for them (`DecoderSpec.is_plain`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

# Which rotary table a layer's attention reads; None: the layer has no rotary embedding (SmolLM3's
# NoPE layers). "default" is the model's only table unless its config gives one per layer type
# (Gemma 3: "sliding_attention" and "full_attention").
RopeKey = str | None
Activation = Literal["silu", "gelu_tanh", "swiglu_oai"]


@dataclass(frozen=True)
class LayerSpec:
    """What sets one layer apart: its attention window, rotary table and MLP kind."""

    sliding_window: int | None = None  # attend to the last W positions (the query's included)
    rope: RopeKey = "default"
    moe: bool = False  # a mixture-of-experts MLP (DecoderSpec.moe) instead of the dense one


@dataclass(frozen=True)
class MoESpec:
    """A sparse mixture-of-experts MLP: a linear router picks `top_k` of `num_experts` gated MLPs
    per token and sums their outputs weighted by the routing weights.

    routing "softmax_topk": softmax over all experts' logits, then the top k (renormalized to sum
    to 1 when `normalize_topk`: Mixtral, Qwen3-MoE); "topk_softmax": the top k logits, then a
    softmax over them (gpt-oss)."""

    num_experts: int
    top_k: int
    intermediate_size: int  # one expert's width
    routing: Literal["softmax_topk", "topk_softmax"] = "softmax_topk"
    normalize_topk: bool = False
    router_bias: bool = False
    expert_bias: bool = False  # gpt-oss: biases on every expert projection
    shared_expert_size: int = 0  # Qwen2-MoE: a dense MLP every token takes, gated by a sigmoid
    shared_expert_gate: bool = False


@dataclass(frozen=True)
class DecoderSpec:
    """The shape of a model, read from its HF config (see modeling/families.py)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    tie_word_embeddings: bool
    qkv_bias: bool = False
    qk_norm: bool = False  # per-head RMSNorm of q and k (Qwen3, Gemma 3)
    family: str = "llama"
    o_bias: bool = False
    mlp_bias: bool = False
    # RMSNorm of the whole q and k projections (OLMo 2, OLMoE), instead of per head
    qk_norm_full: bool = False
    # "pre": norm before attention and MLP (Llama); "sandwich": before and after each (Gemma);
    # "post": after each only (OLMo 2)
    norms: Literal["pre", "sandwich", "post"] = "pre"
    activation: Activation = "silu"
    swiglu_limit: float = 7.0  # gpt-oss's clamp ("swiglu_oai")
    swiglu_alpha: float = 1.702
    embed_scale: float = 1.0  # Gemma: sqrt(hidden); Granite: embedding_multiplier
    residual_scale: float = 1.0  # Granite: each block's output is scaled before the residual add
    attn_scale: float | None = None  # None: head_dim ** -0.5
    attn_softcap: float | None = None  # Gemma 2: scores = c * tanh(scores / c)
    final_softcap: float | None = None  # Gemma 2: logits = c * tanh(logits / c)
    logits_divisor: float = 1.0  # Granite: logits / logits_scaling
    # Gemma's RMSNorms multiply by (1 + weight): the loader adds this to every norm weight it places
    norm_offset: float = 0.0
    attention_sinks: bool = False  # gpt-oss: a learned logit per head in the softmax denominator
    moe: MoESpec | None = None
    layers: tuple[LayerSpec, ...] = field(default=())

    def layer(self, index: int) -> LayerSpec:
        return self.layers[index] if self.layers else _PLAIN_LAYER

    @property
    def scale(self) -> float:
        return self.head_dim**-0.5 if self.attn_scale is None else self.attn_scale

    @property
    def is_plain(self) -> bool:
        """Whether every layer is a Llama/Qwen layer (pre-norms, SiLU, dense MLP, default rotary,
        no window), which is what the fused CPU decode stack runs."""
        return (
            self.norms == "pre"
            and self.activation == "silu"
            and not (self.o_bias or self.mlp_bias or self.qk_norm_full or self.attention_sinks)
            and self.embed_scale == 1.0
            and self.residual_scale == 1.0
            and self.attn_scale is None
            and self.attn_softcap is None
            and self.moe is None
            and all(layer == _PLAIN_LAYER for layer in self.layers)
        )


_PLAIN_LAYER = LayerSpec()
