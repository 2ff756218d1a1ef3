"""Load what the engine runs: HF config, our model with its weights, and the tokenizer if there is
one."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from localchat.engine.loading.gguf_checkpoint import gguf_weights
from localchat.engine.loading.model_cache import TENSOR_INDEX, ensure_converted
from localchat.engine.modeling.decoder import DecoderForCausalLM
from localchat.engine.modeling.registry import build_model, text_config
from localchat.engine.modeling.weights import Weight, init_dummy, load_weights
from localchat.errors import InvalidParameterError, ModelNotFoundError
from localchat.models.source import ModelSource

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "vocab.json")


@dataclass
class ModelFiles:
    """A Hugging Face style directory (config, tokenizer, weights), or for a GGUF file a small
    directory with its config and tokenizer, the weights being read from the file itself."""

    directory: Path
    source: ModelSource

    @property
    def has_tokenizer(self) -> bool:
        return any((self.directory / name).is_file() for name in _TOKENIZER_FILES)


def model_files(source: ModelSource, progress=None) -> ModelFiles:
    directory = ensure_converted(source.path, progress) if source.kind == "gguf" else source.path
    return ModelFiles(directory, source)


def load_hf_config(files: ModelFiles):
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(str(files.directory))
    except (OSError, ValueError) as exc:
        raise ModelNotFoundError(f"{files.source.path}: cannot read config.json: {exc}") from exc
    return text_config(config)


def eos_token_ids(files: ModelFiles, hf_config) -> set[int]:
    """EOS ids from generation_config.json (which may list several) and config.json."""
    ids: set[int] = set()
    candidates = [getattr(hf_config, "eos_token_id", None)]
    generation = files.directory / "generation_config.json"
    if generation.is_file():
        candidates.append(json.loads(generation.read_text()).get("eos_token_id"))
    for value in candidates:
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, list):
            ids.update(v for v in value if isinstance(v, int))
    return ids


def load_tokenizer(path: str | Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))


def _safetensors_files(directory: Path) -> list[Path]:
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise ModelNotFoundError(
            f"{directory}: no *.safetensors weights "
            "(use --load-format dummy for random weights from config.json)"
        )
    return files


def _iter_safetensors(files: list[Path]):
    from safetensors import safe_open

    for file in files:
        with safe_open(str(file), framework="pt", device="cpu") as handle:
            for name in handle.keys():  # noqa: SIM118 - a safe_open handle is not iterable
                yield name, handle.get_tensor(name)


def gguf_tensors(
    files: ModelFiles, *, dequantize: bool, interleave: bool
) -> Iterator[tuple[str, Weight]]:
    """The GGUF file's weights (gguf_checkpoint.gguf_weights) by its converted tensor index."""
    index = json.loads((files.directory / TENSOR_INDEX).read_text())
    return gguf_weights(files.source.path, index, dequantize=dequantize, interleave=interleave)


def load_model(
    files: ModelFiles,
    hf_config,
    *,
    dtype: torch.dtype,
    device: torch.device,
    load_format: str = "auto",
    quantization: str = "auto",
    seed: int = 0,
    shard: Callable[[DecoderForCausalLM], DecoderForCausalLM] | None = None,
    tensors: Iterable[tuple[str, Weight]] | None = None,
) -> DecoderForCausalLM:
    """Build the model for `hf_config` on `device` in `dtype` with its weights: a GGUF file's
    quantized tensors kept quantized (unless quantization='none'), a safetensors checkpoint's dense
    (or quantized with int8/int4), or (load_format='dummy') random ones. `shard` cuts it to one
    tensor-parallel rank's part before the weights are packed. `tensors`, where given, are the
    checkpoint's weights already being read (a GGUF file's, as `gguf_tensors` gives them for this
    device and `shard`)."""
    with torch.device("meta"):
        model = build_model(hf_config)
    gguf = files.source.kind == "gguf" and load_format != "dummy"
    if gguf and quantization in ("int8", "int4"):
        raise InvalidParameterError(
            f"{files.source.path.name} is already quantized; --quantization {quantization} "
            "applies to dense checkpoints (use auto or none)",
            param="quantization",
        )
    bits = {"int8": 8, "int4": 4}.get(quantization)
    if load_format == "dummy":
        init_dummy(model, dtype=dtype, device=device, seed=seed, quantize_bits=bits)
    else:
        if tensors is None and gguf:
            # the CPU kernel's layout straight away, unless a TP shard is cut from the rows first
            interleave = device.type == "cpu" and shard is None
            tensors = gguf_tensors(files, dequantize=quantization == "none", interleave=interleave)
        elif tensors is None:
            tensors = _iter_safetensors(_safetensors_files(files.directory))
        try:
            missing = load_weights(
                model,
                tensors,
                dtype=dtype,
                device=device,
                quantize_bits=bits,
                dequantize=quantization == "none",
            )
        except ValueError as exc:
            raise ModelNotFoundError(f"{files.source.path}: {exc}") from exc
        if missing:
            raise ModelNotFoundError(
                f"{files.source.path}: checkpoint lacks weights for "
                f"{', '.join(sorted(missing)[:5])}"
            )
    model = model.eval().requires_grad_(False)
    if shard is not None:
        model = shard(model)
    model.pack_weights()
    return model
