"""Metadata at scale: images of 100,000 to 2,000,000 partitions, their snapshots, the
controller's decisions on them.

Everything here is the pure metadata layer and the pure controller, in this process, so
the figures are what the code costs per partition before any network or disk: the time
to replay a cluster's records into a :class:`~highwater.metadata.MetadataImage` (what a
restarted controller or a new broker does with the log), its memory, the snapshot's
encoding and loading (what a restarted controller and a broker catching up from a
snapshot do), one ISR change (copy-on-write), and the controller's decisions that touch a
tenth of the partitions at once: the tick that fences a silent broker and moves its
leaderships, and a controlled shutdown's heartbeat (the first batch of each, then every
batch that follows: their sum, mean and longest).

The cluster: 10 brokers, topics of 1,000 partitions with replication factor 3, leaders
spread evenly. The floor beside the replay is the same number of plain Python dict
insertions of one small tuple per partition, measured in the same run: what any Python
image costs before it holds anything useful.
"""

from __future__ import annotations

import gc
import os
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from highwater.controller import ControllerConfig, InMemoryMetadataStore, QuorumController
from highwater.controller_api.messages import BrokerHeartbeatRequest
from highwater.metadata import (
    MetadataImage,
    MetadataRecord,
    PartitionChangeRecord,
    PartitionRecord,
    RegisterBrokerRecord,
    TopicRecord,
    UnfenceBrokerRecord,
    load_snapshot_values,
    replay,
    snapshot_values,
)
from highwater.metadata.heap import ImageHeapFreezer

from bench.report import Report, Row, SuiteSection

T = TypeVar("T")

BROKERS = 10
PARTITIONS_PER_TOPIC = 1_000
SIZES = tuple(
    int(size) for size in os.environ.get("BENCH_SCALE_SIZES", "100000,1000000,2000000").split(",")
)
"""The partition counts measured; ``BENCH_SCALE_SIZES=100000,1000000`` runs fewer."""
SESSION_MS = 9_000


def cluster_records(partitions: int, brokers: int = BROKERS) -> list[MetadataRecord]:
    """``brokers`` brokers registered and unfenced, then topics of up to 1,000 partitions,
    RF 3, leaders spread evenly."""
    records: list[MetadataRecord] = []
    for broker_id in range(brokers):
        records.append(RegisterBrokerRecord(broker_id, f"inc-{broker_id}", broker_id))
        records.append(UnfenceBrokerRecord(broker_id, broker_id))
    per_topic = min(PARTITIONS_PER_TOPIC, partitions)
    for topic in range(partitions // per_topic):
        topic_id = f"topic-id-{topic:013d}"
        records.append(TopicRecord(f"topic-{topic}", topic_id))
        for partition_id in range(per_topic):
            first = (topic + partition_id) % brokers
            replicas = tuple((first + i) % brokers for i in range(3))
            records.append(PartitionRecord(topic_id, partition_id, replicas, replicas, first))
    return records


def timed(action: Callable[[], T]) -> tuple[T, float]:
    gc.collect()
    started = time.perf_counter()
    result = action()
    return result, time.perf_counter() - started


def traced_bytes(action: Callable[[], T]) -> tuple[T, int]:
    """The result of ``action`` and the bytes it still holds once it returned."""
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    result = action()
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return result, after - before


class FullCollections:
    """The CPU seconds of each full (generation 2) garbage collection while in use."""

    def __init__(self) -> None:
        self.pauses: list[float] = []
        self._started = 0.0

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            self._started = time.process_time()
        else:
            self.pauses.append(time.process_time() - self._started)

    def __enter__(self) -> FullCollections:
        gc.callbacks.append(self._on_gc)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._on_gc)

    def describe(self) -> str:
        if not self.pauses:
            return "no full collection"
        return f"{len(self.pauses)} full collections, {sum(self.pauses):.2f} s of CPU in all"


