"""Model shapes for random-weight GGUF files: named presets or an HF config.json, and the tensors
and `{arch}.*` metadata llama.cpp's converter writes for a Llama, Qwen2, Qwen3 or Qwen3-MoE model of
that shape, or for Gemma 3's text model (a preset only: its five local layers to one global are
llama.cpp's fixed pattern, the file stores the window).

Shapes here are numpy shapes (rows, columns); GGUF stores them reversed, the writer does that.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from gguf import RopeScalingType

from localchat.errors import InvalidParameterError

# HF architecture -> GGUF architecture
_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Qwen3MoeForCausalLM": "qwen3moe",
}
_GGUF_ARCHES = ("llama", "qwen2", "qwen3", "qwen3moe", "gemma3")


@dataclass(frozen=True, slots=True)
class ModelShape:
    """The hyperparameters a decoder's tensors and GGUF metadata follow. `vocab_size` is None until
    the tokenizer is known (a random file takes the default model's, or the one it is given)."""

    name: str
    arch: str  # GGUF architecture: llama, qwen2, qwen3, qwen3moe, gemma3
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    head_dim: int | None = None  # None: hidden_size // num_heads
    explicit_head_dim: bool = (
        False  # the config names head_dim: the converter writes key/value_length
    )
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    context_length: int = 8192
    tie_word_embeddings: bool = False
    vocab_size: int | None = None
    # a mixture-of-experts MLP in every layer (qwen3moe): experts, experts per token, expert width
    num_experts: int = 0
    num_experts_per_tok: int = 0
    expert_intermediate_size: int = 0
    # gemma3: the local layers' window, and the global layers' linear rope scaling (0: none)
    sliding_window: int = 0
    rope_scaling_factor: float = 0.0

    def __post_init__(self) -> None:
        if self.arch not in _GGUF_ARCHES:
            raise InvalidParameterError(
                f"architecture {self.arch!r} is not supported: {', '.join(_GGUF_ARCHES)}",
                param="config",
            )
        if (self.arch == "qwen3moe") != (self.num_experts > 0):
            raise InvalidParameterError(
                "num_experts is for the qwen3moe architecture, which needs it", param="num_experts"
            )
        if self.num_experts and not 1 <= self.num_experts_per_tok <= self.num_experts:
            raise InvalidParameterError(
                f"num_experts_per_tok must be in 1..{self.num_experts}, "
                f"got {self.num_experts_per_tok}",
                param="num_experts_per_tok",
            )
        for field in (
            "hidden_size",
            "num_layers",
            "num_heads",
            "num_kv_heads",
            "intermediate_size",
        ):
            if getattr(self, field) < 1:
                raise InvalidParameterError(
                    f"{field} must be >= 1, got {getattr(self, field)}", param=field
                )
        if self.num_heads % self.num_kv_heads:
            raise InvalidParameterError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads "
                f"({self.num_kv_heads})",
                param="num_kv_heads",
            )
        if self.head_dim is None and self.hidden_size % self.num_heads:
            raise InvalidParameterError(
                f"hidden_size ({self.hidden_size}) must be a multiple of num_heads "
                f"({self.num_heads}) unless head_dim is given",
                param="head_dim",
            )

    @property
    def dim_per_head(self) -> int:
        return self.head_dim if self.head_dim is not None else self.hidden_size // self.num_heads


