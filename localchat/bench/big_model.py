"""C4, a big model on the CPU (and C7, an agent's long prompt on the same file): localchat and
llama.cpp on the same GGUF file (by default a random-weight Llama-3.1-8B-shaped Q4_K_M file made
once by make_gguf), each loaded in a process of its own, then taking turns.

Figures per system: decode tok/s and TTFT (as C1), load time (model construction, from a warm page
cache) and peak RSS (the child's VmHWM: a bare Python or torch runtime plus the model; memory-mapped
weights count as they are touched). The file is read once before the first system loads so neither
pays for the disk, and memory is touched and freed right before each system loads so both start
alike (`_prime_memory`).

Both stay loaded, and the systems take turns for the workload's rounds, each round on fresh
requests and in the other order than the last. The ratio is the median of the rounds' ratios: on a
VM the host may move the two CPUs between cores that share an L3 and cores that do not from one
minute to the next, and the speeds move with it (docs/benchmarks-history.md, 2026-12-05), so two
systems measured minutes apart, each in a single run, compare two draws of the host. Before and
after each run, the round trip of a cache line between two CPUs says where the host put them
(`host.py`).

C7 adds the KV cache's bytes for the run's context (`kv_bytes.py`): its dtype's, float16's and
q8_0's.
"""

from __future__ import annotations

import mmap
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from localchat.bench import progress
from localchat.bench.host import core_round_trip_ns
from localchat.bench.isolated import IsolatedSystem
from localchat.bench.isolated_child import IsolatedSpec
from localchat.bench.kv_bytes import gguf_kv_shape, kv_note, kv_record
from localchat.bench.records import RunResult, figures, ratio
from localchat.bench.runner import BenchOutcome
from localchat.bench.workloads import Workload, random_requests
from localchat.errors import InvalidParameterError, LocalchatError

DEFAULT_THREADS = 2  # DESIGN.md: C4 runs on 2 threads
PRIME_EXTRA = 512 << 20  # memory primed beyond the file and the KV pool, for the runtime itself
RANDOM_FILE_VERSION = 1  # bump when make_gguf writes different files, so a cached one is made again
# GGUF tokenizer.ggml.token_type of an ordinary token (not control, byte, unused ...)
_NORMAL_TOKEN = 1


def random_file_path(workload: Workload) -> Path:
    from localchat.models.paths import cache_root

    if workload.random_gguf is None:
        raise ValueError(f"{workload.name} names no random-weight file")
    preset, quant = workload.random_gguf
    return cache_root() / "bench" / f"random-{preset}-{quant}-v{RANDOM_FILE_VERSION}.gguf"


def bench_file(
    model: str | None, gguf: str | None, workload: Workload, show_progress: bool
) -> Path:
    """FILE (MODEL or --gguf) when given; else the workload's random file, made on first use (also
    at a --gguf path that does not exist yet)."""
    if model is not None:
        path = Path(model)
        if path.suffix != ".gguf" or not path.is_file():
            raise InvalidParameterError(
                f"{workload.name} runs a GGUF file: {model} is not one", param="model"
            )
        return path
    if workload.random_gguf is None:
        raise InvalidParameterError(f"{workload.name} needs a GGUF FILE", param="model")
    path = Path(gguf) if gguf else random_file_path(workload)
    if not path.is_file():
        from localchat.bench.gguf_shapes import resolve_shape
        from localchat.bench.random_gguf import write_random_gguf

        preset, quant = workload.random_gguf
        with progress.status(
            show_progress,
            f"writing a random-weight {preset} {quant} GGUF to {path} "
            "(first run only, one to two minutes) ...",
        ):
            write_random_gguf(path, resolve_shape(preset), quant)
    return path


