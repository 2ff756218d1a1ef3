"""Small parsing helpers shared by the config, the CLI and the server."""

from __future__ import annotations

import os
import re
from pathlib import Path

from localchat.errors import InvalidParameterError

_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "kib": 1024,
    "m": 1000**2,
    "mb": 1000**2,
    "mib": 1024**2,
    "g": 1000**3,
    "gb": 1000**3,
    "gib": 1024**3,
    "t": 1000**4,
    "tb": 1000**4,
    "tib": 1024**4,
}


def parse_memory_size(value: int | str, *, param: str = "kv_cache_memory") -> int:
    """Parse `512MiB`, `4GiB`, `1.5GB` or a plain byte count into bytes."""
    if isinstance(value, bool):
        raise InvalidParameterError(
            f"{param} must be a size like '512MiB' or a byte count", param=param
        )
    if isinstance(value, int):
        size = value
    else:
        match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(value))
        unit = match.group(2).lower() if match else None
        if match is None or unit not in _SIZE_UNITS:
            raise InvalidParameterError(
                f"{param}={value!r} is not a size; use e.g. '512MiB', '4GiB' or a byte count",
                param=param,
            )
        size = int(float(match.group(1)) * _SIZE_UNITS[unit])
    if size <= 0:
        raise InvalidParameterError(f"{param} must be positive, got {value!r}", param=param)
    return size


def format_bytes(size: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(size) < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"


def partial_suffix(text: str, tag: str) -> int:
    """Length of the longest end of `text` that is a proper beginning of `tag`."""
    for size in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-size:]):
            return size
    return 0


def private_dir(path: Path) -> Path:
    """`path` as a directory, created (with its parents) readable by its owner alone (0700) when
    missing; one that exists keeps its mode."""
    if not path.is_dir():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.mkdir(mode=0o700, exist_ok=True)
    return path


def private_file(path: Path, *, make_dir: bool = True) -> Path:
    """`path` as a file readable and writable by its owner alone (0600): created empty when missing
    (its folder with private_dir unless not `make_dir`), narrowed to 0600 when it exists. SQLite
    gives its journal and WAL files the database's mode."""
    if make_dir:
        private_dir(path.parent)
    os.close(os.open(path, os.O_CREAT | os.O_WRONLY | getattr(os, "O_CLOEXEC", 0), 0o600))
    os.chmod(path, 0o600)
    return path


def write_private(path: Path, text: str) -> None:
    """Write `text` to `path`, a file of mode 0600 (private_file)."""
    private_file(path)
    path.write_text(text)
