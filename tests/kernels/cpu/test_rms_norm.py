"""The C++ add + RMSNorm against the torch reference."""

from __future__ import annotations

import pytest
import torch

from localchat.kernels.norm import rms_norm, rms_norm_ref
from tests.cpu_kernels import kernels_or_skip

pytestmark = pytest.mark.usefixtures("each_isa")  # each build of the kernels (conftest.py)


@pytest.mark.parametrize("rows", [1, 7, 130])
def test_add_rms_norm_matches_reference(rows):
    kernels_or_skip()
    generator = torch.Generator().manual_seed(rows)
    x, residual = (
        torch.randn(rows, 576, generator=generator),
        torch.randn(rows, 576, generator=generator) * 3,
    )
    weight = torch.rand(576, generator=generator) + 0.5
    expected, expected_sum = rms_norm_ref(x, weight, 1e-5, residual.clone())
    got, got_sum = rms_norm(x, weight, 1e-5, residual)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_sum, expected_sum, rtol=0, atol=0)
    assert got_sum.data_ptr() == residual.data_ptr()  # updated in place: no new residual per layer
    torch.testing.assert_close(
        rms_norm(x, weight, 1e-5), rms_norm_ref(x, weight, 1e-5), rtol=1e-5, atol=1e-5
    )
