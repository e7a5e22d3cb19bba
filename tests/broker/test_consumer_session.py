"""Consumer sessions (``Broker.ConsumerSession``) against two brokers in one process.

The topic's partitions are split between broker 1 (where sessions connect, with the
controller and the group coordinator) and broker 2, so a session reads some partitions
from the broker it talks to and the others from their leader over gRPC. The stories: a
member consumes, acknowledges and commits (and only what it acknowledged is committed);
a second member rebalances the group and, dropped without a word, gives its partitions
back; a session that never acknowledges is not fed past its credit; seeks; explicit
partitions; refusals with clear status codes; hundreds of sessions opened and dropped
leave no task behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import grpc
import grpc.aio
import pytest
import pytest_asyncio
from highwater.broker import consumer_session
from highwater.client.admin import AdminClient
from highwater.controller_api import messages as m
from highwater.rpc import auth
from highwater.security import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
)
from highwater.security.authentication import SESSION_METADATA_KEY
from highwater.v1 import broker_pb2 as pb
from highwater.v1 import broker_pb2_grpc, coordinator_pb2, coordinator_pb2_grpc
from highwater.v1.common_pb2 import ErrorCode
from two_brokers import TwoBrokers, two_brokers

pytestmark = [pytest.mark.timeout(120), pytest.mark.asyncio(loop_scope="module")]

TOPIC = "sessions"
PARTITIONS = 4
RECORDS = 40

Call = grpc.aio.StreamStreamCall  # type: ignore[type-arg]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def cluster(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[TwoBrokers]:
    async with two_brokers(tmp_path_factory.mktemp("sessions")) as running:
        leaders = await running.create_topic(TOPIC, PARTITIONS)
        assert set(leaders.values()) == {1, 2}, leaders
        async with grpc.aio.insecure_channel(running.address) as channel:
            request = pb.ProduceRequest()
            records = [
                pb.Record(key=f"k{i}".encode(), value=f"v{i}".encode()) for i in range(RECORDS)
            ]
            request.topics.add(topic=TOPIC).partitions.add(
                partition=-1, records=pb.PlainRecords(records=records)
            )
            reply = await broker_pb2_grpc.BrokerStub(channel).Produce(request)
            assert reply.topics[0].partitions[0].error == ErrorCode.NONE
        yield running


@pytest_asyncio.fixture(loop_scope="module")
async def broker(cluster: TwoBrokers) -> AsyncIterator[broker_pb2_grpc.BrokerStub]:
    async with grpc.aio.insecure_channel(cluster.address) as channel:
        yield broker_pb2_grpc.BrokerStub(channel)


def start(group: str, **fields: object) -> pb.ConsumerSessionRequest:
    fields.setdefault("topics", [TOPIC])
    fields.setdefault("auto_offset_reset", pb.OFFSET_RESET_EARLIEST)
    fields.setdefault("assignors", ["range"])
    fields.setdefault("session_timeout_ms", 6000)
    fields.setdefault("heartbeat_interval_ms", 200)
    return pb.ConsumerSessionRequest(start=pb.SessionStart(group_id=group, **fields))  # type: ignore[arg-type]


def ack(offsets: dict[tuple[str, int], int], *, commit: bool = False) -> pb.ConsumerSessionRequest:
    return pb.ConsumerSessionRequest(
        ack=pb.SessionAck(
            offsets=[
                pb.SessionOffset(topic=t, partition=p, offset=o) for (t, p), o in offsets.items()
            ],
            commit=commit,
        )
    )


class Session:
    """A client's end of a consumer session: its events read into a queue as they come
    (a read given up on a timeout would cancel the call)."""

    def __init__(
        self, broker: broker_pb2_grpc.BrokerStub, metadata: tuple[tuple[str, str], ...] = ()
    ) -> None:
        self.call: Call = broker.ConsumerSession(metadata=metadata)
        self.events: asyncio.Queue[pb.ConsumerSessionResponse | None] = asyncio.Queue()
        self.reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        try:
            while (event := await self.call.read()) is not grpc.aio.EOF:
                self.events.put_nowait(event)
        except (grpc.aio.AioRpcError, asyncio.CancelledError):
            pass  # the call failed, or this end cancelled it (drop)
        finally:
            self.events.put_nowait(None)

    async def write(self, request: pb.ConsumerSessionRequest) -> None:
        await self.call.write(request)

    async def next(self, kind: str, timeout: float = 20) -> pb.ConsumerSessionResponse:
        """The next event of ``kind`` (others are skipped)."""
        deadline = time.monotonic() + timeout
        while True:
            event = await asyncio.wait_for(
                self.events.get(), max(deadline - time.monotonic(), 0.01)
            )
            assert event is not None, "the session ended"
            if event.WhichOneof("event") == kind:
                return event

    async def consume(self, count: int) -> dict[tuple[str, int], list[pb.FetchedRecord]]:
        """Read records until ``count`` arrived, acknowledging none."""
        seen: dict[tuple[str, int], list[pb.FetchedRecord]] = {}
        total = 0
        while total < count:
            event = (await self.next("records")).records
            seen.setdefault((event.topic, event.partition), []).extend(event.records)
            total += len(event.records)
        return seen

    async def drop(self) -> None:
        self.call.cancel()
        await self.reader


async def committed(cluster: TwoBrokers, group: str) -> dict[int, int]:
    return {p: offset for p, (offset, _) in (await committed_with_epochs(cluster, group)).items()}


async def committed_with_epochs(cluster: TwoBrokers, group: str) -> dict[int, tuple[int, int]]:
    """The group's committed offset of each partition with its leader epoch."""
    async with grpc.aio.insecure_channel(cluster.address) as channel:
        reply = await coordinator_pb2_grpc.GroupCoordinatorStub(channel).OffsetFetch(
            coordinator_pb2.OffsetFetchRequest(
                group_id=group,
                topics=[
                    coordinator_pb2.OffsetFetchTopic(
                        name=TOPIC, partition_indexes=range(PARTITIONS)
                    )
                ],
            )
        )
    return {
        p.partition_index: (p.committed_offset, p.committed_leader_epoch)
        for p in reply.topics[0].partitions
    }


