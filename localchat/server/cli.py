"""`localchat serve [MODEL]`: load the model, then serve the OpenAI-compatible API with uvicorn.

The port is bound before the model loads (a busy port fails at once) and requests are accepted once
it is ready. SIGINT/SIGTERM stop accepting, give running requests `--grace-period` seconds to
finish, then abort the rest, stop the engine and exit 0.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import sqlite3
from pathlib import Path
from typing import Annotated, Any

import typer

from localchat import envs
from localchat.cli_options import engine_options, option
from localchat.engine.sampling import request_limits
from localchat.errors import InvalidParameterError
from localchat.server import request_guard
from localchat.server.parser_choice import chat_parsers
from localchat.server.uvicorn_run import ConnectionLimits

logger = logging.getLogger("localchat.server")
_PANEL = "Server options"
_MODELS = "Several models"


@engine_options
def serve(
    model: Annotated[
        str | None,
        typer.Argument(
            help="Model directory, .gguf file or hub id "
            "(default: the embedded SmolLM2-135M-Instruct)"
        ),
    ] = None,
    host: Annotated[
        str, option(_PANEL, "--host", help="Address to listen on (loopback unless told otherwise)")
    ] = "127.0.0.1",
    port: Annotated[
        int, option(_PANEL, "--port", help="Port to listen on (0: any free port)")
    ] = 8000,
    served_model_name: Annotated[
        str | None,
        option(_PANEL, "--served-model-name", help="Model name in the API (default: the model's)"),
    ] = None,
    api_key: Annotated[
        str | None,
        option(
            _PANEL,
            "--api-key",
            envvar=envs.API_KEY.name,
            show_default=False,
            help="Require 'Authorization: Bearer KEY' on /v1/*, /tokenize, /detokenize, "
            "/metrics and /docs",
        ),
    ] = None,
    api_key_file: Annotated[
        Path | None,
        option(
            _PANEL,
            "--api-key-file",
            help="Read the API key from this file (its first line), so it is not in `ps`",
        ),
    ] = None,
    metrics_without_key: Annotated[
        bool,
        option(
            _PANEL,
            "--metrics-without-key",
            help="Answer /metrics without the API key (for a scraper that has none)",
        ),
    ] = False,
    cors_origin: Annotated[
        list[str] | None,
        option(_PANEL, "--cors-origin", help="Allowed CORS origin (repeatable; '*' for any)"),
    ] = None,
    allowed_hosts: Annotated[
        list[str] | None,
        option(
            _PANEL,
            "--allowed-hosts",
            help="Host names to answer besides localhost, 127.0.0.1 and [::1] (repeatable or "
            "comma-separated; '*': any); others get 403",
        ),
    ] = None,
    allowed_media_domains: Annotated[
        list[str] | None,
        option(
            _PANEL,
            "--allowed-media-domains",
            help="Hosts whose http(s) image URLs the server fetches (repeatable or "
            "comma-separated; exact names; a private address only where listed itself); default: "
            "none, only data: URLs",
        ),
    ] = None,
    limit: Annotated[
        list[str] | None,
        option(
            _PANEL,
            "--limit",
            help="NAME=VALUE: a bound on what one request may carry (repeatable or "
            "comma-separated), e.g. stop_strings=128, grammar_seconds=30; names and defaults "
            "in docs/security.md",
        ),
    ] = None,
    max_waiting: Annotated[
        int,
        option(
            _PANEL,
            "--max-waiting",
            help="Most requests waiting for the batch; beyond it, 503 with Retry-After",
        ),
    ] = 1024,
    grace_period: Annotated[
        float,
        option(
            _PANEL,
            "--grace-period",
            help="Seconds running requests get to finish on SIGINT/SIGTERM",
        ),
    ] = 30.0,
    max_connections: Annotated[
        int,
        option(
            _PANEL,
            "--max-connections",
            help="Most open connections; beyond it, 503 (docs/security.md)",
        ),
    ] = ConnectionLimits.max_connections,
    header_timeout: Annotated[
        float,
        option(
            _PANEL,
            "--header-timeout",
            envvar=envs.HEADER_TIMEOUT.name,
            help="Seconds a client has to send a request's line and headers; then it is cut off",
        ),
    ] = ConnectionLimits.header_timeout,
    body_timeout: Annotated[
        float,
        option(
            _PANEL,
            "--body-timeout",
            envvar=envs.BODY_TIMEOUT.name,
            help="Seconds a client has to send a body; then 408",
        ),
    ] = ConnectionLimits.body_timeout,
    log_level: Annotated[
        str, option(_PANEL, "--log-level", help="debug, info, warning or error")
    ] = "info",
    data_parallel_size: Annotated[
        int,
        option(
            _PANEL,
            "--data-parallel-size",
            "-dp",
            help="Engine replicas, one process each, behind this server (prefix-aware routing)",
        ),
    ] = 1,
    tool_call_parser: Annotated[
        str | None,
        option(
            _PANEL,
            "--tool-call-parser",
            help="hermes, llama3_json, mistral or harmony (default: from the chat template)",
        ),
    ] = None,
    reasoning_parser: Annotated[
        str | None,
        option(
            _PANEL,
            "--reasoning-parser",
            help="qwen3, deepseek_r1 or harmony (default: harmony for a gpt-oss template, "
            "qwen3 when the template has <think>)",
        ),
    ] = None,
    pooling: Annotated[
        str,
        option(_PANEL, "--pooling", help="/v1/embeddings pooling: last (token) or mean"),
    ] = "last",
    responses_store: Annotated[
        Path | None,
        option(
            _PANEL,
            "--responses-store",
            help="SQLite file keeping /v1/responses' stored responses across restarts "
            "(default: in memory)",
        ),
    ] = None,
    models: Annotated[
        str | None,
        option(
            _MODELS,
            "--models",
            help="Serve several models (comma-separated names or paths); the request's model picks",
        ),
    ] = None,
    models_dir: Annotated[
        Path | None,
        option(_MODELS, "--models-dir", help="Serve every .gguf file and model directory in DIR"),
    ] = None,
    max_loaded_models: Annotated[
        int, option(_MODELS, "--max-loaded-models", help="Most models loaded at once")
    ] = 1,
    max_memory: Annotated[
        str | None,
        option(
            _MODELS,
            "--max-memory",
            help="Memory budget of the loaded models (weights + KV cache), e.g. 8GiB",
        ),
    ] = None,
    keep_alive: Annotated[
        str | None,
        option(
            _MODELS,
            "--keep-alive",
            help="How long an idle model stays loaded (default 5m; 0: unload at once, -1: forever)",
        ),
    ] = None,
    allow_client_unload: Annotated[
        bool,
        option(
            _MODELS,
            "--allow-client-unload",
            help="Let a request's keep_alive shorten its model's (0 unloads it when idle); "
            "by default it may only lengthen it",
        ),
    ] = False,
    engine_config=None,
) -> None:
    """Serve MODEL (a model directory, .gguf file or hub id; default: the embedded
    SmolLM2-135M-Instruct) over an OpenAI-compatible HTTP API: chat and completions, SSE streaming,
    tokenize, /metrics, docs at /docs."""
    if not 0 <= port <= 65535:
        raise InvalidParameterError(f"--port must be 0 to 65535, got {port}", param="port")
    if max_waiting < 1:
        raise InvalidParameterError(
            f"--max-waiting must be >= 1, got {max_waiting}", param="max_waiting"
        )
    if grace_period < 0:
        raise InvalidParameterError(
            f"--grace-period must be >= 0, got {grace_period}", param="grace_period"
        )
    api_key = _api_key(api_key, api_key_file)
    if max_connections < 1:
        raise InvalidParameterError(
            f"--max-connections must be >= 1, got {max_connections}", param="max_connections"
        )
    for flag, seconds in (("header_timeout", header_timeout), ("body_timeout", body_timeout)):
        if not seconds > 0:
            raise InvalidParameterError(
                f"--{flag.replace('_', '-')} must be > 0, got {seconds}", param=flag
            )
    if data_parallel_size < 1:
        raise InvalidParameterError(
            f"--data-parallel-size must be >= 1, got {data_parallel_size}",
            param="data_parallel_size",
        )
    chat_parsers(tool_call_parser, reasoning_parser, None)  # bad names fail before loading
    _set_limits(limit)
    from localchat.engine.core.llm_engine import POOLING

    if pooling not in POOLING:
        raise InvalidParameterError(
            f"--pooling must be one of {', '.join(POOLING)}, got {pooling!r}", param="pooling"
        )
    if models is not None or models_dir is not None:
        if model is not None:
            raise InvalidParameterError("give MODEL or --models/--models-dir, not both")
        if data_parallel_size > 1:
            raise InvalidParameterError(
                "--data-parallel-size serves one model; it does not go with --models/--models-dir",
                param="data_parallel_size",
            )
        if engine_config.mmproj not in (None, "none"):
            raise InvalidParameterError(
                "--mmproj names one model's image encoder; with --models/--models-dir each GGUF "
                "model takes the mmproj*.gguf beside it in its directory or pulled repo",
                param="mmproj",
            )
        from localchat.server.multimodel import serve as multi

        served = multi.models_to_serve(models, models_dir)
        budget, keep = multi.check_limits(max_loaded_models, max_memory, keep_alive or "5m")
    elif (
        max_memory is not None
        or keep_alive is not None
        or max_loaded_models != 1
        or allow_client_unload
    ):
        raise InvalidParameterError(
            "--max-loaded-models, --max-memory, --keep-alive and --allow-client-unload go with "
            "--models or --models-dir"
        )
    from localchat.engine.distributed.torchrun import join_torchrun

    several = data_parallel_size > 1 or models is not None or models_dir is not None
    # under torchrun, ranks > 0 serve rank 0 and exit here, before binding the port
    engine_config = join_torchrun(
        engine_config, alone="--data-parallel-size or --models" if several else None
    )
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    from localchat.server.media_fetch import media_domains

    sock = _bind(host, port)
    names = [name.strip() for item in allowed_hosts or () for name in item.split(",")]
    options: dict[str, Any] = {
        "api_key": api_key,
        "metrics_without_key": metrics_without_key,
        "cors_origins": cors_origin or None,
        "hosts": request_guard.allowed_hosts(host, [name for name in names if name]),
        "max_waiting": max_waiting,
        "grace_period": grace_period,
        "log_level": log_level.lower(),
        "parsers": (tool_call_parser, reasoning_parser),
        "pooling": pooling,
        "responses_store": _responses_store(responses_store),
        "limits": ConnectionLimits(max_connections, header_timeout, body_timeout),
        "media_domains": media_domains(allowed_media_domains),
    }
    if models is not None or models_dir is not None:
        asyncio.run(
            multi.serve_models(
                sock,
                engine_config,
                served,
                max_loaded=max_loaded_models,
                max_memory=budget,
                keep_alive=keep,
                allow_client_unload=allow_client_unload,
                **options,
            )
        )
        return
    asyncio.run(
        _serve(
            sock,
            engine_config,
            served_model_name=served_model_name,
            **options,
            data_parallel_size=data_parallel_size,
        )
    )


def _set_limits(items: list[str] | None) -> None:
    """LOCALCHAT_LIMITS with --limit's items over it, checked here (a bad one fails at start-up,
    not in every request) and written back, so the engine's processes read the same."""
    try:
        bounds = request_limits.limits()
    except ValueError as exc:
        raise InvalidParameterError(str(exc)) from None
    given = [part for item in items or () for part in item.split(",") if part.strip()]
    try:
        bounds = request_limits.parse_limits(given, bounds)
    except ValueError as exc:
        raise InvalidParameterError(f"--limit {exc}", param="limit") from None
    envs.LIMITS.set(request_limits.as_setting(bounds))


