"""The control plane at scale, KRaft against etcd mode: the seeds' ZooKeeper-versus-KRaft
experiment (``python -m bench control-plane``, docs/control-plane.md).

For each partition count the suite measures, in both modes, the control-plane part of four
events on a cluster of 3 brokers with replication factor 3:

- failover: KRaft's new active controller already holds the image (it replayed the log as a
  follower) and only decides; etcd mode's new controller reads every key from etcd, decodes
  them into an image and pushes the whole image to every broker (each broker decodes it);
- controlled shutdown: KRaft decides the moves in one heartbeat (records committed once
  through Raft); etcd mode writes each moved partition's state key (compare-and-swap
  transactions of 128 keys) and pushes the moves to the brokers as a delta;
- cold broker start: KRaft's broker loads a snapshot; etcd mode's broker decodes a push;
- propagation of one topic creation: KRaft's brokers replay one delta; etcd mode writes the
  keys and pushes the delta (the topic's records) to each of the 3 brokers.

Beside them, one leader move pushed as the etcd-mode controller pushed it before delta
pushes (the whole image) and as it does now (:func:`push_figures`).

The etcd side runs a real 3-member etcd (Debian's etcd-server, fsync on); the brokers'
decoding runs in this process. Process clusters holding 100,000 partitions do not fit this
2-core machine, so no figure includes broker processes, their gRPC hops or Raft's commit:
these are the costs that grow with the partition count. Beside them, the metadata write rate:
ISR changes per second through compare-and-swap on partition keys in etcd, and the KRaft
controller's AlterPartition decisions per second (before Raft's commit), same run.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import time
from pathlib import Path

from highwater.controller import ControllerConfig, InMemoryMetadataStore, QuorumController
from highwater.controller_api.messages import (
    AlterPartitionItem,
    AlterPartitionRequest,
    CreatableTopic,
    CreateTopicsRequest,
)
from highwater.etcd_metadata.connection import Compare, EtcdConnection, Put
from highwater.etcd_metadata.endpoints import EtcdStoreAddress
from highwater.etcd_metadata.keys import KeySpace, image_from_keys, image_keys
from highwater.metadata import (
    MetadataImage,
    MetadataRecord,
    load_snapshot_values,
    replay,
    snapshot_values,
)
from highwater.metadata.delta import MetadataDelta
from highwater.metadata.records import PartitionChangeRecord, decode_record, encode_record

from bench import scale
from bench._control_plane_processes import process_rows
from bench._etcd_peer import etcd_available, etcd_cluster
from bench.report import Report, Row, SuiteSection

BROKERS = 3
PARTITIONS_PER_TOPIC = 1_000
SIZES = (1_000, 10_000, 100_000)
MODES = ("kraft", "etcd")
TXN_OPS = 128  # etcd's default --max-txn-ops
RATE_SECONDS = 3.0


def cluster_records(partitions: int) -> list[MetadataRecord]:
    """3 brokers registered and unfenced; topics of up to 1,000 partitions, RF 3."""
    return scale.cluster_records(partitions, BROKERS)


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
    return list(controller.create_topics(request).records)


def kraft_figures(partitions: int) -> dict[str, float]:
    """Seconds of each event's control-plane part in KRaft mode, and AlterPartition/s."""
    records = cluster_records(partitions)
    image = replay(records, len(records) - 1, 1)
    figures: dict[str, float] = {}
    # (a) failover: the standby's image is in memory; it activates and takes a change.
    started = _clock()
    store, controller = _active_controller(image)
    store.append(_create_topic(controller, "after-failover"))
    figures["failover"] = time.perf_counter() - started
    # (b) controlled shutdown of broker 2: one heartbeat decides every move.
    latest = store.latest_image()
    started = _clock()
    moves = scale.heartbeat(controller, latest, 2, 2, want_shutdown=True)
    store.append(moves)
    figures["controlled_shutdown"] = time.perf_counter() - started
    # (c) cold broker start: the broker loads the latest snapshot.
    values = snapshot_values(store.latest_image())
    started = _clock()
    load_snapshot_values(values, store.latest_image().offset, 1)
    figures["broker_start"] = time.perf_counter() - started
    # (d) propagation: a topic creation, then each broker replays the delta.
    brokers = [store.latest_image() for _ in range(BROKERS)]
    started = _clock()
    delta = _create_topic(controller, "propagated")
    for image_of_broker in brokers:
        replay(delta, image_of_broker.offset + len(delta), image=image_of_broker)
    figures["propagation"] = time.perf_counter() - started
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


async def _write_keys(connection: EtcdConnection, keys: dict[str, bytes]) -> None:
    """Put ``keys`` in transactions of at most 128 operations, 8 in flight."""
    items = list(keys.items())
    batches = [items[i : i + TXN_OPS] for i in range(0, len(items), TXN_OPS)]
    for first in range(0, len(batches), 8):
        await asyncio.gather(
            *(
                connection.txn((), [Put(k, v) for k, v in batch])
                for batch in batches[first : first + 8]
            )
        )


async def _read_prefix(endpoint: str, prefix: str) -> dict[str, bytes]:
    """Every key under ``prefix``, in pages of 10,000 keys: one range reply of 100,000
    partitions (20 MB) exceeds gRPC's 4 MiB receive limit, which
    ``EtcdConnection.get_prefix`` reads with (see docs/control-plane.md)."""
    import aetcd
    from aetcd import rpc

    host, port = endpoint.rsplit(":", 1)
    raw = prefix.encode()
    end = raw[:-1] + bytes([raw[-1] + 1])
    keys: dict[str, bytes] = {}
    async with aetcd.Client(host=host, port=int(port), timeout=120) as client:
        start = raw
        while True:
            request = rpc.RangeRequest(key=start, range_end=end, limit=10_000)
            reply = await client.kvstub.Range(request, timeout=120)
            for kv in reply.kvs:
                keys[kv.key.decode()] = kv.value
            if not reply.more:
                return keys
            start = reply.kvs[-1].key + b"\0"


