"""The consumer in a group, against a real embedded server: rebalances with the eager and
the cooperative protocol, static membership, auto-commit, commit errors, close (its
connections closed even when leaving the group failed)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import grpc.aio
import pytest
from embedded_servers import running_embedded_server
from highwater.client.admin import AdminClient, NewTopic
from highwater.client.consumer import (
    AsyncConsumer,
    CommitFailedError,
    ConsumerClosedError,
    ConsumerError,
    LogTruncationError,
    Message,
    TopicPartition,
)
from highwater.client.errors import ClusterError
from highwater.client.producer import AsyncProducer
from highwater.embedded import EmbeddedServer
from highwater.v1 import broker_pb2 as pb
from highwater.v1 import broker_pb2_grpc, coordinator_pb2_grpc
from highwater.v1 import coordinator_pb2 as cpb

pytestmark = pytest.mark.timeout(90)

TOPIC = "orders"
PARTITIONS = 6


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[EmbeddedServer]:
    async with running_embedded_server(tmp_path) as embedded:
        async with AdminClient(embedded.listen) as admin:
            await admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)])
        async with AsyncProducer({"bootstrap.servers": embedded.listen}) as producer:
            await asyncio.gather(
                *(
                    producer.produce(TOPIC, f"{p}-{i}".encode(), partition=p)
                    for p in range(PARTITIONS)
                    for i in range(10)
                )
            )
        yield embedded


class Member:
    """An AsyncConsumer in the group, polled in the background, with its callbacks' log."""

    def __init__(
        self, address: str, name: str, *, topics: Sequence[str] = (TOPIC,), **config: Any
    ) -> None:
        self.name = name
        self.topics = list(topics)
        self.consumer = AsyncConsumer(
            {
                "bootstrap.servers": address,
                "group.id": "app",
                "client.id": name,
                "auto.offset.reset": "earliest",
                "heartbeat.interval.ms": 200,
                "session.timeout.ms": 6000,
                **config,
            }
        )
        self.assigned: list[set[tuple[str, int]]] = []
        self.revoked: list[set[tuple[str, int]]] = []
        self.records: list[tuple[int, int]] = []
        self.partitions_read: set[tuple[str, int]] = set()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        def on_assign(_c: AsyncConsumer, partitions: list[TopicPartition]) -> None:
            self.assigned.append({tp.key() for tp in partitions})

        def on_revoke(_c: AsyncConsumer, partitions: list[TopicPartition]) -> None:
            self.revoked.append({tp.key() for tp in partitions})

        self.consumer.subscribe(self.topics, on_assign=on_assign, on_revoke=on_revoke)
        self._task = asyncio.create_task(self._poll())

    async def _poll(self) -> None:
        while True:
            message = await self.consumer.poll(0.1)
            if message is not None and message.error() is None:
                self.records.append((message.partition(), message.offset()))
                self.partitions_read.add((message.topic(), message.partition()))

    def owned(self) -> set[tuple[str, int]]:
        return {tp.key() for tp in self.consumer.assignment()}

    async def stop_polling(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def close(self) -> None:
        await self.stop_polling()
        await self.consumer.close()


async def eventually(check: Callable[[], bool], what: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"not within {timeout_s}s: {what}")


def balanced(members: list[Member]) -> bool:
    owned = [m.owned() for m in members]
    everything = set().union(*owned)
    return (
        len(everything) == PARTITIONS
        and sum(len(o) for o in owned) == PARTITIONS
        and max(map(len, owned)) - min(map(len, owned)) <= 1
    )


async def test_eager_members_share_the_partitions_and_consume_every_record_once(
    server: EmbeddedServer,
) -> None:
    a = Member(server.listen, "a", **{"partition.assignment.strategy": "range"})
    b = Member(server.listen, "b", **{"partition.assignment.strategy": "range"})
    a.start()
    await eventually(lambda: len(a.owned()) == PARTITIONS, "a alone owns everything")
    b.start()
    await eventually(lambda: balanced([a, b]), "a and b share the partitions")
    await eventually(lambda: len(set(a.records) | set(b.records)) == 60, "every record read")
    # Eager: a gave everything up before the second generation.
    assert a.revoked and a.revoked[-1] == {(TOPIC, p) for p in range(PARTITIONS)}
    await a.close()  # commits its positions and leaves: b takes everything at once
    await eventually(lambda: len(b.owned()) == PARTITIONS, "b owns everything after a left")
    await b.close()
    seen = a.records + b.records
    # At-least-once across the hand-over; every record, and no record twice within a member.
    assert set(seen) == {(p, o) for p in range(PARTITIONS) for o in range(10)}
    assert len(set(a.records)) == len(a.records) and len(set(b.records)) == len(b.records)


async def test_cooperative_members_give_up_only_the_partitions_that_move(
    server: EmbeddedServer,
) -> None:
    config = {"partition.assignment.strategy": "cooperative-sticky"}
    a, b = Member(server.listen, "a", **config), Member(server.listen, "b", **config)
    a.start()
    await eventually(lambda: len(a.owned()) == PARTITIONS, "a owns everything")
    kept_by_a: set[tuple[str, int]] = set()
    b.start()
    await eventually(lambda: balanced([a, b]), "a and b share the partitions")
    kept_by_a = a.owned()
    # a revoked exactly what b got, and never the partitions it kept.
    assert a.revoked == [b.owned()]
    assert not any(kept_by_a & r for r in a.revoked)
    # No partition was ever owned by both at once: a revoked before b was assigned.
    assert b.assigned[-1] == b.owned()
    await a.close()
    await b.close()


async def test_a_static_member_that_restarts_gets_its_partitions_back_without_a_rebalance(
    server: EmbeddedServer,
) -> None:
    config = {"partition.assignment.strategy": "range", "session.timeout.ms": 10000}
    a = Member(server.listen, "a", **{**config, "group.instance.id": "pod-a"})
    b = Member(server.listen, "b", **{**config, "group.instance.id": "pod-b"})
    a.start()
    b.start()
    await eventually(lambda: balanced([a, b]), "a and b share the partitions")
    generation = a.consumer.consumer_group_metadata().generation_id
    before = b.owned()
    # a and b may have joined one after the other (two generations): count from here.
    a_history = (len(a.assigned), len(a.revoked))
    await b.close()  # a static member does not leave the group on close
    restarted = Member(server.listen, "b", **{**config, "group.instance.id": "pod-b"})
    restarted.start()
    await eventually(lambda: restarted.owned() == before, "pod-b has its partitions back")
    assert restarted.consumer.consumer_group_metadata().generation_id == generation
    assert a.consumer.consumer_group_metadata().generation_id == generation
    assert (len(a.assigned), len(a.revoked)) == a_history  # a was never disturbed
    await a.close()
    await restarted.close()


async def test_auto_commit_and_close_commit_the_positions(server: EmbeddedServer) -> None:
    a = Member(server.listen, "a", **{"auto.commit.interval.ms": 100})
    a.start()
    await eventually(lambda: len(a.records) == 60, "every record read")
    await a.close()
    probe = AsyncConsumer({"bootstrap.servers": server.listen, "group.id": "app"})
    committed = await probe.committed([TopicPartition(TOPIC, p) for p in range(PARTITIONS)])
    assert [tp.offset for tp in committed] == [10] * PARTITIONS
    await probe.close()


async def test_commits_are_checked_against_the_membership(server: EmbeddedServer) -> None:
    a = Member(server.listen, "a", **{"enable.auto.commit": False})
    a.start()
    await eventually(lambda: len(a.owned()) == PARTITIONS, "a owns everything")
    await a.stop_polling()
    done = await a.consumer.commit(offsets=[TopicPartition(TOPIC, 0, 3)], asynchronous=False)
    assert done is not None and done[0].error is None
    async with AdminClient(server.listen) as admin:
        await admin.create_topics([NewTopic("other", 1, 1)])  # it exists, unassigned
    deadline = time.monotonic() + 30
    while True:
        with pytest.raises(CommitFailedError) as failed:
            await a.consumer.commit(offsets=[TopicPartition("other", 0, 3)], asynchronous=False)
        # Until the coordinator's image has the new topic, it does not exist there.
        if "not assigned" in str(failed.value) or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.05)
    assert "not assigned" in str(failed.value)
    await a.close()
    no_group = AsyncConsumer({"bootstrap.servers": server.listen})
    with pytest.raises(ConsumerError, match=r"group\.id"):
        no_group.subscribe([TOPIC])
    await no_group.close()