PRESETS: dict[str, ModelShape] = {
    # Llama-3.1-8B: the C4 workload's shape
    "llama-8b": ModelShape(
        "llama-8b",
        "llama",
        4096,
        32,
        32,
        8,
        14336,
        rope_theta=500000.0,
        rms_norm_eps=1e-5,
        context_length=131072,
    ),
    # Llama-3.2-1B
    "llama-1b": ModelShape(
        "llama-1b",
        "llama",
        2048,
        16,
        32,
        8,
        8192,
        head_dim=64,
        explicit_head_dim=True,
        rope_theta=500000.0,
        rms_norm_eps=1e-5,
        context_length=131072,
        tie_word_embeddings=True,
    ),
    # Qwen3-30B-A3B: the C5 workload's shape (128 experts, 8 a token)
    "qwen3-30b-a3b": ModelShape(
        "qwen3-30b-a3b",
        "qwen3moe",
        2048,
        48,
        32,
        4,
        6144,
        head_dim=128,
        explicit_head_dim=True,
        rope_theta=1000000.0,
        rms_norm_eps=1e-6,
        context_length=40960,
        num_experts=128,
        num_experts_per_tok=8,
        expert_intermediate_size=768,
    ),
    # SmolLM2-135M (the default model's shape)
    "smollm2-135m": ModelShape(
        "smollm2-135m",
        "llama",
        576,
        30,
        9,
        3,
        1536,
        rope_theta=100000.0,
        rms_norm_eps=1e-5,
        context_length=8192,
        tie_word_embeddings=True,
    ),
    # Gemma 3 4B's text model (the vision benchmark's, benchmarks/vision_ttft.py)
    "gemma3-4b": ModelShape(
        "gemma3-4b",
        "gemma3",
        2560,
        34,
        8,
        4,
        10240,
        head_dim=256,
        explicit_head_dim=True,
        rope_theta=1000000.0,
        rms_norm_eps=1e-6,
        context_length=131072,
        tie_word_embeddings=True,
        sliding_window=1024,
        rope_scaling_factor=8.0,
    ),
}


