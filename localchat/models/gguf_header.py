"""Read and check a GGUF file's header in one bounded pass: its metadata and tensor table, without
the gguf package's reader (which takes seconds building arrays for the tokenizer, and trusts the
file: an array claiming 2^63 elements hangs it). The loader reads every value, arrays too
(`read_header(path, arrays=True)`: the default model's 49,152 tokens and merges in a tenth of a
second, where gguf-py's reader takes three); listing a model skips them.

Every count, length and offset is checked against the bytes the file has before it is used, arrays
nest at most MAX_ARRAY_DEPTH deep, a tensor's dimensions must multiply to at most 2^63 - 1 and its
data must lie inside the file, and the keys the loader reads must hold values of their type. A file
that breaks any of it is an InvalidModelFileError naming the file and the first problem, so that
the gguf package, and transformers' GGUF tokenizer reader, only ever see a consistent header.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass, field
from math import prod
from pathlib import Path
from typing import Any

import numpy as np

from localchat.errors import InvalidModelFileError

# value types: struct format by type id (8 is a string, 9 an array)
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
_INTEGERS = frozenset({0, 1, 2, 3, 4, 5, 10, 11})
_NUMBERS = _INTEGERS | {6, 12}
_TYPE_NAMES = {
    **dict.fromkeys(_INTEGERS, "an integer"),
    6: "a float",
    12: "a float",
    7: "a bool",
    _STRING: "a string",
    _ARRAY: "an array",
}

MAX_ARRAY_DEPTH = 4  # llama.cpp reads no nested array at all; gguf-py reads any depth
MAX_KEY_BYTES = 65535  # the GGUF spec's bound on keys and tensor names
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_ELEMENTS = 2**63 - 1  # a tensor's element count fits int64, as ggml counts it
_VERSIONS = (2, 3)
_DEFAULT_ALIGNMENT = 32

# What the keys the loader and the tokenizer reader use must hold: one of these shapes
_INT, _NUMBER, _BOOL, _TEXT = "an integer", "a number", "a bool", "a string"
_INTS, _NUMBERS_ARRAY, _TEXTS = "an array of integers", "an array of numbers", "an array of strings"
_INT_OR_INTS = "an integer or an array of integers"
_KNOWN_KEYS = {
    "general.architecture": _TEXT,
    "general.name": _TEXT,
    "general.alignment": _INT,
    "general.file_type": _INT,
    "general.quantization_version": _INT,
    "tokenizer.chat_template": _TEXT,
    "tokenizer.ggml.model": _TEXT,
    "tokenizer.ggml.pre": _TEXT,
    "tokenizer.ggml.tokens": _TEXTS,
    "tokenizer.ggml.merges": _TEXTS,
    "tokenizer.ggml.token_type": _INTS,
    "tokenizer.ggml.scores": _NUMBERS_ARRAY,
    "tokenizer.ggml.add_bos_token": _BOOL,
    "tokenizer.ggml.add_eos_token": _BOOL,
    "tokenizer.ggml.add_space_prefix": _BOOL,
    **{
        f"tokenizer.ggml.{name}_token_id": _INT
        for name in ("bos", "eos", "eot", "eom", "unknown", "padding", "seperator", "mask")
    },
}
# `{general.architecture}.KEY`
_ARCH_KEYS = {
    "context_length": _INT,
    "embedding_length": _INT,
    "block_count": _INT,
    "vocab_size": _INT,
    "feed_forward_length": _INT_OR_INTS,
    "expert_feed_forward_length": _INT,
    "expert_count": _INT,
    "expert_used_count": _INT,
    "attention.head_count": _INT_OR_INTS,
    "attention.head_count_kv": _INT_OR_INTS,
    "attention.key_length": _INT,
    "attention.value_length": _INT,
    "attention.sliding_window": _INT,
    "attention.layer_norm_rms_epsilon": _NUMBER,
    "attention.layer_norm_epsilon": _NUMBER,
    "rope.dimension_count": _INT,
    "rope.freq_base": _NUMBER,
    "rope.scaling.factor": _NUMBER,
    "rope.scaling.type": _TEXT,
}


@dataclass(frozen=True)
class GGUFTensor:
    """One entry of the tensor table: dimensions as the file lists them (fastest-varying first),
    its ggml type and where its data lies in the file."""

    name: str
    dims: tuple[int, ...]
    type_id: int
    offset: int  # from the start of the file
    nbytes: int


@dataclass(frozen=True)
class GGUFHeader:
    """The scalar and string metadata (arrays too where read with `arrays=True`, as lists), each
    key's value type (and an array's element type), the tensor table and the parameter count of a
    checked GGUF file."""

    metadata: dict[str, Any]
    parameters: int
    tensors: tuple[GGUFTensor, ...] = ()
    types: dict[str, tuple[int, int | None]] = field(default_factory=dict)

    def arch_field(self, key: str) -> Any:
        return self.metadata.get(f"{self.metadata.get('general.architecture')}.{key}")


class GGUFFormatError(ValueError):
    """What is wrong with a GGUF header, at the first problem found."""


class _PastTheEnd(GGUFFormatError):
    """A header that reads beyond the file's end: a cut-off download, or a lie."""


