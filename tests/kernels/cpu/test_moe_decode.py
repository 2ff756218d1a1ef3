"""The C++ decode stack with mixture-of-experts layers (Qwen3-MoE, Mixtral): a single decode runs
the router, the top-k choice and the chosen experts' quantized projections inside the stack, and
gives the tokens and logprobs of the same model run op by op (the Python MoE block)."""

from __future__ import annotations

import pytest
import torch

from localchat import LLM, SamplingParams
from localchat.engine.modeling.cpu_decode import supports
from localchat.engine.modeling.registry import spec_from_config
from tests.family_models import VOCAB, build, save
from tests.kernels.cpu.stack_batches import run_both

pytestmark = pytest.mark.usefixtures("each_isa")
GENERIC_KERNELS = True  # the generic build too (conftest.py)


def _decode(llm: LLM, prompt: list[int]):
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, logprobs=0)
    out = llm.generate([prompt], params)[0].outputs[0]
    return out.token_ids, [entry.logprob for entry in out.logprobs]


@pytest.mark.parametrize(
    "family,quantization", [("qwen3-moe", "int8"), ("qwen3-moe", "int4"), ("mixtral", "int8")]
)
def test_moe_layers_run_in_the_stack_as_op_by_op(family, quantization, tmp_path):
    save(family, tmp_path)
    llm = LLM(str(tmp_path), max_model_len=256, kv_cache_memory="16MiB", quantization=quantization)
    model = llm.engine.runner.model
    assert model.cpu_decode is not None  # the experts are quantized: the stack takes the layers
    generator = torch.Generator().manual_seed(7)
    prompt = torch.randint(3, VOCAB, (37,), generator=generator).tolist()
    calls = []
    forward = model.cpu_decode.forward
    model.cpu_decode.forward = lambda *args: calls.append(1) or forward(*args)
    tokens, logprobs = _decode(llm, prompt)
    assert len(calls) == 23  # every decode after the prompt's
    model.cpu_decode = None
    reference_tokens, reference_logprobs = _decode(llm, prompt)
    assert tokens == reference_tokens
    # the router's float32 dot products sum in another order than torch's: logits differ by ulps
    torch.testing.assert_close(logprobs, reference_logprobs, rtol=0, atol=2e-4)


@pytest.mark.parametrize("family", ["qwen3-moe", "mixtral"])
def test_moe_layers_run_several_tokens_in_the_stack_as_op_by_op(family, tmp_path):
    """Decodes beside a sequence's last six tokens: each token runs through its own experts."""
    save(family, tmp_path)
    llm = LLM(str(tmp_path), max_model_len=256, kv_cache_memory="16MiB", quantization="int8")
    assert llm.engine.runner.model.cpu_decode.max_tokens == 16
    fused, ops = run_both(llm, poison=float("nan"))
    # the router's dot products sum in another order than torch's (see above)
    torch.testing.assert_close(fused.hidden, ops.hidden, rtol=0, atol=1e-3)
    # the keys and values in the pool's float16: a rounding step apart at most
    torch.testing.assert_close(fused.stored, ops.stored, rtol=2e-3, atol=1e-3)


@pytest.mark.parametrize(
    "family,runs",
    [("qwen3-moe", True), ("mixtral", True), ("qwen2-moe", False), ("olmoe", False)],
)
def test_the_stack_takes_only_the_moe_it_runs(family, runs):
    """A shared expert (Qwen2-MoE) and q/k norms over the whole projection (OLMoE) run op by op."""
    assert supports(spec_from_config(build(family).config)) is runs
