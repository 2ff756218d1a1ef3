"""Turn a decoded request into SamplingParams, rejecting OpenAI-level mistakes with a 400 naming the
field.

SamplingParams checks the ranges of its own fields; this adds the checks that span fields
(top_logprobs without logprobs, stream_options without stream, ...) and refuses features the engine
lacks, so nothing is silently ignored.
"""

from __future__ import annotations

from localchat.engine.sampling_params import MAX_LOGPROBS, SamplingParams
from localchat.errors import InvalidParameterError
from localchat.server.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    SamplingFields,
)


def _require(ok: bool, message: str, param: str) -> None:
    if not ok:
        raise InvalidParameterError(message, param=param)


def _common_checks(request: SamplingFields) -> None:
    _require(
        request.stream_options is None or request.stream,
        "stream_options is only allowed with stream=true",
        "stream_options",
    )
    _require(not request.logit_bias, "logit_bias is not supported", "logit_bias")


def _params(
    request: SamplingFields,
    max_tokens: int | None,
    logprobs: int | None,
    prompt_logprobs: int | None = None,
) -> SamplingParams:
    return SamplingParams(
        n=request.n,
        temperature=1.0 if request.temperature is None else request.temperature,
        top_p=1.0 if request.top_p is None else request.top_p,
        top_k=0 if request.top_k is None else request.top_k,
        min_p=0.0 if request.min_p is None else request.min_p,
        repetition_penalty=1.0
        if request.repetition_penalty is None
        else request.repetition_penalty,
        presence_penalty=request.presence_penalty,
        frequency_penalty=request.frequency_penalty,
        seed=request.seed,
        max_tokens=max_tokens,
        min_tokens=request.min_tokens,
        ignore_eos=request.ignore_eos,
        stop=request.stop,
        stop_token_ids=request.stop_token_ids,
        include_stop_str_in_output=request.include_stop_str_in_output,
        logprobs=logprobs,
        skip_special_tokens=request.skip_special_tokens,
        prompt_logprobs=prompt_logprobs,
    )


def chat_sampling_params(request: ChatCompletionRequest) -> SamplingParams:
    _common_checks(request)
    top = request.top_logprobs
    if top is not None:
        _require(
            0 <= top <= MAX_LOGPROBS,
            f"top_logprobs must be in [0, {MAX_LOGPROBS}], got {top}",
            "top_logprobs",
        )
        _require(
            request.logprobs or top == 0, "top_logprobs requires logprobs=true", "top_logprobs"
        )
    _require(
        not (request.add_generation_prompt and request.continue_final_message),
        "add_generation_prompt and continue_final_message cannot both be true",
        "continue_final_message",
    )
    _require(
        request.tool_choice in (None, "none", "auto"),
        "tool_choice other than 'none' or 'auto' is not supported",
        "tool_choice",
    )
    _require(
        request.response_format is None or request.response_format.get("type") == "text",
        "only response_format {'type': 'text'} is supported",
        "response_format",
    )
    max_tokens = (
        request.max_completion_tokens
        if request.max_completion_tokens is not None
        else request.max_tokens
    )
    param = "max_completion_tokens" if request.max_completion_tokens is not None else "max_tokens"
    _require(
        max_tokens is None or max_tokens >= 1,
        f"{param} must be at least 1, got {max_tokens}",
        param,
    )
    return _params(request, max_tokens, (top or 0) if request.logprobs else None)


def completion_sampling_params(request: CompletionRequest) -> SamplingParams:
    _common_checks(request)
    _require(request.suffix is None, "suffix is not supported", "suffix")
    _require(
        request.best_of is None or request.best_of == request.n, "best_of must equal n", "best_of"
    )
    if request.logprobs is not None:
        _require(
            0 <= request.logprobs <= MAX_LOGPROBS,
            f"logprobs must be in [0, {MAX_LOGPROBS}], got {request.logprobs}",
            "logprobs",
        )
    _require(
        request.max_tokens is None or request.max_tokens >= 1,
        f"max_tokens must be at least 1, got {request.max_tokens}",
        "max_tokens",
    )
    # with echo, the logprobs cover the echoed prompt too (the first token has none), as in OpenAI's
    # legacy API
    prompt_logprobs = request.logprobs if request.echo else None
    return _params(request, request.max_tokens, request.logprobs, prompt_logprobs)
