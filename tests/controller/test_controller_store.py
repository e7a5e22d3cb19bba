"""``RaftMetadataStore`` and ``MetadataStateMachine`` over a scripted Raft log.

The fake log assigns offsets as Raft does (control batches take offsets too), and commits
when the test says so, handing the committed data batches to the state machine.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

import pytest
from highwater.controller import NotControllerError
from highwater.controller.service import RaftMetadataStore
from highwater.errors import UnexpectedAppendOffsetError
from highwater.metadata import (
    ConfigRecord,
    ConfigResource,
    ConfigResourceType,
    MetadataImage,
    MetadataRecord,
    MetadataReplayError,
    NoOpRecord,
    PartitionRecord,
    RegisterBrokerRecord,
    TopicRecord,
    encode_record,
    replay,
)
from highwater.metadata.delta import MetadataDelta
from highwater.metadata.snapshot import snapshot_values
from highwater.metadata.state_machine import MetadataStateMachine, decode_snapshot, encode_snapshot
from highwater.raft.messages import OffsetAndEpoch
from highwater.raft.node import NotLeaderError
from highwater.raft.state_machine import SnapshotReader
from highwater.records import RecordBatch, SimpleRecord, build_batch, iter_batches


@dataclass
class _Entry:
    batch: RecordBatch
    control: bool
    future: asyncio.Future[int] | None
    voters: bool = False
    """A dynamic quorum's ``voters`` record, which the leader's Raft layer appends itself."""


class FakeRaft:
    """The store's view of ``RaftServer``: ``append`` with epoch and base-offset checks."""

    def __init__(self, machine: MetadataStateMachine) -> None:
        self.machine = machine
        self.epoch = 1
        self.leader: int | None = 1
        self.node_id = 1
        self.entries: list[_Entry] = []
        self.end_offset = 0
        self.committed = 0

    @property
    def leader_id(self) -> int | None:
        return self.leader

    def _batch(self, values: Sequence[bytes], control: bool) -> RecordBatch:
        data = build_batch(
            [SimpleRecord(value=v) for v in values],
            base_offset=self.end_offset,
            partition_leader_epoch=self.epoch,
            is_control=control,
        )
        return next(iter_batches(data))

    def append(
        self,
        values: Sequence[bytes],
        *,
        epoch: int | None = None,
        base_offset: int | None = None,
    ) -> tuple[OffsetAndEpoch, asyncio.Future[int]]:
        if self.leader != self.node_id or (epoch is not None and epoch != self.epoch):
            raise NotLeaderError(self.leader, self.epoch)
        if base_offset is not None and base_offset != self.end_offset:
            # As RaftServer.append: only its own voters records may lie between.
            between = [
                e for e in self.entries if base_offset <= e.batch.base_offset < self.end_offset
            ]
            if base_offset > self.end_offset or not all(e.voters for e in between):
                raise UnexpectedAppendOffsetError(f"log end {self.end_offset}, not {base_offset}")
        batch = self._batch(values, control=False)
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self.entries.append(_Entry(batch, False, future))
        self.end_offset = batch.next_offset
        return OffsetAndEpoch(batch.next_offset - 1, self.epoch), future

    def new_epoch(self, leader: int | None) -> None:
        """An election: a new epoch, its leader's marker at the log end."""
        self.epoch += 1
        self.leader = leader
        batch = self._batch([b"leader-change"], control=True)
        self.entries.append(_Entry(batch, True, None))
        self.end_offset = batch.next_offset

    def append_voters(self) -> int:
        """A membership change on the leader: a ``voters`` control record at the log end,
        between the store's batches; its offset."""
        batch = self._batch([b"voters"], control=True)
        self.entries.append(_Entry(batch, True, None, voters=True))
        self.end_offset = batch.next_offset
        return batch.base_offset

    def truncate(self, offset: int) -> None:
        """A new leader's log replaced ours from ``offset``: those entries never commit."""
        for entry in self.entries:
            if entry.batch.base_offset >= offset and entry.future is not None:
                entry.future.set_exception(NotLeaderError(self.leader, self.epoch))
        self.entries = [e for e in self.entries if e.batch.base_offset < offset]
        self.end_offset = offset

    def replicate(self, records: Sequence[MetadataRecord]) -> None:
        """Another leader's entry, replicated to us."""
        batch = self._batch([encode_record(r) for r in records], control=False)
        self.entries.append(_Entry(batch, False, None))
        self.end_offset = batch.next_offset

    def commit(self, up_to: int | None = None) -> None:
        """Commit up to ``up_to`` (default: the log end): resolve, then apply, as the
        driver does."""
        end = self.end_offset if up_to is None else up_to
        data = []
        for entry in self.entries:
            if self.committed <= entry.batch.base_offset and entry.batch.next_offset <= end:
                future = entry.future
                if future is not None and not future.done():
                    future.set_result(entry.batch.next_offset - 1)
                if not entry.control:
                    data.append(entry.batch)
        self.committed = end
        if data:
            self.machine.apply(data, end)


