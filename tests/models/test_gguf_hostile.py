"""Hostile GGUF files: crafted headers (huge arrays, deep nesting, offsets and strings past the end,
overflowing dimensions, keys of the wrong type) and random mutations of a small valid file. Every
reader entry point (the header reader behind `list` and `show`, the checkpoint the loader opens, the
conversion `generate` runs first, the CLI itself) answers each with InvalidModelFileError, or a
one-line error in the CLI, within seconds: no hang, no traceback."""

from __future__ import annotations

import atexit
import shutil
import struct
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFWriter
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from localchat.cli import app
from localchat.engine.loading.gguf_checkpoint import GGUFCheckpoint
from localchat.engine.loading.model_cache import ensure_converted
from localchat.errors import InvalidModelFileError, LocalchatError
from localchat.models.facts import facts_of
from localchat.models.gguf_header import read_header

U8, U32, I32, F32, STRING, ARRAY, U64 = 0, 4, 5, 6, 8, 9, 10
SECONDS = 5  # what "at once" means here, on a loaded 2-core CI machine


# --- GGUF bytes, written by hand ------------------------------------------------------------------
def text(value: str | bytes) -> bytes:
    raw = value.encode() if isinstance(value, str) else value
    return struct.pack("<Q", len(raw)) + raw


def field(key: str, kind: int, payload: bytes) -> bytes:
    return text(key) + struct.pack("<I", kind) + payload


def tensor(name: str, dims: list[int], type_id: int = 0, offset: int = 0) -> bytes:
    packed = struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims)
    return text(name) + packed + struct.pack("<IQ", type_id, offset)


def gguf(fields: list[bytes], tensors: list[bytes] = (), data: bytes = b"", counts=None) -> bytes:
    """A GGUF v3 file; `counts` (tensors, fields) overrides the counts in its header."""
    n_tensors, n_fields = counts or (len(tensors), len(fields))
    head = b"GGUF" + struct.pack("<IQQ", 3, n_tensors, n_fields) + b"".join(fields)
    head += b"".join(tensors)
    return head + b"\0" * (-len(head) % 32) + data


ARCH = field("general.architecture", STRING, text("llama"))


def nested_arrays(depth: int) -> bytes:
    """An array of an array of ... `depth` deep, each holding the next, the innermost empty."""
    header = struct.pack("<IQ", ARRAY, 1)
    return header * (depth - 1) + struct.pack("<IQ", U8, 0)


CRAFTED = {
    "array-of-2^63-strings": gguf(
        [ARCH, field("tokenizer.ggml.tokens", ARRAY, struct.pack("<IQ", STRING, 2**63))]
    ),
    "array-of-2^63-bytes": gguf([ARCH, field("x.data", ARRAY, struct.pack("<IQ", U8, 2**63))]),
    "arrays-nested-100000-deep": gguf([ARCH, field("x.nested", ARRAY, nested_arrays(100_000))]),
    "string-past-the-end": gguf([ARCH, field("general.name", STRING, struct.pack("<Q", 2**40))]),
    "key-past-the-end": gguf([struct.pack("<Q", 2**63) + b"general"]),
    "2^62-fields": gguf([ARCH], counts=(0, 2**62)),
    "2^62-tensors": gguf([ARCH], counts=(2**62, 1)),
    "tensor-data-past-the-end": gguf(
        [ARCH], [tensor("token_embd.weight", [32, 8], offset=2**40)], data=b"\0" * 1024
    ),
    "tensor-longer-than-the-file": gguf(
        [ARCH], [tensor("token_embd.weight", [4096, 4096])], data=b"\0" * 1024
    ),
    "dims-overflow-int64": gguf([ARCH], [tensor("token_embd.weight", [2**32, 2**32])]),
    "dims-overflow-into-few-bytes": gguf([ARCH], [tensor("t", [2**62, 2**62, 16, 4])]),
    "five-dims": gguf([ARCH], [tensor("t", [1, 1, 1, 1, 1])]),
    "unknown-tensor-type": gguf([ARCH], [tensor("t", [32], type_id=9999)], data=b"\0" * 128),
    "architecture-an-integer": gguf([field("general.architecture", U32, struct.pack("<I", 7))]),
    "architecture-an-array": gguf(
        [field("general.architecture", ARRAY, struct.pack("<IQ", U8, 1) + b"x")]
    ),
    "block-count-a-string": gguf([ARCH, field("llama.block_count", STRING, text("many"))]),
    "tokens-an-integer-array": gguf(
        [ARCH, field("tokenizer.ggml.tokens", ARRAY, struct.pack("<IQI", U32, 1, 5))]
    ),
    "unknown-value-type": gguf([ARCH, field("x.y", 77, b"")]),
    "alignment-not-a-power-of-two": gguf([ARCH, field("general.alignment", U32, b"\3\0\0\0")]),
    "key-not-utf8": gguf([ARCH, text(b"\xff\xfe") + struct.pack("<IB", U8, 0)]),
    "version-99": b"GGUF" + struct.pack("<IQQ", 99, 0, 0),
    "not-gguf": b"PK\3\4" + b"\0" * 64,
    "cut-off": gguf([ARCH])[:20],
    "empty": b"",
}


def _timed(call: Callable[[], object]) -> object:
    start = time.monotonic()
    try:
        return call()
    finally:
        assert time.monotonic() - start < SECONDS, "took too long"


