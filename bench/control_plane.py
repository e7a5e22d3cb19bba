"""The seeds' control-plane experiment: the ZooKeeper-era architecture (the etcd metadata
mode) against KRaft, as partitions grow.

The KRaft article's case for KRaft is a measurement: a new ZooKeeper-era controller must
read all metadata from the store and push it to every broker before it can act, so its
failover and a broker's controlled shutdown grow with the partitions; a KRaft standby
controller already holds the metadata log. This suite measures both modes of Highwater on
the same machine in the same run (docs/control-plane.md).

**On processes** (``PROCESS_SIZES``): three brokers, replication factor 3; KRaft with a
quorum of three controller processes, the etcd mode with one etcd member (Debian's
etcd-server) and every broker a controller candidate. Topics of 100 partitions (each
created in one etcd transaction under etcd's default ``--max-txn-ops``), leaders spread.

- *metadata propagation*: a one-partition topic created through a broker, until every
  broker's Metadata shows it with a leader;
- *controller failover*: kill -9 of the active controller (KRaft: its process; etcd: the
  broker holding the ``controller`` key) until a topic creation is accepted again;
- *controlled shutdown*: SIGTERM of a broker that is not the etcd controller, until its
  process exits (it exits once the controller moved its leaderships);
- *cold broker start*: that broker started again, until its Metadata lists every
  partition with a leader and itself as live.

**The image alone** (``IMAGE_SIZES``): what the control plane computes, without processes,
for sizes the machine cannot hold as processes. etcd: a new controller's read of every
key from a real etcd, its decoding into the image, and one push (the whole image encoded,
then decoded by a broker); KRaft: the standby already holds the image, and a restarted
broker loads a snapshot (encode and load).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import statistics
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from bench._etcd_peer import etcd_available, etcd_cluster, free_port
from bench._highwater_cluster import HighwaterProcess, describe_partitions
from bench.report import Report, Row, SuiteSection

PROCESS_SIZES = (1_000, 3_000)
IMAGE_SIZES = (10_000, 100_000, 1_000_000)
TOPIC_PARTITIONS = 100
BROKERS = (1, 2, 3)
CLUSTER = "bench"
MODES = ("kraft", "etcd")


@dataclass
class ProcessCluster:
    """The processes of one mode's cluster and how to find its active controller."""

    mode: str
    brokers: dict[int, HighwaterProcess]
    addresses: dict[int, str]
    controllers: dict[int, HighwaterProcess] = field(default_factory=dict)
    controller_addresses: dict[int, str] = field(default_factory=dict)
    store: str = ""

    def live(self) -> list[str]:
        return [self.addresses[n] for n, p in self.brokers.items() if p.alive]

    async def active_controller(self) -> int:
        """KRaft: the quorum leader's node id; etcd: the broker the controller key names."""
        if self.mode == "kraft":
            from bench.raft import _describe

            for address in self.controller_addresses.values():
                described = await _describe(address)
                if described is not None and described[0] > 0:
                    return described[0]
            raise RuntimeError("no KRaft leader")
        from highwater.etcd_metadata.connection import EtcdConnection
        from highwater.etcd_metadata.endpoints import parse_metadata_store

        connection = EtcdConnection(parse_metadata_store(self.store))
        try:
            _, claim = await connection.get(f"/highwater/{CLUSTER}/controller")
        finally:
            await connection.close()
        if claim is None:
            raise RuntimeError("no etcd controller")
        return int(json.loads(claim.value)["broker_id"])


@contextlib.contextmanager
def process_cluster(root: Path, mode: str, endpoint: str = "") -> Iterator[ProcessCluster]:
    """Three brokers and, in KRaft mode, three controllers; everything stopped at the end."""
    addresses = {n: f"127.0.0.1:{free_port()}" for n in BROKERS}
    cluster = ProcessCluster(mode, {}, addresses)
    if mode == "kraft":
        cluster.controller_addresses = {n: f"127.0.0.1:{free_port()}" for n in (11, 12, 13)}
        voters = ",".join(f"{n}@{a}" for n, a in cluster.controller_addresses.items())
        for n, address in cluster.controller_addresses.items():
            cluster.controllers[n] = HighwaterProcess(
                f"controller {n}",
                [
                    "controller",
                    "--node-id",
                    str(n),
                    "--listen",
                    address,
                    "--voters",
                    voters,
                    "--data-dir",
                    str(root / f"controller-{n}"),
                ],
                root / f"controller-{n}.log",
            )
        source = ["--controllers", ",".join(cluster.controller_addresses.values())]
    else:
        cluster.store = f"etcd://{endpoint}/{CLUSTER}"
        source = ["--metadata-store", cluster.store]
    for n, address in addresses.items():
        cluster.brokers[n] = HighwaterProcess(
            f"broker {n}",
            [
                "broker",
                "--node-id",
                str(n),
                "--listen",
                address,
                *source,
                "--data-dir",
                str(root / f"broker-{n}"),
            ],
            root / f"broker-{n}.log",
        )
    processes = [*cluster.controllers.values(), *cluster.brokers.values()]
    try:
        for process in processes:
            process.start()
        yield cluster
    finally:
        for process in cluster.brokers.values():
            process.terminate()
        for process in processes:
            process.stop()


