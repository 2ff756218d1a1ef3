"""What every handler shares: the engine, the served model name, metrics and the API key."""

from __future__ import annotations

import hmac
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from litestar import Request
from litestar.connection import ASGIConnection
from litestar.exceptions import NotAuthorizedException
from litestar.handlers import BaseRouteHandler

from localchat.errors import InvalidParameterError, LocalchatError, ModelNotFoundError
from localchat.server.logprobs import TokenStrings
from localchat.server.metrics import ServerMetrics
from localchat.server.parser_choice import chat_parsers
from localchat.server.tool_parsers import ToolParser
from localchat.server.tools import template_messages

if TYPE_CHECKING:
    from localchat.engine.core.engine_client import EngineClient
    from localchat.server.protocol import ChatCompletionRequest, TokenizeRequest

# chat_template_kwargs may not override what the server itself passes to the template
RESERVED_TEMPLATE_KWARGS = frozenset(
    {"messages", "tools", "documents", "add_generation_prompt", "continue_final_message"}
)


@dataclass
class ServerState:
    """Handlers reach it as `request.app.state.server`."""

    engine: EngineClient  # started
    model_name: str
    api_key: str | None = None
    tool_call_parser: str | None = None  # --tool-call-parser (None: from the chat template)
    reasoning_parser: str | None = None  # --reasoning-parser (None: from the chat template)
    pooling: str = "last"  # --pooling: how /v1/embeddings pools a prompt's hidden states
    metrics_without_key: bool = False  # --metrics-without-key: /metrics open to any client
    # --allowed-media-domains: the hosts image URLs are fetched from (server/media_fetch.py)
    media_domains: frozenset[str] = frozenset()
    created: int = field(default_factory=lambda: int(time.time()))
    metrics: ServerMetrics = field(init=False)
    token_str: TokenStrings = field(init=False)
    tools: ToolParser = field(init=False)
    reasoning: str | None = field(init=False)

    def __post_init__(self) -> None:
        self.metrics = ServerMetrics(self.engine)
        self.token_str = TokenStrings(self.engine.tokenizer)
        template = self.engine.chat_template
        source = template.source if template is not None else None
        self.tools, self.reasoning = chat_parsers(
            self.tool_call_parser, self.reasoning_parser, source
        )

    def special_token_id(self, text: str) -> int | None:
        """The id of an added (special) token spelled `text`, if the tokenizer has one."""
        tokenizer = self.engine.tokenizer
        return None if tokenizer is None else tokenizer.get_added_vocab().get(text)

    def check_model(self, name: str | None) -> None:
        """An omitted model means the served one; any other name is a 404."""
        if name is not None and name != self.model_name:
            raise ModelNotFoundError(
                f"the model {name!r} does not exist; this server serves {self.model_name!r}",
                param="model",
            )

    def render_chat(
        self, data: ChatCompletionRequest | TokenizeRequest, tools: list[dict] | None
    ) -> list[int]:
        """The prompt of a request's messages, rendered with the template options it carries."""
        if not data.messages:
            raise InvalidParameterError("messages must hold at least one message", param="messages")
        clash = sorted(RESERVED_TEMPLATE_KWARGS & set(data.chat_template_kwargs or {}))
        if clash:
            raise InvalidParameterError(
                f"chat_template_kwargs may not set {', '.join(clash)}", param="chat_template_kwargs"
            )
        try:
            return self.engine.render_chat(
                template_messages(data.messages),
                chat_template_kwargs=data.chat_template_kwargs,
                add_generation_prompt=data.add_generation_prompt,
                continue_final_message=data.continue_final_message,
                tools=tools,
            )
        except LocalchatError:
            raise
        except Exception as exc:  # a template tripping over unexpected input is still bad input
            raise InvalidParameterError(
                f"the chat template failed on these messages: {exc}", param="messages"
            ) from exc

    @staticmethod
    def new_id(prefix: str) -> str:
        return f"{prefix}-{uuid.uuid4().hex}"


def server_of(request: Request) -> ServerState:
    return request.app.state.server


def server_for(request: Request, model: str | None) -> ServerState:
    """The server, once it is known to serve the request's model (the opening of every route that
    takes one)."""
    server = server_of(request)
    server.check_model(model)
    return server


def require_api_key(connection: ASGIConnection, _handler: BaseRouteHandler) -> None:
    """Litestar guard: `Authorization: Bearer KEY`, compared in constant time, when a key is set."""
    expected = connection.app.state.server.api_key
    if expected is None:
        return
    if not bearer_matches(connection.headers.get("authorization", ""), expected):
        raise NotAuthorizedException(
            "invalid or missing API key: send 'Authorization: Bearer <key>'"
        )


def require_metrics_key(connection: ASGIConnection, handler: BaseRouteHandler) -> None:
    """Litestar guard of /metrics: the API key, unless the server runs --metrics-without-key."""
    if not connection.app.state.server.metrics_without_key:
        require_api_key(connection, handler)


def bearer_matches(header: str, key: str) -> bool:
    """Whether an Authorization header is `Bearer KEY`, compared in constant time."""
    scheme, _, given = header.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), key.encode())
