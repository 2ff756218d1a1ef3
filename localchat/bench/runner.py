"""One bench from start to finish: our engine (or a server), then each peer, on the same requests.

Returns the figures of every system, keyed by column name, plus the ratios and notes for the report.
The engine is freed before the peers load, so on a GPU the HF peer gets the memory the KV cache
held.
"""

from __future__ import annotations

import dataclasses
import gc
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from localchat.bench import progress
from localchat.bench.records import RunResult, figures, ratio
from localchat.bench.workloads import (
    BenchRequest,
    Workload,
    allowed_token_ids,
    random_requests,
    user_messages,
)

if TYPE_CHECKING:
    from localchat.bench.online import OnlineOptions

PEERS = {
    "hf": "hf",
    "transformers": "hf",
    "llama-cpp": "llama.cpp",
    "llama.cpp": "llama.cpp",
    "llama_cpp": "llama.cpp",
    "llamacpp": "llama.cpp",
}


@dataclass
class BenchOutcome:
    model: str
    results: dict[str, dict] = field(default_factory=dict)
    ratios: dict[str, float | None] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    # figures for the --json file alone, beside results and ratios (C7's kv_cache, the paired
    # workloads' ttft_ratios)
    record: dict[str, Any] = field(default_factory=dict)

    def add(self, column: str, result: RunResult, kind: str, why_short: str | None = None) -> dict:
        """`why_short`: why the output may fall short of the requested tokens (a text endpoint
        without ignore_eos), for the note."""
        fig = {"label": result.label, **figures(result, kind)}
        self.results[column] = fig
        self.notes.extend(result.notes)
        if fig["output_tokens"] != fig["requested_output_tokens"] and not fig["failures"]:
            self.notes.append(
                f"{column}: {fig['output_tokens']} output tokens for "
                f"{fig['requested_output_tokens']} requested "
                f"({why_short or 'does it honour ignore_eos / max_tokens?'})"
            )
        return fig


def parse_peers(values: list[str] | None) -> list[str]:
    from localchat.errors import InvalidParameterError

    peers: list[str] = []
    for item in (v.strip().lower() for value in values or [] for v in value.split(",")):
        if not item:
            continue
        if item not in PEERS:
            raise InvalidParameterError(
                f"--compare takes hf or llama-cpp, got {item!r}", param="compare"
            )
        if PEERS[item] not in peers:
            peers.append(PEERS[item])
    return peers


def _release_memory() -> None:
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def run_offline(
    config,
    workload: Workload,
    peers: list[str],
    *,
    hf_batch_size: int | None,
    gguf: str | None,
    show_progress: bool,
) -> BenchOutcome:
    from localchat.bench.offline import (
        model_target,
        run_engine,
        run_engine_chat,
        warm_up,
    )
    from localchat.bench.peer_llama_cpp import (
        INSTALL_HINT,
        gguf_for,
        llama_cpp_available,
    )
    from localchat.engine.core.llm_engine import LLMEngine

    notes = []
    if "llama.cpp" in peers and not llama_cpp_available():
        peers = [p for p in peers if p != "llama.cpp"]
        notes.append(f"llama.cpp peer skipped: llama-cpp-python is not installed ({INSTALL_HINT})")
        progress.STDERR.print(f"note: {notes[-1]}", style="yellow", markup=False)
    with progress.status(show_progress, "loading the model ..."):
        engine = LLMEngine(config)
    target = model_target(engine)
    if "llama.cpp" in peers:
        gguf_for(target, gguf)  # a missing GGUF fails now, not after our run
    outcome = BenchOutcome(target.name, notes=notes)
    chat = workload.kind == "chat"
    total = workload.num_requests * workload.output_len[0]
    messages: list[str] = []
    requests: list[BenchRequest] = []
    if chat:
        messages = user_messages(workload, engine.tokenizer, config.seed)
    else:
        token_ids = allowed_token_ids(engine.model_info.vocab_size, engine.tokenizer)
        requests = random_requests(workload, token_ids, config.seed)
        total = sum(r.output_len for r in requests)
    warm_up(engine, list(range(100, 108)))
    with progress.token_progress(show_progress, "localchat", total) as advance:
        if chat:
            result, chat_prompts = run_engine_chat(
                engine, messages, workload.output_len[0], advance
            )
        else:
            result = run_engine(engine, requests, advance)
    ours = outcome.add("localchat", result, workload.kind)
    del engine
    _release_memory()
    for peer_name in peers:
        peer_result = _run_peer(
            peer_name,
            target,
            workload,
            chat_prompts if chat else requests,
            hf_batch_size=hf_batch_size,
            gguf=gguf,
            show_progress=show_progress,
            total=total,
        )
        peer = outcome.add(peer_name, peer_result, workload.kind)
        outcome.ratios[f"localchat/{peer_name}"] = ratio(ours, peer, workload.kind)
    return outcome