async def members(cluster: TwoBrokers, group: str) -> int:
    async with grpc.aio.insecure_channel(cluster.address) as channel:
        reply = await coordinator_pb2_grpc.GroupCoordinatorStub(channel).DescribeGroups(
            coordinator_pb2.DescribeGroupsRequest(group_ids=[group])
        )
    return len(reply.groups[0].members)


async def test_a_member_consumes_every_partition_and_commits_only_what_it_acknowledged(
    cluster: TwoBrokers, broker: broker_pb2_grpc.BrokerStub
) -> None:
    session = Session(broker)
    await session.write(start("solo"))
    assignment = (await session.next("assignment")).assignment
    assert assignment.member_id and assignment.generation_id >= 1
    assert {(p.topic, p.partition) for p in assignment.partitions} == {
        (TOPIC, p) for p in range(PARTITIONS)
    }
    seen = await session.consume(RECORDS)
    assert sorted(r.value for rs in seen.values() for r in rs) == sorted(
        f"v{i}".encode() for i in range(RECORDS)
    )
    for records in seen.values():
        assert [r.offset for r in records] == list(range(len(records)))

    # Acknowledge all of partition 0 and the first record of the others; commit.
    acked = {tp: (len(rs) if tp[1] == 0 else 1) for tp, rs in seen.items()}
    await session.write(ack(acked, commit=True))
    result = (await session.next("committed")).committed
    assert {(r.partition, r.offset, r.error) for r in result.partitions} == {
        (tp[1], offset, ErrorCode.NONE) for tp, offset in acked.items()
    }
    # Each commit carries the leader epoch of the last record acknowledged (KIP-320).
    assert await committed_with_epochs(cluster, "solo") == {
        tp[1]: (o, seen[tp][o - 1].leader_epoch) for tp, o in acked.items()
    }

    # A commit without new acknowledgements commits nothing more.
    await session.write(pb.ConsumerSessionRequest(commit=pb.SessionCommit()))
    assert not (await session.next("committed")).committed.partitions
    await session.call.done_writing()
    await session.reader
    assert await session.call.code() == grpc.StatusCode.OK
    assert await members(cluster, "solo") == 0


