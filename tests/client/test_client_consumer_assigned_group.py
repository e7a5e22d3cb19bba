"""The consumer with partitions assigned by hand, against a real EmbeddedServer: where they
start with a ``group.id`` (the group's committed offset), auto-commit without joining the
group, partitions of topics that do not exist (yet, or any more), and the group settings'
checks.

The server runs on its own event loop in a background thread (one per module); each test
uses topics and groups of its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import grpc.aio
import pytest
from embedded_servers import ServerThread
from highwater.client.admin import AdminClient, NewTopic
from highwater.client.cluster import UnknownTopicOrPartitionError
from highwater.client.consumer import (
    OFFSET_INVALID,
    OFFSET_STORED,
    AsyncConsumer,
    ConsumerConfig,
    Message,
    TopicPartition,
)
from highwater.client.producer import AsyncProducer
from highwater.errors import InvalidConfigError
from highwater.v1 import broker_pb2 as pb
from highwater.v1 import broker_pb2_grpc
from highwater.v1.common_pb2 import ErrorCode

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    """One embedded server for the module."""
    thread = ServerThread(tmp_path_factory.mktemp("assigned-group"))
    thread.start()
    try:
        yield thread
    finally:
        thread.stop()


async def described(address: str, topic: str) -> pb.MetadataTopic:
    """The broker's Metadata answer for ``topic``."""
    async with grpc.aio.insecure_channel(address) as channel:
        reply = await broker_pb2_grpc.BrokerStub(channel).Metadata(
            pb.MetadataRequest(topics=[topic])
        )
    return reply.topics[0]


async def create_topic(address: str, name: str) -> None:
    """Create a topic of one partition and wait until Metadata names its leader."""
    async with AdminClient(address, request_timeout_s=10) as admin:
        (await admin.create_topics([NewTopic(name, 1, 1)]))[name].raise_for_error()
    for _ in range(500):
        found = (await described(address, name)).partitions
        if len(found) == 1 and found[0].leader_id >= 0:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{name} got no leader")


async def delete_topic(address: str, name: str) -> None:
    """Delete a topic and wait until Metadata no longer names it."""
    async with AdminClient(address, request_timeout_s=10) as admin:
        (await admin.delete_topics([name]))[name].raise_for_error()
    for _ in range(500):
        if (await described(address, name)).error == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{name} was not deleted")


async def produce(address: str, topic: str, values: list[str]) -> None:
    """Write ``values`` to partition 0 of ``topic``."""
    async with AsyncProducer({"bootstrap.servers": address, "linger.ms": 0}) as producer:
        await asyncio.gather(*(producer.produce(topic, v, partition=0) for v in values))


async def committed(address: str, group: str, topic: str) -> int | None:
    """The offset ``group`` committed for partition 0 of ``topic`` (None: none)."""
    config = {"bootstrap.servers": address, "group.id": group, "enable.auto.commit": False}
    async with AsyncConsumer(config) as probe:
        [tp] = await probe.committed([TopicPartition(topic, 0)])
    return None if tp.offset == OFFSET_INVALID else tp.offset


def values(messages: list[Message]) -> list[bytes | None]:
    return [m.value() for m in messages]


# --- where an assigned partition starts -----------------------------------------------------


@pytest.mark.parametrize("offset", [None, OFFSET_STORED, OFFSET_INVALID])
async def test_an_assigned_partition_starts_at_the_groups_committed_offset(
    server: ServerThread, offset: int | None
) -> None:
    """As Kafka's ``updateFetchPositions`` (``initWithCommittedOffsetsIfNeeded`` before any
    reset, manual assignment included): with ``auto.offset.reset=latest`` a restarted
    consumer resumes at its commit, and does not skip what was produced meanwhile."""
    topic, group = f"resume-{offset}", f"resume-{offset}"
    await create_topic(server.address, topic)
    await produce(server.address, topic, [f"v{i}" for i in range(6)])
    config = {
        "bootstrap.servers": server.address,
        "group.id": group,
        "auto.offset.reset": "latest",
        "enable.auto.commit": False,
        "fetch.max.wait.ms": 100,
    }
    async with AsyncConsumer(config) as first:
        first.assign([TopicPartition(topic, 0, 0)])
        messages = await first.consume(4, 10)
        assert values(messages) == [b"v0", b"v1", b"v2", b"v3"]
        await first.commit(messages[-1], asynchronous=False)
    async with AsyncConsumer(config) as restarted:
        restarted.assign([TopicPartition(topic, 0, offset)])
        assert values(await restarted.consume(2, 10)) == [b"v4", b"v5"]
        [committed_tp] = await restarted.committed([TopicPartition(topic, 0)])
        assert committed_tp.leader_epoch is not None  # the commit's epoch, validated


async def test_an_assigned_partition_without_a_commit_starts_by_auto_offset_reset(
    server: ServerThread,
) -> None:
    await create_topic(server.address, "no-commit")
    await produce(server.address, "no-commit", ["a", "b"])
    for reset in ("earliest", "latest"):
        config = {
            "bootstrap.servers": server.address,
            "group.id": f"no-commit-{reset}",
            "auto.offset.reset": reset,
            "enable.auto.commit": False,
            "fetch.max.wait.ms": 100,
        }
        async with AsyncConsumer(config) as consumer:
            consumer.assign([TopicPartition("no-commit", 0)])
            if reset == "earliest":
                assert values(await consumer.consume(2, 10)) == [b"a", b"b"]
            else:
                assert await consumer.poll(0.5) is None
                await produce(server.address, "no-commit", ["c"])
                assert values(await consumer.consume(1, 10)) == [b"c"]


# --- auto-commit of partitions assigned by hand ---------------------------------------------


