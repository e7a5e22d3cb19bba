"""Partition reassignment on real processes: ``highwater partitions reassign`` moves a topic
off a broker (one partition's leader included) while it keeps serving, and the emptied
broker can then be removed from the cluster; before, the controller refuses to remove it.

One controller and four brokers. Topic ``moving`` has two partitions with two replicas,
``0: [11, 12]`` and ``1: [12, 11]``, and 200 records written with acks=all. The plan moves
partition 0 to ``[13, 14]`` (its leader 11 leaves: leadership goes to 13 once it has caught
up) and partition 1 to ``[12, 14]``. ``--execute --wait`` returns once both moves are done;
``--verify`` agrees; the brokers report the new replicas, all in sync; 11's replicas are
deleted from its disk; every record reads back, in order, from the new leaders, and new
writes with acks=all succeed. Broker 11 is then stopped and unregistered.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest
from broker_processes import ProcessCluster, create_topic, metadata, process_cluster
from highwater.client.admin import AdminClient, InvalidRequestError, NewTopic
from highwater.client.consumer import OFFSET_BEGINNING, AsyncConsumer, TopicPartition
from highwater.client.producer import AsyncProducer

pytestmark = pytest.mark.timeout(180)

TOPIC = "moving"
BROKERS = (11, 12, 13, 14)
RECORDS = 200
PLAN = {"version": 1, "partitions": [
    {"topic": TOPIC, "partition": 0, "replicas": [13, 14]},
    {"topic": TOPIC, "partition": 1, "replicas": [12, 14]},
]}  # fmt: skip


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[ProcessCluster]:
    running = process_cluster(tmp_path, BROKERS, replica_lag_time_max_ms=2000)
    try:
        running.start()
        yield running
    finally:
        running.kill()


def highwater(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "highwater", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


async def partitions_seen(address: str) -> dict[int, tuple[int, tuple[int, ...], tuple[int, ...]]]:
    """partition -> (leader, replicas, isr) as a broker's Metadata has it."""
    reply = await metadata(address, TOPIC)
    if reply is None or not reply.topics:
        return {}
    return {
        p.partition: (p.leader_id, tuple(p.replicas), tuple(p.isr))
        for p in reply.topics[0].partitions
    }


def _full(
    partitions: Iterable[tuple[int, tuple[int, ...], tuple[int, ...]]], isr: set[int]
) -> bool:
    seen = list(partitions)
    return len(seen) == 2 and all(set(p[2]) == isr for p in seen)


async def read_partition(bootstrap: str, partition: int) -> list[bytes | None]:
    values: list[bytes | None] = []
    async with AsyncConsumer({"bootstrap.servers": bootstrap}) as consumer:
        tp = TopicPartition(TOPIC, partition)
        _, high = await consumer.get_watermark_offsets(tp, timeout=30)
        consumer.assign([TopicPartition(TOPIC, partition, OFFSET_BEGINNING)])
        async with asyncio.timeout(30):
            while len(values) < high:
                message = await consumer.poll(1.0)
                if message is None:
                    continue
                assert message.error() is None, message.error()
                assert message.offset() == len(values)
                values.append(message.value())
    return values


