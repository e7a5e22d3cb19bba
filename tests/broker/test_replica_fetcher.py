"""The replica fetcher, driven without gRPC: a follower's real partitions and logs, fetching
from a fake transport whose answers come from a real leader log (as a leader's
``read_for_follower`` would: records past the high watermark, or the diverging epoch).

Covered: appends and the follower's high watermark, truncation to a diverging epoch,
backing off after failed fetches and error answers, answers from a leader that is no
longer the partition's dropped, and a leader change moving the partition to another
leader's fetcher. The follower's high watermark never moves back when a new leader's
lags (the rule of docs/broker.md; Kafka's follower would take the lower value).
"""

from __future__ import annotations

import asyncio
import errno
import os
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

import highwater.storage.segment as segment_module
import pytest
from highwater.broker.partitions import Partition, PartitionManager
from highwater.broker.replica_fetcher import (
    FetchRound,
    ReplicaFetcher,
    ReplicaFetcherManager,
    ReplicaFetchError,
)
from highwater.broker.replication import find_diverging_epoch
from highwater.broker.settings import BrokerSettings
from highwater.internal.v1 import replication_pb2 as rpb
from highwater.metadata import (
    BrokerEndpoint,
    MetadataRecord,
    PartitionChangeRecord,
    PartitionRecord,
    RegisterBrokerRecord,
    TopicRecord,
    UnfenceBrokerRecord,
    replay,
)
from highwater.records import SimpleRecord, build_batch
from highwater.storage.log import PartitionLog
from highwater.storage.log_manager import LogManager
from highwater.storage.topic_partition import TopicPartition
from highwater.v1.common_pb2 import ErrorCode

TOPIC = "orders"
TOPIC_ID = "orders-topic-id-000000"
TP = TopicPartition(TOPIC, 0)
FOLLOWER = 2
BROKER_EPOCH = 7
SETTINGS = BrokerSettings(replica_fetch_backoff_ms=250, replica_fetch_max_wait_ms=10)


def address(broker_id: int) -> str:
    return f"b{broker_id}:9092"


def cluster(leader: int) -> list[MetadataRecord]:
    """Brokers 1, 2, 3; ``orders`` with one partition on all three, led by ``leader``."""
    records: list[MetadataRecord] = []
    for broker_id in (1, 2, 3):
        epoch = BROKER_EPOCH if broker_id == FOLLOWER else broker_id
        endpoint = BrokerEndpoint("PLAINTEXT", f"b{broker_id}", 9092)
        records.append(RegisterBrokerRecord(broker_id, f"inc-{broker_id}", epoch, (endpoint,)))
        records.append(UnfenceBrokerRecord(broker_id, epoch))
    records.append(TopicRecord(TOPIC, TOPIC_ID))
    records.append(PartitionRecord(TOPIC_ID, 0, (1, 2, 3), (1, 2, 3), leader))
    return records


def batch(values: list[bytes]) -> bytes:
    return build_batch([SimpleRecord(key=None, value=v, timestamp=1_000) for v in values])


@dataclass
class FakeLeader:
    """A leader's answers to a follower's fetches, from a real log: records from the fetch
    offset (past the high watermark too) or, where the follower's last epoch ends earlier
    here, the diverging epoch (KIP-320). ``fail`` makes the next fetches fail; ``error``
    answers the partition with that code; ``empty`` answers the next fetches with no
    partition (an incremental fetch's long poll that ended with nothing new); ``on_fetch``
    runs as each fetch arrives."""

    log: PartitionLog
    high_watermark: int = 0
    requests: list[rpb.ReplicaFetchRequest] = field(default_factory=list)
    fail: int = 0
    error: int = ErrorCode.NONE
    empty: int = 0
    on_fetch: Callable[[], None] | None = None
    closed: int = 0

    async def fetch(
        self, request: rpb.ReplicaFetchRequest, timeout_s: float
    ) -> rpb.ReplicaFetchResponse:
        await asyncio.sleep(0)  # a network round trip lets the loop run
        self.requests.append(request)
        if self.on_fetch is not None:
            self.on_fetch()
        if self.fail:
            self.fail -= 1
            raise ReplicaFetchError("the leader is unreachable")
        response = rpb.ReplicaFetchResponse()
        if self.empty:
            self.empty -= 1
            return response
        for topic in request.topics:
            answers = response.topics.add(topic=topic.topic)
            for item in topic.partitions:
                answer = answers.partitions.add(partition=item.partition)
                if self.error != ErrorCode.NONE:
                    answer.error = self.error  # type: ignore[assignment]
                    answer.high_watermark = answer.log_start_offset = -1
                    continue
                answer.high_watermark = self.high_watermark
                answer.log_start_offset = self.log.log_start_offset
                diverging = find_diverging_epoch(
                    item.fetch_offset, item.last_fetched_epoch, self.log.latest_epoch_end_offset
                )
                if diverging is not None:
                    answer.diverging_epoch.epoch = diverging.epoch
                    answer.diverging_epoch.end_offset = diverging.end_offset
                    continue
                answer.records = self.log.read(item.fetch_offset, 1 << 20).records
        return response

    async def close(self) -> None:
        self.closed += 1


