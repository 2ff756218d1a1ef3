"""One forward pass of M tokens on the CPU: the C++ decode stack against the op-by-op layers.

    python benchmarks/multirow_forward.py [MODEL] [--rows 1,2,4,6,8,16] [--context 300]
        [--rounds 15] [--batch] [--threads N] [--json FILE]

A sequence of `--context` tokens is prefilled once; then each round times, for every M, one
forward pass (the model's hidden states, no LM head) of M new tokens at the end of that sequence
(speculative decoding's verification of M - 1 drafted tokens), on the stack and op by op, in
alternating order. With `--batch` the M tokens are M sequences' decodes instead (each sequence a
copy of the context in its own blocks). Prints the median milliseconds of each and their spread
(min-max over the rounds).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from localchat import LLM, SamplingParams
from localchat.engine.core.sequence import Request


def _sequence(tokens: list[int], first_block: int, block_size: int):
    seq = Request("bench", tokens, SamplingParams(max_tokens=1)).seqs[0]
    blocks = -(-len(tokens) // block_size)
    seq.block_tables = [list(range(first_block, first_block + blocks))]
    return seq, first_block + blocks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?")
    parser.add_argument("--rows", default="1,2,4,6,8,16")
    parser.add_argument("--context", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--batch", action="store_true", help="M sequences' decodes")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rows = [int(r) for r in args.rows.split(",")]
    if args.threads:
        torch.set_num_threads(args.threads)
    llm = LLM(args.model, max_model_len=args.context + max(rows) + 16)
    runner = llm.engine.runner
    model = runner.model
    stack = model.cpu_decode
    if stack is None:
        raise SystemExit("this model does not run on the C++ decode stack here")
    block_size = runner.block_size
    context = [(i * 7919) % 20000 + 100 for i in range(args.context)]
    width = max(rows)
    copies = width if args.batch else 1
    seqs, next_block = [], 0
    with torch.inference_mode():
        for _ in range(copies):
            seq, next_block = _sequence(context + [5] * width, next_block, block_size)
            runner._forward(*runner._prepare([seq], [args.context])[:3])
            seq.num_computed_tokens = args.context
            seqs.append(seq)

    def forward(m: int, fused: bool) -> float:
        model.cpu_decode = stack if fused else None
        if args.batch:
            batch = runner._prepare(seqs[:m], [1] * m)[:3]
        else:
            batch = runner._prepare(seqs[:1], [m])[:3]
        start = time.perf_counter()
        with torch.inference_mode():
            runner._forward(*batch)
        return time.perf_counter() - start

    times: dict[str, dict[int, list[float]]] = {"stack": {}, "ops": {}}
    for m in rows:  # warm up
        forward(m, True), forward(m, False)
    for r in range(args.rounds):
        for m in rows:
            order = (True, False) if r % 2 == 0 else (False, True)
            for fused in order:
                times["stack" if fused else "ops"].setdefault(m, []).append(forward(m, fused))
    model.cpu_decode = stack
    kind = "decodes of M sequences" if args.batch else "M tokens of one sequence"
    print(f"one forward pass, {kind}, context {args.context}, {args.rounds} rounds (ms)")
    print(" M   stack median (min-max)      ops median (min-max)     ops/stack")
    report = {}
    for m in rows:
        s, o = times["stack"][m], times["ops"][m]
        sm, om = statistics.median(s) * 1e3, statistics.median(o) * 1e3
        print(
            f"{m:2d}   {sm:7.2f} ({min(s) * 1e3:6.2f}-{max(s) * 1e3:6.2f})   "
            f"{om:7.2f} ({min(o) * 1e3:6.2f}-{max(o) * 1e3:6.2f})   {om / sm:5.2f}x"
        )
        report[m] = {"stack_ms": [t * 1e3 for t in s], "ops_ms": [t * 1e3 for t in o]}
    if args.json:
        args.json.write_text(json.dumps({"kind": kind, "context": args.context, "rows": report}))


if __name__ == "__main__":
    main()