def _api_key(given: str | None, path: Path | None) -> str | None:
    """The key of --api-key (or LOCALCHAT_API_KEY) or of --api-key-file (its first line, without
    surrounding blanks), not both; None when neither gives one."""
    if path is None:
        return given or None
    if given:
        raise InvalidParameterError(
            "give --api-key (or LOCALCHAT_API_KEY) or --api-key-file, not both",
            param="api_key_file",
        )
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidParameterError(
            f"cannot read --api-key-file {path}: {getattr(exc, 'strerror', None) or exc}",
            param="api_key_file",
        ) from None
    key = lines[0].strip() if lines else ""
    if not key:
        raise InvalidParameterError(
            f"--api-key-file {path} holds no key on its first line", param="api_key_file"
        )
    return key


def _responses_store(path: Path | None):
    """The store of /v1/responses (opened before the model loads, so a bad path fails at once)."""
    from localchat.server.responses.store import open_store

    try:
        return open_store(path)
    except sqlite3.Error as exc:
        raise InvalidParameterError(
            f"cannot open --responses-store {path}: {exc}", param="responses_store"
        ) from None


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise InvalidParameterError(
            f"cannot listen on {host}:{port}: {exc.strerror or exc}", param="port"
        ) from None
    sock.set_inheritable(True)
    return sock


