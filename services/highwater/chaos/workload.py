"""The clients of a chaos run: idempotent acks=all producers, group consumers that commit,
an observer of the group's committed offsets, and the final read of every partition.

Every operation goes into the history (:mod:`highwater.chaos.history`) as it is invoked
and as it completes; the clients are the library's own (:class:`AsyncProducer`,
:class:`AsyncConsumer`, :class:`AdminClient`), configured as an application that wants
no loss would configure them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass

from highwater.chaos.history import HistoryWriter
from highwater.client.admin import AdminClient, NewTopic, TopicExistsError
from highwater.client.consumer import (
    OFFSET_BEGINNING,
    AsyncConsumer,
    CommitFailedError,
    TopicPartition,
)
from highwater.client.producer import AsyncProducer, RecordMetadata
from highwater.errors import HighwaterError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WorkloadConfig:
    topic: str = "chaos"
    partitions: int = 3
    replication_factor: int = 3
    min_insync_replicas: int = 2
    producers: int = 2
    consumers: int = 2
    group: str = "chaos-group"
    writes_per_second: float = 40.0
    """Per producer."""
    max_in_flight: int = 30
    """Writes a producer has invoked and not seen completed, at most, per partition: a
    partition without a leader holds up only its own writes."""
    commit_interval_s: float = 1.0
    observe_interval_s: float = 1.0


def _text(value: bytes | None) -> str | None:
    return None if value is None else value.decode(errors="replace")


class Workload:
    """Drives the clients against the cluster at ``bootstrap``, recording into ``history``."""

    def __init__(self, bootstrap: str, history: HistoryWriter, config: WorkloadConfig) -> None:
        self.bootstrap = bootstrap
        self.history = history
        self.config = config

    # --- setup ------------------------------------------------------------------------

    async def create_topic(self, timeout_s: float = 90) -> None:
        """Create the topic (retrying while the cluster settles) and wait for its leaders."""
        cfg = self.config
        topic = NewTopic(
            cfg.topic,
            cfg.partitions,
            cfg.replication_factor,
            config={
                "min.insync.replicas": str(cfg.min_insync_replicas),
                "unclean.leader.election.enable": "false",
            },
        )
        deadline = time.monotonic() + timeout_s
        async with AdminClient(self.bootstrap, request_timeout_s=10) as admin:
            while True:
                try:
                    results = await admin.create_topics([topic])
                    error = results[cfg.topic].error
                    if error is None or isinstance(error, TopicExistsError):
                        break
                except HighwaterError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"could not create topic {cfg.topic}")
                await asyncio.sleep(0.5)
        self.history.record("note", "setup", text=f"topic {cfg.topic} created")
        await self.wait_healthy(timeout_s)

    async def wait_healthy(self, timeout_s: float) -> bool:
        """Wait until every partition has a leader and a full ISR; whether it happened."""
        cfg = self.config
        deadline = time.monotonic() + timeout_s
        async with AdminClient(self.bootstrap, request_timeout_s=5) as admin:
            while time.monotonic() < deadline:
                with contextlib.suppress(HighwaterError, TimeoutError):
                    described = await admin.describe_topics([cfg.topic])
                    partitions = described[cfg.topic].partitions
                    if len(partitions) == cfg.partitions and all(
                        p.leader is not None and len(p.isr) == len(p.replicas) for p in partitions
                    ):
                        return True
                await asyncio.sleep(0.5)
        return False

    # --- the run ----------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Produce, consume, commit and observe until ``stop`` is set; then the producers
        deliver what they hold (or fail it) and the consumers leave the group."""
        tasks = [asyncio.create_task(self._producer(i, stop)) for i in range(self.config.producers)]
        tasks += [
            asyncio.create_task(self._consumer(i, stop)) for i in range(self.config.consumers)
        ]
        tasks.append(asyncio.create_task(self._observer(stop)))
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _producer(self, number: int, stop: asyncio.Event) -> None:
        cfg = self.config
        name = f"p{number}"
        process = f"producer-{number}"
        producer = AsyncProducer(
            {
                "bootstrap.servers": self.bootstrap,
                "acks": "all",
                "enable.idempotence": True,
                "linger.ms": 5,
                "request.timeout.ms": 5000,
                "delivery.timeout.ms": 120_000,
                "retry.backoff.ms": 200,
            }
        )
        in_flight = [0] * cfg.partitions
        released = asyncio.Event()
        interval = 1.0 / cfg.writes_per_second
        sequence = 0
        turn = 0

        def completed(
            value: str, partition: int, invoked: float, future: asyncio.Future[RecordMetadata]
        ) -> None:
            in_flight[partition] -= 1
            released.set()
            if future.cancelled():
                self.history.record("write", process, status="fail", value=value, error="cancelled")
                return
            error = future.exception()
            if error is None:
                meta = future.result()
                self.history.record(
                    "write",
                    process,
                    status="ok",
                    value=value,
                    partition=meta.partition,
                    offset=meta.offset,
                    t_invoke=invoked,
                )
            else:
                self.history.record(
                    "write",
                    process,
                    status="fail",
                    value=value,
                    error=f"{type(error).__name__}: {error}"[:200],
                )

        try:
            while not stop.is_set():
                # The next partition in turn that has room for another write.
                open_partitions = [
                    p
                    for p in ((turn + i) % cfg.partitions for i in range(cfg.partitions))
                    if in_flight[p] < cfg.max_in_flight
                ]
                if not open_partitions:
                    released.clear()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(released.wait(), 1.0)
                    continue
                partition = open_partitions[0]
                turn = partition + 1
                value = f"{name}-{sequence}"
                sequence += 1
                op = self.history.record(
                    "write", process, status="invoke", value=value, partition=partition
                )
                try:
                    future = producer.produce(cfg.topic, value.encode(), partition=partition)
                except HighwaterError as e:
                    self.history.record(
                        "write", process, status="fail", value=value, error=str(e)[:200]
                    )
                else:
                    in_flight[partition] += 1
                    future.add_done_callback(
                        lambda f, v=value, p=partition, t=op["t"]: completed(v, p, t, f)  # type: ignore[misc]
                    )
                await asyncio.sleep(interval)
        finally:
            with contextlib.suppress(Exception):
                await producer.flush(30)
            with contextlib.suppress(Exception):
                await producer.close(1)

    async def _consumer(self, number: int, stop: asyncio.Event) -> None:
        cfg = self.config
        process = f"consumer-{number}"
        consumer = AsyncConsumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": cfg.group,
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "session.timeout.ms": 10_000,
                "heartbeat.interval.ms": 1000,
                "request.timeout.ms": 5000,
            }
        )
        loop = asyncio.get_running_loop()
        next_commit = loop.time() + cfg.commit_interval_s
        try:
            consumer.subscribe([cfg.topic])
            while not stop.is_set():
                try:
                    message = await consumer.poll(0.5)
                except Exception as e:  # a client's failure is recorded; the run goes on
                    self.history.record(
                        "note", process, text=f"poll failed: {type(e).__name__} {e}"[:200]
                    )
                    await asyncio.sleep(0.5)
                    continue
                if message is not None:
                    if message.error() is not None:
                        self.history.record(
                            "note", process, text=f"error message: {message.error()}"[:200]
                        )
                    else:
                        self.history.record(
                            "read",
                            process,
                            partition=message.partition(),
                            offset=message.offset(),
                            value=_text(message.value()),
                        )
                if loop.time() >= next_commit:
                    next_commit = loop.time() + cfg.commit_interval_s
                    await self._commit(consumer, process)
        finally:
            with contextlib.suppress(Exception):
                await self._commit(consumer, process)
            with contextlib.suppress(Exception):
                async with asyncio.timeout(15):
                    await consumer.close()

    async def _commit(self, consumer: AsyncConsumer, process: str) -> None:
        cfg = self.config
        invoked = self.history.now()
        try:
            async with asyncio.timeout(10):
                committed = await consumer.commit(asynchronous=False)
        except CommitFailedError as e:
            committed = e.partitions
        except Exception as e:  # a failed commit is recorded; the run goes on
            self.history.record(
                "commit",
                process,
                group=cfg.group,
                status="fail",
                error=f"{type(e).__name__} {e}"[:200],
            )
            return
        for tp in committed or []:
            if tp.offset is None:
                continue
            if tp.error is None:
                self.history.record(
                    "commit",
                    process,
                    group=cfg.group,
                    partition=tp.partition,
                    offset=tp.offset,
                    status="ok",
                    t_invoke=invoked,
                )
            else:
                self.history.record(
                    "commit",
                    process,
                    group=cfg.group,
                    partition=tp.partition,
                    offset=tp.offset,
                    status="fail",
                    error=str(tp.error)[:200],
                )

    async def _observer(self, stop: asyncio.Event) -> None:
        cfg = self.config
        async with AdminClient(self.bootstrap, request_timeout_s=5) as admin:
            while not stop.is_set():
                invoked = self.history.now()
                try:
                    offsets = await admin.list_consumer_group_offsets(cfg.group)
                except Exception:  # unavailable now; the next observation may succeed
                    offsets = {}
                for (topic, partition), meta in offsets.items():
                    if topic == cfg.topic:
                        self.history.record(
                            "committed",
                            "observer",
                            group=cfg.group,
                            partition=partition,
                            offset=meta.offset,
                            t_invoke=invoked,
                        )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), cfg.observe_interval_s)

    # --- after the run ----------------------------------------------------------------

    async def final_read(self, timeout_s: float = 60) -> dict[int, int]:
        """Read every partition from its beginning to its high watermark as one reader
        (process ``final``); the high watermark of each partition read to its end. A
        partition that cannot be read to its end in ``timeout_s`` gets a note and no
        ``final`` marker (the checker then reports it)."""
        cfg = self.config
        high_watermarks: dict[int, int] = {}
        async with AsyncConsumer(
            {"bootstrap.servers": self.bootstrap, "request.timeout.ms": 5000}
        ) as consumer:
            for partition in range(cfg.partitions):
                try:
                    async with asyncio.timeout(timeout_s):
                        high = await self._read_partition(consumer, partition)
                except (HighwaterError, TimeoutError) as e:
                    self.history.record(
                        "note",
                        "final",
                        text=f"final read of partition {partition} failed: {type(e).__name__} {e}"[
                            :300
                        ],
                    )
                    continue
                high_watermarks[partition] = high
        return high_watermarks

    async def _read_partition(self, consumer: AsyncConsumer, partition: int) -> int:
        topic = self.config.topic
        while True:
            try:
                _, high = await consumer.get_watermark_offsets(
                    TopicPartition(topic, partition), timeout=5
                )
                break
            except (HighwaterError, TimeoutError):
                await asyncio.sleep(0.5)
        consumer.assign([TopicPartition(topic, partition, OFFSET_BEGINNING)])
        records = 0
        position = 0
        while position < high:
            message = await consumer.poll(1.0)
            if message is None:
                continue
            if message.error() is not None:
                await asyncio.sleep(0.2)
                continue
            if message.offset() >= high:
                break
            self.history.record(
                "read",
                "final",
                partition=partition,
                offset=message.offset(),
                value=_text(message.value()),
            )
            records += 1
            position = message.offset() + 1
        self.history.record(
            "final", "final", partition=partition, high_watermark=high, records=records
        )
        return high
