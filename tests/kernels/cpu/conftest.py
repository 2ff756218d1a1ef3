"""Fixtures of the C++ CPU kernel tests.

The kernel tests run on each build of the kernels this machine can run: the native one, on an
AVX-512 machine the AVX2 kernels (the same sources built with -mno-avx512f), which most laptops run
and which would otherwise go untested here, and the generic kernels (LOCALCHAT_CPU_ISA=generic:
what runs where an ISA has no kernel). A module opts in with
`pytestmark = pytest.mark.usefixtures("each_isa")`, and to the generic build with
`GENERIC_KERNELS = True` (where the kernels it tests have ISA versions: quant/arch/<isa>/).
"""

from __future__ import annotations

import functools

import pytest

from localchat.kernels import cpu_extension, quant_linear
from localchat.kernels.cpu_extension import build_isa
from tests.cpu_kernels import kernels_or_skip


@functools.cache
def _build(isa: str):
    return build_isa(isa)


@pytest.fixture(params=["native", "avx2", "generic"])
def each_isa(request, monkeypatch):
    """The test on the native kernels, on the AVX2 build where those are AVX-512, and on the
    generic build where the native one has vector kernels; cpu_kernels() then returns that build
    (so the engine's own calls take it too)."""
    native = kernels_or_skip()
    if request.param != "native":
        if request.param == "avx2" and native.simd_isa() != "avx512-vnni":
            pytest.skip("the native build already is what this CPU runs")
        if request.param == "generic" and not native.simd_isa():
            pytest.skip("the native build already is the generic one")
        if request.param == "generic" and not getattr(request.module, "GENERIC_KERNELS", False):
            pytest.skip("its kernels have no ISA versions: the generic build is the same")
        module = _build(request.param)
        monkeypatch.setattr(cpu_extension, "_module", module)
        # the block cache goes under torch's allocator once per process, from the native build
        monkeypatch.setenv("LOCALCHAT_CPU_BLOCK_CACHE_MB", "0")
    return request.param


@pytest.fixture(autouse=True)
def _default_device():
    """Overrides ../conftest.py's fixture of this name: the Triton tests' device (TRITON_INTERPRET,
    torch's default device) is not for these, which run the C++ kernels on the CPU as they are."""
    return


@pytest.fixture
def ext():
    """The C++ extension the test runs on (a build failure fails the test; only a machine without
    a C++ compiler skips it)."""
    return kernels_or_skip()


@pytest.fixture
def gemm_env(monkeypatch):
    """Set LOCALCHAT_BF16_GEMM_MIN_ROWS, ..._DENSE_MIN_ROWS or ..._INT8_ACTIVATIONS for one test,
    `gemm_env(INT8_ACTIVATIONS="0")`: quant_linear reads them afresh, and again after the test."""

    def set_settings(**values: str) -> None:
        for name, value in values.items():
            monkeypatch.setenv(f"LOCALCHAT_{name}", value)
        quant_linear.gemm_choices.cache_clear()

    yield set_settings
    quant_linear.gemm_choices.cache_clear()