async def test_close_closes_the_connections_when_leaving_the_group_fails(
    server: EmbeddedServer,
) -> None:
    """An ``on_revoke`` that raises while the consumer leaves its group: ``close`` raises
    that error, after closing the consumer and every channel all the same."""

    def on_revoke(_c: AsyncConsumer, _partitions: list[TopicPartition]) -> None:
        raise RuntimeError("the application failed to revoke")

    consumer = AsyncConsumer({"bootstrap.servers": server.listen, "group.id": "app"})
    consumer.subscribe([TOPIC], on_revoke=on_revoke)
    for _ in range(200):
        await consumer.poll(0.05)
        if len(consumer.assignment()) == PARTITIONS:
            break
    assert len(consumer.assignment()) == PARTITIONS
    channels = list(consumer.cluster._channels.values())
    assert channels
    with pytest.raises(RuntimeError, match="failed to revoke"):
        await consumer.close()
    for channel in channels:
        with pytest.raises(grpc.aio.UsageError):
            await broker_pb2_grpc.BrokerStub(channel).Metadata(pb.MetadataRequest())
    with pytest.raises(ConsumerClosedError):
        await consumer.poll(0)
    await consumer.close()  # closed: nothing more


async def test_commits_carry_the_leader_epoch_of_the_records_consumed(
    server: EmbeddedServer,
) -> None:
    """As Kafka's consumer commits ``FetchPosition.offsetEpoch``: the leader epoch of the
    batch the last consumed record came in, and a partition started at a committed offset
    keeps that offset's epoch until it consumes more."""
    a = Member(server.listen, "a", **{"enable.auto.commit": False})
    a.start()
    await eventually(lambda: len(a.records) == 60, "every record read")
    await a.stop_polling()
    await a.consumer.commit(asynchronous=False)
    async with AdminClient(server.listen) as admin:
        described = (await admin.describe_topics([TOPIC]))[TOPIC].partitions
        epochs = {p.partition: p.leader_epoch for p in described}
        committed = await admin.list_consumer_group_offsets("app")
        assert {tp: (o.offset, o.leader_epoch) for tp, o in committed.items()} == {
            (TOPIC, p): (10, epochs[p]) for p in range(PARTITIONS)
        }
        await a.close()
        # b starts at the committed offsets and commits before consuming anything.
        b = Member(server.listen, "b", **{"enable.auto.commit": False})
        b.start()
        await eventually(lambda: len(b.owned()) == PARTITIONS, "b owns everything")
        await b.stop_polling()
        await b.consumer.commit(asynchronous=False)
        again = await admin.list_consumer_group_offsets("app")
        assert again == committed
        await b.close()


