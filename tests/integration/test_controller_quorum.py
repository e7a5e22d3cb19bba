"""Three real ``highwater controller`` processes on loopback: kill -9 each in turn, lose nothing.

Writes go through the Controller API with :class:`ControllerClient`, which finds the
active controller and follows it through failovers: a broker registers and heartbeats,
and the client keeps creating topics and altering each new topic's config.

The story: a leader is elected; writes are pipelined to it and, while some are still in
flight, one voter is killed with SIGKILL (the leader first, then the others in turn),
writes go on against the two survivors, the voter is restarted and catches up. At the
end every voter has the same log and, replayed through the controller's own state
machine, the same metadata image; every topic whose creation and every config change
that was acknowledged is in it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import grpc
import pytest
from highwater.controller import messages as m
from highwater.controller.client import ControllerClient
from highwater.controller.service import MetadataStateMachine
from highwater.metadata import ConfigResourceType, MetadataImage
from highwater.metadata.snapshot import snapshot_values
from highwater.raft.partition_raft_log import PartitionRaftLog
from highwater.raft.service import MetadataLogLayout, SnapshotReader
from highwater.raft.snapshot_files import FileSnapshotStore
from highwater.storage.records import RecordBatch, iter_batches
from highwater.v1 import raft_pb2, raft_pb2_grpc
from highwater.v1.common_pb2 import ErrorCode

pytestmark = pytest.mark.timeout(240)

VOTERS = (1, 2, 3)
BROKER = 1
NONE = ErrorCode.NONE


def free_ports(count: int) -> list[int]:
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


@dataclass
class Controller:
    """One ``highwater controller`` process."""

    node_id: int
    port: int
    voters: str
    data_dir: Path
    log_path: Path
    process: subprocess.Popen[bytes] | None = None
    _stderr: IO[bytes] | None = field(default=None, repr=False)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> None:
        assert not self.alive
        self._stderr = open(self.log_path, "ab")  # noqa: SIM115 - closed in reap()
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "highwater",
                "--log-level",
                "INFO",
                "controller",
                "--node-id",
                str(self.node_id),
                "--listen",
                self.address,
                "--voters",
                self.voters,
                "--data-dir",
                str(self.data_dir),
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=self._stderr,
            env=env,
        )

    def kill(self) -> None:
        """SIGKILL: no resignation, no flush, nothing."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self.reap()

    def terminate(self, timeout_s: float = 20) -> int:
        """SIGTERM (a graceful stop) and the exit status."""
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout_s)
        finally:
            self.reap()

    def reap(self) -> None:
        process = self.process
        if process is not None:
            if process.poll() is None:
                process.kill()
            process.wait(10)
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None


def describe(controller: Controller) -> raft_pb2.DescribeQuorumResponse | None:
    with grpc.insecure_channel(controller.address) as channel:
        try:
            return raft_pb2_grpc.RaftStub(channel).DescribeQuorum(
                raft_pb2.DescribeQuorumRequest(), timeout=2
            )
        except grpc.RpcError:
            return None


