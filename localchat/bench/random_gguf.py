"""Write a random-weight GGUF of any Llama/Qwen2/Qwen3/Qwen3-MoE (or Gemma 3) shape in a chosen
quantization mix, with the default model's tokenizer (or the caller's `tokenizer` fields), so tests
and benchmarks have 1B-, 8B- and 30B-A3B-shaped files without a model hub (`mxfp4`: a MoE's
experts in MXFP4, as gpt-oss's files have them, and its other matrices in Q8_0).

Each tensor is written as soon as it is made, so memory stays at about one tensor. Its blocks are
drawn at random from a pool of 65,536 random blocks of its type: the legacy types (Q4_0 ... Q8_0,
MXFP4, BF16) are quantized from normal weights with `gguf.quants.quantize`; K-quants, which gguf-py
cannot quantize, get random codes and scale bytes with fp16 super-block scales chosen so the
dequantized weights have the asked standard deviation. Drawing from a pool keeps an 8B file to
about a minute of CPU; the values are as random as a speed benchmark needs, and mean nothing.

Not reproduced: llama.cpp's rope_freqs tensor for llama3 rope scaling (it costs nothing at run
time, and the presets have no rope scaling).
"""

from __future__ import annotations

import functools
import os
import shutil
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
from gguf import (
    GGML_QUANT_SIZES,
    GGMLQuantizationType,
    GGUFValueType,
    GGUFWriter,
    LlamaFileType,
)
from gguf.quants import dequantize, quantize

from localchat.bench.gguf_shapes import (
    ModelShape,
    TensorSpec,
    add_arch_metadata,
    tensor_specs,
)
from localchat.errors import InvalidParameterError, LocalchatError
from localchat.models.gguf_header import read_header

T = GGMLQuantizationType
# quantization name -> (type of most matrices, llama.cpp file type)
QUANTS: dict[str, tuple[GGMLQuantizationType, LlamaFileType]] = {
    "q4_k_m": (T.Q4_K, LlamaFileType.MOSTLY_Q4_K_M),
    "q5_k_m": (T.Q5_K, LlamaFileType.MOSTLY_Q5_K_M),
    "q4_k": (T.Q4_K, LlamaFileType.MOSTLY_Q4_K_S),
    "q5_k": (T.Q5_K, LlamaFileType.MOSTLY_Q5_K_S),
    "q6_k": (T.Q6_K, LlamaFileType.MOSTLY_Q6_K),
    "q8_0": (T.Q8_0, LlamaFileType.MOSTLY_Q8_0),
    "q4_0": (T.Q4_0, LlamaFileType.MOSTLY_Q4_0),
    "q4_1": (T.Q4_1, LlamaFileType.MOSTLY_Q4_1),
    "q5_0": (T.Q5_0, LlamaFileType.MOSTLY_Q5_0),
    "q5_1": (T.Q5_1, LlamaFileType.MOSTLY_Q5_1),
    # llama.cpp's MXFP4_MOE (gpt-oss's files): the experts MXFP4, every other matrix Q8_0
    "mxfp4": (T.MXFP4, LlamaFileType.MOSTLY_MXFP4_MOE),
    "f16": (T.F16, LlamaFileType.MOSTLY_F16),
    "bf16": (T.BF16, LlamaFileType.MOSTLY_BF16),
    "f32": (T.F32, LlamaFileType.ALL_F32),
}
# Q6_K for the output and for attn_v / ffn_down of about half the layers
_MIXED = ("q4_k_m", "q5_k_m")
# llama.cpp's fallback when a row is not a whole number of 256-wide super-blocks
_K_FALLBACK = {T.Q4_K: T.Q5_0, T.Q5_K: T.Q5_1, T.Q6_K: T.Q8_0}
_FLOAT_BLOCK = 32  # pool block width for the float types
POOL_BLOCKS = 1 << 16
# K-quants: x = d*sc*q - dmin*m with sc, m, q uniform; dmin = d * mean(q) centres the weights on
# zero
_K_MIN_RATIO = {T.Q4_K: 7.5, T.Q5_K: 15.5}

Progress = Callable[[int, int], None]
# every `tokenizer.*` field (key, value, type, array item type), and the vocabulary's size
TokenizerFields = tuple[list[tuple[str, object, GGUFValueType, GGUFValueType | None]], int]


