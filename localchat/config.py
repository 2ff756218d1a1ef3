"""EngineConfig: every knob of the engine, validated when it is built."""

from __future__ import annotations

from dataclasses import dataclass, fields

from localchat.errors import InvalidParameterError
from localchat.utils import parse_memory_size

DTYPES = ("auto", "float32", "float16", "bfloat16")
LOAD_FORMATS = ("auto", "dummy")
DEVICES = ("auto", "cpu", "cuda")
QUANTIZATIONS = ("auto", "none", "int8", "int4")
KV_CACHE_DTYPES = ("auto", "float32", "float16", "bfloat16", "q8_0", "fp8")


def _check(condition: bool, param: str, message: str) -> None:
    if not condition:
        raise InvalidParameterError(f"{param} {message}", param=param)


@dataclass(slots=True)
class EngineConfig:
    """What to load and how to run it; defaults suit the machine (`None` means: choose for the
    device).

    `model` is a local HF directory, a `.gguf` file, a hub id in the local HF cache, or None for the
    embedded default (SmolLM2-135M-Instruct). `quantization`: auto keeps a GGUF file's quantized
    weights as they are (and a dense checkpoint dense), none dequantizes them, int8/int4 quantize a
    dense checkpoint's projections weight-only, group-wise. `kv_cache_memory` takes '512MiB'/'4GiB'
    or bytes; on CUDA without it the pool takes `gpu_memory_utilization` of the GPU after the
    weights and a profiling pass. `kv_cache_dtype`: auto stores keys and values in float16 where
    quantized weights run float32 on the CPU (as llama.cpp does: half the bytes per token, twice
    the context per GiB), else in the model's dtype; q8_0 (the CPU) in llama.cpp's Q8_0 blocks,
    0.53x of float16's bytes; fp8 (CUDA, compute capability 8.9+) in float8 e4m3. `mmproj` is
    llama.cpp's image encoder file of a GGUF model (its mmproj GGUF); None takes the one beside the
    model in its directory or pulled repo, 'none' none.
    """

    model: str | None = None
    tokenizer: str | None = None
    mmproj: str | None = None
    load_format: str = "auto"
    quantization: str = "auto"
    dtype: str = "auto"
    device: str = "auto"
    max_model_len: int | None = None
    block_size: int = 16
    kv_cache_memory: int | str | None = None
    kv_cache_dtype: str = "auto"
    gpu_memory_utilization: float = 0.9
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    enable_prefix_caching: bool = True
    enforce_eager: bool = False
    chat_template: str | None = None
    seed: int = 0
    num_threads: int | None = None
    tensor_parallel_size: int = 1
    # vLLM's --speculative-config: a dict or its JSON (engine/speculative/config.py); None: off
    speculative_config: dict | str | None = None

    def __post_init__(self) -> None:
        _check(
            self.load_format in LOAD_FORMATS,
            "load_format",
            f"must be one of {LOAD_FORMATS}, got {self.load_format!r}",
        )
        _check(
            self.quantization in QUANTIZATIONS,
            "quantization",
            f"must be one of {QUANTIZATIONS}, got {self.quantization!r}",
        )
        _check(self.dtype in DTYPES, "dtype", f"must be one of {DTYPES}, got {self.dtype!r}")
        _check(
            self.kv_cache_dtype in KV_CACHE_DTYPES,
            "kv_cache_dtype",
            f"must be one of {KV_CACHE_DTYPES}, got {self.kv_cache_dtype!r}",
        )
        _check(self.device in DEVICES, "device", f"must be one of {DEVICES}, got {self.device!r}")
        _check(
            self.block_size in (8, 16, 32, 64, 128),
            "block_size",
            f"must be 8, 16, 32, 64 or 128, got {self.block_size}",
        )
        if self.max_model_len is not None:
            _check(
                self.max_model_len >= 1, "max_model_len", f"must be >= 1, got {self.max_model_len}"
            )
        if self.kv_cache_memory is not None:
            self.kv_cache_memory = parse_memory_size(self.kv_cache_memory)
        _check(
            0.0 < self.gpu_memory_utilization <= 1.0,
            "gpu_memory_utilization",
            f"must be in (0, 1], got {self.gpu_memory_utilization}",
        )
        if self.max_num_seqs is not None:
            _check(
                1 <= self.max_num_seqs <= 4096,
                "max_num_seqs",
                f"must be in [1, 4096], got {self.max_num_seqs}",
            )
        if self.max_num_batched_tokens is not None:
            _check(
                self.max_num_batched_tokens >= 1,
                "max_num_batched_tokens",
                f"must be >= 1, got {self.max_num_batched_tokens}",
            )
        if self.num_threads is not None:
            _check(self.num_threads >= 1, "num_threads", f"must be >= 1, got {self.num_threads}")
        _check(
            1 <= self.tensor_parallel_size <= 64,
            "tensor_parallel_size",
            f"must be in [1, 64], got {self.tensor_parallel_size}",
        )

        if self.speculative_config is not None:
            from localchat.engine.speculative.config import SpeculativeConfig

            parsed = SpeculativeConfig.parse(self.speculative_config)
            self.speculative_config = None if parsed is None else parsed.to_dict()

    @classmethod
    def from_kwargs(cls, model: str | None = None, **kwargs) -> EngineConfig:
        """Build from keyword arguments, naming any that are unknown."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise InvalidParameterError(
                f"unknown engine option(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}",
                param=unknown[0],
            )
        return cls(model=model, **kwargs)
