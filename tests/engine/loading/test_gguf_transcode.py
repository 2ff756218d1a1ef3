"""Block types the kernels do not read (Q3_K, IQ4_NL, IQ4_XS, Q2_K), rewritten at load: gguf-py
dequantizes the rewritten blocks to the original's floats (exactly where the module says so), and
a file of them runs as its float path does."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize

from localchat import LLM
from localchat.engine.loading.gguf_transcode import TRANSCODED, transcode, transcode_reference
from localchat.kernels.cpu_extension import cpu_kernels
from tests.gguf_writer import build, random_blocks, write_gguf

ROWS = 6


@pytest.mark.parametrize("qtype", list(TRANSCODED))
@pytest.mark.parametrize("rewrite", [transcode, transcode_reference], ids=["kernels", "numpy"])
def test_rewritten_blocks_dequantize_to_the_originals_floats(qtype, rewrite):
    raw = random_blocks((ROWS, 768), qtype)
    blocks, target = rewrite(raw, qtype)
    assert target == TRANSCODED[qtype] and blocks.dtype == np.uint8 and blocks.shape[0] == ROWS
    original = dequantize(raw, qtype)
    rewritten = dequantize(blocks, target)
    assert rewritten.shape == original.shape
    if qtype in (T.Q3_K, T.IQ4_NL):
        np.testing.assert_array_equal(rewritten, original)
    elif qtype == T.IQ4_XS:  # each group's scale rounded to float16
        np.testing.assert_allclose(rewritten, original, rtol=2.0**-11, atol=0)
    else:  # Q2_K quantized again: half a step (each 32 weights' largest / 127), and the step's
        # rounding to float16 times the largest code (127 * 2^-11 of a step)
        step = np.abs(original.reshape(-1, 32)).max(axis=1, keepdims=True) / 127
        assert (np.abs(rewritten - original).reshape(-1, 32) <= 0.57 * step).all()


@pytest.mark.skipif(cpu_kernels() is None, reason="the C++ kernels are not built here")
@pytest.mark.parametrize("qtype", [T.Q3_K, T.IQ4_NL, T.IQ4_XS])
def test_the_kernels_rewrite_as_numpy_does(qtype):
    """The C++ rewrite (the threads' share of blocks) equals numpy's bit for bit; rows taken from
    a wider array (a stride) as the file's map gives them."""
    wide = random_blocks((ROWS, 2048), qtype, seed=5)
    raw = wide[:, : wide.shape[1] // 2]
    np.testing.assert_array_equal(transcode(raw, qtype)[0], transcode_reference(raw, qtype)[0])


@pytest.mark.parametrize("qtype", list(TRANSCODED))
def test_a_file_of_them_runs_as_its_float_path(tmp_path, qtype):
    """A Llama whose 2-D weights are random qtype blocks (256 inputs, as the 256-weight blocks
    need): quantized kernels against the float path (gguf-py's dequantization of the file's
    blocks, Q2_K's before its requantization)."""
    model = build("llama3", hidden_size=256, intermediate_size=256, head_dim=64)
    path = write_gguf(model, "llama3", tmp_path / "m.gguf", random_type=qtype)
    options = dict(max_model_len=64, kv_cache_memory="8MiB", kv_cache_dtype="float32")
    prompt = list(range(20, 60))
    ours = LLM(str(path), **options).engine.prompt_logits(prompt)
    reference = LLM(str(path), quantization="none", **options).engine.prompt_logits(prompt)
    assert (ours.argmax(-1) == reference.argmax(-1)).float().mean() >= 0.97
    torch.testing.assert_close(ours, reference, rtol=0.02, atol=0.02 * reference.abs().max().item())
