"""GGUF files of the tiny family models (tests/family_models.py), written with gguf-py the way
llama.cpp's convert_hf_to_gguf.py writes the real models: its tensor names (gguf-py's own
TensorNameMap), its `{arch}.*` metadata, and its conventions: Q/K rows interleaved for the
Llama-style architectures, Gemma's norms stored as 1 + w, experts stacked in one 3-D tensor per
projection (gpt-oss's gate and up de-interleaved), Phi-3's fused qkv and gate_up, longrope's factors
as tensors, routers and 1-D tensors in F32.

The models are the family models with what llama.cpp cannot express in a file set to what it
assumes (Gemma 3's five local layers to one global, SmolLM3's rope-less fourth layer, the Gemmas'
query scale, Qwen3-MoE's renormalized top k, OLMoE without grouped KV heads, gpt-oss's clamp of 7
and its yarn rounded as llama.cpp rounds it), and a small vocabulary (byte-level BPE, sentencepiece
for the Gemmas) with the special tokens chat templates end turns with.

`quantized_reference` gives the transformers model with each weight as gguf-py dequantizes the
file's blocks: quantization works on 32- or 256-value runs along a row's inputs, and every
convention above only moves whole rows, so quantizing in Hugging Face's layout gives the file's
values.
"""

from __future__ import annotations

import copy
import math
import zlib
from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFWriter, TokenType, get_tensor_name_map
from gguf.constants import GGML_QUANT_SIZES, MODEL_ARCH_NAMES
from gguf.quants import dequantize, quantize

from tests import family_models

T = GGMLQuantizationType

# --- the tokenizer -------------------------------------------------------------------------------

SPECIALS = ["<pad>", "<eos>", "<bos>", "<end_of_turn>", "<|return|>", "<|call|>", "<|im_end|>"]
SPECIALS += ["<|end|>"]


