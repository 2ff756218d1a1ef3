"""A chat request on its way to the engine, shared by every API that chats (chat completions,
Anthropic's Messages, OpenAI's Responses): tools planned, messages rendered with the chat template,
sampling parameters and any grammar (structured output or a forced tool call) checked, harmony's
special tokens kept, then the generation started; and a parser per reply that splits reasoning
and tool calls out of the text."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from litestar import Request

from localchat.engine.core.multimodal import ImageInput
from localchat.engine.sampling.sampling_params import SamplingParams
from localchat.harmony import harmony_stop_ids
from localchat.reasoning import HARMONY, new_splitter, reply_thinking
from localchat.server.chat_reply import ReplyParser
from localchat.server.generation import Generation
from localchat.server.media_fetch import fetch_remote_images
from localchat.server.protocol import ChatCompletionRequest
from localchat.server.sampling import chat_sampling_params
from localchat.server.state import ServerState
from localchat.server.streaming import start_generation
from localchat.server.structured import checked_grammar
from localchat.server.tools import ToolPlan, plan_tools
from localchat.server.vision_prompt import image_parts, render_with_images


@dataclass
class ChatPrompt:
    """A chat request rendered: its prompt's token ids, its tool plan, the role of the reply and
    the reasoning parser in effect for it (None when the reply is not an assistant's)."""

    tokens: list[int]
    plan: ToolPlan
    role: str
    reasoning: str | None
    tail: str  # the prompt's last tokens as text, special tokens kept (where a reply starts)
    images: tuple[ImageInput, ...] = ()  # its pictures, in order (server/vision_prompt.py)


@dataclass
class ChatRun:
    """A started chat generation and how to read its replies."""

    generation: Generation
    role: str
    reasoning: str | None
    new_parser: Callable[[], ReplyParser]


def render_prompt(server: ServerState, data: ChatCompletionRequest) -> ChatPrompt:
    """The prompt of a chat request (what /v1/messages/count_tokens counts)."""
    plan = plan_tools(data, server.tools, server.special_token_id)
    images: tuple[ImageInput, ...] = ()
    if parts := image_parts(data):
        tokens, images = render_with_images(server, data, plan.template_tools, parts)
    else:
        tokens = server.render_chat(data, plan.template_tools)
    role = "assistant" if data.add_generation_prompt else data.messages[-1].role
    reasoning = server.reasoning if role == "assistant" else None
    tail = server.engine.detokenize(tokens[-8:], skip_special_tokens=False) if reasoning else ""
    return ChatPrompt(tokens, plan, role, reasoning, tail, images)


def parser_factory(
    server: ServerState, reasoning: str | None, tail: str, parse_tools: bool
) -> Callable[[], ReplyParser]:
    tools = server.tools if parse_tools else None

    def new_parser() -> ReplyParser:
        return ReplyParser(new_splitter(reasoning, tail) if reasoning else None, tools)

    return new_parser


async def sampling_params(
    server: ServerState, data: ChatCompletionRequest, prompt: ChatPrompt
) -> tuple[SamplingParams, str | None]:
    """The request's SamplingParams (the model's generation defaults where it leaves a field
    unset) and the field its grammar came from, if it has one."""
    plan, reasoning = prompt.plan, prompt.reasoning
    tool_grammar = (plan.grammar, str(data.tool_choice)) if plan.grammar else None
    grammar, grammar_param = await checked_grammar(
        data, tool_grammar, reply_thinking(reasoning, prompt.tail), server.special_token_id
    ) or (None, None)
    defaults = server.engine.model_info.generation_defaults  # generation_config.json
    params = chat_sampling_params(defaults.fill_request(data), grammar)
    if reasoning == HARMONY:  # the reply's structure is its special tokens
        params.skip_special_tokens = False
        params.stop_token_ids = harmony_stop_ids(
            params.stop_token_ids, server.special_token_id, server.engine.model_info.eos_token_ids
        )
    elif plan.parse and not server.tools.skip_special_tokens:
        params.skip_special_tokens = False  # the call marker is a special token
    return params, grammar_param


async def start_chat(
    request: Request,
    server: ServerState,
    data: ChatCompletionRequest,
    request_id: str,
    *,
    max_tokens_ceiling: bool = False,
) -> ChatRun:
    """Render, check and start a chat request as `request_id` (its response's id). With
    `max_tokens_ceiling` (APIs whose max_tokens is a ceiling that clients set high, as Anthropic's
    and the Responses API's are), a max_tokens beyond the context leaves the reply the rest of the
    context instead of being refused."""
    data = await fetch_remote_images(data, server.media_domains)  # --allowed-media-domains
    prompt = render_prompt(server, data)
    params, grammar_param = await sampling_params(server, data, prompt)
    limit = server.engine.model_info.max_model_len
    if max_tokens_ceiling and params.max_tokens and len(prompt.tokens) + params.max_tokens > limit:
        params.max_tokens = None
    generation = await start_generation(
        request,
        server,
        "",
        params,
        [prompt.tokens],
        grammar_param,
        request_id=request_id,
        images=prompt.images,
    )
    new_parser = parser_factory(server, prompt.reasoning, prompt.tail, prompt.plan.parse)
    return ChatRun(generation, prompt.role, prompt.reasoning, new_parser)
