"""TextCodec: tokenize, detokenize and render chat prompts with one tokenizer.

A Rust tokenizer is guarded by a borrow flag, not a lock: used by two threads at once it may fail
with `RuntimeError: Already borrowed` (vLLM hit this). So each thread gets its own codec: the engine
thread the engine's, an event loop a `copy()` with its own tokenizer.
"""

from __future__ import annotations

import copy

from localchat.engine.core.chat_template import ChatTemplate
from localchat.errors import LocalchatError, NoTokenizerError


class TextCodec:
    """Text <-> token ids for one model; `tokenizer` is None for a model loaded without one."""

    def __init__(self, tokenizer, chat_template: ChatTemplate | None):
        self.tokenizer = tokenizer
        self.chat_template = chat_template

    def copy(self) -> TextCodec:
        """A codec with its own tokenizer, for another thread (the chat template is read-only)."""
        return TextCodec(copy.deepcopy(self.tokenizer), self.chat_template)

    def tokenize(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if self.tokenizer is None:
            raise NoTokenizerError(
                "this model was loaded without a tokenizer: pass token ids, not text"
            )
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens)

    def detokenize(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        if self.tokenizer is None:
            raise NoTokenizerError("this model was loaded without a tokenizer")
        return self.tokenizer.decode(token_ids, skip_special_tokens=skip_special_tokens)

    def render_chat(
        self,
        messages: list[dict],
        *,
        chat_template_kwargs: dict | None = None,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        tools: list[dict] | None = None,
    ) -> list[int]:
        """Token ids of a conversation rendered with the chat template (no special tokens added on
        top, as transformers' apply_chat_template does)."""
        if self.chat_template is None:
            raise LocalchatError(
                "this model has no chat template; pass one with --chat-template FILE"
            )
        text = self.chat_template.render(
            messages,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
            tools=tools,
            **(chat_template_kwargs or {}),
        )
        return self.tokenize(text, add_special_tokens=False)
