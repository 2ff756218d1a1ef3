"""Fixtures of the C++ CPU kernel tests.

On an AVX-512 machine the kernel tests run twice: on the native build and on the AVX2 kernels (the
same sources built with -mno-avx512f), which most laptops run and which would otherwise go untested
here. A module opts in with `pytestmark = pytest.mark.usefixtures("each_isa")`.
"""

from __future__ import annotations

import functools

import pytest

from localchat.kernels import cpu_extension
from localchat.kernels.cpu_extension import build_kernels
from tests.cpu_kernels import kernels_or_skip


@functools.cache
def _avx2_build():
    return build_kernels(("-mno-avx512f",))


@pytest.fixture(params=["native", "avx2"])
def each_isa(request, monkeypatch):
    """The test once on the native kernels and once, where those are AVX-512, on the AVX2 build,
    which cpu_kernels() then returns (so the engine's own calls take it too)."""
    native = kernels_or_skip()
    if request.param == "avx2":
        if native.simd_isa() != "avx512-vnni":
            pytest.skip("the native build already is what this CPU runs")
        module = _avx2_build()
        assert module.simd_isa() == "avx2"
        monkeypatch.setattr(cpu_extension, "_module", module)
        # the block cache goes under torch's allocator once per process, from the native build
        monkeypatch.setenv("LOCALCHAT_CPU_BLOCK_CACHE_MB", "0")
    return request.param


@pytest.fixture
def ext():
    """The C++ extension the test runs on (a build failure fails the test; only a machine without
    a C++ compiler skips it)."""
    return kernels_or_skip()
