"""Route checkpoint tensors (Hugging Face names) into our model, fusing q/k/v and gate/up.

A tensor is dense (torch.Tensor) or quantized (PackedWeight, from a GGUF file). The model is built
on the meta device; each parameter is materialized only when its data arrives, so a quantized model
never holds a dense copy of its projections. Fused parts are collected until complete, then stacked:
dense parts into one parameter (quantized on the way when `quantize_bits` is set), quantized parts
into one PackedWeight (or a tuple when their layouts differ).

Checkpoints name the same tensor in several ways (Mixtral's w1/w2/w3, the experts of transformers
5 and gpt-oss stacked in one 3-D tensor, a multimodal checkpoint's language_model prefix):
`checkpoint_names` turns them into one set of names first. gpt-oss's released checkpoints keep their
experts in MXFP4 (`*_blocks` and `*_scales`): they become PackedWeights of llama.cpp's MXFP4 blocks,
which the kernels read as they read a GGUF's.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import torch
from gguf import GGMLQuantizationType
from torch import nn

from localchat.engine.loading.gguf_repack import file_blocks_weight
from localchat.engine.loading.gguf_rows import GgufRows
from localchat.engine.modeling.decoder import DecoderForCausalLM, RMSNorm, projection_slots
from localchat.errors import UnsupportedModelError
from localchat.kernels.packed_weight import PackedWeight, quantize_weight
from localchat.kernels.quant_linear import fuse

_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
_EXPERT = re.compile(r"^mlp\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.(weight|bias)$")

# HF suffix inside a layer -> (submodule, our attribute, part index, number of parts)
_LAYER_TENSORS = {
    "self_attn.q_proj.weight": ("self_attn", "qkv_weight", 0, 3),
    "self_attn.k_proj.weight": ("self_attn", "qkv_weight", 1, 3),
    "self_attn.v_proj.weight": ("self_attn", "qkv_weight", 2, 3),
    "self_attn.qkv_proj.weight": ("self_attn", "qkv_weight", 0, 1),  # Phi-3: already fused
    "self_attn.q_proj.bias": ("self_attn", "qkv_bias", 0, 3),
    "self_attn.k_proj.bias": ("self_attn", "qkv_bias", 1, 3),
    "self_attn.v_proj.bias": ("self_attn", "qkv_bias", 2, 3),
    "self_attn.o_proj.weight": ("self_attn", "o_weight", 0, 1),
    "self_attn.o_proj.bias": ("self_attn", "o_bias", 0, 1),
    "self_attn.q_norm.weight": ("self_attn.q_norm", "weight", 0, 1),
    "self_attn.k_norm.weight": ("self_attn.k_norm", "weight", 0, 1),
    "self_attn.sinks": ("self_attn", "sinks", 0, 1),
    "mlp.gate_proj.weight": ("mlp", "gate_up_weight", 0, 2),
    "mlp.up_proj.weight": ("mlp", "gate_up_weight", 1, 2),
    "mlp.gate_up_proj.weight": ("mlp", "gate_up_weight", 0, 1),  # Phi-3: already fused
    "mlp.down_proj.weight": ("mlp", "down_weight", 0, 1),
    "mlp.gate_proj.bias": ("mlp", "gate_up_bias", 0, 2),
    "mlp.up_proj.bias": ("mlp", "gate_up_bias", 1, 2),
    "mlp.down_proj.bias": ("mlp", "down_bias", 0, 1),
    "mlp.gate.weight": ("mlp", "router_weight", 0, 1),
    "mlp.router.weight": ("mlp", "router_weight", 0, 1),  # gpt-oss
    "mlp.router.bias": ("mlp", "router_bias", 0, 1),
    "mlp.shared_expert_gate.weight": ("mlp", "shared_expert_gate", 0, 1),
    "input_layernorm.weight": ("input_layernorm", "weight", 0, 1),
    "post_attention_layernorm.weight": ("post_attention_layernorm", "weight", 0, 1),
    "pre_feedforward_layernorm.weight": ("pre_feedforward_layernorm", "weight", 0, 1),
    "post_feedforward_layernorm.weight": ("post_feedforward_layernorm", "weight", 0, 1),
}
for _prefix in ("mlp.shared_expert.",):
    for _suffix in ("gate_proj.weight", "up_proj.weight", "down_proj.weight"):
        _path, _attr, _part, _parts = _LAYER_TENSORS[f"mlp.{_suffix}"]
        _LAYER_TENSORS[_prefix + _suffix] = (_prefix.rstrip("."), _attr, _part, _parts)
_GLOBAL_TENSORS = {
    "model.embed_tokens.weight": ("", "embed_tokens"),
    "model.norm.weight": ("norm", "weight"),
    "lm_head.weight": ("", "lm_head"),
}
# --quantization covers the decoder's projections; the embedding and LM head stay dense (int4 heads
# cost several points of top-1 agreement). Quantized checkpoints (GGUF) keep all of these as they
# come.
_QUANTIZABLE = {"qkv_weight", "o_weight", "gate_up_weight", "down_weight"}
_KEPT_QUANTIZED = _QUANTIZABLE | {"embed_tokens", "lm_head"}

# other spellings of a name -> ours (prefix replacements, then whole-suffix ones)
_PREFIXES = (
    ("model.language_model.", "model."),  # a multimodal checkpoint's text model (transformers 5)
    ("language_model.model.", "model."),  # ... (transformers 4)
    ("language_model.lm_head.", "lm_head."),
    ("model.text_model.", "model."),  # ... (SmolVLM's and Idefics3's)
)
_MIXTRAL = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}
_MIXTRAL_NAME = re.compile(r"^(model\.layers\.\d+\.)block_sparse_moe\.(.+)$")
_MIXTRAL_EXPERT = re.compile(r"^experts\.(\d+)\.(w[123])\.weight$")
_STACKED_EXPERTS = re.compile(
    r"^(model\.layers\.\d+\.mlp\.experts\.)(gate_up_proj|down_proj)(_bias)?$"
)
_MXFP4_EXPERTS = re.compile(
    r"^(model\.layers\.\d+\.mlp\.experts\.)(gate_up_proj|down_proj)_(blocks|scales)$"
)

Weight = torch.Tensor | PackedWeight | GgufRows


def checkpoint_names(
    tensors: Iterable[tuple[str, Weight]], family: str, *, dequantize: bool = False
) -> Iterator[tuple[str, Weight]]:
    """The checkpoint's tensors under the names WeightPlacer knows: prefixes of multimodal
    checkpoints stripped, Mixtral's block_sparse_moe renamed, stacked experts split into one tensor
    per expert (gpt-oss's [E, in, out] with gate and up interleaved; transformers 5's [E, out,
    in] with gate before up; gpt-oss's MXFP4 blocks and scales, once both have come, as one
    PackedWeight per expert and projection, or with `dequantize` as dense float32 weights)."""
    packed: dict[str, dict[str, torch.Tensor]] = {}  # MXFP4 stacks whose other half is to come
    for name, tensor in tensors:
        for old, new in _PREFIXES:
            if name.startswith(old):
                name = new + name.removeprefix(old)
        if match := _MIXTRAL_NAME.match(name):
            rest = match.group(2)
            if expert := _MIXTRAL_EXPERT.match(rest):
                rest = f"experts.{expert.group(1)}.{_MIXTRAL[expert.group(2)]}.weight"
            name = f"{match.group(1)}mlp.{rest}"
        if name.endswith(("_blocks", "_scales")) and ".mlp.experts." in name:
            match = _MXFP4_EXPERTS.match(name)
            if family != "gpt_oss" or match is None or not isinstance(tensor, torch.Tensor):
                raise UnsupportedModelError(
                    f"{name}: MXFP4 experts are read from gpt-oss checkpoints only"
                )
            stack = match.group(1) + match.group(2)
            halves = packed.setdefault(stack, {})
            halves[match.group(3)] = tensor
            if len(halves) == 2:  # the blocks and their scales, in either order
                del packed[stack]
                experts = _mxfp4_experts(match.group(1), match.group(2), **halves)
                for part, weight in experts:
                    yield part, weight.dequantize() if dequantize else weight
            continue
        if isinstance(tensor, torch.Tensor) and (match := _STACKED_EXPERTS.match(name)):
            yield from _split_experts(
                match.group(1), match.group(2), bool(match.group(3)), tensor, family
            )
            continue
        yield name, tensor
    for stack, halves in packed.items():
        missing = "scales" if "blocks" in halves else "blocks"
        present = next(iter(halves))
        raise UnsupportedModelError(f"{stack}_{missing}: missing beside {stack}_{present}")


def _mxfp4_experts(
    prefix: str, kind: str, blocks: torch.Tensor, scales: torch.Tensor
) -> Iterator[tuple[str, PackedWeight]]:
    """One stack of gpt-oss's MXFP4 experts as the released checkpoints keep it (transformers'
    `convert_moe_packed_tensors` reads it): blocks uint8 [experts, rows, in / 32, 16], byte b of
    a block holding its values 2b and 2b + 1 in its low and high nibbles, and scales uint8
    [experts, rows, in / 32], E8M0 exponents (2^(s - 127)); gate_up's rows alternate gate and up.
    Each expert's projections become llama.cpp's MXFP4 blocks (the exponent byte, then byte j
    holding values j and j + 16: the same E2M1 codes), as a GGUF keeps them."""
    name = f"{prefix}{kind}"
    if (
        blocks.dtype != torch.uint8
        or scales.dtype != torch.uint8
        or blocks.dim() != 4
        or blocks.shape[-1] != 16
        or blocks.shape[:-1] != scales.shape
    ):
        raise UnsupportedModelError(
            f"{name}_blocks: expected uint8 blocks [experts, rows, groups, 16] and uint8 scales "
            f"[experts, rows, groups], got {blocks.dtype} {list(blocks.shape)} and {scales.dtype} "
            f"{list(scales.shape)}"
        )
    for expert in range(blocks.shape[0]):
        codes = blocks[expert]
        values = torch.stack((codes & 0x0F, codes >> 4), dim=-1).flatten(-2)  # [rows, groups, 32]
        low_high = values[..., :16] | values[..., 16:] << 4
        rows = torch.cat((scales[expert].unsqueeze(-1), low_high), -1).flatten(-2)
        names = f"{prefix}{expert}."
        if kind == "down_proj":
            yield f"{names}down_proj.weight", _mxfp4_weight(rows)
        else:
            yield f"{names}gate_proj.weight", _mxfp4_weight(rows[0::2])
            yield f"{names}up_proj.weight", _mxfp4_weight(rows[1::2])


def _mxfp4_weight(rows: torch.Tensor) -> PackedWeight:
    return file_blocks_weight(rows.contiguous(), GGMLQuantizationType.MXFP4)


def _split_experts(
    prefix: str, kind: str, bias: bool, tensor: torch.Tensor, family: str
) -> Iterator[tuple[str, torch.Tensor]]:
    suffix = "bias" if bias else "weight"
    transposed = family == "gpt_oss"  # [E, in, out], gate and up interleaved
    for expert, weight in enumerate(tensor):
        if transposed and not bias:
            weight = weight.T
        names = f"{prefix}{expert}."
        if kind == "down_proj":
            yield f"{names}down_proj.{suffix}", weight.contiguous()
        elif transposed:
            yield f"{names}gate_proj.{suffix}", weight[0::2].contiguous()
            yield f"{names}up_proj.{suffix}", weight[1::2].contiguous()
        else:
            gate, up = weight.chunk(2, dim=0)
            yield f"{names}gate_proj.{suffix}", gate.contiguous()
            yield f"{names}up_proj.{suffix}", up.contiguous()


@dataclass
class WeightPlacer:
    """Places (HF name, tensor) pairs into a meta-built model on `device` in `dtype`."""

    model: DecoderForCausalLM
    dtype: torch.dtype
    device: torch.device
    quantize_bits: int | None = None
    pending: dict[tuple[nn.Module, str], dict[int, Weight]] = field(default_factory=dict)
    placed: set[tuple[int, str]] = field(default_factory=set)

    def destination(self, name: str) -> tuple[nn.Module, str, int, int] | None:
        if name in _GLOBAL_TENSORS:
            path, attr = _GLOBAL_TENSORS[name]
            if attr == "lm_head" and self.model.spec.tie_word_embeddings:
                return None
            return self.model.get_submodule(path), attr, 0, 1
        match = _LAYER.match(name)
        if not match or int(match.group(1)) >= len(self.model.layers):
            return None
        suffix = match.group(2)
        if expert := _EXPERT.match(suffix):
            kind = expert.group(2).removesuffix("_proj") + "_proj"
            path, attr, part, parts = _LAYER_TENSORS[f"mlp.{kind}.{expert.group(3)}"]
            path = f"mlp.experts.{expert.group(1)}"
        elif suffix in _LAYER_TENSORS:
            path, attr, part, parts = _LAYER_TENSORS[suffix]
        else:
            return None
        try:
            module = self.model.layers[int(match.group(1))].get_submodule(path)
        except AttributeError:  # q_norm/k_norm, experts, ... of a model without them
            return None
        return (module, attr, part, parts) if module._parameters.get(attr) is not None else None

    @torch.no_grad()
    def add(self, name: str, tensor: Weight) -> None:
        dest = self.destination(name)
        if dest is None:
            return
        module, attr, part, parts = dest
        slot = self.pending.setdefault((module, attr), {})
        slot[part] = tensor
        if len(slot) == parts:
            del self.pending[(module, attr)]
            self._place(module, attr, [slot[i] for i in range(parts)], name)

    def _place(self, module: nn.Module, attr: str, parts: list[Weight], name: str) -> None:
        meta = module._parameters[attr]
        assert meta is not None, f"{name}: no parameter {attr} to place"
        if isinstance(parts[0], GgufRows):  # an embedding left in the file (CPU kernels only)
            self._check_shape(name, parts[0].shape, meta)
            del module._parameters[attr]
            setattr(module, attr, parts[0])
            return
        packed = [p for p in parts if isinstance(p, PackedWeight)]
        if len(packed) == len(parts) and attr in _KEPT_QUANTIZED:
            value = fuse(packed)
            value = (
                value.to(self.device)
                if isinstance(value, PackedWeight)
                else tuple(p.to(self.device) for p in value)
            )
            shape = (sum(p.shape[0] for p in parts), parts[0].shape[1])
            self._check_shape(name, shape, meta)
            del module._parameters[attr]
            setattr(module, attr, value)
        else:
            dense = torch.cat(
                [p.dequantize() if isinstance(p, PackedWeight | GgufRows) else p for p in parts]
            )
            self._check_shape(name, tuple(dense.shape), meta)
            if isinstance(module, RMSNorm) and self.model.spec.norm_offset:
                dense = dense.float() + self.model.spec.norm_offset  # Gemma's (1 + weight)
            if self.quantize_bits and attr in _QUANTIZABLE:
                del module._parameters[attr]
                setattr(module, attr, quantize_weight(dense, self.quantize_bits).to(self.device))
            else:
                module._parameters[attr] = nn.Parameter(
                    dense.to(self.device, self.dtype), requires_grad=False
                )
        self.placed.add((id(module), attr))

    @staticmethod
    def _check_shape(name: str, shape: tuple[int, ...], meta: torch.Tensor) -> None:
        if tuple(shape) != tuple(meta.shape):
            raise ValueError(
                f"checkpoint tensor {name} (fused: {tuple(shape)}) does not fit {tuple(meta.shape)}"
            )

    def missing(self) -> list[str]:
        """Names of parameters still on the meta device (never written)."""
        return [name for name, param in self.model.named_parameters() if param.is_meta]


@torch.no_grad()
def load_weights(
    model: DecoderForCausalLM,
    tensors: Iterable[tuple[str, Weight]],
    *,
    dtype: torch.dtype,
    device: torch.device,
    quantize_bits: int | None = None,
    dequantize: bool = False,
) -> list[str]:
    """Place every tensor; return the names of parameters the checkpoint did not provide.
    `dequantize`: a safetensors checkpoint's quantized tensors (gpt-oss's MXFP4 experts) as
    dense ones."""
    placer = WeightPlacer(model, dtype, device, quantize_bits)
    for name, tensor in checkpoint_names(tensors, model.spec.family, dequantize=dequantize):
        placer.add(name, tensor)
    return placer.missing()


@torch.no_grad()
def init_dummy(
    model: DecoderForCausalLM,
    *,
    dtype: torch.dtype,
    device: torch.device,
    seed: int,
    quantize_bits: int | None = None,
) -> None:
    """Random weights with a sane scale (norm weights 1, biases 0), reproducible from `seed`,
    generated on the device one parameter at a time (so a quantized model never holds all its dense
    weights)."""
    generator = torch.Generator(device=device).manual_seed(seed)
    modules = dict(model.named_modules())
    for name, meta in list(model.named_parameters()):
        module_name, _, attr = name.rpartition(".")
        module = modules[module_name]
        param = torch.empty(meta.shape, dtype=dtype, device=device)
        if name.endswith("norm.weight"):
            param.fill_(1.0)
        elif name.endswith("bias"):
            param.zero_()
        else:
            param.normal_(0.0, 0.02, generator=generator)
        if quantize_bits and attr in _QUANTIZABLE:
            del module._parameters[attr]
            setattr(module, attr, quantize_weight(param, quantize_bits))
        else:
            module._parameters[attr] = nn.Parameter(param, requires_grad=False)


def describe_weights(model: DecoderForCausalLM) -> str:
    """The formats the projections and embedding are held in, e.g. 'Q4_1 + Q8_0' or 'float32'."""
    kinds: set[str] = set()
    values = [model.embed_tokens, *(getattr(m, attr) for m, attr in projection_slots(model))]
    for value in values:
        for part in value if isinstance(value, tuple) else (value,):
            if isinstance(part, PackedWeight | GgufRows):
                kinds.update(part.source_type.split("+"))
            else:
                kinds.add(str(part.dtype).removeprefix("torch."))
    return " + ".join(sorted(kinds))
