"""EngineRuntime: everything loaded and decided before the first step (device, dtype, model,
tokenizer, context length, batch limits, KV pool size)."""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass

import torch

from localchat.config import EngineConfig
from localchat.engine.core.chat_template import ChatTemplate
from localchat.engine.core.kv_groups import kv_layout
from localchat.engine.core.memory import PrefaultedMemory
from localchat.engine.distributed.parallel_layers import shard_model
from localchat.engine.distributed.shard_plan import check_tensor_parallel
from localchat.engine.loading.background_weights import BackgroundWeights
from localchat.engine.loading.loader import (
    ModelFiles,
    eos_token_ids,
    gguf_tensors,
    load_hf_config,
    load_model,
    load_tokenizer,
    model_files,
)
from localchat.engine.modeling.decoder import DecoderForCausalLM
from localchat.engine.modeling.registry import spec_from_config
from localchat.engine.modeling.rotary import rope_parameters_by_key
from localchat.errors import InvalidParameterError, UnsupportedModelError
from localchat.kernels.cpu_extension import cpu_kernels
from localchat.kernels.kv_quant import FP8, Q8_0, check_pool_dtype, kv_row_bytes
from localchat.models.source import resolve_model
from localchat.utils import format_bytes

logger = logging.getLogger("localchat.engine")

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
_KV_DTYPES = {**_DTYPES, "q8_0": Q8_0, "fp8": FP8}  # kernels/kv_quant.py: int8 means q8_0 blocks
CPU_DEFAULT_KV_MEMORY = 1 << 30
CPU_DEFAULT_MAX_MODEL_LEN = 8192  # keeps the rotary tables and the pool modest on a laptop