async def test_assigned_partitions_are_auto_committed_without_joining_the_group(
    server: ServerThread,
) -> None:
    """As Kafka's ``ConsumerCoordinator.poll`` and ``close``: with ``enable.auto.commit``
    the positions of partitions assigned by hand are committed every
    ``auto.commit.interval.ms`` and on close, and the consumer is no member of the group."""
    await create_topic(server.address, "auto-commit")
    await produce(server.address, "auto-commit", [f"v{i}" for i in range(10)])
    config = {
        "bootstrap.servers": server.address,
        "group.id": "auto-commit",
        "auto.commit.interval.ms": 100,
        "fetch.max.wait.ms": 100,
    }
    async with AsyncConsumer(config) as consumer:
        consumer.assign([TopicPartition("auto-commit", 0, 0)])
        assert len(await consumer.consume(10, 10)) == 10
        for _ in range(50):
            await consumer.poll(0.05)
            if await committed(server.address, "auto-commit", "auto-commit") == 10:
                break
        assert await committed(server.address, "auto-commit", "auto-commit") == 10
        assert consumer.consumer_group_metadata().member_id == ""


async def test_close_commits_the_positions_of_assigned_partitions(server: ServerThread) -> None:
    await create_topic(server.address, "close-commit")
    await produce(server.address, "close-commit", [f"v{i}" for i in range(10)])
    config = {
        "bootstrap.servers": server.address,
        "group.id": "close-commit",
        "auto.commit.interval.ms": 600_000,
        "fetch.max.wait.ms": 100,
    }
    async with AsyncConsumer(config) as consumer:
        consumer.assign([TopicPartition("close-commit", 0, 0)])
        assert len(await consumer.consume(7, 10)) == 7
        # Only the first poll's commit, of the starting position, before the interval.
        assert await committed(server.address, "close-commit", "close-commit") in (None, 0)
    assert await committed(server.address, "close-commit", "close-commit") == 7


# --- partitions of topics that do not exist -------------------------------------------------


def errors_of(messages: list[Message]) -> list[BaseException]:
    return [e for m in messages if (e := m.error()) is not None]


async def test_a_topic_created_after_assign_is_read_once_it_exists(server: ServerThread) -> None:
    """UNKNOWN_TOPIC_OR_PARTITION is delivered once (librdkafka), and the partition is
    fetched on after a metadata refresh (Kafka's fetcher), not dropped."""
    config = {
        "bootstrap.servers": server.address,
        "auto.offset.reset": "earliest",
        "fetch.max.wait.ms": 100,
        "retry.backoff.ms": 50,
    }
    async with AsyncConsumer(config) as consumer:
        consumer.assign([TopicPartition("late", 0)])
        before = await consumer.consume(5, 1)
        [error] = errors_of(before)
        assert isinstance(error, UnknownTopicOrPartitionError)
        await create_topic(server.address, "late")
        await produce(server.address, "late", ["a", "b"])
        after = await consumer.consume(2, 10)
        assert errors_of(after) == [] and values(after) == [b"a", b"b"]


async def test_a_topic_deleted_and_created_again_is_read_on_at_the_position(
    server: ServerThread,
) -> None:
    await create_topic(server.address, "reborn")
    await produce(server.address, "reborn", ["old0", "old1"])
    config = {
        "bootstrap.servers": server.address,
        "auto.offset.reset": "earliest",
        "fetch.max.wait.ms": 100,
        "retry.backoff.ms": 50,
    }
    async with AsyncConsumer(config) as consumer:
        consumer.assign([TopicPartition("reborn", 0, 0)])
        assert values(await consumer.consume(2, 10)) == [b"old0", b"old1"]
        await delete_topic(server.address, "reborn")
        gone = await consumer.consume(5, 1)
        [error] = errors_of(gone)
        assert isinstance(error, UnknownTopicOrPartitionError)
        await create_topic(server.address, "reborn")
        await produce(server.address, "reborn", ["new0", "new1", "new2"])
        assert values(await consumer.consume(1, 10)) == [b"new2"]


# --- settings -------------------------------------------------------------------------------


def test_the_heartbeat_interval_must_be_below_the_session_timeout() -> None:
    """Kafka's ``Heartbeat``: "Heartbeat must be set lower than the session timeout"."""
    base = {"bootstrap.servers": "localhost:1", "group.id": "g", "session.timeout.ms": 6000}
    for heartbeat in (6000, 10000):
        with pytest.raises(InvalidConfigError, match=r"heartbeat\.interval\.ms"):
            ConsumerConfig.parse({**base, "heartbeat.interval.ms": heartbeat})
    assert ConsumerConfig.parse({**base, "heartbeat.interval.ms": 2000}).heartbeat_interval_ms == (
        2000
    )


async def test_a_commit_waits_for_the_coordinator_to_know_a_new_topic(
    server: ServerThread,
) -> None:
    """A commit answered UNKNOWN_TOPIC_OR_PARTITION, which the coordinator answers while
    its metadata does not have the partition yet, is sent again within
    ``request.timeout.ms``, as Kafka's consumer retries it: here the topic is created
    while the commit waits, and the commit is then taken."""
    config = {
        "bootstrap.servers": server.address,
        "group.id": "commit-new-topic",
        "enable.auto.commit": False,
        "request.timeout.ms": 8000,
    }
    async with AsyncConsumer(config) as consumer:

        async def create_later() -> None:
            await asyncio.sleep(0.5)
            await create_topic(server.address, "appears-later")

        creating = asyncio.create_task(create_later())
        done = await consumer.commit(
            offsets=[TopicPartition("appears-later", 0, 4)], asynchronous=False
        )
        await creating
        assert done is not None and done[0].error is None, done
    assert await committed(server.address, "commit-new-topic", "appears-later") == 4
