"""Fetch sessions between brokers (KIP-227), in one process: a follower's real
:class:`~highwater.broker.replica_fetcher.ReplicaFetcher` against a leader's real
:class:`~highwater.broker.request_handler.RequestHandler` (its ``replica_fetch``, the
``ReplicaFetch`` stream's body), over a transport that calls it directly.

Covered: the first fetch is full and opens the session; idle rounds name no partition and
read none on the leader; an append is answered for its partition alone, and wakes a
parked fetch; a leader change forgets the partition; a session the leader lost makes the
follower fetch in full again; partitions the answer's byte budget left out come next; the
follower's skipped fetches keep it caught up across a quiet spell longer than
``replica.lag.time.max.ms``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from highwater.broker.partitions import Partition, PartitionManager
from highwater.broker.purgatory import Purgatory
from highwater.broker.replica_fetcher import FetchRound, ReplicaFetcher
from highwater.broker.replication import AlterPartitionProposal, IsrChange
from highwater.broker.request_handler import RequestHandler
from highwater.broker.settings import BrokerSettings
from highwater.broker.telemetry import BrokerTelemetry
from highwater.controller_api.client import ControllerClient
from highwater.internal.v1 import replication_pb2 as rpb
from highwater.metadata import (
    BrokerEndpoint,
    FenceBrokerRecord,
    MetadataImage,
    MetadataRecord,
    PartitionChangeRecord,
    PartitionRecord,
    RegisterBrokerRecord,
    TopicRecord,
    UnfenceBrokerRecord,
    replay,
)
from highwater.records import SimpleRecord, build_batch
from highwater.storage.log_manager import LogManager
from highwater.v1 import broker_pb2 as pb

pytestmark = pytest.mark.timeout(30)

TOPIC = "orders"
TOPIC_ID = "orders-topic-id-000000"
PARTITIONS = 4
LEADER, FOLLOWER, OTHER = 1, 2, 3
FOLLOWER_EPOCH = 7
LAG_MS = 30_000
SETTINGS = BrokerSettings(replica_fetch_max_wait_ms=0, replica_lag_time_max_ms=LAG_MS)


def image() -> MetadataImage:
    records: list[MetadataRecord] = []
    for broker_id in (LEADER, FOLLOWER, OTHER):
        epoch = FOLLOWER_EPOCH if broker_id == FOLLOWER else broker_id
        endpoint = BrokerEndpoint("PLAINTEXT", f"b{broker_id}", 9092)
        records.append(RegisterBrokerRecord(broker_id, f"inc-{broker_id}", epoch, (endpoint,)))
        records.append(UnfenceBrokerRecord(broker_id, epoch))
    records.append(TopicRecord(TOPIC, TOPIC_ID))
    for index in range(PARTITIONS):
        records.append(
            PartitionRecord(TOPIC_ID, index, (LEADER, FOLLOWER), (LEADER, FOLLOWER), LEADER)
        )
    return replay(records, 10)


@dataclass
class Clock:
    now_ms: int = 1_000_000

    def __call__(self) -> int:
        return self.now_ms


@dataclass
class Leader:
    """The leader's request handling, called in place of its ``ReplicaFetch`` stream."""

    handler: RequestHandler
    requests: list[rpb.ReplicaFetchRequest] = field(default_factory=list)
    answers: list[rpb.ReplicaFetchResponse] = field(default_factory=list)

    async def fetch(
        self, request: rpb.ReplicaFetchRequest, timeout_s: float
    ) -> rpb.ReplicaFetchResponse:
        self.requests.append(request)
        answer = await self.handler.replica_fetch(request)
        self.answers.append(answer)
        return answer

    async def close(self) -> None:
        pass


