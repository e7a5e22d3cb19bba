"""Real ``highwater controller`` and ``highwater broker`` processes on loopback for bench/broker.py.

:func:`highwater_cluster` starts one controller (a single-voter quorum: the data plane is
what the broker suite measures, and one voter leaves the two CPUs to the brokers) and N
brokers, each with its own data directory and log file, waits until every broker is
registered and unfenced (over the process's TLS, if ``highwater.rpc.tls`` sets one), and
stops every process it started — by its PID, SIGKILL for those that do not stop in time —
when the block ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import grpc
import grpc.aio
from highwater.rpc.channels import open_blocking_channel, open_channel
from highwater.v1 import broker_pb2 as pb
from highwater.v1 import broker_pb2_grpc

from bench._etcd_peer import free_port

FIRST_BROKER_ID = 101
STOP_TIMEOUT_S = 30.0


@dataclass
class HighwaterProcess:
    """One ``python -m highwater ROLE ...`` process: start, SIGKILL, SIGTERM, reap."""

    name: str
    args: list[str]
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)
    """Variables set for the process on top of this one's."""
    process: subprocess.Popen[bytes] | None = None
    _log: IO[bytes] | None = field(default=None, repr=False)

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def start(self) -> None:
        assert not self.alive, f"{self.name} is running already"
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in reap()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "highwater", "--log-level", "INFO", *self.args],
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **self.env},
        )

    def kill(self) -> None:
        """SIGKILL: no controlled shutdown, no flush."""
        if self.alive:
            assert self.process is not None
            os.kill(self.process.pid, signal.SIGKILL)
        self.reap()

    def terminate(self) -> None:
        """SIGTERM: the process stops by itself (a broker: a controlled shutdown first)."""
        if self.alive:
            assert self.process is not None
            os.kill(self.process.pid, signal.SIGTERM)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after :data:`STOP_TIMEOUT_S`."""
        if self.alive:
            self.terminate()
            assert self.process is not None
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(STOP_TIMEOUT_S)
        self.reap()

    def reap(self) -> None:
        process = self.process
        if process is not None:
            if process.poll() is None:
                os.kill(process.pid, signal.SIGKILL)
            process.wait(10)
        if self._log is not None:
            self._log.close()
            self._log = None


@dataclass
class HighwaterCluster:
    """The processes of a running cluster and the addresses clients use."""

    controller: HighwaterProcess
    brokers: dict[int, HighwaterProcess]
    broker_addresses: dict[int, str]

    @property
    def bootstrap(self) -> str:
        return ",".join(self.broker_addresses.values())

    def live_addresses(self) -> list[str]:
        return [self.broker_addresses[n] for n, b in self.brokers.items() if b.alive]

    def all_processes(self) -> list[HighwaterProcess]:
        return [*self.brokers.values(), self.controller]


def _broker_args(node_id: int, address: str, controller: str, data_dir: Path) -> list[str]:
    return [
        "broker",
        "--node-id",
        str(node_id),
        "--listen",
        address,
        "--controllers",
        controller,
        "--data-dir",
        str(data_dir),
    ]


@contextlib.contextmanager
def highwater_cluster(
    root: Path,
    brokers: int,
    *,
    start_timeout_s: float = 90.0,
    env: dict[str, str] | None = None,
    extra_args: Callable[[str], list[str]] | None = None,
) -> Iterator[HighwaterCluster]:
    """One controller and ``brokers`` brokers under ``root``; all stopped when the block ends.

    ``env``: variables every process gets; ``extra_args(name)``: more options for the
    process ``name`` ("controller 1", "broker 101", ...)."""
    root.mkdir(parents=True, exist_ok=True)
    controller_address = f"127.0.0.1:{free_port()}"
    controller = HighwaterProcess(
        "controller 1",
        [
            "controller",
            "--node-id",
            "1",
            "--listen",
            controller_address,
            "--voters",
            f"1@{controller_address}",
            "--data-dir",
            str(root / "controller-1"),
        ],
        root / "controller-1.log",
        dict(env or {}),
    )
    addresses = {FIRST_BROKER_ID + i: f"127.0.0.1:{free_port()}" for i in range(brokers)}
    processes = {
        node_id: HighwaterProcess(
            f"broker {node_id}",
            _broker_args(node_id, address, controller_address, root / f"broker-{node_id}"),
            root / f"broker-{node_id}.log",
            dict(env or {}),
        )
        for node_id, address in addresses.items()
    }
    if extra_args is not None:
        for process in (controller, *processes.values()):
            process.args += extra_args(process.name)
    cluster = HighwaterCluster(controller, processes, addresses)
    try:
        controller.start()
        for process in processes.values():
            process.start()
        wait_registered(cluster, set(addresses), timeout_s=start_timeout_s)
        yield cluster
    finally:
        for process in processes.values():  # brokers first: their controlled shutdowns
            process.terminate()
        for process in processes.values():
            process.stop()
        controller.stop()


def live_broker_ids(address: str) -> set[int]:
    """The unfenced brokers a broker's Metadata lists (empty if it does not answer)."""
    try:
        with open_blocking_channel(address) as channel:
            reply = broker_pb2_grpc.BrokerStub(channel).Metadata(
                pb.MetadataRequest(topics=["__no_such_topic__"]), timeout=2
            )
    except grpc.RpcError:
        return set()
    return {b.node_id for b in reply.brokers}


def wait_registered(cluster: HighwaterCluster, wanted: set[int], *, timeout_s: float) -> None:
    """Until every broker in ``wanted`` is listed by every live broker's Metadata."""
    deadline = time.monotonic() + timeout_s
    while True:
        dead = [p.name for p in cluster.all_processes() if p.process is not None and not p.alive]
        if dead:
            raise RuntimeError(f"{', '.join(dead)} exited; see the logs under the data dir")
        if all(wanted <= live_broker_ids(a) for a in cluster.live_addresses()):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"brokers {sorted(wanted)} did not all register in time")
        time.sleep(0.2)


async def describe_partitions(address: str, topic: str) -> dict[int, pb.PartitionMetadata] | None:
    """Partition -> its metadata (leader, replicas, ISR) of ``topic`` as the broker at
    ``address`` sees it; None if it does not answer or does not know the topic."""
    try:
        async with open_channel(address, max_message_bytes=64 << 20) as channel:
            reply: pb.MetadataResponse = await broker_pb2_grpc.BrokerStub(channel).Metadata(
                pb.MetadataRequest(topics=[topic]), timeout=2
            )
    except grpc.aio.AioRpcError:
        return None
    for described in reply.topics:
        if described.name == topic and described.partitions:
            return {p.partition: p for p in described.partitions}
    return None


async def wait_for_leaders(
    address: str,
    topic: str,
    partitions: int,
    *,
    not_led_by: int | None = None,
    led_by: int | None = None,
    timeout_s: float = 120.0,
    poll_s: float = 0.02,
) -> float:
    """Seconds until every partition of ``topic`` has a leader (``led_by``, or other than
    ``not_led_by``) in the Metadata of the broker at ``address``."""
    started = time.monotonic()
    deadline = started + timeout_s
    while time.monotonic() < deadline:
        described = await describe_partitions(address, topic)
        if described is not None and len(described) == partitions:
            leaders = [p.leader_id for p in described.values()]
            if all(
                leader >= 0 and leader != not_led_by and (led_by is None or leader == led_by)
                for leader in leaders
            ):
                return time.monotonic() - started
        await asyncio.sleep(poll_s)
    raise RuntimeError(f"{topic}: not every partition got a leader within {timeout_s:.0f} s")
