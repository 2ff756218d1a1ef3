"""Perplexity with a float16 KV cache against a q8_0 one (issue 43, item 2), through the LLM API:
the text as one prompt, echoed with its logprobs (SamplingParams.prompt_logprobs), so every token's
probability comes from attention over keys and values read back from the pool (a prefill stores
them before attending, in chunks of max_num_batched_tokens).

    python benchmarks/kv_quality.py [MODEL] [--text FILE] [--kv-cache-dtype q8_0] [--json OUT]
                                    [--decode-rounds N] [--context 128,2048]

Default: the embedded default model (SmolLM2-135M-Instruct, GGUF) and the Declaration of
Independence (public domain, benchmarks/data/declaration.txt, 1,701 tokens). Target: the quantized
pool's perplexity within 0.5% of float16's.

With --decode-rounds N, also batch-1 decode tok/s of both pools, paired: the two engines stay loaded
and take turns, N rounds of one greedy request per context length (a prompt of that many tokens of
the text, then 128 tokens), each pool's best round and median kept, so a busy machine's noise falls
on both alike (`localchat bench --workload c1 --kv-cache-dtype q8_0` measures one pool per process).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import platform
import statistics
import time
from pathlib import Path

import torch

DEFAULT_TEXT = Path(__file__).parent / "data" / "declaration.txt"
_ids = itertools.count()


def perplexity(llm, ids: list[int]) -> tuple[float, int]:
    """exp(mean -log p(token t | tokens before t)) over the prompt's tokens after the first, from
    its echoed prompt logprobs; and how many tokens that scored."""
    from localchat import SamplingParams

    params = SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=0)
    (out,) = llm.generate([ids], params)
    scored = [entry.logprob for entry in out.prompt_logprobs[1:] if entry is not None]
    assert len(scored) == len(ids) - 1, "a prompt token without its logprob"
    return math.exp(-sum(scored) / len(scored)), len(scored)


def decode_rate(llm, prompt: list[int], tokens: int = 128) -> float:
    """Batch-1 decode tok/s of one greedy request: the tokens after the first over the time after
    the first token came (its prefill excluded)."""
    from localchat import SamplingParams

    engine = llm.engine
    params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
    engine.add_request(f"decode-{next(_ids)}", prompt, params)
    first, first_count, count = 0.0, 0, 0
    while engine.has_unfinished():
        for output in engine.step():
            count += output.num_output_tokens
        if not first_count and count:
            first, first_count = time.perf_counter(), count
    return (count - first_count) / (time.perf_counter() - first)


def paired_decode(llms: dict, ids: list[int], contexts: list[int], rounds: int) -> dict:
    """{context: {pool: {"best": tok/s, "median": tok/s, "rounds": [...]}}}, the pools in turns."""
    figures: dict = {}
    for context in contexts:
        prompt = (ids * (context // len(ids) + 1))[:context]
        rates: dict[str, list[float]] = {name: [] for name in llms}
        for _ in range(rounds):
            for name, llm in llms.items():
                rates[name].append(decode_rate(llm, prompt))
        figures[context] = {
            name: {"best": max(r), "median": statistics.median(r), "rounds": r}
            for name, r in rates.items()
        }
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", default=None, help="default: the embedded model")
    parser.add_argument("--text", default=str(DEFAULT_TEXT))
    parser.add_argument("--kv-cache-dtype", default="q8_0", help="the pool set against float16")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--json", default=None, help="write the figures here")
    parser.add_argument("--decode-rounds", type=int, default=0, help="paired decode rounds")
    parser.add_argument("--context", default="128,2048", help="prompt lengths of the decode runs")
    args = parser.parse_args()

    from localchat import LLM

    results: dict = {"model": args.model or "default (SmolLM2-135M-Instruct)"}
    pools, llms = {}, {}
    started = time.perf_counter()
    for dtype in ("float16", args.kv_cache_dtype):
        llms[dtype] = llm = LLM(args.model, kv_cache_dtype=dtype, num_threads=args.threads)
        ids = llm.engine.tokenize(Path(args.text).read_text())
        results["text"], results["tokens"] = Path(args.text).name, len(ids)
        ppl, results["scored_tokens"] = perplexity(llm, ids)
        runner = llm.engine.runner
        pools[dtype] = runner.bytes_per_block()
        results[f"ppl_kv_{dtype}"] = ppl
        results[f"kv_bytes_per_block_{dtype}"] = runner.bytes_per_block()
    if args.decode_rounds:
        contexts = [int(n) for n in args.context.split(",")]
        results["decode_tok_s"] = paired_decode(llms, ids, contexts, args.decode_rounds)
    quantized = args.kv_cache_dtype
    results["ppl_ratio"] = results[f"ppl_kv_{quantized}"] / results["ppl_kv_float16"]
    results["within_0.5%"] = abs(results["ppl_ratio"] - 1) <= 0.005
    results["kv_bytes_ratio"] = pools[quantized] / pools["float16"]
    results.update(
        seconds=round(time.perf_counter() - started, 1),
        machine=platform.processor() or platform.machine(),
        threads=args.threads or torch.get_num_threads(),
        date=time.strftime("%Y-%m-%d"),
        torch=torch.__version__,
    )
    print(json.dumps(results, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