@pytest.fixture(params=sorted(CRAFTED))
def crafted(request, tmp_path) -> Path:
    path = tmp_path / f"{request.param}.gguf"
    path.write_bytes(CRAFTED[request.param])
    return path


@pytest.mark.timeout(60)
def test_each_reader_refuses_a_crafted_file_at_once(crafted):
    for read in (
        lambda: read_header(crafted),
        lambda: GGUFCheckpoint(crafted),
        lambda: ensure_converted(crafted),
    ):
        with pytest.raises(InvalidModelFileError) as error:
            _timed(read)
        message = str(error.value)
        assert crafted.name in message and "\n" not in message
    # `list` shows it anyway, with what its name and size say
    facts = _timed(lambda: facts_of("gguf", crafted))
    assert facts.parameters is None and facts.architecture is None


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "name", ["array-of-2^63-bytes", "arrays-nested-100000-deep", "architecture-an-integer"]
)
@pytest.mark.parametrize("command", ["generate", "show"])
def test_the_cli_says_one_line(tmp_path, monkeypatch, name, command):
    """`generate -m FILE` and `show NAME` (the file under an alias): one line, exit status 2;
    `list` still lists it."""
    monkeypatch.setenv("LOCALCHAT_CACHE_DIR", str(tmp_path / "cache"))  # the alias's registry
    path = tmp_path / f"{name}.gguf"
    path.write_bytes(CRAFTED[name])
    runner = CliRunner()
    if command == "show":
        assert runner.invoke(app, ["alias", "hostile", str(path)]).exit_code == 0
        listed = _timed(lambda: runner.invoke(app, ["list"]))
        assert listed.exit_code == 0 and "hostile" in listed.output
        args = ["show", "hostile"]
    else:
        args = ["generate", "-m", str(path), "--device", "cpu", "hi"]
    result = _timed(lambda: runner.invoke(app, args))
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit), result.exception
    # a progress line may come first ("reading the tokenizer of ..."); the error is one line
    *_, last = result.output.strip().splitlines()
    assert last.startswith("error: ") and path.name in last and "Traceback" not in result.output


# --- a small valid file, mutated ------------------------------------------------------------------
def small_gguf(path: Path) -> Path:
    """A 2-token llama with one block, written by gguf-py as llama.cpp's converter writes one."""
    writer = GGUFWriter(str(path), "llama")
    writer.add_context_length(64)
    writer.add_embedding_length(8)
    writer.add_block_count(1)
    writer.add_feed_forward_length(16)
    writer.add_head_count(2)
    writer.add_head_count_kv(1)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(["a", "b", "ab", "<eos>"])
    writer.add_token_types([1, 1, 1, 3])
    writer.add_token_merges(["a b"])
    writer.add_eos_token_id(3)
    writer.add_chat_template("{{ messages[0]['content'] }}")
    rng = np.random.default_rng(0)
    for name, shape in (
        ("token_embd.weight", (4, 8)),
        ("output_norm.weight", (8,)),
        ("blk.0.attn_norm.weight", (8,)),
        ("blk.0.attn_q.weight", (8, 8)),
        ("blk.0.attn_k.weight", (4, 8)),
        ("blk.0.attn_v.weight", (4, 8)),
        ("blk.0.attn_output.weight", (8, 8)),
        ("blk.0.ffn_norm.weight", (8,)),
        ("blk.0.ffn_gate.weight", (16, 8)),
        ("blk.0.ffn_up.weight", (16, 8)),
        ("blk.0.ffn_down.weight", (8, 16)),
    ):
        writer.add_tensor(name, rng.standard_normal(shape).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


_SMALL_DIR = tempfile.mkdtemp(prefix="localchat-small-gguf-")
atexit.register(shutil.rmtree, _SMALL_DIR, ignore_errors=True)
SMALL = small_gguf(Path(_SMALL_DIR) / "small.gguf")
SMALL_BYTES = SMALL.read_bytes()
HEADER_END = min(t.offset for t in read_header(SMALL).tensors)  # mutations hit the header


def test_the_small_file_reads():
    header = read_header(SMALL)
    assert header.metadata["general.architecture"] == "llama" and header.parameters == 632
    checkpoint = GGUFCheckpoint(SMALL)
    assert checkpoint.hf_config().num_hidden_layers == 1
    assert len(checkpoint.tensor_index()["tensors"]) == 11


def _read_everything(path: Path) -> None:
    read_header(path)
    checkpoint = GGUFCheckpoint(path)
    checkpoint.hf_config()
    checkpoint.tensor_index()
    ensure_converted(path)  # transformers' tokenizer reader too, where the rest reads


@pytest.mark.timeout(300)
@settings(
    max_examples=200,
    deadline=2000,
    derandomize=True,  # the same 200 files on every run: CI stays reproducible
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    changes=st.lists(
        st.tuples(
            st.integers(0, HEADER_END - 1),
            st.sampled_from([0, 1, 0x7F, 0x80, 0xFF, 8, 9, 12]) | st.integers(0, 255),
        ),
        min_size=1,
        max_size=6,
    ),
    cut=st.none() | st.integers(0, len(SMALL_BYTES)),
)
def test_a_mutated_file_is_read_or_refused_clearly(changes, cut):
    data = bytearray(SMALL_BYTES)
    for position, value in changes:
        data[position] = value
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "mutated.gguf"
        path.write_bytes(bytes(data[:cut] if cut is not None else data))
        try:
            _read_everything(path)
        except LocalchatError as error:
            assert "\n" not in error.message
