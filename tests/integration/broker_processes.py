"""Real ``highwater broker`` processes on loopback for the broker integration tests, and what
they share: Metadata polling, topic creation, follower-style fetches, reading a partition's
segment files back.

A :class:`BrokerProcess` runs ``python -m highwater broker``, with
``--replica-lag-time-max-ms`` and ``--advertised-listener`` (a proxy in front of the broker)
when a test needs them. It heartbeats every :data:`HEARTBEAT_INTERVAL_MS` (Kafka's 2 s
otherwise): a controlled shutdown waits for every other broker's next heartbeat (each must
report it replayed the leader moves), and a test may give the controller a session timeout
of a few seconds (:data:`SHORT_SESSION_ARGS`) where it waits for a paused broker's fencing.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import grpc.aio
from highwater.client.admin import AdminClient, AdminError, NewTopic, TopicExistsError
from highwater.client.consumer import OFFSET_BEGINNING, AsyncConsumer, TopicPartition
from highwater.controller_api.client import ControllerUnavailableError
from highwater.records import RecordBatch, iter_batches
from highwater.rpc.channels import open_channel
from highwater.rpc.endpoints import free_loopback_ports
from highwater.v1 import broker_pb2 as pb
from highwater.v1 import broker_pb2_grpc
from highwater.v1.common_pb2 import ErrorCode
from quorum_processes import Controller

HEARTBEAT_INTERVAL_MS = 250
"""The brokers' ``--broker-heartbeat-interval-ms`` (Kafka's default: 2,000)."""
SHORT_SESSION_ARGS = ("--override", "broker.session.timeout.ms=4000")
"""Controller arguments: a broker session of 4 s (sixteen heartbeats), not 9 s, for tests
that wait for a broker whose connection stays open (paused) to be fenced."""


@dataclass
class BrokerProcess:
    """One broker process: SIGKILL, SIGTERM (a controlled shutdown), restart."""

    node_id: int
    port: int
    controllers: str
    data_dir: Path
    log_path: Path
    advertised: str | None = None
    """The address registered with the controller (clients and followers connect to it);
    None: the listen address."""
    replica_lag_time_max_ms: int | None = None
    extra_args: tuple[str, ...] = ()
    heartbeat_interval_ms: int = HEARTBEAT_INTERVAL_MS
    process: subprocess.Popen[bytes] | None = None
    _log: IO[bytes] | None = field(default=None, repr=False)

    @property
    def address(self) -> str:
        """Where the broker listens."""
        return f"127.0.0.1:{self.port}"

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def partition_dir(self, topic: str, partition: int = 0) -> Path:
        return self.data_dir / "logs" / f"{topic}-{partition}"

    def command(self) -> list[str]:
        common = [
            "--node-id",
            str(self.node_id),
            "--listen",
            self.address,
            "--controllers",
            self.controllers,
            "--data-dir",
            str(self.data_dir),
            "--broker-heartbeat-interval-ms",
            str(self.heartbeat_interval_ms),
        ]
        if self.advertised is not None:
            common += ["--advertised-listener", self.advertised]
        if self.replica_lag_time_max_ms is not None:
            common += ["--replica-lag-time-max-ms", str(self.replica_lag_time_max_ms)]
        common += self.extra_args
        return [sys.executable, "-m", "highwater", "--log-level", "INFO", "broker", *common]

    def start(self) -> None:
        assert not self.alive
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in reap()
        self.process = subprocess.Popen(
            self.command(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=self._log,
            env=dict(os.environ, PYTHONUNBUFFERED="1"),
        )

    def kill(self) -> None:
        """SIGKILL: no controlled shutdown, no flush, no checkpoint."""
        if self.alive:
            assert self.process is not None
            self.process.send_signal(signal.SIGKILL)
        self.reap()

    def terminate(self, timeout_s: float = 30) -> int:
        """SIGTERM (a controlled shutdown) and the exit status."""
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
        if self._log is not None:
            self._log.close()
            self._log = None

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def broker_epoch(self) -> int:
        """The epoch this broker last registered with, as its log says: what a fetch that
        stands in for this broker's own must name."""
        found = re.findall(rf"broker {self.node_id} registered with epoch (\d+)", self.log_text())
        assert found, f"broker {self.node_id} has not registered"
        return int(found[-1])


# --- Metadata -------------------------------------------------------------------------------


async def metadata(address: str, topic: str) -> pb.MetadataResponse | None:
    try:
        async with open_channel(address) as channel:
            reply: pb.MetadataResponse = await broker_pb2_grpc.BrokerStub(channel).Metadata(
                pb.MetadataRequest(topics=[topic]), timeout=2
            )
            return reply
    except grpc.aio.AioRpcError:
        return None


async def wait_partition(
    brokers: Iterable[BrokerProcess],
    topic: str,
    condition: Callable[[pb.PartitionMetadata], bool],
    *,
    what: str,
    timeout_s: float = 60,
) -> pb.PartitionMetadata:
    """Partition 0 of ``topic`` as the first live broker that answers sees it, once
    ``condition`` holds for it; AssertionError naming ``what`` and the last state if not."""
    candidates = list(brokers)
    last: pb.PartitionMetadata | None = None
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for broker in candidates:
            if not broker.alive:
                continue
            reply = await metadata(broker.address, topic)
            if reply is None or not reply.topics or not reply.topics[0].partitions:
                continue
            state = reply.topics[0].partitions[0]
            last = state
            if condition(state):
                return state
        await asyncio.sleep(0.1)
    raise AssertionError(f"{what}: not within {timeout_s}s; last seen {last}")