def gguf_vocabulary(path: Path) -> tuple[str, list[int]]:
    """The file's general.name and the ordinary tokens of its vocabulary (control, byte and unused
    tokens excluded)."""
    from localchat.models.gguf_header import read_header

    metadata = read_header(path, arrays=True).metadata
    types = metadata.get("tokenizer.ggml.token_type")
    if not isinstance(types, list):
        raise LocalchatError(f"{path.name}: no tokenizer in the GGUF metadata")
    name = metadata.get("general.name", path.stem)
    return name, [i for i, kind in enumerate(types) if kind == _NORMAL_TOKEN]


def kv_pool_bytes(path: Path, tokens: int, block_size: int, element_size: float) -> int:
    """The bytes of a KV pool of `tokens` tokens (whole blocks) of `element_size` bytes a value
    (q8_0: 34 / 32) for the GGUF at `path`."""
    shape = gguf_kv_shape(path)
    blocks = -(-tokens // block_size)
    values = blocks * block_size * 2 * shape.layers * shape.kv_heads * shape.head_dim
    return int(values * element_size)


def _warm_page_cache(path: Path) -> None:
    with open(path, "rb", buffering=0) as f:
        while f.read(64 << 20):
            pass


def _available_memory() -> int | None:
    """MemAvailable of /proc/meminfo in bytes (None where there is none: not Linux)."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _prime_memory(nbytes: int, keep: int) -> None:
    """Touch `nbytes` of fresh memory and free it, right before each system starts, so both start
    alike; at most what the machine has available beyond `keep` bytes (the model file's pages in
    the page cache, which priming must not evict, nor run out of memory: on the C5 file, 18 GB of
    24, the first system's child and the priming together were killed for memory).

    Without it the second system always started right after the first had freed its
    memory, and on a VM whose memory balloon hands free memory back to the host that matters: on
    the 8B file (2026-12-05) llama.cpp loaded in 2.9-3.7 s right after localchat, 4.8 s after 30 s
    idle and 5.8-8.8 s after a minute or more. Priming does not make either fast (the host's state
    moves loads by 2-4x within minutes); it gives both the same start."""
    available = _available_memory()
    if available is not None:
        nbytes = min(nbytes, available - keep - (1 << 30))
    if nbytes <= 0:
        return
    try:
        block = np.empty(nbytes, dtype=np.uint8)
    except MemoryError:  # the system's own allocation then says what is wrong
        return
    block[:: mmap.PAGESIZE] = 0
    del block


def run_big_model(
    config,
    workload: Workload,
    peers: list[str],
    *,
    gguf: str | None,
    show_progress: bool,
    hf_batch_size: int | None = None,
    systems: list[str] | None = None,
) -> BenchOutcome:
    """localchat, then llama.cpp (whether or not --compare names it), each in its own process.
    `systems` narrows the run (e.g. to llama.cpp alone while localchat cannot hold the model)."""
    from localchat.bench.peer_llama_cpp import INSTALL_HINT, llama_cpp_available
    from localchat.engine.core.runtime import pool_dtype

    del hf_batch_size  # same signature as run_offline; the HF peer has no place here
    if "hf" in peers:
        raise InvalidParameterError(
            f"{workload.name} compares with llama.cpp only (transformers would hold the "
            "model in float32)",
            param="compare",
        )
    systems = list(systems or ["localchat", "llama.cpp"])
    notes = []
    if "llama.cpp" in systems and not llama_cpp_available():
        systems.remove("llama.cpp")
        notes.append(f"llama.cpp skipped: llama-cpp-python is not installed ({INSTALL_HINT})")
        progress.STDERR.print(f"note: {notes[-1]}", style="yellow", markup=False)
    path = bench_file(config.model, gguf, workload, show_progress)
    with progress.status(
        show_progress, f"reading {path.name} ({path.stat().st_size / 2**30:.1f} GiB) ..."
    ):
        name, token_ids = gguf_vocabulary(path)
        # fresh requests each round, so no prefix cache serves one round from another
        rounds_requests = [
            random_requests(workload, token_ids, config.seed + index)
            for index in range(workload.rounds)
        ]
        _warm_page_cache(path)
    threads = config.num_threads or DEFAULT_THREADS
    context = max(len(r.prompt_token_ids) + r.output_len for rs in rounds_requests for r in rs)
    n_ctx = context + 8
    # the context llama.cpp gets too (n_ctx), so neither system sizes a KV cache for 8k tokens it
    # never uses: the KV pool holds the n_ctx tokens of llama.cpp's (the default 1 GiB would hold
    # 4k, and zeroing the rest costs seconds of load where fresh memory is slow to touch)
    engine_config = replace(
        config,
        model=str(path),
        num_threads=threads,
        max_model_len=config.max_model_len or n_ctx,
    )
    kv_dtype = pool_dtype(engine_config, "gguf")
    if engine_config.kv_cache_memory is None:
        from localchat.kernels.kv_quant import kv_row_bytes

        element_size = kv_row_bytes(kv_dtype, 32) / 32
        engine_config.kv_cache_memory = kv_pool_bytes(path, n_ctx, config.block_size, element_size)
    outcome = BenchOutcome(path.name, notes=notes)
    outcome.notes.append(
        f"file: {path} ({path.stat().st_size / 2**30:.2f} GiB, general.name {name!r})"
    )
    if workload.kv_bytes:
        kv = kv_record(gguf_kv_shape(path), context, kv_dtype, config.kv_cache_dtype)
        outcome.record["kv_cache"] = kv
        outcome.notes.append(kv_note(kv))
    children = {}
    rounds: dict[str, list[RoundFigures]] = {system: [] for system in systems}
    try:
        for system in systems:  # loaded one after the other, then all kept loaded
            spec = IsolatedSpec(
                system, str(path), threads, n_ctx, engine_config if system == "localchat" else None
            )
            children[system] = IsolatedSystem(spec, system)
            with progress.status(
                show_progress, f"{system}: loading {path.name} in its own process ..."
            ):
                size = path.stat().st_size
                _prime_memory(size + engine_config.kv_cache_memory + PRIME_EXTRA, keep=size)
                children[system].start()
        for index, requests in enumerate(rounds_requests):
            order = systems if index % 2 == 0 else systems[::-1]
            for system in order:
                with progress.status(
                    show_progress, f"round {index + 1} of {workload.rounds}: {system} ..."
                ):
                    before = core_round_trip_ns()
                    result = children[system].run(requests)
                    after = core_round_trip_ns()
                ran_first = system == order[0]
                rounds[system].append(RoundFigures(index + 1, ran_first, result, before, after))
    finally:
        memory = {system: child.close() for system, child in children.items()}
    for system in systems:
        _add_system(outcome, system, rounds[system], memory[system], children[system], workload)
        _note_memory(outcome, system, threads)
    _compare(outcome, workload)
    return outcome


@dataclass
class RoundFigures:
    """One system's run in one round, with a cache line's round trip between two CPUs (ns) just
    before and after it."""

    index: int
    ran_first: bool
    result: RunResult
    trip_before: float | None
    trip_after: float | None


def _add_system(
    outcome: BenchOutcome,
    system: str,
    rounds: list[RoundFigures],
    memory: dict,
    child: IsolatedSystem,
    workload: Workload,
) -> None:
    """The system's figures over all its rounds, each round's own under "rounds"."""
    results = [r.result for r in rounds]
    combined = RunResult(
        system,
        child.label,
        [record for result in results for record in result.records],
        sum(result.duration for result in results),
        {**(results[-1].engine or {}), **memory} if results else memory,
        notes=[note for result in results for note in result.notes],
    )
    if child.error is not None:
        combined.notes.append(f"{system}: {child.error}")
    fig = outcome.add(system, combined, workload.kind)
    per_round = []
    for r in rounds:
        one = figures(r.result, workload.kind)
        entry: dict = {
            "round": r.index,
            "ran_first": r.ran_first,
            "decode_tok_s": one.get("decode_tok_s"),
            "ttft_ms": (one.get("ttft_ms") or {}).get("mean"),
        }
        if r.trip_before is not None and r.trip_after is not None:
            entry["core_round_trip_ns"] = {
                "before": round(r.trip_before, 1),
                "after": round(r.trip_after, 1),
            }
        per_round.append(entry)
    fig["rounds"] = per_round


def _note_memory(outcome: BenchOutcome, system: str, threads: int) -> None:
    fig = outcome.results[system]
    if fig.get("load_s") is None:
        return
    split = (
        f"; at the end {fig['rss_anon_end_mib']:,.0f} MiB anonymous"
        f" + {fig['rss_file_end_mib']:,.0f} MiB file-backed"
        if "rss_anon_end_mib" in fig
        else ""
    )
    outcome.notes.append(
        f"{system}: load {fig['load_s']:.2f} s, peak RSS {fig['peak_rss_mib']:,.0f} MiB "
        f"({fig['rss_before_load_mib']:,.0f} MiB before loading{split}), {threads} threads"
    )


def _compare(outcome: BenchOutcome, workload: Workload) -> None:
    """The ratios are the medians of the rounds' ratios: each pairs the two systems' runs on the
    same requests, one right after the other, so both meet the same state of the machine (on a VM,
    the host may place the two CPUs differently from one minute to the next). Decode: ours / the
    peer's (above 1, ours is faster), in `ratios`; TTFT: ours / the peer's (below 1, ours is
    faster), in the record's `ttft_ratios`."""
    ours, peer = outcome.results.get("localchat"), outcome.results.get("llama.cpp")
    if ours is None or peer is None:
        return
    paired, ttfts = [], []
    for mine, theirs in zip(ours["rounds"], peer["rounds"], strict=True):
        value = ratio(mine, theirs, workload.kind)
        ttft = (
            mine["ttft_ms"] / theirs["ttft_ms"] if mine["ttft_ms"] and theirs["ttft_ms"] else None
        )
        if ttft is not None:
            ttfts.append(ttft)
        trips = [
            f"{trip['before']:.0f}-{trip['after']:.0f}"
            for trip in (mine.get("core_round_trip_ns"), theirs.get("core_round_trip_ns"))
            if trip
        ]
        if value is not None:
            paired.append(value)
            first = "localchat" if mine["ran_first"] else "llama.cpp"
            where = (
                f"; a cache line's round trip before-after each run {' and '.join(trips)} ns"
                if trips
                else ""
            )
            ttft_ratio = f" = {ttft:.2f}x" if ttft is not None else ""
            outcome.notes.append(
                f"round {mine['round']} ({first} first): decode {mine['decode_tok_s']:.2f} / "
                f"{theirs['decode_tok_s']:.2f} tok/s = {value:.2f}x, TTFT "
                f"{mine['ttft_ms']:,.0f} / {theirs['ttft_ms']:,.0f} ms{ttft_ratio}{where}"
            )
    outcome.ratios["localchat/llama.cpp"] = float(np.median(paired)) if paired else None
    outcome.record["ttft_ratios"] = {
        "localchat/llama.cpp": float(np.median(ttfts)) if ttfts else None
    }
    parts = []
    if len(paired) > 1:
        parts.append(
            f"decode: median of {len(paired)} rounds' ratios, {min(paired):.2f}-{max(paired):.2f}x"
        )
    for key, name in (("peak_rss_mib", "peak RSS"), ("load_s", "load time")):
        if ours.get(key) and peer.get(key):
            parts.append(f"{name} {ours[key] / peer[key]:.2f}x")
    if ttfts:
        spread = (
            f" (median of {len(ttfts)} rounds' ratios, {min(ttfts):.2f}-{max(ttfts):.2f}x)"
            if len(ttfts) > 1
            else ""
        )
        parts.append(f"TTFT {float(np.median(ttfts)):.2f}x{spread}")
    if parts:
        outcome.notes.append(f"localchat / llama.cpp: {', '.join(parts)}")
