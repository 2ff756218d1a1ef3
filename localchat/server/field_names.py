"""Errors of the shared chat path in another API's words: the APIs that translate their requests
into a chat completion (Anthropic's Messages, OpenAI's Responses) name their own fields in a 400,
not the chat completion's they became."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator

from localchat.errors import LocalchatError


def _root(param: str) -> str:
    return re.split(r"[.\[]", param, maxsplit=1)[0]


@contextlib.contextmanager
def api_field_names(fields: dict[str, str], paths: tuple[tuple[str, str], ...] = ()) -> Iterator:
    """Inside, a LocalchatError whose `param` is a chat field of `fields` (chat name → the API's)
    is raised again naming the API's field: in `param`, and in the message where the chat name
    is written as a field (a name with `_`; a plain word is only renamed in `param`). `paths` are
    (regex, replacement) rewrites of paths in the message and param (`tools[0].function.` →
    `tools[0].`)."""
    try:
        yield
    except LocalchatError as exc:
        if exc.param is None or _root(exc.param) not in fields:
            raise
        message, param = exc.message, exc.param
        for pattern, replacement in paths:
            message, param = (
                re.sub(pattern, replacement, message),
                re.sub(pattern, replacement, param),
            )
        chat = _root(param)
        api = fields[chat]
        param = api + param[len(chat) :]
        if "_" in chat:  # a plain word ("messages", "stop") may be English in the message
            message = re.sub(rf"(?<![\w.]){re.escape(chat)}(?=[\[.]|\b)", api, message)
        exc.message, exc.param = message, param
        exc.args = (message,)
        raise
