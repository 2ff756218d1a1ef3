"""One-shot GPU check for the Triton/CUDA path: kernel tests, the quantized (W4A16/W8A16) linear
against its reference and a bf16 matmul, logits parity with HF transformers, and the G1/G2 workloads
of DESIGN.md for localchat and HF in the same run, printed as one table.

    # on a CUDA machine (about 5 minutes on an H200)
    python benchmarks/gpu_check.py
    # dry run of every step on the CPU, tiny model
    python benchmarks/gpu_check.py --device cpu --tiny
    # just the quantized linear (under a minute)
    python benchmarks/gpu_check.py --quant-linear-only

Weights are random (the qwen3-0.6b config from ../shared/models), drawn once by transformers and
saved, so both engines load the very same bf16 weights from disk.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED_CONFIG = next(
    p
    for p in (
        ROOT.parent / "shared" / "models" / "qwen3-0.6b" / "config.json",
        ROOT / "tests" / "data" / "models" / "qwen3-0.6b" / "config.json",
    )
    if p.is_file()
)
G1_FLOOR, G2_FLOOR = 37_500.0, 3_600.0  # memory-bound floors on one H200 (issue #3)
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def kernel_tests(device: str) -> tuple[str, bool]:
    env = {**os.environ, "LOCALCHAT_KERNEL_DEVICE": device}
    if device != "cpu":
        env.pop("TRITON_INTERPRET", None)
    result = subprocess.run(
        # the Triton kernels' tests; the C++ CPU kernels' (tests/kernels/cpu) are not for the GPU
        [
            sys.executable,
            "-m",
            "pytest",
            "tests/kernels",
            "--ignore=tests/kernels/cpu",
            "-q",
            "-p",
            "no:cacheprovider",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    if result.returncode != 0:
        print(result.stdout[-6000:], result.stderr[-2000:])
    return (lines[-1] if lines else "no output"), result.returncode == 0


QUANT_SHAPES = [
    ("u4", 32, 4096, 4096),
    ("u4", 32, 14336, 4096),
    ("u8", 16, 4096, 4096),
]  # layout, group, N, K
QUANT_ROWS = (1, 16, 512)


def packed_weight_for(layout: str, group: int, n: int, k: int, device: str):
    """u4: asymmetric int4 (Q4_K-like, quantize_weight); u8 group 16: symmetric around 32
    (Q6_K-like)."""
    import torch

    from localchat.kernels.packed_weight import PackedWeight, quantize_weight

    generator = torch.Generator(device=device).manual_seed(0)
    if layout == "u4":
        dense = torch.randn(n, k, device=device, generator=generator) * 0.02
        return quantize_weight(dense, 4, group)
    codes = torch.randint(0, 64, (n, k), device=device, generator=generator, dtype=torch.uint8)
    scales = (torch.rand(n, k // group, device=device, generator=generator) * 1e-3 + 1e-4).to(
        torch.float16
    )
    return PackedWeight("u8", codes, scales, None, group, zero_point=32, source_type="Q6_K-like")


def seconds(fn, device: str) -> float:
    """Median time of fn: triton's do_bench on CUDA (clears L2 between runs), a few calls on the
    CPU."""
    if device == "cuda":
        import triton.testing

        return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median") / 1e3
    times = []
    for _ in range(3):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return sorted(times)[1]


def quant_linear_check(device: str, tiny: bool) -> list[dict]:
    """triton_quant_linear at real projection shapes: error against x.float() @ dequantize().T
    (relative to max |x| @ |W|.T), time against F.linear of the dequantized weight in the activation
    dtype, and the weight's bytes per second at M = 1. On the CPU (tiny) it runs under Triton's
    interpreter: a dry run, not a timing."""
    import torch
    import torch.nn.functional as F

    from localchat.kernels.triton_quant_linear import triton_quant_linear

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    shapes = (
        list(dict.fromkeys((layout, group, 96, 128) for layout, group, _, _ in QUANT_SHAPES))
        if tiny
        else QUANT_SHAPES
    )
    results = []
    for layout, group, n, k in shapes:
        weight = packed_weight_for(layout, group, n, k, device)
        dense = weight.dequantize()
        dense_lowp = dense.to(dtype)
        for m in QUANT_ROWS if not tiny else (1, 16, 40):
            x = torch.randn(m, k, device=device).to(dtype)
            out = triton_quant_linear(x, weight)
            expected = x.float() @ dense.T
            scale = (x.float().abs() @ dense.abs().T).amax().item()
            error = (out.float() - expected).abs().amax().item() / scale
            ours = seconds(lambda x=x, w=weight: triton_quant_linear(x, w), device)
            theirs = seconds(lambda x=x, w=dense_lowp: F.linear(x, w), device)
            results.append(
                {
                    "layout": layout,
                    "group": group,
                    "n": n,
                    "k": k,
                    "m": m,
                    "rel_error": error,
                    "seconds": ours,
                    "dense_seconds": theirs,
                    "weight_bytes": weight.nbytes,
                    "dense_bytes": dense_lowp.nbytes,
                    "dense_dtype": str(dtype).removeprefix("torch."),
                }
            )
        release(device)
    return results


def quant_linear_rows(
    results: list[dict], device: str
) -> tuple[list[tuple[str, str, str, str]], bool]:
    tolerance = (
        1e-2 if device == "cuda" else 1e-5
    )  # bfloat16 weights and outputs on CUDA; float32 on the CPU
    rows, ok = [], True
    for r in results:
        passed = r["rel_error"] <= tolerance
        ok &= passed
        ours = f"{r['seconds'] * 1e6:,.1f} us"
        theirs = f"{r['dense_dtype']} F.linear {r['dense_seconds'] * 1e6:,.1f} us"
        if r["m"] == 1:
            ours += f", {r['weight_bytes'] / r['seconds'] / 1e9:,.0f} GB/s"
            theirs += f", {r['dense_bytes'] / r['dense_seconds'] / 1e9:,.0f} GB/s"
        verdict = (
            f"{'ok' if passed else 'FAILED'}, err {r['rel_error']:.1e}, "
            f"{r['dense_seconds'] / r['seconds']:.2f}x"
        )
        rows.append(
            (
                f"quant linear {r['layout']}/g{r['group']} {r['n']}x{r['k']} M={r['m']}",
                ours,
                theirs,
                verdict,
            )
        )
    return rows, ok


def quant_linear_step(device: str, tiny: bool) -> tuple[list[dict], str]:
    """Runs quant_linear_check in a child process (on the CPU under TRITON_INTERPRET=1, which must
    be set before the kernel module is imported). Returns the results and, on failure, the child's
    output."""
    env = {**os.environ}
    if device == "cpu":
        env["TRITON_INTERPRET"] = "1"
    else:
        env.pop("TRITON_INTERPRET", None)
    with tempfile.TemporaryDirectory(prefix="localchat-quant-linear-") as tmp:
        path = Path(tmp) / "quant.json"
        command = [
            sys.executable,
            __file__,
            "--device",
            device,
            "--quant-linear-only",
            "--json",
            str(path),
        ]
        result = subprocess.run(
            command + (["--tiny"] if tiny else []),
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
        if not path.is_file():
            return [], result.stdout[-4000:] + result.stderr[-4000:]
        return json.loads(path.read_text())["quant_linear"], ""


def print_table(rows: list[tuple[str, str, str, str]]) -> None:
    header = ("check", "localchat", "peer", "verdict")
    width = [max(len(r[i]) for r in [*rows, header]) for i in range(4)]
    print()
    for row in [header, *rows]:
        print(" | ".join(cell.ljust(w) for cell, w in zip(row, width, strict=True)))


def make_model(directory: Path, tiny: bool, dtype, device: str) -> None:
    """Random bf16 weights for the qwen3-0.6b config (or a tiny variant), saved as safetensors."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config_dict = json.loads(SHARED_CONFIG.read_text())
    if tiny:
        config_dict.update(
            hidden_size=128,
            intermediate_size=256,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=32,
        )
    (directory / "config.json").write_text(json.dumps(config_dict))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(directory), dtype=dtype)
    model.save_pretrained(directory, safe_serialization=True)
    del model