def _encode(records: Sequence[MetadataRecord]) -> list[bytes]:
    return [encode_record(r) for r in records]


Log = tuple[FakeRaft, MetadataStateMachine, RaftMetadataStore]


@pytest.fixture
def log() -> Log:
    machine = MetadataStateMachine()
    raft = FakeRaft(machine)
    store = RaftMetadataStore(raft, machine)
    return raft, machine, store


def broker(broker_id: int, epoch: int) -> RegisterBrokerRecord:
    return RegisterBrokerRecord(broker_id, f"incarnation-{broker_id}", epoch, fenced=True)


def topic_records(name: str, topic_id: str) -> list[MetadataRecord]:
    return [TopicRecord(name, topic_id), PartitionRecord(topic_id, 0, (1,), (1,), 1)]


def config(topic: str, value: str) -> ConfigRecord:
    return ConfigRecord(ConfigResourceType.TOPIC, topic, "retention.ms", value)


async def activate(raft: FakeRaft, store: RaftMetadataStore) -> None:
    """What the controller server does: a NoOpRecord committed, then activate."""
    raft.new_epoch(raft.node_id)
    raft.append(_encode([NoOpRecord()]), epoch=raft.epoch)
    raft.commit()
    store.activate(raft.epoch)


async def test_an_inactive_store_refuses_writes(log: Log) -> None:
    raft, machine, store = log
    assert not store.is_active
    with pytest.raises(NotControllerError) as refused:
        store.append([broker(1, 0)])
    assert refused.value.controller_id == 1
    assert store.latest_image() is machine.image
    assert raft.end_offset == 0


async def test_appends_build_speculative_images_at_their_log_offsets(
    log: Log,
) -> None:
    raft, machine, store = log
    await activate(raft, store)
    committed = machine.image
    assert committed.offset == 1 and store.latest_image() is committed  # marker 0, no-op 1
    # A broker epoch is the offset of its RegisterBrokerRecord: the next offset.
    epoch = store.latest_image().offset + 1
    assert store.append([broker(1, epoch)]) == 2
    assert store.latest_image().broker(1) is not None
    assert store.latest_image().broker(1).broker_epoch == 2  # type: ignore[union-attr]
    assert machine.image is committed and store.committed_offset() == 1
    last = store.append(topic_records("a", "id-a"))
    assert last == 4 and store.latest_image().offset == 4
    assert store.latest_image().topic("a") is not None and machine.image.topic("a") is None
    assert store.pending_batches == 2
    assert [e.batch.base_offset for e in raft.entries[-2:]] == [2, 3]

    waiter = store.commit_waiter()
    assert waiter is not None and not waiter.done()
    speculative = store.latest_image()
    raft.commit()
    # The committed image is the speculative one: nothing decoded twice.
    assert machine.image is speculative
    assert store.pending_batches == 0 and store.commit_waiter() is None
    assert waiter.result() == 4


