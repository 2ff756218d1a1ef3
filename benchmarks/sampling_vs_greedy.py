"""Batch-1 decode tok/s with the chat's default sampling against greedy, on the same engine
(issue 9: target >= 0.9x).

Both decode the same prompt for `--max-tokens` tokens with ignore_eos, alternating greedy and
sampled runs to spread machine noise over both. Decode tok/s = (n - 17) / (t(n) - t(17)) over
the times at which `LLMEngine.step()` returns each token, as C1 measures it.

    python benchmarks/sampling_vs_greedy.py [--rounds 4] [--max-tokens 256] [--json OUT] [MODEL]
"""

from __future__ import annotations

import argparse
import itertools
import json
import platform
import statistics
import time
from pathlib import Path

PROMPT = "Write a long, detailed story about a lighthouse keeper who finds a message in a bottle."


def decode_tok_s(llm, prompt: list[int], params, request_id: str) -> float:
    engine = llm.engine
    engine.add_request(request_id, prompt, params)
    times: list[float] = []
    while engine.has_unfinished():
        times.extend(time.perf_counter() for _ in engine.step())
    return (len(times) - 17) / (times[-1] - times[16])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", default=None)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    import torch

    from localchat import LLM, SamplingParams
    from localchat.tui.conversation import DEFAULT_SETTINGS

    llm = LLM(args.model, num_threads=args.threads)
    prompt = llm.engine.render_chat(
        [{"role": "user", "content": PROMPT}], add_generation_prompt=True
    )
    common = {"max_tokens": args.max_tokens, "ignore_eos": True}
    greedy = SamplingParams(temperature=0, **common)
    sampled = SamplingParams(
        temperature=DEFAULT_SETTINGS["temperature"],
        top_p=DEFAULT_SETTINGS["top_p"],
        seed=0,
        **common,
    )
    ids = (f"bench-{i}" for i in itertools.count())
    decode_tok_s(llm, prompt, greedy, next(ids))  # warm up
    runs: dict[str, list[float]] = {"greedy": [], "sampled": []}
    for _ in range(args.rounds):
        runs["greedy"].append(decode_tok_s(llm, prompt, greedy, next(ids)))
        runs["sampled"].append(decode_tok_s(llm, prompt, sampled, next(ids)))
    medians = {name: statistics.median(values) for name, values in runs.items()}
    results = {
        "runs_tok_s": runs,
        "median_tok_s": medians,
        "sampled_vs_greedy": medians["sampled"] / medians["greedy"],
        "sampling": {"temperature": sampled.temperature, "top_p": sampled.top_p},
        "max_tokens": args.max_tokens,
        "threads": torch.get_num_threads(),
        "machine": platform.processor() or platform.machine(),
        "date": time.strftime("%Y-%m-%d"),
    }
    print(json.dumps(results, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
