"""Read a GGUF file with the `gguf` package: an HF config from its metadata, and its tensors under
Hugging Face names (llama.cpp's rotary row permutation of Q/K undone), quantized ones kept as
PackedWeights."""

from __future__ import annotations

import contextlib
import mmap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from localchat.engine.gguf_repack import DENSE_TYPES, QUANTIZED_TYPES, dense, repack
from localchat.engine.gguf_rows import GgufRows
from localchat.errors import InvalidModelFileError, UnsupportedModelError
from localchat.kernels.packed_weight import PackedWeight

# GGUF architecture -> (HF config class name, HF architecture, Q/K rows permuted by llama.cpp's
# converter)
_ARCHES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", True),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", False),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", False),
}

_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}


class GGUFCheckpoint:
    """A memory-mapped GGUF file."""

    def __init__(self, path: Path):
        from gguf import GGUFReader

        self.path = Path(path)
        try:
            self.reader = GGUFReader(str(self.path))
        except (
            ValueError,
            OSError,
            IndexError,
            KeyError,
        ) as exc:  # a bad magic, a cut-off file, a bad field
            raise InvalidModelFileError(
                f"{self.path.name} is not a readable GGUF file ({exc}); is it complete? "
                "(compare its size with the original)"
            ) from None
        self.arch = self.field("general.architecture")
        if self.arch not in _ARCHES:
            raise UnsupportedModelError(
                f"{self.path.name}: GGUF architecture {self.arch!r} is not supported; "
                f"supported: {', '.join(_ARCHES)}"
            )

    def field(self, key: str, default=None):
        field = self.reader.fields.get(key)
        return default if field is None else field.contents()

    def _arch_field(self, key: str, default=None):
        return self.field(f"{self.arch}.{key}", default)

    def hf_config(self):
        import transformers

        config_name, architecture, _ = _ARCHES[self.arch]
        num_heads = self._arch_field("attention.head_count")
        hidden = self._arch_field("embedding_length")
        tensor_names = {t.name for t in self.reader.tensors}
        if "rope_freqs.weight" in tensor_names:
            raise UnsupportedModelError(
                f"{self.path.name}: GGUF rope_freqs (llama3 rope scaling) is not supported; "
                "use the Hugging Face safetensors checkpoint"
            )
        kwargs = dict(
            architectures=[architecture],
            vocab_size=len(self.field("tokenizer.ggml.tokens", []))
            or self._arch_field("vocab_size"),
            hidden_size=hidden,
            intermediate_size=self._arch_field("feed_forward_length"),
            num_hidden_layers=self._arch_field("block_count"),
            num_attention_heads=num_heads,
            num_key_value_heads=self._arch_field("attention.head_count_kv", num_heads),
            head_dim=self._arch_field("attention.key_length", hidden // num_heads),
            rms_norm_eps=self._arch_field("attention.layer_norm_rms_epsilon", 1e-6),
            rope_theta=self._arch_field("rope.freq_base", 10000.0),
            max_position_embeddings=self._arch_field("context_length", 4096),
            tie_word_embeddings="output.weight" not in tensor_names,
            bos_token_id=self.field("tokenizer.ggml.bos_token_id"),
            eos_token_id=self.field("tokenizer.ggml.eos_token_id"),
        )
        config = getattr(transformers, config_name)(**kwargs)
        config.architectures = [architecture]
        return config

    def tensor_index(self) -> dict:
        """What loading the weights needs, as JSON: the tensors' names, types, shapes and byte
        ranges, and the head counts for un-permuting Q/K. Reading it back skips parsing the file's
        metadata (the tokenizer's arrays take seconds in gguf-py)."""
        num_heads = self._arch_field("attention.head_count")
        return {
            "arch": self.arch,
            "num_heads": num_heads,
            "num_kv_heads": self._arch_field("attention.head_count_kv", num_heads),
            "tensors": [
                {
                    "name": t.name,
                    "type": int(t.tensor_type),
                    "shape": [int(d) for d in reversed(t.shape)],
                    "offset": int(t.data_offset),
                    "nbytes": int(t.n_bytes),
                }
                for t in self.reader.tensors
            ],
        }


def gguf_weights(
    path: Path, index: dict, dequantize: bool = False, interleave: bool = False
) -> Iterator[tuple[str, torch.Tensor | PackedWeight | GgufRows]]:
    """(HF name, weight) for every tensor we use, read through a memory map of the file: quantized
    types as PackedWeights (their codes kept; with `interleave`, in the CPU kernel's layout, which
    leaves Q4_K, Q5_K, Q6_K and long-row Q8_0 in the map as their blocks, and an untied token
    embedding as GgufRows, read from the map as it is looked up), F32/F16/BF16 as tensors; with
    `dequantize`, all as float32 tensors (the reference path). `index` is
    GGUFCheckpoint.tensor_index()."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize as gguf_dequantize

    data = np.memmap(path, dtype=np.uint8, mode="r")
    if data.size < max((t["offset"] + t["nbytes"] for t in index["tensors"]), default=0):
        raise InvalidModelFileError(
            f"{path.name}: the file is shorter than its tensor table says (cut off?)"
        )
    permuted = _ARCHES[index["arch"]][2]
    untied = any(entry["name"] == "output.weight" for entry in index["tensors"])
    for entry in index["tensors"]:
        name = _hf_name(entry["name"])
        if name is None:
            continue
        shape = tuple(entry["shape"])
        qtype = GGMLQuantizationType(entry["type"])
        raw = data[entry["offset"] : entry["offset"] + entry["nbytes"]]
        order = None
        if permuted and name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = index["num_heads"] if name.endswith("q_proj.weight") else index["num_kv_heads"]
            order = _unpermute_index(shape[0], heads)
        if qtype in DENSE_TYPES:
            weight: torch.Tensor | PackedWeight | GgufRows = dense(raw, qtype, shape)
        elif qtype not in QUANTIZED_TYPES:
            raise UnsupportedModelError(
                f"{path.name}: tensor {entry['name']} has GGUF type {qtype.name}; supported: "
                f"{', '.join(t.name for t in (*DENSE_TYPES, *QUANTIZED_TYPES))}"
            )
        elif interleave and untied and name == "model.embed_tokens.weight" and not dequantize:
            weight = GgufRows(raw.reshape(shape[0], -1), qtype, (shape[0], shape[1]))
        elif dequantize:
            array = np.asarray(
                gguf_dequantize(raw.reshape(shape[0], -1), qtype), dtype=np.float32
            ).reshape(shape)
            weight = torch.from_numpy(np.ascontiguousarray(array))
        else:
            weight = repack(raw, qtype, shape, order, interleave)  # rows reordered while repacking
        if order is not None and isinstance(weight, torch.Tensor):
            weight = weight[order].contiguous()
        if dequantize and isinstance(weight, torch.Tensor) and weight.dtype != torch.float32:
            weight = weight.float()
        yield name, weight
        if not _reads_the_map(weight, data):
            _release(data, entry["offset"], entry["nbytes"])


def _reads_the_map(weight: torch.Tensor | PackedWeight | GgufRows, data: np.memmap) -> bool:
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


def _hf_name(gguf_name: str) -> str | None:
    parts = gguf_name.split(".")
    if parts[0] == "blk" and len(parts) == 4 and parts[2] in _LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}.{parts[3]}"
    if len(parts) == 2 and parts[0] in _GLOBAL_NAMES:
        return f"{_GLOBAL_NAMES[parts[0]]}.{parts[1]}"
    return None


def _unpermute_index(rows: int, num_heads: int) -> torch.Tensor:
    """Row order that inverts llama.cpp's permutation, which interleaves each head's two rotary
    halves."""
    return (
        torch.arange(rows).reshape(num_heads, rows // num_heads // 2, 2).transpose(1, 2).reshape(-1)
    )