async def test_partial_commits_keep_the_rest_speculative(
    log: Log,
) -> None:
    raft, machine, store = log
    await activate(raft, store)
    for i in range(5):
        store.append([config("t", str(1000 + i))])
    latest = store.latest_image()
    raft.commit(up_to=raft.entries[-3].batch.next_offset)  # the first three
    assert machine.image.offset == latest.offset - 2
    assert store.pending_batches == 2
    assert store.latest_image() is latest
    store.append([config("t", "2000")])
    raft.commit()
    assert machine.image is store.latest_image()
    assert machine.image.topic_config("t") == {"retention.ms": "2000"}


async def test_leadership_loss_drops_the_speculative_images(
    log: Log,
) -> None:
    raft, machine, store = log
    await activate(raft, store)
    store.append([broker(1, 2)])
    raft.commit()
    store.append(topic_records("lost", "id-lost"))
    store.append([config("lost", "5")])
    waiter = store.commit_waiter()
    assert store.latest_image().topic("lost") is not None

    # Another voter wins an election; its log replaces our uncommitted tail.
    raft.truncate(3)
    raft.new_epoch(leader=2)
    store.deactivate()
    assert not store.is_active and store.pending_batches == 0
    assert store.latest_image() is machine.image and machine.image.topic("lost") is None
    assert waiter is not None and isinstance(waiter.exception(), NotLeaderError)
    with pytest.raises(NotControllerError) as refused:
        store.append([config("x", "1")])
    assert refused.value.controller_id == 2

    # The new leader's records arrive and commit: replayed from their bytes.
    raft.replicate(topic_records("kept", "id-kept"))
    raft.commit()
    assert machine.image.topic("kept") is not None and machine.image.topic("lost") is None
    assert machine.image.offset == raft.end_offset - 1


async def test_control_batches_leave_gaps_that_the_image_skips(
    log: Log,
) -> None:
    raft, machine, store = log
    await activate(raft, store)  # marker at 0, no-op at 1
    store.append([broker(1, 2)])
    raft.commit()
    store.deactivate()
    raft.new_epoch(leader=1)  # marker at 3
    await activate(raft, store)  # another marker at 4, no-op at 5
    assert machine.image.offset == 5 and machine.image.epoch == raft.epoch
    assert store.append([broker(2, 6)]) == 6
    raft.commit()
    assert machine.image.offset == 6
    assert sorted(machine.image.brokers) == [1, 2]


async def test_a_batch_goes_after_the_voters_records_of_a_membership_change(log: Log) -> None:
    """A membership change's ``voters`` record takes the offset the next batch expected:
    the batch goes after it, and the image the store keeps for it is at its records'
    offsets, so that its commit still takes that image (not decoded again) and the
    controller is not restarted."""
    raft, machine, store = log
    await activate(raft, store)  # marker at 0, no-op at 1
    incarnation = store.incarnation
    assert raft.append_voters() == 2
    assert store.append([broker(1, 3)]) == 2  # decided for offset 2 ...
    assert raft.entries[-1].batch.base_offset == 3  # ... and written at 3
    assert store.latest_image().offset == 3
    raft.commit()
    assert machine.image.offset == 3 and machine.image.broker(1) is not None
    assert store.incarnation == incarnation

    # In a group: the record lands while the group is staged, with an image built.
    store.begin_batch()
    store.append(topic_records("a", "id-a"))
    built = store.latest_image()
    assert built.offset == 5
    store.append([config("a", "1")])
    assert raft.append_voters() == 4
    store.seal()
    assert store.incarnation == incarnation
    sealed = store.latest_image()
    assert (raft.entries[-1].batch.base_offset, sealed.offset) == (5, 7)
    raft.commit()
    assert machine.image is sealed
    assert machine.image.topic_config("a")["retention.ms"] == "1"
    replica = MetadataStateMachine()
    replica.apply([e.batch for e in raft.entries if not e.control], raft.end_offset)
    assert snapshot_values(replica.image) == snapshot_values(machine.image)
    assert replica.image.offset == machine.image.offset

    # Anything but a voters record there is still the store out of step.
    raft.replicate([config("a", "2")])
    with pytest.raises(UnexpectedAppendOffsetError):
        store.append([config("a", "3")])
    assert store.incarnation != incarnation


