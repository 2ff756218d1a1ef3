"""llama.cpp's batch-1 decode with the prompt fed one token at a time (n_batch=1), for builds that
cannot evaluate a batch on this machine.

On the 2026-12-02 (sixth session) VM, the default llama-cpp-python build (-march=native, with ggml's
AMX backend) is killed by a general-protection fault at its first batched evaluation (`ldtilecfg`:
the VM lists AMX in /proc/cpuinfo but does not let it run), so `localchat bench --compare
llama-cpp` cannot use it. Decoding one token at a time still works, and it is how this script
measures that build's decode speed next to a build without AMX:

    python benchmarks/llama_token_by_token.py MODEL.gguf [--prompt 128] [--tokens 128]
    PYTHONPATH=/path/to/amx/build python benchmarks/llama_token_by_token.py MODEL.gguf

Prints one JSON line: the decode tok/s of each of three rounds.
"""

from __future__ import annotations

import argparse
import json
import time

from llama_cpp import Llama


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--prompt", type=int, default=128, help="prompt tokens (fed one by one)")
    parser.add_argument("--tokens", type=int, default=128, help="decoded tokens per round")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    llm = Llama(
        args.model, n_threads=args.threads, n_batch=1, n_ubatch=1, n_ctx=1024, verbose=False
    )
    prompt = list(range(1000, 1000 + args.prompt))
    rounds = []
    for _ in range(3):
        llm.reset()
        llm.eval(prompt)
        start = time.perf_counter()
        for i in range(args.tokens):
            llm.eval([1000 + (i * 7) % 5000])
        rounds.append(args.tokens / (time.perf_counter() - start))
    print(json.dumps({"model": args.model, "decode_tok_s": rounds}))


if __name__ == "__main__":
    main()
