"""A broker's liveness stream on processes: a killed broker is fenced at once, a paused one is not.

One controller and two ``highwater broker`` processes share one topic whose partitions
alternate their preferred leader between the brokers. The session timeout is long (20 s),
so anything that moves within a few seconds was moved by the liveness stream, not by the
session expiring:

* broker 12 paused with SIGSTOP for less than the session timeout keeps its connection
  open: none of its leaderships moves, and it is not fenced;
* broker 12 killed with SIGKILL: the kernel closes its connection, the stream ends without
  the broker saying it leaves, and the controller fences it and moves every leadership to
  broker 11 in one batch, well before the session timeout.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from broker_processes import BrokerProcess, create_topic, metadata
from highwater.client.admin import NewTopic
from highwater.rpc.endpoints import free_loopback_ports
from quorum_processes import Controller

pytestmark = pytest.mark.timeout(180)

TOPIC = "liveness"
PARTITIONS = 20
BROKERS = (11, 12)
SESSION_TIMEOUT_MS = 20_000


@dataclass
class Cluster:
    controller: Controller
    brokers: dict[int, BrokerProcess]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root: Path = tmp_path_factory.mktemp("liveness")
    ports = free_loopback_ports(1 + len(BROKERS))
    controller = Controller(
        1,
        ports[0],
        f"1@127.0.0.1:{ports[0]}",
        root / "controller",
        root / "controller.log",
        ("--override", f"broker.session.timeout.ms={SESSION_TIMEOUT_MS}"),
    )
    brokers = {
        node_id: BrokerProcess(
            node_id, port, controller.address, root / f"broker-{node_id}", root / f"b{node_id}.log"
        )
        for node_id, port in zip(BROKERS, ports[1:], strict=True)
    }
    controller.start()
    for broker in brokers.values():
        broker.start()
    try:
        assignment = {p: [BROKERS[p % 2], BROKERS[(p + 1) % 2]] for p in range(PARTITIONS)}
        topic = NewTopic(TOPIC, replica_assignment=assignment)
        asyncio.run(create_topic(brokers[11].address, topic, timeout_s=90))
        asyncio.run(wait_leaders(brokers[11], lambda leaders: leaders == preferred(), "preferred"))
        yield Cluster(controller, brokers)
    finally:
        for broker in brokers.values():
            broker.kill()
        controller.kill()


def preferred() -> dict[int, int]:
    return {p: BROKERS[p % 2] for p in range(PARTITIONS)}


async def leaders_of(broker: BrokerProcess) -> dict[int, int] | None:
    reply = await metadata(broker.address, TOPIC)
    if reply is None or not reply.topics or len(reply.topics[0].partitions) != PARTITIONS:
        return None
    return {p.partition: p.leader_id for p in reply.topics[0].partitions}


async def wait_leaders(
    broker: BrokerProcess, condition: object, what: str, timeout_s: float = 60
) -> dict[int, int]:
    assert callable(condition)
    last = None
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        last = await leaders_of(broker)
        if last is not None and condition(last):
            return last
        await asyncio.sleep(0.02)
    raise AssertionError(f"{what}: not within {timeout_s}s; leaders {last}")


async def test_a_paused_broker_keeps_its_leaderships(cluster: Cluster) -> None:
    paused = cluster.brokers[12]
    os.kill(paused.pid, signal.SIGSTOP)
    try:
        # Long enough for several missed heartbeats, well under the session timeout.
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:
            assert await leaders_of(cluster.brokers[11]) == preferred()
            await asyncio.sleep(0.2)
    finally:
        os.kill(paused.pid, signal.SIGCONT)
    await asyncio.sleep(0.5)
    assert await leaders_of(cluster.brokers[11]) == preferred()
    assert "disconnected: fenced" not in cluster.controller.log_path.read_text(errors="replace")


async def test_a_killed_broker_is_fenced_at_once(cluster: Cluster) -> None:
    survivor, victim = cluster.brokers[11], cluster.brokers[12]
    assert await leaders_of(survivor) == preferred()
    killed = time.monotonic()
    victim.kill()
    await wait_leaders(
        survivor,
        lambda leaders: set(leaders.values()) == {11},
        "every leadership on broker 11",
        timeout_s=SESSION_TIMEOUT_MS / 1000,
    )
    moved_s = time.monotonic() - killed
    # The session timeout (20 s) did not do it.
    assert moved_s < SESSION_TIMEOUT_MS / 1000 / 4, moved_s
    log = cluster.controller.log_path.read_text(errors="replace")
    assert "broker 12 (epoch" in log and "disconnected: fenced" in log
