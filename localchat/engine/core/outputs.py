"""What the engine returns: per-request outputs, as deltas (streaming) or accumulated (offline)."""

from __future__ import annotations

from dataclasses import dataclass, field

from localchat.engine.core.sequence import TokenLogprob


@dataclass
class CompletionOutput:
    """One sample of a request: its text and token ids (new ones only, in a delta), and why it
    stopped.

    finish_reason is None while running, then 'stop' (EOS, a stop token or string), 'length'
    (max_tokens or the context) or 'abort'. stop_reason is the stop string or stop token id that
    ended it, if any.
    """

    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] | None = None
    finish_reason: str | None = None
    stop_reason: str | int | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def cumulative_logprob(self) -> float | None:
        """The sum of the sampled tokens' logprobs (vLLM's field), where logprobs were asked for."""
        return None if self.logprobs is None else sum(t.logprob for t in self.logprobs)

    def merge(self, delta: CompletionOutput) -> None:
        self.text += delta.text
        self.token_ids.extend(delta.token_ids)
        if delta.logprobs is not None:
            if self.logprobs is None:
                self.logprobs = []
            self.logprobs.extend(delta.logprobs)
        self.finish_reason = delta.finish_reason
        self.stop_reason = delta.stop_reason


@dataclass
class RequestMetrics:
    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finished_time: float | None = None


@dataclass
class RequestOutput:
    """A request's samples. `text` and `token_ids` are those of the first sample (the only one if
    n=1).

    `num_cached_tokens` is how many prompt tokens came from the prefix cache instead of being
    computed. `prompt_logprobs` (with SamplingParams.prompt_logprobs) has an entry per prompt token,
    None for the first; a stream carries it in the request's first delta.
    """

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = False
    num_cached_tokens: int = 0
    metrics: RequestMetrics | None = None
    prompt_logprobs: list[TokenLogprob | None] | None = None

    @property
    def text(self) -> str:
        return self.outputs[0].text

    @property
    def token_ids(self) -> list[int]:
        return self.outputs[0].token_ids

    @property
    def num_output_tokens(self) -> int:
        return sum(len(o.token_ids) for o in self.outputs)

    def merge(self, delta: RequestOutput) -> None:
        """Fold a delta from the engine into this accumulated output."""
        by_index = {o.index: o for o in self.outputs}
        for piece in delta.outputs:
            if piece.index in by_index:
                by_index[piece.index].merge(piece)
            else:
                self.outputs.append(CompletionOutput(piece.index))
                self.outputs[-1].merge(piece)
        self.outputs.sort(key=lambda o: o.index)
        self.finished = delta.finished
        self.num_cached_tokens = delta.num_cached_tokens
        self.metrics = delta.metrics
        if delta.prompt_logprobs is not None:
            self.prompt_logprobs = delta.prompt_logprobs
