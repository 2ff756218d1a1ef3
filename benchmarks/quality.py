"""Quality of the quantized CPU path, with numbers: logits against the float32 path, and perplexity
against llama.cpp on the same GGUF file and the same token ids.

    python benchmarks/quality.py [MODEL.gguf] [--text FILE] [--window 512] [--json OUT]

- Logits: our quantized engine (the default) against our float32 path (the GGUF dequantized, which
  equals transformers token for token): top-1 agreement and max/mean KL(float || quantized) over
  every position of the first window.
- Perplexity: non-overlapping windows of `--window` tokens of the text (default: the Declaration of
  Independence, public domain, benchmarks/data/declaration.txt); each token after the first of a
  window is scored. The same token ids go to llama.cpp (llama-cpp-python, `logits_all`), so
  tokenizers play no part.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import time
from pathlib import Path

import torch

DEFAULT_TEXT = Path(__file__).parent / "data" / "declaration.txt"


def windows(ids: list[int], size: int) -> list[list[int]]:
    return [ids[i : i + size] for i in range(0, len(ids) - 1, size) if len(ids[i : i + size]) > 1]


def nll_sum(logits: torch.Tensor, ids: list[int]) -> float:
    """Sum of -log p(token t | tokens before t) over t >= 1, from logits at every position."""
    logprobs = logits[:-1].float().log_softmax(dim=-1)
    return -logprobs.gather(1, torch.tensor(ids[1:]).unsqueeze(1)).sum().item()


def engine_logits(llm, ids: list[int]) -> torch.Tensor:
    return llm.engine.prompt_logits(ids)


def llama_cpp_perplexity(path: str, chunks: list[list[int]], window: int, threads: int) -> float:
    import numpy as np
    from llama_cpp import Llama

    model = Llama(
        model_path=path,
        n_ctx=window,
        n_batch=window,
        logits_all=True,
        n_threads=threads,
        verbose=False,
    )
    total, count = 0.0, 0
    for chunk in chunks:
        model.reset()
        model.eval(chunk)
        logits = torch.from_numpy(np.array(model.scores[: len(chunk)], dtype=np.float32))
        total += nll_sum(logits, chunk)
        count += len(chunk) - 1
    return math.exp(total / count)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "model", nargs="?", default=None, help="a GGUF file (default: the embedded default model)"
    )
    parser.add_argument("--text", default=str(DEFAULT_TEXT))
    parser.add_argument("--window", type=int, default=512)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--kv-cache-dtype", default="auto", help="the quantized engine's KV pool (auto: float16)"
    )
    parser.add_argument("--no-llama-cpp", action="store_true", help="skip the llama.cpp peer")
    parser.add_argument("--json", default=None, help="write the figures here")
    args = parser.parse_args()

    from localchat import LLM
    from localchat.kernels.kv_quant import kv_dtype_name
    from localchat.models.default_model import pull_default_model

    path = args.model or str(pull_default_model())
    quantized = LLM(path, num_threads=args.threads, kv_cache_dtype=args.kv_cache_dtype)
    reference = LLM(path, num_threads=args.threads, quantization="none")
    ids = quantized.engine.tokenize(Path(args.text).read_text())
    chunks = windows(ids, args.window)

    started = time.perf_counter()
    q_logits, f_logits = engine_logits(quantized, chunks[0]), engine_logits(reference, chunks[0])
    agreement = (q_logits.argmax(-1) == f_logits.argmax(-1)).float().mean().item()
    kl = torch.nn.functional.kl_div(
        q_logits.log_softmax(-1), f_logits.log_softmax(-1), log_target=True, reduction="none"
    ).sum(-1)
    results = {
        "model": Path(path).name,
        "tokens": len(ids),
        "window": args.window,
        "kv_cache_dtype": kv_dtype_name(quantized.engine.runner.kv_cache_dtype),
        "windows": len(chunks),
        "logits_positions": len(chunks[0]),
        "top1_agreement": agreement,
        "max_kl": kl.max().item(),
        "mean_kl": kl.mean().item(),
    }
    for name, llm in (("localchat_quantized", quantized), ("localchat_float32", reference)):
        total = sum(nll_sum(engine_logits(llm, chunk), chunk) for chunk in chunks)
        results[f"ppl_{name}"] = math.exp(total / sum(len(c) - 1 for c in chunks))
    if not args.no_llama_cpp:
        results["ppl_llama_cpp"] = llama_cpp_perplexity(path, chunks, args.window, args.threads)
        results["ppl_ratio_localchat_vs_llama_cpp"] = (
            results["ppl_localchat_quantized"] / results["ppl_llama_cpp"]
        )
    results.update(
        seconds=round(time.perf_counter() - started, 1),
        machine=platform.processor() or platform.machine(),
        date=time.strftime("%Y-%m-%d"),
        torch=torch.__version__,
    )
    print(json.dumps(results, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
