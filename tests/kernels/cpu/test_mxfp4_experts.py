"""gpt-oss's MXFP4 experts (GGML type 39) end to end: a tiny gpt-oss GGUF written as llama.cpp's
MXFP4_MOE files are (tests/gguf_writer.py: its expert stacks MXFP4, the other matrices Q8_0) loads
each expert in the file's blocks, read from its memory map by the C++ kernels, or (rows shorter than
GROUP_BLOCKS_MIN_INPUTS, a small model's) repacked as u8; either way its logits and greedy tokens
follow our float32 path on gguf-py's dequantization of the same file (--quantization none), and the
file's values are gguf-py's quantization of the model's own weights."""

from __future__ import annotations

import pytest
import torch

from localchat import LLM
from localchat.engine.loading import gguf_repack
from localchat.kernels import quant_linear
from localchat.kernels.cpu_extension import cpu_kernels
from localchat.kernels.packed_weight import PackedWeight
from tests.gguf_writer import VOCAB, build, quantized_reference, write_gguf
from tests.kernels.cpu.test_file_blocks import _mapped_file
from tests.logits_reference import assert_follows, random_prompts

OPTIONS = dict(max_model_len=256, kv_cache_memory="16MiB")


@pytest.fixture(scope="module")
def gpt_oss(tmp_path_factory):
    """(transformers model, its MXFP4_MOE file)."""
    model = build("gpt-oss")
    path = tmp_path_factory.mktemp("gpt-oss") / "gpt-oss-mxfp4.gguf"
    return model, write_gguf(model, "gpt-oss", path, "mxfp4")


def _expert_parts(llm: LLM) -> list[PackedWeight]:
    experts = [e for layer in llm.engine.runner.model.layers for e in layer.mlp.experts]
    weights = [w for e in experts for w in (e.gate_up_weight, e.down_weight)]
    return [p for w in weights for p in (w if isinstance(w, tuple) else (w,))]


@pytest.mark.parametrize("in_blocks", [True, False], ids=["blocks", "repacked"])
def test_mxfp4_experts_follow_the_float_path(gpt_oss, in_blocks, monkeypatch, gemm_env):
    model, path = gpt_oss
    gemm_env(INT8_ACTIVATIONS="0")  # two codes: the float path's
    # each expert's gate and up stay two weights (a small model's are copied into one)
    monkeypatch.setattr(quant_linear, "FUSE_MAX_BYTES", 0)
    if in_blocks:  # the tiny model's rows (64 and 32 inputs) in their blocks, as a real model's
        monkeypatch.setattr(gguf_repack, "GROUP_BLOCKS_MIN_INPUTS", 0)
    llm = LLM(str(path), **OPTIONS)
    parts = _expert_parts(llm)
    assert len(parts) == 3 * 8 * 3 and {p.source_type for p in parts} == {"MXFP4"}
    ext = cpu_kernels()
    if ext is not None:  # (without the C++ kernels: the torch repack, u8)
        assert {p.layout for p in parts} == {"mxfp4" if in_blocks else "u8"}
        if in_blocks:
            assert all(_mapped_file(p.qweight.data_ptr()) == str(path) for p in parts)
    reference = LLM(str(path), quantization="none", **OPTIONS)
    assert not any(isinstance(p, PackedWeight) for p in _expert_parts(reference))
    prompts = random_prompts(2, 40, vocab=VOCAB, seed=0)  # past the 24-token window
    assert_follows(llm, reference.engine.prompt_logits, prompts, rtol=2e-3)
    # the float path reads the file as transformers reads gguf-py's round trip of the weights
    with torch.no_grad():
        expected = quantized_reference(model, "gpt-oss", "mxfp4")(torch.tensor([prompts[0]]))
    torch.testing.assert_close(
        reference.engine.prompt_logits(prompts[0]), expected.logits[0], rtol=1e-4, atol=1e-4
    )


def test_mxfp4_experts_run_in_the_cpu_decode_stack(tmp_path, monkeypatch):
    """A Qwen3-MoE whose experts are MXFP4 blocks: a single decode runs them inside the C++ stack
    (kernels/csrc/decode_moe.h), with the tokens and logprobs of the same model run op by op."""
    from localchat import SamplingParams
    from tests.cpu_kernels import kernels_or_skip

    kernels_or_skip()
    monkeypatch.setattr(gguf_repack, "GROUP_BLOCKS_MIN_INPUTS", 0)
    model = build("qwen3-moe")
    path = write_gguf(model, "qwen3-moe", tmp_path / "qwen3-moe-mxfp4.gguf", "mxfp4")
    llm = LLM(str(path), **OPTIONS)
    assert {p.layout for p in _expert_parts(llm)} == {"mxfp4"}
    runner_model = llm.engine.runner.model
    assert runner_model.cpu_decode is not None
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, logprobs=0)
    prompt = random_prompts(1, 37, vocab=VOCAB, seed=3)[0]

    def decode():
        out = llm.generate([prompt], params)[0].outputs[0]
        return out.token_ids, [entry.logprob for entry in out.logprobs]

    tokens, logprobs = decode()
    runner_model.cpu_decode = None
    reference_tokens, reference_logprobs = decode()
    assert tokens == reference_tokens
    # the router's float32 dot products sum in another order than torch's: logits differ by ulps
    torch.testing.assert_close(logprobs, reference_logprobs, rtol=0, atol=2e-4)
