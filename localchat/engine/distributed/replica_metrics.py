"""The `localchat_replica_*` families of a data-parallel server's /metrics, one sample per
replica: whether it serves, its requests in flight and routed, the prefix blocks the router counts
it as holding, and its engine's last stats."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from localchat.engine.core.llm_engine import EngineStats
from localchat.engine.distributed.replica_router import PrefixRouter

if TYPE_CHECKING:
    from localchat.engine.distributed.replica import Replica


def replica_metrics(
    replicas: Sequence[Replica], router: PrefixRouter, stats: Sequence[EngineStats | None]
) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
    """The families, from the replicas, the router and each replica's stats (None: none yet)."""
    up = GaugeMetricFamily(
        "localchat_replica_up",
        "1 while the replica serves, 0 once it failed.",
        labels=["replica"],
    )
    in_flight = GaugeMetricFamily(
        "localchat_replica_requests_in_flight",
        "Requests (an embedding call's: one per input) the server has routed to the replica "
        "and not seen finish.",
        labels=["replica"],
    )
    routed = CounterMetricFamily(
        "localchat_replica_routed_requests",
        "Requests routed to the replica, by why: a cached prefix, or the lightest load.",
        labels=["replica", "route"],
    )
    held = GaugeMetricFamily(
        "localchat_replica_prefix_blocks",
        "Prompt blocks the router counts the replica as holding (less those it reported evicted).",
        labels=["replica"],
    )
    for replica in replicas:
        label = str(replica.index)
        up.add_metric([label], 1 if replica.alive else 0)
        in_flight.add_metric([label], replica.in_flight)
        for route, count in replica.routed.items():
            routed.add_metric([label, route], count)
        held.add_metric([label], router.blocks_held(replica.index))
    yield from (up, in_flight, routed, held)
    for name, documentation, kind, read in _REPLICA_SERIES:
        family = kind(name, documentation, labels=["replica"])
        for replica, replica_stat in zip(replicas, stats, strict=True):
            if replica_stat is not None:
                family.add_metric([str(replica.index)], read(replica_stat))
        yield family


_REPLICA_SERIES: list[
    tuple[str, str, type[GaugeMetricFamily | CounterMetricFamily], Callable[[EngineStats], float]]
] = [
    (
        "localchat_replica_num_requests_running",
        "Requests in the replica's running batch.",
        GaugeMetricFamily,
        lambda s: s.num_running,
    ),
    (
        "localchat_replica_num_requests_waiting",
        "Requests waiting in the replica.",
        GaugeMetricFamily,
        lambda s: s.num_waiting,
    ),
    (
        "localchat_replica_kv_cache_usage_perc",
        "Fraction of the replica's KV cache blocks in use (0 to 1).",
        GaugeMetricFamily,
        lambda s: s.kv_cache_usage,
    ),
    (
        "localchat_replica_prefix_cache_queries",
        "Prompt tokens the replica looked up in its prefix cache.",
        CounterMetricFamily,
        lambda s: s.prefix_cache_queries,
    ),
    (
        "localchat_replica_prefix_cache_hits",
        "Prompt tokens the replica found in its prefix cache.",
        CounterMetricFamily,
        lambda s: s.prefix_cache_hits,
    ),
    (
        "localchat_replica_prompt_tokens",
        "Prompt tokens of requests the replica accepted.",
        CounterMetricFamily,
        lambda s: s.prompt_tokens_total,
    ),
    (
        "localchat_replica_generation_tokens",
        "Tokens the replica generated.",
        CounterMetricFamily,
        lambda s: s.generation_tokens_total,
    ),
    (
        "localchat_replica_num_preemptions",
        "Sequences the replica preempted for lack of KV blocks.",
        CounterMetricFamily,
        lambda s: s.num_preemptions,
    ),
]