def parity(directory: Path, device: str, dtype_name: str) -> dict:
    """Engine logits vs HF logits on the same weights: max/mean abs difference and top-1
    agreement."""
    import torch
    from transformers import AutoModelForCausalLM

    from localchat import LLM

    llm = LLM(
        str(directory), dtype=dtype_name, device=device, max_model_len=2048, kv_cache_memory="2GiB"
    )
    hf = (
        AutoModelForCausalLM.from_pretrained(directory, dtype=llm.engine.runtime.dtype)
        .to(device)
        .eval()
    )
    generator = torch.Generator().manual_seed(1)
    worst, mean_diffs, agree, total = 0.0, [], 0, 0
    for length in (17, 200, 700):
        prompt = torch.randint(
            0, llm.engine.runner.spec.vocab_size, (length,), generator=generator
        ).tolist()
        ours = llm.engine.prompt_logits(prompt)
        with torch.inference_mode():
            theirs = hf(torch.tensor([prompt], device=device)).logits[0].float()
        diff = (ours - theirs).abs()
        worst = max(worst, diff.max().item())
        mean_diffs.append(diff.mean().item())
        agree += (ours.argmax(-1) == theirs.argmax(-1)).sum().item()
        total += length
    scale = theirs.abs().mean().item()
    del llm, hf
    torch.cuda.empty_cache() if device == "cuda" else None
    return {
        "max_abs": worst,
        "mean_abs": sum(mean_diffs) / len(mean_diffs),
        "logit_scale": scale,
        "top1_agreement": agree / total,
    }


