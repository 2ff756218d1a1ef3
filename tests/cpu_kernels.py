"""The C++ CPU kernels for the tests that run them. A build that fails where a C++ compiler exists
is a test failure, never a skip (a broken header would otherwise turn the kernel tests into skips
and leave the suite green); only a machine without a compiler skips them."""

from __future__ import annotations

import os
from types import ModuleType

import pytest

from localchat.kernels import cpu_extension


def kernels_or_skip() -> ModuleType:
    """The extension cpu_kernels() gives; fails the test when it did not build though a compiler
    exists, skips it where there is no compiler (or LOCALCHAT_NO_CPU_KERNELS turns them off)."""
    module = cpu_extension.cpu_kernels()
    if module is not None:
        return module
    if os.environ.get("LOCALCHAT_NO_CPU_KERNELS"):
        pytest.skip("LOCALCHAT_NO_CPU_KERNELS is set")
    compiler = cpu_extension.compiler()
    if compiler is not None:
        pytest.fail(
            f"the C++ CPU kernels did not build, though {compiler} is here: "
            f"{cpu_extension.build_failure()}"
        )
    pytest.skip("no C++ compiler here (CXX or c++), so no C++ CPU kernels")
