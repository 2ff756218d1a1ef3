"""Fixtures of the C++ CPU kernel tests."""

from __future__ import annotations

import pytest

from localchat.kernels.cpu_extension import cpu_kernels


@pytest.fixture(scope="session")
def ext():
    """The built C++ extension (the tests skip where it cannot be built)."""
    module = cpu_kernels()
    if module is None:
        pytest.skip("the C++ CPU kernels cannot be built here")
    return module
