"""Named listeners over real processes: a client outside, bootstrapped through EXTERNAL.

A controller, a broker and a group coordinator, the broker and the coordinator each with
``INTERNAL`` on 127.0.0.1 (the one they use between them) and ``EXTERNAL`` on 127.0.0.2,
a second loopback address; and ``highwater server`` with the same two listeners. A
client that bootstraps through EXTERNAL creates a topic, produces, consumes in a group,
and is told only EXTERNAL addresses (Metadata, FindCoordinator, ``cluster describe``);
one that bootstraps through INTERNAL is told only INTERNAL ones. Bad listener settings
stop a role before it starts, naming the key.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest.mock import patch

import grpc.aio
import pytest
from click.testing import CliRunner
from highwater.cli.main import main
from highwater.client import cluster as client_cluster
from highwater.client.admin import AdminClient, NewTopic
from highwater.client.consumer import AsyncConsumer
from highwater.client.producer import AsyncProducer
from highwater.controller_api import client as controller_client
from highwater.group import membership
from highwater.rpc.channels import open_channel
from highwater.rpc.endpoints import free_loopback_ports
from highwater.v1 import broker_pb2 as pb
from highwater.v1 import broker_pb2_grpc
from quorum_processes import Controller

pytestmark = pytest.mark.timeout(180)

INTERNAL_HOST = "127.0.0.1"
EXTERNAL_HOST = "127.0.0.2"
# Ports are chosen free on both: one free on 127.0.0.1 may be the other fixture's EXTERNAL port.
BOTH_HOSTS = (INTERNAL_HOST, EXTERNAL_HOST)


def highwater(
    *args: str, stdin: str = "", timeout_s: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "highwater", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
        check=False,
    )


def until_ok(*args: str, stdin: str = "", timeout_s: float = 60) -> str:
    """Run ``highwater ARGS...`` until it succeeds (the cluster is still starting); its
    output, stdout then stderr."""
    deadline = time.monotonic() + timeout_s
    while True:
        done = highwater(*args, stdin=stdin)
        if done.returncode == 0:
            return done.stdout + done.stderr
        if time.monotonic() > deadline:
            raise AssertionError(f"highwater {' '.join(args)}: {done.stderr or done.stdout}")
        time.sleep(0.3)


@dataclass(frozen=True)
class Endpoints:
    """Where a client bootstraps through each listener."""

    internal: str
    external: str


class Processes:
    """Processes started by a fixture, each logging to a file; stopped together."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.running: list[subprocess.Popen[bytes]] = []

    def start(self, name: str, *args: str) -> None:
        with open(self.root / f"{name}.log", "wb") as log:
            self.running.append(
                subprocess.Popen(
                    [sys.executable, "-m", "highwater", *args],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                    env=dict(os.environ, PYTHONUNBUFFERED="1"),
                )
            )

    def stop(self) -> None:
        for process in reversed(self.running):
            process.terminate()
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)


def two_listeners(internal_port: int, external_port: int) -> str:
    return f"INTERNAL://{INTERNAL_HOST}:{internal_port},EXTERNAL://{EXTERNAL_HOST}:{external_port}"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Endpoints]:
    """A controller, a broker (100) and a coordinator (200) with INTERNAL and EXTERNAL."""
    root = tmp_path_factory.mktemp("listeners")
    controller_port, broker_in, broker_out, coordinator_in, coordinator_out = free_loopback_ports(
        5, hosts=BOTH_HOSTS
    )
    overrides = ("offsets.topic.replication.factor=1", "offsets.topic.num.partitions=2")
    controller = Controller(
        0,
        controller_port,
        f"0@127.0.0.1:{controller_port}",
        root / "controller",
        root / "controller.log",
        tuple(arg for key in overrides for arg in ("--override", key)),
    )
    controller.start()
    processes = Processes(root)
    try:
        processes.start(
            "broker",
            "broker", "--node-id", "100", "--controllers", controller.address,
            "--data-dir", str(root / "broker"),
            "--listeners", two_listeners(broker_in, broker_out),
            "--override", "inter.broker.listener.name=INTERNAL",
        )  # fmt: skip
        processes.start(
            "coordinator",
            "coordinator", "--node-id", "200", "--controllers", controller.address,
            "--data-dir", str(root / "coordinator"), "--group-initial-rebalance-delay-ms", "0",
            "--override", f"listeners={two_listeners(coordinator_in, coordinator_out)}",
            "--inter-broker-listener-name", "INTERNAL",
        )  # fmt: skip
        yield Endpoints(f"{INTERNAL_HOST}:{broker_in}", f"{EXTERNAL_HOST}:{broker_out}")
    finally:
        processes.stop()
        controller.terminate()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Endpoints]:
    """``highwater server`` with INTERNAL and EXTERNAL, advertised as bound."""
    root = tmp_path_factory.mktemp("listeners-server")
    internal, external = free_loopback_ports(2, hosts=BOTH_HOSTS)
    processes = Processes(root)
    try:
        processes.start(
            "server",
            "server", "--data-dir", str(root / "data"),
            "--listeners", two_listeners(internal, external),
            "--override", "offsets.topic.num.partitions=2",
            "--advertised-listeners",
            f"EXTERNAL://{EXTERNAL_HOST}:{external},INTERNAL://{INTERNAL_HOST}:{internal}",
        )  # fmt: skip
        yield Endpoints(f"{INTERNAL_HOST}:{internal}", f"{EXTERNAL_HOST}:{external}")
    finally:
        processes.stop()


