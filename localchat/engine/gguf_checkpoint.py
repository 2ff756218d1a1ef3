"""Read a GGUF file with the `gguf` package: an HF config from its metadata, and its tensors dequantized
to float32 under Hugging Face names (llama.cpp's rotary row permutation of Q/K undone)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from localchat.errors import UnsupportedModelError

# GGUF architecture -> (HF config class name, HF architecture, Q/K rows permuted by llama.cpp's converter)
_ARCHES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", True),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", False),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", False),
}

_LAYER_NAMES = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}
_GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


class GGUFCheckpoint:
    """A memory-mapped GGUF file."""

    def __init__(self, path: Path):
        from gguf import GGUFReader

        self.path = Path(path)
        self.reader = GGUFReader(str(self.path))
        self.arch = self.field("general.architecture")
        if self.arch not in _ARCHES:
            raise UnsupportedModelError(
                f"{self.path.name}: GGUF architecture {self.arch!r} is not supported; supported: {', '.join(_ARCHES)}"
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
            raise UnsupportedModelError(f"{self.path.name}: GGUF rope_freqs (llama3 rope scaling) is not supported; "
                                        "use the Hugging Face safetensors checkpoint")
        kwargs = dict(
            architectures=[architecture],
            vocab_size=len(self.field("tokenizer.ggml.tokens", [])) or self._arch_field("vocab_size"),
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

    def hf_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """(HF name, float32 tensor) for every weight, dequantized one at a time."""
        from gguf.quants import dequantize

        permuted = _ARCHES[self.arch][2]
        num_heads = self._arch_field("attention.head_count")
        num_kv_heads = self._arch_field("attention.head_count_kv", num_heads)
        for tensor in self.reader.tensors:
            name = _hf_name(tensor.name)
            if name is None:
                continue
            array = dequantize(tensor.data, tensor.tensor_type)
            # np.array copies: the memory-mapped GGUF data is read-only
            array = np.array(array, dtype=np.float32).reshape([int(d) for d in reversed(tensor.shape)])
            if permuted and name.endswith("q_proj.weight"):
                array = _unpermute(array, num_heads)
            elif permuted and name.endswith("k_proj.weight"):
                array = _unpermute(array, num_kv_heads)
            yield name, torch.from_numpy(np.ascontiguousarray(array))


def _hf_name(gguf_name: str) -> str | None:
    parts = gguf_name.split(".")
    if parts[0] == "blk" and len(parts) == 4 and parts[2] in _LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}.{parts[3]}"
    if len(parts) == 2 and parts[0] in _GLOBAL_NAMES:
        return f"{_GLOBAL_NAMES[parts[0]]}.{parts[1]}"
    return None


def _unpermute(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Invert llama.cpp's permutation, which interleaves each head's two rotary halves row by row."""
    rows = weight.shape[0]
    return (weight.reshape(num_heads, rows // num_heads // 2, 2, *weight.shape[1:])
            .swapaxes(1, 2).reshape(weight.shape))
