"""Render a conversation with the model's Jinja chat template, exactly as transformers does.

The environment matches transformers' (sandboxed, trim_blocks/lstrip_blocks, loop controls, a tojson
that keeps non-ASCII, raise_exception, strftime_now), and the template sees the tokenizer's special
tokens, so the rendered text equals `tokenizer.apply_chat_template(..., tokenize=False)`.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from pathlib import Path

from localchat.errors import InvalidParameterError, LocalchatError

_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "
ROLES = ("system", "user", "assistant", "tool", "developer")


@lru_cache(maxsize=8)
def _compile(source: str):
    import jinja2
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(
            value,
            ensure_ascii=ensure_ascii,
            indent=indent,
            separators=separators,
            sort_keys=sort_keys,
        )

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(source)


def normalize_messages(messages: list[dict]) -> list[dict]:
    """Validate roles, join lists of text parts into one string, drop None-valued keys."""
    normalized = []
    for position, message in enumerate(messages):
        if not isinstance(message, dict) or "role" not in message:
            raise InvalidParameterError(
                f"messages[{position}] must be an object with a 'role'", param="messages"
            )
        if message["role"] not in ROLES:
            raise InvalidParameterError(
                f"messages[{position}].role {message['role']!r} is not one of {', '.join(ROLES)}",
                param="messages",
            )
        content = message.get("content")
        if isinstance(content, list) and any(_is_image(part) for part in content):
            pass  # a vision-language model's template places its images among the texts
        elif isinstance(content, list):
            texts = []
            for part in content:
                if (
                    not isinstance(part, dict)
                    or part.get("type") != "text"
                    or not isinstance(part.get("text"), str)
                ):
                    raise InvalidParameterError(
                        f"messages[{position}].content parts must be "
                        "{'type': 'text', 'text': ...}",
                        param="messages",
                    )
                texts.append(part["text"])
            content = "\n".join(texts)
        elif content is not None and not isinstance(content, str):
            raise InvalidParameterError(
                f"messages[{position}].content must be a string or a list of text parts",
                param="messages",
            )
        normalized.append(
            {k: v for k, v in {**message, "content": content}.items() if v is not None}
        )
    return normalized


SYSTEM_ROLES = ("system", "developer")


def _is_image(part) -> bool:
    """An image part as multimodal chat templates take it ({"type": "image"})."""
    return isinstance(part, dict) and part.get("type") == "image"


def without_system(messages: list[dict]) -> list[dict]:
    return [m for m in messages if m["role"] not in SYSTEM_ROLES]


def system_merged(messages: list[dict]) -> list[dict] | None:
    """The conversation with its system and developer messages' text at the top of the first user
    message (a blank line between), as Gemma's documentation asks of templates without a system
    role; a user message of their own where none follows them. None when there are none."""
    if len(without_system(messages)) == len(messages):
        return None
    system = "\n\n".join(
        m["content"] for m in messages if m["role"] in SYSTEM_ROLES and m.get("content")
    )
    rest = without_system(messages)
    first_user = next((i for i, m in enumerate(rest) if m["role"] == "user"), None)
    if not system:
        return rest
    if first_user is None:
        return [{"role": "user", "content": system}, *rest]
    user = rest[first_user]
    content = user.get("content")
    rest[first_user] = {**user, "content": f"{system}\n\n{content}" if content else system}
    return rest


def processor_template(directory: str | Path) -> str | None:
    """The template of a model directory's chat_template.json (a processor's, `{"chat_template":
    TEXT}`), which transformers' tokenizers do not read; None without one."""
    if not directory:
        return None
    try:
        saved = json.loads((Path(directory) / "chat_template.json").read_text())
    except (OSError, ValueError):
        return None
    template = saved.get("chat_template") if isinstance(saved, dict) else None
    return template if isinstance(template, str) and template else None


class ChatTemplate:
    """A model's chat template plus the special tokens it may refer to."""

    def __init__(self, source: str, special_tokens: dict[str, str]):
        self.source = source
        self.special_tokens = special_tokens

    @classmethod
    def for_tokenizer(cls, tokenizer, override: str | None = None) -> ChatTemplate | None:
        """The tokenizer's template, or `override` (a file path or the template text itself). A
        vision-language model that keeps its template in the processor's chat_template.json only
        (SmolVLM, Idefics3, Gemma 3's older uploads) has that one."""
        source = getattr(tokenizer, "chat_template", None) or processor_template(
            getattr(tokenizer, "name_or_path", "")
        )
        if override is not None:
            path = Path(override).expanduser()
            if path.is_file():
                source = path.read_text()
            elif "{" in override:
                source = override
            else:
                raise InvalidParameterError(
                    f"chat template file {override!r} does not exist", param="chat_template"
                )
        if isinstance(source, dict):  # several named templates: take the default one
            source = source.get("default") or next(iter(source.values()))
        if not source:
            return None
        return cls(
            source,
            {k: str(v) for k, v in tokenizer.special_tokens_map.items() if isinstance(v, str)},
        )

    def render(
        self,
        messages: list[dict],
        *,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        tools: list[dict] | None = None,
        documents: list[dict] | None = None,
        **kwargs,
    ) -> str:
        """The prompt text for `messages`; `kwargs` (chat_template_kwargs, e.g. enable_thinking)
        reach the template.

        A template that has no system role (Gemma 1 and 2, older Mistral ones) gets the fallback
        Gemma documents: the system (and developer) messages' text goes at the top of the first
        user message, a blank line before the user's own; only when the template rejected the
        conversation because of them (it renders without them), else its error stands."""
        messages = normalize_messages(messages)
        options = dict(
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
            tools=tools,
            documents=documents,
            **kwargs,
        )
        try:
            return self._render(messages, **options)
        except InvalidParameterError:
            merged = system_merged(messages)
            if merged is None:
                raise
        # the template refused a conversation with a system message: if it takes the rest, the
        # system message was what it refused (else the rest's error is the one to report)
        self._render(without_system(messages), **options)
        return self._render(merged, **options)

    def _render(
        self,
        messages: list[dict],
        *,
        add_generation_prompt: bool,
        continue_final_message: bool,
        tools: list[dict] | None,
        documents: list[dict] | None,
        **kwargs,
    ) -> str:
        import jinja2

        if continue_final_message:
            if not messages or not isinstance(messages[-1].get("content"), str):
                raise InvalidParameterError(
                    "continue_final_message needs a final message with text content",
                    param="continue_final_message",
                )
            final = messages[-1]["content"]
            messages[-1] = {**messages[-1], "content": final + _CONTINUE_TAG}
        try:
            text = _compile(self.source).render(
                messages=messages,
                tools=tools,
                documents=documents,
                add_generation_prompt=add_generation_prompt,
                **{**self.special_tokens, **kwargs},
            )
        except jinja2.TemplateError as exc:
            raise InvalidParameterError(
                f"the chat template rejected these messages: {exc}", param="messages"
            ) from exc
        if continue_final_message:
            tag = text.rfind(_CONTINUE_TAG.strip())
            if tag < 0:
                raise LocalchatError(
                    "the chat template dropped the final message; cannot continue it"
                )
            text = (
                text[:tag]
                if text[tag : tag + len(_CONTINUE_TAG)] == _CONTINUE_TAG
                else text[:tag].rstrip()
            )
        return text