def _use_more_bits(layer: int, num_layers: int) -> bool:
    """llama.cpp's choice of the layers that get Q6_K in a *_K_M file (the first and last eighth,
    and every third layer between)."""
    eighth = num_layers // 8
    return layer < eighth or layer >= 7 * num_layers // 8 or (layer - eighth) % 3 == 2


def tensor_type(spec: TensorSpec, quant: str, shape: ModelShape) -> GGMLQuantizationType:
    """The GGML type of one tensor in the given quantization mix."""
    if spec.role != "matrix":
        return T.F32
    qtype = QUANTS[quant][0]
    if qtype == T.MXFP4 and not spec.kind.endswith("_exps"):
        qtype = T.Q8_0
    if quant in _MIXED:
        output = spec.kind == "output" or (spec.kind == "token_embd" and shape.tie_word_embeddings)
        more_bits = (
            spec.kind in ("attn_v", "ffn_down", "ffn_down_exps")
            and spec.layer is not None
            and _use_more_bits(spec.layer, shape.num_layers)
        )
        if output or more_bits:
            qtype = T.Q6_K
    row = spec.shape[-1]
    if row % GGML_QUANT_SIZES[qtype][0]:
        qtype = _K_FALLBACK.get(qtype, qtype)
    if row % GGML_QUANT_SIZES[qtype][0]:
        qtype = T.F16
    return qtype


def plan(shape: ModelShape, quant: str) -> list[tuple[TensorSpec, GGMLQuantizationType]]:
    if quant not in QUANTS:
        raise InvalidParameterError(
            f"quantization must be one of {', '.join(QUANTS)}, got {quant!r}", param="quant"
        )
    return [(spec, tensor_type(spec, quant, shape)) for spec in tensor_specs(shape)]


def tensor_nbytes(spec: TensorSpec, qtype: GGMLQuantizationType) -> int:
    block, type_size = GGML_QUANT_SIZES[qtype]
    return int(np.prod(spec.shape)) // block * type_size


def estimated_size(shape: ModelShape, quant: str) -> int:
    """Bytes of tensor data (the metadata adds a few MB)."""
    return sum(tensor_nbytes(spec, qtype) for spec, qtype in plan(shape, quant))


@functools.cache  # (read once per process)
def default_tokenizer() -> TokenizerFields:
    """Every `tokenizer.*` field of the default model's GGUF (key, value, type, array item type),
    and the size of its vocabulary."""
    from localchat.models.default_model import pull_default_model

    header = read_header(pull_default_model(), arrays=True)
    fields = []
    for key, value in header.metadata.items():
        if key.startswith("tokenizer."):
            kind, element = header.types[key]
            item = None if element is None else GGUFValueType(element)
            fields.append((key, value, GGUFValueType(kind), item))
    vocab = len(header.metadata["tokenizer.ggml.tokens"])
    return fields, vocab


def _k_quant_pool(qtype: GGMLQuantizationType, rng: np.random.Generator, std: float) -> np.ndarray:
    """Random K-quant blocks: random codes and packed 6-bit scales, fp16 super-block scales set so
    that the dequantized values have standard deviation `std`."""
    _, type_size = GGML_QUANT_SIZES[qtype]
    pool = rng.integers(0, 256, (POOL_BLOCKS, type_size), dtype=np.uint8)
    d_at = slice(type_size - 2, type_size) if qtype == T.Q6_K else slice(0, 2)  # Q6_K keeps d last
    ratio = _K_MIN_RATIO.get(qtype)

    def set_scales(d: np.ndarray) -> None:
        pool[:, d_at] = d.astype(np.float16).reshape(-1, 1).view(np.uint8)
        if ratio is not None:  # dmin follows d
            pool[:, 2:4] = (d * ratio).astype(np.float16).reshape(-1, 1).view(np.uint8)

    set_scales(np.ones(POOL_BLOCKS, dtype=np.float32))
    unit_std = float(dequantize(pool, qtype).std())
    set_scales(rng.uniform(0.5, 1.5, POOL_BLOCKS).astype(np.float32) * (std / unit_std / 1.04))
    return pool


