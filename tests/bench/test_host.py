"""The round trip of a cache line between two CPUs (bench/host.py, kernels/csrc/core_round_trip.h):
what the bench's notes say about where the host put the CPUs."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from localchat.bench.host import core_round_trip_ns
from tests.cpu_kernels import kernels_or_skip

pytestmark = pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="needs two CPUs to pin threads to",
)


def test_two_cpus_pass_a_line_and_give_a_figure():
    kernels_or_skip()  # (without them there is no figure)
    # a figure, whatever its size: that is the host's (where other processes hold the CPUs, each
    # pass waits for the scheduler), not a property of the code
    value = core_round_trip_ns(200)
    assert value is not None and value > 0


def test_cpus_it_cannot_run_on_or_one_cpu_give_no_figure():
    ext = kernels_or_skip()
    assert ext.core_round_trip_ns(0, 1_000_000, 10) == -1.0  # no such CPU: nothing pinned
    with pytest.raises(RuntimeError, match="two distinct CPUs"):
        ext.core_round_trip_ns(0, 0, 10)
    cpu = min(os.sched_getaffinity(0))
    code = (
        "import os; from localchat.bench.host import core_round_trip_ns; "
        f"os.sched_setaffinity(0, {{{cpu}}}); print(core_round_trip_ns(100))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0 and result.stdout.strip() == "None", result.stderr