@dataclass
class Brokers:
    leader: Leader
    leader_partitions: PartitionManager
    follower_partitions: PartitionManager
    fetcher: ReplicaFetcher
    clock: Clock
    reads: list[int]
    """Partitions the leader read for followers, in order."""
    proposals: list[tuple[int, AlterPartitionProposal]]
    """The ISR changes the leader proposed, by partition."""

    async def append(self, index: int, *values: bytes) -> None:
        batch = build_batch([SimpleRecord(key=None, value=v, timestamp=1_000) for v in values])
        request = pb.ProduceRequest(acks=1)
        request.topics.add(topic=TOPIC).partitions.add(partition=index, record_batches=batch)
        answer = await self.leader.handler.produce(request)
        assert answer.topics[0].partitions[0].error == 0, answer

    def follower(self, index: int) -> Partition:
        return self.follower_partitions.get(TOPIC, index)

    def named(self) -> list[int]:
        """The partitions the last fetch named."""
        return [p.partition for t in self.leader.requests[-1].topics for p in t.partitions]

    def answered(self) -> list[int]:
        return [p.partition for t in self.leader.answers[-1].topics for p in t.partitions]


@pytest.fixture
async def brokers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Brokers]:
    clock = Clock()
    proposals: list[tuple[int, AlterPartitionProposal]] = []
    managers = []
    partition_managers = []
    for node in (LEADER, FOLLOWER):
        logs = LogManager(tmp_path / f"broker-{node}")
        logs.startup(node_id=node)
        managers.append(logs)
        partitions = PartitionManager(node, logs, clock=clock, replica_lag_time_max_ms=LAG_MS)
        partitions.apply_image(image())
        partition_managers.append(partitions)
    leader_partitions, follower_partitions = partition_managers
    handler = RequestHandler(
        node_id=LEADER,
        settings=SETTINGS,
        partitions=leader_partitions,
        purgatory=Purgatory(),
        telemetry=BrokerTelemetry(leader_partitions),
        controller=ControllerClient(["127.0.0.1:1"]),
        broker_epoch=lambda: 1,
        propose=lambda partition, proposal: proposals.append(
            (partition.topic_partition.partition, proposal)
        ),
    )
    leader_partitions.on_change = handler.replica_sessions.partition_changed
    reads: list[int] = []
    read_for_follower = Partition.read_for_follower

    def counted(self: Partition, *args: object, **kwargs: object) -> object:
        reads.append(self.topic_partition.partition)
        return read_for_follower(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Partition, "read_for_follower", counted)
    leader = Leader(handler)
    fetcher = ReplicaFetcher(
        LEADER,
        partitions=follower_partitions,
        replica_id=FOLLOWER,
        broker_epoch=lambda: FOLLOWER_EPOCH,
        settings=SETTINGS,
        connect=lambda address: leader,
    )
    yield Brokers(leader, leader_partitions, follower_partitions, fetcher, clock, reads, proposals)
    await handler.controller.close()
    for logs in managers:
        logs.shutdown()


async def test_idle_rounds_name_and_read_nothing_and_an_append_is_answered_alone(
    brokers: Brokers,
) -> None:
    assert await brokers.fetcher.fetch_round() is FetchRound.FETCHED
    first = brokers.leader.requests[0]
    assert first.HasField("session_epoch") and first.session_epoch == 0
    assert sorted(brokers.named()) == list(range(PARTITIONS))
    session_id = brokers.leader.answers[0].session_id
    assert session_id > 0
    assert sorted(brokers.reads) == list(range(PARTITIONS))

    brokers.reads.clear()
    for epoch in (1, 2):
        # Nothing new: an empty answer, and the next fetch goes at once (no back-off).
        assert await brokers.fetcher.fetch_round() is FetchRound.FETCHED
        request = brokers.leader.requests[-1]
        assert (request.session_id, request.session_epoch) == (session_id, epoch)
        assert brokers.named() == [] and brokers.answered() == []
    assert brokers.reads == []  # the leader read no partition either

    await brokers.append(2, b"a", b"b")
    await brokers.fetcher.fetch_round()
    assert brokers.named() == [] and brokers.answered() == [2]
    assert brokers.reads == [2]
    assert brokers.follower(2).log_end_offset == 2
    # The follower's new offset is named next; the leader's high watermark moves to it and
    # the follower is told.
    await brokers.fetcher.fetch_round()
    assert brokers.named() == [2] and brokers.answered() == [2]
    assert brokers.follower(2).high_watermark == 2
    await brokers.fetcher.fetch_round()
    assert brokers.named() == [] and brokers.answered() == []


