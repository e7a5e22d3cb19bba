"""A consumer session's positions and credit: what is delivered, acknowledged, committed.

Pure bookkeeping for :mod:`~highwater.broker.consumer_session`. Per partition it holds:

- ``position``: the next offset to deliver (None until the committed offset or the reset
  policy gave one);
- ``acknowledged``: the client's word that every record below it is processed: what a
  commit commits (at-least-once: nothing is committed past it), with the leader epoch of
  the batch the record before it came in (Kafka's ``offsetEpoch``, what lets a consumer
  resuming from the commit validate it, KIP-320). It only moves forward: an
  acknowledgement below it says nothing new (every record below 5 is processed when
  every record below 10 is) and is ignored, so that acknowledgements arriving out of
  order never move a commit back; only a seek below it lets the client acknowledge
  from there again (it rewound to process those records anew);
- ``committed``: what the group has for it, as far as this session knows;
- the records delivered and not acknowledged yet, with their sizes and leader epochs.

The session's credit is ``max_records`` records and ``max_bytes`` bytes outstanding over
all its partitions: :meth:`SessionState.deliverable` says how many of a fetched run of
records may go now (one record even past the bytes when nothing is outstanding, so that
a record larger than the credit still comes), and a session out of credit is not fetched
for until an acknowledgement (or a seek, or a revocation) frees some. A session whose
bytes left do not take the next record fetched is out of credit as well
(:meth:`SessionState.short_of_bytes`): fetching again would bring the same record, again
and again, until the client acknowledges.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from highwater.group.protocol import TopicPartitionKey

__all__ = ["PartitionProgress", "SessionState"]


@dataclass(slots=True)
class PartitionProgress:
    position: int | None = None
    acknowledged: int | None = None
    acknowledged_epoch: int = -1
    """The leader epoch of the record before :attr:`acknowledged` (-1: not known)."""
    ack_floor: int | None = None
    """Acknowledgements below it are stale and ignored: :attr:`acknowledged`, or lower
    after a seek below it."""
    committed: int | None = None
    outstanding: deque[tuple[int, int, int]] = field(default_factory=deque)
    """``(offset, size, leader epoch)`` of the records delivered and not acknowledged, in
    offset order."""


class SessionState:
    """The partitions a session holds and its credit (see the module docstring)."""

    def __init__(self, max_records: int, max_bytes: int) -> None:
        if max_records < 1 or max_bytes < 1:
            raise ValueError("max_records and max_bytes must be at least 1")
        self.max_records = max_records
        self.max_bytes = max_bytes
        self.partitions: dict[TopicPartitionKey, PartitionProgress] = {}
        self.outstanding_records = 0
        self.outstanding_bytes = 0
        self._short_of_bytes = False
        """The next record fetched did not fit the bytes left (see :meth:`short_of_bytes`)."""

    # -- holding partitions --------------------------------------------------------------

    def assign(self, partitions: Iterable[TopicPartitionKey]) -> None:
        for tp in partitions:
            self.partitions.setdefault(tp, PartitionProgress())

    def remove(self, partitions: Iterable[TopicPartitionKey]) -> None:
        """Stop holding ``partitions``: their outstanding records are no longer owed."""
        for tp in partitions:
            progress = self.partitions.pop(tp, None)
            if progress is not None:
                self._release(progress.outstanding)

    def start_at(
        self, tp: TopicPartitionKey, offset: int, *, committed: bool, leader_epoch: int = -1
    ) -> None:
        """Where ``tp`` starts: its committed offset (which is also acknowledged, with the
        committed ``leader_epoch``), or where the reset policy put it."""
        progress = self.partitions.get(tp)
        if progress is None:
            return
        progress.position = offset
        if committed:
            progress.acknowledged = progress.committed = progress.ack_floor = offset
            progress.acknowledged_epoch = leader_epoch

    def held(self) -> tuple[TopicPartitionKey, ...]:
        return tuple(sorted(self.partitions))

    # -- delivering ----------------------------------------------------------------------

    def has_credit(self) -> bool:
        """Whether a fetch may deliver something now: records left, and bytes left for the
        next record (any record when nothing is outstanding)."""
        if self.outstanding_records >= self.max_records:
            return False
        if self.outstanding_records == 0:
            return True
        return self.outstanding_bytes < self.max_bytes and not self._short_of_bytes

    def short_of_bytes(self) -> None:
        """Records fetched did not fit the bytes left (:meth:`deliverable` took fewer than
        came): the session is out of credit until records are released (acknowledged,
        sought past or revoked), rather than fetching the same record again at once. With
        nothing outstanding every fetch delivers a record, so that is never short."""
        if self.outstanding_records > 0:
            self._short_of_bytes = True

    def record_room(self) -> int:
        """How many records may be delivered now."""
        return max(self.max_records - self.outstanding_records, 0)

    def byte_room(self) -> int:
        """How many bytes a fetch may ask for now (at least 1)."""
        return max(self.max_bytes - self.outstanding_bytes, 1)

    def fetchable(self) -> list[tuple[TopicPartitionKey, int]]:
        """The partitions to fetch and from where: all with a position, while there is credit."""
        if not self.has_credit():
            return []
        return [
            (tp, p.position) for tp, p in sorted(self.partitions.items()) if p.position is not None
        ]

    def deliverable(self, sizes: Sequence[int]) -> int:
        """How many of a run of records with ``sizes`` may be delivered now."""
        records, size = self.outstanding_records, self.outstanding_bytes
        count = 0
        for record_size in sizes:
            if records >= self.max_records:
                break
            if records > 0 and size + record_size > self.max_bytes:
                break
            records += 1
            size += record_size
            count += 1
        return count

    def delivered(self, tp: TopicPartitionKey, records: Iterable[tuple[int, int, int]]) -> None:
        """``(offset, size, leader epoch)`` of records of ``tp`` sent to the client, in
        offset order."""
        progress = self.partitions[tp]
        for offset, size, epoch in records:
            progress.outstanding.append((offset, size, epoch))
            progress.position = offset + 1
            self.outstanding_records += 1
            self.outstanding_bytes += size

    # -- the client's word ---------------------------------------------------------------

    def acknowledge(self, tp: TopicPartitionKey, offset: int) -> str | None:
        """Every record of ``tp`` below ``offset`` is processed; why not, if refused."""
        progress = self.partitions.get(tp)
        if progress is None:
            return f"{tp[0]}-{tp[1]} is not held by this session"
        if progress.position is None or offset > progress.position or offset < 0:
            return (
                f"{tp[0]}-{tp[1]}: offset {offset} acknowledges records never delivered "
                f"(next to deliver: {progress.position})"
            )
        if progress.ack_floor is not None and offset < progress.ack_floor:
            return None  # stale: already said by a later acknowledgement (see the module)
        freed: list[tuple[int, int, int]] = []
        while progress.outstanding and progress.outstanding[0][0] < offset:
            freed.append(progress.outstanding.popleft())
        if freed:
            progress.acknowledged_epoch = freed[-1][2]  # the last record below ``offset``
        elif offset != progress.acknowledged:
            progress.acknowledged_epoch = -1
        progress.acknowledged = progress.ack_floor = offset
        self._release(freed)
        return None

    def seek(self, tp: TopicPartitionKey, offset: int) -> str | None:
        progress = self.partitions.get(tp)
        if progress is None:
            return f"{tp[0]}-{tp[1]} is not held by this session"
        self._release(progress.outstanding)
        progress.outstanding = deque()
        progress.position = offset
        if progress.ack_floor is not None:
            progress.ack_floor = min(progress.ack_floor, offset)
        self._short_of_bytes = False  # the next record fetched is another one
        return None

    def to_commit(
        self, partitions: Iterable[TopicPartitionKey] | None = None
    ) -> dict[TopicPartitionKey, tuple[int, int]]:
        """The acknowledged positions not committed yet (of ``partitions``, or all), each
        with its leader epoch (-1: not known)."""
        wanted = self.partitions if partitions is None else partitions
        result = {}
        for tp in wanted:
            progress = self.partitions.get(tp)
            if progress is None or progress.acknowledged is None:
                continue
            if progress.acknowledged != progress.committed:
                result[tp] = (progress.acknowledged, progress.acknowledged_epoch)
        return result

    def committed(self, tp: TopicPartitionKey, offset: int) -> None:
        progress = self.partitions.get(tp)
        if progress is not None:
            progress.committed = offset

    def _release(self, records: Iterable[tuple[int, int, int]]) -> None:
        for _, size, _ in records:
            self.outstanding_records -= 1
            self.outstanding_bytes -= size
            self._short_of_bytes = False
