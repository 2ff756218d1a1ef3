"""SamplingParams: how one request picks its tokens and when it stops."""

from __future__ import annotations

from dataclasses import dataclass

from localchat.engine.sampling.request_limits import check_most
from localchat.errors import InvalidParameterError

MAX_LOGPROBS = 20
INT64_MAX = 2**63 - 1


def _range_error(name: str, allowed: str, value) -> InvalidParameterError:
    return InvalidParameterError(f"{name} must be {allowed}, got {value!r}", param=name)


@dataclass(slots=True)
class SamplingParams:
    """Sampling and stopping for one request, validated on construction.

    temperature 0 means greedy. top_k <= 0 and top_p 1 disable those filters. `max_tokens=None`
    generates until the context is full. `seed` makes a request's samples reproducible whatever else
    shares its batch. `logprobs=k` returns the chosen token's logprob and the k most likely
    alternatives (0 <= k <= 20). `prompt_logprobs=k` returns the same for every prompt token after
    the first (with the request's first output); such a request computes its whole prompt, without
    the prefix cache.
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    max_tokens: int | None = None
    min_tokens: int = 0
    ignore_eos: bool = False
    stop: list[str] | str | None = None
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    logprobs: int | None = None
    skip_special_tokens: bool = True
    prompt_logprobs: int | None = None
    # logits processors (engine/sampling/logits_processors.py): an additive bias per token id
    # (-100..100), the only token ids allowed, words never to generate, an llguidance grammar to
    # follow
    logit_bias: dict[int, float] | None = None
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    grammar: str | None = None

    def __post_init__(self) -> None:
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        stop_token_ids = list(self.stop_token_ids or [])
        self.stop, self.stop_token_ids = stop, stop_token_ids
        self._validate(stop, stop_token_ids)

    def _validate(self, stop: list[str], stop_token_ids: list[int]) -> None:
        def check(ok: bool, name: str, allowed: str) -> None:
            if not ok:
                raise _range_error(name, allowed, getattr(self, name))

        check(isinstance(self.n, int) and 1 <= self.n <= 128, "n", "an integer in [1, 128]")
        check(0.0 <= self.temperature <= 100.0, "temperature", "in [0, 100]")
        check(0.0 < self.top_p <= 1.0, "top_p", "in (0, 1]")
        check(
            isinstance(self.top_k, int) and self.top_k >= -1,
            "top_k",
            "-1, 0 (disabled) or a positive integer",
        )
        check(0.0 <= self.min_p <= 1.0, "min_p", "in [0, 1]")
        check(0.0 < self.repetition_penalty <= 10.0, "repetition_penalty", "in (0, 10]")
        check(-2.0 <= self.presence_penalty <= 2.0, "presence_penalty", "in [-2, 2]")
        check(-2.0 <= self.frequency_penalty <= 2.0, "frequency_penalty", "in [-2, 2]")
        check(
            self.seed is None
            or (isinstance(self.seed, int) and -(2**63) <= self.seed <= INT64_MAX),
            "seed",
            "a 64-bit integer",
        )
        check(
            self.max_tokens is None or (isinstance(self.max_tokens, int) and self.max_tokens >= 1),
            "max_tokens",
            "an integer >= 1",
        )
        check(
            isinstance(self.min_tokens, int) and self.min_tokens >= 0,
            "min_tokens",
            "an integer >= 0",
        )
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise InvalidParameterError(
                f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})",
                param="min_tokens",
            )
        check(
            self.logprobs is None
            or (isinstance(self.logprobs, int) and 0 <= self.logprobs <= MAX_LOGPROBS),
            "logprobs",
            f"an integer in [0, {MAX_LOGPROBS}]",
        )
        check(
            self.prompt_logprobs is None
            or (
                isinstance(self.prompt_logprobs, int) and 0 <= self.prompt_logprobs <= MAX_LOGPROBS
            ),
            "prompt_logprobs",
            f"an integer in [0, {MAX_LOGPROBS}]",
        )
        self._check_sizes(stop, stop_token_ids)
        check(all(isinstance(s, str) and s for s in stop), "stop", "a list of non-empty strings")
        check(
            all(isinstance(t, int) and t >= 0 for t in stop_token_ids),
            "stop_token_ids",
            "a list of non-negative token ids",
        )
        check(
            all(
                isinstance(t, int) and t >= 0 and -100.0 <= b <= 100.0
                for t, b in (self.logit_bias or {}).items()
            ),
            "logit_bias",
            "a map of token ids to biases in [-100, 100]",
        )
        check(
            self.allowed_token_ids is None
            or (
                len(self.allowed_token_ids) > 0
                and all(isinstance(t, int) and t >= 0 for t in self.allowed_token_ids)
            ),
            "allowed_token_ids",
            "a non-empty list of non-negative token ids",
        )
        check(
            all(isinstance(w, str) and w for w in self.bad_words or []),
            "bad_words",
            "a list of non-empty strings",
        )

    def _check_sizes(self, stop: list[str], stop_token_ids: list[int]) -> None:
        """Each list within its RequestLimits bound (engine/sampling/request_limits.py)."""

        def most(name: str, items, limit: str, chars: str | None = None) -> None:
            check_most(name, len(items), limit)
            if chars is not None:
                longest = max((len(i) for i in items if isinstance(i, str)), default=0)
                check_most(name, longest, chars, "characters in each entry")

        most("stop", stop, "stop_strings", "stop_string_chars")
        most("stop_token_ids", stop_token_ids, "stop_token_ids")
        most("bad_words", self.bad_words or [], "bad_words", "bad_word_chars")
        most("logit_bias", self.logit_bias or {}, "logit_bias")
        most("allowed_token_ids", self.allowed_token_ids or [], "allowed_token_ids")

    @property
    def greedy(self) -> bool:
        return self.temperature < 1e-5

    @property
    def has_logits_processors(self) -> bool:
        return bool(self.logit_bias or self.allowed_token_ids or self.bad_words or self.grammar)

    @property
    def has_penalties(self) -> bool:
        return (
            self.repetition_penalty != 1.0
            or self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0
        )