async def test_a_topic_moves_off_a_broker_which_can_then_be_removed(
    cluster: ProcessCluster, tmp_path: Path
) -> None:
    first = cluster.brokers[11]
    await create_topic(
        first.address, NewTopic(TOPIC, replica_assignment={0: [11, 12], 1: [12, 11]})
    )
    deadline = time.monotonic() + 60
    while not _full((await partitions_seen(first.address)).values(), {11, 12}):
        assert time.monotonic() < deadline, "the topic's ISRs did not fill"
        await asyncio.sleep(0.2)
    written = {
        0: [f"p0-{i}".encode() for i in range(RECORDS)],
        1: [f"p1-{i}".encode() for i in range(RECORDS)],
    }
    async with AsyncProducer({"bootstrap.servers": cluster.bootstrap, "acks": "all"}) as producer:
        await asyncio.gather(
            *(
                producer.produce(TOPIC, v, partition=p)
                for p, values in written.items()
                for v in values
            )
        )

    # A broker that still holds replicas cannot be removed.
    bootstrap = ("--bootstrap-server", cluster.bootstrap)
    check = highwater("brokers", "check-removal", *bootstrap, "--ids-from", "11")
    assert check.returncode == 1
    assert "broker 11 still holds replicas of 2 partition(s) (moving-0, moving-1)" in check.stderr
    async with AdminClient(cluster.bootstrap, request_timeout_s=10) as admin:
        with pytest.raises(InvalidRequestError, match="still holds replicas of 2 partitions"):
            await admin.unregister_broker(11)

    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(PLAN))
    executed = highwater(
        "partitions", "reassign", *bootstrap, "--execute", "--plan", str(plan), "--wait"
    )
    assert executed.returncode == 0, executed.stderr
    rollback = executed.stdout.split("\n")[1]
    assert json.loads(rollback)["partitions"] == [
        {"topic": TOPIC, "partition": 0, "replicas": [11, 12]},
        {"topic": TOPIC, "partition": 1, "replicas": [12, 11]},
    ]
    assert "Reassigned 2 partition(s)." in executed.stdout
    verified = highwater("partitions", "reassign", *bootstrap, "--verify", "--plan", str(plan))
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert verified.stdout.count("is completed.") == 2

    deadline = time.monotonic() + 30
    while True:
        seen = await partitions_seen(cluster.brokers[14].address)
        if seen and all(len(isr) == 2 for _, _, isr in seen.values()):
            break
        assert time.monotonic() < deadline, f"the moved partitions are not in sync: {seen}"
        await asyncio.sleep(0.2)
    leader0, replicas0, isr0 = seen[0]
    assert replicas0 == (13, 14) and set(isr0) == {13, 14}
    assert leader0 == 13  # leadership left 11 for the first new replica
    assert seen[1][1] == (12, 14) and seen[1][0] == 12
    deadline = time.monotonic() + 30
    while any(first.data_dir.joinpath("logs").glob(f"{TOPIC}-*")):
        assert time.monotonic() < deadline, "broker 11 kept its replicas of the moved topic"
        await asyncio.sleep(0.2)

    for partition, values in written.items():
        assert await read_partition(cluster.bootstrap, partition) == values
    async with AsyncProducer({"bootstrap.servers": cluster.bootstrap, "acks": "all"}) as producer:
        more = await producer.produce(TOPIC, b"after the move", partition=0)
    assert more.offset == RECORDS

    # Broker 11 holds nothing now: it is stopped and removed from the cluster.
    check = highwater("brokers", "check-removal", *bootstrap, "--ids", "11")
    assert check.returncode == 0, check.stderr
    first.terminate()
    bootstrap = ("--bootstrap-server", cluster.bootstrap)
    removed = highwater("brokers", "unregister", *bootstrap, "--id", "11")
    assert removed.returncode == 0, removed.stderr
    listed = highwater("brokers", "list", *bootstrap)
    assert [line.split()[0] for line in listed.stdout.splitlines()] == ["ID", "12", "13", "14"]

    # Partition 1's replicas reordered: 14 is preferred now, but 12 keeps leading until a
    # preferred leader election (kafka-leader-election) moves leadership to it.
    plan.write_text(
        json.dumps({"version": 1, "partitions": [
            {"topic": TOPIC, "partition": 1, "replicas": [14, 12]}]})
    )  # fmt: skip
    reordered = highwater(
        "partitions", "reassign", *bootstrap, "--execute", "--plan", str(plan), "--wait"
    )
    assert reordered.returncode == 0, reordered.stderr
    elected = highwater(
        "leader-election", *bootstrap, "--election-type", "PREFERRED",
        "--topic", TOPIC, "--partition", "1",
    )  # fmt: skip
    assert elected.returncode == 0, elected.stderr
    assert elected.stdout == (
        f"Successfully completed leader election (PREFERRED) for partitions {TOPIC}-1\n"
    )
    deadline = time.monotonic() + 30  # the command waited for its bootstrap broker; 14 may lag
    while (await partitions_seen(cluster.brokers[14].address)).get(1, (-1, ()))[:2] != (
        14,
        (14, 12),
    ):
        assert time.monotonic() < deadline, "broker 14 does not lead partition 1"
        await asyncio.sleep(0.1)
