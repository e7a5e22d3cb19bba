"""Controller quorum benchmarks: committed writes/s beside etcd, failover, and 100,000 partitions.

Three real ``highwater controller`` processes on loopback (fsync on), written to through the
Controller API the way brokers and admin clients write: one ``AlterConfigs`` per write,
whose ``ConfigRecord`` is about 100 bytes. The peer is a 3-member etcd cluster on loopback
(Debian's etcd-server, fsync on) driven by the same number of concurrent clients putting
100-byte values. Both are driven from Python clients in this process.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from bench._etcd_peer import (
    WorkloadResult,
    etcd_available,
    etcd_cluster,
    etcd_put_workload,
    free_port,
    percentile,
)
from bench.report import Report, Row, SuiteSection, at_most, ratio_at_least

VALUE_SIZE = 100
WRITERS = (1, 64)
# Long enough that one ConfigRecord (resource name + key + value) is about 100 bytes.
TOPIC_PREFIX = "bench-quorum-writer-with-a-name-long-enough-for-100-byte-records-"


@dataclass
class ControllerProcess:
    node_id: int
    address: str
    data_dir: Path
    voters: str
    log_path: Path
    process: subprocess.Popen[bytes] | None = None
    profile_out: Path | None = None
    """Run under ``bench._profiled_server`` (cProfile windows opened by SIGUSR1, written
    to ``profile_out.N`` by SIGUSR2) instead of plain ``python -m highwater``."""
    timeline_out: Path | None = None
    """Run under ``bench._raft_timeline`` (commit-path timeline windows, the same signals)."""
    extra_args: tuple[str, ...] = ()
    """More ``highwater controller`` arguments (``--append-linger-ms N``)."""

    def start(self) -> None:
        log = open(self.log_path, "ab")  # noqa: SIM115 - owned by the process
        launcher = ["-m", "highwater"]
        if self.profile_out is not None:
            launcher = ["-m", "bench._profiled_server", str(self.profile_out)]
        elif self.timeline_out is not None:
            launcher = ["-m", "bench._raft_timeline", str(self.timeline_out)]
        self.process = subprocess.Popen(
            [
                sys.executable,
                *launcher,
                "controller",
                "--node-id",
                str(self.node_id),
                "--listen",
                self.address,
                "--voters",
                self.voters,
                "--data-dir",
                str(self.data_dir),
                *self.extra_args,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()
        self.process = None

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None


@contextlib.contextmanager
def controller_quorum(
    root: Path,
    voters: int = 3,
    *,
    profiled: bool = False,
    timeline: bool = False,
    extra_args: tuple[str, ...] = (),
) -> Iterator[list[ControllerProcess]]:
    """``voters`` controller processes on loopback; ``profiled``: each under
    ``bench._profiled_server``, writing its profiles to ``root/cN.prof.W``; ``timeline``:
    under ``bench._raft_timeline``, writing its windows to ``root/cN.timeline.W``;
    ``extra_args``: more arguments for each ``highwater controller``."""
    addresses = [f"127.0.0.1:{free_port()}" for _ in range(voters)]
    spec = ",".join(f"{i + 1}@{address}" for i, address in enumerate(addresses))
    processes = [
        ControllerProcess(
            i + 1,
            address,
            root / f"controller-{i + 1}",
            spec,
            root / f"c{i + 1}.log",
            profile_out=root / f"c{i + 1}.prof" if profiled else None,
            timeline_out=root / f"c{i + 1}.timeline" if timeline else None,
            extra_args=extra_args,
        )
        for i, address in enumerate(addresses)
    ]
    try:
        for process in processes:
            process.data_dir.mkdir(parents=True, exist_ok=True)
            process.start()
        yield processes
    finally:
        for process in processes:
            process.stop()


async def _describe(
    address: str,
) -> tuple[int, int, int, dict[int, int], dict[int, int]] | None:
    """(leader id, epoch, high watermark, voter id -> log end offset, voter id -> last fetch
    time in ms) from one controller."""
    import grpc.aio
    from highwater.internal.v1 import raft_pb2, raft_pb2_grpc

    try:
        async with grpc.aio.insecure_channel(address) as channel:
            stub = raft_pb2_grpc.RaftStub(channel)
            reply = await stub.DescribeQuorum(raft_pb2.DescribeQuorumRequest(), timeout=2)
    except Exception:
        return None
    if reply.error != 0:
        return None
    ends = {v.replica_id: v.log_end_offset for v in reply.current_voters}
    fetched = {v.replica_id: v.last_fetch_timestamp for v in reply.current_voters}
    return reply.leader_id, reply.leader_epoch, reply.high_watermark, ends, fetched


async def wait_for_leader(processes: list[ControllerProcess], timeout_s: float = 60) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for process in processes:
            if process.process is None:
                continue
            described = await _describe(process.address)
            if described is not None and described[0] > 0:
                return described[0]
        await asyncio.sleep(0.05)
    raise RuntimeError("the controller quorum elected no leader")


async def wait_caught_up(
    processes: list[ControllerProcess], node_id: int, timeout_s: float = 300
) -> float:
    """Seconds until ``node_id`` has fetched again and its log end reached the leader's
    high watermark (as the leader sees it)."""
    started = time.monotonic()
    started_ms = time.time() * 1000
    deadline = started + timeout_s
    while time.monotonic() < deadline:
        for process in processes:
            if process.process is None:
                continue
            described = await _describe(process.address)
            if described is None or described[0] != process.node_id:
                continue
            _, _, high_watermark, ends, fetched = described
            if (
                ends.get(node_id, -1) >= high_watermark > 0
                and fetched.get(node_id, -1) > started_ms
            ):
                return time.monotonic() - started
        await asyncio.sleep(0.02)
    raise RuntimeError(f"controller {node_id} did not catch up")


class _Cluster:
    """A client, one registered broker kept alive by heartbeats, and the writers' topics."""

    def __init__(self, addresses: list[str]) -> None:
        from highwater.controller_api.client import ControllerClient

        self.client = ControllerClient(addresses, timeout_s=120)
        self.broker_epoch = -1
        self._heartbeats: asyncio.Task[None] | None = None

    async def setup(self, brokers: int = 1) -> None:
        from highwater.controller_api import messages as m
        from highwater.metadata.records import BrokerEndpoint

        self.brokers: dict[int, int] = {}
        for broker_id in range(1, brokers + 1):
            reply = await self.client.register_broker(
                m.RegisterBrokerRequest(
                    broker_id=broker_id,
                    incarnation_id=f"bench-{broker_id}",
                    listeners=(BrokerEndpoint("PLAINTEXT", "127.0.0.1", 9000 + broker_id),),
                )
            )
            self.brokers[broker_id] = reply.broker_epoch
        self._heartbeats = asyncio.create_task(self._heartbeat_forever())
        for _ in range(200):
            if await self._heartbeat_all():
                break
            await asyncio.sleep(0.05)

    async def _heartbeat_all(self) -> bool:
        from highwater.controller_api import messages as m

        unfenced = True
        for broker_id, epoch in self.brokers.items():
            reply = await self.client.broker_heartbeat(
                m.BrokerHeartbeatRequest(broker_id, epoch, current_metadata_offset=1 << 40)
            )
            unfenced = unfenced and not reply.is_fenced
        return unfenced

    async def _heartbeat_forever(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            with contextlib.suppress(Exception):
                await self._heartbeat_all()

    async def create_topics(self, names: list[str], partitions: int = 1) -> None:
        from highwater.controller_api import messages as m

        reply = await self.client.create_topics(
            m.CreateTopicsRequest(
                tuple(
                    m.CreatableTopic(name, num_partitions=partitions, replication_factor=1)
                    for name in names
                )
            )
        )
        bad = [t for t in reply.topics if t.error not in (0, 36)]  # 36: already exists
        if reply.error or bad:
            raise RuntimeError(f"CreateTopics failed: {reply.error} {bad[:3]}")

    async def alter_config(self, topic: str, value: int) -> None:
        from highwater.controller_api import messages as m
        from highwater.metadata.records import ConfigResourceType

        reply = await self.client.alter_configs(
            m.AlterConfigsRequest(
                (
                    m.AlterConfigsResource(
                        ConfigResourceType.TOPIC,
                        topic,
                        (m.AlterableConfig("retention.ms", value=str(value)),),
                    ),
                )
            )
        )
        if reply.error or any(r.error for r in reply.resources):
            raise RuntimeError(f"AlterConfigs failed: {reply}")

    async def close(self) -> None:
        if self._heartbeats is not None:
            self._heartbeats.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._heartbeats
        await self.client.close()


async def _write_workload(cluster: _Cluster, writers: int, duration_s: float) -> WorkloadResult:
    await cluster.create_topics([f"{TOPIC_PREFIX}{i:03d}" for i in range(writers)])
    latencies: list[float] = []
    stop_at = time.monotonic() + duration_s

    async def writer(number: int) -> None:
        topic = f"{TOPIC_PREFIX}{number:03d}"
        value = 86_400_000
        while time.monotonic() < stop_at:
            started = time.perf_counter()
            await cluster.alter_config(topic, value)
            latencies.append((time.perf_counter() - started) * 1000)
            value += 1

    started = time.monotonic()
    await asyncio.gather(*(writer(i) for i in range(writers)))
    elapsed = time.monotonic() - started
    latencies.sort()
    return WorkloadResult(
        len(latencies), elapsed, percentile(latencies, 0.5), percentile(latencies, 0.99)
    )


def run(report: Report) -> None:
    duration = max(2.0, 10.0 * report.scale)
    with (
        report.suite(
            "raft", "Controller quorum (`highwater.raft`, `highwater.controller`)"
        ) as section,
        report.data_dir("raft", need_bytes=2 * 1024**3) as root,
    ):
        etcd: dict[int, WorkloadResult] = {}
        if etcd_available():
            report.progress("raft: etcd peer, 3 members on loopback")
            with etcd_cluster(root / "etcd") as endpoints:
                for writers in WRITERS:
                    etcd[writers] = asyncio.run(
                        etcd_put_workload(
                            endpoints[0],
                            writers=writers,
                            value_size=VALUE_SIZE,
                            duration_s=duration,
                        )
                    )
        report.progress("raft: no-op gRPC Controller service, the floor")
        with grpc_floor_server(root / "grpc-floor.log") as address:
            floor = asyncio.run(_throughput_on([address], duration))
        ours: dict[int, WorkloadResult] = {}
        with controller_quorum(root / "quorum") as processes:
            report.progress("raft: 3 highwater controllers on loopback")
            ours = asyncio.run(_throughput(processes, duration))
            failover = asyncio.run(_failover(processes, runs=max(3, int(20 * report.scale))))
        _throughput_rows(section, ours, etcd, floor)
        _failover_rows(section, failover)
        runs = max(2, int(3 * report.scale))
        report.progress(f"raft: kill -9 of a broker leading 1,000 partitions, {runs} runs")
        broker_failover = _broker_failover(root / "broker-failover", runs)
        _broker_failover_rows(section, broker_failover)
        with controller_quorum(root / "scale") as processes:
            partitions = max(1_000, int(100_000 * report.scale))
            report.progress(f"raft: creating {partitions:,} partitions")
            scale = asyncio.run(_scale(processes, partitions))
        _scale_rows(section, scale, partitions)
        section.note(
            "Writes: each Highwater write is one `AlterConfigs` request through the Controller "
            "API to the active controller (validated, one ~100-byte `ConfigRecord` appended "
            "through Raft, answered once committed on a majority, every voter fsyncing before "
            "it counts). etcd: one `put` of a 100-byte value per write through aetcd, 3 members "
            "on loopback with etcd's default fsync. Both driven by the same number of "
            f"concurrent asyncio clients in one Python process for {duration:.0f} s each."
        )
        section.note(
            "Floor rows: the same client, the same requests, against `bench/_grpc_floor.py`, a "
            "Controller service on grpc.aio and uvloop that answers every call at once with an "
            "empty response: what the client, Python's gRPC and this machine allow before any "
            "validation, Raft round trip or fsync. Where the floor is below etcd, no Python "
            "controller can reach the target here; where it is just above, the margin is what "
            "a commit has left for its leader-to-follower fetch round trip between processes "
            "and its fsyncs."
        )


@contextlib.contextmanager
def grpc_floor_server(log_path: Path) -> Iterator[str]:
    """A no-op Controller service (:mod:`bench._grpc_floor`) in its own process."""
    address = f"127.0.0.1:{free_port()}"
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "bench._grpc_floor", address.rsplit(":", 1)[1]],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        asyncio.run(_wait_serving(address))
        yield address
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()