async def _retry(action: Callable[[], Awaitable[bool]], timeout_s: float, poll_s: float) -> float:
    """Seconds until ``action`` returns True."""
    started = time.monotonic()
    while True:
        if await action():
            return time.monotonic() - started
        if time.monotonic() - started > timeout_s:
            raise RuntimeError(f"not done within {timeout_s:.0f} s")
        await asyncio.sleep(poll_s)


async def _create(bootstrap: str, topic: str, partitions: int, replicas: int = 3) -> bool:
    """One attempt at creating ``topic``; True if it exists now."""
    from highwater.client.admin import AdminClient, AdminError, NewTopic, TopicExistsError

    try:
        async with AdminClient(bootstrap, request_timeout_s=10) as admin:
            results = await admin.create_topics([NewTopic(topic, partitions, replicas)])
    except AdminError:
        return False
    error = results[topic].error
    return error is None or isinstance(error, TopicExistsError)


async def _all_led(address: str, topics: list[str], partitions: int) -> bool:
    for topic in topics:
        described = await describe_partitions(address, topic)
        if described is None or len(described) != partitions:
            return False
        if any(p.leader_id < 0 for p in described.values()):
            return False
    return True


async def _serving(cluster: ProcessCluster, node_id: int, topics: list[str]) -> bool:
    """The broker lists every partition of ``topics`` with a leader, and itself as live."""
    from bench._highwater_cluster import live_broker_ids

    address = cluster.addresses[node_id]
    if node_id not in await asyncio.to_thread(live_broker_ids, address):
        return False
    return await _all_led(address, topics, TOPIC_PARTITIONS)


@dataclass
class ProcessResult:
    propagation_s: list[float] = field(default_factory=list)
    failover_s: float | None = None
    shutdown_s: float | None = None
    cold_start_s: float | None = None
    setup_s: float = 0.0
    error: str = ""


