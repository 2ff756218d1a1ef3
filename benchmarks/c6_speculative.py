"""C6: input-grounded decoding with speculative decoding (prompt lookup) against without it, on the
default model, greedy, with real text shipped in benchmarks/data (DESIGN.md's C6).

Tasks: (a) return a 300-line source file with one requested change; (b) summarise a document
(the Declaration of Independence, ~1,800 tokens) quoting it; (c) three questions over the same
document, each turn carrying the previous answers. Then C1 (random prompt, open-ended output) to
show what speculation costs where lookups rarely hit.

Both engines stay loaded and take turns on each task (paired rounds); decode tok/s of a reply is
(tokens - 1) / (time of the last token - time of the first). The texts must be identical.

    python benchmarks/c6_speculative.py --rounds 3 --json c6.json [--threads 2]

With `--quantization none --speculative-config '{"method": "draft_model", "model": GGUF}'` (GGUF:
the default model's file) the model is the default model dequantized to float32 and its own Q4_1
file drafts for it: the same tokenizer and nearly the same answers, a stand-in for a small draft of
a larger model where no such pair of files can be fetched.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import platform
import random
import shlex
import statistics
import time
from pathlib import Path

import torch

from localchat import LLM, SamplingParams

DATA = Path(__file__).parent / "data"
SPEC = {
    "method": "ngram",
    "num_speculative_tokens": 5,
    "prompt_lookup_min": 2,
    "prompt_lookup_max": 4,
}


def tasks() -> dict[str, list[dict]]:
    """Each task's conversation turns (user messages; the replies are the model's own)."""
    code = (DATA / "c6" / "block_manager.py.txt").read_text()
    doc = (DATA / "declaration.txt").read_text()
    return {
        "edit": [
            "Here is a Python file:\n\n```python\n"
            + code
            + "```\n\nReturn the whole file with one "
            "change: rename the method `free` to `release` (its definition and every call). "
            "Output only the code."
        ],
        "summarise": [
            "Summarise this document in about 200 words, quoting at least three of its sentences "
            "word for word:\n\n" + doc
        ],
        "questions": [
            "Read this document:\n\n" + doc + "\n\nWhich grievances does it list about the courts "
            "and judges? Quote them.",
            "Which sentences speak of taxes or trade? Quote them exactly.",
            "Quote the document's last sentence, then explain it in one sentence.",
        ],
    }


def timed(llm: LLM, prompt: list[int], max_tokens: int) -> tuple[list[int], float, float]:
    """(tokens, decode tok/s, seconds to the first token) of one greedy request, stepped here."""
    engine = llm.engine
    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    request = engine.add_request(f"c6-{time.monotonic_ns()}", prompt, params)
    start = time.perf_counter()
    first = last = None
    while engine.has_unfinished():
        outputs = engine.step()
        now = time.perf_counter()
        if any(o.outputs and o.outputs[0].token_ids for o in outputs):
            first = first if first is not None else now
            last = now
    tokens = list(request.seqs[0].output_token_ids)
    decode = (len(tokens) - 1) / (last - first) if last and first and last > first else float("nan")
    return tokens, decode, (first or start) - start


def run_task(llm: LLM, turns: list[str], max_tokens: int) -> dict:
    messages: list[dict] = []
    replies, decode, tokens = [], [], 0
    for turn in turns:
        messages.append({"role": "user", "content": turn})
        prompt = llm.engine.render_chat(messages, add_generation_prompt=True)
        out, rate, _ = timed(llm, prompt, max_tokens)
        reply = llm.engine.detokenize(out)
        messages.append({"role": "assistant", "content": reply})
        replies.append(out)
        decode.append(rate)
        tokens += len(out)
    # a multi-turn task's rate: its tokens over its decode time
    seconds = sum((len(r) - 1) / d for r, d in zip(replies, decode, strict=True) if d == d)
    return {"replies": replies, "tokens": tokens, "decode_tok_s": (tokens - len(turns)) / seconds}


def c1(llm: LLM, seed: int) -> dict:
    rng = random.Random(seed)
    prompt = [rng.randrange(1000, 40000) for _ in range(128)]
    engine = llm.engine
    params = SamplingParams(temperature=0, max_tokens=128, ignore_eos=True)
    request = engine.add_request(f"c1-{seed}-{time.monotonic_ns()}", prompt, params)
    first = last = None
    while engine.has_unfinished():
        outputs = engine.step()
        now = time.perf_counter()
        if any(o.outputs and o.outputs[0].token_ids for o in outputs):
            first = first if first is not None else now
            last = now
    tokens = list(request.seqs[0].output_token_ids)
    return {
        "replies": [tokens],
        "tokens": len(tokens),
        "decode_tok_s": (len(tokens) - 1) / (last - first),
    }


def _shell_word(value: object) -> str:
    """An argument as the shell takes it back: a speculative config as its JSON."""
    return shlex.quote(json.dumps(value) if isinstance(value, dict) else str(value))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--max-tokens", type=int, default=4096)
    parser.add_argument(
        "--speculative-config", type=json.loads, default=SPEC, help="JSON, as serve takes it"
    )
    parser.add_argument(
        "--quantization",
        default="auto",
        help="the model's (both engines'): none runs the default GGUF dequantized, a slower "
        "target for a draft_model drafting with the file as it is",
    )
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    plain = LLM(quantization=args.quantization)
    spec = LLM(quantization=args.quantization, speculative_config=args.speculative_config)
    work = {
        name: (lambda llm, turns=turns: run_task(llm, turns, args.max_tokens))
        for name, turns in tasks().items()
    }
    results: dict[str, dict] = {}
    for round_ in range(args.rounds):
        for name, job in [*work.items(), ("c1", lambda llm, r=round_: c1(llm, r))]:
            order = [("plain", plain), ("spec", spec)]
            if round_ % 2:
                order.reverse()
            runs = {label: job(llm) for label, llm in order}
            entry = results.setdefault(
                name, {"plain": [], "spec": [], "ratio": [], "identical": True}
            )
            for label in ("plain", "spec"):
                entry[label].append(runs[label]["decode_tok_s"])
            entry["ratio"].append(runs["spec"]["decode_tok_s"] / runs["plain"]["decode_tok_s"])
            entry["identical"] &= runs["spec"]["replies"] == runs["plain"]["replies"]
            entry["tokens"] = runs["plain"]["tokens"]
            print(
                f"round {round_} {name}: {runs['plain']['decode_tok_s']:.1f} -> "
                f"{runs['spec']['decode_tok_s']:.1f} tok/s ({entry['ratio'][-1]:.2f}x), "
                f"{entry['tokens']} tokens, identical {entry['identical']}",
                flush=True,
            )
    for entry in results.values():
        entry["median_ratio"] = statistics.median(entry["ratio"])
    grounded = [results[name]["median_ratio"] for name in work]
    stats = spec.engine.stats()
    summary = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": "python benchmarks/c6_speculative.py "
        + " ".join(
            f"--{key.replace('_', '-')} {_shell_word(value)}"
            for key, value in vars(args).items()
            if value is not None
        ),
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "threads": torch.get_num_threads(),
        },
        "speculative_config": args.speculative_config,
        "results": results,
        "c6_geomean_ratio": math.exp(sum(map(math.log, grounded)) / len(grounded)),
        "c1_ratio": results["c1"]["median_ratio"],
        "acceptance": stats.spec_accepted_tokens_total / max(stats.spec_draft_tokens_total, 1),
    }
    print(json.dumps({k: v for k, v in summary.items() if k != "results"}, indent=1))
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