def _run_peer(
    name: str, target, workload: Workload, work, *, hf_batch_size, gguf, show_progress, total
) -> RunResult:
    chat = workload.kind == "chat"
    if name == "hf":
        from localchat.bench.peer_hf import HFPeer

        with progress.status(show_progress, "loading the model in transformers ..."):
            peer = HFPeer(target)
            peer.warm_up()
        batch_size = hf_batch_size or (64 if target.device == "cuda" else 8)
        with progress.token_progress(show_progress, "hf", total) as advance:
            return (
                peer.run_chat(work, workload.output_len[0], advance)
                if chat
                else peer.run(work, batch_size, advance)
            )
    from localchat.bench.peer_llama_cpp import LlamaCppPeer, gguf_for

    path = gguf_for(target, gguf)
    if chat:
        n_ctx = max(len(p) for p in work) + workload.output_len[0] + 8
    else:
        n_ctx = max(len(r.prompt_token_ids) + r.output_len for r in work) + 8
    with progress.status(show_progress, "loading the model in llama.cpp ..."):
        llama = LlamaCppPeer(path, target.num_threads, n_ctx)
        llama.warm_up()
    with progress.token_progress(show_progress, "llama.cpp", total) as advance:
        return (
            llama.run_chat(work, workload.output_len[0], advance)
            if chat
            else llama.run(work, advance)
        )


def _online_vocabulary(config) -> tuple[str, list[int], Any]:
    """MODEL's name, the token ids random prompts may use and its tokenizer (or, without one, None
    and its config's vocab_size, as the offline run does), without loading any weights."""
    from localchat.engine.loading.loader import load_hf_config, load_tokenizer, model_files
    from localchat.models.source import resolve_model

    files = model_files(resolve_model(config.model))
    if config.tokenizer is None and not files.has_tokenizer:
        return files.source.name, allowed_token_ids(load_hf_config(files).vocab_size), None
    tokenizer = load_tokenizer(config.tokenizer or files.directory)
    return files.source.name, allowed_token_ids(len(tokenizer), tokenizer), tokenizer


def run_online_bench(
    config,
    workload: Workload,
    options: OnlineOptions,
    *,
    baseline: str | None,
    show_progress: bool,
) -> BenchOutcome:
    from localchat.bench.online import TEXT_ENDPOINTS, run_online
    from localchat.bench.report import load_baseline
    from localchat.errors import InvalidParameterError

    if workload.kind == "chat":
        raise InvalidParameterError("the chat workload (c3) runs offline only", param="workload")
    baseline_fig = load_baseline(baseline) if baseline else None
    name, token_ids, tokenizer = _online_vocabulary(config)
    requests = random_requests(workload, token_ids, config.seed)
    text = TEXT_ENDPOINTS.get(options.endpoint)
    if text is not None:  # the same random ids, decoded: the server re-tokenises them
        if tokenizer is None:
            raise InvalidParameterError(
                f"--endpoint {options.endpoint} sends the prompts as text: MODEL needs a tokenizer",
                param="endpoint",
            )
        requests = [
            dataclasses.replace(r, prompt_text=tokenizer.decode(r.prompt_token_ids))
            for r in requests
        ]
    total = sum(r.output_len for r in requests)
    outcome = BenchOutcome(options.model or name)
    with progress.token_progress(show_progress, "server", total) as advance:
        result = run_online(options, requests, seed=config.seed, advance=advance)
    why_short = f"does {text.path} honour ignore_eos?" if text else None
    server = outcome.add("server", result, workload.kind, why_short)
    if baseline_fig is not None:
        column, fig = baseline_fig
        outcome.results[column] = fig
        outcome.ratios[f"server/{column}"] = ratio(server, fig, workload.kind)
    return outcome
