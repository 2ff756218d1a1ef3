"""The C++ decode stack on several tokens in one call (kernels/csrc/decode_layer.h): single decodes
beside a sequence's last six tokens on a context of three blocks (speculative decoding's
verification) and a new three-token prompt. The stack's hidden states, and the keys and values it
stores, must be the op-by-op path's from the same pool, on every build of the kernels."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from localchat import LLM
from localchat.kernels.kv_quant import is_q8_0
from tests.kernels.cpu.stack_batches import MIXED, random_llm, run_both, run_singly, slots_view

# native, AVX2 and generic kernels (conftest.py)
pytestmark = pytest.mark.usefixtures("each_isa")
GENERIC_KERNELS = True
# contexts of one to five ranges of keys (decode_layer.h's key_splits): a decode, a verification of
# four tokens and the start of a prompt
LONG = ((300, 1), (130, 4), (0, 7))

# (shape, KV pool dtype): a GGUF file's pool is float16 unless asked otherwise
CASES = [
    ("llama-q4_k_m", "auto"),
    ("llama-q4_k_m", "float32"),
    ("llama-q4_k_m", "q8_0"),  # int8 codes and a scale per 32 values (kernels/kv_quant.py)
    ("qwen3-q4_k_m", "auto"),
]


@pytest.fixture(scope="module", params=CASES, ids=lambda case: "-".join(case))
def tiny_llm(request, tmp_path_factory):
    return random_llm(tmp_path_factory.mktemp("rows"), *request.param)


def _assert_same_pass(llm: LLM, fused, ops) -> None:
    # activations are rounded to int8 codes, so a float-rounding difference (the norms sum in
    # another order) can move a code by one step: about 1e-3 after the layers, where a token that
    # attends to a wrong key or position is off by tenths. A q8_0 pool's codes move too, a step
    # being max |x| / 127 of a block: up to about 1e-2.
    q8_0 = is_q8_0(llm.engine.runner.kv_cache)
    torch.testing.assert_close(fused.hidden, ops.hidden, rtol=0, atol=3e-2 if q8_0 else 5e-3)
    # each token's greedy choice and its logprob, to test_decode_layer.py's bound (q8_0: its codes'
    # step, on this random model's flat distributions)
    model = llm.engine.runner.model
    logprobs = model.compute_logits(fused.hidden).log_softmax(-1)
    reference = model.compute_logits(ops.hidden).log_softmax(-1)
    chosen = reference.argmax(-1, keepdim=True)
    assert torch.equal(logprobs.argmax(-1, keepdim=True), chosen)
    error = (logprobs.gather(1, chosen) - reference.gather(1, chosen)).abs().max().item()
    assert error < (2e-2 if q8_0 else 5e-3)
    # each layer's stored keys and values: within one step of the pool's rounding (float16: 0.008
    # at 8-16; q8_0: a code, max |x| / 127 of a block)
    step = ops.stored.abs().max().item() / 127 if q8_0 else 1e-2
    torch.testing.assert_close(fused.stored, ops.stored, rtol=0, atol=step)


def test_several_sequences_and_a_verification_run_as_op_by_op(tiny_llm):
    fused, ops = run_both(tiny_llm)
    assert fused.hidden.shape[0] == sum(new for _, new in MIXED)
    _assert_same_pass(tiny_llm, fused, ops)
    # nothing but the new tokens' slots is written (both passes leave the rest of the pool alone)
    changed = (slots_view(fused.pool) != slots_view(ops.pool)).any(dim=(0, 1, 3, 4))
    changed[fused.slots] = False
    assert not changed.any()


def test_every_token_stores_its_key_before_any_token_attends(tiny_llm):
    """The verification's tokens attend to the tokens before them in the same pass: their keys
    must be in the pool before attention reads it. The new tokens' slots hold NaN before the
    stack's pass; a key read before it was stored would make every later state NaN."""
    fused, ops = run_both(tiny_llm, poison=float("nan"))
    assert torch.isfinite(fused.hidden).all() and torch.isfinite(fused.stored).all()
    _assert_same_pass(tiny_llm, fused, ops)


def test_a_token_gets_what_it_gets_alone(tiny_llm):
    """Each token's result does not depend on the pass it is in: the panel kernel gives each
    activation row the GEMV's result, and a token's keys are split between the threads as one
    token's are. So the batch equals its tokens run one at a time, bit for bit, and speculative
    decoding's verification equals the decodes it stands for."""
    fused, _ = run_both(tiny_llm)
    single = run_singly(tiny_llm)
    assert torch.equal(fused.hidden, single.hidden)
    assert torch.equal(fused.stored, single.stored)


def test_a_pass_is_the_same_whatever_the_thread_count(tiny_llm, each_isa):
    """A token's keys are attended in ranges that its length alone decides, merged in order: its
    hidden state does not depend on how many threads run the pass (a server at --threads 1 scores
    a prompt as an offline LLM on every core does)."""
    if each_isa != "native":
        pytest.skip("the ranges and their merge are one code on every build")
    threads = torch.get_num_threads()
    outcomes = []
    try:
        for count in (1, 2, 3):
            torch.set_num_threads(count)
            outcomes.append(run_both(tiny_llm, LONG)[0])
    finally:
        torch.set_num_threads(threads)
    for other in outcomes[1:]:
        assert torch.equal(other.hidden, outcomes[0].hidden)
        assert torch.equal(other.stored, outcomes[0].stored)


@pytest.mark.parametrize("shape", [((0, 32),), tuple((4 + i, 1) for i in range(32))])
def test_the_most_tokens_a_call_takes(tiny_llm, shape, each_isa, request):
    """A prompt of max_tokens tokens, and a batch of max_tokens decodes (contexts of one to three
    blocks)."""
    if each_isa != "native" and request.node.callspec.params["tiny_llm"][1] != "auto":
        pytest.skip("the other builds run the pool types in the tests above")
    fused, ops = run_both(tiny_llm, shape, poison=float("nan"))
    _assert_same_pass(tiny_llm, fused, ops)


def test_the_stack_takes_batches_up_to_its_limit(tiny_llm):
    stack = tiny_llm.engine.runner.model.cpu_decode
    assert stack.max_tokens == 32
    step = SimpleNamespace(images=None)
    assert stack.applies(torch.zeros(32, dtype=torch.long), step)
    assert not stack.applies(torch.zeros(33, dtype=torch.long), step)
    with pytest.raises(RuntimeError, match="max_rows"):
        stack.stack.forward(torch.zeros(33, 256), *[torch.empty(0)] * 6)