async def test_a_second_member_rebalances_and_a_dropped_one_gives_its_partitions_back(
    cluster: TwoBrokers, broker: broker_pb2_grpc.BrokerStub
) -> None:
    first = Session(broker)
    await first.write(start("pair"))
    assert len((await first.next("assignment")).assignment.partitions) == PARTITIONS

    async with grpc.aio.insecure_channel(cluster.address) as other:
        second = Session(broker_pb2_grpc.BrokerStub(other))
        await second.write(start("pair"))
        shares: list[set[int]] = []
        for session in (first, second):
            while True:
                event = (await session.next("assignment")).assignment
                if event.generation_id >= 2 and not event.revoked:
                    shares.append({p.partition for p in event.partitions})
                    break
        assert shares[0] | shares[1] == set(range(PARTITIONS))
        assert not shares[0] & shares[1] and all(shares)
        await second.consume(1)  # delivered, never acknowledged
        # The second member's connection goes away without a word.
    await second.reader
    while True:
        event = (await first.next("assignment")).assignment
        if len(event.partitions) == PARTITIONS:
            break
    assert await members(cluster, "pair") == 1
    assert all(offset < 0 for offset in (await committed(cluster, "pair")).values())
    await first.drop()


async def test_a_subscribed_topic_that_appears_is_assigned_to_the_session(
    cluster: TwoBrokers, broker: broker_pb2_grpc.BrokerStub
) -> None:
    """A session subscribed to a topic that does not exist yet gets its partitions once it
    is created: the broker watches its image for the session as a Kafka consumer watches
    the metadata, and the session rejoins."""
    later = "sessions-later"
    session = Session(broker)
    await session.write(start("watching", topics=[TOPIC, later]))
    first = (await session.next("assignment")).assignment
    assert {p.topic for p in first.partitions} == {TOPIC}
    await cluster.create_topic(later, 2)
    while True:
        event = (await session.next("assignment")).assignment
        owned = {(p.topic, p.partition) for p in event.partitions}
        if (later, 0) in owned:
            break
    assert owned == {(TOPIC, p) for p in range(PARTITIONS)} | {(later, 0), (later, 1)}
    await session.drop()


async def test_a_session_that_never_acknowledges_is_fed_no_more_than_its_credit(
    broker: broker_pb2_grpc.BrokerStub,
) -> None:
    session = Session(broker)
    await session.write(start("stingy", max_records=3))
    seen = await session.consume(3)
    assert sum(len(r) for r in seen.values()) == 3
    with pytest.raises(TimeoutError):
        await session.next("records", timeout=1.5)
    tp, records = next(iter(seen.items()))
    await session.write(ack({tp: records[-1].offset + 1}))
    more = await session.consume(1)
    assert 0 < sum(len(r) for r in more.values()) <= len(records)

    # Acknowledging what was never delivered is refused, and changes nothing.
    await session.write(ack({tp: 10_000}))
    notice = (await session.next("notice")).notice
    assert notice.error == ErrorCode.INVALID_REQUEST
    assert "never delivered" in notice.message
    await session.drop()


async def test_explicit_partitions_and_seeks(broker: broker_pb2_grpc.BrokerStub) -> None:
    session = Session(broker)
    await session.write(
        start("assigned", topics=[], partitions=[pb.SessionPartition(topic=TOPIC, partition=1)])
    )
    assignment = (await session.next("assignment")).assignment
    assert [(p.topic, p.partition) for p in assignment.partitions] == [(TOPIC, 1)]
    assert not assignment.member_id
    first = (await session.consume(1))[(TOPIC, 1)]
    await session.write(
        pb.ConsumerSessionRequest(seek=pb.SessionSeek(topic=TOPIC, partition=1, offset=0))
    )
    again = (await session.next("records")).records
    assert again.records[0].offset == 0 and again.records[0].value == first[0].value
    await session.write(
        pb.ConsumerSessionRequest(seek=pb.SessionSeek(topic=TOPIC, partition=3, offset=0))
    )
    assert (await session.next("notice")).notice.error == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    await session.write(ack({(TOPIC, 1): 1}, commit=True))
    (result,) = (await session.next("committed")).committed.partitions
    assert (result.partition, result.offset, result.error) == (1, 1, ErrorCode.NONE)
    await session.drop()