@dataclass
class Follower:
    """Broker 2's partitions over a real data directory, and the leaders it can reach."""

    partitions: PartitionManager
    leaders: dict[str, FakeLeader]
    sleeps: list[float] = field(default_factory=list)
    connected: list[str] = field(default_factory=list)
    changes: int = 0

    @property
    def partition(self) -> Partition:
        return self.partitions.get(TOPIC, 0)

    def connect(self, to: str) -> FakeLeader:
        self.connected.append(to)
        return self.leaders[to]

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)

    def on_change(self) -> None:
        self.changes += 1

    def fetcher(self, leader_id: int) -> ReplicaFetcher:
        return ReplicaFetcher(
            leader_id,
            partitions=self.partitions,
            replica_id=FOLLOWER,
            broker_epoch=lambda: BROKER_EPOCH,
            settings=SETTINGS,
            connect=self.connect,
            on_change=self.on_change,
            sleep=self.sleep,
        )

    def change_leader(self, leader: int) -> None:
        image = self.partitions.image
        change = PartitionChangeRecord(TOPIC_ID, 0, leader=leader)
        self.partitions.apply_image(replay([change], image.offset + 1, image=image))


def open_log(tmp_path: Path, name: str) -> tuple[LogManager, PartitionLog]:
    manager = LogManager(tmp_path / name)
    manager.startup(node_id=1)
    return manager, manager.get_or_create_log(TP)


@pytest.fixture
async def setup(tmp_path: Path) -> AsyncIterator[tuple[Follower, FakeLeader, FakeLeader]]:
    managers = []
    leader_logs = []
    for name in ("leader1", "leader3"):
        manager, leader_log = open_log(tmp_path, name)
        managers.append(manager)
        leader_logs.append(leader_log)
    follower_logs = LogManager(tmp_path / "follower")
    follower_logs.startup(node_id=FOLLOWER)
    managers.append(follower_logs)
    partitions = PartitionManager(FOLLOWER, follower_logs)
    one, three = FakeLeader(leader_logs[0]), FakeLeader(leader_logs[1])
    follower = Follower(partitions, {address(1): one, address(3): three})
    yield follower, one, three
    for manager in managers:
        manager.shutdown()


def follow(follower: Follower, leader: int, *, offset: int = 10) -> None:
    follower.partitions.apply_image(replay(cluster(leader), offset))
    assert follower.partition.follower_state is not None


def epochs_of(partition_log: PartitionLog) -> list[tuple[int, int]]:
    """(base offset, leader epoch) of each batch."""
    return [(h.base_offset, h.partition_leader_epoch) for _, _, h in partition_log.iter_batches()]


async def test_a_fetch_appends_the_leaders_records_and_takes_its_high_watermark(
    setup: tuple[Follower, FakeLeader, FakeLeader],
) -> None:
    follower, one, _ = setup
    follow(follower, leader=1)
    one.log.append_as_leader(batch([b"a", b"b"]), 0)
    one.log.append_as_leader(batch([b"c"]), 0)
    one.high_watermark = 2
    fetcher = follower.fetcher(1)

    assert await fetcher.fetch_round() is FetchRound.FETCHED
    (request,) = one.requests
    assert (request.replica_id, request.replica_epoch) == (FOLLOWER, BROKER_EPOCH)
    item = request.topics[0].partitions[0]
    assert (item.fetch_offset, item.last_fetched_epoch, item.current_leader_epoch) == (0, -1, 0)
    partition = follower.partition
    assert partition.log_end_offset == 3
    assert partition.high_watermark == 2  # the leader's: records past it are not committed
    assert epochs_of(partition.log) == epochs_of(one.log)
    assert follower.connected == [address(1)]
    assert follower.changes == 1

    one.high_watermark = 3
    assert await fetcher.fetch_round() is FetchRound.FETCHED
    item = one.requests[1].topics[0].partitions[0]
    assert (item.fetch_offset, item.last_fetched_epoch) == (3, 0)
    assert (partition.log_end_offset, partition.high_watermark) == (3, 3)
    assert follower.connected == [address(1)]  # the same transport


