"""Broker benchmarks: producer, consumer and end-to-end latency beside NATS JetStream; failover.

Highwater runs as real processes on loopback (``bench/_highwater_cluster.py``): one
controller and one broker (acks=1), then one controller and three brokers (replication
factor 3, acks=all, ``min.insync.replicas=2``). It is driven by the project's own client
library from this process: ``AsyncProducer`` (batching by ``batch.size`` and ``linger.ms``)
and ``AsyncConsumer`` reading back what was produced. Extra rows send pre-built RecordBatch
v2 bytes through the Produce RPC and count fetched batches without decoding records: the
brokers' own limit, apart from the client's cost per record.

The peer is Debian's ``nats-server`` with JetStream on file storage, one server (R1) and a
three-server cluster (R3), driven by nats-py from this process with the same records
(``bench/_jetstream_peer.py``). Every record is 100 bytes; each topic or stream has one
partition. Each throughput phase runs three times on both systems and the median trial is
reported.

Failover: a topic of 1,000 partitions, replication factor 3, whose preferred leader is one
broker; that broker is killed with SIGKILL (time until every partition has another leader,
the controller fences it as soon as its liveness stream breaks), then restarted, made the
leader again by a preferred election, and stopped with SIGTERM (its controlled shutdown
moves the leaderships first).
"""

from __future__ import annotations

import asyncio
import contextlib
import cProfile
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from bench._highwater_cluster import (
    HighwaterCluster,
    describe_partitions,
    highwater_cluster,
    live_broker_ids,
    wait_for_leaders,
)
from bench._jetstream_peer import (
    SEND_TIME,
    Counted,
    connect_with_stream,
    consume_throughput,
    end_to_end_latencies,
    jetstream_available,
    jetstream_servers,
    nats_server_version,
    publish_throughput,
)
from bench._pure_python import run_pure
from bench.report import (
    Report,
    Row,
    SuiteSection,
    Target,
    at_least,
    at_most,
    hotspots_text,
    percentile,
)

RECORD_SIZE = 100
PAYLOAD = bytes(i % 251 for i in range(RECORD_SIZE))
TOPIC = "bench"
RAW_TOPIC = "bench-raw"
LATENCY_TOPIC = "bench-latency"
FAILOVER_TOPIC = "bench-failover"
FAILOVER_PARTITIONS = 1000

# The compiled codec's targets: the producer at 1 M records/s with one broker,
# 600 k with RF 3; the consumer at 1.5 M; end-to-end p50 at most JetStream R3's in the same
# run (None here: the peer's figure is the limit) and p99 at most 5 ms.
PRODUCER_TARGETS = {1: 1_000_000.0, 3: 600_000.0}
CONSUMER_TARGET = 1_500_000.0
LATENCY_RATE = 10_000.0
LATENCY_TARGETS: dict[str, float | None] = {"p50": None, "p99": 5.0}

# The throughput rows' producer batches as large as the Kafka suite gives librdkafka
# (bench/kafka.py): a Produce request costs the leader about 1.2-1.6 ms of CPU whatever its
# size, so at 128 KiB (about 1,180 records) the brokers, not the client, bound RF 3.
# `python -m bench.client` prints every producer row at both sizes.
PRODUCER_CONFIG = {"linger.ms": 5, "batch.size": 1_000_000}
LATENCY_PRODUCER_CONFIG = {"linger.ms": 0, "batch.size": 16 * 1024}
# The latency phase's pacing: each tick produces the records due by then (10 at 10,000/s).
PACING_TICK_S = 0.001
# How many records the producing loop queues between turns it gives the event loop: the
# sender sends, and delivery reports come back, only on those turns. Every 2,000 records,
# about 150,000 records were left waiting at a time and the garbage collector's passes over
# their futures cost a tenth of the run; every 500, about 5,000.
YIELD_EVERY = 500
# What the consuming loop asks consume() for at a time: Kafka's max.poll.records default.
CONSUME_BATCH = 500
# Each throughput phase runs TRIALS times, Highwater's and JetStream's alike, and the trial
# of median rate is reported, every trial's rate beside it: this machine's speed moves by
# about a tenth from one run to the next, for both.
TRIALS = 3
RAW_BATCH_RECORDS = 1000
RAW_IN_FLIGHT = 4
JETSTREAM_WINDOW = 2000

_T = TypeVar("_T")