def shape_from_config(path: Path) -> ModelShape:
    """A ModelShape from an HF config.json (its vocabulary is ignored: the tokenizer is the
    default's)."""
    try:
        config = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise InvalidParameterError(
            f"{path}: not a readable config.json ({exc})", param="config"
        ) from None
    architectures = config.get("architectures") or []
    arch = next((_ARCHITECTURES[a] for a in architectures if a in _ARCHITECTURES), None)
    if arch is None:
        raise InvalidParameterError(
            f"{path}: architectures {architectures} not supported; supported: "
            f"{', '.join(_ARCHITECTURES)}",
            param="config",
        )
    try:
        heads = int(config["num_attention_heads"])
        return ModelShape(
            name=Path(path).parent.name or "model",
            arch=arch,
            hidden_size=int(config["hidden_size"]),
            num_layers=int(config["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(config.get("num_key_value_heads") or heads),
            intermediate_size=int(config["intermediate_size"]),
            head_dim=config.get("head_dim"),
            explicit_head_dim=config.get("head_dim") is not None,
            rope_theta=float(config.get("rope_theta", 10000.0)),
            rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
            context_length=int(config.get("max_position_embeddings", 8192)),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            num_experts=int(config.get("num_experts") or 0) if arch == "qwen3moe" else 0,
            num_experts_per_tok=int(config.get("num_experts_per_tok") or 0),
            expert_intermediate_size=int(config.get("moe_intermediate_size") or 0),
        )
    except KeyError as exc:
        raise InvalidParameterError(
            f"{path}: config.json lacks {exc.args[0]}", param="config"
        ) from None


def resolve_shape(spec: str) -> ModelShape:
    """A preset name or a config.json path (or a directory holding one)."""
    if spec in PRESETS:
        return PRESETS[spec]
    path = Path(spec)
    if path.is_dir():
        path = path / "config.json"
    if path.is_file():
        return shape_from_config(path)
    raise InvalidParameterError(
        f"{spec!r} is neither a preset ({', '.join(PRESETS)}) nor a config.json", param="config"
    )


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """One tensor: GGUF name, numpy shape, and role ('matrix' gets quantized, 3-D for stacked
    experts; 'norm' is ones, 'bias' and 'router' small random, all three float32 as llama.cpp keeps
    1-D tensors and expert routers)."""

    name: str
    shape: tuple[int, ...]
    role: str
    layer: int | None = None

    @property
    def kind(self) -> str:
        """The tensor's name without block prefix and suffix: attn_v, ffn_down, output, token_embd
        ..."""
        parts = self.name.split(".")
        return parts[2] if parts[0] == "blk" else parts[0]


def tensor_specs(shape: ModelShape) -> list[TensorSpec]:
    """Every tensor of the model in the converter's order (embedding, the blocks, final norm,
    output)."""
    if shape.vocab_size is None:
        raise ValueError("the shape's vocab_size must be set (from the tokenizer) first")
    hidden, hd = shape.hidden_size, shape.dim_per_head
    q_rows, kv_rows = shape.num_heads * hd, shape.num_kv_heads * hd
    specs = [TensorSpec("token_embd.weight", (shape.vocab_size, hidden), "matrix")]
    for i in range(shape.num_layers):

        def add(
            kind: str, dims: tuple[int, ...], role: str = "matrix", suffix: str = "weight", i=i
        ) -> None:
            specs.append(TensorSpec(f"blk.{i}.{kind}.{suffix}", dims, role, i))

        add("attn_norm", (hidden,), "norm")
        add("attn_q", (q_rows, hidden))
        add("attn_k", (kv_rows, hidden))
        add("attn_v", (kv_rows, hidden))
        if shape.arch == "qwen2":  # q/k/v biases
            add("attn_q", (q_rows,), "bias", "bias")
            add("attn_k", (kv_rows,), "bias", "bias")
            add("attn_v", (kv_rows,), "bias", "bias")
        if shape.arch in ("qwen3", "qwen3moe", "gemma3"):  # per-head q/k RMSNorm
            add("attn_q_norm", (hd,), "norm")
            add("attn_k_norm", (hd,), "norm")
        add("attn_output", (hidden, q_rows))
        if shape.arch == "gemma3":  # the norm after attention
            add("post_attention_norm", (hidden,), "norm")
        add("ffn_norm", (hidden,), "norm")
        if shape.num_experts:  # the router (kept float32, as llama.cpp does) and stacked experts
            experts, width = shape.num_experts, shape.expert_intermediate_size
            add("ffn_gate_inp", (experts, hidden), "router")
            add("ffn_gate_exps", (experts, width, hidden))
            add("ffn_up_exps", (experts, width, hidden))
            add("ffn_down_exps", (experts, hidden, width))
            continue
        add("ffn_gate", (shape.intermediate_size, hidden))
        add("ffn_up", (shape.intermediate_size, hidden))
        add("ffn_down", (hidden, shape.intermediate_size))
        if shape.arch == "gemma3":  # the norm after the MLP
            add("post_ffw_norm", (hidden,), "norm")
    specs.append(TensorSpec("output_norm.weight", (hidden,), "norm"))
    if not shape.tie_word_embeddings:
        specs.append(TensorSpec("output.weight", (shape.vocab_size, hidden), "matrix"))
    return specs


def add_arch_metadata(writer, shape: ModelShape) -> None:
    """The `{arch}.*` keys, as llama.cpp's convert_hf_to_gguf.py writes them for this
    architecture."""
    writer.add_context_length(shape.context_length)
    writer.add_embedding_length(shape.hidden_size)
    writer.add_block_count(shape.num_layers)
    writer.add_feed_forward_length(shape.intermediate_size)
    writer.add_head_count(shape.num_heads)
    writer.add_head_count_kv(shape.num_kv_heads)
    writer.add_rope_freq_base(shape.rope_theta)
    writer.add_layer_norm_rms_eps(shape.rms_norm_eps)
    if shape.explicit_head_dim or shape.dim_per_head != shape.hidden_size // shape.num_heads:
        writer.add_key_length(shape.dim_per_head)
        writer.add_value_length(shape.dim_per_head)
    if shape.arch == "llama":
        writer.add_vocab_size(shape.vocab_size)
        writer.add_rope_dimension_count(shape.dim_per_head)
    if shape.sliding_window:
        writer.add_sliding_window(shape.sliding_window)
    if shape.rope_scaling_factor:
        writer.add_rope_scaling_type(RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(shape.rope_scaling_factor)
    if shape.num_experts:
        writer.add_expert_count(shape.num_experts)
        writer.add_expert_used_count(shape.num_experts_per_tok)
        writer.add_expert_feed_forward_length(shape.expert_intermediate_size)