def engine_run(
    directory: Path, workload, device: str, dtype_name: str, num_requests: int | None = None
):
    from localchat.bench.offline import model_target, run_engine, warm_up
    from localchat.bench.records import figures
    from localchat.bench.workloads import allowed_token_ids, random_requests
    from localchat.config import EngineConfig
    from localchat.engine.core.llm_engine import LLMEngine

    config = EngineConfig(
        model=str(directory),
        dtype=dtype_name,
        device=device,
        max_model_len=workload.input_len[1] + workload.output_len[1] + 16,
    )
    started = time.perf_counter()
    engine = LLMEngine(config)
    load_s = time.perf_counter() - started
    requests = random_requests(
        workload, allowed_token_ids(engine.runner.spec.vocab_size), config.seed
    )
    warm_up(engine, list(range(100, 108)))
    result = run_engine(engine, requests[:num_requests] if num_requests else requests)
    target = model_target(engine)
    info = {
        "load_s": load_s,
        "kv_blocks": engine.block_manager.num_blocks,
        "graphs": engine.runner.graphs.max_batch_size if engine.runner.graphs else 0,
    }
    del engine
    return figures(result, workload.kind), target, requests, info


def hf_run(target, workload, requests, batch_size: int):
    from localchat.bench.peer_hf import HFPeer
    from localchat.bench.records import figures

    peer = HFPeer(target)
    peer.warm_up()
    result = peer.run(requests, batch_size)
    del peer
    return figures(result, workload.kind)