@dataclass
class Workloads:
    """What one system (one Highwater cluster or one JetStream deployment) measured."""

    produced: Counted | None = None
    consumed: Counted | None = None
    raw_produced: Counted | None = None
    raw_fetched: Counted | None = None
    latencies_ms: list[float] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)
    trial_rates: dict[str, list[float]] = field(default_factory=dict)
    """Records/s of every trial of a phase ("produce", "consume", ...), in run order."""
    produced_per_batch: Counted | None = None
    """``produce()`` with one ``on_delivery_batch`` report per batch, no callback per record."""
    consumed_batches: Counted | None = None
    """``consume_batches()``: views of column buffers, no ``Message`` per record."""
    pure_produced: Counted | None = None
    pure_consumed: Counted | None = None
    pure_produced_per_batch: Counted | None = None
    pure_consumed_batches: Counted | None = None
    """The client rows again with the pure-Python codec (a child process)."""
    profiles: list[tuple[str, str]] = field(default_factory=list)
    """(title, cProfile table) of the client's runs, for the report."""

    async def median_trial(self, phase: str, action: Callable[[], Awaitable[Counted]]) -> Counted:
        """Run ``action`` :data:`TRIALS` times; the trial of median rate (each trial's rate
        is kept in :attr:`trial_rates`)."""
        trials = []
        rates = self.trial_rates[phase] = []
        for _ in range(TRIALS):
            trial = await action()
            trials.append(trial)
            rates.append(trial.per_second)
        return sorted(trials, key=lambda trial: trial.per_second)[len(trials) // 2]

    def trials_text(self, phase: str) -> str:
        """``runs: a · b · c records/s``, or nothing without trials."""
        rates = self.trial_rates.get(phase)
        if not rates or len(rates) < 2:
            return ""
        return "runs: " + " · ".join(f"{rate:,.0f}" for rate in rates) + " records/s"


@dataclass
class Failover:
    """Seconds of the failover runs (None: that part did not run)."""

    kill_to_leaders_s: float | None = None
    shutdown_exit_s: float | None = None
    shutdown_to_leaders_s: float | None = None
    rejoin_s: float | None = None
    elect_s: float | None = None
    same_partitions: bool = True
    errors: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Sizes:
    """The run's sizes, shrunk by ``--scale``."""

    records: int
    raw_batches: int
    latency_s: float
    warmup_s: float

    @classmethod
    def for_scale(cls, scale: float) -> Sizes:
        return cls(
            records=max(10_000, int(300_000 * scale)),
            raw_batches=max(20, int(600 * scale)),
            latency_s=max(2.0, 10.0 * scale),
            warmup_s=1.0,
        )


def _guarded(
    errors: dict[str, str], name: str, action: Callable[[], Awaitable[_T]]
) -> Awaitable[_T | None]:
    """Run one workload; a failure is recorded under ``name`` (its rows say NOT RUN)."""

    async def run() -> _T | None:
        try:
            return await action()
        except Exception as error:  # a failed workload must not hide the others
            errors[name] = f"{type(error).__name__}: {error}"[:200]
            return None

    return run()


# --- Highwater: the client library ---------------------------------------------------------


async def create_topic(
    bootstrap: str,
    topic: str,
    *,
    partitions: int = 1,
    replication_factor: int = 1,
    assignment: dict[int, list[int]] | None = None,
    config: dict[str, str] | None = None,
    timeout_s: float = 60.0,
) -> None:
    """Create ``topic`` through a broker (forwarded to the controller), retrying while the
    cluster starts."""
    from highwater.client.admin import AdminClient, AdminError, NewTopic, TopicExistsError

    if assignment is not None:
        new = NewTopic(topic, replica_assignment=assignment, config=config)
    else:
        new = NewTopic(topic, partitions, replication_factor, config=config)
    async with asyncio.timeout(timeout_s):
        while True:
            try:
                async with AdminClient(bootstrap, request_timeout_s=10) as admin:
                    results = await admin.create_topics([new])
            except AdminError:
                await asyncio.sleep(0.2)
                continue
            error = results[topic].error
            if error is None or isinstance(error, TopicExistsError):
                return
            await asyncio.sleep(0.2)  # brokers still registering


async def leader_address(cluster: HighwaterCluster, topic: str, partition: int = 0) -> str:
    """The address of the partition's leader, once it has one."""
    async with asyncio.timeout(60):
        while True:
            for address in cluster.live_addresses():
                described = await describe_partitions(address, topic)
                if described and described[partition].leader_id in cluster.broker_addresses:
                    return cluster.broker_addresses[described[partition].leader_id]
            await asyncio.sleep(0.05)


async def wait_full_isr(
    address: str, topic: str, partitions: int, replicas: int, timeout_s: float = 60
) -> None:
    """Until every partition's ISR holds all ``replicas`` replicas."""
    async with asyncio.timeout(timeout_s):
        while True:
            described = await describe_partitions(address, topic)
            if (
                described is not None
                and len(described) == partitions
                and all(len(p.isr) == replicas for p in described.values())
            ):
                return
            await asyncio.sleep(0.05)


async def produce_with_client(
    bootstrap: str,
    topic: str,
    acks: str,
    records: int,
    *,
    timeout_s: float = 180,
    per_batch: bool = False,
    handles: bool = True,
    config: Mapping[str, int | str] | None = None,
) -> Counted:
    """``records`` records through ``AsyncProducer``; every delivery report checked: one
    callback per record, or (``per_batch``) one ``on_delivery_batch`` report per batch.
    ``handles`` False: through ``produce_without_handle()``, which returns no handle.
    ``config``: producer settings over :data:`PRODUCER_CONFIG`."""
    from highwater.client.producer import AsyncProducer, BatchMetadata, Message

    failures: list[BaseException] = []
    reported = 0

    def delivered(error: BaseException | None, _message: Message) -> None:
        if error is not None:
            failures.append(error)

    def batch_delivered(error: BaseException | None, batch: BatchMetadata) -> None:
        nonlocal reported
        reported += batch.record_count
        if error is not None:
            failures.append(error)

    producer = AsyncProducer(
        {"bootstrap.servers": bootstrap, "acks": acks, **PRODUCER_CONFIG, **(config or {})},
        on_delivery_batch=batch_delivered if per_batch else None,
    )
    on_delivery = None if per_batch else delivered
    produce = producer.produce if handles else producer.produce_without_handle

    try:
        async with asyncio.timeout(timeout_s):
            await producer.send(topic, PAYLOAD)  # metadata and producer id, not timed
            started = time.perf_counter()
            for first in range(0, records, YIELD_EVERY):
                # No test per record of when to yield: the caller's loop is not the client's.
                for _ in range(min(YIELD_EVERY, records - first)):
                    produce(topic, PAYLOAD, on_delivery=on_delivery)
                await asyncio.sleep(0)  # let the sender drain what is ready
                while len(producer) > 200_000:
                    await producer.poll(0.01)
            left = await producer.flush()
            elapsed = time.perf_counter() - started
    finally:
        await producer.close(5)
    if failures or left or (per_batch and reported != records + 1):
        raise RuntimeError(f"{len(failures)} records failed, {left} undelivered: {failures[:1]}")
    return Counted(records, elapsed)


async def consume_with_client(
    bootstrap: str, topic: str, records: int, *, timeout_s: float = 120, batches: bool = False
) -> Counted:
    """Read ``records`` records from offset 0 through ``AsyncConsumer``: ``consume()``'s
    messages, each checked for an error, or (``batches``) ``consume_batches()``' views,
    each checked for an error and its values taken (no message per record)."""
    if batches:
        return await _consume_batches_with_client(bootstrap, topic, records, timeout_s)
    from highwater.client.consumer import AsyncConsumer, TopicPartition

    consumer = AsyncConsumer({"bootstrap.servers": bootstrap, "auto.offset.reset": "earliest"})
    seen = 0
    try:
        async with asyncio.timeout(timeout_s):
            consumer.assign([TopicPartition(topic, 0, 0)])
            started = time.perf_counter()
            while seen < records:
                messages = await consumer.consume(min(CONSUME_BATCH, records - seen), timeout=5)
                for message in messages:
                    if message.error() is not None:
                        raise RuntimeError(f"consumer error: {message.error()}")
                seen += len(messages)
            elapsed = time.perf_counter() - started
    finally:
        await consumer.close()
    return Counted(seen, elapsed)


async def latencies_with_client(
    bootstrap: str,
    topic: str,
    *,
    rate: float,
    duration_s: float,
    warmup_s: float,
    producer_config: dict[str, object] | None = None,
) -> list[float]:
    """Produce at ``rate`` records/s (acks=all) for ``duration_s`` after ``warmup_s``; each
    record's milliseconds from ``produce()`` to its arrival at a consumer polling the
    partition in this process (the send time travels in the record's value).
    ``producer_config``: settings over :data:`LATENCY_PRODUCER_CONFIG` (the probe's
    experiments; the suite uses none)."""
    from highwater.client.consumer import AsyncConsumer, TopicPartition
    from highwater.client.producer import AsyncProducer

    producer = AsyncProducer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            **LATENCY_PRODUCER_CONFIG,
            **(producer_config or {}),
        }
    )
    consumer = AsyncConsumer({"bootstrap.servers": bootstrap, "fetch.max.wait.ms": 500})
    latencies: list[float] = []
    padding = PAYLOAD[SEND_TIME.size :]
    measuring_from = 0
    stop = asyncio.Event()

    async def receive() -> None:
        while not stop.is_set():
            message = await consumer.poll(0.2)
            if message is None:
                continue
            now = time.perf_counter_ns()
            if message.error() is not None:
                raise RuntimeError(f"consumer error: {message.error()}")
            value = message.value()
            assert value is not None
            sent = SEND_TIME.unpack_from(value)[0]
            if sent >= measuring_from:
                latencies.append((now - sent) / 1e6)

    try:
        async with asyncio.timeout(warmup_s + duration_s + 60):
            await producer.send(topic, PAYLOAD)  # metadata and producer id
            _low, high = await consumer.get_watermark_offsets(TopicPartition(topic, 0))
            consumer.assign([TopicPartition(topic, 0, high)])
            receiver = asyncio.create_task(receive())
            loop = asyncio.get_running_loop()
            started = time.perf_counter()
            measuring_from = time.perf_counter_ns() + int(warmup_s * 1e9)
            total = int(rate * (warmup_s + duration_s))
            sent = measured = 0
            paced = loop.create_future()

            def pace() -> None:
                # Every millisecond, the records due by now. A timer callback, not a task
                # asleep: no future, task step and coroutine resumption per tick, about a
                # third of each tick's CPU (docs/benchmarks.md, issue 21).
                nonlocal sent, measured
                if paced.done():  # the phase was cancelled (its timeout) or failed
                    return
                try:
                    due = min(total, int((time.perf_counter() - started) * rate) + 1)
                    while sent < due:
                        now = time.perf_counter_ns()
                        producer.produce(topic, SEND_TIME.pack(now) + padding)
                        sent += 1
                        measured += now >= measuring_from
                except Exception as error:  # raised by the phase's await below
                    paced.set_exception(error)
                    return
                if sent < total:
                    loop.call_later(PACING_TICK_S, pace)
                else:
                    paced.set_result(None)

            pace()
            await paced
            await producer.flush()
            deadline = time.monotonic() + 10
            while len(latencies) < measured and time.monotonic() < deadline:
                if receiver.done():
                    break
                await asyncio.sleep(0.01)
            stop.set()
            await receiver
    finally:
        stop.set()
        await producer.close(5)
        await consumer.close()
    return latencies


