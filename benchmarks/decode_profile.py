"""Where a CPU decode token's time goes, for a quantized model on the C++ decode stack.

    python benchmarks/decode_profile.py /tmp/c4/llama-8b-q4_k_m.gguf [--tokens 64] [--context N]
        [--json FILE]

Runs one greedy request and times every decode step: the decoder stack (all layers, one C++ call),
the LM head (compute_logits) and the rest of the engine step (scheduling, sampling, detokenizing),
as medians over the steps. A second request runs with DecodeStack.profile on and splits the stack's
time-stamp-counter cycles into its phases (qkv, attention, o, gate/up, down, barrier waits), each
projection with the bytes of weights it reads per token and the rate that makes. `--context N` gives
both requests prompts of N tokens (default: short ones, about 40 tokens), to see what a long
conversation's attention costs.

A diagnostic without a peer: the claims against llama.cpp come from `localchat bench`. Between
processes the same command moves by up to 15% on a ballooned VM (where the weights' memory lands),
so compare variants of a kernel inside one process where you can.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from localchat import LLM, SamplingParams
from localchat.engine.modeling import cpu_decode
from localchat.engine.modeling.decoder import DecoderForCausalLM
from localchat.kernels.packed_weight import PackedWeight

PHASES = ("qkv", "attention", "o", "gate_up", "down", "barrier")


def _weight_bytes(weight: PackedWeight | tuple[PackedWeight, ...]) -> int:
    return sum(p.nbytes for p in (weight if isinstance(weight, tuple) else (weight,)))


def _timed(owner: type, name: str, into: list[float]) -> Callable[[], None]:
    """Wrap owner.name so each call's seconds append to `into`; returns the undo."""
    original = getattr(owner, name)

    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        result = original(*args, **kwargs)
        into.append(time.perf_counter() - start)
        return result

    setattr(owner, name, wrapper)
    return lambda: setattr(owner, name, original)


def _prompt(llm: LLM, text: str, tokens: int | None) -> str | list[int]:
    """`text`, or its token ids repeated to `tokens` of them."""
    if tokens is None:
        return text
    ids = llm.tokenizer.encode(text, add_special_tokens=False)
    return (ids * (tokens // len(ids) + 1))[:tokens]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--context", type=int, help="prompt tokens (default: about 40)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    llm = LLM(args.model)
    model = llm.engine.runner.model
    if not isinstance(model, DecoderForCausalLM) or model.cpu_decode is None:
        raise SystemExit("this model does not run on the C++ decode stack here")
    stack_s: list[float] = []
    head_s: list[float] = []
    step_s: list[float] = []
    undo = [
        _timed(cpu_decode.CpuDecodeStack, "forward", stack_s),
        _timed(DecoderForCausalLM, "compute_logits", head_s),
    ]
    engine_step = llm.engine.step

    def step():
        start = time.perf_counter()
        result = engine_step()
        step_s.append(time.perf_counter() - start)
        return result

    llm.engine.step = step  # type: ignore[method-assign]
    params = SamplingParams(temperature=0, max_tokens=args.tokens, ignore_eos=True)
    llm.generate(["warm up " * 8], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    for series in (stack_s, head_s, step_s):
        series.clear()
    llm.generate([_prompt(llm, "The quick brown fox " * 8, args.context)], params)
    decodes = len(stack_s)
    steps, heads = step_s[-decodes:], head_s[-decodes:]
    ms = {
        "step": statistics.median(steps) * 1e3,
        "stack": statistics.median(stack_s) * 1e3,
        "lm_head": statistics.median(heads) * 1e3,
        "rest": statistics.median(s - a - b for s, a, b in zip(steps, stack_s, heads, strict=True))
        * 1e3,
    }
    llm.engine.step = engine_step  # type: ignore[method-assign]

    stack = model.cpu_decode.stack
    stack_s.clear()
    stack.profile(True)
    profiled = _prompt(llm, "Pack my box with five dozen liquor jugs " * 4, args.context)
    llm.generate([profiled], params)
    cycles = stack.profile(False)
    for restore in undo:
        restore()
    # the counter's rate: the first thread's cycles over the stack calls' wall time (the region is
    # nearly all of a call)
    hz = sum(cycles[0]) / sum(stack_s)
    per_thread = [
        {phase: c / hz / len(stack_s) * 1e3 for phase, c in zip(PHASES, thread, strict=True)}
        for thread in cycles
    ]
    weights = {"qkv": 0, "o": 0, "gate_up": 0, "down": 0}
    for layer in model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        weights["qkv"] += _weight_bytes(attn.qkv_weight)
        weights["o"] += _weight_bytes(attn.o_weight)
        # a mixture of experts reads its top_k experts a token: their mean bytes times top_k
        experts = getattr(mlp, "experts", None)
        share = mlp.moe.top_k / len(experts) if experts is not None else 1.0
        for name in ("gate_up", "down"):
            parts = experts if experts is not None else [mlp]
            read = sum(_weight_bytes(getattr(part, f"{name}_weight")) for part in parts)
            weights[name] += int(read * share)
    print(
        f"decode step {ms['step']:.2f} ms (median over {decodes} steps): stack "
        f"{ms['stack']:.2f}, LM head {ms['lm_head']:.2f}, rest {ms['rest']:.2f}"
    )
    phases = {}
    for phase in PHASES:
        thread_ms = [t[phase] for t in per_thread]
        phases[phase] = {"ms_per_thread": thread_ms}
        line = f"  {phase:9s} " + " / ".join(f"{t:6.2f}" for t in thread_ms) + " ms"
        if phase in weights:
            rate = weights[phase] / (max(thread_ms) / 1e3) / 1e9
            phases[phase] |= {"weight_bytes": weights[phase], "gb_per_s": rate}
            line += f"   {weights[phase] / 1e6:8.1f} MB a token, {rate:5.1f} GB/s"
        print(line)
    if args.json:
        report = {
            "model": args.model,
            "tokens": args.tokens,
            "context": args.context,
            "ms": ms,
            "phases": phases,
        }
        args.json.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