async def test_a_diverging_epoch_truncates_the_follower_then_it_fetches_the_leaders_records(
    setup: tuple[Follower, FakeLeader, FakeLeader],
) -> None:
    follower, _, three = setup
    # The follower led epoch 0 and wrote 0..4; the new leader has 0..2 of epoch 0, then
    # its own 3..5 of epoch 1 (the seed's second story).
    own = follower.partitions.log_manager.get_or_create_log(TP)
    own.append_as_leader(batch([b"a", b"b", b"c"]), 0)
    own.append_as_leader(batch([b"x", b"y"]), 0)
    three.log.append_as_leader(batch([b"a", b"b", b"c"]), 0)
    three.log.append_as_leader(batch([b"p", b"q", b"r"]), 1)
    three.high_watermark = 3
    follow(follower, leader=3)
    partition = follower.partition
    assert partition.log_end_offset == 5
    fetcher = follower.fetcher(3)

    assert await fetcher.fetch_round() is FetchRound.FETCHED
    assert partition.log_end_offset == 3  # truncated to where epoch 0 ends on the leader
    assert partition.high_watermark <= 3

    assert await fetcher.fetch_round() is FetchRound.FETCHED
    item = three.requests[1].topics[0].partitions[0]
    assert (item.fetch_offset, item.last_fetched_epoch) == (3, 0)
    assert partition.log_end_offset == 6
    assert epochs_of(partition.log) == [(0, 0), (3, 1)]
    assert partition.log.read(0, 1 << 20).records == three.log.read(0, 1 << 20).records
    assert partition.high_watermark == 3


async def test_failed_fetches_and_error_answers_back_off(
    setup: tuple[Follower, FakeLeader, FakeLeader],
) -> None:
    follower, one, _ = setup
    follow(follower, leader=1)
    one.log.append_as_leader(batch([b"a"]), 0)
    one.high_watermark = 1
    fetcher = follower.fetcher(1)

    one.fail = 1
    assert await fetcher.fetch_round() is FetchRound.BACK_OFF
    one.error = ErrorCode.NOT_LEADER_OR_FOLLOWER
    assert await fetcher.fetch_round() is FetchRound.BACK_OFF
    assert follower.partition.log_end_offset == 0  # an error answer changes nothing

    # ``run`` sleeps replica.fetch.backoff.ms after each failure, then fetches on; it ends
    # once the partition follows another leader (here during the second failure),
    # closing its transport.
    one.fail, one.error = 2, ErrorCode.NONE
    one.on_fetch = lambda: follower.change_leader(3) if len(one.requests) == 4 else None
    await asyncio.wait_for(fetcher.run(), 5)
    assert follower.sleeps == [SETTINGS.replica_fetch_backoff_ms / 1000] * 2
    assert len(one.requests) == 4
    assert one.closed == 1
    assert follower.partition.log_end_offset == 0


async def test_an_answer_with_nothing_new_is_followed_by_the_next_fetch_at_once(
    setup: tuple[Follower, FakeLeader, FakeLeader],
) -> None:
    # The leader held the fetch for its long poll and had nothing to say: a back-off here
    # would hold the records produced meanwhile by replica.fetch.backoff.ms.
    follower, one, _ = setup
    follow(follower, leader=1)
    fetcher = follower.fetcher(1)
    one.empty = 1
    assert await fetcher.fetch_round() is FetchRound.FETCHED

    # In ``run``: two empty answers, one with the record, then the partition follows
    # another leader while the fourth fetch is under way (its stale answer is the one
    # back-off), and the fetcher ends.
    one.empty = 2
    one.log.append_as_leader(batch([b"a"]), 0)
    one.high_watermark = 1
    one.on_fetch = lambda: follower.change_leader(3) if len(one.requests) == 5 else None
    await asyncio.wait_for(fetcher.run(), 5)
    assert len(one.requests) == 5
    assert follower.partition.log_end_offset == 1
    assert follower.sleeps == [SETTINGS.replica_fetch_backoff_ms / 1000]


async def test_an_answer_from_a_leader_no_longer_followed_is_dropped(
    setup: tuple[Follower, FakeLeader, FakeLeader],
) -> None:
    follower, one, _ = setup
    follow(follower, leader=1)
    one.log.append_as_leader(batch([b"a", b"b"]), 0)
    one.high_watermark = 2
    one.on_fetch = lambda: follower.change_leader(3)  # while the fetch is under way
    fetcher = follower.fetcher(1)

    assert await fetcher.fetch_round() is FetchRound.BACK_OFF
    partition = follower.partition
    assert (partition.log_end_offset, partition.high_watermark) == (0, 0)
    assert partition.leader_epoch == 1
    assert await fetcher.fetch_round() is FetchRound.IDLE


