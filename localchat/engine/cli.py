"""The engine's commands: `localchat generate PROMPT`, one reply streamed to stdout (as a chat turn
unless --raw), and `localchat pull`, which downloads a model (models/pull.py) and prepares it for
the engine."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from localchat.cli_options import engine_options, report_errors
from localchat.utils import format_bytes

# when neither the flags nor the model's generation_config.json choose
CLI_FALLBACK = {"temperature": 0.7, "top_p": 0.95}


@engine_options
def generate(
    prompt: Annotated[
        str,
        typer.Argument(help="The message (or, with --raw, the text to continue); - reads stdin"),
    ],
    model: Annotated[
        str | None,
        typer.Option(
            "--model",
            "-m",
            help="A name from `localchat list`, model directory, .gguf file or hub id "
            "(default: the embedded SmolLM2-135M-Instruct)",
        ),
    ] = None,
    max_tokens: Annotated[
        int, typer.Option("--max-tokens", "-n", help="Most tokens to generate")
    ] = 256,
    temperature: Annotated[
        float | None,
        typer.Option("--temperature", "-t", help="0 = greedy (default: the model's, else 0.7)"),
    ] = None,
    top_p: Annotated[
        float | None, typer.Option("--top-p", help="(default: the model's, else 0.95)")
    ] = None,
    sampling_seed: Annotated[
        int | None, typer.Option("--sampling-seed", help="Seed for this reply")
    ] = None,
    raw: Annotated[
        bool,
        typer.Option("--raw", help="Continue the text instead of answering it as a chat message"),
    ] = False,
    system: Annotated[str | None, typer.Option("--system", help="System prompt")] = None,
    engine_config=None,
) -> None:
    """Generate one reply to PROMPT with the in-process engine, streamed as it is produced."""
    from localchat.engine.distributed.torchrun import join_torchrun
    from localchat.engine.llm import LLM
    from localchat.engine.sampling.sampling_params import SamplingParams

    engine_config = join_torchrun(engine_config)  # under torchrun, ranks > 0 serve rank 0 and exit
    if prompt == "-":
        prompt = sys.stdin.read()
    llm = LLM(config=engine_config)
    sampling = llm.engine.model_info.generation_defaults.resolve(
        {"temperature": temperature, "top_p": top_p}, fallback=CLI_FALLBACK
    )
    params = SamplingParams(**sampling, max_tokens=max_tokens, seed=sampling_seed)
    if raw:
        token_ids = llm.engine.tokenize(prompt)
    else:
        messages = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": prompt}
        ]
        token_ids = llm.render_chat(messages)
    engine = llm.engine
    engine.add_request("generate", token_ids, params)
    while engine.has_unfinished():
        for output in engine.step():
            sys.stdout.write(output.outputs[0].text)
            sys.stdout.flush()
    sys.stdout.write("\n")


@report_errors
def pull(
    model: Annotated[
        str | None,
        typer.Argument(
            help="OWNER/REPO (safetensors), OWNER/REPO:QUANT or OWNER/REPO:FILE.gguf; "
            "nothing for the default model"
        ),
    ] = None,
) -> None:
    """Download a model from the Hugging Face hub (HF_ENDPOINT, HF_TOKEN) into its cache: resumed
    when interrupted, checked against the hub's checksums."""
    from localchat.engine.loading.model_cache import ensure_converted

    if model is None:
        from localchat.models.default_model import DEFAULT_MODEL_NAME, pull_default_model

        path = pull_default_model()
        ensure_converted(path)
        typer.echo(f"{DEFAULT_MODEL_NAME}: {path}")
        return
    from localchat.models.names import parse_hub_ref
    from localchat.models.pull import pull as pull_model
    from localchat.models.registry import entries

    ref = parse_hub_ref(model)
    try:
        pulled = pull_model(ref)
    except KeyboardInterrupt:
        typer.secho(f"interrupted; `localchat pull {model}` resumes", err=True)
        raise typer.Exit(130) from None
    if pulled.plan.kind == "gguf":
        ensure_converted(pulled.path)
    name = next((e.name for e in entries() if e.path == pulled.path), model)
    size = format_bytes(pulled.plan.total_bytes)
    images = f", its image encoder {pulled.plan.mmproj}" if pulled.plan.mmproj else ""
    typer.echo(f"pulled {name} ({ref}, {size}{images}): localchat chat {name}")
