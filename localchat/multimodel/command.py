"""`localchat serve-models NAME,NAME,...`: one OpenAI-compatible server for several models, loaded
on first use and evicted least-recently-used under `--max-loaded-models`."""

from __future__ import annotations

import asyncio
import logging
import signal
from typing import Annotated

import typer

from localchat.cli_options import engine_options, option
from localchat.errors import InvalidParameterError

logger = logging.getLogger("localchat.server")
_PANEL = "Server options"


@engine_options
def serve_models(
    models: Annotated[
        str, typer.Argument(help="Comma-separated names from `localchat list` (or paths)")
    ],
    host: Annotated[str, option(_PANEL, "--host", help="Address to listen on")] = "127.0.0.1",
    port: Annotated[int, option(_PANEL, "--port", help="Port to listen on")] = 8000,
    max_loaded_models: Annotated[
        int, option(_PANEL, "--max-loaded-models", help="Most engines loaded at once")
    ] = 1,
    api_key: Annotated[
        str | None,
        option(_PANEL, "--api-key", envvar="LOCALCHAT_API_KEY", show_default=False, help="Key"),
    ] = None,
    engine_config=None,
) -> None:
    """Serve several models; a request's `model` picks one (the first when it names none)."""
    from localchat.engine.model_source import resolve_model

    names = [n.strip() for n in models.split(",") if n.strip()]
    if not names or max_loaded_models < 1:
        raise InvalidParameterError("give at least one model and --max-loaded-models >= 1")
    for name in names:
        resolve_model(name, pull=False)  # a name that cannot load fails now, not at the request
    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(_serve(names, engine_config, host, port, max_loaded_models, api_key or None))


async def _serve(names, engine_config, host, port, max_loaded, api_key) -> None:
    import uvicorn

    from localchat.multimodel.pool import EnginePool
    from localchat.multimodel.router import ModelRouter
    from localchat.server.app import build_app
    from localchat.server.state import ServerState

    def build(engine, name):
        return build_app(ServerState(engine, name, api_key))

    pool = EnginePool(names, engine_config, build, max_loaded=max_loaded)
    config = uvicorn.Config(
        ModelRouter(pool, api_key), host=host, port=port, log_config=None, lifespan="off"
    )
    server = uvicorn.Server(config)
    logger.info("serving %s on http://%s:%d", ", ".join(names), host, port)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: None)
    try:
        await server.serve()
    finally:
        await pool.close()
        logger.info("stopped")
