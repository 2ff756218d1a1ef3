"""benchmarks/gemv_rate.cpp, the kernels' GEMV rate without torch: it builds against the kernels'
headers as its comment says, prints a rate per round for the ISA's kernel or the generic one, and
refuses bad arguments with a usage line."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from localchat.kernels import cpu_extension

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "benchmarks" / "gemv_rate.cpp"
CSRC = Path(cpu_extension.__file__).parent / "csrc"


@pytest.fixture(scope="module")
def gemv_rate(tmp_path_factory) -> Path:
    if shutil.which("g++") is None:
        pytest.skip("no g++")
    out = tmp_path_factory.mktemp("gemv_rate") / "gemv_rate"
    build = subprocess.run(
        ["g++", "-std=c++17", "-O2", "-march=native", "-I", str(CSRC), str(SOURCE), "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, build.stderr[-4000:]
    return out


@pytest.mark.parametrize("kind", ["Q4_K", "Q6_K", "Q8_0", "MXFP4"])
@pytest.mark.parametrize("generic", [False, True], ids=["isa", "generic"])
def test_it_prints_a_rate_per_round(gemv_rate, kind, generic):
    args = [str(gemv_rate), kind, "9", "512", *(["generic"] if generic else [])]
    run = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert len(lines) == 3
    for line in lines:
        match = re.fullmatch(rf"{kind} 9 x 512 \([\d.]+ MB\), (\S+): ([\d.]+) GB/s", line)
        assert match, line
        isas = ("generic",) if generic else ("avx512-vnni", "avx2", "neon", "generic")
        assert match[1] in isas
        assert float(match[2]) > 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "usage: gemv_rate TYPE ROWS COLUMNS"),
        (["Q4_K", "9", "512", "avx9"], "usage"),
        (["Q9_K", "9", "512"], "unknown type"),
        (["Q4_K", "0", "512"], "not positive"),
        (["Q4_K", "9", "100"], "multiple of 256 for Q4_K"),
    ],
)
def test_bad_arguments_get_a_usage_line(gemv_rate, args, message):
    run = subprocess.run([str(gemv_rate), *args], capture_output=True, text=True, timeout=60)
    assert run.returncode == 2
    assert message in run.stderr and run.stdout == ""
