"""Real ``highwater controller`` (and ``observer``) processes on loopback, for integration tests.

:class:`Controller` runs one process (SIGKILL, SIGTERM, restart); :class:`Cluster` runs
three voters and writes through :class:`ControllerClient`, remembering every creation and
config change that was acknowledged; :func:`read_log` and :func:`replay_image` read a
stopped replica's data directory back, through the controller's own state machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import grpc
from highwater.controller_api import messages as m
from highwater.controller_api.client import ControllerClient
from highwater.internal.v1 import raft_pb2, raft_pb2_grpc
from highwater.metadata import ConfigResourceType, MetadataImage
from highwater.metadata.state_machine import MetadataStateMachine
from highwater.raft.driver import MetadataLogLayout
from highwater.raft.partition_raft_log import PartitionRaftLog
from highwater.raft.snapshot_files import FileSnapshotStore
from highwater.raft.state_machine import SnapshotReader
from highwater.raft.voter_files import unwrap_snapshot
from highwater.records import RecordBatch, iter_batches
from highwater.rpc.endpoints import free_loopback_ports
from highwater.v1.common_pb2 import ErrorCode

VOTERS = (1, 2, 3)
BROKER = 1
NONE = ErrorCode.NONE


@dataclass
class Controller:
    """One ``highwater controller`` process (``role="observer"``: ``highwater observer``)."""

    node_id: int
    port: int
    voters: str
    data_dir: Path
    log_path: Path
    extra_args: tuple[str, ...] = ()
    role: str = "controller"
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
                self.role,
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
    """Three voters on loopback, and what was acknowledged to the writes sent to them."""

    def __init__(self, root: Path, *extra_args: str) -> None:
        ports = free_loopback_ports(len(VOTERS))
        self.voters = ",".join(f"{n}@127.0.0.1:{p}" for n, p in zip(VOTERS, ports, strict=True))
        self.controllers = {
            n: Controller(
                n,
                p,
                self.voters,
                root / f"controller-{n}",
                root / f"controller-{n}.log",
                extra_args,
            )
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
            _, data = unwrap_snapshot(snapshots.read(latest))  # a dynamic quorum's voters
            machine.load_snapshot(SnapshotReader(latest, data))
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
