"""Read a GGUF file's metadata and tensor shapes in one pass over its header, without the gguf
package's reader (which takes seconds building arrays for the tokenizer)."""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from math import prod
from pathlib import Path
from typing import Any

from localchat.errors import InvalidModelFileError

_SCALARS = {
    0: "B",
    1: "b",
    2: "H",
    3: "h",
    4: "I",
    5: "i",
    6: "f",
    7: "?",
    10: "Q",
    11: "q",
    12: "d",
}
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True)
class GGUFHeader:
    """The scalar and string metadata (arrays are skipped) and the parameter count."""

    metadata: dict[str, Any]
    parameters: int

    def arch_field(self, key: str) -> Any:
        return self.metadata.get(f"{self.metadata.get('general.architecture')}.{key}")


def read_header(path: Path) -> GGUFHeader:
    """The header of the GGUF file at `path`, or InvalidModelFileError naming it."""
    try:
        with (
            open(path, "rb") as handle,
            mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as m,
        ):
            return _parse(m)
    except (OSError, ValueError, struct.error, KeyError, IndexError) as exc:
        raise InvalidModelFileError(f"{path}: not a readable GGUF file ({exc})") from None


class _Cursor:
    def __init__(self, data: mmap.mmap):
        self.data, self.pos = data, 0

    def take(self, fmt: str) -> Any:
        (value,) = struct.unpack_from("<" + fmt, self.data, self.pos)
        self.pos += struct.calcsize("<" + fmt)
        return value

    def string(self) -> str:
        length = self.take("Q")
        text = bytes(self.data[self.pos : self.pos + length]).decode("utf-8", "replace")
        self.pos += length
        return text

    def value(self, kind: int) -> Any:
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            self.skip_array()
            return None
        return self.take(_SCALARS[kind])

    def skip_array(self) -> None:
        kind, count = self.take("I"), self.take("Q")
        if kind in _SCALARS:
            self.pos += count * struct.calcsize("<" + _SCALARS[kind])
            return
        for _ in range(count):
            self.value(kind)


def _parse(data: mmap.mmap) -> GGUFHeader:
    cursor = _Cursor(data)
    if bytes(data[:4]) != b"GGUF":
        raise ValueError("bad magic")
    cursor.pos = 4
    version = cursor.take("I")
    if version < 2:
        raise ValueError(f"GGUF version {version} is too old")
    num_tensors, num_fields = cursor.take("Q"), cursor.take("Q")
    metadata: dict[str, Any] = {}
    for _ in range(num_fields):
        key = cursor.string()
        value = cursor.value(cursor.take("I"))
        if value is not None:
            metadata[key] = value
    parameters = 0
    for _ in range(num_tensors):
        cursor.string()
        dims = [cursor.take("Q") for _ in range(cursor.take("I"))]
        cursor.take("I")  # type
        cursor.take("Q")  # offset
        parameters += prod(dims)
    return GGUFHeader(metadata, parameters)
