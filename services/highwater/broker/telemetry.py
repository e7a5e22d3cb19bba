"""The broker's telemetry: bytes in and out per topic, produce and fetch durations, ISR
changes, client-quota throttle times per quota type and entity, gauges of its partitions
and of its fetch sessions, and (with tracing on) a span for each replica fetch that
brought records.

Gauges are read from the partitions at collection time, as Kafka's ReplicaManager gauges
are: under-replicated partitions (led here, ISR smaller than the replica set), partitions
under their min ISR (Kafka's UnderMinIsrPartitionCount), partitions led here, replicas
held, and each replica's log end offset and high watermark. The fetch session caches
(KIP-227: the Kafka listener's, of consumers, and the replica fetch's, of followers) are
read the same way, for Kafka's ``FetchSessionCache`` metrics: sessions
(``NumIncrementalFetchSessions``), partitions cached (``NumIncrementalFetchPartitionsCached``)
and sessions evicted (``IncrementalFetchSessionEvictionsPerSec``, as a cumulative count).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable
from typing import Final

from opentelemetry.metrics import CallbackOptions, Meter, Observation
from opentelemetry.semconv._incubating.attributes import messaging_attributes as messaging
from opentelemetry.trace import Span

from highwater.broker.fetch_sessions import FetchSessionCache
from highwater.broker.partitions import PartitionManager
from highwater.broker.replication import AlterPartitionProposal, IsrChange
from highwater.internal.v1 import replication_pb2 as rpb
from highwater.metadata.client_quotas import (
    CONSUMER_BYTE_RATE,
    PRODUCER_BYTE_RATE,
    REQUEST_PERCENTAGE,
    QuotaMatch,
)
from highwater.storage.log_manager import LogDirectory, LogManager
from highwater.storage.topic_partition import TopicPartition
from highwater.telemetry.instruments import duration_histogram, meter, observe, tracer

__all__ = [
    "ACKS",
    "CONSUMER",
    "PARTITION",
    "QUOTA_CLIENT_ID",
    "QUOTA_TYPE",
    "QUOTA_USER",
    "REPLICA",
    "TOPIC",
    "BrokerTelemetry",
    "FetchSessionMetrics",
]

TOPIC: Final = messaging.MESSAGING_DESTINATION_NAME
PARTITION: Final = messaging.MESSAGING_DESTINATION_PARTITION_ID
REPLICA: Final = {"highwater.fetch.replica": True}
"""The attribute of ``bytes_out`` sent to followers (and of their fetches' durations)."""
CONSUMER: Final = {"highwater.fetch.replica": False}
QUOTA_TYPE: Final = "highwater.quota.type"
QUOTA_USER: Final = "highwater.quota.user"
QUOTA_CLIENT_ID: Final = "highwater.quota.client_id"
_QUOTA_TYPES: Final = {
    PRODUCER_BYTE_RATE: "produce",
    CONSUMER_BYTE_RATE: "fetch",
    REQUEST_PERCENTAGE: "request",
}
ACKS: Final = "highwater.produce.acks"
"""The attribute of a produce request's duration: its ``acks`` (0, 1 or -1)."""


class BrokerTelemetry:
    """Instruments of one broker (see :mod:`highwater.telemetry`)."""

    def __init__(self, partitions: PartitionManager) -> None:
        self._tracer = tracer("broker")
        broker_meter = meter("broker")
        self.bytes_in = broker_meter.create_counter(
            "highwater.broker.in",
            unit="By",
            description="Record batch bytes appended by producers, per topic",
        )
        self.bytes_out = broker_meter.create_counter(
            "highwater.broker.out",
            unit="By",
            description="Record batch bytes sent to consumers (and, with "
            "highwater.fetch.replica=true, to followers), per topic",
        )
        self.fetch_duration = duration_histogram(
            broker_meter,
            "highwater.broker.fetch.duration",
            "Time from a fetch's arrival to its answer, long poll included (unary or over "
            "a FetchStream; highwater.fetch.replica=true for followers' fetches)",
        )
        self.produce_duration = duration_histogram(
            broker_meter,
            "highwater.broker.produce.duration",
            "Time from a produce request's arrival to its answer, replication to the ISR "
            "included with acks=all (unary or over a ProduceStream)",
        )
        self._throttle_time = broker_meter.create_histogram(
            "highwater.broker.quota.throttle_time",
            unit="ms",
            description="How long each answer a client quota governs was held (0: not "
            "throttled), per quota type (produce, fetch, request) and entity (the user "
            "and client id that share the quota; empty for a component the entity lacks)",
        )
        self._isr_shrinks = broker_meter.create_counter(
            "highwater.broker.isr.shrinks",
            unit="{change}",
            description="ISR shrinks this broker proposed as a partition leader",
        )
        self._isr_expands = broker_meter.create_counter(
            "highwater.broker.isr.expands",
            unit="{change}",
            description="ISR expansions this broker proposed as a partition leader",
        )
        gauges = (
            ("highwater.broker.under_replicated_partitions", _under_replicated, "{partition}",
             "Partitions led here whose ISR is smaller than their replica set"),
            ("highwater.broker.under_min_isr_partitions", _under_min_isr, "{partition}",
             "Partitions led here whose ISR is smaller than their effective "
             "min.insync.replicas: acks=all produces fail with NOT_ENOUGH_REPLICAS"),
            ("highwater.broker.leader_count", _leaders, "{partition}",
             "Partitions this broker leads"),
            ("highwater.broker.partition_count", _replicas, "{partition}",
             "Partition replicas this broker holds"),
            ("highwater.partition.log_end_offset", _log_end_offsets, "{offset}",
             "Log end offset of each replica held here"),
            ("highwater.partition.high_watermark", _high_watermarks, "{offset}",
             "High watermark of each replica held here"),
        )  # fmt: skip
        for name, read, unit, description in gauges:
            observe(broker_meter, name, partitions, read, unit=unit, description=description)
        log_dir_gauges = (
            ("highwater.log_dir.capacity", _dir_total, "By",
             "Size of the file system of each log directory (highwater.log_dir: its path)"),
            ("highwater.log_dir.usable", _dir_usable, "By",
             "Bytes still usable on the file system of each log directory"),
            ("highwater.log_dir.size", _dir_size, "By",
             "Bytes of the partition logs in each log directory"),
            ("highwater.log_dir.offline", _dir_offline, "1",
             "1 for a failed (offline) log directory, 0 for an online one"),
        )  # fmt: skip
        for name, read_dirs, unit, description in log_dir_gauges:
            observe(
                broker_meter,
                name,
                partitions.log_manager,
                read_dirs,
                unit=unit,
                description=description,
            )
        self.fetch_sessions = FetchSessionMetrics(broker_meter)

    def replica_fetch_span(self, leader_id: int, reply: rpb.ReplicaFetchResponse) -> Span | None:
        """A ``replica fetch`` span for a follower's fetch answer that carried records
        (started now, ended by the caller once they are appended); None when tracing is off
        or the answer carried none."""
        if self._tracer is None:
            return None
        fetched = sum(len(p.records) for t in reply.topics for p in t.partitions)
        if not fetched:
            return None
        return self._tracer.start_span(
            "replica fetch",
            attributes={
                "highwater.replica.leader_id": leader_id,
                "highwater.replica.fetched_bytes": fetched,
                "highwater.replica.partitions": sum(len(t.partitions) for t in reply.topics),
            },
        )

    def quota_throttled(self, key: str, quota: QuotaMatch, throttle_ms: int) -> None:
        """One answer a quota on ``key`` governed, held ``throttle_ms``."""
        self._throttle_time.record(
            throttle_ms,
            {
                QUOTA_TYPE: _QUOTA_TYPES[key],
                QUOTA_USER: quota.user,
                QUOTA_CLIENT_ID: quota.client_id,
            },
        )

    def isr_change_proposed(self, proposal: AlterPartitionProposal, topic: str) -> None:
        counter = self._isr_shrinks if proposal.change is IsrChange.SHRINK else self._isr_expands
        counter.add(1, {TOPIC: topic})


class FetchSessionMetrics:
    """Kafka's fetch session cache metrics over the caches :meth:`watch` is given (read at
    collection time, while each cache lives), with ``highwater.fetch.replica`` saying whose
    sessions they are: ``true`` for followers' (the replica fetch's cache), ``false`` for
    consumers' (the Kafka listener's)."""

    def __init__(self, meter_: Meter) -> None:
        self._caches: list[tuple[weakref.ref[FetchSessionCache], dict[str, bool]]] = []
        meter_.create_observable_gauge(
            "highwater.broker.fetch_session_count",
            [self._reader(len)],
            unit="{session}",
            description="Incremental fetch sessions held (Kafka's NumIncrementalFetchSessions)",
        )
        meter_.create_observable_gauge(
            "highwater.broker.fetch_session_partition_count",
            [self._reader(FetchSessionCache.partitions_cached)],
            unit="{partition}",
            description="Partitions held by the incremental fetch sessions, once per session "
            "(Kafka's NumIncrementalFetchPartitionsCached)",
        )
        meter_.create_observable_counter(
            "highwater.broker.fetch_session.evictions",
            [self._reader(lambda cache: cache.evictions)],
            unit="{session}",
            description="Fetch sessions evicted to make room for a new one (Kafka's "
            "IncrementalFetchSessionEvictionsPerSec, as a count: its rate is the metric's)",
        )

    def watch(self, cache: FetchSessionCache, *, replica: bool) -> None:
        """Report ``cache`` (followers' sessions if ``replica``, else consumers')."""
        self._caches.append((weakref.ref(cache), REPLICA if replica else CONSUMER))

    def _reader(
        self, read: Callable[[FetchSessionCache], int]
    ) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def callback(_options: CallbackOptions) -> Iterable[Observation]:
            observed = []
            for ref, attributes in self._caches:
                cache = ref()
                if cache is not None:
                    observed.append(Observation(read(cache), attributes))
            return observed

        return callback


def _under_replicated(partitions: PartitionManager) -> Iterable[Observation]:
    count = sum(
        1
        for p in partitions
        if p.is_leader and len(p.registration.isr) < len(p.registration.replicas)
    )
    return [Observation(count)]


def _under_min_isr(partitions: PartitionManager) -> Iterable[Observation]:
    count = sum(
        1 for p in partitions if p.leader_state is not None and p.leader_state.is_under_min_isr
    )
    return [Observation(count)]


def _leaders(partitions: PartitionManager) -> Iterable[Observation]:
    return [Observation(sum(1 for p in partitions if p.is_leader))]


def _replicas(partitions: PartitionManager) -> Iterable[Observation]:
    return [Observation(sum(1 for _ in partitions))]


def _log_end_offsets(partitions: PartitionManager) -> Iterable[Observation]:
    return [
        Observation(p.log_end_offset, _partition_attributes(p.topic_partition)) for p in partitions
    ]


def _high_watermarks(partitions: PartitionManager) -> Iterable[Observation]:
    return [
        Observation(p.high_watermark, _partition_attributes(p.topic_partition)) for p in partitions
    ]


def _partition_attributes(tp: TopicPartition) -> dict[str, str]:
    return {TOPIC: tp.topic, PARTITION: str(tp.partition)}


def _dir_attributes(directory: LogDirectory) -> dict[str, str]:
    return {
        "highwater.log_dir": str(directory.path),
        "highwater.log_dir.id": directory.directory_id,
    }


def _dir_total(log_manager: LogManager) -> Iterable[Observation]:
    return [
        Observation(total, _dir_attributes(d))
        for d, total, _, _ in log_manager.disk_usage()
        if total >= 0
    ]


def _dir_usable(log_manager: LogManager) -> Iterable[Observation]:
    return [
        Observation(usable, _dir_attributes(d))
        for d, _, usable, _ in log_manager.disk_usage()
        if usable >= 0
    ]


def _dir_size(log_manager: LogManager) -> Iterable[Observation]:
    return [
        Observation(size, _dir_attributes(d))
        for d, _, _, size in log_manager.disk_usage()
        if size >= 0
    ]


def _dir_offline(log_manager: LogManager) -> Iterable[Observation]:
    return [Observation(0 if d.online else 1, _dir_attributes(d)) for d in log_manager.log_dirs]