class Cluster:
    def __init__(self, root: Path) -> None:
        ports = free_ports(len(VOTERS))
        voters = ",".join(f"{n}@127.0.0.1:{p}" for n, p in zip(VOTERS, ports, strict=True))
        self.controllers = {
            n: Controller(n, p, voters, root / f"controller-{n}", root / f"controller-{n}.log")
            for n, p in zip(VOTERS, ports, strict=True)
        }
        self.topics: dict[str, str] = {}
        """Acknowledged topic creations: name -> topic id."""
        self.configs: dict[str, str] = {}
        """Acknowledged config changes: topic -> its retention.ms."""
        self.failed = 0
        self._next = 0

    @property
    def addresses(self) -> list[str]:
        return [c.address for c in self.controllers.values()]

    def leader(self, timeout_s: float = 30) -> tuple[Controller, raft_pb2.DescribeQuorumResponse]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for controller in self.controllers.values():
                if not controller.alive:
                    continue
                response = describe(controller)
                if response is not None and response.error == ErrorCode.NONE:
                    return controller, response
            time.sleep(0.1)
        raise AssertionError(f"no leader within {timeout_s}s; see the logs in {self.logs()}")

    def logs(self) -> list[str]:
        return [str(c.log_path) for c in self.controllers.values()]

    async def write_one(self, client: ControllerClient) -> bool:
        """Create a topic, then set its retention; True if both were acknowledged."""
        number = self._next
        self._next += 1
        name = f"topic-{number:05d}"
        created = await client.create_topics(m.CreateTopicsRequest((m.CreatableTopic(name, 1, 1),)))
        (result,) = created.topics
        if result.error == NONE:
            self.topics[name] = result.topic_id
        elif result.error != ErrorCode.TOPIC_ALREADY_EXISTS:
            # A retry after a crash that committed the first try: it exists all the same.
            self.failed += 1
            return False
        value = str(60_000 + number)
        altered = await client.alter_configs(
            m.AlterConfigsRequest(
                (
                    m.AlterConfigsResource(
                        ConfigResourceType.TOPIC,
                        name,
                        (m.AlterableConfig("retention.ms", value=value),),
                    ),
                )
            )
        )
        if altered.resources[0].error != NONE:
            self.failed += 1
            return False
        self.configs[name] = value
        return result.error == NONE

    async def write(
        self, client: ControllerClient, count: int, *, then: Callable[[], None] | None = None
    ) -> int:
        """``count`` writes at once; ``then`` runs while they are in flight. How many
        were acknowledged."""
        writes = [asyncio.create_task(self.write_one(client)) for _ in range(count)]
        if then is not None:
            await asyncio.sleep(0.05)
            then()
        return sum(await asyncio.gather(*writes))

    def wait_caught_up(self, timeout_s: float = 60) -> int:
        """Wait until every voter's log end offset is the leader's and committed."""
        deadline = time.monotonic() + timeout_s
        last = None
        while time.monotonic() < deadline:
            _, response = self.leader()
            last = response
            ends = {r.replica_id: r.log_end_offset for r in response.current_voters}
            leader_end = ends.get(response.leader_id, -1)
            if (
                set(ends) == set(VOTERS)
                and all(end == leader_end for end in ends.values())
                and response.high_watermark == leader_end
            ):
                return leader_end
            time.sleep(0.2)
        raise AssertionError(f"voters did not catch up: {last}")

    def kill_all(self) -> None:
        for controller in self.controllers.values():
            controller.kill()


async def keep_broker_alive(client: ControllerClient) -> None:
    """A broker: registers, then heartbeats (as caught up) every 200 ms."""
    registered = await client.register_broker(m.RegisterBrokerRequest(BROKER, "incarnation-1"))
    assert registered.error == NONE, registered
    epoch = registered.broker_epoch
    while True:
        with contextlib.suppress(Exception):
            await client.broker_heartbeat(m.BrokerHeartbeatRequest(BROKER, epoch, 1 << 40))
        await asyncio.sleep(0.2)


def read_log(data_dir: Path) -> list[tuple[int, int, bool, bytes | None]]:
    """(offset, epoch, is control, value) of every entry in a stopped voter's log."""
    raft_log = PartitionRaftLog.open(MetadataLogLayout(data_dir).log_dir)
    try:
        entries = []
        offset = raft_log.start_offset
        while offset < raft_log.end_offset:
            for batch in iter_batches(raft_log.read(offset, 1 << 20)):
                for record in batch.records():
                    entries.append(
                        (
                            record.offset,
                            batch.partition_leader_epoch,
                            batch.is_control,
                            record.value,
                        )
                    )
                offset = batch.next_offset
        return entries
    finally:
        raft_log.close()


def replay_image(data_dir: Path, end_offset: int) -> MetadataImage:
    """A stopped voter's metadata image up to ``end_offset``: its latest snapshot, then its
    log, through the controller's state machine."""
    layout = MetadataLogLayout(data_dir)
    snapshots = FileSnapshotStore(layout.snapshot_dir)
    machine = MetadataStateMachine()
    try:
        latest = snapshots.latest()
        offset = 0
        if latest is not None and latest.offset <= end_offset:
            machine.load_snapshot(SnapshotReader(latest, snapshots.read(latest)))
            offset = latest.offset
        raft_log = PartitionRaftLog.open(layout.log_dir, snapshots=snapshots.snapshots())
        try:
            offset = max(offset, raft_log.start_offset)
            batches: list[RecordBatch] = []
            while offset < end_offset:
                for batch in iter_batches(raft_log.read(offset, 1 << 20)):
                    if batch.next_offset <= offset or batch.base_offset >= end_offset:
                        continue
                    if not batch.is_control:
                        batches.append(batch)
                    offset = batch.next_offset
            machine.apply(batches, end_offset)
        finally:
            raft_log.close()
    finally:
        snapshots.close()
    return machine.image


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    cluster = Cluster(tmp_path)
    try:
        yield cluster
    finally:
        cluster.kill_all()


