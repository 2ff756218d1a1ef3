"""The CPU GEMV's read bandwidth in both weight layouts (row-major and interleaved), alternating the
two in one process so that the machine's drift hits both alike.

    python benchmarks/gemv_bandwidth.py [--rounds 40]

Shapes: an 8B model's gate/up (Q4_K-like u4, 14336 x 4096) and down (Q6_K-like u8 group 16,
4096 x 14336) from DRAM (eight copies, 0.3-0.5 GB, cycled), and a 4096 x 4096 u4 one that stays in
L3. Prints GB/s (weight bytes read per second): mean over rounds and best round.
"""

from __future__ import annotations

import argparse
import time

import torch

from localchat.kernels.cpu_extension import cpu_kernels
from localchat.kernels.packed_weight import PackedWeight
from localchat.kernels.quant_linear import interleave_for_kernel, quant_linear

SHAPES = [  # name, layout, out, in, group, copies
    ("gate/up u4 (DRAM)", "u4", 14336, 4096, 32, 8),
    ("down u8 g16 (DRAM)", "u8", 4096, 14336, 16, 8),
    ("u4 4096x4096 (L3)", "u4", 4096, 4096, 32, 1),
]


def random_weight(layout: str, rows: int, cols: int, group: int) -> PackedWeight:
    codes = torch.randint(0, 256, (rows, cols // 2 if layout == "u4" else cols), dtype=torch.uint8)
    scales = (torch.rand(rows, cols // group) * 0.01).half()
    if layout == "u4":
        mins = (-torch.rand(rows, cols // group) * 0.08).half()
        return PackedWeight("u4", codes, scales, mins, 32)
    return PackedWeight("u8", codes & 63, scales, None, group, zero_point=32)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    if cpu_kernels() is None:
        raise SystemExit("the C++ CPU kernels cannot be built here")
    torch.set_num_threads(args.threads)
    for name, layout, rows, cols, group, copies in SHAPES:
        plain = [random_weight(layout, rows, cols, group) for _ in range(copies)]
        inter = [interleave_for_kernel(random_weight(layout, rows, cols, group)) for _ in plain]
        x = torch.randn(1, cols)
        reps = 1 if copies > 1 else 20
        seconds = {"row-major": [], "interleaved": []}
        for i in range(args.rounds):
            order = [("row-major", plain), ("interleaved", inter)]
            for label, weights in order if i % 2 else order[::-1]:
                start = time.perf_counter()
                for _ in range(reps):
                    for w in weights:
                        quant_linear(x, w)
                seconds[label].append((time.perf_counter() - start) / (reps * len(weights)))
        nbytes = plain[0].nbytes
        cells = [
            f"{label} {nbytes * len(t) / sum(t) / 1e9:.1f} (best {nbytes / min(t) / 1e9:.1f})"
            for label, t in seconds.items()
        ]
        print(f"{name}: " + " | ".join(cells) + " GB/s", flush=True)


if __name__ == "__main__":
    main()