@pytest.mark.parametrize(
    ("first", "status", "words"),
    [
        (
            pb.ConsumerSessionRequest(commit=pb.SessionCommit()),
            grpc.StatusCode.INVALID_ARGUMENT,
            "must be `start`",
        ),
        (start(""), grpc.StatusCode.INVALID_ARGUMENT, "group_id is required"),
        (start("g", topics=[]), grpc.StatusCode.INVALID_ARGUMENT, "either topics"),
        (
            start("g", assignors=["fair"]),
            grpc.StatusCode.INVALID_ARGUMENT,
            "unknown partition assignor",
        ),
        (start("g", max_records=0), grpc.StatusCode.INVALID_ARGUMENT, "at least 1"),
        (start("g", auto_offset_reset=7), grpc.StatusCode.INVALID_ARGUMENT, "auto_offset_reset"),
        (
            start("g", topics=[], partitions=[pb.SessionPartition(topic=TOPIC, partition=9)]),
            grpc.StatusCode.INVALID_ARGUMENT,
            "does not exist",
        ),
    ],
)
async def test_a_session_that_cannot_start_ends_with_a_clear_status(
    broker: broker_pb2_grpc.BrokerStub,
    first: pb.ConsumerSessionRequest,
    status: grpc.StatusCode,
    words: str,
) -> None:
    call = broker.ConsumerSession()
    await call.write(first)
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await call.read()
    assert refused.value.code() == status
    assert words in (refused.value.details() or "")


async def test_the_acls_refuse_a_group_or_topic_the_caller_may_not_read(
    cluster: TwoBrokers, broker: broker_pb2_grpc.BrokerStub
) -> None:
    """With the ACL checks on, a session needs READ on its group and on each topic (this
    plaintext caller is User:ANONYMOUS); the refusal is PERMISSION_DENIED, naming which."""
    async with AdminClient(cluster.address) as admin:  # before the checks are on
        assert await admin.create_acls(
            [
                AclBinding(
                    ResourceType.GROUP,
                    "public-",
                    PatternType.PREFIXED,
                    "User:ANONYMOUS",
                    "*",
                    AclOperation.READ,
                    AclPermissionType.ALLOW,
                )
            ]
        ) == [None]
    before = auth.server_security()
    auth.configure(auth.ServerSecurity(authorizer="acl"))
    try:
        for group, words in (
            ("secret", "GROUP_AUTHORIZATION_FAILED: User:ANONYMOUS may not read group secret"),
            ("public-1", f"TOPIC_AUTHORIZATION_FAILED: User:ANONYMOUS may not read topic {TOPIC}"),
        ):
            call = broker.ConsumerSession()
            await call.write(start(group))
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await call.read()
            assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert words in (refused.value.details() or "")
    finally:
        auth.configure(before)


ANONYMOUS = "User:ANONYMOUS"
READER = "User:reader"


def allow(resource_type: ResourceType, name: str, operation: AclOperation) -> AclBinding:
    return AclBinding(
        resource_type, name, PatternType.LITERAL, READER, "*", operation, AclPermissionType.ALLOW
    )


@contextlib.asynccontextmanager
async def reading_allowed(
    cluster: TwoBrokers, group: str
) -> AsyncIterator[tuple[AclBinding, tuple[tuple[str, str], ...]]]:
    """The ACL checks on, the services' own calls (User:ANONYMOUS here) super users as in
    a deployment, and User:reader (a SASL session of this process) allowed to read
    ``group`` and the topic; yields the topic's READ and the reader's call metadata."""
    topic_read = allow(ResourceType.TOPIC, TOPIC, AclOperation.READ)
    granted = [allow(ResourceType.GROUP, group, AclOperation.READ), topic_read]
    async with AdminClient(cluster.address) as admin:
        assert await admin.create_acls(granted) == [None] * len(granted)
    before = auth.server_security()
    auth.configure(auth.ServerSecurity(authorizer="acl", super_users=frozenset({ANONYMOUS})))
    token = auth.authenticator().tokens.issue(READER, "SCRAM-SHA-256", time.time() + 120)
    try:
        yield topic_read, ((SESSION_METADATA_KEY, token),)
    finally:
        auth.configure(before)
        async with AdminClient(cluster.address) as admin:
            await admin.delete_acls([m.AclFilter(principal=READER)])


async def remove(cluster: TwoBrokers, acl: AclBinding) -> None:
    async with AdminClient(cluster.address) as admin:
        assert await admin.delete_acls(
            [m.AclFilter(resource_type=acl.resource_type, resource_name=acl.resource_name)]
        ) == [[acl]]


async def ended_refused(session: Session) -> str:
    """The details of the session's end, which must be PERMISSION_DENIED within 10 s."""
    ended, _ = await asyncio.wait({session.reader}, timeout=10)
    assert ended, "the session read on after its READ was removed"
    assert await session.call.code() == grpc.StatusCode.PERMISSION_DENIED
    return await session.call.details() or ""