def release(device: str) -> None:
    import gc

    gc.collect()
    if device == "cuda":
        import torch

        torch.cuda.empty_cache()


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cuda")
    parser.add_argument(
        "--tiny", action="store_true", help="a 2-layer model and small workloads (CPU dry run)"
    )
    parser.add_argument("--skip-kernels", action="store_true")
    parser.add_argument(
        "--quant-linear-only",
        action="store_true",
        help="run only the quantized linear check in this process (CPU: needs TRITON_INTERPRET=1)",
    )
    parser.add_argument(
        "--hf-g1-requests",
        type=int,
        default=64,
        help="HF runs the first N requests of G1 (one batch of 64 takes ~1 minute)",
    )
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()

    import torch

    from localchat.bench.workloads import WORKLOADS

    device = args.device
    dtype_name = "bfloat16" if device == "cuda" else "float32"
    rows: list[tuple[str, str, str, str]] = []
    report: dict = {"date": time.strftime("%Y-%m-%d"), "device": device, "torch": torch.__version__}
    if device == "cuda":
        report["gpu"] = torch.cuda.get_device_name()
    log(f"device {report.get('gpu', device)}, torch {torch.__version__}")
    ok = True

    if args.quant_linear_only:
        report["quant_linear"] = quant_linear_check(device, args.tiny)
        quant_rows, ok = quant_linear_rows(report["quant_linear"], device)
        print_table(quant_rows)
        if args.json:
            Path(args.json).write_text(json.dumps(report, indent=2, default=str))
        return 0 if ok else 1

    if not args.skip_kernels:
        log("kernel tests ...")
        summary, passed = kernel_tests(device)
        ok &= passed
        rows.append(
            ("kernel tests (Triton vs torch reference)", summary, "", "ok" if passed else "FAILED")
        )

    log("quantized linear (Triton W4A16/W8A16) vs reference and a dense matmul ...")
    report["quant_linear"], failure = quant_linear_step(device, args.tiny)
    quant_rows, passed = quant_linear_rows(report["quant_linear"], device)
    if failure:
        print(failure)
        quant_rows, passed = [("quant linear", "did not run", "", "FAILED")], False
    ok &= passed
    rows.extend(quant_rows)

    g1, g2 = WORKLOADS["g1"], WORKLOADS["g2"]
    hf_g1_requests = args.hf_g1_requests
    if args.tiny:
        g1 = replace(g1, num_requests=8, input_len=(16, 64), output_len=(16, 48))
        g2 = replace(g2, input_len=(32, 32), output_len=(40, 40))
        hf_g1_requests = 4
    with tempfile.TemporaryDirectory(prefix="localchat-gpu-check-") as tmp:
        directory = Path(tmp)
        log("random weights for the qwen3-0.6b config ...")
        make_model(
            directory, args.tiny, torch.bfloat16 if device == "cuda" else torch.float32, device
        )

        log("logits parity with HF ...")
        par = parity(directory, device, dtype_name)
        report["parity"] = par
        tolerance = 0.05 * max(par["logit_scale"], 1.0) if device == "cuda" else 1e-3
        parity_ok = par["mean_abs"] <= tolerance and par["top1_agreement"] >= 0.95
        ok &= parity_ok
        rows.append(
            (
                "logits vs HF: max / mean |diff|, top-1 agreement",
                f"{par['max_abs']:.3g} / {par['mean_abs']:.3g}",
                f"{100 * par['top1_agreement']:.1f}% agree",
                "ok" if parity_ok else "FAILED",
            )
        )
        release(device)

        log("G2 (batch-1 decode) localchat ...")
        ours_g2, target, requests, info = engine_run(directory, g2, device, dtype_name)
        release(device)
        log("G2 HF ...")
        hf_g2 = hf_run(target, g2, requests, 1)
        release(device)
        log("G1 (offline throughput) localchat ...")
        ours_g1, target, requests, info_g1 = engine_run(directory, g1, device, dtype_name)
        release(device)
        log(f"G1 HF on the first {hf_g1_requests} requests ...")
        hf_g1 = hf_run(target, g1, requests[:hf_g1_requests], 64)
        release(device)

    report.update(
        g1={"localchat": ours_g1, "hf": hf_g1, "hf_requests": hf_g1_requests, "engine": info_g1},
        g2={"localchat": ours_g2, "hf": hf_g2, "engine": info},
    )
    g2_ours, g2_hf = ours_g2.get("decode_tok_s") or 0.0, hf_g2.get("decode_tok_s") or 0.0
    g1_ours, g1_hf = ours_g1["output_throughput"] or 0.0, hf_g1["output_throughput"] or 0.0
    rows.append(
        (
            "G2 decode tok/s (batch 1)",
            f"{g2_ours:,.0f}",
            f"HF {g2_hf:,.1f}",
            f"{g2_ours / g2_hf:.1f}x HF, {100 * g2_ours / G2_FLOOR:.0f}% of floor"
            if g2_hf
            else "-",
        )
    )
    rows.append(
        (
            f"G1 output tok/s ({g1.num_requests} requests)",
            f"{g1_ours:,.0f}",
            f"HF {g1_hf:,.1f} ({hf_g1_requests} req.)",
            f"{g1_ours / g1_hf:.1f}x HF, {100 * g1_ours / G1_FLOOR:.0f}% of floor"
            if g1_hf
            else "-",
        )
    )
    rows.append(
        (
            "G1 TTFT / TPOT mean (ms)",
            f"{ours_g1['ttft_ms']['mean']:,.0f} / {ours_g1['tpot_ms']['mean']:.1f}",
            f"HF {hf_g1['ttft_ms']['mean']:,.0f} / {hf_g1['tpot_ms']['mean']:.1f}",
            f"{info_g1['kv_blocks']} KV blocks, graphs to {info_g1['graphs']}",
        )
    )

    print_table(rows)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2, default=str))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
