"""What `list` and `show` print about a model: architecture, parameter count, quantization,
context length and size on disk, read from its config.json and safetensors headers, or its GGUF
header."""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from math import prod
from pathlib import Path

from localchat.errors import InvalidModelFileError
from localchat.models.family_names import family_of_gguf, family_of_model_type
from localchat.models.gguf_header import read_header
from localchat.models.names import quant_of_filename


@dataclass(frozen=True)
class Facts:
    architecture: str | None
    parameters: int | None
    quantization: str | None
    context_length: int | None
    size_bytes: int
    family: str | None = None  # the family localchat runs it as; None: not one it runs

    @property
    def family_label(self) -> str:
        """The family, or the architecture with "(not supported)"."""
        if self.family:
            return self.family
        return f"{self.architecture} (not supported)" if self.architecture else "-"


def facts_of(kind: str, path: Path) -> Facts:
    """Facts of a 'gguf' file or an 'hf_dir' directory; a field it cannot read is None."""
    return _gguf_facts(path) if kind == "gguf" else _dir_facts(path)


def gguf_quantization(path: Path, file_type: int | None) -> str | None:
    """The file's quantization (general.file_type, e.g. 'q4_k_m'), else its file name's tag."""
    import gguf

    try:
        name = gguf.LlamaFileType(file_type if isinstance(file_type, int) else -1).name
        return name.split("_", 1)[1].lower()
    except (ValueError, TypeError, IndexError):
        return quant_of_filename(path.name)


def _gguf_facts(path: Path) -> Facts:
    try:
        header = read_header(path)
    except InvalidModelFileError:  # listed anyway, with what its name and size say
        return Facts(None, None, quant_of_filename(path.name), None, path.stat().st_size)
    architecture = header.metadata.get("general.architecture")
    return Facts(
        architecture,
        header.parameters,
        gguf_quantization(path, header.metadata.get("general.file_type")),
        header.arch_field("context_length"),
        path.stat().st_size,
        family_of_gguf(architecture, header.arch_field("expert_count")),
    )


def read_config(directory: Path) -> dict:
    try:
        config = json.loads((directory / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}


def _dir_facts(directory: Path) -> Facts:
    config = read_config(directory)
    text = config.get("text_config")
    text = text if isinstance(text, dict) else config
    quant = (config.get("quantization_config") or {}).get("quant_method")
    dtype = config.get("torch_dtype") or config.get("dtype")
    dtypes = {"bfloat16": "bf16", "float16": "f16", "float32": "f32"}
    weights = sorted(directory.glob("*.safetensors"))
    return Facts(
        config.get("model_type"),
        sum(_safetensors_parameters(w) for w in weights) or None,
        quant or dtypes.get(str(dtype), dtype),
        text.get("max_position_embeddings"),
        sum(p.stat().st_size for p in directory.iterdir() if p.is_file()),
        family_of_model_type(config.get("model_type")),
    )


def _safetensors_parameters(path: Path) -> int:
    """Elements of every tensor in a safetensors file, from its JSON header alone."""
    try:
        with open(path, "rb") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            header = json.loads(handle.read(length))
    except (OSError, ValueError, struct.error):
        return 0
    return sum(
        prod(t["shape"]) for k, t in header.items() if k != "__metadata__" and isinstance(t, dict)
    )


def format_parameters(count: int | None) -> str:
    """135M, 494M, 7.6B."""
    if not count:
        return "-"
    if count >= 1e9:
        return f"{count / 1e9:.1f}B"
    return f"{count / 1e6:.0f}M" if count >= 1e6 else f"{count / 1e3:.0f}K"