async def test_a_leader_change_moves_the_partition_to_the_new_leaders_fetcher(
    setup: tuple[Follower, FakeLeader, FakeLeader],
) -> None:
    follower, one, three = setup
    follow(follower, leader=1)
    for log_ in (one.log, three.log):
        log_.append_as_leader(batch([b"a", b"b"]), 0)
    one.high_watermark = 2
    three.log.append_as_leader(batch([b"c"]), 1)
    three.high_watermark = 3
    manager = ReplicaFetcherManager(
        follower.partitions,
        replica_id=FOLLOWER,
        broker_epoch=lambda: BROKER_EPOCH,
        settings=SETTINGS,
        connect=follower.connect,
    )
    try:
        manager.ensure_fetchers()
        assert manager.leaders == {1}
        async with asyncio.timeout(5):
            while follower.partition.log_end_offset < 2:
                await asyncio.sleep(0.01)
        follower.change_leader(3)
        manager.ensure_fetchers()
        async with asyncio.timeout(5):
            while follower.partition.log_end_offset < 3 or 1 in manager.leaders:
                await asyncio.sleep(0.01)
        assert manager.leaders == {3}
        assert follower.connected[-1] == address(3)
        assert follower.partition.high_watermark == 3
        assert epochs_of(follower.partition.log) == [(0, 0), (2, 1)]
        assert one.closed == 1
        # the new leader was asked in its epoch, from where the old one left off
        first = three.requests[0].topics[0].partitions[0]
        assert (first.current_leader_epoch, first.fetch_offset) == (1, 2)
    finally:
        await manager.close()
    assert manager.leaders == frozenset()


async def test_the_followers_high_watermark_does_not_go_back_when_a_new_leaders_lags(
    setup: tuple[Follower, FakeLeader, FakeLeader],
) -> None:
    """Leader 1 committed 0..4 (HW 5) and the follower has it all; leader 3, elected
    from the ISR, has every record but has not learned the HW yet (3). The follower's HW
    stays 5: every offset below it was committed, and committed records survive a clean
    election. Only a truncation lowers it."""
    follower, one, three = setup
    follow(follower, leader=1)
    for log_ in (one.log, three.log):
        log_.append_as_leader(batch([b"a", b"b", b"c", b"d", b"e"]), 0)
    one.high_watermark = 5
    assert await follower.fetcher(1).fetch_round() is FetchRound.FETCHED
    partition = follower.partition
    assert (partition.log_end_offset, partition.high_watermark) == (5, 5)

    follower.change_leader(3)
    three.high_watermark = 3
    assert await follower.fetcher(3).fetch_round() is FetchRound.FETCHED
    assert partition.log_end_offset == 5
    assert partition.high_watermark == 5
    assert partition.log.high_watermark == 5

    three.high_watermark = 6  # (a leader's HW past the follower's LEO is capped by it)
    assert await follower.fetcher(3).fetch_round() is FetchRound.FETCHED
    assert partition.high_watermark == 5


async def test_a_follower_whose_append_failed_on_a_full_disk_names_the_new_epoch_after(
    setup: tuple[Follower, FakeLeader, FakeLeader], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seeds 100, 104 and 128 of the whole-cluster simulation (docs/simulation.md): the
    follower's append of leader 1's first epoch-2 batch fails on a full disk after the
    log recorded epoch 2's start; an ISR change then makes the partition forget that
    empty epoch. Once the disk has room the batch appends, and the next fetch must name
    epoch 2: naming epoch 0 (the log's stale idea of its latest epoch kept the append
    from recording epoch 2 again), the leader answers that epoch 0 ends at 2, and the
    follower cuts the committed batch it holds."""
    follower, one, _ = setup
    follow(follower, leader=1)
    one.log.append_as_leader(batch([b"a", b"b"]), 0)
    one.high_watermark = 2
    fetcher = follower.fetcher(1)
    assert await fetcher.fetch_round() is FetchRound.FETCHED
    one.log.append_as_leader(batch([b"c"]), 2)
    one.high_watermark = 3
    partition = follower.partition

    def disk_full(fd: int, pieces: list[bytes], total: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with monkeypatch.context() as patched:
        patched.setattr(segment_module, "_write_fully", disk_full)
        assert await fetcher.fetch_round() is FetchRound.FETCHED
    assert partition.log_end_offset == 2  # nothing was appended
    image = follower.partitions.image
    shrink = PartitionChangeRecord(TOPIC_ID, 0, isr=(1, 2))
    follower.partitions.apply_image(replay([shrink], image.offset + 1, image=image))

    assert await fetcher.fetch_round() is FetchRound.FETCHED
    assert partition.log_end_offset == 3 and partition.last_fetched_epoch == 2
    assert await fetcher.fetch_round() is FetchRound.FETCHED
    item = one.requests[-1].topics[0].partitions[0]
    assert (item.fetch_offset, item.last_fetched_epoch) == (3, 2)
    assert partition.log_end_offset == 3  # no diverging epoch: nothing cut
    assert epochs_of(partition.log) == [(0, 0), (2, 2)]
