"""The AdminClient's consumer group operations against a real in-process EmbeddedServer.

Each test starts an :class:`EmbeddedServer` (controller, broker and group coordinator on one
free loopback port); real :class:`AsyncConsumer` members join groups on the same event loop
while the admin client lists, describes, alters and deletes them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path

import pytest
from embedded_servers import running_embedded_server
from highwater.client.admin import (
    AdminClient,
    GroupIdNotFoundError,
    GroupNotEmptyError,
    InvalidGroupIdError,
    NewTopic,
    OffsetAndMetadata,
    OffsetSpec,
    UnknownTopicOrPartitionError,
)
from highwater.client.consumer import AsyncConsumer
from highwater.client.producer import AsyncProducer
from highwater.embedded import EMBEDDED_NODE_ID, EmbeddedServer
from highwater.v1.common_pb2 import ErrorCode

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[EmbeddedServer]:
    """A running embedded server whose broker is unfenced."""
    async with running_embedded_server(tmp_path) as embedded:
        yield embedded


@pytest.fixture
async def admin(server: EmbeddedServer) -> AsyncIterator[AdminClient]:
    """An admin client bootstrapped from the server's one address."""
    async with AdminClient(server.listen, request_timeout_s=10.0) as client:
        yield client


async def eventually(check: Callable[[], Awaitable[bool]], what: str, within: float = 15) -> None:
    """Wait until ``check()`` holds, checking every 20 ms."""
    deadline = time.monotonic() + within
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


async def create_topic(admin: AdminClient, name: str, partitions: int) -> None:
    """Create a topic and wait until every partition has a leader."""
    (await admin.create_topics([NewTopic(name, partitions, 1)]))[name].raise_for_error()

    async def led() -> bool:
        try:
            described = await admin.describe_topics([name])
        except UnknownTopicOrPartitionError:
            return False
        return all(p.leader is not None for p in described[name].partitions)

    await eventually(led, f"leaders of {name}")


async def produce(address: str, topic: str, per_partition: dict[int, int]) -> list[str]:
    """Write ``per_partition[p]`` records to each partition ``p``; their values."""
    values = []
    async with AsyncProducer({"bootstrap.servers": address, "linger.ms": 0}) as producer:
        futures = []
        for partition, count in per_partition.items():
            for i in range(count):
                value = f"p{partition}-{i}"
                values.append(value)
                futures.append(producer.produce(topic, value, partition=partition))
        await asyncio.gather(*futures)
    return values


def member(address: str, group: str, client_id: str) -> AsyncConsumer:
    """A group member that notices rebalances quickly."""
    return AsyncConsumer(
        {
            "bootstrap.servers": address,
            "group.id": group,
            "client.id": client_id,
            "auto.offset.reset": "earliest",
            "fetch.max.wait.ms": 100,
            "heartbeat.interval.ms": 100,
            "session.timeout.ms": 6000,
        }
    )


async def consume_together(
    consumers: Sequence[AsyncConsumer], done: Callable[[list[str]], bool]
) -> list[str]:
    """Poll every consumer concurrently until ``done(values so far)`` holds."""
    values: list[str] = []
    stop = asyncio.Event()

    async def run(consumer: AsyncConsumer) -> None:
        while not stop.is_set():
            message = await consumer.poll(0.1)
            if message is not None:
                assert message.error() is None, message.error()
                value = message.value()
                assert value is not None
                values.append(value.decode())

    tasks = [asyncio.create_task(run(c)) for c in consumers]

    async def finished() -> bool:
        for task in tasks:
            if task.done():
                task.result()  # re-raise a failure
        return done(values)

    try:
        await eventually(finished, "the members to consume", within=30)
    finally:
        stop.set()
        await asyncio.gather(*tasks)
    return values


async def test_two_members_consume_a_topic_once_and_are_described_with_lag(
    server: EmbeddedServer, admin: AdminClient
) -> None:
    await create_topic(admin, "orders", 4)
    produced = await produce(server.listen, "orders", {0: 10, 1: 10, 2: 10, 3: 10})
    first, second = member(server.listen, "billing", "c1"), member(server.listen, "billing", "c2")
    first.subscribe(["orders"])
    second.subscribe(["orders"])
    try:
        consumed = await consume_together(
            [first, second],
            lambda got: (
                len(got) >= 40 and len(first.assignment()) == 2 and len(second.assignment()) == 2
            ),
        )
        assert sorted(consumed) == sorted(produced)  # every record, none twice
        await first.commit(asynchronous=False)
        await second.commit(asynchronous=False)

        listed = await admin.list_consumer_groups()
        assert [(g.group_id, g.state, g.is_simple_consumer_group) for g in listed] == [
            ("billing", "Stable", False)
        ]
        description = (await admin.describe_consumer_groups(["billing"]))["billing"]
        assert description.state == "Stable"
        assert description.partition_assignor == "range"
        assert description.coordinator.node_id == EMBEDDED_NODE_ID
        assert description.coordinator.address == server.listen
        members = sorted(description.members, key=lambda m: m.client_id)
        assert [m.client_id for m in members] == ["c1", "c2"]
        assert all(m.host == "/127.0.0.1" for m in members)
        assert sorted(tp for m in members for tp in m.assignment) == [
            ("orders", p) for p in range(4)
        ]
        assert all(len(m.assignment) == 2 for m in members)
        assert description.leader in {m.member_id for m in members}

        offsets = await admin.list_consumer_group_offsets("billing")
        # The commits carry the leader epoch of the records consumed (the first leader's, 0).
        assert offsets == {("orders", p): OffsetAndMetadata(10, 0) for p in range(4)}
        assert await admin.list_consumer_group_offsets("billing", [("orders", 1)]) == {
            ("orders", 1): OffsetAndMetadata(10, 0)
        }

        await produce(server.listen, "orders", {0: 3})
        ends = await admin.list_offsets({("orders", p): OffsetSpec.LATEST for p in range(4)})
        lag = {tp: ends[tp].offset - offsets[tp].offset for tp in offsets}
        assert lag == {("orders", 0): 3, ("orders", 1): 0, ("orders", 2): 0, ("orders", 3): 0}
    finally:
        await first.close()
        await second.close()


