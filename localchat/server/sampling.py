"""Turn a decoded request into SamplingParams, rejecting OpenAI-level mistakes with a 400 naming the
field.

SamplingParams checks the ranges of its own fields; this adds the checks that span fields
(top_logprobs without logprobs, stream_options without stream, ...) and refuses features the engine
lacks, so nothing is silently ignored.
"""

from __future__ import annotations

from localchat.engine.sampling.sampling_params import MAX_LOGPROBS, SamplingParams
from localchat.errors import InvalidParameterError
from localchat.server.keep_alive import parse_keep_alive
from localchat.server.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    SamplingFields,
)


def _require(ok: bool, message: str, param: str) -> None:
    if not ok:
        raise InvalidParameterError(message, param=param)


# OpenAI's documented range (the engine itself accepts up to 100)
MAX_TEMPERATURE = 2.0


def _common_checks(request: SamplingFields) -> None:
    _require(
        request.stream_options is None or request.stream,
        "stream_options is only allowed with stream=true",
        "stream_options",
    )
    temperature = request.temperature
    _require(
        temperature is None or 0.0 <= temperature <= MAX_TEMPERATURE,
        f"temperature must be in [0, {MAX_TEMPERATURE:g}], got {temperature}",
        "temperature",
    )
    if request.keep_alive is not None:
        parse_keep_alive(request.keep_alive)


def _logit_bias(request: SamplingFields) -> dict[int, float] | None:
    """OpenAI's logit_bias: token ids as JSON object keys (strings), biases in [-100, 100]."""
    if not request.logit_bias:
        return None
    bias = {}
    for key, value in request.logit_bias.items():
        token = key.strip()
        _require(  # ASCII digits only: "²" is a digit to str.isdigit, and not to int()
            token.isascii() and token.isdecimal(),
            f"logit_bias keys must be token ids, got {key!r}",
            "logit_bias",
        )
        _require(
            -100.0 <= value <= 100.0,
            f"logit_bias values must be in [-100, 100], got {value}",
            "logit_bias",
        )
        bias[int(token)] = value
    return bias


def _params(
    request: SamplingFields,
    max_tokens: int | None,
    logprobs: int | None,
    prompt_logprobs: int | None = None,
    grammar: str | None = None,
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
        logit_bias=_logit_bias(request),
        allowed_token_ids=request.allowed_token_ids,
        bad_words=request.bad_words,
        grammar=grammar,
    )


def chat_sampling_params(
    request: ChatCompletionRequest, grammar: str | None = None
) -> SamplingParams:
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
    return _params(request, max_tokens, (top or 0) if request.logprobs else None, grammar=grammar)


def completion_sampling_params(
    request: CompletionRequest, grammar: str | None = None
) -> SamplingParams:
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
    return _params(request, request.max_tokens, request.logprobs, prompt_logprobs, grammar)
