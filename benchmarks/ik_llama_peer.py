"""ik_llama.cpp as a second CPU peer for C4 and C7 (issue 43): its own `llama-bench` on a GGUF.

ik_llama.cpp (github.com/ikawrakow/ik_llama.cpp) is not a Python package: build it from source
with cmake (not in CI), then point --bin at the folder holding its `llama-bench`:

    cmake -B /tmp/ik/build -S /tmp/ik/src -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \\
        -DLLAMA_CURL=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TESTS=OFF
    cmake --build /tmp/ik/build -j 2 --target llama-bench llama-cli

One llama-bench process per run, `-o json`, the model loaded once for both tests:

- c4 (prompt 128, output 64, as `localchat bench --workload c4`; default 4 repetitions):
  `-p 128 -n 0 -gp 128,64`;
- c7 (prompt 8,192, output 256; default 1 repetition): `-p 8192 -n 0 -gp 8192,256`.

`-p P -n 0` times the prefill alone (`ppP`): prompt tok/s, and the TTFT estimate is that prefill's
time (P / prompt tok/s; no tokenizer, no chat template, no sampling of the first token). `-gp P,G`
(`tgG@ppP`) fills the KV cache with P tokens untimed, then times G single-token decode steps:
decode tok/s after the prompt, G / time. (`-pg P,G` would time prefill and decode together, one
rate for both; `-n G` alone would decode from an empty cache.) So a C7 run pays for the 8,192-token
prefill twice a repetition (once timed, once untimed before the decode), plus llama-bench's
warm-up (one token each). llama-bench feeds random token ids: no tokenizer, no sampling.

--extra replaces the default ik_llama.cpp options, `-rtr 1 -fa 1`, "ik_llama.cpp as users run it"
on a CPU per its README and docs/parameters.md:

- `-rtr 1` run-time repacking: at load, each weight with a row-interleaved variant is repacked into
  it (Q4_K -> Q4_K_R4, Q6_K -> Q6_K_R4, Q8_0 -> Q8_0_R8, ...), the feature issue 43 cites; off by
  default in ik_llama.cpp (it turns mmap off: the load copies the weights, so load time and RSS are
  not comparable to an mmap'd load, and neither is measured here), but its docs' CPU examples use
  it. On the C4 file it repacks 225 tensors (the Q4_K and Q6_K ones); `--extra "-fa 1"` measures
  without it.
- `-fa 1` flash attention (ik_llama.cpp's default already, spelled out): its CPU FA kernels.
- fused MoE (`-fmoe`) and fused up-gate are on by default and left so; `-fmoe` matters for C5-like
  MoE files only. `-mla` is DeepSeek's only. The KV cache stays f16 (`-ctk/-ctv` to change it).

    python benchmarks/ik_llama_peer.py --bin /tmp/ik/build/bin FILE.gguf --workload c4 \\
        --threads 2 --json c4_ik.json
    python benchmarks/ik_llama_peer.py --bin /tmp/ik/build/bin FILE.gguf --workload c7 \\
        --threads 2 --json c7_ik.json

The JSON has the figures, each repetition's, the ik_llama.cpp commit (llama-bench's build_commit,
or --commit), the command line, the CPU (lscpu's model name), the date, and llama-bench's records.
"""

from __future__ import annotations

import argparse
import datetime
import json
import shlex
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

# workload -> (prompt tokens, generated tokens, default repetitions)
WORKLOADS: dict[str, tuple[int, int, int]] = {"c4": (128, 64, 4), "c7": (8192, 256, 1)}
DEFAULT_EXTRA = "-rtr 1 -fa 1"


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    for line in out.splitlines():
        if line.strip().startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def bench_command(
    bench: Path, gguf: Path, n_prompt: int, n_gen: int, threads: int, rounds: int, extra: str
) -> list[str]:
    return [
        str(bench),
        "-m",
        str(gguf.resolve()),
        "-p",
        str(n_prompt),
        "-n",
        "0",
        "-gp",
        f"{n_prompt},{n_gen}",
        "-t",
        str(threads),
        "-r",
        str(rounds),
        "-o",
        "json",
        *shlex.split(extra),
    ]


def run_bench(cmd: list[str]) -> list[dict[str, Any]]:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"llama-bench failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}")
    start = proc.stdout.find("[")
    if start < 0:
        sys.exit(f"llama-bench printed no JSON: {proc.stdout[-2000:]}")
    records: list[dict[str, Any]] = json.loads(proc.stdout[start:])
    return records


def summarize(records: list[dict[str, Any]], n_prompt: int, n_gen: int) -> dict[str, Any]:
    by_test = {r["test"]: r for r in records}
    pp, gp = by_test.get(f"pp{n_prompt}"), by_test.get(f"tg{n_gen}@pp{n_prompt}")
    if pp is None or gp is None:
        sys.exit(f"llama-bench gave tests {sorted(by_test)}, not pp{n_prompt} and tg{n_gen}@pp")
    ttft = [ns / 1e6 for ns in pp["samples_ns"]]
    return {
        "prompt_tok_s": pp["avg_ts"],
        "prompt_tok_s_rounds": pp["samples_ts"],
        "ttft_ms_estimate": statistics.mean(ttft),
        "ttft_ms_estimate_rounds": ttft,
        "decode_tok_s": gp["avg_ts"],
        "decode_tok_s_rounds": gp["samples_ts"],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("gguf", type=Path)
    ap.add_argument("--bin", type=Path, required=True, help="ik's llama-bench folder")
    ap.add_argument("--workload", choices=sorted(WORKLOADS), default="c4")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, help="llama-bench -r (default: c4 4, c7 1)")
    ap.add_argument("--extra", default=DEFAULT_EXTRA, help=f"ik options ({DEFAULT_EXTRA!r})")
    ap.add_argument("--commit", help="ik_llama.cpp commit, if the build does not know its own")
    ap.add_argument("--json", type=Path, help="write the results here")
    args = ap.parse_args(argv)

    bench = args.bin / "llama-bench"
    if not bench.is_file():
        sys.exit(f"no ik_llama.cpp llama-bench at {bench}: build it (see this script's docstring)")
    if not args.gguf.is_file():
        sys.exit(f"no GGUF file at {args.gguf}")
    n_prompt, n_gen, default_rounds = WORKLOADS[args.workload]
    rounds = args.rounds or default_rounds
    cmd = bench_command(bench, args.gguf, n_prompt, n_gen, args.threads, rounds, args.extra)
    date = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    records = run_bench(cmd)
    figures = summarize(records, n_prompt, n_gen)
    result = {
        "system": "ik_llama.cpp",
        "workload": args.workload,
        "prompt_tokens": n_prompt,
        "output_tokens": n_gen,
        "threads": args.threads,
        "rounds": rounds,
        "commit": args.commit or records[0].get("build_commit", "unknown"),
        "command": shlex.join(cmd),
        "cpu": cpu_model(),
        "date": date,
        **figures,
        "llama_bench": records,
    }
    print(
        f"ik_llama.cpp {result['commit']} {args.workload} ({n_prompt} + {n_gen} tokens, "
        f"{args.threads} threads, {rounds} rounds, {args.extra or 'no extra options'}): "
        f"decode {figures['decode_tok_s']:.2f} tok/s, prompt {figures['prompt_tok_s']:.1f} tok/s, "
        f"TTFT ~{figures['ttft_ms_estimate']:,.0f} ms"
    )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
