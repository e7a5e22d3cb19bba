"""``BrokerSettings``: a broker's own settings, with Kafka's names and defaults.

Shared by the broker's parts (lifecycle, request handling, the replica fetchers, the
AlterPartition sender), which each read the ones they need.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from highwater.storage.log_manager import LogManagerSettings

__all__ = ["BrokerSettings"]


@dataclass(frozen=True, slots=True)
class BrokerSettings:
    """The broker's own settings, with Kafka's names and defaults."""

    heartbeat_interval_ms: int = 2000
    """``broker.heartbeat.interval.ms``."""
    fenced_heartbeat_interval_ms: int = 100
    """How often a fenced broker heartbeats while it waits to be unfenced."""
    rack: str | None = None
    """``broker.rack``."""
    controlled_shutdown_timeout_ms: int = 10_000
    """How long ``stop`` waits for the controller to let the broker go."""
    replica_lag_time_max_ms: int = 30_000
    """``replica.lag.time.max.ms``: a follower not caught up for this long leaves the ISR."""
    replica_fetch_max_wait_ms: int = 500
    """``replica.fetch.wait.max.ms``: a follower's long poll."""
    replica_fetch_max_bytes: int = 1024 * 1024
    """``replica.fetch.max.bytes``: per partition."""
    replica_fetch_response_max_bytes: int = 10 * 1024 * 1024
    """``replica.fetch.response.max.bytes``."""
    replica_fetch_backoff_ms: int = 100
    """``replica.fetch.backoff.ms``: the wait after a failed fetch."""
    fetch_max_bytes: int = 55 * 1024 * 1024
    """``fetch.max.bytes``: the most one fetch answer carries, whatever it asks for (one
    batch more at most), below the 64 MiB gRPC message limit of the broker's server."""
    registration_retry_backoff_ms: int = 500
    """The wait between registrations while a previous incarnation's session lasts."""
    initial_registration_timeout_ms: int = 60_000
    """``initial.broker.registration.timeout.ms``: how long the first registration is
    tried (no controller answering, a previous incarnation's session lasting) before the
    broker gives up starting."""
    alter_partition_retry_backoff_ms: int = 100
    """The wait before an ISR change the controller refused for now is sent again."""
    quota_window_num: int = 11
    """``quota.window.num``: the samples a client quota's rate is measured over."""
    quota_window_size_seconds: int = 1
    """``quota.window.size.seconds``: the span of each sample."""
    connections_max_idle_ms: int = 600_000
    """``connections.max.idle.ms``: the Kafka listener closes a connection with no request
    in flight and no bytes moving for this long (-1: never)."""
    max_request_partition_size_limit: int = 2000
    """``max.request.partition.size.limit``: the most partitions one DescribeTopicPartitions
    answer holds, whatever the request asks."""
    log: LogManagerSettings = field(default_factory=LogManagerSettings)
    """Retention, compaction, flush and checkpoint intervals of the data directory."""
