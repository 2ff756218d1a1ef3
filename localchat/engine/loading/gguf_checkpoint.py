"""Read a GGUF file (its header with models/gguf_header.py, its blocks through a memory map, the
`gguf` package's tables of types): an HF config from its metadata, and its tensors under
Hugging Face names with llama.cpp's conventions undone (engine/loading/gguf_arches.py), quantized
ones kept as PackedWeights.

A tensor of stacked experts ([experts, rows, columns], llama.cpp's `ffn_*_exps`) is split into one
weight per expert; each expert's blocks are a contiguous range of the tensor, so a quantized expert
stays in the file's memory map exactly as a 2-D tensor does.
"""

from __future__ import annotations

import contextlib
import mmap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from localchat.engine.loading.gguf_arches import ARCHES, GgufMeta, rope_parameters
from localchat.engine.loading.gguf_names import TensorTarget
from localchat.engine.loading.gguf_names import tensor_target as _target
from localchat.engine.loading.gguf_repack import DENSE_TYPES, QUANTIZED_TYPES, dense, repack
from localchat.engine.loading.gguf_rows import GgufRows
from localchat.engine.loading.gguf_transcode import TRANSCODED, transcode
from localchat.errors import InvalidModelFileError, UnsupportedModelError
from localchat.kernels.packed_weight import PackedWeight
from localchat.models.gguf_header import GGUFHeader, read_header

Weight = torch.Tensor | PackedWeight | GgufRows


class GGUFCheckpoint:
    """A memory-mapped GGUF file."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.header = open_gguf(self.path)
        self.arch = self.field("general.architecture")
        if self.arch == "clip":
            raise UnsupportedModelError(
                f"{self.path.name} is llama.cpp's image encoder of a model (an mmproj file), not "
                "a model: pass it with --mmproj beside the model's GGUF file"
            )
        if self.arch not in ARCHES:
            raise UnsupportedModelError(
                f"{self.path.name}: GGUF architecture {self.arch!r} is not supported; "
                f"supported: {', '.join(ARCHES)}"
            )
        self.meta = GgufMeta(self.header, self.arch, self.path)
        self._check_sizes()

    def _check_sizes(self) -> None:
        """The sizes every family's config is built from are positive integers, and there are no
        more blocks than tensors (the config builders loop over the blocks)."""
        for key in ("embedding_length", "block_count", "attention.head_count"):
            value = self.meta.get(key)
            if type(value) is not int or value < 1:
                found = "missing" if value is None else f"{value!r}"
                raise InvalidModelFileError(
                    f"{self.path.name}: {self.arch}.{key} must be a positive integer, is {found}"
                )
        blocks, tensors = self.meta.get("block_count"), len(self.meta.tensors)
        if blocks > tensors:
            raise InvalidModelFileError(
                f"{self.path.name}: {self.arch}.block_count is {blocks}, more than its {tensors} "
                "tensors"
            )

    def field(self, key: str, default=None):
        return self.header.metadata.get(key, default)

    def hf_config(self):
        """The transformers config the file's metadata describes; InvalidModelFileError where its
        values make none (a size of 0, a key missing or of another type)."""
        # transformers' configs check their fields as huggingface_hub's strict dataclasses
        from huggingface_hub.errors import StrictDataclassError

        try:
            return self._hf_config()
        except (
            TypeError,
            ValueError,
            ZeroDivisionError,
            KeyError,
            IndexError,
            OverflowError,
            StrictDataclassError,
        ) as exc:
            what = " ".join(f"{type(exc).__name__}: {exc}".split())
            raise InvalidModelFileError(
                f"{self.path.name}: its metadata does not make a {self.arch} model ({what})"
            ) from None

    def _hf_config(self):
        import transformers

        meta = self.meta
        num_heads = meta.get("attention.head_count")
        hidden = meta.get("embedding_length")
        head_dim = meta.get("attention.key_length", hidden // num_heads)
        embedding = meta.shape("token_embd.weight")
        common = dict(
            vocab_size=embedding[0] if embedding else len(self.field("tokenizer.ggml.tokens", [])),
            hidden_size=hidden,
            intermediate_size=meta.get("feed_forward_length"),
            num_hidden_layers=meta.get("block_count"),
            num_attention_heads=num_heads,
            num_key_value_heads=meta.get("attention.head_count_kv", num_heads),
            head_dim=head_dim,
            rms_norm_eps=meta.get("attention.layer_norm_rms_epsilon", 1e-6),
            rope_parameters=rope_parameters(meta, head_dim),
            max_position_embeddings=meta.get("context_length", 4096),
            tie_word_embeddings="output.weight" not in meta.tensors,
            bos_token_id=self.field("tokenizer.ggml.bos_token_id"),
            eos_token_id=self.field("tokenizer.ggml.eos_token_id"),
        )
        config_class, architecture, fields = ARCHES[self.arch].build(meta, common)
        config = getattr(transformers, config_class)(**fields)
        config.architectures = [architecture]
        return config

    def tensor_index(self) -> dict:
        """What loading the weights needs, as JSON: the tensors' names, types, shapes and byte
        ranges, and the head counts for un-permuting Q/K. Reading it back skips parsing the file's
        metadata. Refuses, by name, a tensor we have no place for or a type we cannot read, before
        anything is loaded."""
        num_heads = self.meta.get("attention.head_count")
        index = {
            "arch": self.arch,
            "num_heads": num_heads,
            "num_kv_heads": self.meta.get("attention.head_count_kv", num_heads),
            "tensors": tensor_entries(self.header),
        }
        for entry in index["tensors"]:
            if tensor_target(self.arch, entry["name"], self.path) is not None:
                _check_type(entry, self.path)
        return index


def open_gguf(path: Path) -> GGUFHeader:
    """The checked header of the GGUF file at `path`, its arrays read too (models/gguf_header.py,
    bounded by the file's bytes); InvalidModelFileError naming the file where it cannot be read."""
    return read_header(path, arrays=True)


def tensor_entries(header: GGUFHeader) -> list[dict]:
    """Each tensor of a GGUF file (its checked header): its name, type, shape (rows first) and byte
    range."""
    return [
        {
            "name": t.name,
            "type": t.type_id,
            "shape": list(reversed(t.dims)),
            "offset": t.offset,
            "nbytes": t.nbytes,
        }
        for t in header.tensors
    ]


def float_tensors(path: Path, entries: list[dict]) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, float32 tensor) of each of the file's `entries` (tensor_entries), whatever its type
    (a type we cannot read refused by name), read through a memory map of the file."""
    data = _mapped(path, entries)
    for entry in entries:
        _check_type(entry, path)
        raw = data[entry["offset"] : entry["offset"] + entry["nbytes"]]
        shape = tuple(entry["shape"])
        weight = _weight(
            raw, entry["type"], shape, TensorTarget(entry["name"]), {}, True, False, False
        )
        assert isinstance(weight, torch.Tensor)  # dequantized: a float32 tensor
        yield entry["name"], weight


def _mapped(path: Path, entries: list[dict]) -> np.memmap:
    """The file's bytes, memory-mapped; InvalidModelFileError where they end before a tensor."""
    data = np.memmap(path, dtype=np.uint8, mode="r")
    if data.size < max((t["offset"] + t["nbytes"] for t in entries), default=0):
        raise InvalidModelFileError(
            f"{path.name}: the file is shorter than its tensor table says (cut off?)"
        )
    return data