async def test_a_session_ends_at_its_next_fetch_once_its_topic_read_is_removed(
    cluster: TwoBrokers, broker: broker_pb2_grpc.BrokerStub
) -> None:
    """Kafka checks every fetch, so a READ removed while a consumer reads fails its next
    poll: a session reading on the broker's behalf (its fetches are the broker's own, or
    from the other leader as the broker) ends PERMISSION_DENIED at its next round of
    fetches, naming the topic, rather than reading on under the broker's rights."""
    async with reading_allowed(cluster, "revoked") as (topic_read, reader):
        session = Session(broker, reader)
        try:
            await session.write(start("revoked"))
            await session.consume(RECORDS)
            await remove(cluster, topic_read)
            refusal = f"TOPIC_AUTHORIZATION_FAILED: {READER} may not read topic {TOPIC}"
            assert refusal in await ended_refused(session)
        finally:
            await session.drop()


async def test_hundreds_of_sessions_opened_and_dropped_leave_nothing_behind(
    cluster: TwoBrokers, broker: broker_pb2_grpc.BrokerStub
) -> None:
    sessions = cluster.embedded.broker.sessions
    baseline = len(asyncio.all_tasks())

    async def open_and_drop(i: int) -> None:
        session = Session(broker)
        await session.write(start(f"churn-{i % 20}", max_records=1))
        if i % 2:  # half are dropped at once, mid-join; the others once they have records
            await session.next("records", timeout=60)
        await session.drop()

    for wave in range(5):
        await asyncio.gather(*(open_and_drop(wave * 40 + i) for i in range(40)))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        quiet = not sessions.open_sessions and not sessions.ending_sessions
        if quiet and len(asyncio.all_tasks()) <= baseline:
            break
        await asyncio.sleep(0.1)
    assert (sessions.open_sessions, sessions.ending_sessions) == (0, 0)
    assert len(asyncio.all_tasks()) <= baseline, asyncio.all_tasks()
    for group in range(20):
        assert await members(cluster, f"churn-{group}") == 0


async def assignments(session: Session, seconds: float) -> list[pb.SessionAssignment]:
    """The assignments the session receives within ``seconds``."""
    seen = []
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        with contextlib.suppress(TimeoutError):
            event = await asyncio.wait_for(session.events.get(), left)
            assert event is not None, "the session ended"
            if event.WhichOneof("event") == "assignment":
                seen.append(event.assignment)
    return seen


async def test_members_holding_no_records_stay_in_the_group_past_max_poll_interval(
    cluster: TwoBrokers, broker: broker_pb2_grpc.BrokerStub
) -> None:
    """max.poll.interval.ms is about poll() calls, and a Kafka consumer with nothing
    assigned, or nothing fetched, still polls: sessions holding no records unacknowledged
    (one with the only partition and nothing to read, one with nothing assigned) are
    waiting for records, and the group stays as it is however long they wait."""
    topic = "sessions-single"
    await cluster.create_topic(topic, 1)
    first, second = Session(broker), Session(broker)
    await first.write(start("waiting", topics=[topic], max_poll_interval_ms=1000))
    assert (await first.next("assignment")).assignment.generation_id == 1
    await second.write(start("waiting", topics=[topic], max_poll_interval_ms=1000))
    held = []
    for session in (first, second):
        while True:
            event = (await session.next("assignment")).assignment
            if event.generation_id >= 2 and not event.revoked:
                held.append(len(event.partitions))
                break
    assert sorted(held) == [0, 1]
    assert await assignments(first, 2.5) == [] and await assignments(second, 0.1) == []
    assert await members(cluster, "waiting") == 2
    await first.drop()
    await second.drop()


async def test_a_session_taken_out_for_not_polling_rejoins_when_the_client_speaks(
    cluster: TwoBrokers, broker: broker_pb2_grpc.BrokerStub
) -> None:
    """Records held unacknowledged past max_poll_interval_ms without a word take the
    session out of the group; any word from the client brings it back (here an ack that
    frees credit the session was not short of)."""
    session = Session(broker)
    await session.write(start("slow", max_poll_interval_ms=1000))
    seen = await session.consume(RECORDS)
    deadline = time.monotonic() + 20
    while await members(cluster, "slow") != 0:
        assert time.monotonic() < deadline, "the silent session is still in the group"
        await asyncio.sleep(0.1)
    tp, records = next(iter(seen.items()))
    await session.write(ack({tp: len(records)}))
    lost = (await session.next("assignment", timeout=10)).assignment
    assert lost.lost
    back = (await session.next("assignment", timeout=10)).assignment
    assert len(back.partitions) == PARTITIONS and back.generation_id > lost.generation_id
    assert (await session.next("records", timeout=10)).records.records  # redelivered
    await session.drop()


