"""Engine flags shared by every command that loads a model (generate, chat, serve, bench)."""

from __future__ import annotations

import functools
import inspect
import sys
import typing
from typing import Annotated, Any

import typer

from localchat.config import EngineConfig
from localchat.errors import LocalchatError

_PANEL = "Engine options"


def option(panel: str, *names: str, help: str, **kwargs) -> Any:
    """A command-line option (typer.Option) listed under the `panel` heading of --help."""
    return typer.Option(*names, help=help, rich_help_panel=panel, **kwargs)


# name -> (annotation, default): each becomes a keyword-only CLI option of the decorated command.
ENGINE_PARAMETERS: dict[str, tuple] = {
    "dtype": (
        Annotated[
            str,
            option(
                _PANEL,
                "--dtype",
                help="auto (float32 on CPU, bfloat16 on CUDA), float32, float16, bfloat16",
            ),
        ],
        "auto",
    ),
    "device": (Annotated[str, option(_PANEL, "--device", help="auto, cpu or cuda")], "auto"),
    "max_model_len": (
        Annotated[
            int | None,
            option(
                _PANEL,
                "--max-model-len",
                help="Context length (default: the model's, at most 8192 on CPU)",
            ),
        ],
        None,
    ),
    "max_num_seqs": (
        Annotated[int | None, option(_PANEL, "--max-num-seqs", help="Most sequences in one batch")],
        None,
    ),
    "max_num_batched_tokens": (
        Annotated[
            int | None,
            option(
                _PANEL,
                "--max-num-batched-tokens",
                help="Token budget of one step (prefill chunk size)",
            ),
        ],
        None,
    ),
    "kv_cache_memory": (
        Annotated[
            str | None,
            option(_PANEL, "--kv-cache-memory", help="KV cache size, e.g. 512MiB or 4GiB"),
        ],
        None,
    ),
    "kv_cache_dtype": (
        Annotated[
            str,
            option(
                _PANEL,
                "--kv-cache-dtype",
                help="auto (float16 for quantized weights on CPU, else the model's dtype), "
                "float32, float16, bfloat16, q8_0 (CPU: 0.53x of float16's bytes), fp8 (CUDA)",
            ),
        ],
        "auto",
    ),
    "gpu_memory_utilization": (
        Annotated[
            float,
            option(_PANEL, "--gpu-memory-utilization", help="Fraction of GPU memory to use (CUDA)"),
        ],
        0.9,
    ),
    "block_size": (Annotated[int, option(_PANEL, "--block-size", help="Tokens per KV block")], 16),
    "enable_prefix_caching": (
        Annotated[
            bool,
            option(
                _PANEL,
                "--prefix-caching/--no-prefix-caching",
                help="Reuse the KV of shared prompt prefixes",
            ),
        ],
        True,
    ),
    "enforce_eager": (
        Annotated[bool, option(_PANEL, "--enforce-eager", help="Disable CUDA graphs")],
        False,
    ),
    "load_format": (
        Annotated[
            str,
            option(
                _PANEL, "--load-format", help="auto, or dummy for random weights from config.json"
            ),
        ],
        "auto",
    ),
    "quantization": (
        Annotated[
            str,
            option(
                _PANEL,
                "--quantization",
                help="auto (GGUF stays quantized), none (dequantize), "
                "int8 or int4 (weight-only, group 32, for dense checkpoints)",
            ),
        ],
        "auto",
    ),
    "chat_template": (
        Annotated[
            str | None,
            option(
                _PANEL, "--chat-template", help="Jinja chat template file overriding the model's"
            ),
        ],
        None,
    ),
    "tokenizer": (
        Annotated[
            str | None,
            option(_PANEL, "--tokenizer", help="Tokenizer directory (default: the model's)"),
        ],
        None,
    ),
    "mmproj": (
        Annotated[
            str | None,
            option(
                _PANEL,
                "--mmproj",
                help="llama.cpp's image encoder (mmproj GGUF) of a GGUF model (default: the one "
                "beside it in its directory or pulled repo; none: no images)",
            ),
        ],
        None,
    ),
    "seed": (
        Annotated[
            int, option(_PANEL, "--seed", help="Seed for random weights and unseeded sampling")
        ],
        0,
    ),
    "num_threads": (
        Annotated[int | None, option(_PANEL, "--threads", help="CPU threads for torch")],
        None,
    ),
    "tensor_parallel_size": (
        Annotated[
            int,
            option(
                _PANEL,
                "--tensor-parallel-size",
                "-tp",
                help="Ranks to split the model over (one process each; gloo on CPU, NCCL on CUDA)",
            ),
        ],
        1,
    ),
    "speculative_config": (
        Annotated[
            str | None,
            option(
                _PANEL,
                "--speculative-config",
                help="Speculative decoding as vLLM takes it, a JSON object: "
                '\'{"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4}\' '
                '(methods ngram, suffix, draft_model with "model": a small model with the same '
                "tokenizer)",
            ),
        ],
        None,
    ),
}


def report_errors(func):
    """Turn a LocalchatError into a one-line message and exit status 2, never a traceback."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except LocalchatError as exc:
            typer.secho(f"error: {exc.message}", fg=typer.colors.RED, err=True)
            raise typer.Exit(2) from None
        except KeyboardInterrupt:
            raise typer.Exit(130) from None

    return wrapper


def engine_options(func):
    """Give a command the engine flags; it receives them as `engine_config: EngineConfig` (built
    from its `model` argument and the flags) and must not declare them itself."""
    signature = inspect.signature(func)
    # resolve string annotations in func's module
    hints = typing.get_type_hints(func, include_extras=True)
    own = [
        p.replace(annotation=hints.get(name, p.annotation))
        for name, p in signature.parameters.items()
        if name != "engine_config"
    ]
    extra = [
        inspect.Parameter(
            name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation, default=default
        )
        for name, (annotation, default) in ENGINE_PARAMETERS.items()
    ]

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        engine_kwargs = {name: kwargs.pop(name) for name in ENGINE_PARAMETERS}
        kwargs["engine_config"] = EngineConfig(model=kwargs.get("model"), **engine_kwargs)
        return func(*args, **kwargs)

    # what typer (through inspect.signature) reads; functools.wraps' type does not declare it
    wrapper.__signature__ = signature.replace(parameters=own + extra)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {p.name: p.annotation for p in own + extra}
    return report_errors(wrapper)


def stdin_is_tty() -> bool:
    return sys.stdin.isatty() and sys.stdout.isatty()
