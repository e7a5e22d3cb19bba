"""Consumer groups on real processes: members join, crash and leave while consuming, and a
coordinator and a broker are killed; no partition is consumed by two members in one
generation, every record is consumed, and no acknowledged commit is lost.

One controller, three brokers (``__consumer_offsets`` with three replicas and
``min.insync.replicas`` 2), two ``highwater coordinator`` processes, and consumer processes
(``group_member.py``) that commit after every batch and log every step.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import pytest
from broker_processes import BrokerProcess, create_topic
from coordinator_processes import CoordinatorProcess
from highwater.client.admin import AdminClient, NewTopic
from highwater.client.producer import AsyncProducer
from highwater.metadata.consumer_offsets import CONSUMER_OFFSETS_TOPIC, partition_for_group
from highwater.rpc.endpoints import free_loopback_ports
from quorum_processes import Controller

pytestmark = pytest.mark.timeout(180)

TOPIC = "events"
GROUP = "billing"
PARTITIONS = 6
RECORDS_PER_PARTITION = 300
MEMBER_SCRIPT = Path(__file__).with_name("group_member.py")
BROKER_IDS = (11, 12, 13)
COORDINATOR_IDS = (21, 22)


@dataclass
class Member:
    """One ``group_member.py`` process and its event log."""

    name: str
    out: Path
    bootstrap: str
    process: subprocess.Popen[bytes] | None = None
    _log: IO[bytes] | None = field(default=None, repr=False)

    def start(self) -> None:
        self._log = open(self.out.with_suffix(".log"), "ab")  # noqa: SIM115 - closed in reap()
        self.process = subprocess.Popen(
            [
                sys.executable,
                str(MEMBER_SCRIPT),
                "--bootstrap",
                self.bootstrap,
                "--group",
                GROUP,
                "--topic",
                TOPIC,
                "--out",
                str(self.out),
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=self._log,
            env=dict(os.environ, PYTHONUNBUFFERED="1"),
        )

    def events(self) -> list[dict[str, Any]]:
        if not self.out.exists():
            return []
        lines = self.out.read_text().splitlines()
        return [json.loads(line) for line in lines if line.endswith("}")]

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self.reap()

    def terminate(self) -> int:
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(30)
        finally:
            self.reap()

    def reap(self) -> None:
        if self.process is not None:
            if self.process.poll() is None:
                self.process.kill()
            self.process.wait(10)
        if self._log is not None:
            self._log.close()
            self._log = None


@dataclass
class Cluster:
    controller: Controller
    brokers: dict[int, BrokerProcess]
    coordinators: dict[int, CoordinatorProcess]
    members: list[Member] = field(default_factory=list)

    @property
    def bootstrap(self) -> str:
        return ",".join(b.address for b in self.brokers.values() if b.alive)

    def stop_all(self) -> None:
        for member in self.members:
            member.kill()
        for coordinator in self.coordinators.values():
            coordinator.kill()
        for broker in self.brokers.values():
            broker.kill()
        self.controller.kill()


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    controller_port, *ports = free_loopback_ports(1 + len(BROKER_IDS) + len(COORDINATOR_IDS))
    controller = Controller(
        1,
        controller_port,
        f"1@127.0.0.1:{controller_port}",
        tmp_path / "controller",
        tmp_path / "controller.log",
        ("--offsets-topic-replication-factor", "3"),
    )
    brokers = {
        node_id: BrokerProcess(
            node_id,
            port,
            controller.address,
            tmp_path / f"broker-{node_id}",
            tmp_path / f"broker-{node_id}.log",
        )
        for node_id, port in zip(BROKER_IDS, ports, strict=False)
    }
    coordinators = {
        node_id: CoordinatorProcess(
            node_id, port, controller.address, tmp_path / f"coordinator-{node_id}.log"
        )
        for node_id, port in zip(COORDINATOR_IDS, ports[len(BROKER_IDS) :], strict=True)
    }
    running = Cluster(controller, brokers, coordinators)
    try:
        controller.start()
        for broker in brokers.values():
            broker.start()
        for coordinator in coordinators.values():
            coordinator.start()
        yield running
    finally:
        running.stop_all()


async def eventually(check: Callable[[], Any], what: str, timeout_s: float = 60) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        await asyncio.sleep(0.1)
    raise AssertionError(f"not within {timeout_s}s: {what}")


async def group_state(bootstrap: str) -> tuple[int, int, dict[str, int]]:
    """(coordinator id, member count, committed offsets) of the group, as the admin sees it."""
    async with AdminClient(bootstrap, request_timeout_s=10) as admin:
        description = (await admin.describe_consumer_groups([GROUP]))[GROUP]
        offsets = await admin.list_consumer_group_offsets(GROUP)
    committed = {f"{tp[0]}:{tp[1]}": o.offset for tp, o in offsets.items()}
    return description.coordinator.node_id, len(description.members), committed


async def offsets_leader(bootstrap: str) -> int:
    async with AdminClient(bootstrap, request_timeout_s=10) as admin:
        topic = (await admin.describe_topics([CONSUMER_OFFSETS_TOPIC]))[CONSUMER_OFFSETS_TOPIC]
    leader = topic.partitions[partition_for_group(GROUP, len(topic.partitions))].leader
    assert leader is not None
    return leader


def assigned(member: Member) -> bool:
    return any(e["event"] == "assign" and e["partitions"] for e in member.events())


def consumed(members: list[Member]) -> set[tuple[int, int]]:
    return {
        (e["partition"], e["offset"]) for m in members for e in m.events() if e["event"] == "record"
    }


async def test_members_come_and_go_and_coordinator_and_broker_failures_lose_no_commit(
    cluster: Cluster, tmp_path: Path
) -> None:
    first_broker = next(iter(cluster.brokers.values()))
    await create_topic(
        first_broker.address,
        NewTopic(TOPIC, PARTITIONS, 3, config={"min.insync.replicas": "2"}),
    )
    async with AsyncProducer({"bootstrap.servers": cluster.bootstrap, "acks": "all"}) as producer:
        futures = [
            producer.produce(TOPIC, f"{p}-{i}".encode(), partition=p)
            for i in range(RECORDS_PER_PARTITION)
            for p in range(PARTITIONS)
        ]
        await asyncio.gather(*futures)

    def member(name: str) -> Member:
        started = Member(name, tmp_path / f"member-{name}.jsonl", cluster.bootstrap)
        cluster.members.append(started)
        started.start()
        return started

    a, b = member("a"), member("b")
    await eventually(lambda: assigned(a) and assigned(b), "a and b share the partitions")
    c = member("c")
    await eventually(lambda: assigned(c), "c joins and gets partitions")

    # A member crashes: the coordinator notices when its session expires.
    await eventually(lambda: len(consumed(cluster.members)) > 300, "consumption is under way")
    b.kill()

    # The group's coordinator dies: its partitions of __consumer_offsets move.
    owner, _, before = await group_state(cluster.bootstrap)
    cluster.coordinators[owner].kill()
    new_owner = await eventually_async(
        lambda: group_state(cluster.bootstrap), lambda s: s[0] != owner, "the group moves"
    )
    for key, offset in before.items():
        assert new_owner[2].get(key, -1) >= offset, f"{key}: commit lost with the coordinator"

    # The broker leading the group's partition of __consumer_offsets dies.
    leader = await offsets_leader(cluster.bootstrap)
    _, _, before = await group_state(cluster.bootstrap)
    cluster.brokers[leader].kill()
    await eventually(lambda: len(consumed(cluster.members)) > 900, "consumption goes on")

    # A member leaves gracefully; the last one finishes the topic.
    assert a.terminate() == 0
    total = PARTITIONS * RECORDS_PER_PARTITION
    await eventually(lambda: len(consumed(cluster.members)) == total, "every record consumed", 90)
    final = await eventually_async(
        lambda: group_state(cluster.bootstrap),
        lambda s: all(s[2].get(f"{TOPIC}:{p}") == RECORDS_PER_PARTITION for p in range(PARTITIONS)),
        "every partition committed to its end",
    )
    for key, offset in before.items():
        assert final[2][key] >= offset
    c.terminate()

    events = [(m.name, e) for m in cluster.members for e in m.events()]
    # No partition is assigned to two members in one generation.
    owners: dict[tuple[int, str, int], str] = {}
    for name, e in events:
        if e["event"] != "assign":
            continue
        for topic, partition in e["partitions"]:
            owned = (e["generation"], topic, partition)
            assert owners.setdefault(owned, name) == name, f"{owned}: {owners[owned]} and {name}"
    # An acknowledged commit is never lost: every later assignment starts at or after it.
    acknowledged: list[tuple[float, str, int]] = [
        (e["t"], k, o) for _, e in events if e["event"] == "commit" for k, o in e["offsets"].items()
    ]
    for _, e in events:
        if e["event"] != "assign":
            continue
        for key, start in e["committed"].items():
            earlier = [o for t, k, o in acknowledged if k == key and t < e["t"] - 0.5]
            if earlier:
                assert start >= max(earlier), (
                    f"{key}: started at {start}, {max(earlier)} was committed"
                )


async def eventually_async(
    fetch: Callable[[], Any], check: Callable[[Any], bool], what: str, timeout_s: float = 60
) -> Any:
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = await fetch()
        except Exception as e:  # the cluster is failing over: ask again
            last = e
        else:
            if check(last):
                return last
        await asyncio.sleep(0.2)
    raise AssertionError(f"not within {timeout_s}s: {what}; last {last}")