def _byte_alphabet() -> list[str]:
    """GPT-2's byte-level alphabet: one printable character per byte, in byte order."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    spelling = bytes_to_unicode()
    return [spelling[b] for b in range(256)]


TOKENS = SPECIALS + _byte_alphabet() + ["Ġt", "he"]
MERGES = ["Ġ t", "h e"]
# Gemma's files are sentencepiece ones: byte-fallback tokens and "▁" for a space
SPM_TOKENS = SPECIALS + [f"<0x{b:02X}>" for b in range(256)] + ["▁", "▁t"]
VOCAB = len(TOKENS)  # 266, as len(SPM_TOKENS)
PAD, EOS, BOS = 0, 1, 2
CHAT_TEMPLATE = (
    "{% for message in messages %}<bos>{{ message['role'] }}\n{{ message['content'] }}"
    "<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<bos>assistant\n{% endif %}"
)


def _add_tokenizer(writer: GGUFWriter, arch: str) -> None:
    """A byte-level BPE vocabulary (llama.cpp's "gpt2" model), or for the Gemmas a sentencepiece
    one ("llama"), with the special tokens first."""
    control = [TokenType.CONTROL] * len(SPECIALS)
    if arch.startswith("gemma"):
        writer.add_tokenizer_model("llama")
        writer.add_token_list(SPM_TOKENS)
        types = control + [TokenType.BYTE] * 256 + [TokenType.NORMAL] * 2
        writer.add_token_scores([0.0] * len(SPECIALS) + [-1000.0] * 256 + [-1.0, -2.0])
        writer.add_add_space_prefix(False)
    else:
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre("default")
        writer.add_token_list(TOKENS)
        types = control + [TokenType.NORMAL] * (VOCAB - len(SPECIALS))
        writer.add_token_merges(MERGES)
    writer.add_token_types([int(t) for t in types])
    writer.add_bos_token_id(BOS)
    writer.add_eos_token_id(EOS)
    writer.add_pad_token_id(PAD)
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)


# --- the models ----------------------------------------------------------------------------------

_GPT_OSS_ROPE = family_models.FAMILIES["gpt-oss"][2]["rope_parameters"]
# family -> (llama.cpp architecture, config changes so that llama.cpp can express the model)
GGUF_FAMILIES: dict[str, tuple[str, dict]] = {
    "gemma": ("gemma", {}),
    # a head_dim that is not hidden / heads, as the real Gemmas' (the 27B's query scale is that)
    "gemma2": ("gemma2", dict(tie_word_embeddings=True, head_dim=32, query_pre_attn_scalar=32)),
    "gemma3": (
        "gemma3",
        dict(
            num_hidden_layers=6,
            layer_types=["sliding_attention"] * 5 + ["full_attention"],
            head_dim=32,
            query_pre_attn_scalar=32,
        ),
    ),
    "phi3": ("phi3", {}),
    "phi4-mini": ("phi3", {}),
    "olmo2": ("olmo2", {}),
    "granite": ("granite", {}),
    "smollm3": ("smollm3", dict(num_hidden_layers=4, no_rope_layers=[1, 1, 1, 0])),
    "qwen2-yarn": ("qwen2", {}),
    "qwen2-moe": ("qwen2moe", dict(mlp_only_layers=[])),
    "qwen3-moe": ("qwen3moe", dict(norm_topk_prob=True)),
    "mixtral": ("llama", {}),
    "llama3": ("llama", {}),
    "olmoe": ("olmoe", dict(num_key_value_heads=4)),  # llama.cpp's OLMoE has no grouped KV heads
    # llama.cpp's yarn rounds its correction range (transformers' truncate=True)
    "gpt-oss": (
        "gpt-oss",
        dict(swiglu_limit=7.0, rope_parameters={**_GPT_OSS_ROPE, "truncate": True}),
    ),
}
# families of tests/family_models.py with no llama.cpp layout: Mistral's window (llama.cpp's llama
# architecture has none) and dynamic NTK (no GGUF key)
NO_LAYOUT = ("mistral-window", "llama-dynamic")
_PERMUTED = ("llama", "granite", "smollm3")  # llama.cpp's "normal" rope: Q/K rows interleaved


def build(family: str, seed: int = 0, **overrides):
    """The family's tiny transformers model (tests/family_models.build) as llama.cpp can store it,
    with this module's vocabulary."""
    tokens = dict(vocab_size=VOCAB, pad_token_id=PAD, eos_token_id=EOS, bos_token_id=BOS)
    return family_models.build(family, seed, **{**GGUF_FAMILIES[family][1], **tokens, **overrides})


# --- tensors -------------------------------------------------------------------------------------


def _permute(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """llama.cpp's Q/K row order: each head's two rotary halves interleaved."""
    shape = weight.shape
    return (
        weight.reshape(heads, 2, shape[0] // heads // 2, *shape[1:]).swapaxes(1, 2).reshape(shape)
    )


def _hf_tensors(model, arch: str) -> list[tuple[str, str, torch.Tensor]]:
    """(Hugging Face source name, the name gguf-py maps, tensor) in llama.cpp's layout, before
    quantization: experts split into gate/up/down stacks, the conventions applied."""
    config = model.config
    out = []
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight" and config.tie_word_embeddings:
            continue  # one tensor for both: token_embd
        tensor = tensor.detach().float()
        base = name.removesuffix(".weight").removesuffix(".bias")
        if arch.startswith("gemma") and name.endswith("norm.weight"):
            tensor = tensor + 1
        if arch in _PERMUTED and base.endswith(("q_proj", "k_proj")):
            heads = config.num_attention_heads if "q_proj" in base else config.num_key_value_heads
            tensor = _permute(tensor, heads)
        if name.endswith("experts.gate_up_proj"):
            if arch == "gpt-oss":  # [E, H, 2I], gate and up interleaved
                tensor = tensor.transpose(1, 2)
                gate, up = tensor[:, 0::2], tensor[:, 1::2]
            else:  # [E, 2I, H], gate first
                gate, up = tensor.chunk(2, dim=1)
            out.append((name, name.replace("gate_up_proj", "gate_proj.weight"), gate))
            out.append((name, name.replace("gate_up_proj", "up_proj.weight"), up))
            continue
        if name.endswith("experts.gate_up_proj_bias"):
            out.append((name, name.replace("gate_up_proj_bias", "gate_proj.bias"), tensor[:, 0::2]))
            out.append((name, name.replace("gate_up_proj_bias", "up_proj.bias"), tensor[:, 1::2]))
            continue
        mapped = name
        if name.endswith("experts.down_proj"):
            tensor = tensor.transpose(1, 2) if arch == "gpt-oss" else tensor
            mapped = f"{name}.weight"
        elif name.endswith("experts.down_proj_bias"):
            mapped = name.replace("down_proj_bias", "down_proj.bias")
        elif name.endswith("self_attn.sinks"):
            mapped = f"{name}.weight"
        elif name.endswith("shared_expert_gate.weight"):
            tensor = tensor.reshape(-1)  # the converter squeezes [1, hidden]
        out.append((name, mapped, tensor.contiguous()))
    return out


def gguf_type(gguf_name: str, tensor: torch.Tensor, quant: str) -> GGMLQuantizationType:
    """The type llama.cpp would give a tensor in a file of `quant` ("f32", "q8_0", "q4_k_m", its
    K-quant mix with Q6_K downs and output, or "mxfp4", gpt-oss's MXFP4_MOE: MXFP4 experts, the
    rest Q8_0): 1-D tensors, biases and routers stay F32; rows too short for a block fall back."""
    if quant == "f32" or tensor.dim() < 2 or not gguf_name.endswith(".weight"):
        return T.F32  # biases too (llama.cpp quantizes only weights)
    if ".ffn_gate_inp." in gguf_name:
        return T.F32
    qtype = T.Q8_0
    if quant == "mxfp4" and "_exps." in gguf_name:
        qtype = T.MXFP4
    if quant == "q4_k_m":
        qtype = T.Q6_K if ("ffn_down" in gguf_name or gguf_name == "output.weight") else T.Q4_K
    row = tensor.shape[-1]
    if row % 256 and qtype in (T.Q4_K, T.Q6_K):
        qtype = T.Q8_0
    return qtype if row % 32 == 0 else T.F16


def _arch_tensors(model, arch: str):
    """(Hugging Face source name, GGUF name, tensor) of every tensor of the file."""
    names = get_tensor_name_map(_model_arch(arch), model.config.num_hidden_layers)
    out = []
    for source, name, tensor in _hf_tensors(model, arch):
        gguf = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if gguf is None:
            raise KeyError(f"gguf-py has no {arch} name for {name}")
        out.append((source, gguf, tensor))
    return out


def _model_arch(arch: str):
    return next(key for key, value in MODEL_ARCH_NAMES.items() if value == arch)


# --- quantization --------------------------------------------------------------------------------


def quantize_blocks(rows: np.ndarray, qtype: GGMLQuantizationType) -> np.ndarray:
    """[..., n] float32 as `qtype` blocks (uint8 [..., bytes]); gguf-py quantizes all but the
    K-quants, which get a plain quantizer of ours (valid blocks, not llama.cpp's search)."""
    rows = np.ascontiguousarray(rows, dtype=np.float32)
    if qtype == T.Q4_K:
        return _q4_k(rows)
    if qtype == T.Q6_K:
        return _q6_k(rows)
    return np.asarray(quantize(rows, qtype)).view(np.uint8).reshape(*rows.shape[:-1], -1)


# where each type's float16 scales lie in its block, and their range
_RANDOM_SCALES = {
    T.Q3_K: ([108], (0.0005, 0.002)),
    T.Q2_K: ([80, 82], (0.001, 0.004)),
    T.IQ4_XS: ([0], (0.0001, 0.0004)),
    T.IQ4_NL: ([0], (0.0005, 0.002)),
}


def random_blocks(shape: tuple[int, ...], qtype: GGMLQuantizationType, seed: int = 0) -> np.ndarray:
    """uint8 blocks of qtype for a [..., n] tensor: random code bytes, finite float16 scales."""
    per_block, size = GGML_QUANT_SIZES[qtype]
    count = int(np.prod(shape)) // per_block
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, (count, size), dtype=np.uint8)
    offsets, (low, high) = _RANDOM_SCALES[qtype]
    for at in offsets:
        scale = rng.uniform(low, high, (count, 1)).astype(np.float16)
        blocks[:, at : at + 2] = scale.view(np.uint8)
    return blocks.reshape(*shape[:-1], shape[-1] // per_block * size)


def _f16(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16)


def _q6_k(x: np.ndarray) -> np.ndarray:
    """Q6_K: per 256 values an f16 d, 16 int8 sub-scales (per 16 values) and 6-bit codes q, value
    d * scale * (q - 32); codes as ggml lays them out (low nibbles in ql, top bits in qh)."""
    blocks = x.reshape(-1, 256)
    sub = blocks.reshape(-1, 16, 16)
    scale = np.abs(sub).max(axis=2) / 31.0
    d = _f16(np.abs(scale).max(axis=1) / 127.0).astype(np.float32)
    safe_d = np.where(d == 0, 1.0, d)
    sc = np.clip(np.rint(scale / safe_d[:, None]), -127, 127).astype(np.int8)
    step = d[:, None, None] * sc[:, :, None].astype(np.float32)
    q = np.where(step == 0, 0, np.rint(sub / np.where(step == 0, 1, step)))
    q = (np.clip(q, -32, 31) + 32).astype(np.uint8).reshape(-1, 2, 4, 32)  # [block, half, k, l]
    ql = np.concatenate(
        [
            (q[:, :, 0] & 15) | ((q[:, :, 2] & 15) << 4),
            (q[:, :, 1] & 15) | ((q[:, :, 3] & 15) << 4),
        ],
        axis=2,
    ).reshape(-1, 128)
    qh = (q[:, :, 0] >> 4) | ((q[:, :, 1] >> 4) << 2) | ((q[:, :, 2] >> 4) << 4)
    qh = (qh | ((q[:, :, 3] >> 4) << 6)).reshape(-1, 64)
    out = np.concatenate([ql, qh, sc.view(np.uint8), _f16(d).view(np.uint8).reshape(-1, 2)], 1)
    return out.reshape(*x.shape[:-1], -1)


def _q4_k(x: np.ndarray) -> np.ndarray:
    """Q4_K: per 256 values f16 d and dmin, 6-bit scale and min per 32 values (packed in 12 bytes),
    4-bit codes q, value d * scale * q - dmin * min."""
    blocks = x.reshape(-1, 256)
    sub = blocks.reshape(-1, 8, 32)
    low = np.minimum(sub.min(axis=2), 0.0)
    scale, minimum = (sub.max(axis=2) - low) / 15.0, -low
    d = _f16(scale.max(axis=1) / 63.0).astype(np.float32)
    dmin = _f16(minimum.max(axis=1) / 63.0).astype(np.float32)
    sc = np.clip(np.rint(scale / np.where(d == 0, 1, d)[:, None]), 0, 63).astype(np.uint8)
    mn = np.clip(np.rint(minimum / np.where(dmin == 0, 1, dmin)[:, None]), 0, 63).astype(np.uint8)
    step = d[:, None, None] * sc[:, :, None]
    shifted = sub + (dmin[:, None] * mn)[:, :, None]
    q = np.where(step == 0, 0, np.rint(shifted / np.where(step == 0, 1, step)))
    q = np.clip(q, 0, 15).astype(np.uint8).reshape(-1, 4, 2, 32)  # pairs of 32-value runs
    qs = (q[:, :, 0] | (q[:, :, 1] << 4)).reshape(-1, 128)
    scales = np.concatenate(
        [
            (sc[:, :4] & 63) | ((sc[:, 4:] >> 4) << 6),
            (mn[:, :4] & 63) | ((mn[:, 4:] >> 4) << 6),
            (sc[:, 4:] & 15) | ((mn[:, 4:] & 15) << 4),
        ],
        axis=1,
    )
    halves = np.stack([_f16(d), _f16(dmin)], axis=1).view(np.uint8).reshape(-1, 4)
    return np.concatenate([halves, scales, qs], axis=1).reshape(*x.shape[:-1], -1)


def _round_trip(tensor: torch.Tensor, qtype: GGMLQuantizationType) -> torch.Tensor:
    """The values a `qtype` file holds for a tensor whose rows run along its last dimension."""
    if qtype == T.F32:
        return tensor
    array = tensor.numpy()
    blocks = quantize_blocks(array.reshape(-1, array.shape[-1]), qtype)
    values = np.asarray(dequantize(blocks, qtype), dtype=np.float32).reshape(array.shape)
    return torch.from_numpy(values.copy())


def quantized_reference(model, family: str, quant: str):
    """A copy of the transformers model whose weights are the file's as gguf-py dequantizes them."""
    arch = GGUF_FAMILIES[family][0]
    types: dict[str, GGMLQuantizationType] = {}
    for source, gguf, tensor in _arch_tensors(model, arch):
        types[source] = gguf_type(gguf, tensor, quant)
    state = {}
    for name, tensor in model.state_dict().items():
        qtype = types.get(name, types["model.embed_tokens.weight"])  # a tied head: the embedding
        # gpt-oss keeps its experts as [E, in, out]: rows run along the middle dimension
        if arch == "gpt-oss" and name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            state[name] = _round_trip(tensor.float().transpose(1, 2), qtype).transpose(1, 2)
        else:
            state[name] = _round_trip(tensor.float(), qtype)
    reference = copy.deepcopy(model)
    reference.load_state_dict(state)
    return reference.eval()


# --- the file ------------------------------------------------------------------------------------


def write_gguf(
    model, family: str, path: Path, quant: str = "f32", tokenizer=None, random_type=None
) -> Path:
    """Write `model` as llama.cpp's converter would for the family, its matrices in `quant`;
    `tokenizer(writer, arch)` writes the vocabulary where this module's is not the model's. With
    `random_type` (a type gguf-py cannot quantize), every matrix whose rows it can hold is random
    blocks of it instead (random_blocks: the file is then not the model)."""
    arch = GGUF_FAMILIES[family][0]
    writer = GGUFWriter(str(path), arch)
    _add_metadata(writer, model.config, arch)
    (tokenizer or _add_tokenizer)(writer, arch)
    for _, gguf, tensor in _arch_tensors(model, arch):
        qtype = gguf_type(gguf, tensor, quant)
        array = tensor.contiguous().numpy().astype(np.float32)
        per_block = GGML_QUANT_SIZES[random_type][0] if random_type else 0
        if (
            random_type
            and gguf_type(gguf, tensor, "q8_0") != T.F32
            and array.shape[-1] % per_block == 0
        ):
            blocks = random_blocks(array.shape, random_type, seed=zlib.crc32(gguf.encode()))
            writer.add_tensor(gguf, blocks, raw_dtype=random_type)
        elif qtype == T.F32:
            writer.add_tensor(gguf, array)
        elif qtype == T.F16:
            writer.add_tensor(gguf, array.astype(np.float16))
        else:
            writer.add_tensor(gguf, quantize_blocks(array, qtype), raw_dtype=qtype)
    for name, values in _extra_tensors(model.config, arch):
        writer.add_tensor(name, values)
    return finish(writer, path)


def finish(writer: GGUFWriter, path: Path) -> Path:
    """Write what `writer` holds (header, metadata, tensors) to its file, `path`."""
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _rope(config) -> tuple[dict, dict]:
    """(full attention's rotary parameters, sliding attention's), as the converter reads them."""
    params = dict(config.rope_parameters or {})
    if "full_attention" in params:
        return params["full_attention"], params.get("sliding_attention", {})
    return params, {}


def _add_metadata(writer: GGUFWriter, config, arch: str) -> None:
    """The `{arch}.*` keys convert_hf_to_gguf.py writes for the family."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    full, sliding = _rope(config)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    if arch not in ("gemma", "gemma2"):  # these two leave llama.cpp's default base (10000)
        writer.add_rope_freq_base(full["rope_theta"])
    if "rope_theta" in sliding:
        writer.add_rope_freq_base_swa(sliding["rope_theta"])
    kind = full.get("rope_type")
    if kind == "linear":
        writer.add_rope_scaling_type(_scaling("LINEAR"))
        writer.add_rope_scaling_factor(full["factor"])
    elif kind == "yarn":
        writer.add_rope_scaling_type(_scaling("YARN"))
        writer.add_rope_scaling_factor(full["factor"])
        writer.add_rope_scaling_orig_ctx_len(full["original_max_position_embeddings"])
        if "beta_fast" in full:
            writer.add_rope_scaling_yarn_beta_fast(full["beta_fast"])
            writer.add_rope_scaling_yarn_beta_slow(full["beta_slow"])
    if arch != "granite" and "head_dim" in config.to_dict():  # Granite's converter drops it
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
    experts = getattr(config, "num_local_experts", None) or getattr(config, "num_experts", None)
    if experts:
        writer.add_expert_count(experts)
        writer.add_expert_used_count(config.num_experts_per_tok)
    if arch in ("llama", "granite", "smollm3"):  # LlamaModel's own keys
        writer.add_vocab_size(config.vocab_size)
        writer.add_rope_dimension_count(config.hidden_size // config.num_attention_heads)
    _add_family_metadata(writer, config, arch, head_dim)


def _scaling(name: str):
    from gguf import RopeScalingType

    return RopeScalingType[name]


def _add_family_metadata(writer: GGUFWriter, config, arch: str, head_dim: int) -> None:
    if arch == "gemma2":
        writer.add_attn_logit_softcapping(config.attn_logit_softcapping)
        writer.add_final_logit_softcapping(config.final_logit_softcapping)
    if arch in ("gemma2", "gemma3", "gpt-oss"):
        writer.add_sliding_window(config.sliding_window)
    if arch == "granite":
        writer.add_attention_scale(config.attention_multiplier)
        writer.add_embedding_scale(config.embedding_multiplier)
        writer.add_residual_scale(config.residual_multiplier)
        writer.add_logit_scale(config.logits_scaling)
    if arch in ("qwen2moe", "qwen3moe"):
        writer.add_expert_feed_forward_length(config.moe_intermediate_size)
    if arch == "qwen2moe":
        writer.add_expert_shared_feed_forward_length(config.shared_expert_intermediate_size)
    if arch == "gpt-oss":
        writer.add_expert_feed_forward_length(config.intermediate_size)
    if arch == "phi3":
        full, _ = _rope(config)
        partial = full.get("partial_rotary_factor", 1.0)
        writer.add_rope_dimension_count(
            int(partial * config.hidden_size) // config.num_attention_heads
        )
        original = full.get("original_max_position_embeddings")
        writer.add_rope_scaling_orig_ctx_len(original or config.original_max_position_embeddings)
        writer.add_sliding_window(config.sliding_window or 0)
        if full.get("rope_type") == "longrope":
            scale = config.max_position_embeddings / original
            writer.add_rope_scaling_attn_factors(
                float(np.sqrt(1 + np.log(scale) / np.log(original))) if scale > 1 else 1.0
            )


def _llama3_divisors(config, params: dict) -> np.ndarray:
    """Llama 3.1's rope scaling as the divisor of each rotary pair's frequency (the rope_freqs
    tensor): 1 for short wavelengths, `factor` for long ones, a smooth blend between."""
    dim = config.head_dim
    factor, low, high = params["factor"], params["low_freq_factor"], params["high_freq_factor"]
    context = params["original_max_position_embeddings"]
    divisors = []
    for i in range(0, dim, 2):
        wavelength = 2 * math.pi * params["rope_theta"] ** (i / dim)
        if wavelength < context / high:
            divisors.append(1.0)
        elif wavelength > context / low:
            divisors.append(factor)
        else:
            smooth = (context / wavelength - low) / (high - low)
            divisors.append(1 / ((1 - smooth) / factor + smooth))
    return np.asarray(divisors, dtype=np.float32)


def _extra_tensors(config, arch: str) -> list[tuple[str, np.ndarray]]:
    """Tensors the converter makes from the config: Llama 3's rope_freqs, Phi-3's longrope
    factors."""
    full, _ = _rope(config)
    if arch == "llama" and full.get("rope_type") == "llama3":
        return [("rope_freqs.weight", _llama3_divisors(config, full))]
    if arch != "phi3" or full.get("rope_type") != "longrope":
        return []
    return [
        ("rope_factors_long.weight", np.asarray(full["long_factor"], dtype=np.float32)),
        ("rope_factors_short.weight", np.asarray(full["short_factor"], dtype=np.float32)),
    ]