async def _wait_serving(address: str, timeout_s: float = 30) -> None:
    import grpc.aio

    async with grpc.aio.insecure_channel(address) as channel:
        await asyncio.wait_for(channel.channel_ready(), timeout_s)


async def _throughput(
    processes: list[ControllerProcess], duration: float
) -> dict[int, WorkloadResult]:
    await wait_for_leader(processes)
    return await _throughput_on([p.address for p in processes], duration)


async def _throughput_on(addresses: list[str], duration: float) -> dict[int, WorkloadResult]:
    cluster = _Cluster(addresses)
    try:
        await cluster.setup()
        return {w: await _write_workload(cluster, w, duration) for w in WRITERS}
    finally:
        await cluster.close()


async def _failover(processes: list[ControllerProcess], runs: int) -> list[float]:
    """Seconds from kill -9 of the active controller to the first write committed after it."""
    cluster = _Cluster([p.address for p in processes])
    times: list[float] = []
    try:
        await cluster.setup()
        await cluster.create_topics([f"{TOPIC_PREFIX}failover"])
        value = 1
        for _ in range(runs):
            leader = await wait_for_leader(processes)
            for process in processes:
                if process.process is not None and process.node_id != leader:
                    await wait_caught_up(processes, process.node_id)
            victim = next(p for p in processes if p.node_id == leader)
            await cluster.alter_config(f"{TOPIC_PREFIX}failover", value)
            value += 1
            killed = time.monotonic()
            victim.kill()
            await cluster.alter_config(f"{TOPIC_PREFIX}failover", value)
            value += 1
            times.append(time.monotonic() - killed)
            victim.start()
            await wait_caught_up(processes, victim.node_id)
    finally:
        await cluster.close()
    return times


