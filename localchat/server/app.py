"""Build the Litestar application of the OpenAI-compatible server around a started AsyncEngine."""

from __future__ import annotations

from litestar import Litestar
from litestar.config.cors import CORSConfig
from litestar.datastructures import State
from litestar.openapi import OpenAPIConfig

from localchat import __version__
from localchat.server.access_log import access_log
from localchat.server.anthropic.routes import anthropic_router
from localchat.server.body_depth import limit_json_depth
from localchat.server.errors import handle_exception
from localchat.server.openapi_errors import document_errors
from localchat.server.request_guard import MAX_BODY_BYTES, guard_hosts, require_json, send_error
from localchat.server.responses.routes import ROUTES as RESPONSES_ROUTES
from localchat.server.responses.store import MemoryResponseStore, ResponseStore
from localchat.server.routes_chat import create_chat_completion
from localchat.server.routes_completions import create_completion
from localchat.server.routes_embeddings import create_embeddings
from localchat.server.routes_misc import ROUTES, health, metrics, version
from localchat.server.state import ServerState, bearer_matches

OPENAI_ROUTES = [
    create_chat_completion,
    create_completion,
    create_embeddings,
    *ROUTES,
    *RESPONSES_ROUTES,
]
# the OpenAPI schema names the errors each route answers with (/health, /version and /metrics
# answer none in that shape)
document_errors(route for route in OPENAI_ROUTES if route not in (health, version, metrics))


def build_app(
    server: ServerState,
    cors_origins: list[str] | None = None,
    responses: ResponseStore | None = None,
) -> Litestar:
    """The Litestar app; OpenAPI docs at /docs. Every error is answered in OpenAI's error shape
    (Anthropic's on /v1/messages). `responses` keeps the Responses API's responses (in memory when
    not given). A body must be application/json (request_guard.py); CORS is off unless
    `cors_origins` names origins."""
    return Litestar(
        route_handlers=[*OPENAI_ROUTES, anthropic_router],
        state=State(
            {
                "server": server,
                "responses": MemoryResponseStore() if responses is None else responses,
            }
        ),
        exception_handlers={Exception: handle_exception},
        middleware=[require_json, _docs_need_key(server), limit_json_depth],
        cors_config=CORSConfig(allow_origins=cors_origins, allow_headers=["*"])
        if cors_origins
        else None,
        openapi_config=OpenAPIConfig(
            title="localchat",
            version=__version__,
            path="/docs",
            description="OpenAI-compatible API of a localchat server.",
        ),
        logging_config=None,
        request_max_body_size=MAX_BODY_BYTES,
    )


def _docs_need_key(server: ServerState):
    """Middleware factory: /docs (the OpenAPI pages and schema) takes the API key when one is
    set, as /v1/* does."""

    def factory(app):
        async def middleware(scope, receive, send) -> None:
            path = scope.get("path", "")
            if (
                scope["type"] == "http"
                and server.api_key is not None
                and (path == "/docs" or path.startswith("/docs/"))
            ):
                headers = dict(scope.get("headers") or ())
                given = headers.get(b"authorization", b"").decode("latin-1")
                if not bearer_matches(given, server.api_key):
                    message = "invalid or missing API key: send 'Authorization: Bearer <key>'"
                    return await send_error(scope, send, message, 401, "authentication_error")
            await app(scope, receive, send)

        return middleware

    return factory


def build_asgi_app(
    server: ServerState,
    cors_origins: list[str] | None = None,
    responses: ResponseStore | None = None,
    hosts: frozenset[str] | None = None,
):
    """The app behind the Host check (`hosts`: request_guard.allowed_hosts) and in the access log,
    as uvicorn runs it."""
    return access_log(guard_hosts(build_app(server, cors_origins, responses), hosts))
