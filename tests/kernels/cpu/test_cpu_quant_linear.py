"""The C++ CPU kernel (AVX-512 VNNI or AVX2, whichever this CPU has, and its portable twin) against
torch references."""

from __future__ import annotations

import pytest
import torch

from localchat.kernels.packed_weight import (
    PackedWeight,
    pack_k_params,
    pack_u4,
    pack_u6,
    quantize_weight,
)
from localchat.kernels.quant_linear import (
    fuse,
    interleave_for_kernel,
    quant_linear,
    quant_linear_reference,
)

pytestmark = pytest.mark.usefixtures("each_isa")  # each build of the kernels (conftest.py)
GENERIC_KERNELS = True  # the generic build too (conftest.py)


def int8_activation_reference(x: torch.Tensor, weight: PackedWeight, bias=None) -> torch.Tensor:
    """What the one-level kernel computes: x rounded to int8 per 32 values (scale amax / 127),
    exactly."""
    blocks = x.float().reshape(x.shape[0], -1, 32)
    scale = blocks.abs().amax(dim=-1, keepdim=True) / 127
    codes = torch.where(scale > 0, blocks / torch.where(scale > 0, scale, 1), 0).round()
    return quant_linear_reference((codes * scale).reshape(x.shape), weight, bias)


def rounding_bound(x: torch.Tensor, weight: PackedWeight, step: float) -> torch.Tensor:
    """|W| @ e: the most that rounding each activation to `step` x (its 32-block's amax / 127) can
    move y."""
    blocks = x.float().abs().reshape(x.shape[0], -1, 32)
    error = (blocks.amax(dim=-1, keepdim=True) / 127 * step).expand_as(blocks).reshape(x.shape)
    return error @ weight.dequantize().abs().T


