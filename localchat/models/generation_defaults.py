"""A model's own sampling defaults (its generation_config.json), used for the fields a request
leaves unset, as vLLM's `--generation-config auto` does; explicit values win."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

FIELDS = ("temperature", "top_p", "top_k", "repetition_penalty")


@dataclass(frozen=True)
class GenerationDefaults:
    """The sampling fields the model's authors chose; None where they chose nothing."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    repetition_penalty: float | None = None

    def as_dict(self) -> dict[str, Any]:
        """Only the fields that are set."""
        return {k: v for k, v in asdict(self).items() if v is not None}

    def fill(self, explicit: dict[str, Any]) -> dict[str, Any]:
        """`explicit` (a request's fields, None when unset) with the unset ones taken from here."""
        return {k: (self.as_dict().get(k) if v is None else v) for k, v in explicit.items()}


NONE = GenerationDefaults()


def generation_config_path(kind: str, path: Path) -> Path:
    """Where a model's generation_config.json is: in its directory, or beside its GGUF file."""
    return (path.parent if kind == "gguf" else path) / "generation_config.json"


def read_generation_defaults(file: Path) -> GenerationDefaults:
    """The four fields of a generation_config.json; a missing or unreadable file gives none
    (`do_sample` is not read, as in vLLM)."""
    return _read(file, file.stat().st_mtime_ns if file.is_file() else 0)


@lru_cache(maxsize=64)
def _read(file: Path, _mtime: int) -> GenerationDefaults:
    try:
        data = json.loads(file.read_text())
    except (OSError, ValueError):
        return NONE
    if not isinstance(data, dict):
        return NONE
    values: dict[str, Any] = {}
    for name in FIELDS:
        value = data.get(name)
        if isinstance(value, int | float) and not isinstance(value, bool):
            values[name] = int(value) if name == "top_k" else float(value)
    return GenerationDefaults(**values)


def defaults_for(kind: str, path: Path) -> GenerationDefaults:
    """The generation defaults of the model at `path` ('gguf' file or 'hf_dir' directory)."""
    return read_generation_defaults(generation_config_path(kind, path))
