"""The control plane at scale, KRaft against etcd mode: the seeds' ZooKeeper-versus-KRaft
experiment (``python -m bench control-plane``, docs/control-plane.md).

For each partition count the suite measures, in both modes, the control-plane part of four
events on a cluster of 3 brokers with replication factor 3:

- failover: KRaft's new active controller already holds the image (it replayed the log as a
  follower, and built the indexes its decisions read: ``prepare_standby``) and only
  decides; etcd mode's new controller (the mode's own :class:`EtcdController`, in this
  process, over a real etcd) claims the controller key,
  reads every key once, decodes them into its image; the whole image is pushed to every
  broker (each broker decodes it); then each takes a topic creation;
- propagation of one topic creation (before the shutdown, while 3 brokers can take RF 3):
  KRaft's brokers replay one delta; the etcd-mode controller writes the keys it changed
  and the records are pushed to, and applied by, each of the 3 brokers;
- controlled shutdown, until the broker leads nothing: the heartbeat and the ticks after
  it decide the moves in batches of ``leader_moves_per_batch``; KRaft's brokers replay
  them; the etcd-mode controller writes each changed partition's state key (its
  compare-and-swap transactions) and the moves are pushed to the brokers as deltas;
- cold broker start: KRaft's broker loads a snapshot; etcd mode's broker decodes a push.

Beside them, one leader move pushed as the etcd-mode controller pushed it before delta
pushes (the whole image) and as it does now (:func:`push_figures`).

The brokers' decoding runs in this process (the brokers registered here have no
listeners: the controller pushes to nobody and the benchmark decodes what it would push).
Process clusters holding 100,000 partitions do not fit this 2-core machine, so no figure
includes broker processes, their gRPC hops or Raft's commit: these are the costs that grow
with the partition count. Beside them, the metadata write rate: ISR changes per second
through compare-and-swap on partition keys in etcd, and the KRaft controller's
AlterPartition decisions per second (before Raft's commit), same run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from highwater.controller import ControllerConfig, InMemoryMetadataStore, QuorumController
from highwater.controller.etcd_controller import EtcdController, EtcdControllerSettings
from highwater.controller_api import codec
from highwater.controller_api.messages import (
    AlterPartitionItem,
    AlterPartitionRequest,
    BrokerHeartbeatRequest,
    CreatableTopic,
    CreateTopicsRequest,
)
from highwater.etcd_metadata.connection import Compare, EtcdConnection, Put
from highwater.etcd_metadata.endpoints import EtcdStoreAddress
from highwater.etcd_metadata.keys import KeySpace, image_keys, partition_state_value
from highwater.etcd_metadata.session import EtcdSession
from highwater.metadata import (
    MetadataImage,
    MetadataRecord,
    load_snapshot_values,
    replay,
    snapshot_values,
)
from highwater.metadata.delta import MetadataDelta
from highwater.metadata.heap import ImageHeapFreezer
from highwater.metadata.records import PartitionChangeRecord, decode_record, encode_record

from bench import scale
from bench._control_plane_processes import process_rows
from bench._etcd_peer import etcd_available, etcd_cluster
from bench.report import Report, Row, SuiteSection

BROKERS = 3
PARTITIONS_PER_TOPIC = 1_000
SIZES = (1_000, 10_000, 100_000, 1_000_000)
MODES = ("kraft", "etcd")
RATE_SECONDS = 3.0


def cluster_records(partitions: int) -> list[MetadataRecord]:
    """3 brokers registered and unfenced; topics of up to 1,000 partitions, RF 3."""
    return scale.cluster_records(partitions, BROKERS)


def cluster_image(partitions: int) -> MetadataImage:
    """The image of :func:`cluster_records`: built once per size, shared by both modes'
    measures (at 1,000,000 partitions the replay alone takes tens of seconds)."""
    records = cluster_records(partitions)
    return replay(records, len(records) - 1, 1)


def _clock() -> float:
    gc.collect()
    return time.perf_counter()


def _active_controller(image: MetadataImage) -> tuple[InMemoryMetadataStore, QuorumController]:
    store = InMemoryMetadataStore(image, epoch=1)
    # Every move of the controlled shutdown (b) in the one decision it times (by default
    # the controller writes 1,000 partition changes a batch, the rest in later ticks).
    config = ControllerConfig(leader_moves_per_batch=max(image.partition_count, 1))
    controller = QuorumController(store.latest_image, config, seed=1)
    controller.activate(0)
    for broker_id in range(BROKERS):
        store.append(scale.heartbeat(controller, store.latest_image(), broker_id, 1))
    return store, controller


def _create_topic(controller: QuorumController, name: str) -> list[MetadataRecord]:
    request = CreateTopicsRequest((CreatableTopic(name, 1, 3),))
    result = controller.create_topics(request)
    if not result.records:
        raise RuntimeError(f"the controller refused topic {name}: {result.response}")
    return list(result.records)


def kraft_figures(image: MetadataImage) -> dict[str, float]:
    """Seconds of each event's control-plane part in KRaft mode, and AlterPartition/s, on
    the cluster ``image`` (:func:`cluster_image`)."""
    figures: dict[str, float] = {}
    # As KRaft's processes do with an image this large (their metadata state machine,
    # `ImageHeapFreezer`): the image leaves the garbage collector's full collections. The
    # etcd-mode controller builds its image from etcd's keys and does not, so the heap is
    # unfrozen again before its measures.
    gc.unfreeze()
    ImageHeapFreezer().after_publish(image)
    try:
        return _kraft_figures(image, figures)
    finally:
        gc.unfreeze()


def _kraft_figures(image: MetadataImage, figures: dict[str, float]) -> dict[str, float]:
    # (a) failover: the standby's image is in memory, with the indexes it built while it
    # followed (`QuorumController.prepare_standby`); it activates and takes a change.
    QuorumController(lambda: image, ControllerConfig(), seed=1).prepare_standby()
    started = _clock()
    store, controller = _active_controller(image)
    store.append(_create_topic(controller, "after-failover"))
    figures["failover"] = time.perf_counter() - started
    # (d) propagation (before the shutdown, while 3 brokers can take RF 3): a topic
    # creation, then each broker replays the delta.
    brokers = [store.latest_image() for _ in range(BROKERS)]
    started = _clock()
    delta = _create_topic(controller, "propagated")
    for image_of_broker in brokers:
        replay(delta, image_of_broker.offset + len(delta), image=image_of_broker)
    figures["propagation"] = time.perf_counter() - started
    # (b) controlled shutdown of broker 2: the heartbeat and the ticks after it decide the
    # moves in batches (leader_moves_per_batch); each broker replays them.
    latest = store.latest_image()
    started = _clock()
    moves = scale.heartbeat(controller, latest, 2, 2, want_shutdown=True)
    store.append(moves)
    now_ms = 2
    while store.latest_image().partitions_led_by(2):
        now_ms += 1
        batch = list(controller.tick(now_ms).records)
        if not batch:
            raise RuntimeError("a controlled shutdown's leader moves stopped before the end")
        store.append(batch)
        moves += batch
    for _ in range(BROKERS):
        replay(moves, store.latest_image().offset, image=latest)
    figures["controlled_shutdown"] = time.perf_counter() - started
    figures["controlled_shutdown_moves"] = float(len(latest.partitions_led_by(2)))
    # (c) cold broker start: the broker loads the latest snapshot.
    values = snapshot_values(store.latest_image())
    started = _clock()
    load_snapshot_values(values, store.latest_image().offset, 1)
    figures["broker_start"] = time.perf_counter() - started
    # AlterPartition rate: ISR shrinks and expands of one partition, decided by the controller.
    figures["alter_partition_per_s"] = _alter_partition_rate(store, controller)
    return figures


def _alter_partition_rate(store: InMemoryMetadataStore, controller: QuorumController) -> float:
    topic_id = "topic-id-0000000000000"
    changes = 0
    stop_at = time.perf_counter() + RATE_SECONDS
    started = time.perf_counter()
    while time.perf_counter() < stop_at:
        image = store.latest_image()
        partition = image.partition(topic_id, 0)
        assert partition is not None
        isr = (partition.leader,) if len(partition.isr) > 1 else partition.replicas
        isr = tuple(b for b in isr if image.brokers[b].is_active) or (partition.leader,)
        leader = partition.leader
        request = AlterPartitionRequest(
            leader,
            image.brokers[leader].broker_epoch,
            (
                AlterPartitionItem(
                    topic_id, 0, partition.leader_epoch, partition.partition_epoch, isr
                ),
            ),
        )
        result = controller.alter_partition(request)
        store.append(result.records)
        changes += 1
    return changes / (time.perf_counter() - started)


SETUP_TXN_OPS = 1024
"""Keys per transaction when the benchmark fills etcd before a measure (its etcd is started
with ``--max-txn-ops`` this large; the controller keeps etcd's default of 128)."""
ETCD_ARGS = (
    "--quota-backend-bytes",
    str(8 * 1024**3),
    "--max-txn-ops",
    str(SETUP_TXN_OPS),
)
"""The benchmark's etcd: a backend quota of 8 GiB (etcd's largest recommended; the default
2 GiB is about 4 copies of a 1,000,000-partition prefix, and nothing is compacted between
sizes) and larger set-up transactions. ``--max-request-bytes`` stays at etcd's 1.5 MiB:
1,024 partition states are about 150 KB, a topic key of 1,000 partitions about 16 KB."""


async def _fill(connection: EtcdConnection, keys: dict[str, bytes]) -> None:
    """The set-up: put ``keys`` in transactions of :data:`SETUP_TXN_OPS`, 8 in flight."""
    items = list(keys.items())
    batches = [items[i : i + SETUP_TXN_OPS] for i in range(0, len(items), SETUP_TXN_OPS)]
    for first in range(0, len(batches), 8):
        await asyncio.gather(
            *(
                connection.txn((), [Put(k, v) for k, v in batch])
                for batch in batches[first : first + 8]
            )
        )


def _push(image: MetadataImage) -> MetadataImage:
    """A push of the whole image: encoded once, decoded by each broker; one broker's image."""
    values = snapshot_values(image)
    pushed = image
    for _ in range(BROKERS):
        pushed = load_snapshot_values(values, image.offset, 1)
    return pushed


def _push_delta(image: MetadataImage, values: Sequence[bytes], offset: int) -> MetadataImage:
    """A delta push: each broker applies the encoded ``values`` to its image (of the same
    base: one image stands for the 3)."""
    applied = image
    for _ in range(BROKERS):
        applied = MetadataDelta(image).replay_all(decode_record(v) for v in values).apply(offset, 1)
    return applied


async def _settled(controller: EtcdController, done: Callable[[MetadataImage], bool]) -> None:
    """Until the controller's image satisfies ``done`` (its ticks write the rest of a
    shutdown's leader moves, batch by batch)."""
    async with asyncio.timeout(3600):
        while not done(controller.image):
            await asyncio.sleep(0.02)


async def _controller_call(controller: EtcdController, rpc: Any, request: Any) -> None:
    response = await controller.call(rpc, request)
    error = getattr(response, "error", 0) or next(
        (t.error for t in getattr(response, "topics", ()) if t.error), 0
    )
    if error:
        raise RuntimeError(f"the etcd-mode controller refused {rpc.name}: {response}")


async def etcd_figures(
    endpoints: list[str], image: MetadataImage, figures: dict[str, float] | None = None
) -> dict[str, float]:
    """Seconds of each event's control-plane part in etcd mode on the cluster ``image``
    (:func:`cluster_image`), and CAS ISR changes/s (into ``figures``, each printed as it
    is measured).

    The controller is the mode's own :class:`EtcdController` over the real etcd, in this
    process: it campaigns, reads the prefix and builds its image, decides, and writes the
    keys its decisions changed (:func:`~highwater.etcd_metadata.keys.changed_keys`,
    :func:`~highwater.controller.etcd_controller.plan_writes`). The 3 brokers here have no
    listeners, so it pushes to nobody: the benchmark decodes each push as the 3 brokers
    would (the whole image after a failover, the records of a change otherwise)."""
    partitions = image.partition_count
    address = EtcdStoreAddress(
        tuple((h, int(p)) for h, p in (e.rsplit(":", 1) for e in endpoints)),
        cluster=f"bench-{partitions}",
    )
    space = KeySpace(address.prefix)
    # Generous per-call timeouts: the machine is shared, and no kill detection is measured.
    connection = EtcdConnection(address, timeout_s=60.0, range_timeout_s=600.0)
    session = EtcdSession(connection, ttl_s=600)
    recorded = _Figures(f"etcd, {partitions:,}", figures if figures is not None else {})
    controller: EtcdController | None = None
    try:
        keys = image_keys(image, space)
        recorded["etcd_keys"] = float(len(keys))
        await _fill(
            connection,
            {k: partition_state_value(v, 0) if "/partitions/" in k else v for k, v in keys.items()},
        )
        del keys
        await connection.txn((), [Put(space.metadata_offset, str(image.offset).encode())])
        await session.start()
        lease = session.lease_id
        assert lease is not None
        await connection.txn(
            (), [Put(space.broker_id(b), b'{"listeners": []}', lease) for b in range(BROKERS)]
        )
        controller = EtcdController(
            node_id=0,
            address="127.0.0.1:1",
            connection=connection,
            space=space,
            session=session,
            cluster_id="bench",
            settings=EtcdControllerSettings(
                # No failure detection is measured: sessions outlive the run.
                controller=ControllerConfig(broker_session_timeout_ms=3_600_000),
                push_history_records=10 * partitions,
                seed=1,
            ),
        )
        # (a) failover: the candidate reads every key, builds its image and claims the
        # controller key; the whole image is pushed to every broker; then it takes a topic
        # creation (its keys written, the records pushed).
        started = _clock()
        await controller.start()
        await controller.wait_active(timeout_s=3600)
        recorded["failover_load"] = time.perf_counter() - started
        loaded = controller.image
        pushed_at = time.perf_counter()
        brokers_image = _push(loaded)
        recorded["failover_push"] = time.perf_counter() - pushed_at
        created_at = time.perf_counter()
        await _controller_call(
            controller,
            codec.CREATE_TOPICS,
            CreateTopicsRequest((CreatableTopic("after-failover", 1, 3),)),
        )
        brokers_image = _push_delta(
            brokers_image, _since(controller, loaded.offset), controller.image.offset
        )
        recorded["failover_change"] = time.perf_counter() - created_at
        recorded["failover"] = time.perf_counter() - started
        # (d) propagation of a topic creation (before the shutdown, while 3 brokers can take
        # RF 3): keys written, the delta pushed to each.
        before = controller.image
        started = _clock()
        await _controller_call(
            controller,
            codec.CREATE_TOPICS,
            CreateTopicsRequest((CreatableTopic("propagated", 1, 3),)),
        )
        brokers_image = _push_delta(
            brokers_image, _since(controller, before.offset), controller.image.offset
        )
        recorded["propagation"] = time.perf_counter() - started
        # (b) controlled shutdown of broker 2: the heartbeat and the ticks after it decide
        # the moves in batches (leader_moves_per_batch), each written (the moved
        # partitions' state keys); the moves pushed to each broker.
        before = controller.image
        started = _clock()
        await _controller_call(
            controller,
            codec.BROKER_HEARTBEAT,
            BrokerHeartbeatRequest(
                2, before.brokers[2].broker_epoch, before.offset, want_shutdown=True
            ),
        )
        await _settled(controller, lambda image: not image.partitions_led_by(2))
        brokers_image = _push_delta(
            brokers_image, _since(controller, before.offset), controller.image.offset
        )
        recorded["controlled_shutdown"] = time.perf_counter() - started
        recorded["controlled_shutdown_moves"] = float(len(before.partitions_led_by(2)))
        # (c) cold broker start: the broker decodes the push of the whole image.
        latest = controller.image
        values = snapshot_values(latest)
        started = _clock()
        load_snapshot_values(values, latest.offset, 1)
        recorded["broker_start"] = time.perf_counter() - started
        del values
        recorded["prefix_reads"] = float(controller.prefix_reads)
        await controller.stop()
        controller = None
        recorded["cas_isr_change_per_s"] = await _cas_rate(connection, space)
    finally:
        if controller is not None:
            await controller.stop()
        await session.stop()
        await connection.close()
    return recorded.values


class _Figures:
    """The figures of one size, each printed as it is set."""

    def __init__(self, label: str, values: dict[str, float]) -> None:
        self.label = label
        self.values = values

    def __setitem__(self, name: str, value: float) -> None:
        self.values[name] = value
        print(f"control-plane: {self.label}: {name} = {value:.6g}", flush=True)


def _since(controller: EtcdController, offset: int) -> tuple[bytes, ...]:
    values = controller.records_since(offset)
    if values is None:
        raise RuntimeError(f"the controller's history does not reach back to offset {offset}")
    return values


def push_figures(image: MetadataImage) -> dict[str, float]:
    """One leader move pushed to the 3 brokers, as the etcd-mode controller pushed it before
    delta pushes (the whole image: encoded once, decoded by each broker) and as it pushes it
    now (the one record: each broker applies it to its image): seconds and bytes."""
    topic = next(iter(image.topics.by_name.values()))
    partition = topic.partitions[0]
    leader = next(r for r in partition.replicas if r != partition.leader)
    move = [PartitionChangeRecord(topic.topic_id, 0, leader=leader)]
    after = MetadataDelta(image).replay_all(move).apply(image.offset + 1, 1)
    gc.collect()
    started = time.perf_counter()
    values = snapshot_values(after)
    for _ in range(BROKERS):
        load_snapshot_values(values, after.offset, 1)
    full_s = time.perf_counter() - started
    started = time.perf_counter()
    delta = [encode_record(r) for r in move]
    for _ in range(BROKERS):
        MetadataDelta(image).replay_all(decode_record(v) for v in delta).apply(after.offset, 1)
    delta_s = time.perf_counter() - started
    return {
        "leader_move_push_full": full_s,
        "leader_move_push_delta": delta_s,
        "leader_move_push_full_bytes": float(sum(len(v) for v in values)),
        "leader_move_push_delta_bytes": float(sum(len(v) for v in delta)),
    }


async def _cas_rate(connection: EtcdConnection, space: KeySpace) -> float:
    """ISR changes of one partition, each a compare-and-swap on its state key's revision."""
    key = space.partition_state("topic-0", 0)
    _, current = await connection.get(key)
    assert current is not None
    revision = current.mod_revision
    state = json.loads(current.value)
    changes = 0
    stop_at = time.perf_counter() + RATE_SECONDS
    started = time.perf_counter()
    while time.perf_counter() < stop_at:
        state["isr"] = state["isr"][:1] if len(state["isr"]) > 1 else [0, 1, 2]
        state["partition_epoch"] += 1
        result = await connection.txn(
            (Compare(key, "mod", revision),), (Put(key, json.dumps(state).encode()),)
        )
        assert result.succeeded
        revision = result.revision
        changes += 1
    return changes / (time.perf_counter() - started)


def measure(
    sizes: tuple[int, ...], modes: tuple[str, ...], data_dir: Path
) -> dict[str, dict[int, dict[str, float]]]:
    """``{mode: {partitions: {measure: value}}}``, for each size every mode in the order
    given; each size's figures printed as JSON as they are known (a long run stopped early
    keeps them). Nothing is done twice: each size's image is built once for both modes and
    the whole-image push figures (:func:`push_figures`), and one etcd cluster serves every
    size (each under its own prefix)."""
    results: dict[str, dict[int, dict[str, float]]] = {m: {} for m in modes}
    with contextlib.ExitStack() as stack:
        endpoints: list[str] = []
        if "etcd" in modes:
            if not etcd_available():
                raise RuntimeError("etcd is not installed (Debian's etcd-server)")
            endpoints = stack.enter_context(etcd_cluster(data_dir, extra_args=ETCD_ARGS))
        for partitions in sizes:
            print(f"control-plane: {partitions:,} partitions: the image", flush=True)
            image = cluster_image(partitions)
            for mode in modes:
                print(f"control-plane: {mode}, {partitions:,} partitions", flush=True)
                figures = results[mode][partitions] = {}
                if mode == "kraft":
                    figures.update(kraft_figures(image))
                else:
                    asyncio.run(etcd_figures(endpoints, image, figures))
                    figures.update(push_figures(image))
                figures["load"] = os.getloadavg()[0]
                _print_figures(mode, partitions, figures)
            del image
    return results


def _print_figures(mode: str, partitions: int, figures: dict[str, float]) -> None:
    print(json.dumps({mode: {partitions: figures}}), flush=True)


MEASURES = {
    "failover": "controller failover until a metadata change is taken",
    "controlled_shutdown": "controlled shutdown until its leaderships moved",
    "broker_start": "cold broker start: its image loaded",
    "propagation": "one topic creation until every broker's image has it",
}


def plot(results: dict[str, dict[int, dict[str, float]]], directory: Path) -> list[Path]:
    """One log-log PNG per measure, both modes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for name, title in MEASURES.items():
        figure, axes = plt.subplots(figsize=(5, 3.5))
        for mode, by_size in results.items():
            sizes = sorted(by_size)
            axes.plot(sizes, [by_size[s][name] for s in sizes], marker="o", label=mode)
        axes.set_xscale("log")
        axes.set_yscale("log")
        axes.set_xlabel("partitions")
        axes.set_ylabel("seconds")
        axes.set_title(title, fontsize=9)
        axes.legend()
        figure.tight_layout()
        path = directory / f"control-plane-{name.replace('_', '-')}.png"
        figure.savefig(path, dpi=90)
        plt.close(figure)
        paths.append(path)
    return paths


def _add_rows(section: SuiteSection, results: dict[str, dict[int, dict[str, float]]]) -> None:
    sizes = sorted({s for by_size in results.values() for s in by_size})
    for partitions in sizes:
        kraft = results.get("kraft", {}).get(partitions)
        etcd = results.get("etcd", {}).get(partitions)
        for name, title in MEASURES.items():
            section.add(
                Row(
                    f"{title}, {partitions:,} partitions",
                    kraft[name] if kraft else None,
                    "s",
                    peer_name="etcd mode",
                    peer_value=etcd[name] if etcd else None,
                    error="" if kraft else "KRaft not run",
                )
            )
        if etcd and "leader_move_push_full" in etcd:
            section.add(
                Row(
                    f"etcd mode: one leader move pushed to 3 brokers, {partitions:,} partitions "
                    "(the whole image, as before delta pushes)",
                    etcd["leader_move_push_full"],
                    "s",
                    peer_name="a delta (the one record)",
                    peer_value=etcd["leader_move_push_delta"],
                    extra=f"{etcd['leader_move_push_full_bytes']:,.0f} bytes against "
                    f"{etcd['leader_move_push_delta_bytes']:,.0f}",
                )
            )
        if kraft and etcd:
            section.add(
                Row(
                    f"ISR changes/s: AlterPartition decisions beside etcd CAS, {partitions:,}",
                    kraft["alter_partition_per_s"],
                    "/s",
                    peer_name="etcd CAS on the partition key",
                    peer_value=etcd["cas_isr_change_per_s"],
                )
            )


def run(report: Report) -> None:
    """The suite: every size of :data:`SIZES` in both modes (28.5 minutes on the 2-core
    machine at a load of 16 to 27, most of it the 1,000,000-partition size; less when the
    machine is quiet); a full-scale run also writes the plots and their figures to
    docs/img."""
    sizes = tuple(sorted({max(1_000, int(s * report.scale)) for s in SIZES}))
    with (
        report.suite("control_plane", "The control plane: KRaft against etcd mode") as section,
        report.data_dir("control-plane") as data_dir,
    ):
        results = measure(sizes, MODES, data_dir)
        _add_rows(section, results)
        if report.scale == 1.0:
            images = report.output.parent / "img"
            images.mkdir(parents=True, exist_ok=True)
            (images / "control-plane.json").write_text(json.dumps(results, indent=1))
            for path in plot(results, images):
                report.progress(f"control-plane: wrote {path}")
        section.note(
            "The rows above are the control plane's computation alone (one process, a real "
            "etcd); the rows below are whole clusters of processes, failure detection and "
            "network included (bench/_control_plane_processes.py). See docs/control-plane.md "
            "for the method and the plots."
        )
    with report.suite("control_plane_processes", "The control plane on processes") as section:
        process_rows(report, section)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.control_plane")
    parser.add_argument("--partitions", default=",".join(str(s) for s in SIZES))
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--data-dir", type=Path, default=Path("bench-data/control-plane"))
    parser.add_argument("--plots", type=Path, default=None, help="directory for the PNGs")
    args = parser.parse_args(argv)
    sizes = tuple(int(s) for s in args.partitions.split(","))
    modes = tuple(m for m in args.modes.split(",") if m)
    unknown = set(modes) - set(MODES)
    if unknown:
        parser.error(f"unknown mode(s) {', '.join(sorted(unknown))}; known: kraft, etcd")
    args.data_dir.mkdir(parents=True, exist_ok=True)
    results = measure(sizes, modes, args.data_dir)
    print(json.dumps(results, indent=1))
    if args.plots:
        args.plots.mkdir(parents=True, exist_ok=True)
        (args.plots / "control-plane.json").write_text(json.dumps(results, indent=1))
        for path in plot(results, args.plots):
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