def _dict_floor(partitions: int) -> float:
    """Seconds to insert one small tuple per partition into a dict: the Python floor."""

    def fill() -> dict[tuple[int, int], tuple[int, ...]]:
        table: dict[tuple[int, int], tuple[int, ...]] = {}
        for p in range(partitions):
            table[(p // PARTITIONS_PER_TOPIC, p % PARTITIONS_PER_TOPIC)] = (p % BROKERS, p, 0)
        return table

    return timed(fill)[1]


def heartbeat(
    controller: QuorumController,
    image: MetadataImage,
    broker_id: int,
    now_ms: int,
    *,
    want_shutdown: bool = False,
) -> list[MetadataRecord]:
    request = BrokerHeartbeatRequest(
        broker_id, image.brokers[broker_id].broker_epoch, image.offset, want_shutdown=want_shutdown
    )
    return list(controller.broker_heartbeat(request, now_ms).records)


def _image_rows(report: Report, section: SuiteSection, partitions: int) -> MetadataImage:
    """Replay, memory, snapshot and copy-on-write rows; returns the image for the controller."""
    label = f"{partitions:,} partitions"
    records = cluster_records(partitions)
    report.progress(f"scale: {label}: replay")
    replay_s = timed(lambda: replay(records, len(records) - 1, 1))[1]
    floor_s = _dict_floor(partitions)
    section.add(
        Row(
            f"replay the log into an image, {label}",
            replay_s,
            "s",
            peer_name="dict insertions, one tuple per partition",
            peer_value=floor_s,
            extra=f"{replay_s / partitions * 1e6:.2f} µs per partition",
        )
    )
    report.progress(f"scale: {label}: memory")
    image, image_bytes = traced_bytes(lambda: replay(records, len(records) - 1, 1))
    assert image.partition_count == partitions
    section.add(
        Row(
            f"image memory per partition, {label}",
            image_bytes / partitions,
            "B",
            extra=f"{image_bytes / 2**20:,.0f} MiB in all (tracemalloc)",
        )
    )
    report.progress(f"scale: {label}: snapshot")
    values, encode_s = timed(lambda: snapshot_values(image))
    loaded, load_s = timed(lambda: load_snapshot_values(values, image.offset, 1))
    assert loaded.partition_count == partitions
    section.add(Row(f"snapshot encode, {label}", encode_s, "s", extra=f"{len(values):,} records"))
    section.add(
        Row(
            f"snapshot load (a restarted controller, a broker catching up), {label}",
            load_s,
            "s",
            extra=f"{load_s / partitions * 1e6:.2f} µs per partition",
        )
    )
    middle_topic = f"topic-id-{partitions // PARTITIONS_PER_TOPIC // 2:013d}"
    change = PartitionChangeRecord(middle_topic, 7, isr=(7, 8))
    change_s = timed(lambda: replay([change], image.offset + 1, image=image))[1]
    section.add(Row(f"one ISR change applied (copy-on-write), {label}", change_s * 1e3, "ms"))
    return image


def _controller_rows(
    report: Report, section: SuiteSection, partitions: int, image: MetadataImage
) -> None:
    """The controller's decisions that move a tenth of the leaderships at once."""
    label = f"{partitions:,} partitions"
    report.progress(f"scale: {label}: controller")
    # As a controller's metadata state machine does once it loaded an image this large.
    gc.unfreeze()
    ImageHeapFreezer().after_publish(image)
    store = InMemoryMetadataStore(image, epoch=1)
    controller = QuorumController(store.latest_image, ControllerConfig(), seed=1)
    now = 0
    activate_s = timed(lambda: controller.activate(now))[1]
    section.add(
        Row(
            f"controller activation (sessions; leader and ISR indexes built), {label}",
            activate_s,
            "s",
        )
    )
    now += SESSION_MS
    for broker_id in range(BROKERS - 1):
        store.append(heartbeat(controller, store.latest_image(), broker_id, now))
    tick, tick_s = timed(lambda: controller.tick(now))
    assert tick.response.fenced_brokers == (BROKERS - 1,)
    store.append(tick.records)
    section.add(
        Row(
            f"tick fencing a silent broker, its first batch of leader moves, {label}",
            tick_s,
            "s",
            extra=f"{len(tick.records):,} records",
        )
    )
    with FullCollections() as collections:
        moves = _finish_moves(controller, store, now, BROKERS - 1, tick_s)
    section.add(
        Row(
            f"longest full garbage collection during those moves (image frozen), {label}",
            max(collections.pauses, default=0.0) * 1e3,
            "ms",
            extra=collections.describe(),
        )
    )
    section.add(
        Row(
            f"the silent broker's remaining leader moves, by the next ticks, {label}",
            moves.seconds,
            "s",
            extra=f"{moves.batches} more batches, {_moved(store, BROKERS - 1):,} partitions "
            f"left; {moves.describe_leaders()}",
        )
    )
    section.add(
        Row(
            f"one batch of the silent broker's leader moves, mean, {label}",
            moves.seconds / max(moves.batches, 1) * 1e3,
            "ms",
            extra=f"longest {moves.longest * 1e3:,.0f} ms; a tick's decisions and their apply",
        )
    )
    latest = store.latest_image()
    shutdown, shutdown_s = timed(
        lambda: heartbeat(controller, latest, BROKERS - 2, now, want_shutdown=True)
    )
    store.append(shutdown)
    section.add(
        Row(
            f"controlled shutdown heartbeat, its first batch of leader moves, {label}",
            shutdown_s,
            "s",
            extra=f"{len(shutdown):,} records",
        )
    )
    moves = _finish_moves(controller, store, now, BROKERS - 2, shutdown_s)
    section.add(
        Row(
            f"the shutting-down broker's remaining leader moves, by the next ticks, {label}",
            moves.seconds,
            "s",
            extra=f"{moves.batches} more batches, "
            f"{moves.seconds / max(moves.batches, 1) * 1e3:,.0f} ms each "
            f"(longest {moves.longest * 1e3:,.0f} ms), {_moved(store, BROKERS - 2):,} "
            f"partitions left; {moves.describe_leaders()}",
        )
    )


@dataclass
class Moves:
    """The batches that followed a first batch of leader moves, until none were left."""

    batches: int = 0
    seconds: float = 0.0
    longest: float = 0.0
    leaders_moved_after: int = 0
    """Batches (the first one included) until the broker led nothing."""
    leaders_moved_s: float = 0.0
    """Their seconds (the first one's included)."""

    def describe_leaders(self) -> str:
        return (
            f"all its leaderships moved after {self.leaders_moved_after} batches, "
            f"{self.leaders_moved_s:.2f} s"
        )


def _finish_moves(
    controller: QuorumController,
    store: InMemoryMetadataStore,
    now: int,
    broker_id: int,
    first_s: float,
) -> Moves:
    """Tick until no leader moves are left: each tick's decisions and the apply of its
    records to the next image (what the next tick needs). ``first_s``: the first batch's
    seconds, which already moved some of ``broker_id``'s leaderships.

    Each batch is timed as it runs, its garbage collections included, as a controller's
    are: no forced collection before it (:func:`timed`'s), which would scan every record
    the in-memory store kept so far, hundreds of batches' worth, before each batch."""
    moves = Moves(leaders_moved_after=1, leaders_moved_s=first_s)
    leading = bool(store.latest_image().partitions_led_by(broker_id))
    while True:
        started = time.perf_counter()
        tick = controller.tick(now)
        if tick.records:
            store.append(tick.records)
        written, tick_s = len(tick.records), time.perf_counter() - started
        if not written:
            return moves
        moves.batches += 1
        moves.seconds += tick_s
        moves.longest = max(moves.longest, tick_s)
        if leading:
            moves.leaders_moved_after += 1
            moves.leaders_moved_s += tick_s
            leading = bool(store.latest_image().partitions_led_by(broker_id))


def _moved(store: InMemoryMetadataStore, broker_id: int) -> int:
    """The partitions ``broker_id`` still leads (0 once its moves are done)."""
    return len(store.latest_image().partitions_led_by(broker_id))


def run(report: Report) -> None:
    with report.suite(
        "scale", "Metadata at scale (`highwater.metadata`, `highwater.controller`)"
    ) as section:
        for size in SIZES:
            partitions = max(PARTITIONS_PER_TOPIC, int(size * report.scale))
            _controller_rows(report, section, partitions, _image_rows(report, section, partitions))
            gc.unfreeze()
            gc.collect()
        section.note(
            f"{BROKERS} brokers, topics of {PARTITIONS_PER_TOPIC:,} partitions, replication "
            "factor 3, leaders spread evenly; one process, pure code: no network, no disk. "
            "The replay is what a controller or broker does with the metadata log from its "
            "start; the snapshot load is what it does from a snapshot (partitions stored in "
            "columns, `PartitionsRecord`). The fencing tick and the controlled shutdown "
            "each move a tenth of the leaderships, in batches of at most "
            f"{ControllerConfig().leader_moves_per_batch:,} partition changes: the first "
            "with the decision, the rest by the ticks that follow (every 100 ms on a "
            "controller), each committed through Raft by the quorum (docs/raft.md): the "
            "broker's leaderships first, then its other ISR memberships, walked lazily in "
            "the index's order, so neither the first batch nor the later ones hold work "
            "proportional to the partitions. The controller builds the leader and ISR "
            "indexes when it becomes active; every later image derives them."
        )