BROKER_FAILOVER_PARTITIONS = 1_000


@dataclass
class BrokerFailover:
    """Seconds from kill -9 of the broker leading every partition of a topic until every
    partition had another leader, one per run; what went wrong, if anything did."""

    times: list[float]
    errors: list[str]


def _broker_failover(root: Path, runs: int) -> BrokerFailover:
    """One controller and three brokers, a topic of 1,000 partitions (replication factor
    3) whose preferred leader is broker 101. Each run makes 101 the leader of all of them
    (a preferred election once it is back in every ISR), kills it with SIGKILL and waits
    until the Metadata of broker 102 shows every partition led by another broker, then
    restarts it."""
    from bench._highwater_cluster import highwater_cluster, wait_for_leaders
    from bench.broker import _elect_preferred, _wait_listed, create_topic, wait_full_isr

    result = BrokerFailover([], [])
    topic = "bench-broker-failover"
    partitions = BROKER_FAILOVER_PARTITIONS
    with highwater_cluster(root, 3) as cluster:
        victim, *others = sorted(cluster.brokers)
        watcher = cluster.broker_addresses[others[0]]
        assignment = {p: [victim, *others] for p in range(partitions)}

        async def lead_all() -> None:
            await wait_full_isr(watcher, topic, partitions, 3, timeout_s=300)
            try:
                await wait_for_leaders(watcher, topic, partitions, led_by=victim, timeout_s=1)
            except RuntimeError:
                await _elect_preferred(cluster.bootstrap, topic)
                await wait_for_leaders(watcher, topic, partitions, led_by=victim, timeout_s=120)

        async def one_run() -> float:
            await lead_all()
            killed = time.monotonic()
            cluster.brokers[victim].kill()
            await wait_for_leaders(watcher, topic, partitions, not_led_by=victim, poll_s=0.005)
            return time.monotonic() - killed

        asyncio.run(create_topic(cluster.bootstrap, topic, assignment=assignment, timeout_s=300))
        for run in range(runs):
            try:
                result.times.append(asyncio.run(one_run()))
            except (RuntimeError, TimeoutError) as error:
                result.errors.append(f"run {run}: {type(error).__name__} {error}")
            if not cluster.brokers[victim].alive:
                cluster.brokers[victim].start()
            _wait_listed(cluster, victim, timeout_s=300)
    return result