def read_header(path: Path, arrays: bool = False) -> GGUFHeader:
    """The checked header of the GGUF file at `path` (with `arrays`, the arrays' values as well),
    or InvalidModelFileError naming the file and what is wrong with it."""
    try:
        with open(path, "rb") as handle:
            if handle.seek(0, 2) == 0:
                raise GGUFFormatError("the file is empty")
            with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
                return _Parser(data, arrays).header()
    except (OSError, GGUFFormatError) as exc:
        hint = "; is it complete? (compare its size with the original)"
        raise InvalidModelFileError(
            f"{Path(path).name} is not a readable GGUF file: {exc}"
            + (hint if isinstance(exc, _PastTheEnd) else "")
        ) from None


class _Parser:
    def __init__(self, data: mmap.mmap, keep_arrays: bool = False):
        self.data, self.pos, self.size = data, 0, len(data)
        self.keep_arrays = keep_arrays

    # --- reading, bounded by the end of the file ---------------------------------------------
    def need(self, count: int, what: str) -> None:
        if count > self.size - self.pos:
            raise _PastTheEnd(
                f"{what} at byte {self.pos} runs past the end of the file ({self.size} bytes)"
            )

    def take(self, fmt: str, what: str) -> Any:
        width = struct.calcsize("<" + fmt)
        self.need(width, what)
        (value,) = struct.unpack_from("<" + fmt, self.data, self.pos)
        self.pos += width
        return value

    def text(self, what: str, limit: int | None = None) -> str:
        length = self.take("Q", f"the length of {what}")
        if limit is not None and length > limit:
            raise GGUFFormatError(f"{what} claims {length} bytes, more than {limit}")
        self.need(length, f"{what} ({length} bytes)")
        raw = bytes(self.data[self.pos : self.pos + length])
        self.pos += length
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise GGUFFormatError(f"{what} is not UTF-8") from None

    def value_type(self, what: str) -> int:
        kind = self.take("I", f"the type of {what}")
        if kind not in _SCALARS and kind not in (_STRING, _ARRAY):
            raise GGUFFormatError(f"{what} has unknown value type {kind}")
        return kind

    def value(self, kind: int, what: str) -> Any:
        if kind == _STRING:
            return self.text(what)
        if kind == _ARRAY:
            return self.array(what, depth=1)
        return self.take(_SCALARS[kind], what)

    def array(self, what: str, depth: int) -> tuple[int, int, list | None]:
        """Read past an array: its (element type, count, and its values where the parser keeps
        arrays: numbers and bools as Python's, strings decoded as UTF-8 with any invalid byte
        replaced, nested arrays as lists)."""
        if depth > MAX_ARRAY_DEPTH:
            raise GGUFFormatError(f"{what} nests arrays more than {MAX_ARRAY_DEPTH} deep")
        kind = self.value_type(f"the elements of {what}")
        count = self.take("Q", f"the length of {what}")
        smallest = struct.calcsize("<" + _SCALARS[kind]) if kind in _SCALARS else 8
        if kind == _ARRAY:
            smallest = 12  # an element type and a length
        if count > (self.size - self.pos) // smallest:
            raise _PastTheEnd(
                f"{what} claims {count} elements, more than the rest of the file holds"
            )
        values: list | None = None
        if kind in _SCALARS:
            if self.keep_arrays:
                dtype = np.dtype("<" + _SCALARS[kind])
                values = np.frombuffer(self.data, dtype, count, self.pos).tolist()
            self.pos += count * smallest
        elif kind == _STRING:
            values = self.texts(count, what)
        else:
            values = []
            for _ in range(count):
                nested = self.array(what, depth + 1)[2]
                if self.keep_arrays:
                    values.append(nested)
        return kind, count, values if self.keep_arrays else None

    def texts(self, count: int, what: str) -> list[str]:
        """Read past `count` strings (an array's), each bounded by the file's end: decoded where
        the parser keeps arrays, else skipped (an empty list)."""
        data, pos, size, out, keep = self.data, self.pos, self.size, [], self.keep_arrays
        unpack = struct.Struct("<Q").unpack_from
        for _ in range(count):
            if pos + 8 > size:
                self.pos = pos
                self.need(8, f"the length of an element of {what}")
            (length,) = unpack(data, pos)
            if length > size - pos - 8:
                self.pos = pos + 8
                self.need(length, f"an element of {what} ({length} bytes)")
            if keep:
                out.append(data[pos + 8 : pos + 8 + length].decode("utf-8", "replace"))
            pos += 8 + length
        self.pos = pos
        return out

    # --- the header --------------------------------------------------------------------------
    def header(self) -> GGUFHeader:
        if bytes(self.data[:4]) != b"GGUF":
            raise GGUFFormatError("it does not start with GGUF")
        self.pos = 4
        version = self.take("I", "the version")
        if version not in _VERSIONS:
            raise GGUFFormatError(f"GGUF version {version} is not supported (2 or 3 are)")
        num_tensors = self.take("Q", "the tensor count")
        num_fields = self.take("Q", "the metadata count")
        # each field is at least a key length, a type and one byte; each tensor entry at least a
        # name length, a dimension count, a type and an offset
        if num_fields > (self.size - self.pos) // 13:
            raise GGUFFormatError(f"{num_fields} metadata entries do not fit in the file")
        if num_tensors > (self.size - self.pos) // 24:
            raise GGUFFormatError(f"{num_tensors} tensors do not fit in the file")
        metadata: dict[str, Any] = {}
        shapes: dict[str, tuple[int, int | None]] = {}  # key -> (type, element type of an array)
        for _ in range(num_fields):
            key = self.text("a metadata key", MAX_KEY_BYTES)
            if key in shapes:
                raise GGUFFormatError(f"metadata key {key!r} appears twice")
            kind = self.value_type(f"metadata {key!r}")
            value = self.value(kind, f"metadata {key!r}")
            if kind == _ARRAY:
                shapes[key] = (kind, value[0])
                if self.keep_arrays:
                    metadata[key] = value[2]
            else:
                shapes[key] = (kind, None)
                metadata[key] = value
        _check_known_keys(metadata, shapes)
        alignment = metadata.get("general.alignment", _DEFAULT_ALIGNMENT)
        if alignment <= 0 or alignment & (alignment - 1):
            raise GGUFFormatError(f"general.alignment {alignment} is not a power of two")
        entries = [self.tensor_entry() for _ in range(num_tensors)]
        data_start = -(-self.pos // alignment) * alignment
        return GGUFHeader(
            metadata,
            sum(prod(dims) for _, dims, _, _ in entries),
            tuple(_tensor(entry, data_start, alignment, self.size) for entry in entries),
            shapes,
        )

    def tensor_entry(self) -> tuple[str, tuple[int, ...], int, int]:
        name = self.text("a tensor name", MAX_KEY_BYTES)
        what = f"tensor {name!r}"
        num_dims = self.take("I", f"the dimension count of {what}")
        if num_dims > MAX_DIMS:
            raise GGUFFormatError(f"{what} has {num_dims} dimensions, more than {MAX_DIMS}")
        dims = tuple(self.take("Q", f"a dimension of {what}") for _ in range(num_dims))
        if prod(dims) > MAX_ELEMENTS:
            raise GGUFFormatError(f"{what}'s dimensions {list(dims)} overflow a 64-bit count")
        type_id = self.take("I", f"the type of {what}")
        offset = self.take("Q", f"the data offset of {what}")
        return name, dims, type_id, offset


def _tensor(
    entry: tuple[str, tuple[int, ...], int, int], data_start: int, alignment: int, size: int
) -> GGUFTensor:
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    name, dims, type_id, offset = entry
    what = f"tensor {name!r}"
    try:
        block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(type_id)]
    except (ValueError, KeyError):
        raise GGUFFormatError(f"{what} has unknown type {type_id}") from None
    if dims and dims[0] % block:
        raise GGUFFormatError(f"{what}'s rows of {dims[0]} are not whole blocks of {block}")
    if offset % alignment:
        raise GGUFFormatError(f"{what}'s data offset {offset} is not a multiple of {alignment}")
    nbytes = prod(dims) // block * block_bytes
    if data_start + offset + nbytes > size:
        raise _PastTheEnd(
            f"{what}'s data ({nbytes} bytes at {data_start + offset}) runs past the end of the "
            f"file ({size} bytes)"
        )
    return GGUFTensor(name, dims, type_id, data_start + offset, nbytes)