# --- Highwater: the raw RPCs ---------------------------------------------------------------


async def produce_raw(address: str, topic: str, acks: int, batches: int) -> Counted:
    """``batches`` pre-built batches of :data:`RAW_BATCH_RECORDS` records through the
    Produce RPC to the partition leader at ``address``, :data:`RAW_IN_FLIGHT` at a time."""
    import grpc.aio
    from highwater.records import build_batch
    from highwater.records.record import SimpleRecord
    from highwater.v1 import broker_pb2 as pb
    from highwater.v1 import broker_pb2_grpc
    from highwater.v1.common_pb2 import ErrorCode

    batch = build_batch([SimpleRecord(value=PAYLOAD) for _ in range(RAW_BATCH_RECORDS)])
    request = pb.ProduceRequest(acks=acks, timeout_ms=30_000)
    request.topics.add(topic=topic).partitions.add(partition=0, record_batches=batch)
    remaining = batches

    async def sender(stub: broker_pb2_grpc.BrokerStub) -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            reply = await stub.Produce(request, timeout=30)
            answer = reply.topics[0].partitions[0]
            if answer.error != ErrorCode.NONE:
                raise RuntimeError(f"Produce answered {ErrorCode.Name(answer.error)}")

    async with grpc.aio.insecure_channel(address) as channel:
        stub = broker_pb2_grpc.BrokerStub(channel)
        await stub.Produce(request, timeout=30)  # connects and warms up, not timed
        started = time.perf_counter()
        async with asyncio.timeout(180):
            await asyncio.gather(*(sender(stub) for _ in range(RAW_IN_FLIGHT)))
        elapsed = time.perf_counter() - started
    return Counted(batches * RAW_BATCH_RECORDS, elapsed)