async def test_nothing_is_appended_when_the_records_do_not_replay(
    log: Log,
) -> None:
    raft, _, store = log
    await activate(raft, store)
    end, latest = raft.end_offset, store.latest_image()
    bad = PartitionRecord("no-such-topic", 0, (1,), (1,), 1)
    with pytest.raises(MetadataReplayError):
        store.append([bad])
    assert raft.end_offset == end and store.latest_image() is latest
    assert store.append([]) == latest.offset  # nothing to write


async def test_appends_are_fenced_by_epoch_and_base_offset(
    log: Log,
) -> None:
    raft, _, store = log
    await activate(raft, store)
    # Leadership moved on before the role change reached the store.
    raft.new_epoch(leader=1)
    with pytest.raises(NotControllerError):
        store.append([broker(1, 3)])
    store.activate(raft.epoch)  # without waiting for the new epoch's entry: out of step
    with pytest.raises(UnexpectedAppendOffsetError):
        store.append([broker(1, 3)])


async def test_snapshots_round_trip_through_the_state_machine(
    log: Log,
) -> None:
    raft, machine, store = log
    await activate(raft, store)
    store.append([broker(1, 2), broker(2, 2)])
    for i in range(1500):  # more records than one snapshot batch holds
        store.append(topic_records(f"t{i}", f"id-{i}"))
    raft.commit()
    snapshot_id = OffsetAndEpoch(raft.end_offset, raft.epoch)
    data = machine.snapshot(snapshot_id)
    assert len(list(iter_batches(data))) == 4
    other = MetadataStateMachine()
    other.load_snapshot(SnapshotReader(snapshot_id, data))
    assert other.image.offset == snapshot_id.offset - 1 == machine.image.offset
    assert snapshot_values(other.image) == snapshot_values(machine.image)
    assert decode_snapshot(encode_snapshot(MetadataImage.empty()), OffsetAndEpoch(0, 0)) == (
        replay([], -1, 0)
    )


async def test_appends_staged_together_go_to_raft_as_one_batch(log: Log) -> None:
    raft, machine, store = log
    await activate(raft, store)
    entries = len(raft.entries)
    store.begin_batch()
    epoch = store.latest_image().offset + 1
    # Each staged append is decided on the image of the ones before it, at the offsets
    # the batch will give it.
    assert store.append([broker(1, epoch)]) == epoch
    assert store.latest_image().broker(1).broker_epoch == epoch  # type: ignore[union-attr]
    assert store.append(topic_records("a", "id-a")) == epoch + 2
    assert store.append([config("a", "7")]) == epoch + 3
    assert len(raft.entries) == entries and store.staged_records == 4
    with pytest.raises(RuntimeError):
        store.commit_waiter()  # nothing to wait on before the seal
    staged = store.latest_image()
    store.seal()
    assert len(raft.entries) == entries + 1
    assert raft.entries[-1].batch.base_offset == epoch
    assert raft.entries[-1].batch.next_offset == epoch + 4
    waiter = store.commit_waiter()
    assert waiter is not None and not waiter.done()
    raft.commit()
    assert machine.image is staged  # the staged image, not decoded again
    assert waiter.result() == epoch + 3
    # Outside a group, appends go to Raft at once again.
    store.append([config("a", "8")])
    assert len(raft.entries) == entries + 2


