"""Kernel tests run on the CPU through Triton's interpreter (set before triton is imported), or on a
GPU with LOCALCHAT_KERNEL_DEVICE=cuda (benchmarks/gpu_check.py), where they also cover bfloat16."""

import os

import pytest

DEVICE = os.environ.get("LOCALCHAT_KERNEL_DEVICE", "cpu")
if DEVICE == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"


@pytest.fixture(autouse=True)
def _default_device():
    import torch

    torch.set_default_device(DEVICE)
    yield
    torch.set_default_device("cpu")