async def create_topic(address: str, topic: NewTopic, timeout_s: float = 60) -> None:
    """Create ``topic`` through a broker (it forwards to the active controller), retrying
    while the broker starts and the brokers register. With an explicit replica assignment it
    first waits until every broker named is active (registered and unfenced), so that each
    partition starts with its whole assignment in the ISR and its preferred replica leading."""
    async with asyncio.timeout(timeout_s):
        named = {b for replicas in (topic.replica_assignment or {}).values() for b in replicas}
        while named:
            reply = await metadata(address, topic.name)
            if reply is not None and named <= {b.node_id for b in reply.brokers}:
                break
            await asyncio.sleep(0.1)
        while True:
            try:
                async with AdminClient(address, request_timeout_s=5) as admin:
                    results = await admin.create_topics([topic])
            except (AdminError, ControllerUnavailableError):
                await asyncio.sleep(0.2)  # the broker (or the controller) is still starting
                continue
            error = results[topic.name].error
            if error is None or isinstance(error, TopicExistsError):
                return
            await asyncio.sleep(0.2)


# --- Reading ----------------------------------------------------------------------------------


def segment_bytes(partition_dir: Path) -> bytes:
    """The partition replica's segment files, in offset order, concatenated: its batches as
    stored (segment files hold whole batches back to back)."""
    segments = sorted(partition_dir.glob("*.log"), key=lambda p: int(p.stem))
    return b"".join(path.read_bytes() for path in segments)


def stored_batches(partition_dir: Path) -> list[RecordBatch]:
    return list(iter_batches(segment_bytes(partition_dir)))


def stored_records(partition_dir: Path) -> list[tuple[int, int, bytes | None]]:
    """(offset, leader epoch, value) of every record a replica's segment files hold."""
    return [
        (record.offset, batch.partition_leader_epoch, record.value)
        for batch in stored_batches(partition_dir)
        for record in batch.records()
    ]


async def consume_all(bootstrap: str, topic: str, timeout_s: float = 30) -> list[bytes | None]:
    """What a consumer (the client library's) reads of partition 0 from its beginning up to
    the high watermark it finds when it starts."""
    values: list[bytes | None] = []
    async with AsyncConsumer({"bootstrap.servers": bootstrap}) as consumer:
        partition = TopicPartition(topic, 0)
        _, high_watermark = await consumer.get_watermark_offsets(partition, timeout=timeout_s)
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        async with asyncio.timeout(timeout_s):
            while len(values) < high_watermark:
                message = await consumer.poll(1.0)
                if message is None:
                    continue
                assert message.error() is None, message.error()
                assert message.offset() == len(values), (message.offset(), values)
                values.append(message.value())
    return values


async def read_committed(address: str, topic: str) -> tuple[list[bytes | None], int]:
    """Every record up to the high watermark (a consumer's Fetch), and the high watermark."""
    values: list[bytes | None] = []
    offset = 0
    async with open_channel(address) as channel:
        stub = broker_pb2_grpc.BrokerStub(channel)
        while True:
            request = pb.FetchRequest(max_wait_ms=0, min_bytes=1, max_bytes=1 << 20)
            request.topics.add(topic=topic).partitions.add(
                partition=0,
                current_leader_epoch=-1,
                fetch_offset=offset,
                partition_max_bytes=1 << 20,
            )
            answer = (await stub.Fetch(request, timeout=5)).topics[0].partitions[0]
            assert answer.error == ErrorCode.NONE, answer
            if not answer.records:
                return values, answer.high_watermark
            for batch in iter_batches(answer.records):
                values += [r.value for r in batch.records() if r.offset >= offset]
                offset = batch.next_offset


# --- A cluster of processes -----------------------------------------------------------------


@dataclass
class ProcessCluster:
    """One controller (a single voter) and brokers, each a process of its own."""

    controller: Controller
    brokers: dict[int, BrokerProcess]

    @property
    def bootstrap(self) -> str:
        return ",".join(b.address for b in self.brokers.values() if b.alive)

    def start(self) -> None:
        self.controller.start()
        for broker in self.brokers.values():
            broker.start()

    def kill(self) -> None:
        for broker in self.brokers.values():
            broker.kill()
        self.controller.kill()


def process_cluster(
    root: Path,
    broker_ids: Iterable[int],
    *,
    controller_args: tuple[str, ...] = (),
    replica_lag_time_max_ms: int | None = None,
    broker_args: Callable[[int], tuple[str, ...]] = lambda _node_id: (),
    taken: Iterable[int] = (),
) -> ProcessCluster:
    """A controller and brokers ``broker_ids`` on free ports under ``root`` (not started);
    ``taken``: ports the caller already chose for something else."""
    ids = list(broker_ids)
    avoid = set(taken)
    controller_port, *ports = [
        p for p in free_loopback_ports(1 + len(ids) + len(avoid)) if p not in avoid
    ][: 1 + len(ids)]
    controller = Controller(
        1,
        controller_port,
        f"1@127.0.0.1:{controller_port}",
        root / "controller",
        root / "controller.log",
        controller_args,
    )
    brokers = {
        node_id: BrokerProcess(
            node_id,
            port,
            controller.address,
            root / f"broker-{node_id}",
            root / f"broker-{node_id}.log",
            replica_lag_time_max_ms=replica_lag_time_max_ms,
            extra_args=broker_args(node_id),
        )
        for node_id, port in zip(ids, ports, strict=True)
    }
    return ProcessCluster(controller, brokers)