async def _measure(cluster: ProcessCluster, partitions: int) -> ProcessResult:
    result = ProcessResult()
    bootstrap = ",".join(cluster.addresses.values())
    topics = [f"cp-{i}" for i in range(partitions // TOPIC_PARTITIONS)]
    started = time.monotonic()
    await _retry(lambda: _create(bootstrap, "cp-warm", 1), 180, 0.2)
    for topic in topics:
        await _retry(lambda t=topic: _create(bootstrap, t, TOPIC_PARTITIONS), 300, 0.2)  # type: ignore[misc]
    for address in cluster.live():
        await _retry(lambda a=address: _all_led(a, topics, TOPIC_PARTITIONS), 900, 0.5)  # type: ignore[misc]
    result.setup_s = time.monotonic() - started

    for run in range(3):
        topic = f"cp-propagation-{run}"
        began = time.monotonic()
        await _retry(lambda t=topic: _create(bootstrap, t, 1), 60, 0.01)  # type: ignore[misc]
        for address in cluster.live():
            await _retry(lambda a=address, t=topic: _all_led(a, [t], 1), 60, 0.005)  # type: ignore[misc]
        result.propagation_s.append(time.monotonic() - began)

    # controller failover
    active = await cluster.active_controller()
    victim = cluster.controllers[active] if cluster.mode == "kraft" else cluster.brokers[active]
    victim.kill()
    survivors = ",".join(a for n, a in cluster.addresses.items() if cluster.brokers[n].alive)
    # (replication factor 1: in the etcd mode one of the three brokers is the one killed)
    result.failover_s = await _retry(
        lambda: _create(survivors, "cp-after-failover", 1, replicas=1), 300, 0.01
    )
    victim.start()
    if cluster.mode == "etcd":
        await _retry(lambda: _serving(cluster, active, topics), 120, 0.5)

    # controlled shutdown of a broker that is not the (etcd) controller, then its cold start
    from bench.broker import wait_full_isr

    controller_now = await cluster.active_controller() if cluster.mode == "etcd" else -1
    node = next(n for n in BROKERS if n != controller_now)
    watcher = cluster.addresses[next(n for n in BROKERS if n != node)]
    for topic in topics:  # every replica back in sync before the shutdown
        await wait_full_isr(watcher, topic, TOPIC_PARTITIONS, 3, timeout_s=900)
    broker = cluster.brokers[node]
    began = time.monotonic()
    broker.terminate()
    assert broker.process is not None
    await asyncio.to_thread(broker.process.wait, 600)
    result.shutdown_s = time.monotonic() - began
    broker.reap()
    broker.start()
    result.cold_start_s = await _retry(lambda: _serving(cluster, node, topics), 120, 0.05)
    return result


def _process_rows(
    report: Report, section: SuiteSection, results: dict[tuple[str, int], ProcessResult]
) -> None:
    for (mode, partitions), r in sorted(results.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        label = (
            f"{'KRaft' if mode == 'kraft' else 'etcd mode'}, {partitions:,} partitions, processes"
        )
        if r.error:
            section.add(Row(f"control plane, {label}", None, "s", error=r.error))
            continue
        section.add(
            Row(
                f"metadata propagation of one topic creation, {label}",
                statistics.median(r.propagation_s) * 1e3,
                "ms",
                extra="runs: " + " · ".join(f"{t * 1e3:.0f}" for t in r.propagation_s) + " ms",
            )
        )
        section.add(
            Row(
                f"controller failover (kill -9 until a change is accepted), {label}",
                r.failover_s,
                "s",
            )
        )
        section.add(
            Row(
                f"controlled shutdown of a broker (SIGTERM until it exited), {label}",
                r.shutdown_s,
                "s",
            )
        )
        section.add(
            Row(
                f"cold broker start (until it serves every partition), {label}",
                r.cold_start_s,
                "s",
                extra=f"set-up (topics created, led everywhere) {r.setup_s:.1f} s",
            )
        )


# --- the image alone ------------------------------------------------------------------


@dataclass
class ImageResult:
    etcd_write_s: float = 0.0
    etcd_read_s: float = 0.0
    etcd_decode_s: float = 0.0
    push_encode_s: float = 0.0
    push_load_s: float = 0.0
    keys: int = 0
    bytes: int = 0


async def _etcd_image(endpoint: str, partitions: int) -> ImageResult:
    """A new etcd-era controller's work at ``partitions``: every key read, decoded into the
    image, and the whole image encoded into one push and loaded by a broker."""
    from highwater.etcd_metadata.connection import EtcdConnection, Put
    from highwater.etcd_metadata.endpoints import parse_metadata_store
    from highwater.etcd_metadata.keys import KeySpace, image_from_keys, image_keys
    from highwater.metadata import load_snapshot_values, replay, snapshot_values

    from bench.scale import cluster_records

    result = ImageResult()
    address = parse_metadata_store(f"etcd://{endpoint}/image-{partitions}")
    space = KeySpace(address.prefix)
    records = cluster_records(partitions)
    image = replay(records, len(records) - 1, 1)
    keys = image_keys(image, space)
    result.keys = len(keys)
    result.bytes = sum(len(k) + len(v) for k, v in keys.items())
    connection = EtcdConnection(address, timeout_s=60, range_timeout_s=600)
    try:
        items = list(keys.items())
        began = time.perf_counter()
        for start in range(0, len(items), 128):
            await connection.txn([], [Put(k, v) for k, v in items[start : start + 128]])
        result.etcd_write_s = time.perf_counter() - began
        began = time.perf_counter()
        _, read = await connection.get_prefix(address.prefix)
        result.etcd_read_s = time.perf_counter() - began
    finally:
        await connection.close()
    state = {k: v.value for k, v in read.items() if space.is_state(k)}
    began = time.perf_counter()
    loaded = image_from_keys(state, space, image.offset)
    result.etcd_decode_s = time.perf_counter() - began
    assert loaded.partition_count == partitions
    began = time.perf_counter()
    values = snapshot_values(loaded)
    result.push_encode_s = time.perf_counter() - began
    began = time.perf_counter()
    pushed = load_snapshot_values(values, loaded.offset, 1)
    result.push_load_s = time.perf_counter() - began
    assert pushed.partition_count == partitions
    return result


def _image_rows(section: SuiteSection, partitions: int, r: ImageResult) -> None:
    label = f"{partitions:,} partitions, image alone"
    brokers = len(BROKERS)
    failover = r.etcd_read_s + r.etcd_decode_s + brokers * r.push_encode_s + r.push_load_s
    section.add(
        Row(
            f"etcd mode: a new controller's load and first push, {label}",
            failover,
            "s",
            peer_name="KRaft: the standby holds the image",
            peer_value=0.0,
            extra=(
                f"read {r.keys:,} keys ({r.bytes / 2**20:,.0f} MiB) {r.etcd_read_s:.2f} s · "
                f"decode {r.etcd_decode_s:.2f} s · encode the image {r.push_encode_s:.2f} s "
                f"for each of {brokers} brokers · a broker's load {r.push_load_s:.2f} s"
            ),
        )
    )
    section.add(
        Row(
            f"etcd mode: one change pushed (the whole image, encoded and loaded), {label}",
            r.push_encode_s + r.push_load_s,
            "s",
            peer_name="KRaft: one record replayed by each broker",
            extra=f"writing every key into etcd took {r.etcd_write_s:.1f} s",
        )
    )


def _plot(path: Path, series: dict[str, dict[int, float]], title: str, ylabel: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6, 4))
    for name, points in series.items():
        xs = sorted(points)
        axes.plot(xs, [points[x] for x in xs], marker="o", label=name)
    axes.set_xscale("log")
    axes.set_yscale("log")
    axes.set_xlabel("partitions")
    axes.set_ylabel(ylabel)
    axes.set_title(title)
    axes.grid(True, which="both", alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, format="svg")
    plt.close(figure)


PLOT_DIR = Path(__file__).resolve().parent.parent / "docs" / "img"


def run(report: Report) -> None:
    if not etcd_available():
        raise RuntimeError("etcd is not installed: run `make bench-deps`")
    process_sizes = sorted(
        {
            max(TOPIC_PARTITIONS, int(s * report.scale) // TOPIC_PARTITIONS * TOPIC_PARTITIONS)
            for s in PROCESS_SIZES
        }
    )
    image_sizes = sorted({max(1_000, int(s * report.scale)) for s in IMAGE_SIZES})
    process_results: dict[tuple[str, int], ProcessResult] = {}
    image_results: dict[int, ImageResult] = {}
    with report.suite("control-plane", "The control plane: the etcd mode against KRaft") as section:
        for partitions in process_sizes:
            for mode in MODES:
                report.progress(f"control-plane: {mode}, {partitions:,} partitions on processes")
                with report.data_dir(f"control-plane-{mode}-{partitions}") as root:
                    try:
                        with contextlib.ExitStack() as stack:
                            endpoint = ""
                            if mode == "etcd":
                                endpoint = stack.enter_context(
                                    etcd_cluster(root / "etcd", members=1)
                                )[0]
                            cluster = stack.enter_context(process_cluster(root, mode, endpoint))
                            process_results[(mode, partitions)] = asyncio.run(
                                _measure(cluster, partitions)
                            )
                    except (RuntimeError, TimeoutError, OSError) as error:
                        process_results[(mode, partitions)] = ProcessResult(
                            error=f"{type(error).__name__}: {error}"
                        )
        _process_rows(report, section, process_results)
        with (
            report.data_dir("control-plane-image") as root,
            etcd_cluster(root, members=1) as endpoints,
        ):
            for partitions in image_sizes:
                report.progress(f"control-plane: the image alone, {partitions:,} partitions")
                image_results[partitions] = asyncio.run(_etcd_image(endpoints[0], partitions))
                _image_rows(section, partitions, image_results[partitions])
        PLOT_DIR.mkdir(parents=True, exist_ok=True)
        for measure, attribute in (
            ("controller failover", "failover_s"),
            ("controlled shutdown", "shutdown_s"),
            ("cold broker start", "cold_start_s"),
        ):
            series: dict[str, dict[int, float]] = {}
            for (mode, partitions), r in process_results.items():
                value = getattr(r, attribute)
                if value:
                    series.setdefault("KRaft" if mode == "kraft" else "etcd mode", {})[
                        partitions
                    ] = value
            if measure == "controller failover":
                series["etcd mode, a new controller's load (image alone)"] = {
                    p: r.etcd_read_s
                    + r.etcd_decode_s
                    + len(BROKERS) * r.push_encode_s
                    + r.push_load_s
                    for p, r in image_results.items()
                }
            name = measure.replace(" ", "-")
            _plot(PLOT_DIR / f"control-plane-{name}.svg", series, measure, "seconds")
        section.note(
            "Processes: three brokers (RF 3), KRaft with three controller processes, the etcd "
            "mode with one etcd member; topics of 100 partitions. The image rows are the "
            "control plane's computation alone with a real etcd (no broker processes); "
            "plots in docs/img/control-plane-*.svg, discussion in docs/control-plane.md."
        )
