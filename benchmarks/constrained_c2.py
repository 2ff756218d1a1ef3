"""C2 with half the requests constrained by a JSON grammar, against plain C2 on the same requests.

The constrained half follows `start: (json "\\n")+` (objects of a small schema, without end), so
every step of theirs computes an llguidance mask while still producing the workload's output
lengths (ignore_eos). Prefix caching is off, so every pass prefills. After one untimed pass, runs
alternate plain/constrained, `--rounds` times each; prints output tok/s by the wall clock and by
this process's CPU time (all its threads: the fairer figure on a machine other work shares).

    python benchmarks/constrained_c2.py [--rounds 2] [--threads N]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import llguidance

from localchat.bench.workloads import allowed_token_ids, random_requests, select_workload
from localchat.config import EngineConfig
from localchat.engine.core.llm_engine import LLMEngine
from localchat.engine.sampling.sampling_params import SamplingParams

SCHEMA = {
    "type": "object",
    "properties": {"id": {"type": "integer"}, "name": {"type": "string", "maxLength": 12}},
    "required": ["id", "name"],
    "additionalProperties": False,
}
GRAMMAR = llguidance.LLMatcher.grammar_from_lark(
    f'start: (item "\\n")+\nitem: %json {json.dumps(SCHEMA)}\n'
)


def run(engine: LLMEngine, requests, constrained: bool) -> tuple[float, float, int]:
    """Output tokens per wall second and per CPU second of one pass over `requests` (every other
    one constrained), and the tokens."""
    start, cpu = time.perf_counter(), time.process_time()
    for index, request in enumerate(requests):
        grammar = GRAMMAR if constrained and index % 2 else None
        params = SamplingParams(
            temperature=0.0, max_tokens=request.output_len, ignore_eos=True, grammar=grammar
        )
        engine.add_request(f"c2-{constrained}-{index}", request.prompt_token_ids, params)
    tokens = 0
    while engine.has_unfinished():
        for output in engine.step():
            tokens += output.num_output_tokens
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    return tokens / wall, tokens / cpu, tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    # no prefix caching: every pass prefills its prompts, as C2 does
    options: dict = {"enable_prefix_caching": False}
    if args.threads is not None:
        options["num_threads"] = args.threads
    engine = LLMEngine(EngineConfig.from_kwargs(**options))
    workload = select_workload("c2")
    requests = random_requests(
        workload, allowed_token_ids(engine.model_info.vocab_size, engine.tokenizer), 0
    )
    # warm-up, untimed: one whole constrained pass, so the grammar's tokenizer is built and the
    # first timed pass is not the engine's first
    run(engine, requests, constrained=True)
    figures: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
    for _ in range(args.rounds):
        for constrained in (False, True):
            rate, cpu_rate, tokens = run(engine, requests, constrained)
            figures[constrained].append((rate, cpu_rate))
            label = "half constrained" if constrained else "plain"
            print(
                f"{label:>16}: {rate:7.1f} output tok/s, {cpu_rate:7.1f} per CPU second "
                f"({tokens} tokens)",
                flush=True,
            )
    for column, name in ((0, "tok/s"), (1, "tok per CPU s")):
        plain = statistics.median(f[column] for f in figures[False])
        half = statistics.median(f[column] for f in figures[True])
        change = half / plain - 1
        print(f"median {name}: plain {plain:.1f}, half constrained {half:.1f} ({change:+.1%})")


if __name__ == "__main__":
    main()