async def test_a_session_whose_next_record_does_not_fit_its_bytes_waits_for_an_ack(
    cluster: TwoBrokers, broker: broker_pb2_grpc.BrokerStub, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With 61 of 100 bytes outstanding, the next 61-byte record does not fit: the session
    is out of credit (not fetched for, rather than fetching that record again and again)
    until an acknowledgement frees bytes. A record larger than the credit still comes when
    nothing is outstanding."""
    topic = "sessions-bytes"
    await cluster.create_topic(topic, 1)
    for value in (b"x" * 60, b"y" * 60, b"z" * 200):
        request = pb.ProduceRequest()
        request.topics.add(topic=topic).partitions.add(  # -1: placed, sent to the leader
            partition=-1, records=pb.PlainRecords(records=[pb.Record(key=b"k", value=value)])
        )
        assert (await broker.Produce(request)).topics[0].partitions[0].error == ErrorCode.NONE
    fetches = 0
    fetch_from = consumer_session._Session._fetch_from

    async def counted(self: consumer_session._Session, *args: object) -> object:
        nonlocal fetches
        fetches += 1
        return await fetch_from(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(consumer_session._Session, "_fetch_from", counted)
    session = Session(broker)
    await session.write(
        start(
            "bytes",
            topics=[],
            partitions=[pb.SessionPartition(topic=topic, partition=0)],
            max_bytes=100,
        )
    )
    first = (await session.next("records")).records.records
    assert [r.offset for r in first] == [0]
    before = fetches
    with pytest.raises(TimeoutError):
        await session.next("records", timeout=1.5)
    assert fetches - before <= 2  # (thousands when it spun)
    for offset in (1, 2):
        await session.write(ack({(topic, 0): offset}))
        assert [r.offset for r in (await session.next("records")).records.records] == [offset]
    await session.drop()


async def test_a_client_that_does_not_read_its_answers_is_not_read_either(
    cluster: TwoBrokers, broker: broker_pb2_grpc.BrokerStub
) -> None:
    """Each refused ack is answered by a notice; a client that writes and never reads
    has its requests left unread once MAX_UNWRITTEN_EVENTS answers wait, instead of the
    broker queuing answers without end. Once it reads, every answer comes, in order."""
    sessions = cluster.embedded.broker.sessions
    call: Call = broker.ConsumerSession()
    await call.write(
        start(
            "deaf",
            topics=[],
            partitions=[pb.SessionPartition(topic=TOPIC)],
            auto_offset_reset=pb.OFFSET_RESET_LATEST,
        )
    )
    assert (await call.read()).WhichOneof("event") == "assignment"
    (session,) = [s for s in sessions._sessions if s.start.group_id == "deaf"]
    refused = "n" * 8000  # a large notice each, so the transport's buffers fill soon
    total, written = 4000, 0

    async def write() -> None:
        nonlocal written
        for _ in range(total):
            await call.write(ack({(refused, 0): 1}))
            written += 1

    writer = asyncio.create_task(write())
    most, progress = 0, (-1, time.monotonic())
    while not writer.done():
        most = max(most, session._out.qsize())
        if written != progress[0]:
            progress = (written, time.monotonic())
        elif time.monotonic() - progress[1] > 1:
            break  # held back
        await asyncio.sleep(0.005)
    assert most <= consumer_session.MAX_UNWRITTEN_EVENTS
    for _ in range(total):
        event = await asyncio.wait_for(call.read(), 10)
        assert event.notice.error == ErrorCode.INVALID_REQUEST
    await asyncio.wait_for(writer, 10)
    assert session._out.qsize() == 0
    call.cancel()


async def test_a_client_that_ends_its_requests_commits_what_it_acknowledged(
    cluster: TwoBrokers, broker: broker_pb2_grpc.BrokerStub
) -> None:
    """As Kafka's close() with auto-commit on: the acknowledged positions are committed
    before the stream ends, and the next owner starts after them."""
    session = Session(broker)
    await session.write(start("closing"))
    seen = await session.consume(RECORDS)
    acked = {tp: len(records) - 1 for tp, records in seen.items()}
    await session.write(ack(acked))
    await session.call.done_writing()
    await session.reader
    assert await session.call.code() == grpc.StatusCode.OK
    assert await committed(cluster, "closing") == {tp[1]: o for tp, o in acked.items()}
