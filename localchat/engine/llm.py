"""LLM: the offline API, a loop over LLMEngine.step() for a batch of prompts or conversations."""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from collections.abc import Sequence as SequenceABC
from concurrent.futures import Future
from typing import cast

from localchat.config import EngineConfig
from localchat.engine.core.llm_engine import LLMEngine
from localchat.engine.core.outputs import RequestOutput
from localchat.engine.sampling.sampling_params import SamplingParams
from localchat.errors import InvalidParameterError

Prompt = str | list[int]
# what generate() takes for one prompt: also vLLM's {"prompt": ...} and {"prompt_token_ids": [...]}
PromptInput = Prompt | Mapping[str, object]


class LLM:
    """Load a model and generate for many prompts at once with continuous batching.

    >>> llm = LLM()  # the embedded default model
    >>> params = SamplingParams(temperature=0, max_tokens=8)
    >>> llm.generate("The capital of France is", params)[0].text
    """

    def __init__(self, model: str | None = None, *, config: EngineConfig | None = None, **kwargs):
        self.engine = LLMEngine(config or EngineConfig.from_kwargs(model, **kwargs))
        self._ids = itertools.count()

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    def get_tokenizer(self):
        """The model's tokenizer (vLLM's name for it)."""
        return self.engine.tokenizer

    def generate(
        self,
        prompts: PromptInput | SequenceABC[PromptInput],
        sampling_params: SamplingParams | list[SamplingParams] | None = None,
        *,
        use_tqdm: bool = False,
    ) -> list[RequestOutput]:
        """One accumulated RequestOutput per prompt, in order; `use_tqdm`: a progress bar of the
        prompts done, on stderr."""
        prompt_list = _as_prompt_list(prompts)
        params_list = _as_params_list(sampling_params, len(prompt_list))
        request_ids = []
        grammars: list[Future | None] = []
        try:
            for prompt, params in zip(prompt_list, params_list, strict=True):
                request_id = f"offline-{next(self._ids)}"
                request = self.engine.add_request(request_id, prompt, params)
                request_ids.append(request_id)
                grammars.append(request.constraints.grammar if request.constraints else None)
            # a grammar that fails to compile for this tokenizer raises its error here (the engine
            # would abort its request); the compiles run in parallel meanwhile
            for future in grammars:
                if future is not None:
                    future.result()
            return self._run(request_ids, use_tqdm)
        except BaseException:
            for request_id in request_ids:
                self.engine.abort(request_id)
            raise

    def chat(
        self,
        conversations: list[dict] | list[list[dict]],
        sampling_params: SamplingParams | list[SamplingParams] | None = None,
        *,
        chat_template_kwargs: dict | None = None,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        tools: list[dict] | None = None,
        use_tqdm: bool = False,
    ) -> list[RequestOutput]:
        """Generate a reply for one conversation (a list of messages) or each of several; `tools`:
        OpenAI-style function definitions, rendered by the chat template as the server does."""
        if isinstance(conversations, str) or not isinstance(conversations, SequenceABC):
            raise InvalidParameterError(
                "conversations must be a list of messages or a list of such lists",
                param="conversations",
            )
        # one conversation or several, told by the first item
        if conversations and isinstance(conversations[0], dict):
            batch = [conversations]
        else:  # mypy narrows only the positive isinstance test on an item
            batch = cast(list[list[dict]], conversations)
        if not batch or any(not conversation for conversation in batch):
            raise InvalidParameterError(
                "a conversation must hold at least one message", param="conversations"
            )
        prompts: list[Prompt] = [
            self.render_chat(
                c,
                chat_template_kwargs=chat_template_kwargs,
                add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message,
                tools=tools,
            )
            for c in batch
        ]
        return self.generate(prompts, sampling_params, use_tqdm=use_tqdm)

    def render_chat(self, messages: list[dict], **kwargs) -> list[int]:
        """Token ids of a conversation rendered with the chat template (see
        LLMEngine.render_chat)."""
        return self.engine.render_chat(messages, **kwargs)

    def _run(self, request_ids: list[str], use_tqdm: bool = False) -> list[RequestOutput]:
        results: dict[str, RequestOutput] = {}
        pending = set(request_ids)
        bar = None
        if use_tqdm:
            from tqdm.auto import tqdm

            bar = tqdm(total=len(request_ids), desc="Processed prompts", unit="prompt")
        try:
            while pending:
                for delta in self.engine.step():
                    if delta.request_id in results:
                        results[delta.request_id].merge(delta)
                    else:
                        results[delta.request_id] = delta
                    if delta.finished and delta.request_id in pending:
                        pending.discard(delta.request_id)
                        if bar is not None:
                            bar.update(1)
        finally:
            if bar is not None:
                bar.close()
        return [results[request_id] for request_id in request_ids]


def _as_prompt_list(prompts) -> list[Prompt]:
    if isinstance(prompts, str | Mapping):
        return [_one_prompt(prompts)]
    if isinstance(prompts, SequenceABC) and prompts and all(isinstance(t, int) for t in prompts):
        return [list(prompts)]
    if not isinstance(prompts, SequenceABC) or not prompts:
        raise InvalidParameterError(
            "prompts must be a string, a list of token ids, a {'prompt': ...} or "
            "{'prompt_token_ids': [...]} dict, or a non-empty list of those",
            param="prompts",
        )
    return [_one_prompt(p) for p in prompts]


def _one_prompt(prompt) -> Prompt:
    """A prompt as the engine takes it: a string or token ids, also from vLLM's TextPrompt
    ({"prompt": str}) and TokensPrompt ({"prompt_token_ids": [int, ...]}) dicts."""
    if isinstance(prompt, str):
        return prompt
    if not isinstance(prompt, Mapping):
        if not isinstance(prompt, SequenceABC):
            raise InvalidParameterError(
                f"each prompt must be a string, a list of token ids or a prompt dict, got "
                f"{type(prompt).__name__}",
                param="prompts",
            )
        return list(prompt)
    unknown = sorted(set(prompt) - {"prompt", "prompt_token_ids"})
    if unknown or len(prompt) != 1:
        raise InvalidParameterError(
            "a prompt dict takes one of 'prompt' (a string) or 'prompt_token_ids' (a list of "
            f"token ids); got the keys {sorted(prompt)}",
            param="prompts",
        )
    if "prompt" in prompt:
        if not isinstance(prompt["prompt"], str):
            raise InvalidParameterError("'prompt' must be a string", param="prompts")
        return prompt["prompt"]
    ids = prompt["prompt_token_ids"]
    if isinstance(ids, str) or not isinstance(ids, SequenceABC):
        raise InvalidParameterError(
            "'prompt_token_ids' must be a list of token ids", param="prompts"
        )
    return list(ids)


def _as_params_list(params, count: int) -> list[SamplingParams]:
    if params is None:
        return [SamplingParams() for _ in range(count)]
    if isinstance(params, SamplingParams):
        return [params] * count
    if len(params) != count:
        raise InvalidParameterError(
            f"got {len(params)} sampling params for {count} prompts", param="sampling_params"
        )
    return list(params)