async def _load_and_push(
    connection: EtcdConnection, space: KeySpace, endpoint: str
) -> MetadataImage:
    """A new etcd-era controller: every key read and decoded, the image pushed to each broker
    (each broker decodes the whole push)."""
    state = {
        k: v for k, v in (await _read_prefix(endpoint, space.prefix)).items() if space.is_state(k)
    }
    image = image_from_keys(state, space, 1)
    _push(image)
    return image


def _push(image: MetadataImage) -> None:
    values = snapshot_values(image)
    for _ in range(BROKERS):
        load_snapshot_values(values, image.offset, 1)


def _push_delta(image: MetadataImage, records: list[MetadataRecord], offset: int) -> None:
    """A delta push: the records encoded once, each broker applying them to its image."""
    values = [encode_record(r) for r in records]
    for _ in range(BROKERS):
        MetadataDelta(image).replay_all(decode_record(v) for v in values).apply(offset, 1)


async def etcd_figures(endpoints: list[str], partitions: int) -> dict[str, float]:
    """Seconds of each event's control-plane part in etcd mode, and CAS ISR changes/s."""
    address = EtcdStoreAddress(
        tuple((h, int(p)) for h, p in (e.rsplit(":", 1) for e in endpoints)),
        cluster=f"bench-{partitions}",
    )
    space = KeySpace(address.prefix)
    connection = EtcdConnection(address, timeout_s=120.0)
    figures: dict[str, float] = {}
    try:
        records = cluster_records(partitions)
        image = replay(records, len(records) - 1, 1)
        await _write_keys(connection, image_keys(image, space))
        # (a) failover: load every key, decode, push to every broker, then take a change.
        started = _clock()
        image = await _load_and_push(connection, space, endpoints[0])
        store, controller = _active_controller(image)
        created = _create_topic(controller, "after-failover")
        store.append(created)
        await _write_keys(connection, _changed_keys(image, store.latest_image(), space))
        _push(store.latest_image())
        figures["failover"] = time.perf_counter() - started
        # (b) controlled shutdown of broker 2: each moved partition's key written, the moves
        # pushed to each broker as a delta.
        before = store.latest_image()
        started = _clock()
        moves = scale.heartbeat(controller, before, 2, 2, want_shutdown=True)
        store.append(moves)
        await _write_keys(connection, _changed_keys(before, store.latest_image(), space))
        _push_delta(before, moves, store.latest_image().offset)
        figures["controlled_shutdown"] = time.perf_counter() - started
        # (c) cold broker start: the broker decodes the push of the whole image.
        values = snapshot_values(store.latest_image())
        started = _clock()
        load_snapshot_values(values, store.latest_image().offset, 1)
        figures["broker_start"] = time.perf_counter() - started
        # (d) propagation of a topic creation: keys written, the delta pushed to each.
        before = store.latest_image()
        started = _clock()
        created = _create_topic(controller, "propagated")
        store.append(created)
        await _write_keys(connection, _changed_keys(before, store.latest_image(), space))
        _push_delta(before, created, store.latest_image().offset)
        figures["propagation"] = time.perf_counter() - started
        figures["cas_isr_change_per_s"] = await _cas_rate(connection, space)
    finally:
        await connection.close()
    return figures


def push_figures(partitions: int) -> dict[str, float]:
    """One leader move pushed to the 3 brokers, as the etcd-mode controller pushed it before
    delta pushes (the whole image: encoded once, decoded by each broker) and as it pushes it
    now (the one record: each broker applies it to its image): seconds and bytes."""
    records = cluster_records(partitions)
    image = replay(records, len(records) - 1, 1)
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


def _changed_keys(before: MetadataImage, after: MetadataImage, space: KeySpace) -> dict[str, bytes]:
    old = image_keys(before, space)
    return {k: v for k, v in image_keys(after, space).items() if old.get(k) != v}


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
    """``{mode: {partitions: {measure: value}}}``."""
    results: dict[str, dict[int, dict[str, float]]] = {m: {} for m in modes}
    for partitions in sizes:
        if "kraft" in modes:
            print(f"control-plane: kraft, {partitions:,} partitions", flush=True)
            results["kraft"][partitions] = kraft_figures(partitions)
            results["kraft"][partitions]["load"] = os.getloadavg()[0]
    if "etcd" in modes:
        if not etcd_available():
            raise RuntimeError("etcd is not installed (Debian's etcd-server)")
        with etcd_cluster(data_dir) as endpoints:
            for partitions in sizes:
                print(f"control-plane: etcd, {partitions:,} partitions", flush=True)
                results["etcd"][partitions] = asyncio.run(etcd_figures(endpoints, partitions))
                results["etcd"][partitions].update(push_figures(partitions))
                results["etcd"][partitions]["load"] = os.getloadavg()[0]
    return results


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
    sizes = tuple(max(1_000, int(s * report.scale)) for s in SIZES)
    with (
        report.suite("control_plane", "The control plane: KRaft against etcd mode") as section,
        report.data_dir("control-plane") as data_dir,
    ):
        results = measure(sizes, MODES, data_dir)
        _add_rows(section, results)
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