@dataclass
class EngineRuntime:
    config: EngineConfig
    files: ModelFiles
    hf_config: object
    model: DecoderForCausalLM
    tokenizer: object | None
    chat_template: ChatTemplate | None
    device: torch.device
    dtype: torch.dtype
    kv_cache_dtype: torch.dtype
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    eos_token_ids: set[int]

    @property
    def model_name(self) -> str:
        return self.files.source.name

    @classmethod
    def load(
        cls, config: EngineConfig, progress: Callable[[str], None] | None = None
    ) -> EngineRuntime:
        """Load everything; `progress` hears a short line at each stage (for a loading screen)."""
        say = progress or (lambda message: None)
        device = _pick_device(config.device)
        tp = config.tensor_parallel_size
        if device.type == "cpu":  # tensor-parallel ranks share the cores
            cores = min(os.cpu_count() or 1, torch.get_num_threads())
            torch.set_num_threads(config.num_threads or max(cores // tp, 1))
        dtype = model_dtype(config, device)
        torch.manual_seed(config.seed)
        say("finding the model")
        files = model_files(resolve_model(config.model, progress=progress), progress)
        if device.type == "cpu":  # built once per machine (one to two minutes): say so, not stall
            cpu_kernels(say)
        weights = _early_gguf_weights(config, files, device)
        try:
            return cls._load_from(config, files, device, dtype, say, weights)
        finally:
            if weights is not None:
                weights.close()  # at once where the load failed; else it has finished

    @classmethod
    def _load_from(
        cls,
        config: EngineConfig,
        files: ModelFiles,
        device: torch.device,
        dtype: torch.dtype,
        say: Callable[[str], None],
        weights: BackgroundWeights | None,
    ) -> EngineRuntime:
        tp = config.tensor_parallel_size
        say("reading the config and tokenizer")
        hf_config = load_hf_config(files)
        tokenizer = None
        tokenizer_path = config.tokenizer or (files.directory if files.has_tokenizer else None)
        if tokenizer_path is not None:
            tokenizer = load_tokenizer(tokenizer_path)
            if (
                getattr(tokenizer, "_tokenizer", None) is None
            ):  # incremental detokenization needs it
                raise UnsupportedModelError(
                    f"{tokenizer_path}: only fast tokenizers (tokenizer.json) are supported"
                )
        chat_template = (
            ChatTemplate.for_tokenizer(tokenizer, config.chat_template) if tokenizer else None
        )
        if tp > 1:  # refuse a size that does not split the heads before loading the weights
            check_tensor_parallel(spec_from_config(hf_config), tp)
        kv_cache_dtype = pool_dtype(config, files.source.kind)
        check_pool_dtype(kv_cache_dtype, device, spec_from_config(hf_config).head_dim)
        cuda = device.type == "cuda"
        max_num_seqs = config.max_num_seqs or (256 if cuda else 64)
        max_num_batched_tokens = max(
            config.max_num_batched_tokens or (8192 if cuda else 512), max_num_seqs
        )
        max_model_len = _max_model_len(
            config, hf_config, device, kv_cache_dtype, max_num_batched_tokens
        )
        say(
            f"loading weights ({'random' if config.load_format == 'dummy' else files.source.name}, "
            f"{str(dtype).removeprefix('torch.')}, {device.type})"
        )
        model = load_model(
            files,
            hf_config,
            dtype=dtype,
            device=device,
            load_format=config.load_format,
            quantization=config.quantization,
            seed=config.seed,
            shard=None if tp == 1 else functools.partial(shard_model, rank=0, world_size=tp),
            tensors=weights,
        )
        return cls(
            config,
            files,
            hf_config,
            model,
            tokenizer,
            chat_template,
            device,
            dtype,
            kv_cache_dtype,
            max_model_len,
            max_num_seqs,
            max_num_batched_tokens,
            eos_token_ids(files, hf_config),
        )

    def num_kv_blocks(self, runner) -> int:
        """Blocks that fit the KV budget; the budget must hold at least one full-length sequence
        (in each KV group: every block of a full group, a sliding group's window and a chunk)."""
        per_block = runner.bytes_per_block()
        if self.device.type == "cuda" and self.config.kv_cache_memory is None:
            budget = _cuda_kv_budget(
                runner, self.config.gpu_memory_utilization, self.max_num_batched_tokens
            )
        else:
            budget = kv_budget(self.config)
        num_blocks = budget // per_block
        needed = runner.kv_layout.blocks_per_sequence(
            self.max_model_len, self.config.block_size, self.max_num_batched_tokens
        )
        if num_blocks < needed:
            raise InvalidParameterError(
                f"the KV cache ({format_bytes(budget)}, {num_blocks} blocks of "
                f"{self.config.block_size} tokens) cannot hold one sequence of "
                f"max_model_len={self.max_model_len} tokens ({needed} blocks, "
                f"{format_bytes(needed * per_block)}); raise --kv-cache-memory or lower "
                "--max-model-len",
                param="kv_cache_memory",
            )
        logger.info("KV cache: %d blocks (%s)", num_blocks, format_bytes(num_blocks * per_block))
        return int(num_blocks)


def kv_budget(config: EngineConfig) -> int:
    """The KV pool's bytes as configured: --kv-cache-memory, or the CPU default (on a GPU without
    that option, the budget is what the model leaves; see num_kv_blocks)."""
    if config.kv_cache_memory is None:
        return CPU_DEFAULT_KV_MEMORY
    # a size string is parsed to bytes in EngineConfig.__post_init__
    assert isinstance(config.kv_cache_memory, int)
    return config.kv_cache_memory


def _early_gguf_weights(
    config: EngineConfig, files: ModelFiles, device: torch.device
) -> BackgroundWeights | None:
    """A GGUF file's quantized weights, repacking on a thread of their own from now on while the
    config and tokenizer load (one CPU process, the file's own types); None elsewhere."""
    if (
        files.source.kind != "gguf"
        or config.load_format == "dummy"
        or config.quantization != "auto"
        or device.type != "cpu"
        or config.tensor_parallel_size > 1
    ):
        return None
    return BackgroundWeights(lambda: gguf_tensors(files, dequantize=False, interleave=True))


def prefault_kv_memory(config: EngineConfig) -> PrefaultedMemory | None:
    """Start making the KV pool's memory resident while the model loads, where its size is known
    before the model is (one CPU process); None elsewhere."""
    if config.tensor_parallel_size > 1 or _pick_device(config.device).type != "cpu":
        return None
    return PrefaultedMemory(kv_budget(config))


def _pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise InvalidParameterError(
            "device 'cuda' was requested but no CUDA GPU is available", param="device"
        )
    return torch.device(name)


def model_dtype(config: EngineConfig, device: torch.device) -> torch.dtype:
    """The dtype the model computes in: as configured, or bfloat16 on CUDA and float32 on a CPU."""
    return _DTYPES.get(config.dtype) or (torch.bfloat16 if device.type == "cuda" else torch.float32)


def pool_dtype(config: EngineConfig, source_kind: str) -> torch.dtype:
    """The KV pool's dtype for a model from a `source_kind` file ("gguf", ...): as configured, or
    (auto) float16 where quantized weights (a GGUF file's, or --quantization int8/int4) run float32
    on the CPU, as llama.cpp stores them; else the model's dtype. Attention reads every cached key
    and value at each decode step, so a long context's decode is bound by their bytes. q8_0 is
    torch.int8 here, fp8 torch.float8_e4m3fn (kernels/kv_quant.py)."""
    if config.kv_cache_dtype != "auto":
        return _KV_DTYPES[config.kv_cache_dtype]
    device = _pick_device(config.device)
    dtype = model_dtype(config, device)
    quantized = config.quantization in ("int8", "int4") or (
        source_kind == "gguf" and config.load_format != "dummy" and config.quantization != "none"
    )
    if device.type == "cpu" and dtype == torch.float32 and quantized:
        return torch.float16
    return dtype


def _default_kv_length(
    config: EngineConfig, hf_config, dtype: torch.dtype, chunk: int, limit: int
) -> int:
    """The longest sequence (at most `limit` tokens) the default KV budget holds: every full
    layer's keys, and each sliding-window layer's window and a prefill chunk (kv_groups.py)."""
    spec = spec_from_config(hf_config)
    windows = [spec.layer(i).sliding_window for i in range(spec.num_layers)]
    layout = kv_layout(windows, hybrid=config.tensor_parallel_size == 1)
    block_size = config.block_size
    per_block = (
        2 * layout.slots * block_size * spec.num_kv_heads * kv_row_bytes(dtype, spec.head_dim)
    )
    return layout.longest_sequence(CPU_DEFAULT_KV_MEMORY // per_block, block_size, chunk, limit)


def model_context(hf_config) -> int:
    """The longest context the model takes: max_position_embeddings, stretched by a rope scaling
    that extends it past that (linear and dynamic NTK by their factor, yarn to its factor times the
    original context), as vLLM reads it."""
    base = getattr(hf_config, "max_position_embeddings", None) or 2048
    longest = base
    for params in rope_parameters_by_key(hf_config).values():
        factor = float(params.get("factor") or 1.0)
        if params["rope_type"] in ("linear", "dynamic"):
            longest = max(longest, int(base * factor))
        elif params["rope_type"] == "yarn":
            original = params.get("original_max_position_embeddings") or base
            longest = max(longest, int(original * factor))
    return longest


def _max_model_len(
    config: EngineConfig, hf_config, device: torch.device, dtype: torch.dtype, chunk: int
) -> int:
    model_max = model_context(hf_config)
    if config.max_model_len is None:
        if device.type == "cuda":
            return model_max
        length = min(model_max, CPU_DEFAULT_MAX_MODEL_LEN)
        if (
            config.kv_cache_memory is None
        ):  # a big model's default context is what the default KV budget holds
            fits = _default_kv_length(config, hf_config, dtype, chunk, length)
            if fits < length:
                length = max(fits, config.block_size)
                logger.info(
                    "max_model_len %d: what the default KV cache (%s) holds; raise "
                    "--kv-cache-memory for more",
                    length,
                    format_bytes(CPU_DEFAULT_KV_MEMORY),
                )
        return length
    if config.max_model_len > model_max:
        raise InvalidParameterError(
            f"max_model_len={config.max_model_len} exceeds the model's context of "
            f"{model_max} tokens",
            param="max_model_len",
        )
    return config.max_model_len


def _cuda_kv_budget(runner, utilization: float, num_tokens: int) -> int:
    """What `utilization` of the GPU leaves for KV blocks after the weights, the peak activations of
    a profiling pass over a full step, and whatever other processes and the CUDA context hold."""
    peak = runner.profile_peak_memory(num_tokens)
    free, total = torch.cuda.mem_get_info()
    held_elsewhere = (total - free) - torch.cuda.memory_reserved()
    return max(int(total * utilization) - held_elsewhere - peak, 0)
