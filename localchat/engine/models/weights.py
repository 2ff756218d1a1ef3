"""Route checkpoint tensors (Hugging Face names) into our model, fusing q/k/v and gate/up.

A tensor is dense (torch.Tensor) or quantized (PackedWeight, from a GGUF file). The model is built
on the meta device; each parameter is materialized only when its data arrives, so a quantized model
never holds a dense copy of its projections. Fused parts are collected until complete, then stacked:
dense parts into one parameter (quantized on the way when `quantize_bits` is set), quantized parts
into one PackedWeight (or a tuple when their layouts differ).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch
from torch import nn

from localchat.engine.gguf_rows import GgufRows
from localchat.engine.models.decoder import PROJECTIONS, DecoderForCausalLM
from localchat.kernels.packed_weight import PackedWeight, quantize_weight
from localchat.kernels.quant_linear import fuse

_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")

# HF suffix inside a layer -> (submodule, our attribute, part index, number of parts)
_LAYER_TENSORS = {
    "self_attn.q_proj.weight": ("self_attn", "qkv_weight", 0, 3),
    "self_attn.k_proj.weight": ("self_attn", "qkv_weight", 1, 3),
    "self_attn.v_proj.weight": ("self_attn", "qkv_weight", 2, 3),
    "self_attn.q_proj.bias": ("self_attn", "qkv_bias", 0, 3),
    "self_attn.k_proj.bias": ("self_attn", "qkv_bias", 1, 3),
    "self_attn.v_proj.bias": ("self_attn", "qkv_bias", 2, 3),
    "self_attn.o_proj.weight": ("self_attn", "o_weight", 0, 1),
    "self_attn.q_norm.weight": ("self_attn.q_norm", "weight", 0, 1),
    "self_attn.k_norm.weight": ("self_attn.k_norm", "weight", 0, 1),
    "mlp.gate_proj.weight": ("mlp", "gate_up_weight", 0, 2),
    "mlp.up_proj.weight": ("mlp", "gate_up_weight", 1, 2),
    "mlp.down_proj.weight": ("mlp", "down_weight", 0, 1),
    "input_layernorm.weight": ("input_layernorm", "weight", 0, 1),
    "post_attention_layernorm.weight": ("post_attention_layernorm", "weight", 0, 1),
}
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

Weight = torch.Tensor | PackedWeight | GgufRows


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
        if (
            not match
            or match.group(2) not in _LAYER_TENSORS
            or int(match.group(1)) >= len(self.model.layers)
        ):
            return None
        path, attr, part, parts = _LAYER_TENSORS[match.group(2)]
        try:
            module = self.model.layers[int(match.group(1))].get_submodule(path)
        except AttributeError:  # q_norm/k_norm of a model without them
            return None
        return (module, attr, part, parts) if attr in module._parameters else None

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
) -> list[str]:
    """Place every tensor; return the names of parameters the checkpoint did not provide."""
    placer = WeightPlacer(model, dtype, device, quantize_bits)
    for name, tensor in tensors:
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
    for value in [
        model.embed_tokens,
        *(
            getattr(getattr(layer, path), attr)
            for layer in model.layers
            for path, attr in PROJECTIONS
        ),
    ]:
        for part in value if isinstance(value, tuple) else (value,):
            if isinstance(part, PackedWeight | GgufRows):
                kinds.update(part.source_type.split("+"))
            else:
                kinds.add(str(part.dtype).removeprefix("torch."))
    return " + ".join(sorted(kinds))