async def test_active_groups_refuse_alter_and_delete_until_members_leave(
    server: EmbeddedServer, admin: AdminClient
) -> None:
    await create_topic(admin, "events", 2)
    await produce(server.listen, "events", {0: 8, 1: 8})
    consumer = member(server.listen, "audit", "c1")
    consumer.subscribe(["events"])
    try:
        await consume_together([consumer], lambda got: len(got) >= 16)
        await consumer.commit(asynchronous=False)

        with pytest.raises(GroupNotEmptyError, match="active members") as refused:
            await admin.alter_consumer_group_offsets("audit", {("events", 0): 0})
        assert refused.value.code == ErrorCode.UNKNOWN_MEMBER_ID
        deleted = await admin.delete_consumer_groups(["audit"])
        assert isinstance(deleted["audit"].error, GroupNotEmptyError)
        assert deleted["audit"].error.code == ErrorCode.NON_EMPTY_GROUP
        assert [g.group_id for g in await admin.list_consumer_groups(["Stable"])] == ["audit"]
        assert await admin.list_consumer_groups(["Empty"]) == []
    finally:
        await consumer.close()

    # Closed: the member left, the group is empty and keeps its offsets.
    assert [g.group_id for g in await admin.list_consumer_groups(["empty"])] == ["audit"]
    described = (await admin.describe_consumer_groups(["audit"]))["audit"]
    assert (described.state, described.members) == ("Empty", ())
    await admin.alter_consumer_group_offsets(
        "audit", {("events", 0): 5, ("events", 1): OffsetAndMetadata(7, None, "reset")}
    )
    assert await admin.list_consumer_group_offsets("audit") == {
        ("events", 0): OffsetAndMetadata(5),
        ("events", 1): OffsetAndMetadata(7, None, "reset"),
    }

    # A new member starts where the offsets were altered to.
    resumed = member(server.listen, "audit", "c2")
    resumed.subscribe(["events"])
    try:
        again = await consume_together([resumed], lambda got: len(got) >= 4)
        assert sorted(again) == ["p0-5", "p0-6", "p0-7", "p1-7"]
    finally:
        await resumed.close()

    result = (await admin.delete_consumer_groups(["audit"]))["audit"]
    assert result.succeeded, result.error
    assert await admin.list_consumer_groups() == []
    assert await admin.list_consumer_group_offsets("audit") == {}
    with pytest.raises(GroupIdNotFoundError):
        await admin.describe_consumer_groups(["audit"])
    gone = (await admin.delete_consumer_groups(["audit"]))["audit"]
    assert isinstance(gone.error, GroupIdNotFoundError)
    with pytest.raises(GroupIdNotFoundError):
        gone.raise_for_error()


async def test_unknown_and_invalid_groups_are_clear_errors(admin: AdminClient) -> None:
    with pytest.raises(GroupIdNotFoundError, match="Consumer group 'ghost' does not exist"):
        await admin.describe_consumer_groups(["ghost"])
    assert await admin.list_consumer_group_offsets("ghost") == {}
    assert await admin.list_consumer_groups() == []
    with pytest.raises(InvalidGroupIdError):
        await admin.describe_consumer_groups([""])
    with pytest.raises(InvalidGroupIdError):
        await admin.alter_consumer_group_offsets("", {("t", 0): 1})


async def test_offsets_of_a_group_without_members_can_be_set_from_nothing(
    server: EmbeddedServer, admin: AdminClient
) -> None:
    await create_topic(admin, "logs", 1)
    await admin.alter_consumer_group_offsets("fresh", {("logs", 0): 0})
    listed = await admin.list_consumer_groups()
    assert [(g.group_id, g.state, g.is_simple_consumer_group) for g in listed] == [
        ("fresh", "Empty", True)
    ]
    assert await admin.list_consumer_group_offsets("fresh") == {("logs", 0): OffsetAndMetadata(0)}


async def test_list_offsets_by_spec(server: EmbeddedServer, admin: AdminClient) -> None:
    await create_topic(admin, "metrics", 2)
    await produce(server.listen, "metrics", {0: 5})
    after = int(time.time() * 1000) + 60_000
    found = await admin.list_offsets(
        {
            ("metrics", 0): OffsetSpec.EARLIEST,
            ("metrics", 1): OffsetSpec.LATEST,
        }
    )
    assert found[("metrics", 0)].offset == 0
    assert found[("metrics", 1)].offset == 0
    latest = await admin.list_offsets({("metrics", 0): OffsetSpec.LATEST})
    assert latest[("metrics", 0)].offset == 5
    first = await admin.list_offsets({("metrics", 0): OffsetSpec.for_timestamp(0)})
    assert first[("metrics", 0)].offset == 0
    future = await admin.list_offsets({("metrics", 0): OffsetSpec.for_timestamp(after)})
    assert future[("metrics", 0)].offset == -1
    with pytest.raises(UnknownTopicOrPartitionError, match="'nope' does not exist"):
        await admin.list_offsets({("nope", 0): OffsetSpec.LATEST})
    with pytest.raises(UnknownTopicOrPartitionError, match="no partition 7"):
        await admin.list_offsets({("metrics", 7): OffsetSpec.LATEST})
