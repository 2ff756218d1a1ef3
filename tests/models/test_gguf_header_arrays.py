"""The header reader's arrays (`read_header(path, arrays=True)`, what the loader reads a GGUF file's
metadata with) hold what gguf-py's own reader finds, value for value and type for type."""

from __future__ import annotations

import struct

import numpy as np
from gguf import GGUFReader, GGUFValueType, GGUFWriter

from localchat.models.gguf_header import read_header


def test_every_field_and_tensor_reads_as_gguf_py_reads_it(tmp_path):
    path = tmp_path / "arrays.gguf"
    writer = GGUFWriter(str(path), "llama")
    writer.add_name("arrays")
    writer.add_block_count(2)
    writer.add_array("tokenizer.ggml.tokens", ["<s>", "héllo", "", "<|im_end|>", "\u2581日本"])
    writer.add_array("tokenizer.ggml.token_type", [3, 1, 1, 3, 1])
    writer.add_array("tokenizer.ggml.scores", [0.0, -1.5, 2.25, 1e-7, -3.0])
    writer.add_array("test.bools", [True, False, True])
    writer.add_uint64("test.big", 2**40)
    writer.add_array("test.negative", [-(2**31), 2**31 - 1])
    writer.add_array("test.nested", [[1, 2], [3]])
    writer.add_array("test.empty", [])
    writer.add_float32("test.float", 0.1)
    writer.add_bool("test.flag", True)
    writer.add_tensor("a.weight", np.arange(12, dtype=np.float32).reshape(3, 4))
    writer.add_tensor("b.weight", np.ones((2, 32), dtype=np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    ours = read_header(path, arrays=True)
    theirs = GGUFReader(str(path))
    keys = [key for key in theirs.fields if not key.startswith("GGUF.")]
    assert sorted(ours.metadata) == sorted(keys)
    # nested arrays as lists of lists (gguf-py's contents() runs them together: [1, 2, 3])
    assert ours.metadata["test.nested"] == [[1, 2], [3]]
    for key in keys:
        field = theirs.fields[key]
        if key != "test.nested":
            assert ours.metadata[key] == field.contents(), key
        kind, element = ours.types[key]
        assert GGUFValueType(kind) == field.types[0], key
        if kind == GGUFValueType.ARRAY and field.types[1:]:
            assert GGUFValueType(element) == field.types[1], key
    assert [(t.name, t.dims, t.type_id, t.offset, t.nbytes) for t in ours.tensors] == [
        (t.name, tuple(int(d) for d in t.shape), int(t.tensor_type), t.data_offset, t.n_bytes)
        for t in theirs.tensors
    ]
    # without arrays: the scalars and strings only, as `list` and `show` read them
    plain = read_header(path).metadata
    assert "tokenizer.ggml.tokens" not in plain and plain["test.flag"] is True


def test_a_token_that_is_not_utf8_reads_with_the_byte_replaced(tmp_path):
    def text(raw: bytes) -> bytes:
        return struct.pack("<Q", len(raw)) + raw

    tokens = struct.pack("<IQ", 8, 2) + text(b"ok") + text(b"\xffbad")
    fields = text(b"general.architecture") + struct.pack("<I", 8) + text(b"llama")
    fields += text(b"tokenizer.ggml.tokens") + struct.pack("<I", 9) + tokens
    path = tmp_path / "bad-token.gguf"
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 2) + fields)
    assert read_header(path, arrays=True).metadata["tokenizer.ggml.tokens"] == ["ok", "\ufffdbad"]