async def fetch_raw(address: str, topic: str, records: int) -> Counted:
    """Fetch the partition from offset 0 until ``records`` records came back, counting
    them from the batch headers (CRC checked, records not decoded)."""
    import grpc.aio
    from highwater.records import iter_batches
    from highwater.v1 import broker_pb2 as pb
    from highwater.v1 import broker_pb2_grpc
    from highwater.v1.common_pb2 import ErrorCode

    seen = offset = 0
    async with grpc.aio.insecure_channel(
        address, options=[("grpc.max_receive_message_length", 64 << 20)]
    ) as channel:
        stub = broker_pb2_grpc.BrokerStub(channel)
        started = time.perf_counter()
        async with asyncio.timeout(120):
            while seen < records:
                request = pb.FetchRequest(max_wait_ms=500, min_bytes=1, max_bytes=8 << 20)
                request.topics.add(topic=topic).partitions.add(
                    partition=0,
                    fetch_offset=offset,
                    partition_max_bytes=8 << 20,
                )
                answer = (await stub.Fetch(request, timeout=10)).topics[0].partitions[0]
                if answer.error != ErrorCode.NONE:
                    raise RuntimeError(f"Fetch answered {ErrorCode.Name(answer.error)}")
                for batch in iter_batches(answer.records):
                    if batch.next_offset > offset:
                        seen += batch.next_offset - max(offset, batch.base_offset)
                        offset = batch.next_offset
        elapsed = time.perf_counter() - started
    return Counted(seen, elapsed)


# --- Highwater: the runs -------------------------------------------------------------------


async def _consume_batches_with_client(
    bootstrap: str, topic: str, records: int, timeout_s: float
) -> Counted:
    from highwater.client.consumer import AsyncConsumer, TopicPartition

    consumer = AsyncConsumer({"bootstrap.servers": bootstrap, "auto.offset.reset": "earliest"})
    seen = 0
    try:
        async with asyncio.timeout(timeout_s):
            consumer.assign([TopicPartition(topic, 0, 0)])
            started = time.perf_counter()
            while seen < records:
                views = await consumer.consume_batches(min(CONSUME_BATCH, records - seen), 5)
                for view in views:
                    if view.error() is not None:
                        raise RuntimeError(f"consumer error: {view.error()}")
                    seen += len(view.values())
            elapsed = time.perf_counter() - started
    finally:
        await consumer.close()
    return Counted(seen, elapsed)


