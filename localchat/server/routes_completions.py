"""POST /v1/completions: continue raw text or token ids (one prompt or a batch), whole or
streamed."""

from __future__ import annotations

from typing import Annotated

from litestar import Request, Response, post

from localchat.engine.core.outputs import CompletionOutput, RequestOutput
from localchat.engine.sampling.request_limits import check_most
from localchat.errors import InvalidParameterError
from localchat.server.logprobs import CompletionLogprobs, TokenStrings
from localchat.server.protocol import JSON_BODY, CompletionRequest
from localchat.server.sampling import completion_sampling_params
from localchat.server.state import require_api_key, server_for
from localchat.server.streaming import respond, start_generation
from localchat.server.structured import checked_grammar

_PROMPT_SHAPES = "a string, a list of strings, a list of token ids, or a list of lists of token ids"


def _is_token_ids(value) -> bool:
    return isinstance(value, list) and bool(value) and all(type(t) is int for t in value)


def parse_prompts(prompt) -> list[str | list[int]]:
    """The prompts of a request, each text or token ids."""
    if isinstance(prompt, str):
        return [prompt]
    if _is_token_ids(prompt):
        return [prompt]
    if prompt and all(isinstance(p, str) for p in prompt):
        return list(prompt)
    if prompt and all(_is_token_ids(p) for p in prompt):
        return list(prompt)
    raise InvalidParameterError(f"prompt must be {_PROMPT_SHAPES}", param="prompt")


class CompletionDialect:
    """Completions' choice objects: `text`, and the legacy logprobs with offsets running across
    chunks."""

    def __init__(self, token_str: TokenStrings, logprobs: bool, echoes: list[str], n: int):
        self.token_str, self.logprobs, self.echoes, self.n = token_str, logprobs, echoes, n
        self._builders: dict[int, CompletionLogprobs] = {}
        self._prompt_logprobs: dict[int, list] = {}

    def _logprobs(
        self, index: int, position: int, entries, output: RequestOutput, first: bool
    ) -> dict | None:
        """The choice's logprobs; its first piece starts with the echoed prompt's, when echo asked
        for them (the engine sends a prompt's logprobs once, in its first delta: kept for the
        prompt's other samples)."""
        if not self.logprobs:
            return None
        builder = self._builders.get(index)
        if builder is None:
            builder = self._builders[index] = CompletionLogprobs(self.token_str)
        if output.prompt_logprobs is not None:
            self._prompt_logprobs[position] = output.prompt_logprobs
        prompt = None
        if first and self.echoes and position in self._prompt_logprobs:
            prompt = (output.prompt_token_ids, self._prompt_logprobs[position])
        return builder.build(entries or [], prompt)

    def stream_choice(
        self, index: int, position: int, delta: RequestOutput, out: CompletionOutput, first: bool
    ) -> dict | None:
        text = self.echoes[position] + out.text if first and self.echoes else out.text
        if not (first or text or out.finish_reason or out.logprobs):
            return None
        return {
            "index": index,
            "text": text,
            "logprobs": self._logprobs(index, position, out.logprobs, delta, first),
            "finish_reason": out.finish_reason,
            "stop_reason": out.stop_reason,
        }

    def final_choice(
        self, index: int, position: int, output: RequestOutput, out: CompletionOutput
    ) -> dict:
        echo = self.echoes[position] if self.echoes else ""
        logprobs = self._logprobs(index, position, out.logprobs, output, True)
        return {
            "index": index,
            "text": echo + out.text,
            "logprobs": logprobs,
            "finish_reason": out.finish_reason,
            "stop_reason": out.stop_reason,
        }


@post("/v1/completions", status_code=200, guards=[require_api_key], summary="Create a completion")
async def create_completion(
    request: Request, data: Annotated[CompletionRequest, JSON_BODY]
) -> Response:
    server = server_for(request, data.model)
    defaults = server.engine.model_info.generation_defaults  # generation_config.json
    grammar, grammar_param = await checked_grammar(data) or (None, None)
    params = completion_sampling_params(defaults.fill_request(data), grammar)
    prompts = parse_prompts(data.prompt)
    check_most("prompt", len(prompts), "prompts", "prompts")
    generation = await start_generation(request, server, "cmpl", params, prompts, grammar_param)
    echoes = []
    if data.echo:
        echoes = [
            p if isinstance(p, str) else server.engine.detokenize(p, skip_special_tokens=False)
            for p in prompts
        ]
    dialect = CompletionDialect(server.token_str, data.logprobs is not None, echoes, params.n)
    return await respond(
        request, generation, dialect, data, model=server.model_name, object_name="text_completion"
    )
