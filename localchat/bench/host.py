"""Where the host put this machine's CPUs, for the bench's notes.

On a VM the host may run two CPUs on cores that share an L3 or on cores of different CCDs, and may
change that from one process to the next, or within one. The decode follows it: measured on a
2-core Zen 5 EPYC VM (docs/benchmarks-history.md, 2026-12-05), an 8B Q4_0 decode took 91-92 ms a
token where a cache line's round trip between the two CPUs was 130-180 ns before and after it (a
shared L3), and 70-71 ms where it was 340-500 ns (11 of 14 processes; in two it changed during
the decode).
"""

from __future__ import annotations

import os

ROUNDS = 20_000


def core_round_trip_ns(rounds: int = ROUNDS) -> float | None:
    """The round trip of a cache line between the first two CPUs this process may run on, in ns;
    None where there are not two, the CPU kernels cannot be built, or threads cannot be pinned."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None
    if len(cpus) < 2:
        return None
    from localchat.kernels.cpu_extension import cpu_kernels

    ext = cpu_kernels()
    if ext is None:
        return None
    value = float(ext.core_round_trip_ns(cpus[0], cpus[1], rounds))
    return value if value > 0 else None
