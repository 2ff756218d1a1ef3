"""`localchat serve --models NAME,NAME,...` / `--models-dir DIR`: one OpenAI-compatible server for
several models, loaded on first use and evicted least-recently-used under `--max-loaded-models`
and `--max-memory`, unloaded once idle past their keep_alive."""

from __future__ import annotations

import logging
import socket
from pathlib import Path

from localchat.errors import InvalidParameterError, ModelNotFoundError
from localchat.server.keep_alive import format_duration, parse_keep_alive
from localchat.utils import format_bytes, parse_memory_size

logger = logging.getLogger("localchat.server")


def models_to_serve(models: str | None, models_dir: Path | None) -> dict[str, str]:
    """Served name -> what the engine loads: the names given (registry names or paths, served as
    typed), then every .gguf file (by its stem; an mmproj*.gguf image encoder is none) and every
    directory with a config.json (by its name) in `models_dir`. Each one must resolve now, not at
    its first request."""
    from localchat.models.names import is_mmproj
    from localchat.models.source import resolve_model

    served = {n.strip(): n.strip() for n in (models or "").split(",") if n.strip()}
    if models_dir is not None:
        if not models_dir.is_dir():
            raise InvalidParameterError(
                f"--models-dir {models_dir}: not a directory", param="models_dir"
            )
        for path in sorted(models_dir.iterdir()):
            gguf = path.is_file() and path.suffix == ".gguf" and not is_mmproj(path.name)
            if gguf or (path / "config.json").is_file():
                served.setdefault(path.stem if path.is_file() else path.name, str(path))
        if not served:
            raise ModelNotFoundError(
                f"--models-dir {models_dir}: no .gguf file nor model directory (with config.json)"
            )
    if not served:
        raise InvalidParameterError("--models names no model", param="models")
    for reference in served.values():
        resolve_model(reference, pull=False)
    return served


def check_limits(
    max_loaded_models: int, max_memory: str | None, keep_alive: str
) -> tuple[int | None, float | None]:
    """--max-memory in bytes (None: no budget) and --keep-alive in seconds (None: forever)."""
    if max_loaded_models < 1:
        raise InvalidParameterError(
            f"--max-loaded-models must be >= 1, got {max_loaded_models}",
            param="max_loaded_models",
        )
    budget = None if max_memory is None else parse_memory_size(max_memory, param="max_memory")
    return budget, parse_keep_alive(keep_alive, param="keep_alive")


async def serve_models(
    sock: socket.socket,
    engine_config,
    models: dict[str, str],
    *,
    max_loaded: int,
    max_memory: int | None,
    keep_alive: float | None,
    api_key: str | None,
    cors_origins: list[str] | None,
    hosts: frozenset[str] | None,
    max_waiting: int,
    grace_period: float,
    log_level: str,
    parsers: tuple[str | None, str | None],
    pooling: str,
    responses_store=None,
    limits=None,
    metrics_without_key: bool = False,
    allow_client_unload: bool = False,
    media_domains: frozenset[str] = frozenset(),
) -> None:
    from localchat.server.access_log import access_log
    from localchat.server.app import build_app
    from localchat.server.multimodel.pool import EnginePool
    from localchat.server.multimodel.router import ModelRouter
    from localchat.server.request_guard import guard_hosts
    from localchat.server.responses.routes import stored_responses_app
    from localchat.server.responses.store import open_store
    from localchat.server.state import ServerState
    from localchat.server.uvicorn_run import serve_until_signal, socket_url, uvicorn_server

    if responses_store is None:  # one store for every model's /v1/responses
        responses_store = open_store(None)

    def build(engine, name):
        state = ServerState(
            engine,
            name,
            api_key,
            tool_call_parser=parsers[0],
            reasoning_parser=parsers[1],
            pooling=pooling,
            metrics_without_key=metrics_without_key,
            media_domains=media_domains,
        )
        state.metrics.model_name = name
        return build_app(state, cors_origins, responses_store), state

    pool = EnginePool(
        models,
        engine_config,
        build,
        max_loaded=max_loaded,
        max_memory=max_memory,
        keep_alive=keep_alive,
        max_waiting=max_waiting,
        allow_client_unload=allow_client_unload,
    )
    for name in pool.names:
        need = pool.need(name)
        if max_memory is not None and need.total > max_memory:
            logger.warning(
                "%s needs about %s, more than --max-memory %s: its requests will be refused",
                name,
                format_bytes(need.total),
                format_bytes(max_memory),
            )
    server = uvicorn_server(
        access_log(
            guard_hosts(
                ModelRouter(
                    pool, api_key, stored_responses_app(responses_store), metrics_without_key
                ),
                hosts,
            )
        ),
        log_level=log_level,
        grace_period=grace_period,
        limits=limits,
    )
    logger.info(
        "serving %s (at most %d loaded%s, keep_alive %s) on %s%s",
        ", ".join(pool.names),
        max_loaded,
        "" if max_memory is None else f", {format_bytes(max_memory)}",
        format_duration(keep_alive),
        socket_url(sock),
        " (API key required)" if api_key else "",
    )
    pool.start()
    try:
        await serve_until_signal(server, sock)
    finally:
        await pool.close()
        sock.close()
        logger.info("stopped")