def tensor_target(arch: str, name: str, path: Path) -> TensorTarget | None:
    try:
        return _target(ARCHES[arch], name)
    except UnsupportedModelError as exc:
        raise UnsupportedModelError(f"{path.name}: {exc} (architecture {arch!r})") from None


def _check_type(entry: dict, path: Path) -> None:
    from gguf import GGMLQuantizationType

    qtype = GGMLQuantizationType(entry["type"])
    if qtype in DENSE_TYPES or qtype in QUANTIZED_TYPES or qtype in TRANSCODED:
        return
    raise UnsupportedModelError(
        f"{path.name}: tensor {entry['name']} has GGUF type {qtype.name}; supported: "
        f"{', '.join(t.name for t in (*DENSE_TYPES, *QUANTIZED_TYPES, *TRANSCODED))}"
    )


def gguf_weights(
    path: Path, index: dict, dequantize: bool = False, interleave: bool = False
) -> Iterator[tuple[str, Weight]]:
    """(HF name, weight) for every tensor we use, read through a memory map of the file: quantized
    types as PackedWeights (their codes kept; with `interleave`, in the CPU kernel's layout, which
    leaves Q4_K, Q5_K, Q6_K and the long-row one-group types (Q8_0, Q4_0 ... MXFP4) in the map as
    their blocks, and an untied token embedding as GgufRows, read from the map as it is looked
    up), F32/F16/BF16 as tensors; with `dequantize`, all as float32 tensors (the reference path).
    A stack of experts comes as one weight per expert. `index` is
    GGUFCheckpoint.tensor_index()."""
    data = _mapped(path, index["tensors"])
    untied = any(entry["name"] == "output.weight" for entry in index["tensors"])
    for entry in index["tensors"]:
        target = tensor_target(index["arch"], entry["name"], path)
        if target is None:
            continue
        _check_type(entry, path)
        raw = data[entry["offset"] : entry["offset"] + entry["nbytes"]]
        shape = tuple(entry["shape"])
        if target.experts:
            parts = _split_experts(raw, shape, target.name)
        else:
            parts = [(target.name, raw, shape)]
        in_map = False
        for name, part, part_shape in parts:
            embedding = interleave and untied and name == "model.embed_tokens.weight"
            weight = _weight(
                part, entry["type"], part_shape, target, index, dequantize, interleave, embedding
            )
            yield name, weight
            in_map = in_map or _reads_the_map(weight, data)
        if not in_map:
            _release(data, entry["offset"], entry["nbytes"])


