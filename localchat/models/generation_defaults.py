"""A model's own sampling defaults (its generation_config.json), used for the fields a request
leaves unset, as vLLM's `--generation-config auto` does; explicit values win."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

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

    def resolve(self, explicit: dict[str, Any], fallback: dict[str, Any]) -> dict[str, Any]:
        """Each of FIELDS: the `explicit` value (None: unset), else the model's, else the
        `fallback`'s; a field with none of the three is left out."""
        chosen = {**fallback, **self.as_dict()}
        chosen.update({k: v for k, v in explicit.items() if v is not None})
        return {k: chosen[k] for k in FIELDS if k in chosen}

    def fill_request(self, request: T) -> T:
        """A copy of an API request (a msgspec Struct) whose unset (None) sampling fields take
        the model's values; what the request set is kept."""
        import msgspec

        unset = {
            k: v
            for k, v in self.as_dict().items()
            if hasattr(request, k) and getattr(request, k) is None
        }
        return msgspec.structs.replace(request, **unset) if unset else request  # type: ignore[type-var]


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
