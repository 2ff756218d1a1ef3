"""The fused mixture-of-experts kernels (kernels/triton_moe.py), run by Triton's interpreter on the
CPU, against the torch reference (kernels/moe.py) and a float64 loop over every (token, slot) pair;
and SparseMoE's fused path against its expert-by-expert one."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from localchat.engine.modeling.moe import SparseMoE
from localchat.engine.modeling.spec import DecoderSpec, MoESpec
from localchat.kernels import dispatch, moe, triton_moe
from localchat.kernels.activation import act_and_mul_ref
from localchat.kernels.moe import PackedExperts, fused_moe_ref
from localchat.kernels.packed_weight import quantize_weight
from localchat.kernels.triton_moe import fused_moe_triton, moe_align_block_size
from tests.kernels.conftest import DEVICE

ON_GPU = DEVICE != "cpu"
DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if ON_GPU else [])
# against the reference, which rounds where the kernel does (the sums' order aside); float32 on a
# GPU multiplies in 3xTF32
TOL = {
    torch.float32: dict(atol=1e-4 if ON_GPU else 1e-5, rtol=1e-4),
    torch.float16: dict(atol=4e-3, rtol=4e-3),
    torch.bfloat16: dict(atol=3e-2, rtol=3e-2),
}
cpu_only = pytest.mark.skipif(ON_GPU, reason="checks the CPU dispatch and the interpreter")


def naive_moe(hidden, weights, ids, w13, w2, b13, b2, activation, limit, alpha):
    """Every (token, slot) pair on its own, in float64."""
    out = torch.zeros(hidden.shape, dtype=torch.float64)
    for t in range(hidden.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            gate_up = w13[e].double() @ hidden[t].double()
            if b13 is not None:
                gate_up += b13[e].double()
            down = w2[e].double() @ act_and_mul_ref(gate_up, activation, limit, alpha)
            if b2 is not None:
                down += b2[e].double()
            out[t] += weights[t, j].double() * down
    return out


def make_case(tokens, size, width, experts, top_k, dtype, bias=False, ids=None, seed=0):
    g = torch.Generator(device=DEVICE).manual_seed(seed)

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g, device=DEVICE) * scale).to(dtype)

    hidden = randn(tokens, size)
    w13 = randn(experts, 2 * width, size, scale=size**-0.5)
    w2 = randn(experts, size, width, scale=width**-0.5)
    b13 = randn(experts, 2 * width, scale=0.5) if bias else None
    b2 = randn(experts, size, scale=0.5) if bias else None
    if ids is None:
        logits = torch.randn(tokens, experts, generator=g, device=DEVICE)
        weights, ids = torch.topk(logits.softmax(-1), top_k, dim=-1)
    else:
        weights = torch.rand(ids.shape, generator=g, device=DEVICE)
    return hidden, weights.to(dtype), ids, w13, w2, b13, b2


def check(case, activation="silu", limit=7.0, alpha=1.702):
    hidden = case[0]
    got = fused_moe_triton(*case, activation, limit, alpha)
    assert got.dtype == hidden.dtype and got.shape == hidden.shape
    expected = fused_moe_ref(*case, activation, limit, alpha)
    torch.testing.assert_close(got, expected, **TOL[hidden.dtype])
    naive = naive_moe(*[t.cpu() if t is not None else None for t in case], activation, limit, alpha)
    scale = naive.abs().max().item()
    tol = {torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}[hidden.dtype]
    assert (got.cpu().double() - naive).abs().max().item() <= tol * max(scale, 1.0)


# (tokens, hidden, width, experts, top_k): a decode, a decode batch, a prefill chunk; H and W not
# powers of two, H a multiple of the K step or not, W ending a column tile short
SHAPES = [(1, 48, 40, 8, 2), (5, 64, 24, 16, 4), (44, 40, 36, 8, 2)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_fused_moe_matches_the_reference(shape, dtype):
    tokens, size, width, experts, top_k = shape
    check(make_case(tokens, size, width, experts, top_k, dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("activation", ["silu", "gelu_tanh", "swiglu_oai"])
def test_each_activation_with_biases(activation, dtype):
    # gpt-oss's clamp at 1.5 is reached by these activations
    check(make_case(9, 48, 40, 8, 2, dtype, bias=True, seed=1), activation, limit=1.5, alpha=1.702)


def test_128_experts_top_8():
    check(make_case(3, 32, 16, 128, 8, torch.float32, seed=2), "silu")


def test_all_tokens_on_one_expert_over_several_blocks():
    # 40 pairs of expert 3 fill three 16-row blocks and part of a fourth; expert 5 takes the rest
    ids = torch.tensor([[3, 5]] * 40, device=DEVICE)
    check(make_case(40, 48, 24, 8, 2, torch.float32, ids=ids, seed=3))


def test_top_1_and_experts_without_tokens():
    ids = torch.tensor([[6], [1], [6], [6]], device=DEVICE)  # six of eight experts idle
    check(make_case(4, 48, 40, 8, 1, torch.float32, bias=True, ids=ids, seed=4), "swiglu_oai")


def test_repeated_expert_in_one_token_and_zero_weights():
    ids = torch.tensor([[2, 2, 0], [0, 7, 2]], device=DEVICE)
    hidden, weights, ids, *rest = make_case(2, 48, 40, 8, 3, torch.float32, ids=ids, seed=5)
    weights[1, 1] = 0.0
    check((hidden, weights, ids, *rest))


def test_no_tokens():
    case = make_case(0, 48, 40, 8, 2, torch.float32)
    assert fused_moe_triton(*case).shape == (0, 48)


def test_strided_inputs_and_wrong_shapes():
    hidden, weights, ids, w13, w2, _, _ = make_case(6, 48, 40, 8, 2, torch.float32)
    wide = torch.zeros(6, 96, device=DEVICE)
    wide[:, ::2] = hidden  # a hidden whose rows are not contiguous
    torch.testing.assert_close(
        fused_moe_triton(wide[:, ::2], weights, ids, w13, w2),
        fused_moe_ref(hidden, weights, ids, w13, w2),
        **TOL[torch.float32],
    )
    with pytest.raises(ValueError, match="do not fit"):
        fused_moe_triton(hidden, weights, ids, w13, w2[:, :, :-1])
    with pytest.raises(ValueError, match="b2 must be"):
        fused_moe_triton(hidden, weights, ids, w13, w2, None, w2[:, :, 0].T)
    with pytest.raises(ValueError, match="share a float16"):
        fused_moe_triton(hidden, weights, ids, w13.half(), w2)


def packed(dense: torch.Tensor, bits: int, group: int = 32, zero_point: int | None = None):
    """Experts quantized group-wise (asymmetric; symmetric around zero_point where given)."""
    weights = [quantize_weight(w, bits, group) for w in dense.float()]
    if zero_point is not None:
        weights = [dataclasses.replace(w, mins=None, zero_point=zero_point) for w in weights]
    stacked = PackedExperts.stack(weights)
    assert stacked is not None
    return stacked


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("w13_form", "w2_form", "shape", "bias"),
    [
        ((4, 32, None), (4, 32, None), (9, 64, 32, 8, 2), False),  # int4: u4 with mins
        ((8, 16, None), (8, 16, None), (7, 48, 48, 8, 2), True),  # u8, groups of 16, K tails
        ((4, 32, 8), (8, 32, 128), (5, 64, 32, 16, 4), False),  # Q4_0-like and Q8_0-like
    ],
    ids=["u4", "u8-group16-bias", "symmetric"],
)
def test_quantized_experts(w13_form, w2_form, shape, bias, dtype):
    tokens, size, width, experts, top_k = shape
    hidden, weights, ids, w13, w2, b13, b2 = make_case(
        tokens, size, width, experts, top_k, dtype, bias=bias, seed=8
    )
    q13, q2 = packed(w13, *w13_form), packed(w2, *w2_form)
    assert q13.shape == tuple(w13.shape) and q2.shape == tuple(w2.shape)
    got = fused_moe_triton(hidden, weights, ids, q13, q2, b13, b2, "silu")
    expected = fused_moe_ref(hidden, weights, ids, q13, q2, b13, b2, "silu")
    torch.testing.assert_close(got, expected, **TOL[dtype])
    dense = (q13.dequantize(torch.float32), q2.dequantize(torch.float32))
    naive = naive_moe(hidden.cpu(), weights.cpu(), ids.cpu(), *[w.cpu() for w in dense],
                      None if b13 is None else b13.cpu(), None if b2 is None else b2.cpu(),
                      "silu", 7.0, 1.702)  # fmt: skip
    tol = {torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}[dtype]
    assert (got.cpu().double() - naive).abs().max().item() <= tol * max(naive.abs().max(), 1.0)


@pytest.mark.parametrize("block_m", [16, 64])
def test_align_groups_every_pair_once_in_its_experts_blocks(block_m):
    g = torch.Generator(device=DEVICE).manual_seed(6)
    ids = torch.randint(0, 12, (37, 3), generator=g, device=DEVICE)
    sorted_pairs, block_experts, num_padded = moe_align_block_size(ids, 12, block_m)
    flat = ids.reshape(-1).cpu()
    pairs = flat.numel()
    used = int(num_padded.item())
    assert used % block_m == 0 and sorted_pairs.numel() >= used
    assert sorted_pairs.numel() == block_experts.numel() * block_m
    rows = sorted_pairs.cpu()[:used].view(-1, block_m)
    assert (sorted_pairs.cpu()[used:] == pairs).all()  # the rest is padding
    real = rows[rows < pairs]
    assert sorted(real.tolist()) == list(range(pairs))  # every pair exactly once
    for block, expert in zip(rows, block_experts.cpu()[: used // block_m], strict=True):
        inside = block[block < pairs]
        assert inside.numel() and (flat[inside] == expert).all()
        assert (inside.diff() > 0).all()  # in token order
    counts = torch.bincount(flat, minlength=12)
    assert used == int(((counts + block_m - 1) // block_m * block_m).sum())


def _spec(
    activation="silu", bias=False, shared=0, routing="softmax_topk", size=48, width=24
) -> DecoderSpec:
    moe_spec = MoESpec(
        num_experts=8,
        top_k=2,
        intermediate_size=width,
        routing=routing,
        normalize_topk=True,
        router_bias=bias,
        expert_bias=bias,
        shared_expert_size=shared,
        shared_expert_gate=bool(shared),
    )
    return DecoderSpec(
        256, size, 64, 1, 4, 2, 12, 1e-6, False, activation=activation, swiglu_limit=1.5,
        moe=moe_spec,
    )  # fmt: skip


def _random_moe(spec: DecoderSpec) -> SparseMoE:
    torch.manual_seed(7)
    module = SparseMoE(spec).to(DEVICE)
    with torch.no_grad():
        for param in module.parameters():
            param.normal_(0.0, 0.3)
    return module.requires_grad_(False)


@pytest.mark.parametrize(
    "spec",
    [
        _spec(),  # Qwen3-MoE, Mixtral
        _spec(shared=32),  # Qwen2-MoE
        _spec("swiglu_oai", bias=True, routing="topk_softmax"),  # gpt-oss
    ],
    ids=["plain", "shared-expert", "gpt-oss"],
)
def test_sparse_moe_fused_path_equals_expert_by_expert(spec, monkeypatch):
    module = _random_moe(spec)
    hidden = torch.randn(11, 48, device=DEVICE)
    monkeypatch.setattr("localchat.engine.modeling.moe.use_triton", lambda t: False)
    expected = module(hidden)
    assert module.stacked is None
    calls = []
    kernel = triton_moe.fused_moe_triton
    monkeypatch.setattr(triton_moe, "fused_moe_triton", lambda *a: calls.append(1) or kernel(*a))
    monkeypatch.setattr("localchat.engine.modeling.moe.use_triton", lambda t: True)
    monkeypatch.setattr("localchat.kernels.moe.use_triton", lambda t: True)
    got = module(hidden)
    assert calls == [1]
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    # each expert's parameters are views into the stacks, not copies
    assert module.stacked is not None
    w13, w2, b13, b2 = module.stacked
    assert (b13 is None) == (b2 is None) == (not spec.moe.expert_bias)
    for i, expert in enumerate(module.experts):
        assert expert.gate_up_weight.data_ptr() == w13[i].data_ptr()
        assert expert.down_weight.data_ptr() == w2[i].data_ptr()
        if b13 is not None:
            assert expert.gate_up_bias.data_ptr() == b13[i].data_ptr()
    stacked = module.stacked
    torch.testing.assert_close(module(hidden), got, atol=0, rtol=0)
    assert module.stacked is stacked  # stacked once


@pytest.mark.parametrize("bits", [4, 8])
def test_sparse_moe_stacks_quantized_experts(bits, monkeypatch):
    module = _random_moe(_spec(size=64, width=32))  # whole groups of 32 inputs
    for expert in module.experts:
        for name in ("gate_up_weight", "down_weight"):
            weight = expert._parameters.pop(name)
            setattr(expert, name, quantize_weight(weight, bits))
    hidden = torch.randn(5, 64, device=DEVICE)
    # each expert through kernels/quant_linear.py's torch reference (not the CPU's kernels, which
    # round the activations to int8 codes)
    monkeypatch.setattr("localchat.kernels.quant_linear.cpu_kernels", lambda *a: None)
    module._cpu_experts = False  # nor the CPU's grouped experts (kernels/csrc/moe_prefill.h)
    monkeypatch.setattr("localchat.engine.modeling.moe.use_triton", lambda t: False)
    expected = module(hidden)
    monkeypatch.setattr("localchat.engine.modeling.moe.use_triton", lambda t: True)
    monkeypatch.setattr("localchat.kernels.moe.use_triton", lambda t: True)
    got = module(hidden)
    torch.testing.assert_close(got, expected, **TOL[torch.float32])
    assert module.stacked is not None
    w13 = module.stacked[0]
    assert isinstance(w13, PackedExperts) and w13.layout == f"u{bits}"
    assert module.experts[3].gate_up_weight.qweight.data_ptr() == w13.qweight[3].data_ptr()


def test_experts_quantized_in_several_forms_run_one_by_one(monkeypatch):
    module = _random_moe(_spec(size=64, width=32))
    for i, expert in enumerate(module.experts):
        weight = expert._parameters.pop("gate_up_weight")
        expert.gate_up_weight = quantize_weight(weight, 4 if i else 8)
    hidden = torch.randn(5, 64, device=DEVICE)
    monkeypatch.setattr("localchat.kernels.quant_linear.cpu_kernels", lambda *a: None)
    monkeypatch.setattr("localchat.engine.modeling.moe.use_triton", lambda t: False)
    expected = module(hidden)
    monkeypatch.setattr("localchat.engine.modeling.moe.use_triton", lambda t: True)
    torch.testing.assert_close(module(hidden), expected, atol=0, rtol=0)
    assert module.stacked is None and module._unstackable
    assert isinstance(module.experts[0].down_weight, torch.nn.Parameter)  # left as it was


@cpu_only
def test_cpu_tensors_take_the_reference(monkeypatch):
    monkeypatch.delenv("LOCALCHAT_TRITON_ON_CPU", raising=False)
    dispatch._triton_on_cpu.cache_clear()
    try:

        def forbidden(*args):
            raise AssertionError("a CPU tensor was dispatched to the Triton MoE")

        monkeypatch.setattr(triton_moe, "fused_moe_triton", forbidden)
        case = make_case(3, 48, 40, 8, 2, torch.float32)
        torch.testing.assert_close(moe.fused_moe(*case), fused_moe_ref(*case))
    finally:
        dispatch._triton_on_cpu.cache_clear()


@cpu_only
def test_an_int8_moe_model_on_the_triton_kernels_gives_the_references_tokens(tmp_path, monkeypatch):
    """The whole engine on a tiny Qwen3-MoE quantized to int8: every kernel on Triton (the
    interpreter), the experts stacked at load for the fused MoE (W8A16), against the CPU's
    path."""
    from localchat import LLM, SamplingParams
    from tests.family_models import save

    save("qwen3-moe", tmp_path)
    prompts = [list(range(3, 20)), [7, 8, 9]]
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)

    def run():
        llm = LLM(str(tmp_path), max_model_len=32, kv_cache_memory="1MiB", quantization="int8")
        model = llm.engine.runner.model
        stacked_at_load = [layer.mlp.stacked for layer in model.layers]
        tokens = [out.token_ids for out in llm.generate(prompts, params)]
        return tokens, llm.engine.prompt_logits(prompts[0]), stacked_at_load

    expected, expected_logits, stacked = run()
    assert stacked == [None, None]
    monkeypatch.setenv("LOCALCHAT_TRITON_ON_CPU", "1")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    dispatch._triton_on_cpu.cache_clear()
    try:
        tokens, logits, stacked = run()
    finally:
        dispatch._triton_on_cpu.cache_clear()
    # stacked when the model loaded (before any forward pass)
    assert all(s is not None and isinstance(s[0], PackedExperts) for s in stacked)
    assert tokens == expected
    # the CPU's int8 kernels round the activations to int8 codes (two per value here)
    torch.testing.assert_close(logits, expected_logits, rtol=2e-3, atol=2e-3)