def symmetric_u8(rows: int, cols: int, group: int, zero_point: int, seed: int = 0) -> PackedWeight:
    generator = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 2 * zero_point, (rows, cols), dtype=torch.uint8, generator=generator)
    scales = (torch.rand(rows, cols // group, generator=generator) * 0.01).half()
    return PackedWeight("u8", codes, scales, None, group, zero_point=zero_point)


def as_u6(w: PackedWeight) -> PackedWeight:
    """A Q6_K-like u8 weight (group 16, codes 0..63) in the u6 layout."""
    return PackedWeight("u6", pack_u6(w.qweight), w.scales, None, 16, zero_point=w.zero_point)


def k_quant(layout: str, rows: int, cols: int, seed: int = 2) -> PackedWeight:
    """A Q4_K-like (u4) or Q5_K-like (u8) weight: 6-bit sub-scales and mins, (d, dmin) per 256."""
    generator = torch.Generator().manual_seed(seed)
    groups = cols // 32
    top = 16 if layout == "u4" else 32
    codes = torch.randint(0, top, (rows, cols), dtype=torch.uint8, generator=generator)
    qweight = pack_u4(codes) if layout == "u4" else codes
    sub = torch.randint(0, 64, (rows, groups), dtype=torch.uint8, generator=generator)
    sub_mins = torch.randint(0, 64, (rows, groups), dtype=torch.uint8, generator=generator)
    supers = (torch.rand(rows, groups // 4, generator=generator) * 1e-3 + 1e-5).half()
    scales, mins = pack_k_params(sub, sub_mins)
    return PackedWeight(layout, qweight, scales, mins, 32, super_scales=supers)


def weights(rows: int, cols: int):
    dense = torch.randn(rows, cols, generator=torch.Generator().manual_seed(1)) * 0.02
    k_quants = {}
    if cols % 256 == 0:  # K-quant rows are whole super-blocks
        k_quants = {"u4-kquant": k_quant("u4", rows, cols), "u8-kquant": k_quant("u8", rows, cols)}
    if cols % 128 == 0:  # u6 rows are whole 128-weight chunks
        k_quants["u6-g16-sym"] = as_u6(symmetric_u8(rows, cols, 16, 32, seed=4))
    return k_quants | {
        "u4-asym": quantize_weight(dense, 4),
        "u8-asym": quantize_weight(dense, 8),
        "u4-sym": PackedWeight(
            "u4",
            quantize_weight(dense, 4).qweight,
            quantize_weight(dense, 4).scales,
            None,
            32,
            zero_point=8,
        ),
        "u8-g16-sym": symmetric_u8(rows, cols, 16, 32),
        "u8-g32-sym": symmetric_u8(rows, cols, 32, 128),
    }


def run(ext, x, w: PackedWeight, bias=None, *, precise: bool, vnni: bool = True):
    return ext.quant_linear(
        x,
        w.qweight,
        w.scales,
        w.mins,
        w.super_scales,
        bias,
        w.bits,
        w.group_size,
        w.zero_point,
        precise,
        False,
        vnni,
        w.arrangement,
    )


@pytest.mark.parametrize("shape", [(37, 96), (40, 576), (16, 160), (5, 32), (12, 768), (9, 512)])
@pytest.mark.parametrize("rows", [1, 3, 4, 9])
def test_kernel_matches_references(ext, shape, rows):
    out_features, in_features = shape
    x = torch.randn(rows, in_features, generator=torch.Generator().manual_seed(rows))
    x[0, 3] = 25.0  # an outlier, as real activations have
    bias = torch.randn(out_features)
    for name, w in weights(out_features, in_features).items():
        exact = quant_linear_reference(x, w, bias)
        scale = exact.abs().max().item()
        one_level = int8_activation_reference(x, w, bias)
        for vnni in (True, False):
            got = run(ext, x, w, bias, precise=False, vnni=vnni)
            torch.testing.assert_close(
                got, one_level, rtol=0, atol=2e-5 * scale, msg=f"{name} int8 vnni={vnni}"
            )
            precise = run(ext, x, w, bias, precise=True, vnni=vnni)
            # two int8 levels: each activation within 1/512 of a step of 1/127 of its block's amax
            bound = rounding_bound(x, w, 1 / 512) * 1.01 + 1e-6 * scale
            assert ((precise - exact).abs() <= bound).all(), f"{name} precise vnni={vnni}"
        # int8 activations are measurably coarser than two levels: the precise path is not the same
        # code
        assert (got - exact).abs().max() > 10 * (precise - exact).abs().max()


def test_vnni_and_portable_paths_are_exact_on_representable_values(ext):
    """Activations whose blocks peak at 127 quantize to themselves, and power-of-two scales multiply
    exactly: both paths must then give the float64 result exactly (a lane or group mix-up cannot
    hide)."""
    generator = torch.Generator().manual_seed(3)
    w = symmetric_u8(64, 256, 16, 32)
    w = PackedWeight(
        "u8",
        w.qweight,
        torch.exp2(-torch.randint(4, 9, w.scales.shape, generator=generator)).half(),
        None,
        16,
        zero_point=32,
    )
    x = torch.randint(-127, 128, (5, 256), generator=generator).float()
    x[:, ::32] = 127.0
    expected = (x.double() @ w.dequantize().double().T).float()
    for weight in (w, as_u6(w)):
        for rows in (1, 5):  # the GEMV and the panel kernel
            for precise in (False, True):
                for vnni in (True, False):
                    got = run(ext, x[:rows], weight, precise=precise, vnni=vnni)
                    assert torch.equal(got, expected[:rows]), (weight.layout, precise, vnni)


def test_dispatch_fuses_and_splits(ext):
    dense = torch.randn(48, 128) * 0.02
    q4, q8 = quantize_weight(dense[:32], 4), symmetric_u8(16, 128, 16, 32)
    mixed = fuse([q4, q8])
    assert isinstance(mixed, tuple)  # u4 next to u8 (Q4_K q/k with a Q6_K v) stays two weights
    same = fuse([q4, quantize_weight(dense[32:], 4)])
    assert isinstance(same, PackedWeight) and same.shape == (48, 128)
    x = torch.randn(2, 3, 128)
    expected = torch.cat(
        [
            quant_linear_reference(x.reshape(6, 128), q4),
            quant_linear_reference(x.reshape(6, 128), q8),
        ],
        dim=-1,
    ).reshape(2, 3, 48)
    torch.testing.assert_close(
        quant_linear(x, mixed), expected, rtol=0, atol=1e-4 * expected.abs().max().item()
    )
    symmetric = PackedWeight("u4", q4.qweight, q4.scales, None, 32, zero_point=8)
    fused = fuse(
        [symmetric, q4]
    )  # a symmetric part next to an asymmetric one: its mins are made explicit
    assert isinstance(fused, PackedWeight) and fused.mins is not None
    torch.testing.assert_close(
        fused.dequantize(), torch.cat([symmetric.dequantize(), q4.dequantize()])
    )
    a, b = k_quant("u4", 8, 256, seed=1), k_quant("u4", 4, 256, seed=2)
    stacked = fuse([a, b])  # K-quant parts keep their sub-scales and (d, dmin) pairs
    assert isinstance(stacked, PackedWeight) and stacked.super_scales is not None
    assert torch.equal(stacked.dequantize(), torch.cat([a.dequantize(), b.dequantize()]))


def test_large_parts_are_not_stacked(monkeypatch):
    from localchat.kernels import quant_linear as module

    a, b = quantize_weight(torch.randn(32, 128), 4), quantize_weight(torch.randn(32, 128), 4)
    monkeypatch.setattr(module, "FUSE_MAX_BYTES", a.nbytes + b.nbytes - 1)
    assert fuse([a, b]) == (a, b)  # too large together: no copy, one kernel call each
    assert fuse([a]) is a  # a single part (an embedding, an LM head) is never wrapped


def test_every_row_is_computed_the_same_whatever_the_batch(ext):
    """A decode, a batch and a prefill chunk (more rows than one panel holds) give each row the same
    bits: cached and uncached prompts then see the same logits."""
    generator = torch.Generator().manual_seed(5)
    for name, w in [*weights(52, 320).items(), *weights(52, 768).items()]:
        x = torch.randn(70, w.in_features, generator=generator)
        every = run(ext, x, w, precise=True)
        exact = quant_linear_reference(x, w)
        bound = rounding_bound(x, w, 1 / 512) * 1.01 + 1e-6 * exact.abs().max()
        assert ((every - exact).abs() <= bound).all(), name
        for rows in (1, 2, 7, 33):
            assert torch.equal(run(ext, x[:rows], w, precise=True), every[:rows]), (name, rows)
        assert torch.equal(run(ext, x[40:41], w, precise=True), every[40:41]), name


def test_the_bfloat16_gemm_from_its_row_count_on(ext, monkeypatch, gemm_env):
    """From LOCALCHAT_BF16_GEMM_MIN_ROWS rows on, bands of restored bfloat16 weight rows feed
    oneDNN GEMMs: every layout, either row order, the fused SiLU input and a bias, within
    bfloat16's rounding."""
    from localchat.kernels import quant_linear as module

    gemm_env(BF16_GEMM_MIN_ROWS="32")
    monkeypatch.setattr(module, "BF16_GEMM_MIN_FEATURES", 256)
    for name, w in weights(40, 256).items():
        for weight in (w, interleave_for_kernel(w)):
            gate_up = torch.randn(35, 512)
            bias = torch.randn(40)
            expected = quant_linear_reference(
                torch.nn.functional.silu(gate_up[:, :256]) * gate_up[:, 256:], weight, bias
            )
            got = quant_linear(gate_up, weight, bias, silu_and_mul=True)
            scale = expected.abs().max().item()
            torch.testing.assert_close(got, expected, rtol=0, atol=2e-2 * scale, msg=name)
            assert (got - expected).abs().mean() < 2e-3 * scale, name
            small = gate_up[:2]  # the integer kernel below the threshold
            torch.testing.assert_close(
                quant_linear(small, weight, bias, silu_and_mul=True),
                expected[:2],
                rtol=0,
                atol=1e-3 * scale,
            )


def test_the_bfloat16_gemm_restores_exactly_the_reference_weights_rounded(
    ext, monkeypatch, gemm_env
):
    """The weights the bfloat16 GEMM multiplies are PackedWeight.dequantize's values rounded to
    bfloat16, bit for bit: one-hot activation rows read them back, for every layout, both row
    orders and a short last block of rows."""
    from localchat.kernels import quant_linear as module
    from tests.kernels.cpu.test_interleaved_weights import copy

    gemm_env(BF16_GEMM_MIN_ROWS="32")
    monkeypatch.setattr(module, "BF16_GEMM_MIN_FEATURES", 256)
    eye = torch.eye(512)
    for name, w in weights(42, 512).items():
        expected = w.dequantize().to(torch.bfloat16).to(torch.float32).T
        for weight in (w, interleave_for_kernel(copy(w))):
            assert torch.equal(quant_linear(eye, weight), expected), (name, weight.interleaved)


def test_a_multi_part_projection_writes_each_part_into_its_columns(ext, monkeypatch, gemm_env):
    """A tuple of PackedWeights (q, k and v of different types, as in Q4_K_M files) gives each
    part's own product in its columns: through the bfloat16 GEMM (written in place), with a bias,
    and through the integer kernel below the row threshold."""
    from localchat.kernels import quant_linear as module

    gemm_env(BF16_GEMM_MIN_ROWS="32")
    monkeypatch.setattr(module, "BF16_GEMM_MIN_FEATURES", 256)
    kinds = weights(40, 256)
    parts = tuple(interleave_for_kernel(kinds[name]) for name in list(kinds)[:3])
    bias = torch.randn(sum(p.shape[0] for p in parts))
    for rows in (35, 2):
        x = torch.randn(rows, 256)
        for b in (None, bias):
            got = quant_linear(x, parts, b)
            biases = [None] * 3 if b is None else list(b.split([p.shape[0] for p in parts]))
            pairs = zip(parts, biases, strict=True)
            alone = torch.cat([quant_linear(x, p, pb) for p, pb in pairs], 1)
            assert got.shape == (rows, bias.numel()) and torch.equal(got, alone), (rows, b is None)


def test_large_projections_take_one_activation_code_small_ones_two(ext, gemm_env):
    """From INT8_ACTIVATION_MIN_FEATURES inputs on, a projection's activations take one int8 code
    each (llama.cpp's precision), below it two; LOCALCHAT_INT8_ACTIVATIONS=0/1 sets either
    everywhere."""
    from localchat.kernels import quant_linear as module

    gemm_env(BF16_GEMM_MIN_ROWS="0")
    large = module.INT8_ACTIVATION_MIN_FEATURES
    for cols in (large // 2, large):
        for name, w in weights(16, cols).items():
            x = torch.randn(3, cols)
            got = quant_linear(x, w)
            precise = cols < large
            assert torch.equal(got, run(ext, x, w, precise=precise)), name
            assert not torch.equal(got, run(ext, x, w, precise=not precise)), name
    for setting, expected in (("0", True), ("1", False)):
        gemm_env(INT8_ACTIVATIONS=setting)
        assert module.precise_activations(16) is expected
        assert module.precise_activations(large) is expected


def test_the_dequantized_gemm_when_asked_for(ext, gemm_env):
    """LOCALCHAT_DENSE_MIN_ROWS: from that many rows, the weight is dequantized for a float GEMM."""

    gemm_env(BF16_GEMM_MIN_ROWS="0", DENSE_MIN_ROWS="32")
    for name, w in weights(40, 160).items():
        args = (w.qweight, w.scales, w.mins, w.super_scales, w.bits, w.group_size, w.zero_point)
        dense = ext.dequantize(*args, w.arrangement)
        torch.testing.assert_close(dense, w.dequantize(), rtol=1e-6, atol=1e-7, msg=name)
        gate_up = torch.randn(35, 320)
        expected = quant_linear_reference(
            torch.nn.functional.silu(gate_up[:, :160]) * gate_up[:, 160:], w
        )
        torch.testing.assert_close(
            quant_linear(gate_up, w, silu_and_mul=True), expected, rtol=1e-5, atol=1e-5
        )
        small = gate_up[:2]  # and the integer kernel below the threshold, on the same fused input
        torch.testing.assert_close(
            quant_linear(small, w, silu_and_mul=True),
            expected[:2],
            rtol=0,
            atol=1e-3 * expected.abs().max().item(),
        )