async def test_kill_each_voter_in_turn_while_writing(cluster: Cluster) -> None:
    for controller in cluster.controllers.values():
        controller.start()
    first_leader, response = await asyncio.to_thread(cluster.leader)
    assert {r.replica_id for r in response.current_voters} == set(VOTERS)

    killed: list[int] = []
    async with ControllerClient(cluster.addresses, timeout_s=60) as client:
        heartbeats = asyncio.create_task(keep_broker_alive(client))
        try:
            async with asyncio.timeout(30):
                while not cluster.topics:  # once the broker is unfenced, topics can be created
                    await cluster.write(client, 1)
                    await asyncio.sleep(0.1)
            assert await cluster.write(client, 20) == 20

            for round_number in range(len(VOTERS)):
                leader, _ = await asyncio.to_thread(cluster.leader)
                if round_number == 0:
                    victim = leader  # the leader first: in-flight writes, an election
                else:
                    victim = next(
                        c for n, c in sorted(cluster.controllers.items()) if n not in killed
                    )
                killed.append(victim.node_id)
                await cluster.write(client, 30, then=victim.kill)
                assert not victim.alive
                # Two of three voters keep the quorum: writes go on.
                acked = await cluster.write(client, 20)
                assert acked > 0, f"no write committed with node {victim.node_id} down"
                victim.start()
                assert await cluster.write(client, 20) > 0

            await asyncio.to_thread(cluster.wait_caught_up)
            assert await cluster.write(client, 10) == 10
            end_offset = await asyncio.to_thread(cluster.wait_caught_up)
        finally:
            heartbeats.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await heartbeats

    # Graceful stops, the leader last (a follower's stop then starts no election).
    leader, _ = await asyncio.to_thread(cluster.leader)
    for controller in sorted(cluster.controllers.values(), key=lambda c: c is leader):
        status = await asyncio.to_thread(controller.terminate)
        assert status == 0, f"node {controller.node_id} did not stop cleanly"

    logs = {n: read_log(c.data_dir) for n, c in cluster.controllers.items()}
    committed = {n: [e for e in entries if e[0] < end_offset] for n, entries in logs.items()}
    assert committed[1] == committed[2] == committed[3], "the voters' logs diverge"
    for entries in logs.values():
        # Past the committed end, at most a new leader's epoch-start marker.
        assert all(is_control for offset, _, is_control, _ in entries if offset >= end_offset)
    entries = committed[1]
    assert [offset for offset, _, _, _ in entries] == list(range(end_offset))
    epochs = [epoch for _, epoch, _, _ in entries]
    assert epochs == sorted(epochs)
    assert len(set(epochs)) >= 2  # the first leader was killed: at least one more epoch
    assert first_leader.node_id in killed

    images = {n: replay_image(c.data_dir, end_offset) for n, c in cluster.controllers.items()}
    values = {n: snapshot_values(image) for n, image in images.items()}
    assert values[1] == values[2] == values[3], "the voters' images differ"
    image = images[1]
    assert image.offset == max(offset for offset, _, control, _ in entries if not control)
    lost_topics = {
        name: topic_id
        for name, topic_id in cluster.topics.items()
        if (topic := image.topic(name)) is None or topic.topic_id != topic_id
    }
    assert not lost_topics, f"acknowledged topics lost: {lost_topics}"
    lost_configs = {
        name: value
        for name, value in cluster.configs.items()
        if image.topic_config(name).get("retention.ms") != value
    }
    assert not lost_configs, f"acknowledged config changes lost: {lost_configs}"
    assert len(cluster.topics) >= 100
    broker = image.broker(BROKER)
    assert broker is not None and not broker.fenced
