"""Kernel tests run on the CPU through Triton's interpreter, or on a GPU with
LOCALCHAT_KERNEL_DEVICE=cuda (benchmarks/gpu_check.py), where they also cover bfloat16.

triton.jit reads TRITON_INTERPRET when a kernel is defined, so the kernel modules are imported
here with it set; it is then unset again, and set only while a test of this directory runs: the
rest of the session, and the servers and CLIs other tests start, never see it. The C++ kernels'
tests (cpu/) run as they are: their conftest overrides `_default_device` with one that does
nothing."""

import importlib
import os
import pkgutil
import sys

import pytest

DEVICE = os.environ.get("LOCALCHAT_KERNEL_DEVICE", "cpu")


def _import_interpreted() -> None:
    """Import every Triton kernel module of localchat.kernels with TRITON_INTERPRET=1 (before
    anything imports them compiled), then restore the environment."""
    import localchat.kernels

    names = [
        f"localchat.kernels.{module.name}"
        for module in pkgutil.iter_modules(localchat.kernels.__path__)
        if module.name.startswith("triton_")
    ]
    early = [name for name in names if name in sys.modules]
    if early:  # their kernels are compiled ones, which need a GPU
        raise RuntimeError(f"{early} were imported before the kernel tests could interpret them")
    saved = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        for name in names:
            importlib.import_module(name)
    finally:
        if saved is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = saved


if DEVICE == "cpu":
    _import_interpreted()


@pytest.fixture(autouse=True)
def _default_device(monkeypatch):
    import torch

    if DEVICE == "cpu":  # what the interpreter and dispatch.py read while a kernel runs
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    torch.set_default_device(DEVICE)
    yield
    torch.set_default_device("cpu")
