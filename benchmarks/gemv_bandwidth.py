"""The CPU GEMV's speed on an 8B model's shapes, alternating the variants of each in one process so
that the machine's drift hits them alike.

    python benchmarks/gemv_bandwidth.py [--rounds 40]

- gate/up (Q4_K-like u4, 14336 x 4096) from DRAM, row-major against interleaved;
- down (Q6_K-like, group 16, 4096 x 14336) from DRAM, a byte per code (u8) against 6 bits (u6);
- a 4096 x 4096 u4 weight that stays in L3, row-major against interleaved.

DRAM shapes cycle through eight copies (0.3-0.5 GB). Prints, per variant, microseconds per GEMV and
GB/s (weight bytes read per second): the mean over rounds and the best round.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch

from localchat.kernels.cpu_extension import cpu_kernels
from localchat.kernels.packed_weight import PackedWeight, pack_u6
from localchat.kernels.quant_linear import interleave_for_kernel, quant_linear

Maker = Callable[[], PackedWeight]


def u4_weight(rows: int, cols: int) -> PackedWeight:
    codes = torch.randint(0, 256, (rows, cols // 2), dtype=torch.uint8)
    scales = (torch.rand(rows, cols // 32) * 0.01).half()
    mins = (-torch.rand(rows, cols // 32) * 0.08).half()
    return PackedWeight("u4", codes, scales, mins, 32)


def q6_weight(rows: int, cols: int, layout: str) -> PackedWeight:
    codes = torch.randint(0, 64, (rows, cols), dtype=torch.uint8)
    scales = (torch.rand(rows, cols // 16) * 0.01).half()
    qweight = pack_u6(codes) if layout == "u6" else codes
    return PackedWeight(layout, qweight, scales, None, 16, zero_point=32)


COMPARISONS: list[tuple[str, int, list[tuple[str, Maker]]]] = [  # name, copies, variants
    (
        "gate/up u4 14336x4096 (DRAM)",
        8,
        [
            ("row-major", lambda: u4_weight(14336, 4096)),
            ("interleaved", lambda: interleave_for_kernel(u4_weight(14336, 4096))),
        ],
    ),
    (
        "down Q6_K-like 4096x14336 (DRAM)",
        8,
        [
            ("u8", lambda: interleave_for_kernel(q6_weight(4096, 14336, "u8"))),
            ("u6", lambda: interleave_for_kernel(q6_weight(4096, 14336, "u6"))),
        ],
    ),
    (
        "u4 4096x4096 (L3)",
        1,
        [
            ("row-major", lambda: u4_weight(4096, 4096)),
            ("interleaved", lambda: interleave_for_kernel(u4_weight(4096, 4096))),
        ],
    ),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    if cpu_kernels() is None:
        raise SystemExit("the C++ CPU kernels cannot be built here")
    torch.set_num_threads(args.threads)
    for name, copies, variants in COMPARISONS:
        weights = {label: [make() for _ in range(copies)] for label, make in variants}
        x = torch.randn(1, next(iter(weights.values()))[0].in_features)
        reps = 1 if copies > 1 else 20
        seconds: dict[str, list[float]] = {label: [] for label in weights}
        for i in range(args.rounds):
            order = list(weights.items())
            for label, ws in order if i % 2 else order[::-1]:
                start = time.perf_counter()
                for _ in range(reps):
                    for w in ws:
                        quant_linear(x, w)
                seconds[label].append((time.perf_counter() - start) / (reps * len(ws)))
        cells = []
        for label, t in seconds.items():
            nbytes, mean = weights[label][0].nbytes, sum(t) / len(t)
            cells.append(
                f"{label} {mean * 1e6:.0f} us, {nbytes / mean / 1e9:.1f} GB/s "
                f"(best {min(t) * 1e6:.0f} us, {nbytes / min(t) / 1e9:.1f})"
            )
        print(f"{name}: " + " | ".join(cells), flush=True)


if __name__ == "__main__":
    main()
