"""The C++ CPU kernels build wherever a C++ compiler exists, and a build that fails is never
silent where they are required (LOCALCHAT_REQUIRE_CPU_KERNELS=1, as .ci/run sets it)."""

from __future__ import annotations

import pytest

from localchat.kernels import cpu_extension


def test_the_kernels_build_wherever_a_compiler_exists(monkeypatch):
    compiler = cpu_extension.compiler()
    if compiler is None:
        pytest.skip("no C++ compiler here (CXX or c++)")
    monkeypatch.delenv("LOCALCHAT_NO_CPU_KERNELS", raising=False)
    module = cpu_extension.cpu_kernels()
    assert module is not None, f"{compiler} is here, but: {cpu_extension.build_failure()}"
    assert cpu_extension.build_failure() is None
    assert module.simd_isa() in ("avx512-vnni", "avx2", "")


def test_a_failed_build_falls_back_unless_the_kernels_are_required(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("Error building extension: quant_linear.h:1: #error broken")

    monkeypatch.setattr(cpu_extension, "_module", None)
    monkeypatch.setattr(cpu_extension, "_failed", None)
    monkeypatch.setattr(cpu_extension, "build_kernels", broken)
    monkeypatch.delenv("LOCALCHAT_NO_CPU_KERNELS", raising=False)
    monkeypatch.delenv(cpu_extension.REQUIRE_ENV, raising=False)
    assert cpu_extension.cpu_kernels() is None  # the torch fallback, with a warning
    assert "#error broken" in (cpu_extension.build_failure() or "")
    monkeypatch.setenv(cpu_extension.REQUIRE_ENV, "1")
    with pytest.raises(cpu_extension.CpuKernelsUnavailable, match="#error broken"):
        cpu_extension.cpu_kernels()
