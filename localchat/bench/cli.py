"""`localchat bench [MODEL]`: throughput and latency of this machine, side by side with the
peers."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Annotated

import typer

from localchat import envs
from localchat.cli_options import engine_options, option

_W, _P, _O, _R = "Workload", "Peers (offline mode)", "Online mode", "Output"


def _apply_workload_model(config, workload, online: bool):
    """G1/G2 name their model, dummy weights and bf16: use them where the user chose nothing
    else."""
    from localchat.errors import InvalidParameterError

    if workload.model is None:
        return config
    changes = {}
    if config.model is None:
        if not Path(workload.model).exists():
            raise InvalidParameterError(
                f"{workload.name} is defined on {workload.model} (not found from here): pass MODEL",
                param="model",
            )
        changes["model"] = workload.model
    if online:
        return dataclasses.replace(config, **changes) if changes else config
    if config.load_format == "auto" and workload.load_format:
        changes["load_format"] = workload.load_format
    if config.dtype == "auto" and workload.dtype:
        changes["dtype"] = workload.dtype
    return dataclasses.replace(config, **changes) if changes else config


def _command_line() -> str:
    """The command as typed (from click's parsed parameters, so it also works in-process), secrets
    masked."""
    import shlex

    import click

    ctx = click.get_current_context(silent=True)
    if ctx is None:
        from localchat.bench.report import command_line

        return command_line()
    parts = ["localchat", "bench"]
    for param in ctx.command.params:
        value = ctx.params.get(param.name)
        if value is None or value == param.default or value == ():
            continue
        if param.name == "api_key":
            value = "***"
        if isinstance(param, click.Argument):
            parts.append(shlex.quote(str(value)))
        elif getattr(param, "is_flag", False):
            parts.append(param.opts[0] if value else param.secondary_opts[0])
        else:
            for item in value if isinstance(value, (list, tuple)) else [value]:
                parts += [param.opts[0], shlex.quote(str(item))]
    return " ".join(parts)


@engine_options
def bench(
    model: Annotated[
        str | None,
        typer.Argument(
            help="Model directory, .gguf file or hub id (default: the embedded "
            "SmolLM2-135M-Instruct); with --url only its tokenizer is used"
        ),
    ] = None,
    workload: Annotated[
        str,
        option(
            _W,
            "--workload",
            "-w",
            help="Named workload of docs/benchmarks.md: g1, g2, c1, c2, c3, c4, c5, c7 "
            "(c7: C4's file, an 8,192-token prompt then 256 tokens, KV bytes)",
        ),
    ] = "c2",
    num_requests: Annotated[
        int | None,
        option(_W, "--num-requests", "-n", help="Requests (c3: turns) instead of the workload's"),
    ] = None,
    input_len: Annotated[
        str | None,
        option(_W, "--input-len", help="Prompt length N or MIN:MAX in tokens (c3: user message)"),
    ] = None,
    output_len: Annotated[
        str | None,
        option(_W, "--output-len", help="Output length N or MIN:MAX in tokens (c3: reply)"),
    ] = None,
    rounds: Annotated[
        int | None,
        option(
            _W,
            "--rounds",
            help="c4, c5, c7: rounds in which the systems take turns, each on fresh requests "
            "(default 4; c7: 2); the ratio is the median of the rounds' ratios",
        ),
    ] = None,
    compare: Annotated[
        list[str] | None,
        option(
            _P,
            "--compare",
            "-c",
            help="Peer on the same requests: hf, llama-cpp (repeatable or comma-separated)",
        ),
    ] = None,
    hf_batch_size: Annotated[
        int | None,
        option(
            _P, "--hf-batch-size", help="Batch size of the HF peer (default 8 on CPU, 64 on GPU)"
        ),
    ] = None,
    gguf: Annotated[
        str | None,
        option(
            _P,
            "--gguf",
            help="GGUF file for the llama.cpp peer (default: MODEL when it is one); "
            "c4, c5, c7: made there if missing",
        ),
    ] = None,
    url: Annotated[
        str | None,
        option(
            _O,
            "--url",
            help="Benchmark this OpenAI-compatible server (streaming /v1/completions) "
            "instead of the in-process engine",
        ),
    ] = None,
    endpoint: Annotated[
        str,
        option(
            _O,
            "--endpoint",
            help="What the requests stream through: completions (token ids, ignore_eos), "
            "messages (Anthropic's /v1/messages) or responses (OpenAI's /v1/responses); "
            "these two send the prompt as text (and ignore_eos) and count the tokens the "
            "server reports",
        ),
    ] = "completions",
    concurrency: Annotated[
        int | None, option(_O, "--concurrency", help="Most requests in flight (default: all)")
    ] = None,
    request_rate: Annotated[
        float,
        option(
            _O,
            "--request-rate",
            help="Poisson arrival rate in requests/s (default inf: all at once)",
        ),
    ] = math.inf,
    served_model_name: Annotated[
        str | None,
        option(
            _O,
            "--served-model-name",
            help="Model name to send (default: the server's first in /v1/models)",
        ),
    ] = None,
    api_key: Annotated[
        str | None,
        option(
            _O,
            "--api-key",
            envvar=envs.API_KEY.name,
            show_default=False,
            help="Bearer token for the server",
        ),
    ] = None,
    timeout: Annotated[
        float, option(_O, "--timeout", help="Seconds to wait for any one read from the server")
    ] = 600.0,
    baseline: Annotated[
        str | None,
        option(
            _O, "--baseline", help="An offline run's --json file to compare the server with (S1)"
        ),
    ] = None,
    json_path: Annotated[
        str | None,
        option(
            _R,
            "--json",
            help="Also write the figures, machine, versions and command line to this JSON file",
        ),
    ] = None,
    plot: Annotated[
        str | None,
        option(
            _R,
            "--plot",
            help="Also draw throughput and latency into this image "
            "(.png, .svg, .pdf; needs matplotlib)",
        ),
    ] = None,
    plot_with: Annotated[
        list[str] | None,
        option(
            _R,
            "--plot-with",
            help="Earlier runs' --json files to draw with this one "
            "(online runs: against concurrency)",
        ),
    ] = None,
    show_progress: Annotated[
        bool, option(_R, "--progress/--no-progress", help="Show a progress bar on stderr")
    ] = True,
    engine_config=None,
) -> None:
    """Measure throughput and latency (TTFT, TPOT, ITL) on a random-token workload, with peers side
    by side.

    Offline (default): our engine in this process, then --compare hf / llama-cpp on the same
    requests. Online: --url sends the workload to a running server (ours, vLLM, llama.cpp). --seed
    picks the requests.
    """
    from rich.console import Console

    from localchat.bench.big_model import run_big_model
    from localchat.bench.online import OnlineOptions
    from localchat.bench.report import build_payload, print_report, write_json
    from localchat.bench.runner import parse_peers, run_offline, run_online_bench
    from localchat.bench.workloads import select_workload
    from localchat.errors import InvalidParameterError

    if plot:  # fail before the run, not after it
        from localchat.bench.plot import load_payload, plot_runs, require_matplotlib

        earlier = [
            load_payload(path) for path in plot_with or []
        ]  # a bad file is named even without matplotlib
        require_matplotlib()
    chosen = select_workload(workload, num_requests, input_len, output_len, rounds)
    peers = parse_peers(compare)
    if hf_batch_size is not None and hf_batch_size < 1:
        raise InvalidParameterError(
            f"--hf-batch-size must be >= 1, got {hf_batch_size}", param="hf_batch_size"
        )
    workload_info = {**dataclasses.asdict(chosen), "seed": engine_config.seed}
    if url is None and endpoint != "completions":
        raise InvalidParameterError(
            "--endpoint picks a server's endpoint: add --url", param="endpoint"
        )
    config = _apply_workload_model(engine_config, chosen, online=url is not None)
    if url is not None:
        if peers:
            raise InvalidParameterError(
                "--compare runs peers in this process (offline mode); with --url, compare "
                "with an offline run's figures through --baseline FILE",
                param="compare",
            )
        options = OnlineOptions(
            url,
            concurrency=concurrency,
            request_rate=request_rate,
            model=served_model_name,
            api_key=api_key,
            timeout=timeout,
            endpoint=endpoint,
        )
        outcome = run_online_bench(
            config, chosen, options, baseline=baseline, show_progress=show_progress
        )
        workload_info.update(
            url=url,
            endpoint=endpoint,
            concurrency=concurrency,
            request_rate=None if math.isinf(request_rate) else request_rate,
        )
        mode, extra = "online", {}
    else:
        # c4, c5, c7: each system in its own process, taking turns
        run = run_big_model if chosen.isolated else run_offline
        outcome = run(
            config,
            chosen,
            peers,
            hf_batch_size=hf_batch_size,
            gguf=gguf,
            show_progress=show_progress,
        )
        mode, extra = "offline", {"engine_config": dataclasses.asdict(config)}
    extra = {**extra, **outcome.record}
    title = f"localchat bench ({mode}) - {outcome.model} - {chosen.describe()}"
    print_report(Console(), title, outcome.results, outcome.ratios, chosen.kind, outcome.notes)
    payload = build_payload(
        mode=mode,
        workload=workload_info,
        model=outcome.model,
        results=outcome.results,
        ratios=outcome.ratios,
        notes=outcome.notes,
        extra=extra,
        command=_command_line(),
    )
    if json_path:
        write_json(json_path, payload)
    if plot:
        plot_runs([*earlier, payload], plot)