async def _serve(
    sock: socket.socket,
    engine_config,
    *,
    served_model_name,
    api_key,
    cors_origins,
    max_waiting,
    grace_period,
    log_level,
    hosts: frozenset[str] | None = None,
    parsers: tuple[str | None, str | None] = (None, None),
    pooling: str = "last",
    responses_store=None,
    data_parallel_size: int = 1,
    limits: ConnectionLimits | None = None,
    metrics_without_key: bool = False,
    media_domains: frozenset[str] = frozenset(),
) -> None:
    from localchat.engine.core.async_engine import AsyncEngine
    from localchat.engine.core.engine_client import EngineClient
    from localchat.server.app import build_asgi_app
    from localchat.server.state import ServerState
    from localchat.server.uvicorn_run import serve_until_signal, socket_url, uvicorn_server

    engine: EngineClient
    if data_parallel_size > 1:  # replicas in processes of their own (data_parallel.py)
        from localchat.engine.distributed.data_parallel import DataParallelEngine

        engine = DataParallelEngine(
            engine_config,
            data_parallel_size,
            max_waiting=max_waiting,
            log_level=logging.getLogger().level,
        )
    else:
        engine = AsyncEngine(engine_config, max_waiting=max_waiting)
    try:
        await engine.start()
        info = engine.model_info
        server_state = ServerState(
            engine,
            served_model_name or info.name,
            api_key,
            tool_call_parser=parsers[0],
            reasoning_parser=parsers[1],
            pooling=pooling,
            metrics_without_key=metrics_without_key,
            media_domains=media_domains,
        )
        app = build_asgi_app(server_state, cors_origins, responses_store, hosts)
        server = uvicorn_server(app, log_level=log_level, grace_period=grace_period, limits=limits)
        logger.info(
            "serving %s (max_model_len %d) on %s%s",
            server_state.model_name,
            info.max_model_len,
            socket_url(sock),
            " (API key required)" if api_key else "",
        )
        await serve_until_signal(server, sock)
    finally:
        await engine.shutdown()
        sock.close()
        logger.info("stopped")