async def addresses_told(bootstrap: str, group: str) -> set[str]:
    """Every address a Metadata and a FindCoordinator answer through ``bootstrap`` name,
    once the broker and the coordinator have registered and the group has a coordinator."""
    async with open_channel(bootstrap) as channel, asyncio.timeout(60):
        stub = broker_pb2_grpc.BrokerStub(channel)
        while True:
            try:
                metadata = await stub.Metadata(pb.MetadataRequest(), timeout=5)
                found = await stub.FindCoordinator(
                    pb.FindCoordinatorRequest(key_type=pb.COORDINATOR_TYPE_GROUP, keys=[group]),
                    timeout=5,
                )
            except grpc.aio.AioRpcError:
                await asyncio.sleep(0.2)
                continue
            if metadata.brokers and metadata.coordinators and found.coordinators[0].port > 0:
                break
            await asyncio.sleep(0.2)
    told = {f"{b.host}:{b.port}" for b in (*metadata.brokers, *metadata.coordinators)}
    told |= {f"{c.host}:{c.port}" for c in found.coordinators}
    return told


def hosts_of(addresses: set[str]) -> set[str]:
    return {address.rsplit(":", 1)[0] for address in addresses}


async def produce_and_consume(bootstrap: str, topic: str) -> set[str]:
    """Create ``topic``, produce three records with acks=all and consume them in a group,
    all through ``bootstrap``; every address the clients connected to."""
    connected: set[str] = set()

    def spy(address: str, **options: Any) -> grpc.aio.Channel:
        connected.add(address)
        return open_channel(address, **options)

    with (
        patch.object(client_cluster, "open_channel", spy),
        patch.object(membership, "open_channel", spy),
        patch.object(controller_client, "open_channel", spy),
    ):
        async with AdminClient({"bootstrap.servers": bootstrap}) as admin:
            await admin.create_topics([NewTopic(topic, num_partitions=2)])
        config = {"bootstrap.servers": bootstrap, "acks": "all", "request.timeout.ms": 20_000}
        async with AsyncProducer(config) as producer:
            for value in (b"one", b"two", b"three"):
                await producer.send(topic, value, partition=0)
        consumer = AsyncConsumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"g-{topic}",
                "auto.offset.reset": "earliest",
            }
        )
        values: list[bytes] = []
        try:
            consumer.subscribe([topic])
            async with asyncio.timeout(60):
                while len(values) < 3:
                    messages = await consumer.consume(10, timeout=0.5)
                    values += [m.value() for m in messages if m.error() is None]
            await consumer.commit(asynchronous=False)
        finally:
            await consumer.close()
    assert values == [b"one", b"two", b"three"]
    return connected


@pytest.mark.parametrize("setup", ["cluster", "server"])
def test_a_client_outside_uses_only_external_addresses(
    setup: str, request: pytest.FixtureRequest
) -> None:
    endpoints: Endpoints = request.getfixturevalue(setup)
    told = asyncio.run(addresses_told(endpoints.external, f"g-outside-{setup}"))
    assert hosts_of(told) == {EXTERNAL_HOST}, told
    connected = asyncio.run(produce_and_consume(endpoints.external, f"outside-{setup}"))
    assert hosts_of(connected) == {EXTERNAL_HOST}, connected


@pytest.mark.parametrize("setup", ["cluster", "server"])
def test_a_client_inside_uses_only_internal_addresses(
    setup: str, request: pytest.FixtureRequest
) -> None:
    endpoints: Endpoints = request.getfixturevalue(setup)
    told = asyncio.run(addresses_told(endpoints.internal, "g-inside"))
    assert hosts_of(told) == {INTERNAL_HOST}, told
    assert endpoints.internal in told


@pytest.mark.parametrize(
    ("args", "key"),
    [
        (("--listeners", "A://127.0.0.1:1,a://127.0.0.1:2"), "listeners"),
        (("--listeners", "A:/127.0.0.1:1"), "listeners"),
        (
            ("--listeners", "A://127.0.0.1:1", "--advertised-listeners", "B://h:1"),
            "advertised.listeners",
        ),
        (
            ("--listeners", "A://127.0.0.1:1", "--override", "inter.broker.listener.name=B"),
            "inter.broker.listener.name",
        ),
        (("--listen", "127.0.0.1:1", "--override", "listeners=A://127.0.0.1:2"), "listeners"),
    ],
)
def test_bad_listener_settings_stop_the_broker_naming_the_key(
    args: tuple[str, ...], key: str, tmp_path: Path
) -> None:
    result = CliRunner().invoke(
        main,
        [
            "broker", "--node-id", "100", "--controllers", "127.0.0.1:1",
            "--data-dir", str(tmp_path), *args,
        ],
    )  # fmt: skip
    assert result.exit_code == 1, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and key in lines[0], result.output
    assert not any(tmp_path.iterdir())
