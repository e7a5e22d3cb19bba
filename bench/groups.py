"""Consumer group benchmarks: how long a rebalance takes, and offset commits per second.

The server is ``highwater server`` (a controller, a broker and a group coordinator in one
process, ``group.initial.rebalance.delay.ms`` 0 as Kafka's development configuration) run
as a subprocess, so that its event loop is not the clients'. The members are
``AsyncConsumer``s on this process's event loop (50 in one loop is what one consumer
process per core would not be: the figures include their shared CPU), with
``heartbeat.interval.ms`` 100: a member learns of a rebalance from its next heartbeat, as
in Kafka, so the interval is part of every figure.

- Rebalance: N members (1, 10, 50) subscribe to a topic of 500 partitions at once; the
  time until every member holds its part of one generation's assignment (disjoint and
  covering all 500, the members' counts within one of each other). Then one more member
  joins the stable group: the time until the same holds for N + 1 members. Eager:
  ``range``; cooperative: ``cooperative-sticky``, whose hand-over of moving partitions
  takes a second rebalance, included.
- Offset commits: one member commits synchronously in a loop (1 partition, then 50 per
  commit), then 10 members at once. The floor beside it: acks=all Produce requests of one
  small record, one at a time, to the same server (a commit is one such append to
  ``__consumer_offsets``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from highwater.client.admin import AdminClient, NewTopic
from highwater.client.consumer import AsyncConsumer, TopicPartition
from highwater.client.producer import AsyncProducer

from bench._etcd_peer import free_port
from bench.report import Report, Row, SuiteSection, percentile

TOPIC = "bench-groups"
PARTITIONS = 500
MEMBER_COUNTS = (1, 10, 50)
STRATEGIES = {"eager": "range", "cooperative": "cooperative-sticky"}
HEARTBEAT_MS = 100


@contextlib.contextmanager
def embedded_server(data_dir: Path, log_path: Path) -> Iterator[str]:
    """``highwater server`` on a free loopback port; stopped (by its PID) on exit."""
    address = f"127.0.0.1:{free_port()}"
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "highwater",
                "server",
                "--listen",
                address,
                "--data-dir",
                str(data_dir),
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            yield address
        finally:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


async def _create_topic(address: str) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            async with AdminClient(address, request_timeout_s=10) as admin:
                await admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)])
                described = (await admin.describe_topics([TOPIC]))[TOPIC]
                if all(p.leader is not None for p in described.partitions):
                    return
        except Exception:
            if time.monotonic() > deadline:
                raise
        await asyncio.sleep(0.2)


class _Member:
    def __init__(self, address: str, group: str, strategy: str, name: str) -> None:
        self.consumer = AsyncConsumer(
            {
                "bootstrap.servers": address,
                "group.id": group,
                "client.id": name,
                "partition.assignment.strategy": strategy,
                "heartbeat.interval.ms": HEARTBEAT_MS,
                "session.timeout.ms": 30_000,
                "max.poll.interval.ms": 60_000,
                "enable.auto.commit": False,
                "fetch.max.wait.ms": 100,
            }
        )
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.consumer.subscribe([TOPIC])
        self.task = asyncio.create_task(self._poll())

    async def _poll(self) -> None:
        while True:
            await self.consumer.poll(0.05)

    def owned(self) -> set[tuple[str, int]]:
        return {tp.key() for tp in self.consumer.assignment()}

    async def close(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
        await self.consumer.close()


def _settled(members: list[_Member]) -> bool:
    """One generation, every partition owned once, counts within one of each other."""
    owned = [m.owned() for m in members]
    generations = {m.consumer.consumer_group_metadata().generation_id for m in members}
    counts = [len(o) for o in owned]
    return (
        len(generations) == 1
        and sum(counts) == PARTITIONS
        and len(set().union(*owned)) == PARTITIONS
        and max(counts) - min(counts) <= 1
    )


async def _wait_settled(members: list[_Member], timeout_s: float = 120) -> float:
    started = time.perf_counter()
    while not _settled(members):
        if time.perf_counter() - started > timeout_s:
            raise TimeoutError(f"{len(members)} members did not settle in {timeout_s:.0f} s")
        await asyncio.sleep(0.005)
    return time.perf_counter() - started


async def _rebalances(address: str, count: int, strategy: str) -> tuple[float, float]:
    """(seconds until N members settle, seconds until one more member is in)."""
    group = f"bench-{strategy}-{count}"
    members = [_Member(address, group, strategy, f"m{i}") for i in range(count)]
    try:
        started = time.perf_counter()
        for member in members:
            member.start()
        await _wait_settled(members)
        formed = time.perf_counter() - started
        newcomer = _Member(address, group, strategy, "newcomer")
        members.append(newcomer)
        started = time.perf_counter()
        newcomer.start()
        await _wait_settled(members)
        return formed, time.perf_counter() - started
    finally:
        await asyncio.gather(*(m.close() for m in members))


async def _commit_latencies(
    address: str, members: int, partitions_per_commit: int, duration_s: float
) -> tuple[int, float, list[float]]:
    """(commits, seconds, latencies in ms) of ``members`` committing in a loop."""
    consumers = [
        AsyncConsumer({"bootstrap.servers": address, "group.id": f"bench-commits-{members}-{i}"})
        for i in range(members)
    ]
    latencies: list[float] = []

    async def loop(consumer: AsyncConsumer, deadline: float) -> None:
        offset = 0
        while time.perf_counter() < deadline:
            offset += 1
            offsets = [TopicPartition(TOPIC, p, offset) for p in range(partitions_per_commit)]
            started = time.perf_counter()
            await consumer.commit(offsets=offsets, asynchronous=False)
            latencies.append((time.perf_counter() - started) * 1000)

    try:
        started = time.perf_counter()
        await asyncio.gather(*(loop(c, started + duration_s) for c in consumers))
        return len(latencies), time.perf_counter() - started, latencies
    finally:
        await asyncio.gather(*(c.close() for c in consumers))


async def _produce_floor(address: str, duration_s: float) -> tuple[int, float]:
    async with AsyncProducer(
        {"bootstrap.servers": address, "acks": "all", "linger.ms": 0}
    ) as producer:
        await producer.send(TOPIC, b"warm-up", partition=0)
        count = 0
        started = time.perf_counter()
        while time.perf_counter() - started < duration_s:
            await producer.send(TOPIC, b"x" * 60, partition=0)
            count += 1
        return count, time.perf_counter() - started


def run(report: Report) -> None:
    duration = max(1.0, 5.0 * report.scale)
    counts = [c for c in MEMBER_COUNTS if c <= max(1, int(50 * report.scale)) or c == 1]
    with (
        report.suite("groups", "Consumer groups (`highwater.coordinator`, the client)") as section,
        report.data_dir("groups") as root,
        embedded_server(root / "server", root / "server.log") as address,
    ):
        asyncio.run(_create_topic(address))
        for kind, strategy in STRATEGIES.items():
            for count in counts:
                report.progress(f"groups: {count} member(s), {kind}")
                formed, joined = asyncio.run(_rebalances(address, count, strategy))
                section.add(
                    Row(
                        f"group of {count} member(s) formed, {PARTITIONS} partitions, {kind} "
                        f"({strategy})",
                        formed * 1000,
                        "ms",
                        extra="from the members' subscribe to every member holding its share",
                    )
                )
                section.add(
                    Row(
                        f"one more member joins a stable group of {count}, {kind}",
                        joined * 1000,
                        "ms",
                        extra="until the new generation's shares are all held"
                        + (" (two rebalances)" if kind == "cooperative" else ""),
                    )
                )
        report.progress("groups: offset commits")
        floor_count, floor_s = asyncio.run(_produce_floor(address, duration))
        floor_rate = floor_count / floor_s
        for members, per_commit in ((1, 1), (1, 50), (10, 1)):
            commits, seconds, latencies = asyncio.run(
                _commit_latencies(address, members, per_commit, duration)
            )
            latencies.sort()
            section.add(
                Row(
                    f"offset commits/s, {members} member(s) committing synchronously, "
                    f"{per_commit} partition(s) per commit",
                    commits / seconds,
                    "commits/s",
                    peer_name="acks=all Produce of one record, one at a time (the floor)",
                    peer_value=floor_rate,
                    extra=f"p50 {percentile(latencies, 50):.2f} ms, "
                    f"p99 {percentile(latencies, 99):.2f} ms",
                )
            )
        _notes(section, duration)


def _notes(section: SuiteSection, duration: float) -> None:
    section.note(
        "Server: `highwater server` as a subprocess (one process: controller, broker, "
        "coordinator; `__consumer_offsets` with 50 partitions, one replica). Members: "
        f"`AsyncConsumer`s in the benchmark's process, heartbeat.interval.ms {HEARTBEAT_MS}, "
        "polling every 50 ms; a member learns of a rebalance from its next heartbeat, and "
        "a rebalance ends when every member has rejoined, so the figures grow with the "
        "heartbeat interval and with the members sharing one Python process's CPU."
    )
    section.note(
        f"Commits: {duration:.0f} s per row; each commit is one OffsetCommit answered once "
        "its records are appended (acks=all) to `__consumer_offsets`; the 10 committers "
        "are separate groups (each its own commit stream). The floor is the same append "
        "without the coordinator in between."
    )
    if os.cpu_count():
        section.note(f"{os.cpu_count()} CPUs shared by the server and the clients.")