def _split_experts(
    raw: np.ndarray, shape: tuple[int, ...], template: str
) -> list[tuple[str, np.ndarray, tuple[int, ...]]]:
    """One (name, bytes, shape) per expert of a [experts, ...] tensor: expert e's bytes are the
    e-th of `experts` equal ranges (views of the file's map, never copies)."""
    count = shape[0]
    if len(shape) < 2 or raw.size % count:
        raise InvalidModelFileError(f"{template}: a stack of experts of shape {shape}")
    each = raw.size // count
    return [
        (template.format(expert=e), raw[e * each : (e + 1) * each], shape[1:]) for e in range(count)
    ]


def _weight(
    raw: np.ndarray,
    type_id: int,
    shape: tuple[int, ...],
    target: TensorTarget,
    index: dict,
    dequantize: bool,
    interleave: bool,
    embedding: bool,
) -> Weight:
    """One tensor (a 1-D or 2-D one, or one expert of a stack) as its weight."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize as gguf_dequantize

    qtype = GGMLQuantizationType(type_id)
    order = None
    if target.permute is not None:
        heads = index["num_heads"] if target.permute == "q" else index["num_kv_heads"]
        order = _unpermute_index(shape[0], heads)
    # a norm, a bias or a gate vector: float32 (llama.cpp keeps them so)
    small = bool(target.shift or target.row_vector or len(shape) == 1)
    if qtype in TRANSCODED and not (dequantize or small):  # blocks the kernels read, in memory
        blocks, qtype = transcode(raw.reshape(shape[0], -1), qtype)
        raw = blocks.reshape(-1)
    weight: torch.Tensor
    if qtype in DENSE_TYPES:
        weight = dense(raw, qtype, shape)
    elif dequantize or small:
        rows = raw.reshape(shape[0], -1) if len(shape) > 1 else raw
        array = np.asarray(gguf_dequantize(rows, qtype), dtype=np.float32)
        weight = torch.from_numpy(np.ascontiguousarray(array.reshape(shape)))
    elif embedding:  # an untied embedding, only ever looked up: left in the file
        return GgufRows(raw.reshape(shape[0], -1), qtype, (shape[0], shape[1]))
    else:  # rows reordered while repacking
        return repack(raw, qtype, (shape[0], shape[1]), order, interleave)
    if order is not None:
        weight = weight[order].contiguous()
    if dequantize or small:
        weight = weight.float()
    if target.shift:
        weight = weight - target.shift  # stored as w + shift; the placer adds the family's back
    return weight.reshape(1, -1) if target.row_vector else weight


def _reads_the_map(weight: Weight, data: np.memmap) -> bool:
    """Whether the weight keeps reading the file's memory map (the file's blocks, GgufRows)."""
    if isinstance(weight, GgufRows):
        return True
    return isinstance(weight, PackedWeight) and np.may_share_memory(weight.qweight.numpy(), data)


def _release(data: np.memmap, offset: int, nbytes: int) -> None:
    """Drop a tensor's file pages from this process once it is repacked (they stay in the page
    cache), so loading a big model does not count the whole file on top of the weights in its peak
    memory."""
    handle = getattr(data, "_mmap", None)
    if handle is None or not hasattr(mmap, "MADV_DONTNEED"):
        return
    start = offset - offset % mmap.PAGESIZE
    with contextlib.suppress(OSError, ValueError):
        handle.madvise(mmap.MADV_DONTNEED, start, offset + nbytes - start)


def _unpermute_index(rows: int, num_heads: int) -> torch.Tensor:
    """Row order that inverts llama.cpp's permutation, which interleaves each head's two rotary
    halves."""
    return (
        torch.arange(rows).reshape(num_heads, rows // num_heads // 2, 2).transpose(1, 2).reshape(-1)
    )
