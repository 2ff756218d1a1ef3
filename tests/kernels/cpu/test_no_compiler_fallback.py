"""Without the C++ kernels (a machine without a C++ compiler), a quantized projection is torch's:
each weight is dequantized once, at its first product, and kept, so a decode step is a plain
float32 matmul rather than a whole model's dequantization, with quant_linear_reference's results
bit for bit. Where the kernels are, no copy is kept."""

from __future__ import annotations

import logging

import pytest
import torch

from localchat import LLM, SamplingParams
from localchat.kernels import cpu_extension, quant_linear
from localchat.kernels.packed_weight import PackedWeight, quantize_weight
from tests.cpu_kernels import kernels_or_skip
from tests.family_models import VOCAB, save


@pytest.fixture
def no_compiler(monkeypatch):
    """cpu_kernels() as on a machine without a C++ compiler: it looks for one (CXX), finds none
    and returns None, for this test; the extension built before comes back afterwards."""
    monkeypatch.setenv("CXX", "no-such-c++-compiler")
    monkeypatch.delenv(cpu_extension.REQUIRE_ENV, raising=False)
    monkeypatch.delenv("LOCALCHAT_NO_CPU_KERNELS", raising=False)
    monkeypatch.setattr(cpu_extension, "_module", None)
    monkeypatch.setattr(cpu_extension, "_failed", None)
    assert cpu_extension.cpu_kernels() is None
    assert "no C++ compiler" in (cpu_extension.build_failure() or "")


def _count_dequantizations(monkeypatch) -> list[PackedWeight]:
    """The weights PackedWeight.dequantize restores whole from here on, one entry a call (an
    embedding's rows, looked up each step, are not counted)."""
    calls: list[PackedWeight] = []
    real = PackedWeight.dequantize

    def counted(self, rows=None, dtype=torch.float32):
        if rows is None:
            calls.append(self)
        return real(self, rows, dtype)

    monkeypatch.setattr(PackedWeight, "dequantize", counted)
    return calls


def _weight(bits: int) -> PackedWeight:
    generator = torch.Generator().manual_seed(bits)
    return quantize_weight(torch.randn(96, 64, generator=generator) * 0.1, bits)


@pytest.mark.parametrize("bits", [4, 8])
def test_a_weight_is_dequantized_once_and_multiplies_as_the_reference(
    bits, no_compiler, monkeypatch
):
    weight = _weight(bits)
    bias = torch.randn(96)
    calls = _count_dequantizations(monkeypatch)
    for rows in (1, 5, 1):
        x = torch.randn(rows, 64)
        got = quant_linear.quant_linear(x, weight, bias)
        torch.testing.assert_close(
            got, quant_linear.quant_linear_reference(x, weight, bias), rtol=0, atol=0
        )
    assert len([w for w in calls if w is weight]) == 4  # once kept, then three references
    assert weight.dense is not None and weight.dense.dtype == torch.float32


def test_the_kernels_keep_no_dequantized_copy(monkeypatch):
    kernels_or_skip()
    weight = _weight(4)
    calls = _count_dequantizations(monkeypatch)
    quant_linear.quant_linear(torch.randn(1, 64), weight)
    assert weight.dense is None and not calls


@pytest.mark.parametrize("family", ["llama3", "qwen3-moe"])
def test_a_model_decodes_the_same_tokens_dequantizing_each_weight_once(
    family, no_compiler, tmp_path, monkeypatch, caplog
):
    save(family, tmp_path)
    with caplog.at_level(logging.WARNING, logger="localchat.kernels"):
        llm = LLM(str(tmp_path), max_model_len=128, kv_cache_memory="4MiB", quantization="int4")
    model = llm.engine.runner.model
    values = [value for module in model.modules() for value in vars(module).values()]
    packed = [p for v in values for p in (v if isinstance(v, tuple) else (v,))]
    packed = [p for p in packed if isinstance(p, PackedWeight)]
    assert packed
    expected = quant_linear.dense_fallback_bytes(packed)
    assert (
        "no C++ compiler: quantized weights are kept dequantized in memory "
        f"(float32, from their first use), up to {expected / 2**20:.1f} MiB more"
    ) in caplog.text
    prompt = torch.randint(3, VOCAB, (20,), generator=torch.Generator().manual_seed(3)).tolist()
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    calls = _count_dequantizations(monkeypatch)
    tokens = llm.generate([prompt], params)[0].outputs[0].token_ids
    assert len(calls) == len({id(w) for w in calls})  # each weight once, at its first product
    kept = {id(w) for w in calls}
    assert all(w.dense is not None for w in calls)
    assert all(w.dense is None for w in packed if id(w) not in kept)  # experts never chosen
    calls.clear()
    assert llm.generate([prompt], params)[0].outputs[0].token_ids == tokens
    assert not calls
    # as before the weights were kept: the whole weight dequantized at every product
    monkeypatch.setattr(quant_linear, "dequantized_once", lambda w: w.dequantize())
    assert llm.generate([prompt], params)[0].outputs[0].token_ids == tokens
    assert len(calls) > 2 * len(kept)
