"""Choose between a Triton kernel and its torch reference for a tensor.

CUDA tensors take the Triton kernels when Triton is importable; CPU tensors take the references,
unless LOCALCHAT_TRITON_ON_CPU=1 together with TRITON_INTERPRET=1 (how the tests run the kernels
here).
"""

from __future__ import annotations

import functools
import os

import torch

from localchat import envs


@functools.cache
def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except Exception:
        return False
    return True


@functools.cache
def _triton_on_cpu() -> bool:
    return envs.TRITON_ON_CPU.get() and os.environ.get("TRITON_INTERPRET") == "1"


def use_triton(tensor: torch.Tensor) -> bool:
    if tensor.is_cuda:
        return triton_available()
    return _triton_on_cpu() and triton_available()