async def test_a_parked_fetch_is_woken_by_an_append_to_one_of_its_partitions(
    brokers: Brokers,
) -> None:
    await brokers.fetcher.fetch_round()
    session_id = brokers.leader.answers[0].session_id
    parked = asyncio.create_task(
        brokers.leader.handler.replica_fetch(
            rpb.ReplicaFetchRequest(
                replica_id=FOLLOWER,
                replica_epoch=FOLLOWER_EPOCH,
                max_wait_ms=20_000,
                min_bytes=1,
                session_id=session_id,
                session_epoch=1,
            )
        )
    )
    await asyncio.sleep(0.05)
    assert not parked.done()
    brokers.reads.clear()
    await brokers.append(1, b"x")
    answer = await asyncio.wait_for(parked, 5)
    assert [p.partition for t in answer.topics for p in t.partitions] == [1]
    assert brokers.reads == [1]


async def test_a_high_watermark_moved_by_another_fetch_does_not_wake_a_parked_fetch(
    brokers: Brokers,
) -> None:
    """A follower's fetch is answered early for records, not for a high watermark another
    follower's fetch moved: that is read with the session's next read (here, the long
    poll's end) and the answer carries it."""
    await brokers.fetcher.fetch_round()
    sessions = brokers.leader.handler.replica_sessions
    session_id = brokers.leader.answers[0].session_id
    session = sessions.cache.get(session_id)
    assert session is not None
    parked = asyncio.create_task(sessions.wait(session, 0.3))
    await asyncio.sleep(0.02)
    sessions.high_watermark_moved((TOPIC, 1), except_session=session_id + 1)
    await asyncio.sleep(0.05)
    assert not parked.done()  # no wake-up
    sessions.partition_changed(brokers.leader_partitions.get(TOPIC, 1).topic_partition)
    await asyncio.wait_for(parked, 1)  # an append's mark wakes it

    await brokers.fetcher.fetch_round()
    brokers.reads.clear()
    sessions.high_watermark_moved((TOPIC, 3), except_session=session_id + 1)
    request = rpb.ReplicaFetchRequest(
        replica_id=FOLLOWER,
        replica_epoch=FOLLOWER_EPOCH,
        max_wait_ms=100,
        min_bytes=1,
        session_id=session_id,
        session_epoch=2,
    )
    answer = await brokers.leader.handler.replica_fetch(request)
    assert brokers.reads == [3]  # read once, with the fetch, and not answered (nothing new)
    assert [p.partition for t in answer.topics for p in t.partitions] == []


async def test_a_leader_change_forgets_the_partition(brokers: Brokers) -> None:
    await brokers.fetcher.fetch_round()
    change = PartitionChangeRecord(TOPIC_ID, 3, leader=FOLLOWER)
    brokers.follower_partitions.apply_image(replay([change], 11, image=image()))
    await brokers.fetcher.fetch_round()
    request = brokers.leader.requests[-1]
    assert [(t.topic, list(t.partitions)) for t in request.forgotten_topics] == [(TOPIC, [3])]
    session = brokers.leader.handler.replica_sessions.cache.get(request.session_id)
    assert session is not None and (TOPIC, 3) not in session.partitions