def block_pool(qtype: GGMLQuantizationType, rng: np.random.Generator, std: float) -> np.ndarray:
    """POOL_BLOCKS random blocks of `qtype` as uint8 rows of the type's block size in bytes (float
    types: rows of 32 values)."""
    if qtype in _K_MIN_RATIO or qtype == T.Q6_K:
        return _k_quant_pool(qtype, rng, std)
    block = GGML_QUANT_SIZES[qtype][0]
    width = _FLOAT_BLOCK if block == 1 else block
    weights = (rng.standard_normal((POOL_BLOCKS, width), dtype=np.float32) * std).astype(np.float32)
    if qtype == T.F32:
        return weights.view(np.uint8)
    if qtype == T.F16:
        return weights.astype(np.float16).view(np.uint8)
    # BF16 and the legacy types
    return np.ascontiguousarray(quantize(weights, qtype)).view(np.uint8)


def _tensor_bytes(
    spec: TensorSpec, qtype: GGMLQuantizationType, pools: dict, rng: np.random.Generator, std: float
) -> np.ndarray:
    if spec.role == "norm":
        return np.ones(spec.shape, dtype=np.float32).view(np.uint8)
    if spec.role in ("bias", "router"):
        return (rng.standard_normal(spec.shape, dtype=np.float32) * std).view(np.uint8)
    pool = pools.get(qtype)
    if pool is None:
        pool = pools[qtype] = block_pool(qtype, rng, std)
    block_values = GGML_QUANT_SIZES[qtype][0]
    block_values = _FLOAT_BLOCK if block_values == 1 else block_values
    if spec.shape[-1] % block_values:  # a float row not a multiple of 32 values: no pool
        values = rng.standard_normal(spec.shape, dtype=np.float32) * std
        return np.ascontiguousarray(quantize(values, qtype)).view(np.uint8)
    blocks = pool[rng.integers(0, POOL_BLOCKS, int(np.prod(spec.shape)) // block_values)]
    return blocks.reshape(*spec.shape[:-1], -1) if len(spec.shape) >= 2 else blocks.reshape(-1)


def write_random_gguf(
    path: str | os.PathLike,
    shape: ModelShape,
    quant: str = "q4_k_m",
    *,
    seed: int = 0,
    std: float = 0.02,
    progress: Progress | None = None,
    tokenizer: TokenizerFields | None = None,
) -> Path:
    """Write the file (to a temporary name, renamed when complete) and return its path. The
    vocabulary is `tokenizer`'s, else the default model's."""
    path = Path(path)
    tokenizer_fields, vocab = tokenizer or default_tokenizer()
    shape = replace(shape, vocab_size=vocab)
    tensors = plan(shape, quant)
    total = sum(tensor_nbytes(spec, qtype) for spec, qtype in tensors)
    path.parent.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(path.parent).free
    if free < total + (256 << 20):
        raise LocalchatError(
            f"{path.parent}: {free / 2**30:.1f} GiB free, the file needs {total / 2**30:.1f} GiB"
        )
    partial = path.with_name(f"{path.name}.partial-{os.getpid()}")
    writer = GGUFWriter(str(partial), shape.arch)
    try:
        _write(writer, shape, quant, tensors, tokenizer_fields, seed, std, total, progress)
        os.replace(partial, path)
    finally:
        writer.close()
        partial.unlink(missing_ok=True)
    return path


def _write(
    writer: GGUFWriter,
    shape: ModelShape,
    quant: str,
    tensors,
    tokenizer_fields,
    seed: int,
    std: float,
    total: int,
    progress: Progress | None,
) -> None:
    writer.add_type("model")
    writer.add_name(f"random {shape.name} {quant}")
    add_arch_metadata(writer, shape)
    writer.add_file_type(int(QUANTS[quant][1]))
    for key, value, vtype, sub_type in tokenizer_fields:
        writer.add_key_value(key, value, vtype, sub_type=sub_type)
    if quant not in ("f32", "f16", "bf16"):
        writer.add_quantization_version(2)
    for spec, qtype in tensors:
        block, type_size = GGML_QUANT_SIZES[qtype]
        byte_shape = (*spec.shape[:-1], spec.shape[-1] // block * type_size)
        writer.add_tensor_info(
            spec.name, byte_shape, np.dtype(np.uint8), tensor_nbytes(spec, qtype), raw_dtype=qtype
        )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    rng = np.random.Generator(np.random.SFC64(seed))
    pools: dict = {}
    done = 0
    for spec, qtype in tensors:
        data = _tensor_bytes(spec, qtype, pools, rng, std)
        writer.write_tensor_data(data)
        done += data.nbytes
        if progress is not None:
            progress(done, total)
    writer.flush()
