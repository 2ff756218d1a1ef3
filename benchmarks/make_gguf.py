r"""Write a random-weight GGUF of a model shape in a quantization mix, with the default model's
tokenizer.

    python benchmarks/make_gguf.py llama-8b /tmp/llama-8b-q4_k_m.gguf --quant q4_k_m
    python benchmarks/make_gguf.py ../shared/models/qwen3-0.6b/config.json /tmp/qwen3.gguf \
        --quant q8_0

SHAPE is a preset (llama-8b, llama-1b, smollm2-135m) or an HF config.json (Llama, Qwen2, Qwen3). The
logic lives in localchat.bench.random_gguf (`write_random_gguf`), which
`localchat bench --workload c4` uses too.
"""

from __future__ import annotations

import argparse
import sys
import time

from localchat.bench.gguf_shapes import PRESETS, resolve_shape
from localchat.bench.random_gguf import QUANTS, write_random_gguf
from localchat.errors import LocalchatError

__all__ = ["main", "write_random_gguf"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("shape", help=f"preset ({', '.join(PRESETS)}) or a config.json path")
    parser.add_argument("output", help="the .gguf file to write")
    parser.add_argument(
        "--quant", default="q4_k_m", choices=list(QUANTS), help="quantization mix (default q4_k_m)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--std", type=float, default=0.02, help="standard deviation of the weights")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    shown = [-1]

    def progress(done: int, total: int) -> None:
        percent = 100 * done // total
        if percent // 10 != shown[0]:
            shown[0] = percent // 10
            print(
                f"\r{percent:3d}% of {total / 2**30:.2f} GiB", end="", file=sys.stderr, flush=True
            )

    try:
        shape = resolve_shape(args.shape)
        print(
            f"{shape.name} ({shape.arch}, {shape.num_layers} layers, "
            f"hidden {shape.hidden_size}) in {args.quant}",
            file=sys.stderr,
        )
        path = write_random_gguf(
            args.output, shape, args.quant, seed=args.seed, std=args.std, progress=progress
        )
    except LocalchatError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(
        f"\nwrote {path} ({path.stat().st_size / 2**30:.2f} GiB) "
        f"in {time.perf_counter() - start:.1f} s",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