async def test_a_staged_group_that_raft_refuses_is_never_acknowledged(log: Log) -> None:
    raft, machine, store = log
    await activate(raft, store)
    incarnation = store.incarnation
    store.begin_batch()
    store.append(topic_records("lost", "id-lost"))
    assert store.latest_image().topic("lost") is not None
    # Leadership moves on before the group is sealed.
    raft.new_epoch(leader=2)
    end = raft.end_offset
    with pytest.raises(NotControllerError) as refused:
        store.seal()
    assert refused.value.controller_id == 2
    assert raft.end_offset == end and store.staged_records == 0
    assert store.incarnation != incarnation  # what was decided on it must not be answered
    assert store.latest_image() is machine.image and machine.image.topic("lost") is None


async def test_leadership_loss_drops_the_staged_records(log: Log) -> None:
    raft, machine, store = log
    await activate(raft, store)
    store.begin_batch()
    store.append(topic_records("lost", "id-lost"))
    incarnation = store.incarnation
    store.deactivate()
    assert store.incarnation != incarnation and store.staged_records == 0
    assert store.latest_image() is machine.image
    store.seal()  # nothing left to append
    assert raft.entries[-1].batch.base_offset < 2


async def test_a_staged_group_is_read_through_its_delta_and_builds_its_image_once(
    log: Log,
) -> None:
    raft, machine, store = log
    await activate(raft, store)
    store.append(topic_records("a", "id-a"))
    raft.commit()
    store.begin_batch()
    assert store.latest_view() is store.latest_image()  # nothing staged: the image
    store.append([config("a", "1")])
    store.append([config("a", "2"), ConfigRecord(ConfigResourceType.TOPIC, "a", "x.y", "z")])
    view = store.latest_view()
    assert isinstance(view, MetadataDelta)  # the group's records, no image built
    assert view.config(ConfigResource(ConfigResourceType.TOPIC, "a")) == {
        "retention.ms": "2",
        "x.y": "z",
    }
    image = store.latest_image()
    assert store.latest_image() is image  # built once, until the next append
    assert image.offset == raft.end_offset + 2 and image.topic_config("a")["retention.ms"] == "2"
    store.append([config("a", "3")])
    assert store.latest_image() is not image
    store.seal()
    sealed = store.latest_image()
    raft.commit()
    assert machine.image is sealed and machine.image.topic_config("a")["retention.ms"] == "3"
    # The follower's image, replayed batch by batch from the log, is the same.
    replica = MetadataStateMachine()
    replica.apply([e.batch for e in raft.entries if not e.control], raft.end_offset)
    assert snapshot_values(replica.image) == snapshot_values(machine.image)


async def test_records_that_do_not_replay_leave_the_staged_group_as_it_was(log: Log) -> None:
    raft, machine, store = log
    await activate(raft, store)
    store.begin_batch()
    store.append(topic_records("a", "id-a"))
    store.latest_image()  # built: what follows is staged on top of this image
    store.append([config("a", "1")])
    bad = PartitionRecord("no-such-topic", 0, (1,), (1,), 1)
    # The first two records replay into the staged delta before the third fails.
    with pytest.raises(MetadataReplayError):
        store.append([config("a", "2"), TopicRecord("b", "id-b"), bad])
    assert store.staged_records == 3
    view = store.latest_view()
    assert isinstance(view, MetadataDelta) and view.topic_id("b") is None
    assert view.config(ConfigResource(ConfigResourceType.TOPIC, "a")) == {"retention.ms": "1"}
    image = store.latest_image()
    assert image.topic("b") is None and image.topic_config("a") == {"retention.ms": "1"}
    # Nothing built yet since: the failure leaves the image as it was.
    with pytest.raises(MetadataReplayError):
        store.append([TopicRecord("c", "id-c"), bad])
    assert store.latest_image() is image
    store.append([config("a", "4")])
    store.seal()
    raft.commit()
    assert machine.image.topic("b") is None and machine.image.topic("c") is None
    assert machine.image.topic_config("a") == {"retention.ms": "4"}
    assert raft.entries[-1].batch.next_offset - raft.entries[-1].batch.base_offset == 4