async def test_commits_of_a_message_or_of_offsets_carry_the_leader_epoch_known(
    server: EmbeddedServer,
) -> None:
    """Kafka's ``OffsetAndMetadata.leaderEpoch``: a commit of a message carries the epoch
    of the batch it came in, one of offsets the epoch each ``TopicPartition`` gives (none
    without), and ``committed()`` answers the epochs with the offsets."""
    consumer = AsyncConsumer(
        {
            "bootstrap.servers": server.listen,
            "group.id": "epochs",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe([TOPIC])
    try:
        last: dict[int, Message] = {}
        first: dict[int, Message] = {}
        async with asyncio.timeout(30):
            while len(last) < PARTITIONS or any(m.offset() < 9 for m in last.values()):
                message = await consumer.poll(0.5)
                if message is not None:
                    assert message.error() is None, message.error()
                    last[message.partition()] = message
                    first.setdefault(message.partition(), message)
        async with AdminClient(server.listen) as admin:
            described = (await admin.describe_topics([TOPIC]))[TOPIC].partitions
            epochs = {p.partition: p.leader_epoch for p in described}
            # every message carries the epoch of its batch (confluent-kafka's leader_epoch())
            assert {p: m.leader_epoch() for p, m in last.items()} == epochs
            # a message that is not the last returned commits its own epoch too
            await consumer.commit(message=first[2], asynchronous=False)
            committed = await admin.list_consumer_group_offsets("epochs")
            assert (committed[(TOPIC, 2)].offset, committed[(TOPIC, 2)].leader_epoch) == (
                first[2].offset() + 1,
                epochs[2],
            )
            await consumer.commit(message=last[0], asynchronous=False)
            await consumer.commit(
                offsets=[
                    TopicPartition(TOPIC, 1, 7, leader_epoch=epochs[1]),
                    TopicPartition(TOPIC, 2, 5),
                ],
                asynchronous=False,
            )
            committed = await admin.list_consumer_group_offsets("epochs")
        assert {tp: (o.offset, o.leader_epoch) for tp, o in committed.items()} == {
            (TOPIC, 0): (10, epochs[0]),
            (TOPIC, 1): (7, epochs[1]),
            (TOPIC, 2): (5, None),
        }
        answered = await consumer.committed([TopicPartition(TOPIC, p) for p in range(3)])
        assert [(tp.offset, tp.leader_epoch) for tp in answered] == [
            (10, epochs[0]),
            (7, epochs[1]),
            (5, None),
        ]
    finally:
        await consumer.close()


@pytest.mark.parametrize("reset", ["earliest", "none"])
async def test_a_member_starting_at_a_commit_past_its_epochs_end_resumes_at_the_divergence(
    server: EmbeddedServer, reset: str
) -> None:
    """KIP-320 from a committed offset: the group committed offset 14 of epoch e, but the
    leader's log holds e only up to 10 (each partition has 10 records: as for a commit
    made against a replica truncated since). The member starting on it asks the leader
    where e ends before fetching: with auto.offset.reset it resumes at 10, the first
    offset known to diverge (not at the reset policy's earliest, re-reading what the
    group had consumed), and with none it gets a LogTruncationError naming 10."""
    async with AdminClient(server.listen) as admin:
        epoch = (await admin.describe_topics([TOPIC]))[TOPIC].partitions[0].leader_epoch
    config = {"bootstrap.servers": server.listen, "group.id": f"past-{reset}"}
    committer = AsyncConsumer(config)
    committer.subscribe([TOPIC])
    try:
        await committer.commit(
            offsets=[TopicPartition(TOPIC, 0, 14, leader_epoch=epoch)], asynchronous=False
        )
    finally:
        await committer.close()
    consumer = AsyncConsumer({**config, "auto.offset.reset": reset, "enable.auto.commit": False})
    consumer.subscribe([TOPIC])
    first = TopicPartition(TOPIC, 0)
    try:
        first_message = None
        async with asyncio.timeout(30):
            while True:
                message = await consumer.poll(0.2)
                if message is not None and message.partition() == 0:
                    first_message = message
                    break
                if reset != "none" and consumer.position([first])[0].offset == 10:
                    break
        if reset == "none":
            assert first_message is not None
            error = first_message.error()
            assert isinstance(error, LogTruncationError), error
            truncation = error.truncation
            assert (truncation.offset, truncation.epoch) == (14, epoch)
            assert (truncation.divergent_offset, truncation.divergent_epoch) == (10, epoch)
            return
        assert first_message is None, (first_message.offset(), first_message.error())
        async with AsyncProducer({"bootstrap.servers": server.listen}) as producer:
            await producer.produce(TOPIC, b"0-10", partition=0)
        async with asyncio.timeout(30):
            while (message := await consumer.poll(0.2)) is None or message.partition() != 0:
                pass
        assert message.error() is None, message.error()
        assert (message.offset(), message.value()) == (10, b"0-10")
    finally:
        await consumer.close()


async def test_an_eager_member_hears_on_revoke_at_the_start_of_every_rebalance_even_with_nothing(
    server: EmbeddedServer,
) -> None:
    """Kafka's ConsumerRebalanceListener: with eager rebalancing ``onPartitionsRevoked`` is
    always called at the start of a rebalance (not at the first join, which has no
    generation), ``onPartitionsAssigned`` at the end of every one, even with no partitions."""
    a = Member(server.listen, "a", **{"partition.assignment.strategy": "range"})
    a.start()
    await eventually(lambda: len(a.owned()) == PARTITIONS, "a owns everything")
    calls: list[tuple[str, list[tuple[str, int]]]] = []

    def on_assign(_c: AsyncConsumer, partitions: list[TopicPartition]) -> None:
        calls.append(("assign", [tp.key() for tp in partitions]))

    def on_revoke(_c: AsyncConsumer, partitions: list[TopicPartition]) -> None:
        calls.append(("revoke", [tp.key() for tp in partitions]))

    idle = AsyncConsumer(
        {
            "bootstrap.servers": server.listen,
            "group.id": "app",
            "partition.assignment.strategy": "range",
            "heartbeat.interval.ms": 200,
            "session.timeout.ms": 6000,
        }
    )
    idle.subscribe(["no-such-topic"], on_assign=on_assign, on_revoke=on_revoke)

    async def poll() -> None:
        while True:
            await idle.poll(0.1)

    task = asyncio.create_task(poll())
    try:
        await eventually(lambda: calls == [("assign", [])], "the idle member's first generation")
        await a.close()  # a rebalance: the idle member has nothing, and is told so
        await eventually(lambda: len(calls) == 3, "the idle member's second generation")
        assert calls == [("assign", []), ("revoke", []), ("assign", [])]
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await idle.close()


@pytest.mark.parametrize("how", ["close", "unsubscribe"])
async def test_leaving_after_the_membership_was_lost_reports_the_partitions_lost(
    server: EmbeddedServer, how: str
) -> None:
    """Kafka's onLeavePrepare: a consumer that leaves while its generation is gone (here
    the coordinator removed it) gives its partitions up with ``on_lost``, not
    ``on_revoke``, and commits nothing (they may be another member's already)."""
    calls: list[tuple[str, int]] = []
    consumer = AsyncConsumer(
        {
            "bootstrap.servers": server.listen,
            "group.id": "app",
            "auto.offset.reset": "earliest",
            "heartbeat.interval.ms": 100,
            "session.timeout.ms": 6000,
        }
    )
    consumer.subscribe(
        [TOPIC],
        on_revoke=lambda _c, ps: calls.append(("revoke", len(ps))),
        on_lost=lambda _c, ps: calls.append(("lost", len(ps))),
    )
    for _ in range(200):
        await consumer.poll(0.05)
        if len(consumer.assignment()) == PARTITIONS:
            break
    metadata = consumer.consumer_group_metadata()
    assert len(consumer.assignment()) == PARTITIONS
    async with grpc.aio.insecure_channel(server.listen) as channel:
        left = await coordinator_pb2_grpc.GroupCoordinatorStub(channel).LeaveGroup(
            cpb.LeaveGroupRequest(
                group_id="app", members=[cpb.LeavingMember(member_id=metadata.member_id)]
            )
        )
    assert left.error == 0
    await eventually(
        lambda: consumer.consumer_group_metadata().generation_id == -1, "the heartbeat hears it"
    )
    if how == "close":
        await consumer.close()
    else:
        await consumer.unsubscribe()
        await consumer.close()
    assert calls == [("lost", PARTITIONS)]
    probe = AsyncConsumer({"bootstrap.servers": server.listen, "group.id": "app"})
    committed = await probe.committed([TopicPartition(TOPIC, p) for p in range(PARTITIONS)])
    assert all(tp.offset is not None and tp.offset < 0 for tp in committed)
    await probe.close()


async def test_a_group_whose_leader_could_not_read_the_partition_counts_still_consumes_them(
    server: EmbeddedServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Kafka's leader assigns from the metadata it has and rejoins once the metadata
    differs from what it assigned from: a leader that cannot read the partition counts
    assigns nothing, says so, and the group rebalances once they can be read."""
    config = {"partition.assignment.strategy": "range"}
    a, b = Member(server.listen, "a", **config), Member(server.listen, "b", **config)
    failed_reads = 0
    readable = False
    for member in (a, b):
        cluster = member.consumer.cluster
        read = cluster.partition_counts

        async def counts(topics: Sequence[str], read: Any = read) -> dict[str, int]:
            nonlocal failed_reads
            if not readable:
                failed_reads += 1
                raise ClusterError("no broker answers Metadata")
            result: dict[str, int] = await read(topics)
            return result

        cluster.partition_counts = counts  # type: ignore[method-assign]
    a.start()
    b.start()

    def formed_without_partitions() -> bool:
        ma, mb = a.consumer.consumer_group_metadata(), b.consumer.consumer_group_metadata()
        return ma.generation_id == mb.generation_id >= 1 and bool(ma.member_id and mb.member_id)

    await eventually(formed_without_partitions, "a and b in one generation")
    assert failed_reads and not a.owned() and not b.owned()
    assert "partition counts" in caplog.text
    readable = True
    await eventually(lambda: balanced([a, b]), "a and b share the partitions")
    await eventually(lambda: len(set(a.records) | set(b.records)) == 60, "every record read")
    await a.close()
    await b.close()


PAYMENTS = "payments"


@pytest.mark.parametrize("leader", ["a", "b"])
@pytest.mark.parametrize("payments_at_first", [0, 1])
async def test_a_topic_only_another_member_subscribes_to_is_assigned_once_it_appears_or_grows(
    server: EmbeddedServer, leader: str, payments_at_first: int
) -> None:
    """Kafka's leader watches every topic the group subscribes to, not only its own
    (``groupSubscribe``), and rejoins when their partition counts differ from those it
    assigned from: here a only subscribes to "orders", b also to "payments", which does not
    exist yet (or has one partition) and appears (or grows to three) while the group runs.
    Whoever leads, b consumes every partition of "payments" within a few
    ``metadata.max.age.ms``. b checks its own topics only every five minutes (Kafka's
    followers never do), so that it is the leader's watch that must see the change."""
    config = {"partition.assignment.strategy": "range"}
    a = Member(server.listen, "a", **config, **{"metadata.max.age.ms": 300})
    b = Member(
        server.listen,
        "b",
        topics=[TOPIC, PAYMENTS],
        **config,
        **{"metadata.max.age.ms": 300 if leader == "b" else 300_000},
    )
    try:
        async with AdminClient(server.listen) as admin:
            if payments_at_first:
                await admin.create_topics([NewTopic(PAYMENTS, payments_at_first, 1)])
            first, second = (a, b) if leader == "a" else (b, a)
            first.start()  # the first member to join leads, and keeps leading
            await eventually(lambda: len(first.owned()) >= PARTITIONS, "the leader's generation")
            second.start()
            await eventually(lambda: balanced_orders([a, b]), "a and b share the orders")
            assert {tp for tp in b.owned() if tp[0] == PAYMENTS} == {
                (PAYMENTS, p) for p in range(payments_at_first)
            }
            if payments_at_first:
                await admin.create_partitions({PAYMENTS: 3})
            else:
                await admin.create_topics([NewTopic(PAYMENTS, 3, 1)])
        async with AsyncProducer({"bootstrap.servers": server.listen}) as producer:
            await asyncio.gather(
                *(producer.produce(PAYMENTS, b"paid", partition=p) for p in range(3))
            )
        await eventually(
            lambda: (
                {tp for tp in b.owned() if tp[0] == PAYMENTS} == {(PAYMENTS, p) for p in range(3)}
            ),
            "b owns every partition of payments",
        )
        await eventually(
            lambda: {(PAYMENTS, p) for p in range(3)} <= b.partitions_read,
            "b reads every partition of payments",
        )
        assert not a.owned() & b.owned()
    finally:
        await a.close()
        await b.close()


def balanced_orders(members: list[Member]) -> bool:
    owned = [{tp for tp in m.owned() if tp[0] == TOPIC} for m in members]
    return sum(len(o) for o in owned) == PARTITIONS and all(
        len(o) == PARTITIONS // len(members) for o in owned
    )