def _check_known_keys(metadata: dict[str, Any], shapes: dict[str, tuple[int, int | None]]) -> None:
    """The keys the loader reads hold values of the shape it reads them as."""
    expected = dict(_KNOWN_KEYS)
    arch = metadata.get("general.architecture")
    if "general.architecture" in shapes and not isinstance(arch, str):
        _refuse("general.architecture", _TEXT, shapes["general.architecture"])
    if isinstance(arch, str):
        expected.update({f"{arch}.{key}": shape for key, shape in _ARCH_KEYS.items()})
    for key, (kind, element) in shapes.items():
        want = expected.get(key)
        if want is not None and not _fits(want, kind, element):
            _refuse(key, want, (kind, element))


def _fits(want: str, kind: int, element: int | None) -> bool:
    if kind == _ARRAY:
        return (
            (want in (_INTS, _INT_OR_INTS) and element in _INTEGERS)
            or (want == _NUMBERS_ARRAY and element in _NUMBERS)
            or (want == _TEXTS and element == _STRING)
        )
    return (
        (want in (_INT, _INT_OR_INTS) and kind in _INTEGERS)
        or (want == _NUMBER and kind in _NUMBERS)
        or (want == _BOOL and kind == 7)
        or (want == _TEXT and kind == _STRING)
    )


def _refuse(key: str, want: str, shape: tuple[int, int | None]) -> None:
    kind, element = shape
    found = _TYPE_NAMES[kind]
    if kind == _ARRAY and element is not None:
        found = f"an array of type {element}"
    raise GGUFFormatError(f"metadata {key!r} must be {want}, not {found}")