async def test_a_lost_session_falls_back_to_a_full_fetch(brokers: Brokers) -> None:
    await brokers.fetcher.fetch_round()
    sessions = brokers.leader.handler.replica_sessions.cache
    sessions.resolve(brokers.leader.answers[0].session_id, -1, [], owner=FOLLOWER)  # closed
    await brokers.fetcher.fetch_round()
    assert brokers.leader.answers[-1].error == 70  # FETCH_SESSION_ID_NOT_FOUND
    await brokers.append(0, b"late")
    await brokers.fetcher.fetch_round()
    request = brokers.leader.requests[-1]
    assert (request.session_id, request.session_epoch) == (0, 0)
    assert sorted(brokers.named()) == list(range(PARTITIONS))
    assert brokers.leader.answers[-1].session_id > 0
    assert brokers.follower(0).log_end_offset == 1


async def test_partitions_left_out_by_the_byte_budget_come_next(brokers: Brokers) -> None:
    await brokers.fetcher.fetch_round()
    for index in range(PARTITIONS):
        await brokers.append(index, b"v" * 300)
    session_id = brokers.leader.answers[0].session_id

    def fetch(epoch: int) -> rpb.ReplicaFetchRequest:
        return rpb.ReplicaFetchRequest(
            replica_id=FOLLOWER,
            replica_epoch=FOLLOWER_EPOCH,
            min_bytes=1,
            max_bytes=100,  # one batch at least: the first partition read fills it
            session_id=session_id,
            session_epoch=epoch,
        )

    answered: set[int] = set()
    for epoch in range(1, PARTITIONS + 1):
        answer = await brokers.leader.handler.replica_fetch(fetch(epoch))
        with_records = [p.partition for t in answer.topics for p in t.partitions if p.records]
        assert len(with_records) == 1
        answered.update(with_records)
    assert answered == set(range(PARTITIONS))


async def test_skipped_fetches_keep_a_quiet_follower_caught_up(brokers: Brokers) -> None:
    await brokers.fetcher.fetch_round()
    leader = brokers.leader_partitions.get(TOPIC, 0)
    assert leader.leader_state is not None
    # Quiet for longer than replica.lag.time.max.ms; the follower's rounds go on, naming
    # nothing (partition 0's last fetch that named it was the first).
    for _ in range(3):
        brokers.clock.now_ms += LAG_MS // 2
        await brokers.fetcher.fetch_round()
    await brokers.append(0, b"after a quiet spell")
    # Kafka's follower fetched partition 0 at each round; so, in effect, did this one.
    assert leader.leader_state.out_of_sync_replicas(brokers.clock.now_ms) == frozenset()
    # A follower that stopped fetching is out of sync after the lag time as before.
    brokers.clock.now_ms += LAG_MS + 1
    await brokers.append(0, b"nobody fetched")
    assert leader.leader_state.out_of_sync_replicas(brokers.clock.now_ms) == {FOLLOWER}


async def test_a_caught_up_follower_that_becomes_eligible_is_proposed_into_the_isr(
    brokers: Brokers,
) -> None:
    """It fetches nothing new, so only its session's read of the partition, made when the
    leader learns it is eligible, can propose it (Kafka's leader reads every partition of
    every fetch)."""
    await brokers.fetcher.fetch_round()
    fenced = replay(
        [FenceBrokerRecord(FOLLOWER, FOLLOWER_EPOCH), PartitionChangeRecord(TOPIC_ID, 0, isr=(1,))],
        11,
        image=image(),
    )
    brokers.leader_partitions.apply_image(fenced)
    for _ in range(3):
        await brokers.fetcher.fetch_round()
    assert brokers.proposals == []  # caught up, but fenced: not eligible
    brokers.reads.clear()
    unfenced = replay([UnfenceBrokerRecord(FOLLOWER, FOLLOWER_EPOCH)], 12, image=fenced)
    brokers.leader_partitions.apply_image(unfenced)
    await brokers.fetcher.fetch_round()
    assert 0 in brokers.reads
    assert [(index, p.change, p.new_isr) for index, p in brokers.proposals] == [
        (0, IsrChange.EXPAND, (LEADER, FOLLOWER))
    ]
