"""Every ISA's quantized-projection kernels against the generic ones, through the standalone C++
test (kernels/csrc/tests/kernel_test.cpp, no torch): natively (this CPU's ISA, AVX2 on an AVX-512
machine, and the generic build, where the loops written once against the vector API run on one
lane), and the ARM NEON kernels cross-compiled with Debian's g++-aarch64-linux-gnu and run under
qemu-user (`apt-get install g++-aarch64-linux-gnu qemu-user`; .ci/run installs them where it
can)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from localchat.kernels import cpu_extension

CSRC = Path(cpu_extension.__file__).parent / "csrc"
TEST = CSRC / "tests" / "kernel_test.cpp"
JOBS = ("KV rows", "SiLU and softmax exp", "sampling argmax")  # the vector API's loops' lines
TIMEOUT = 300  # seconds for a build or a run (qemu runs the ARM one in about a second)


def build_and_run(compiler: str, flags: list[str], out: Path, runner: list[str]) -> str:
    build = subprocess.run(
        [compiler, "-std=c++17", "-O2", *flags, "-I", str(CSRC), str(TEST), "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert build.returncode == 0, build.stderr[-4000:]
    run = subprocess.run([*runner, str(out)], capture_output=True, text=True, timeout=TIMEOUT)
    failures = [line for line in run.stdout.splitlines() if line.startswith("FAIL")]
    assert run.returncode == 0 and not failures, run.stdout[-4000:] + run.stderr[-2000:]
    return run.stdout


# the native build in the fast subset; AVX2, generic and ARM (15-20 s each) in the full run
@pytest.mark.parametrize(
    "isa",
    ["native", *(pytest.param(isa, marks=pytest.mark.slow) for isa in ("avx2", "generic"))],
)
def test_this_cpus_kernels_agree_with_the_generic_ones(isa, tmp_path):
    compiler = cpu_extension.compiler()
    if compiler is None:
        pytest.skip("no C++ compiler here (CXX or c++)")
    flags = ["-march=native", "-fopenmp"]
    if isa == "avx2":
        if "avx512_vnni" not in cpu_extension._cpu_signature().split():
            pytest.skip("the native build already is what this CPU runs")
        flags.append("-mno-avx512f")
    if isa == "generic":
        flags.append("-DLC_ISA_GENERIC")
    out = build_and_run(compiler, flags, tmp_path / "kernel_test", [])
    expected = {"native": None, "avx2": "kernels: avx2", "generic": "kernels: generic only"}[isa]
    assert expected is None or out.startswith(expected), out.splitlines()[0]
    if isa == "generic":  # the vector API's loops on one lane (quant/generic/vec.h)
        jobs = [line for line in out.splitlines() if any(job in line for job in JOBS)]
        assert jobs and all("one lane's" in line for line in jobs), jobs


@pytest.mark.slow
def test_the_arm_neon_kernels_agree_with_the_generic_ones_under_qemu(tmp_path):
    compiler, qemu = shutil.which("aarch64-linux-gnu-g++"), shutil.which("qemu-aarch64")
    if compiler is None or qemu is None:
        pytest.skip(
            "needs the aarch64 cross compiler and qemu-user (Debian: apt-get install "
            "g++-aarch64-linux-gnu qemu-user)"
        )
    flags = ["-march=armv8.2-a+dotprod", "-static"]
    out = build_and_run(compiler, flags, tmp_path / "kernel_test", [qemu, "-cpu", "max"])
    assert out.startswith("kernels: neon"), out.splitlines()[0]
    # every layout but u6 (a repacked Q6_K: NEON builds read its blocks) has a NEON kernel
    generic_only = {line.split()[1] for line in out.splitlines() if "generic only" in line}
    assert generic_only == {"u6"}, generic_only
    assert "within rounding" not in out  # NEON keeps the generic order: the same bits
    # the KV rows, SiLU / softmax exp and the sampler's passes have NEON versions too
    for job in ("float16  KV rows", "bfloat16 KV rows", "SiLU and softmax exp", "sampling argmax"):
        lines = [line for line in out.splitlines() if job in line]
        assert lines and all("the ISA's" in line for line in lines), job