def _broker_failover_rows(section: SuiteSection, failover: BrokerFailover) -> None:
    times = sorted(failover.times)
    error = "; ".join(failover.errors) or "did not run"
    median = percentile([t * 1000 for t in times], 0.5) if times else None
    section.add(
        Row(
            f"broker failover: kill -9 of the broker leading {BROKER_FAILOVER_PARTITIONS:,} "
            "partitions (RF 3) until every partition has a new leader: p50",
            median,
            "ms",
            extra=f"{len(times)} runs: "
            + " · ".join(f"{t * 1000:,.0f}" for t in failover.times)
            + " ms; fenced when its liveness stream breaks (session timeout 9 s)",
            target=at_most(1500, "ms"),
            error=error,
        )
    )


@dataclass
class ScaleResult:
    create_s: float
    restart_catch_up_s: float
    snapshot_bytes: int
    image_bytes_per_partition: float


async def _scale(processes: list[ControllerProcess], partitions: int) -> ScaleResult:
    await wait_for_leader(processes)
    cluster = _Cluster([p.address for p in processes])
    try:
        await cluster.setup(brokers=3)
        per_topic = 1_000
        topics = [f"scale-{i:05d}" for i in range(max(1, partitions // per_topic))]
        started = time.monotonic()
        for topic in topics:
            await cluster.create_topics([topic], partitions=per_topic)
        create_s = time.monotonic() - started
        leader = await wait_for_leader(processes)
        follower = next(p for p in processes if p.node_id != leader)
        follower.kill()
        follower.start()
        catch_up = await wait_caught_up(processes, follower.node_id)
    finally:
        await cluster.close()
    snapshot_bytes, per_partition = _image_footprint(processes[0].data_dir)
    return ScaleResult(create_s, catch_up, snapshot_bytes, per_partition)


def _image_footprint(data_dir: Path) -> tuple[int, float]:
    """Replay a voter's metadata log in this process: snapshot size and image memory."""
    from highwater.metadata.delta import MetadataLoader
    from highwater.metadata.records import decode_record
    from highwater.metadata.snapshot import snapshot_values
    from highwater.records.batch import iter_batches

    log_dir = data_dir / "__cluster_metadata-0"
    tracemalloc.start()
    loader = MetadataLoader()
    for path in sorted(log_dir.glob("*.log")):
        data = path.read_bytes()
        for batch in iter_batches(data):
            if batch.is_control:
                continue
            records = [decode_record(r.value) for r in batch.records() if r.value is not None]
            loader.load_batch(batch.base_offset, batch.partition_leader_epoch, records)
    image = loader.image
    current, _peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    partitions = sum(len(topic.partitions) for topic in image.topics.by_name.values())
    size = sum(len(v) for v in snapshot_values(image))
    return size, (current / partitions if partitions else float("nan"))


def _throughput_rows(
    section: SuiteSection,
    ours: dict[int, WorkloadResult],
    etcd: dict[int, WorkloadResult],
    floor: dict[int, WorkloadResult],
) -> None:
    for writers in WRITERS:
        mine, peer, noop = ours.get(writers), etcd.get(writers), floor.get(writers)
        section.add(
            Row(
                f"committed writes/s, {writers} writer(s), 3 voters",
                mine.per_second if mine else None,
                "ops/s",
                peer_name="etcd 3 members, put 100 B",
                peer_value=peer.per_second if peer else None,
                target=ratio_at_least(1.0, "etcd"),
                extra=(
                    f"p50 {mine.p50_ms:.2f} ms, p99 {mine.p99_ms:.2f} ms "
                    f"(etcd p50 {peer.p50_ms:.2f}, p99 {peer.p99_ms:.2f})"
                    if mine and peer
                    else ""
                ),
                error="" if mine else "the workload did not run",
            )
        )
        section.add(
            Row(
                f"the same client and requests, {writers} writer(s), against a no-op Python "
                "gRPC Controller service (the ceiling of any Python controller here)",
                noop.per_second if noop else None,
                "ops/s",
                peer_name="etcd 3 members, put 100 B",
                peer_value=peer.per_second if peer else None,
                extra=f"p50 {noop.p50_ms:.2f} ms, p99 {noop.p99_ms:.2f} ms" if noop else "",
                error="" if noop else "the workload did not run",
            )
        )


def _failover_rows(section: SuiteSection, times: list[float]) -> None:
    ordered = sorted(t * 1000 for t in times)
    for name, value, limit in (
        ("p50", percentile(ordered, 0.5), 1500),
        ("p99", percentile(ordered, 0.99), 3000),
    ):
        section.add(
            Row(
                f"failover, kill -9 of the active controller to the next commit: {name}",
                value,
                "ms",
                target=at_most(limit, "ms"),
                extra=f"{len(times)} runs",
            )
        )


def _scale_rows(section: SuiteSection, scale: ScaleResult, partitions: int) -> None:
    section.add(
        Row(
            f"create {partitions:,} partitions (topics of 1,000, one CreateTopics each)",
            scale.create_s,
            "s",
            extra=f"{partitions / scale.create_s:,.0f} partitions/s",
        )
    )
    section.add(
        Row(
            "restarted controller catches up (log end reaches the high watermark)",
            scale.restart_catch_up_s,
            "s",
        )
    )
    section.add(Row("snapshot size", scale.snapshot_bytes / 1e6, "MB"))
    section.add(Row("MetadataImage memory per partition", scale.image_bytes_per_partition, "B"))
