"""Build the extra C++ kernel builds the kernel tests compare with the native one (the generic
kernels; on an AVX-512 machine the AVX2 ones, and without VBMI where it has VBMI), in a process of
their own started with a parallel test session.

The compiler runs on one core: while the first worker builds the native kernels and the other
waits for them, this builds the rest on the idle core, where the kernel tests would otherwise build
them one after the other later in the run. Each build is torch's cached one, so the tests load it
as they would their own; a build that fails here fails again, with its message, in the test."""

from __future__ import annotations

import subprocess
import sys

import pytest


def _build_all() -> None:
    from localchat import envs
    from localchat.kernels import cpu_extension

    if cpu_extension.compiler() is None or envs.NO_CPU_KERNELS.get():
        return
    cpu_extension.build_isa("generic")
    native = cpu_extension.build_kernels()  # built by the first worker meanwhile: this waits for it
    if native.simd_isa() == "avx512-vnni":
        cpu_extension.build_isa("avx2")
        if "avx512vbmi" in cpu_extension._cpu_signature().split():
            cpu_extension.build_kernels(("-mno-avx512vbmi",))


def start(config: pytest.Config) -> subprocess.Popen | None:
    """In the controller of a session on several xdist workers (the suite's default), the builds
    in a background process; None elsewhere (one process: the tests build what they take)."""
    workers = config.getoption("numprocesses", default=None)
    if hasattr(config, "workerinput") or workers in (None, 0, "0"):
        return None
    return subprocess.Popen(
        [sys.executable, "-m", "tests.prebuild_kernels"],
        cwd=str(config.rootpath),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def finish(process: subprocess.Popen | None) -> None:
    """Wait for the builds (a build stopped halfway would leave torch's lock file behind, on
    which every later build of that name waits)."""
    if process is not None:
        process.wait()


if __name__ == "__main__":
    try:
        _build_all()
    except Exception:  # the tests build it again and report why
        sys.exit(1)
