"""Prometheus metrics (prometheus-client) for GET /metrics, named like vLLM's with a `localchat_`
prefix.

Engine gauges and totals are read from the engine's per-step stats snapshot at scrape time, so
serving adds no work per token for them. Latency histograms and per-reason request counts are kept
in plain Python numbers updated on the event loop thread (the only writer) and exported by a custom
collector: no lock is taken per token.
"""

from __future__ import annotations

import functools
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

# Histogram bounds in seconds, vLLM's. The time to the first token and the time between tokens
# share the scale from half a second to 80 s, each with finer bounds below it (TTFT also has longer
# ones above).
_HALF_SECOND_TO_80S = (0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
TTFT_BUCKETS = (
    *(0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25),
    *_HALF_SECOND_TO_80S,
    *(160.0, 640.0, 2560.0),
)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, *_HALF_SECOND_TO_80S)
E2E_BUCKETS = (
    *(0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0),
    *(120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0),
)
FINISHED_REASONS = ("stop", "length", "abort")

if TYPE_CHECKING:
    from localchat.engine.core.engine_client import EngineClient


class Histogram:
    """Bucket counts and a sum; `observe` is a bisect and two additions."""

    def __init__(self, name: str, documentation: str, buckets: tuple[float, ...]):
        self.name, self.documentation, self.buckets = name, documentation, buckets
        self.counts = [0] * (len(buckets) + 1)  # the last one is +Inf
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.buckets, value)] += 1
        self.sum += value

    def family(self, labels: dict[str, str] | None = None) -> HistogramMetricFamily:
        cumulative, running = [], 0
        for bound, count in zip((*map(str, self.buckets), "+Inf"), self.counts, strict=True):
            running += count
            cumulative.append((bound, running))
        labels = labels or {}
        family = HistogramMetricFamily(self.name, self.documentation, labels=list(labels))
        family.add_metric(list(labels.values()), cumulative, sum_value=self.sum)
        return family


class ServerMetrics:
    """Everything /metrics reports, over one engine; with `model_name` set (a several-model
    server), every sample carries a `model_name` label."""

    def __init__(self, engine: EngineClient, model_name: str | None = None):
        self.engine, self.model_name = engine, model_name
        self.request_success = dict.fromkeys(FINISHED_REASONS, 0)
        self.ttft = Histogram(
            "localchat_time_to_first_token_seconds", "Time to the first output token.", TTFT_BUCKETS
        )
        self.itl = Histogram(
            "localchat_inter_token_latency_seconds",
            "Time between consecutive output deltas of a request (one engine step).",
            ITL_BUCKETS,
        )
        self.e2e = Histogram(
            "localchat_e2e_request_latency_seconds",
            "Time from arrival to the last token.",
            E2E_BUCKETS,
        )
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)

    def finished(self, reason: str | None) -> None:
        reason = reason or "abort"
        self.request_success[reason] = self.request_success.get(reason, 0) + 1

    def collect(self):
        labels = {"model_name": self.model_name} if self.model_name else {}
        _gauge, _counter = (functools.partial(f, labels=labels) for f in (_gauge_of, _counter_of))
        stats = self.engine.stats()
        if stats is not None:
            yield _gauge(
                "localchat_num_requests_running",
                "Requests in the running batch.",
                stats.num_running,
            )
            yield _gauge(
                "localchat_num_requests_waiting",
                "Requests waiting to be scheduled.",
                stats.num_waiting,
            )
            yield _gauge(
                "localchat_kv_cache_usage_perc",
                "Fraction of KV cache blocks in use (0 to 1).",
                stats.kv_cache_usage,
            )
            yield _counter(
                "localchat_prefix_cache_queries",
                "Prompt tokens looked up in the prefix cache.",
                stats.prefix_cache_queries,
            )
            yield _counter(
                "localchat_prefix_cache_hits",
                "Prompt tokens found in the prefix cache.",
                stats.prefix_cache_hits,
            )
            yield _counter(
                "localchat_prompt_tokens",
                "Prompt tokens of accepted requests (generation and embeddings).",
                stats.prompt_tokens_total,
            )
            yield _counter(
                "localchat_generation_tokens", "Generated tokens.", stats.generation_tokens_total
            )
            yield _counter(
                "localchat_num_preemptions",
                "Sequences preempted for lack of KV blocks.",
                stats.num_preemptions,
            )
            yield _counter(
                "localchat_spec_decode_num_draft_tokens",
                "Tokens drafted by speculative decoding.",
                stats.spec_draft_tokens_total,
            )
            yield _counter(
                "localchat_spec_decode_num_accepted_tokens",
                "Drafted tokens the model agreed with (kept).",
                stats.spec_accepted_tokens_total,
            )
        success = CounterMetricFamily(
            "localchat_request_success",
            "Finished requests by finish reason.",
            labels=["finished_reason", *labels],
        )
        for reason, count in self.request_success.items():
            success.add_metric([reason, *labels.values()], count)
        yield success
        for histogram in (self.ttft, self.itl, self.e2e):
            yield histogram.family(labels)
        yield from self.engine.replica_metrics()  # --data-parallel-size: per-replica series

    def render(self) -> bytes:
        return generate_latest(self.registry)


class MultiModelMetrics:
    """/metrics of a several-model server: the ServerMetrics of every loaded model (each labelled
    with its model_name) merged into one family per metric, and the pool's own families."""

    def __init__(
        self,
        sources: Callable[[], Iterable[ServerMetrics]],
        extra: Callable[[], Iterable[Metric]] = list,
    ):
        self.sources, self.extra = sources, extra
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)

    def collect(self) -> Iterator[Metric]:
        families: dict[str, Metric] = {}
        for metrics in self.sources():
            for family in metrics.collect():
                merged = families.setdefault(family.name, family)
                if merged is not family:
                    merged.samples.extend(family.samples)
        yield from families.values()
        yield from self.extra()

    def render(self) -> bytes:
        return generate_latest(self.registry)


def _gauge_of(name: str, documentation: str, value: float, labels: dict) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, documentation, labels=list(labels))
    family.add_metric(list(labels.values()), value)
    return family


def _counter_of(name: str, documentation: str, value: float, labels: dict) -> CounterMetricFamily:
    family = CounterMetricFamily(name, documentation, labels=list(labels))
    family.add_metric(list(labels.values()), value)
    return family
