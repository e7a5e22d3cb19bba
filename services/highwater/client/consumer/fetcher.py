"""The consumer's fetcher, its pure part: topic partitions and their positions, Fetch
requests, and fetched batches buffered and decoded into messages (Kafka's ``Fetcher`` and
``CompletedFetch``).

Each assigned partition has a :class:`PartitionState`: its position (the next offset to
return), its fetch state and the answer's batches, framed and CRC-checked when they
arrive, decoded one batch at a time as they are taken, and whether the position awaits
validation by leader epoch (KIP-320: :meth:`PartitionState.leader_known`,
:meth:`PartitionState.complete_validation`). The I/O (sending the fetches and the
``OffsetsForLeaderEpoch`` requests, metadata, back-off) is
:class:`~highwater.client.consumer.AsyncConsumer`'s.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Final

from highwater.client.message import (
    TIMESTAMP_LOG_APPEND_TIME,
    Message,
    message_makers,
)
from highwater.errors import (
    CorruptRecordError,
)
from highwater.records import RecordBatch, iter_batches
from highwater.records.record import RecordFactory
from highwater.v1 import broker_pb2 as pb
from highwater.v1.common_pb2 import ErrorCode

__all__ = [
    "EARLIEST_TIMESTAMP",
    "FETCH_RETRIABLE_ERRORS",
    "LATEST_TIMESTAMP",
    "OFFSET_BEGINNING",
    "OFFSET_END",
    "OFFSET_INVALID",
    "OFFSET_STORED",
    "PartitionState",
    "TopicPartition",
    "Truncation",
    "create_fetch_request",
]

#: confluent-kafka's logical offsets, accepted by assign() and seek().
OFFSET_BEGINNING: Final = -2
OFFSET_END: Final = -1
OFFSET_STORED: Final = -1000
OFFSET_INVALID: Final = -1001

EARLIEST_TIMESTAMP: Final = -2
LATEST_TIMESTAMP: Final = -1

#: Partition errors after which the metadata is refreshed and the request retried.
FETCH_RETRIABLE_ERRORS: Final[frozenset[int]] = frozenset(
    {
        ErrorCode.NOT_LEADER_OR_FOLLOWER,
        ErrorCode.FENCED_LEADER_EPOCH,
        ErrorCode.UNKNOWN_LEADER_EPOCH,
        ErrorCode.LEADER_NOT_AVAILABLE,
        ErrorCode.REPLICA_NOT_AVAILABLE,
        ErrorCode.KAFKA_STORAGE_ERROR,
        ErrorCode.REQUEST_TIMED_OUT,
        ErrorCode.NETWORK_EXCEPTION,
        ErrorCode.BROKER_NOT_AVAILABLE,
        ErrorCode.OFFSET_NOT_AVAILABLE,
    }
)


@dataclass(slots=True)
class TopicPartition:
    """A partition of a topic, with an offset (confluent-kafka's ``TopicPartition``).

    ``offset`` is None (or :data:`OFFSET_STORED` / :data:`OFFSET_INVALID`) for "not set"
    (the group's committed offset, else ``auto.offset.reset``),
    :data:`OFFSET_BEGINNING` or :data:`OFFSET_END` for the log's ends, else an offset;
    :meth:`AsyncConsumer.offsets_for_times` takes a timestamp in it. ``error`` is set by
    calls that answer per partition. ``leader_epoch`` is the leader epoch of the record
    before the offset, None where not known (Kafka's ``OffsetAndMetadata.leaderEpoch``):
    commits carry it, :meth:`AsyncConsumer.committed` answers it, and an offset given to
    :meth:`AsyncConsumer.assign` or :meth:`AsyncConsumer.seek` with it is validated
    against the leader's log before it is fetched from.
    """

    topic: str
    partition: int
    offset: int | None = None
    error: BaseException | None = None
    leader_epoch: int | None = None

    def key(self) -> tuple[str, int]:
        """``(topic, partition)``: the partition without its offset."""
        return (self.topic, self.partition)


@dataclass(frozen=True, slots=True)
class Truncation:
    """A position the leader's log no longer holds (Kafka's ``LogTruncation``): ``offset``
    of ``epoch`` was validated and the log's ``epoch`` (or the largest below it) ends at
    ``divergent_offset`` of ``divergent_epoch``, below it (both -1: the log holds no
    epoch up to it)."""

    offset: int
    epoch: int
    divergent_offset: int
    divergent_epoch: int


@dataclass(eq=False, slots=True)
class PartitionState:
    """One assigned partition: its position, buffered records and fetch state."""

    topic: str
    partition: int
    position: int | None = None
    """The next offset to return; None: to be looked up (``reset``) first."""
    position_epoch: int = -1
    """The leader epoch of the batch the record before the position came in (-1: not
    known): what a commit of the position carries, Kafka's ``FetchPosition.offsetEpoch``.
    A partition started at a committed offset starts with that offset's epoch."""
    position_leader_epoch: int = -1
    """The partition leader's epoch the position was last checked against (Kafka's
    ``FetchPosition.currentLeader``; -1: none yet): a leader of another epoch in the
    metadata makes a position with a known :attr:`position_epoch` await validation."""
    awaiting_validation: bool = False
    """The position is not fetched from until ``OffsetsForLeaderEpoch`` shows that the
    leader's log holds it (:meth:`leader_known`, :meth:`complete_validation`)."""
    reset: str = "latest"
    """Where a lookup goes: earliest, latest or none."""
    awaiting_committed: bool = False
    """The position is the group's committed offset, to be fetched (``OffsetFetch``) before
    :attr:`reset` may look one up: only a partition the group has no commit for starts
    where ``auto.offset.reset`` says (Kafka's ``initWithCommittedOffsetsIfNeeded``)."""
    paused: bool = False
    failed: bool = False
    """An error was delivered: not fetched again until sought or reassigned."""
    missing_reported: bool = False
    """UNKNOWN_TOPIC_OR_PARTITION was delivered as an error message: the partition is still
    fetched (after a metadata refresh and a back-off) until its topic exists, without the
    error again until it has been fetched, sought or assigned anew."""
    records: list[Message] = field(default_factory=list)
    """The records of the batch decoded last; those from :attr:`taken` on are not returned."""
    records_epoch: int = -1
    """The partition leader epoch of the batch :attr:`records` came in."""
    taken: int = 0
    batches: deque[RecordBatch] = field(default_factory=deque)
    """Fetched batches not decoded yet, in offset order."""
    fetched_end: int = -1
    """The offset after the last batch of the buffered answer."""
    pending_error: BaseException | None = None
    """An error found after the buffered records (corrupt data): delivered after them."""
    backoff_until: float = 0.0
    high_watermark: int = OFFSET_INVALID
    log_start_offset: int = OFFSET_INVALID
    generation: int = 0
    """Bumped by every seek: answers to fetches sent before it are dropped."""
    ahead_generation: int = -1
    """The :attr:`generation` a fetch ahead (:meth:`fetch_ahead_offset`) was sent in while
    it is unanswered, else -1: the partition is not fetched again meanwhile."""
    answer_batches: int = 0
    """How many batches the last buffered answer brought."""

    message_makers: tuple[RecordFactory[Message], RecordFactory[Message]] = field(init=False)
    """What makes a decoded record a message, by the batch's
    :class:`~highwater.records.TimestampType`, for batches of :attr:`makers_epoch`."""
    makers_epoch: int = field(init=False, default=-1)
    """The partition leader epoch :attr:`message_makers` stamp on their messages."""

    def __post_init__(self) -> None:
        self.message_makers = message_makers(self.topic, self.partition, -1)

    def makers_for(
        self, leader_epoch: int
    ) -> tuple[RecordFactory[Message], RecordFactory[Message]]:
        """:attr:`message_makers` for a batch of ``leader_epoch`` (made again only when the
        epoch changes, which a partition's batches seldom do)."""
        if leader_epoch != self.makers_epoch:
            self.message_makers = message_makers(self.topic, self.partition, leader_epoch)
            self.makers_epoch = leader_epoch
        return self.message_makers

    def clear_buffer(self) -> None:
        """Drop what was fetched and not returned yet."""
        self.records = []
        self.taken = 0
        self.batches.clear()
        self.fetched_end = -1
        self.pending_error = None

    def leader_known(self, leader_epoch: int) -> bool:
        """The metadata names a leader of ``leader_epoch`` for the partition; returns
        whether the position awaits validation (Kafka's
        ``maybeValidatePositionForCurrentLeader``).

        A position not yet checked against a leader of that epoch is checked now: one with
        a known epoch (a committed offset's, or that of the batch the last record came in)
        awaits validation, the records fetched for it are dropped and the answers to
        fetches in flight will be (a leader change may mean the log they came from
        diverged); one without (an offset given by hand, or just looked up) is fetched
        from as it is.
        """
        if self.position is None or leader_epoch < 0 or leader_epoch == self.position_leader_epoch:
            return self.awaiting_validation
        self.position_leader_epoch = leader_epoch
        if self.position_epoch >= 0:
            self.awaiting_validation = True
            self.clear_buffer()
            self.generation += 1
        return self.awaiting_validation

    def complete_validation(self, end_epoch: int, end_offset: int, reset: str) -> Truncation | None:
        """Apply the leader's answer to ``OffsetsForLeaderEpoch`` for :attr:`position_epoch`:
        the largest epoch at or below it in the leader's log, ``end_epoch``, and where that
        epoch ends, ``end_offset`` (-1, -1: the log holds none). ``reset`` is
        ``auto.offset.reset``.

        As Kafka's ``SubscriptionState.maybeCompleteValidation``: an end at or past the
        position validates it; an end below it means the log was truncated under the
        position, which moves to that end, the first offset known to diverge (with its
        epoch), or, with ``reset`` none, is returned as a :class:`Truncation` to raise;
        no end at all is a truncation too, and the position is looked up afresh by
        ``reset`` (or, with none, returned without a divergent offset).
        """
        position = self.position
        assert position is not None and self.awaiting_validation
        self.awaiting_validation = False
        if end_offset < 0 or end_epoch < 0:
            if reset == "none":
                return Truncation(position, self.position_epoch, -1, -1)
            self.position, self.position_epoch, self.reset = None, -1, reset
            return None
        if end_offset < position:
            if reset == "none":
                return Truncation(position, self.position_epoch, end_offset, end_epoch)
            self.position, self.position_epoch = end_offset, end_epoch
        return None

    def fetch_ahead_offset(self) -> int | None:
        """Where to fetch the partition ahead of its buffer, while the caller works through
        it (Kafka's fetch pipelining); None when not now.

        Only while the broker is known to hold records after the buffered answer (its end
        is below the answer's high watermark: the fetch is answered at once, no long poll),
        none is in flight, and at most half of the last answer's batches are left, so a
        partition buffers at most about one and a half answers.
        """
        end = self.fetched_end
        if (
            0 <= end < self.high_watermark
            and self.ahead_generation != self.generation
            and self.pending_error is None
            and not self.paused
            and not self.failed
            and len(self.batches) * 2 <= self.answer_batches
        ):
            return end
        return None

    def buffered(self) -> bool:
        """Whether records (decoded or not) wait to be returned."""
        return self.taken < len(self.records) or bool(self.batches)

    def take(self, messages: list[Message], limit: int) -> None:
        """Append buffered records at or after the position to ``messages`` until it holds
        ``limit`` or the buffer is empty, advancing the position. Batches are decoded as
        they are reached, and their records are moved in slices, not one by one."""
        position = self.position
        assert position is not None
        while len(messages) < limit:
            records, i = self.records, self.taken
            if i == len(records):
                if not self._decode_next_batch():
                    return
                continue
            # Offsets increase along a batch: only the first batch of an answer may hold
            # records before the position.
            while i < len(records) and records[i]._offset < position:
                i += 1
            chunk = records[i : i + limit - len(messages)]
            if chunk:
                messages += chunk
                position = self.position = chunk[-1]._offset + 1
                self.position_epoch = self.records_epoch
            self.taken = i + len(chunk)

    def take_columns(
        self, columns: Any, limit: int, epochs: list[tuple[int, int]] | None = None
    ) -> None:
        """:meth:`take` into ``columns`` (a :data:`~highwater.records.columnar.RecordColumns`)
        until they hold ``limit`` records or the buffer is empty: each batch is decoded
        straight into them, whole (so up to a batch more than ``limit`` may come), with no
        message per record. Records already decoded as messages (by a :meth:`take` before),
        and the first batch of an answer when it starts below the position, go in one
        record at a time. ``epochs``, if given, gets ``(row, leader epoch)`` wherever the
        partition leader epoch of the rows taken changes (the first row included)."""
        position = self.position
        assert position is not None

        def rows_of_epoch(epoch: int) -> None:
            if epochs is not None and (not epochs or epochs[-1][1] != epoch):
                epochs.append((len(columns), epoch))

        while len(columns) < limit:
            records, i = self.records, self.taken
            if i < len(records):
                rows_of_epoch(self.records_epoch)
                while i < len(records) and len(columns) < limit:
                    message = records[i]
                    i += 1
                    if message._offset < position:
                        continue
                    columns.timestamp_type = int(
                        message._timestamp_type == TIMESTAMP_LOG_APPEND_TIME
                    )
                    columns(
                        message._key,
                        message._value,
                        message._headers,
                        message._timestamp,
                        message._offset,
                    )
                    position = self.position = message._offset + 1
                    self.position_epoch = self.records_epoch
                self.taken = i
                continue
            if not self.batches:
                return
            batch = self.batches[0]
            if batch.base_offset < position:
                self._decode_next_batch()
                continue
            self.batches.popleft()
            rows_of_epoch(batch.partition_leader_epoch)
            try:
                batch.read_columns(columns)
            except CorruptRecordError as e:
                self.batches.clear()
                self.fetched_end = -1
                self.pending_error = CorruptRecordError(f"{self.topic}-{self.partition}: {e}")
                if columns.last_offset >= position:
                    self.position = columns.last_offset + 1
                    self.position_epoch = batch.partition_leader_epoch
                return
            position = self.position = batch.next_offset
            self.position_epoch = batch.partition_leader_epoch

    def _decode_next_batch(self) -> bool:
        """Decode the next buffered batch into :attr:`records`; False if none is left.

        A corrupt record ends the buffer: the records before it are kept, the batches
        after it dropped, and the error is delivered after them.
        """
        if not self.batches:
            return False
        batch = self.batches.popleft()
        decoded: list[Message] = []
        try:
            makers = self.makers_for(batch.partition_leader_epoch)
            batch.read_records(decoded, makers[batch.timestamp_type])
        except CorruptRecordError as e:
            self.batches.clear()
            self.fetched_end = -1
            self.pending_error = CorruptRecordError(f"{self.topic}-{self.partition}: {e}")
        self.records, self.taken = decoded, 0
        self.records_epoch = batch.partition_leader_epoch
        return True

    def buffer(
        self, offset: int, data: bytes, check_crcs: bool
    ) -> tuple[bool, CorruptRecordError | None]:
        """Buffer the batches of a fetched answer ``data`` that hold records at or after
        ``offset`` (the fetch offset); their records are decoded as they are taken.

        Returns whether records are now buffered, and an error to deliver at once (corrupt
        data with no record before it; corruption after some records is delivered after
        them, :attr:`pending_error`). An answer of only control batches, or of records below
        the position, moves the position past them.
        """
        batches = self.batches
        before = len(batches)
        end = offset
        error: CorruptRecordError | None = None
        try:
            for batch in iter_batches(data, verify_crc=check_crcs):
                if batch.next_offset <= offset:
                    continue
                end = max(end, batch.next_offset)
                if not batch.is_control:
                    batches.append(batch)
        except CorruptRecordError as e:
            error = CorruptRecordError(f"{self.topic}-{self.partition}: {e}")
        self.answer_batches = len(batches) - before
        if batches or (end > offset and self.buffered()):
            self.fetched_end = end  # after a fetch ahead, records before it may wait
        elif error is None and end > offset:
            self.position = end  # only control batches or records below the position
        if error is not None and self.buffered():
            self.fetched_end = -1  # stop at the corruption, report it after the records
            self.pending_error = error
            error = None
        return bool(batches), error

    def fetchable(self, now: float) -> bool:
        """Whether to fetch the partition now."""
        return (
            not self.paused
            and not self.failed
            and self.position is not None
            and not self.awaiting_validation
            and not self.buffered()
            and self.backoff_until <= now
            and self.ahead_generation != self.generation
        )


def create_fetch_request(
    states: Iterable[PartitionState],
    leader_epoch: Callable[[str, int], int],
    *,
    max_wait_ms: int,
    min_bytes: int,
    max_bytes: int,
    partition_max_bytes: int,
    ahead: bool = False,
) -> tuple[pb.FetchRequest, dict[tuple[str, int], tuple[PartitionState, int, int]]]:
    """One Fetch request for ``states`` (each with a position), grouped by topic, and what
    was asked of each partition: ``(state, fetch offset, generation)`` by ``(topic,
    partition)``, to match the answers against (a seek meanwhile bumps the generation).
    ``ahead``: each from the end of its buffered answer
    (:meth:`PartitionState.fetch_ahead_offset`), not from its position."""
    request = pb.FetchRequest(max_wait_ms=max_wait_ms, min_bytes=min_bytes, max_bytes=max_bytes)
    topics: dict[str, pb.FetchTopic] = {}
    sent: dict[tuple[str, int], tuple[PartitionState, int, int]] = {}
    for state in states:
        offset = state.fetched_end if ahead else state.position
        assert offset is not None and offset >= 0
        topic = topics.get(state.topic)
        if topic is None:
            topic = topics[state.topic] = request.topics.add(topic=state.topic)
        topic.partitions.add(
            partition=state.partition,
            current_leader_epoch=leader_epoch(state.topic, state.partition),
            fetch_offset=offset,
            partition_max_bytes=partition_max_bytes,
        )
        sent[(state.topic, state.partition)] = (state, offset, state.generation)
    return request, sent