async def _profile_client(result: Workloads, bootstrap: str, sizes: Sizes) -> None:
    """cProfile tables of one producer run and one consumer run (compiled codec), for the
    client's per-record costs outside the codec (futures, callbacks, messages)."""
    records = max(10_000, sizes.records // 3)
    for title, run in (
        ("producer", lambda: produce_with_client(bootstrap, TOPIC, "1", records)),
        (
            "producer, per-batch reports",
            lambda: produce_with_client(bootstrap, TOPIC, "1", records, per_batch=True),
        ),
        ("consumer", lambda: consume_with_client(bootstrap, TOPIC, records)),
        (
            "consumer, consume_batches()",
            lambda: consume_with_client(bootstrap, TOPIC, records, batches=True),
        ),
    ):
        # CPU seconds of this process, not wall time: the machine is shared.
        profiler = cProfile.Profile(time.process_time)
        profiler.enable()
        try:
            await run()
        finally:
            profiler.disable()
        result.profiles.append(
            (
                f"Where the client's time goes: {title}, {records:,} records, 1 broker, acks=1, "
                "compiled codec (cProfile, CPU seconds; the benchmark's own loop included)",
                hotspots_text(profiler, top=14),
            )
        )


async def pure_client_trials(
    bootstrap: str, topic: str, acks: str, records: int
) -> dict[str, list[tuple[int, float]]]:
    """The producer's and the consumer's trials, ``(records, seconds)`` each: what
    ``bench._pure_python`` runs in a child process on the pure-Python codec."""
    result: dict[str, list[tuple[int, float]]] = {
        "produce": [],
        "consume": [],
        "produce per batch": [],
        "consume batches": [],
    }
    for _ in range(TRIALS):
        c = await produce_with_client(bootstrap, topic, acks, records)
        result["produce"].append((c.records, c.seconds))
    for _ in range(TRIALS):
        c = await consume_with_client(bootstrap, topic, records)
        result["consume"].append((c.records, c.seconds))
    for _ in range(TRIALS):
        c = await produce_with_client(bootstrap, topic, acks, records, per_batch=True)
        result["produce per batch"].append((c.records, c.seconds))
    for _ in range(TRIALS):
        c = await consume_with_client(bootstrap, topic, records, batches=True)
        result["consume batches"].append((c.records, c.seconds))
    return result


async def highwater_workloads(
    cluster: HighwaterCluster, replication: int, sizes: Sizes, report: Report
) -> Workloads:
    """Producer, raw produce, consumer, raw fetch (and with RF 3: end-to-end latency)."""
    result = Workloads()
    bootstrap = cluster.bootstrap
    acks, raw_acks = ("all", -1) if replication > 1 else ("1", 1)
    config = {"min.insync.replicas": "2"} if replication > 1 else None
    for topic in (TOPIC, RAW_TOPIC, LATENCY_TOPIC):
        await create_topic(bootstrap, topic, replication_factor=replication, config=config)
        leader = await leader_address(cluster, topic)
        await wait_full_isr(leader, topic, 1, replication)
    report.progress(f"broker: highwater RF {replication}: producer (client library)")
    produced = await _guarded(
        result.errors,
        "produce",
        lambda: result.median_trial(
            "produce", lambda: produce_with_client(bootstrap, TOPIC, acks, sizes.records)
        ),
    )
    result.produced = produced
    report.progress(f"broker: highwater RF {replication}: consumer (client library)")
    if produced is not None:
        # The untimed warm-up record is read back too.
        result.consumed = await _guarded(
            result.errors,
            "consume",
            lambda: result.median_trial(
                "consume", lambda: consume_with_client(bootstrap, TOPIC, sizes.records + 1)
            ),
        )
    if produced is not None:
        report.progress(f"broker: highwater RF {replication}: producer, per-batch reports")
        result.produced_per_batch = await _guarded(
            result.errors,
            "produce per batch",
            lambda: result.median_trial(
                "produce per batch",
                lambda: produce_with_client(bootstrap, TOPIC, acks, sizes.records, per_batch=True),
            ),
        )
        report.progress(f"broker: highwater RF {replication}: consumer, consume_batches()")
        result.consumed_batches = await _guarded(
            result.errors,
            "consume batches",
            lambda: result.median_trial(
                "consume batches",
                lambda: consume_with_client(bootstrap, TOPIC, sizes.records, batches=True),
            ),
        )
    if produced is not None:
        report.progress(f"broker: highwater RF {replication}: the client on the pure-Python codec")
        pure = await _guarded(
            result.errors,
            "pure",
            lambda: asyncio.to_thread(
                run_pure, "bench.broker:pure_client_trials", bootstrap, TOPIC, acks, sizes.records
            ),
        )
        if pure is not None:
            for phase, trials in pure.items():
                counted = [Counted(records, seconds) for records, seconds in trials]
                result.trial_rates[f"pure {phase}"] = [c.per_second for c in counted]
                median = sorted(counted, key=lambda c: c.per_second)[len(counted) // 2]
                if phase == "produce":
                    result.pure_produced = median
                elif phase == "consume":
                    result.pure_consumed = median
                elif phase == "produce per batch":
                    result.pure_produced_per_batch = median
                else:
                    result.pure_consumed_batches = median
    if produced is not None and replication == 1:
        report.progress("broker: highwater RF 1: profiling the client's producer and consumer")
        await _guarded(result.errors, "profile", lambda: _profile_client(result, bootstrap, sizes))
    report.progress(f"broker: highwater RF {replication}: raw Produce and Fetch")
    raw_leader = await leader_address(cluster, RAW_TOPIC)
    result.raw_produced = await _guarded(
        result.errors,
        "raw produce",
        lambda: result.median_trial(
            "raw produce",
            lambda: produce_raw(raw_leader, RAW_TOPIC, raw_acks, sizes.raw_batches),
        ),
    )
    if result.raw_produced is not None:
        total = result.raw_produced.records + RAW_BATCH_RECORDS  # and the warm-up batch
        result.raw_fetched = await _guarded(
            result.errors,
            "raw fetch",
            lambda: result.median_trial(
                "raw fetch", lambda: fetch_raw(raw_leader, RAW_TOPIC, total)
            ),
        )
    if replication > 1:
        report.progress(f"broker: highwater RF {replication}: end-to-end latency")
        # The throughput phases' writes are written out first, so that the kernel's
        # writeback of their pages does not stall the brokers' appends while latency is
        # measured (it held the first second's records for 200-500 ms).
        os.sync()
        latencies = await _guarded(
            result.errors,
            "latency",
            lambda: latencies_with_client(
                bootstrap,
                LATENCY_TOPIC,
                rate=LATENCY_RATE,
                duration_s=sizes.latency_s,
                warmup_s=sizes.warmup_s,
            ),
        )
        result.latencies_ms = sorted(latencies or [])
    return result


async def failover_runs(cluster: HighwaterCluster, report: Report) -> Failover:
    """kill -9 of the broker leading 1,000 partitions, then a controlled shutdown of it."""
    result = Failover()
    ids = sorted(cluster.brokers)
    victim, others = ids[0], ids[1:]
    watcher = cluster.broker_addresses[others[0]]
    assignment = {p: [victim, *others] for p in range(FAILOVER_PARTITIONS)}
    await create_topic(cluster.bootstrap, FAILOVER_TOPIC, assignment=assignment, timeout_s=120)
    await wait_for_leaders(watcher, FAILOVER_TOPIC, FAILOVER_PARTITIONS, led_by=victim)
    await wait_full_isr(watcher, FAILOVER_TOPIC, FAILOVER_PARTITIONS, len(ids), timeout_s=120)

    report.progress(f"broker: failover: kill -9 of broker {victim}, leader of 1,000 partitions")
    process = cluster.brokers[victim]
    killed = time.monotonic()
    process.kill()
    try:
        await wait_for_leaders(
            watcher, FAILOVER_TOPIC, FAILOVER_PARTITIONS, not_led_by=victim, timeout_s=120
        )
        result.kill_to_leaders_s = time.monotonic() - killed
    except (RuntimeError, TimeoutError) as error:
        result.errors.append(f"kill -9: {error}")
        return result

    report.progress(f"broker: failover: broker {victim} restarts and leads again")
    restarted = time.monotonic()
    process.start()
    topic = FAILOVER_TOPIC
    try:
        await asyncio.to_thread(_wait_listed, cluster, victim)
        await wait_full_isr(watcher, topic, FAILOVER_PARTITIONS, len(ids), timeout_s=120)
        result.rejoin_s = time.monotonic() - restarted
        report.progress(f"broker: failover: back in every ISR {result.rejoin_s:.1f} s after start")
        electing = time.monotonic()
        await _elect_preferred(cluster.bootstrap, topic)
        await wait_for_leaders(watcher, topic, FAILOVER_PARTITIONS, led_by=victim, timeout_s=60)
        result.elect_s = time.monotonic() - electing
    except (RuntimeError, TimeoutError) as error:
        # Fall back on a fresh topic whose preferred leader is the restarted broker.
        result.errors.append(f"preferred election did not bring the leaders back: {error}")
        result.same_partitions = False
        topic = FAILOVER_TOPIC + "-2"
        await create_topic(cluster.bootstrap, topic, assignment=assignment, timeout_s=120)
        await wait_for_leaders(watcher, topic, FAILOVER_PARTITIONS, led_by=victim)
        await wait_full_isr(watcher, topic, FAILOVER_PARTITIONS, len(ids), timeout_s=120)

    report.progress(f"broker: failover: SIGTERM to broker {victim} (controlled shutdown)")
    assert process.process is not None
    popen = process.process
    stopped = time.monotonic()

    async def exited() -> float:
        while popen.poll() is None:
            await asyncio.sleep(0.005)
        return time.monotonic() - stopped

    exit_task = asyncio.create_task(exited())
    process.terminate()
    try:
        await wait_for_leaders(
            watcher, topic, FAILOVER_PARTITIONS, not_led_by=victim, timeout_s=120, poll_s=0.01
        )
        result.shutdown_to_leaders_s = time.monotonic() - stopped
        result.shutdown_exit_s = await asyncio.wait_for(exit_task, 60)
    except (RuntimeError, TimeoutError) as error:
        result.errors.append(f"controlled shutdown: {error}")
    finally:
        exit_task.cancel()
        process.stop()
    return result


def _wait_listed(cluster: HighwaterCluster, node_id: int, timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    address = cluster.broker_addresses[node_id]
    while node_id not in live_broker_ids(address):
        if time.monotonic() > deadline:
            raise RuntimeError(f"broker {node_id} did not come back")
        time.sleep(0.1)


async def _elect_preferred(bootstrap: str, topic: str) -> None:
    from highwater.client.admin import AdminClient, ElectionNotNeededError

    async with AdminClient(bootstrap, request_timeout_s=30) as admin:
        results = await admin.elect_leaders(
            "preferred", [(topic, p) for p in range(FAILOVER_PARTITIONS)]
        )
    failed = [
        error
        for error in results.values()
        if error is not None and not isinstance(error, ElectionNotNeededError)
    ]
    if failed:
        raise RuntimeError(f"{len(failed)} preferred elections failed: {failed[0]}")


# --- JetStream -----------------------------------------------------------------------------


async def jetstream_workloads(
    servers: list[str], replicas: int, sizes: Sizes, report: Report
) -> Workloads:
    result = Workloads()
    client = await connect_with_stream(servers, replicas, window=JETSTREAM_WINDOW)
    try:
        report.progress(f"broker: JetStream R{replicas}: publish")
        result.produced = await _guarded(
            result.errors,
            "produce",
            lambda: result.median_trial(
                "produce",
                lambda: publish_throughput(
                    client, PAYLOAD, sizes.records, window=JETSTREAM_WINDOW, timeout_s=180
                ),
            ),
        )
        if result.produced is not None:
            report.progress(f"broker: JetStream R{replicas}: consume")
            result.consumed = await _guarded(
                result.errors,
                "consume",
                lambda: result.median_trial(
                    "consume", lambda: consume_throughput(client, sizes.records, timeout_s=120)
                ),
            )
        if replicas > 1:
            report.progress(f"broker: JetStream R{replicas}: end-to-end latency")
            os.sync()  # as before Highwater's latency phase
            latencies = await _guarded(
                result.errors,
                "latency",
                lambda: end_to_end_latencies(
                    client,
                    rate=LATENCY_RATE,
                    duration_s=sizes.latency_s,
                    warmup_s=sizes.warmup_s,
                    payload_size=RECORD_SIZE,
                    window=JETSTREAM_WINDOW,
                ),
            )
            result.latencies_ms = sorted(latencies or [])
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(client.close(), 10)
    return result


# --- the suite -----------------------------------------------------------------------------


def run(report: Report) -> None:
    sizes = Sizes.for_scale(report.scale)
    with (
        report.suite("broker", "Brokers (`highwater.broker`, `highwater.client`)") as section,
        report.data_dir("broker", need_bytes=2 * 1024**3) as root,
    ):
        peers: dict[int, Workloads] = {}
        missing = jetstream_available()
        if not missing:
            for replicas in (1, 3):
                os.sync()
                report.progress(f"broker: NATS JetStream R{replicas} on loopback")
                try:
                    with jetstream_servers(root / f"jetstream-r{replicas}", replicas) as servers:
                        peers[replicas] = asyncio.run(
                            jetstream_workloads(servers, replicas, sizes, report)
                        )
                except Exception as error:  # the peer failing leaves its cells empty
                    peers[replicas] = Workloads(errors={"all": f"{type(error).__name__}: {error}"})
        ours: dict[int, Workloads] = {}
        failover = Failover()
        for replication in (1, 3):
            # What the runs before wrote is on its way to the disk: written out now, so that
            # the kernel's writeback of one system's files does not run during another's.
            os.sync()
            report.progress(f"broker: highwater, {replication} broker(s) on loopback")
            with highwater_cluster(root / f"highwater-{replication}", replication) as cluster:
                ours[replication] = asyncio.run(
                    highwater_workloads(cluster, replication, sizes, report)
                )
                if replication == 3:
                    try:
                        failover = asyncio.run(failover_runs(cluster, report))
                    except Exception as error:
                        failover.errors.append(f"{type(error).__name__}: {error}")
        _throughput_rows(section, ours, peers)
        for workloads in ours.values():
            for title, text in workloads.profiles:
                section.add_profile(title, text)
        _latency_rows(section, ours.get(3), peers.get(3))
        _failover_rows(section, failover)
        _notes(section, sizes, ours, peers, failover, missing)


def _peer_name(replicas: int) -> str:
    return f"JetStream R{replicas}, file storage"


def _throughput_rows(
    section: SuiteSection, ours: dict[int, Workloads], peers: dict[int, Workloads]
) -> None:
    labels = {1: "1 broker, acks=1", 3: "3 brokers, RF 3, acks=all, min.insync.replicas=2"}
    for replication, label in labels.items():
        mine = ours.get(replication, Workloads())
        peer = peers.get(replication, Workloads())
        produced = mine.produced
        section.add(
            Row(
                f"producer, client library, 100-byte records, {label}",
                produced.per_second if produced else None,
                "records/s",
                peer_name=_peer_name(replication),
                peer_value=peer.produced.per_second if peer.produced else None,
                target=at_least(PRODUCER_TARGETS[replication], "records/s"),
                extra=_details(
                    produced, mine, "produce", "the client is the bottleneck (see notes)"
                ),
                error=mine.errors.get("produce", "did not run"),
                peer_extra=peer.trials_text("produce"),
            )
        )
        _pure_row(section, mine, "produce", mine.pure_produced, produced)
        per_batch = mine.produced_per_batch
        section.add(
            Row(
                f"producer, client library, `produce()` with per-batch delivery reports "
                f"(`on_delivery_batch`, no callback per record), {label}",
                per_batch.per_second if per_batch else None,
                "records/s",
                peer_name=_peer_name(replication),
                peer_value=peer.produced.per_second if peer.produced else None,
                target=at_least(PRODUCER_TARGETS[replication], "records/s"),
                extra=_details(per_batch, mine, "produce per batch"),
                error=mine.errors.get("produce per batch", "did not run"),
                peer_extra=peer.trials_text("produce"),
            )
        )
        _pure_row(section, mine, "produce per batch", mine.pure_produced_per_batch, per_batch)
        raw = mine.raw_produced
        section.add(
            Row(
                f"producer, pre-built batches of {RAW_BATCH_RECORDS:,} through the Produce RPC, "
                f"{label} (the broker's own limit)",
                raw.per_second if raw else None,
                "records/s",
                peer_name=_peer_name(replication),
                peer_value=peer.produced.per_second if peer.produced else None,
                extra=_details(raw, mine, "raw produce"),
                error=mine.errors.get("raw produce", "did not run"),
                peer_extra=peer.trials_text("produce"),
            )
        )
        consumed = mine.consumed
        section.add(
            Row(
                f"consumer, client library, from offset 0, {label}",
                consumed.per_second if consumed else None,
                "records/s",
                peer_name=_peer_name(replication),
                peer_value=peer.consumed.per_second if peer.consumed else None,
                target=at_least(CONSUMER_TARGET, "records/s"),
                extra=_details(consumed, mine, "consume"),
                error=mine.errors.get("consume", "did not run"),
                peer_extra=peer.trials_text("consume"),
            )
        )
        _pure_row(section, mine, "consume", mine.pure_consumed, consumed)
        views = mine.consumed_batches
        section.add(
            Row(
                f"consumer, client library, `consume_batches()` (views, values taken, no "
                f"`Message` per record), {label}",
                views.per_second if views else None,
                "records/s",
                peer_name=_peer_name(replication),
                peer_value=peer.consumed.per_second if peer.consumed else None,
                target=at_least(CONSUMER_TARGET, "records/s"),
                extra=_details(views, mine, "consume batches"),
                error=mine.errors.get("consume batches", "did not run"),
                peer_extra=peer.trials_text("consume"),
            )
        )
        _pure_row(section, mine, "consume batches", mine.pure_consumed_batches, views)
        fetched = mine.raw_fetched
        section.add(
            Row(
                f"Fetch RPC from offset 0, records counted from batch headers, {label} "
                "(the broker's own limit)",
                fetched.per_second if fetched else None,
                "records/s",
                peer_name=_peer_name(replication),
                peer_value=peer.consumed.per_second if peer.consumed else None,
                extra=_details(fetched, mine, "raw fetch"),
                error=mine.errors.get("raw fetch", "did not run"),
                peer_extra=peer.trials_text("consume"),
            )
        )


def _pure_row(
    section: SuiteSection,
    mine: Workloads,
    phase: str,
    pure: Counted | None,
    compiled: Counted | None,
) -> None:
    """The client row above again, on the pure-Python codec, beside the compiled figure."""
    section.add(
        Row(
            "the same, pure-Python codec (`HIGHWATER_PURE_PYTHON=1`, a child process)",
            pure.per_second if pure else None,
            "records/s",
            peer_name="compiled codec, the row above",
            peer_value=compiled.per_second if compiled else None,
            extra=_details(pure, mine, f"pure {phase}"),
            error=mine.errors.get("pure", "did not run"),
        )
    )


def _details(counted: Counted | None, workloads: Workloads, phase: str, note: str = "") -> str:
    """What a throughput row shows under its figure: MB/s and records of the median trial,
    every trial's rate, and ``note``."""
    parts = [_mb(counted), workloads.trials_text(phase), note]
    return "; ".join(part for part in parts if part)


def _mb(counted: Counted | None) -> str:
    if counted is None:
        return ""
    return f"{counted.per_second * RECORD_SIZE / 1e6:.1f} MB/s, {counted.records:,} records"


def _latency_rows(section: SuiteSection, mine: Workloads | None, peer: Workloads | None) -> None:
    ours = mine.latencies_ms if mine else []
    theirs = peer.latencies_ms if peer else []
    for name, limit in LATENCY_TARGETS.items():
        p = float(name[1:])
        section.add(
            Row(
                f"end-to-end latency {name}, produce() to consumer receipt, "
                f"{LATENCY_RATE:,.0f} records/s, RF 3, acks=all",
                percentile(ours, p) if ours else None,
                "ms",
                peer_name=_peer_name(3),
                peer_value=percentile(theirs, p) if theirs else None,
                target=at_most(limit, "ms") if limit is not None else _at_most_peer(),
                extra=f"{len(ours):,} records; p99.9 {percentile(ours, 99.9):.2f} ms"
                if ours
                else "",
                error=(mine.errors.get("latency", "did not run") if mine else "did not run"),
            )
        )


def _at_most_peer() -> Target:
    """At most the peer's figure in the same run (a latency: lower is better)."""
    return Target(f"≤ {_peer_name(3)}'s", lambda value, peer: peer is not None and value <= peer)


def _failover_rows(section: SuiteSection, failover: Failover) -> None:
    error = "; ".join(failover.errors) or "did not run"
    section.add(
        Row(
            f"failover: kill -9 of the broker leading {FAILOVER_PARTITIONS:,} partitions (RF 3) "
            "until every partition has a new leader",
            failover.kill_to_leaders_s,
            "s",
            extra="the controller fences the broker when its liveness stream breaks (see notes)",
            error=error,
        )
    )
    which = "the same" if failover.same_partitions else "a second topic's"
    section.add(
        Row(
            f"controlled shutdown (SIGTERM) of the broker leading {which} "
            f"{FAILOVER_PARTITIONS:,} partitions: until every partition has a new leader",
            failover.shutdown_to_leaders_s,
            "s",
            error=error,
        )
    )
    section.add(
        Row(
            f"the killed broker restarted: until it is back in all {FAILOVER_PARTITIONS:,} ISRs",
            failover.rejoin_s,
            "s",
            extra="process start, registration, catch-up fetches, ISR expansion",
            error=error,
        )
    )
    section.add(
        Row(
            f"preferred leader election of {FAILOVER_PARTITIONS:,} partitions (ElectLeaders) "
            "until every partition is led by the preferred replica",
            failover.elect_s,
            "s",
            error=error,
        )
    )
    section.add(
        Row(
            "controlled shutdown (SIGTERM): until the broker process exited",
            failover.shutdown_exit_s,
            "s",
            error=error,
        )
    )


def _notes(
    section: SuiteSection,
    sizes: Sizes,
    ours: dict[int, Workloads],
    peers: dict[int, Workloads],
    failover: Failover,
    missing_peer: str,
) -> None:
    section.note(
        "Highwater: real `highwater controller` (one voter) and `highwater broker` processes "
        "on loopback, default broker settings (no fsync per write, as Kafka's default "
        "flush.messages). Producer: the client library's `AsyncProducer` "
        f"(linger.ms={PRODUCER_CONFIG['linger.ms']}, batch.size={PRODUCER_CONFIG['batch.size']:,}, "
        f"defaults otherwise), {sizes.records:,} records to one partition, every delivery "
        f"report checked, the event loop given a turn every {YIELD_EVERY} records; "
        f"consumer: `AsyncConsumer.consume({CONSUME_BATCH})` (Kafka's max.poll.records "
        "default) from offset 0 of the same partition. All clients run in the benchmark's "
        "one Python process, on the same 2 CPUs as the servers; each deployment starts "
        "after `sync`, so that the kernel does not write one system's files out during "
        "another's runs, and so does each latency phase (the throughput phases' pages are "
        "written out before it). Each throughput phase, "
        f"Highwater's and JetStream's alike, runs {TRIALS} times in a row; the trial of median "
        "rate is the figure, and every trial's rate is listed under it."
    )
    section.note(
        "Client vs broker: the raw rows send one pre-built RecordBatch v2 of "
        f"{RAW_BATCH_RECORDS:,} records per Produce request ({RAW_IN_FLIGHT} requests in "
        f"flight, {sizes.raw_batches:,} requests, no idempotence) and fetch 8 MiB answers "
        "counting records from batch headers. Where a raw row is far above its client row, "
        "the client's Python cost per record is the bottleneck, not the broker. The client "
        "rows run on the compiled codec (`highwater.records._codec`: the append, the batch's "
        "encoding, the decoding and the messages made in C); the pure-Python rows under them "
        "repeat the same trials in a child process with `HIGHWATER_PURE_PYTHON=1`. What is "
        "left per record is the client's Python around the codec: the `produce()` call, its "
        "handle and the batch's bookkeeping, the delivery report's callback, the consumer's "
        "loop (see the profiles below). The per-batch rows report deliveries with one "
        "`on_delivery_batch` call per batch instead of a callback per record; the "
        "`consume_batches()` rows take each view's values with `values()` and make no "
        "`Message`."
    )
    section.note(
        f"JetStream: {nats_server_version()} (Debian), file storage (its default sync: every "
        "2 minutes, not per message), one server (R1) or three clustered on loopback (R3); "
        "one stream on one subject. Driven by nats-py from the same process: "
        f"`publish_async` with at most {JETSTREAM_WINDOW:,} unacknowledged publishes and every "
        "PubAck checked, one deadline over the whole phase; consumer: an ordered push consumer "
        "from the stream's start (a pull consumer's `fetch` measured about 3 times slower "
        "in nats-py). "
        "The publish rate is nats-py's per-message cost as much as the server's."
    )
    section.note(
        f"End-to-end latency: {LATENCY_RATE:,.0f} records/s paced for {sizes.latency_s:.0f} s "
        f"after a {sizes.warmup_s:.0f} s warm-up (not counted); each record carries "
        "`perf_counter_ns()` taken just before `produce()`/`publish_async()`, and the "
        "consumer in the same process subtracts it on receipt. Highwater: acks=all, "
        f"linger.ms={LATENCY_PRODUCER_CONFIG['linger.ms']} (a batch that is not full waits "
        "for its partition's request in flight, docs/client.md), `AsyncConsumer.poll()`; "
        "JetStream: an ordered push consumer (deliver policy new)."
    )
    section.note(
        "Failover: one controller, three brokers; a topic of 1,000 partitions, replication "
        "factor 3, the first broker first in every replica list (preferred leader of all). "
        "kill -9 of that broker: time until a surviving broker's Metadata names another "
        "leader for all 1,000 partitions (polled every 20 ms); the controller moves the "
        "leaderships when it fences the broker, which it does as soon as the broker's "
        "BrokerLiveness stream ends without the broker saying it leaves (the kernel closed "
        "the dead process's connection), not after broker.session.timeout.ms (9 s; that "
        "still covers a broker that is unreachable but keeps its connection). Then the "
        "broker restarts, rejoins every "
        "ISR, a preferred election makes it the leader of all 1,000 again, and SIGTERM starts "
        "its controlled shutdown: time until every partition has another leader (polled every "
        "10 ms) and until the process exited."
    )
    if not failover.same_partitions:
        section.note(
            "The preferred election did not bring the leaderships back to the restarted "
            "broker, so the controlled shutdown ran on a second topic of 1,000 partitions "
            "created with it as the preferred leader."
        )
    if missing_peer:
        section.note(f"JetStream did not run: {missing_peer}.")
    for system, runs in (("Highwater", ours), ("JetStream", peers)):
        for replicas, workloads in runs.items():
            for name, error in workloads.errors.items():
                section.note(f"{system} (RF/R{replicas}) {name} failed: `{error}`.")
    for error in failover.errors:
        section.note(f"Failover: {error}.")
