"""The replicated log as the Raft core sees it: the ``RaftLog`` protocol and an in-memory log.

Entries are stored as RecordBatch v2 batches, one batch per append, whose
``partition_leader_epoch`` is the Raft epoch that wrote them; the leader's epoch-start
marker is a control batch. Offsets name entries; an *end offset* is one past the last
entry of a prefix, and a prefix is named by its end offset and the epoch of its last
entry (:class:`~highwater.raft.messages.OffsetAndEpoch`).

After a snapshot the log starts at the snapshot's end offset, and the snapshot's epoch is
the epoch of the (removed) entry just before it: ``last_epoch`` and
``end_offset_for_epoch`` answer with it while the log holds nothing after it.

Every offset the core hands to ``truncate_to`` or ``delete_before`` is a batch boundary:
an epoch's end, a high watermark, a snapshot id. Those all come from end offsets of
whole batches, because the leader appends whole batches and followers copy them.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from highwater.errors import (
    InvalidRecordError,
    OffsetOutOfRangeError,
    UnexpectedAppendOffsetError,
)
from highwater.raft.messages import OffsetAndEpoch
from highwater.records import SimpleRecord, build_batch, iter_batches

__all__ = [
    "InMemoryRaftLog",
    "LogEntry",
    "RaftLog",
    "decode_leader_change",
    "encode_leader_change",
]


class RaftLog(Protocol):
    """What the Raft core needs of its log; the storage engine implements the same.

    Appends and truncations take effect at once (reads see them); durability is separate:
    entries below ``flushed_offset`` survive a crash, the driver flushes when
    :class:`~highwater.raft.node.Ready` says ``must_flush``. A truncation or a move of the
    log start is durable when the call returns.
    """

    @property
    def start_offset(self) -> int:
        """The first offset the log holds; after a snapshot, the snapshot's end offset."""
        ...

    @property
    def end_offset(self) -> int:
        """One past the last entry (the log end offset)."""
        ...

    @property
    def last_epoch(self) -> int:
        """The epoch of the last entry, or of the snapshot the log starts at; 0 if empty."""
        ...

    @property
    def flushed_offset(self) -> int:
        """Entries below this offset are durable."""
        ...

    def end_offset_for_epoch(self, epoch: int) -> OffsetAndEpoch:
        """Where the entries of epochs ``<= epoch`` end, and the largest such epoch.

        Kafka's ``endOffsetForEpoch``: the answer is ``(end_offset, last_epoch)`` when
        ``epoch >= last_epoch``; otherwise the end is the start offset of the first epoch
        above ``epoch``. When every epoch the log knows is above ``epoch`` (only possible
        after a snapshot), the answer is ``(start_offset, snapshot epoch)``: the log cannot
        vouch for anything before its start.
        """
        ...

    def append_as_leader(
        self, values: Sequence[bytes], epoch: int, *, control: bool = False
    ) -> OffsetAndEpoch:
        """Append ``values`` as one batch at the log end in ``epoch``; the last entry's id."""
        ...

    def append_as_follower(self, batches: bytes) -> None:
        """Append batches read from the leader, keeping their offsets and epochs.

        The first batch must start at the log end offset.
        """
        ...

    def read(self, start_offset: int, max_bytes: int) -> bytes:
        """Whole batches from the one holding ``start_offset``, at least one, about
        ``max_bytes`` in all; empty at the log end. Raises ``OffsetOutOfRangeError``
        outside ``[start_offset, end_offset]``."""
        ...

    def truncate_to(self, offset: int) -> None:
        """Remove the entries at and above ``offset`` (a batch boundary)."""
        ...

    def truncate_to_snapshot(self, snapshot_id: OffsetAndEpoch) -> None:
        """Remove every entry: the log starts (and ends) at the snapshot's end offset."""
        ...

    def delete_before(self, offset: int) -> None:
        """Move the log start up to ``offset`` (a snapshot's end), keeping later entries."""
        ...


# --- Control records -------------------------------------------------------------------


def encode_leader_change(leader_id: int, voters: Sequence[int]) -> bytes:
    """The value of the control record a new leader appends at the start of its epoch."""
    return json.dumps(
        {"type": "leader_change", "leader_id": leader_id, "voters": sorted(voters)},
        separators=(",", ":"),
    ).encode()


def decode_leader_change(value: bytes) -> tuple[int, tuple[int, ...]]:
    """``(leader_id, voters)`` from a leader-change control record's value."""
    message = json.loads(value)
    if message.get("type") != "leader_change":
        raise InvalidRecordError(f"not a leader change control record: {value!r}")
    return int(message["leader_id"]), tuple(int(v) for v in message["voters"])


# --- In memory -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LogEntry:
    """One entry of the log, decoded (what tests and the simulation look at)."""

    offset: int
    epoch: int
    value: bytes | None
    is_control: bool


@dataclass(frozen=True, slots=True)
class _Batch:
    base_offset: int
    next_offset: int
    epoch: int
    is_control: bool
    values: tuple[bytes | None, ...]
    data: bytes


class InMemoryRaftLog:
    """A :class:`RaftLog` in memory, for unit tests and the simulation.

    ``flushed_offset`` only moves when the driver calls :meth:`mark_flushed` (what a real
    log does after an fsync); :meth:`crash` simulates a process or machine crash. Record
    timestamps come from ``clock`` (default: always 0, so runs are reproducible).
    """

    def __init__(self, *, clock: Callable[[], int] | None = None) -> None:
        self._clock = clock or (lambda: 0)
        self._batches: list[_Batch] = []
        self._base_offsets: list[int] = []
        # (epoch, start offset) of the epochs of the entries held, both increasing.
        self._epochs: list[tuple[int, int]] = []
        self._start_offset = 0
        self._start_epoch = 0
        self._flushed_offset = 0

    # --- RaftLog ---------------------------------------------------------------------

    @property
    def start_offset(self) -> int:
        return self._start_offset

    @property
    def end_offset(self) -> int:
        return self._batches[-1].next_offset if self._batches else self._start_offset

    @property
    def last_epoch(self) -> int:
        return self._batches[-1].epoch if self._batches else self._start_epoch

    @property
    def flushed_offset(self) -> int:
        return self._flushed_offset

    def end_offset_for_epoch(self, epoch: int) -> OffsetAndEpoch:
        if epoch >= self.last_epoch:
            return OffsetAndEpoch(self.end_offset, self.last_epoch)
        above = bisect.bisect_right(self._epochs, epoch, key=_epoch_of)
        if above == 0:
            return OffsetAndEpoch(self._start_offset, self._start_epoch)
        return OffsetAndEpoch(self._epochs[above][1], self._epochs[above - 1][0])

    def append_as_leader(
        self, values: Sequence[bytes], epoch: int, *, control: bool = False
    ) -> OffsetAndEpoch:
        if not values:
            raise ValueError("nothing to append")
        if epoch < self.last_epoch:
            raise InvalidRecordError(
                f"epoch {epoch} is below the log's last epoch {self.last_epoch}"
            )
        base_offset = self.end_offset
        timestamp = self._clock()
        data = build_batch(
            [SimpleRecord(value=value, timestamp=timestamp) for value in values],
            base_offset=base_offset,
            partition_leader_epoch=epoch,
            is_control=control,
        )
        self._append(
            _Batch(base_offset, base_offset + len(values), epoch, control, tuple(values), data)
        )
        return OffsetAndEpoch(base_offset + len(values) - 1, epoch)

    def append_as_follower(self, batches: bytes) -> None:
        decoded: list[_Batch] = []
        next_offset = self.end_offset
        last_epoch = self.last_epoch
        for batch in iter_batches(batches):
            if batch.base_offset != next_offset:
                raise UnexpectedAppendOffsetError(
                    f"batch at offset {batch.base_offset} does not continue the log "
                    f"at {next_offset}"
                )
            if batch.partition_leader_epoch < last_epoch:
                raise InvalidRecordError(
                    f"batch at offset {batch.base_offset} has epoch {batch.partition_leader_epoch}"
                    f" below the log's last epoch {last_epoch}"
                )
            values = tuple(record.value for record in batch.records())
            decoded.append(
                _Batch(
                    batch.base_offset,
                    batch.next_offset,
                    batch.partition_leader_epoch,
                    batch.is_control,
                    values,
                    batch.to_bytes(),
                )
            )
            next_offset = batch.next_offset
            last_epoch = batch.partition_leader_epoch
        for entry in decoded:
            self._append(entry)

    def read(self, start_offset: int, max_bytes: int) -> bytes:
        end_offset = self.end_offset
        if not self._start_offset <= start_offset <= end_offset:
            raise OffsetOutOfRangeError(
                f"offset {start_offset} is outside the log [{self._start_offset}, {end_offset}]"
            )
        index = self._batch_index(start_offset)
        out = bytearray()
        for batch in self._batches[index:]:
            if out and len(out) + len(batch.data) > max_bytes:
                break
            out += batch.data
        return bytes(out)

    def truncate_to(self, offset: int) -> None:
        if offset >= self.end_offset:
            return
        if offset < self._start_offset:
            raise OffsetOutOfRangeError(
                f"cannot truncate to {offset}, below the log start {self._start_offset}"
            )
        index = self._boundary_index(offset)
        del self._batches[index:]
        del self._base_offsets[index:]
        while self._epochs and self._epochs[-1][1] >= offset:
            self._epochs.pop()
        self._flushed_offset = min(self._flushed_offset, offset)

    def truncate_to_snapshot(self, snapshot_id: OffsetAndEpoch) -> None:
        self._batches.clear()
        self._base_offsets.clear()
        self._epochs.clear()
        self._start_offset = snapshot_id.offset
        self._start_epoch = snapshot_id.epoch
        self._flushed_offset = snapshot_id.offset

    def delete_before(self, offset: int) -> None:
        if offset <= self._start_offset:
            return
        if offset > self.end_offset:
            raise OffsetOutOfRangeError(
                f"cannot start the log at {offset}, past its end {self.end_offset}"
            )
        index = self._boundary_index(offset)
        if index > 0:
            self._start_epoch = self._batches[index - 1].epoch
        del self._batches[:index]
        del self._base_offsets[:index]
        self._start_offset = offset
        self._epochs = _epochs_of(self._batches)
        self._flushed_offset = max(self._flushed_offset, offset)

    # --- Driver and simulation -------------------------------------------------------

    def mark_flushed(self, offset: int) -> None:
        """Record that the entries below ``offset`` are durable (after an fsync)."""
        self._flushed_offset = max(self._flushed_offset, min(offset, self.end_offset))

    def crash(self, lose_unflushed: bool) -> None:
        """Simulate a crash: with ``lose_unflushed``, the entries above ``flushed_offset``
        are gone; otherwise they happened to reach the disk and are durable now."""
        if lose_unflushed:
            index = bisect.bisect_right(self._base_offsets, self._flushed_offset - 1)
            while index > 0 and self._batches[index - 1].next_offset > self._flushed_offset:
                index -= 1
            if index < len(self._batches):
                self.truncate_to(self._batches[index].base_offset)
        self._flushed_offset = self.end_offset

    def entry(self, offset: int) -> LogEntry:
        """The entry at ``offset``; raises ``OffsetOutOfRangeError`` if the log lacks it."""
        if not self._start_offset <= offset < self.end_offset:
            raise OffsetOutOfRangeError(
                f"offset {offset} is outside the log [{self._start_offset}, {self.end_offset})"
            )
        batch = self._batches[self._batch_index(offset)]
        delta = offset - batch.base_offset
        return LogEntry(offset, batch.epoch, batch.values[delta], batch.is_control)

    def entries(self, start: int | None = None, end: int | None = None) -> list[LogEntry]:
        """The entries in ``[start, end)``, by default the whole log."""
        start = self._start_offset if start is None else max(start, self._start_offset)
        end = self.end_offset if end is None else min(end, self.end_offset)
        out: list[LogEntry] = []
        if start >= end:
            return out
        for batch in self._batches[self._batch_index(start) :]:
            if batch.base_offset >= end:
                break
            for delta, value in enumerate(batch.values):
                offset = batch.base_offset + delta
                if start <= offset < end:
                    out.append(LogEntry(offset, batch.epoch, value, batch.is_control))
        return out

    def __repr__(self) -> str:
        return (
            f"InMemoryRaftLog(start={self._start_offset}, end={self.end_offset}, "
            f"last_epoch={self.last_epoch}, flushed={self._flushed_offset})"
        )

    # --- Internals -------------------------------------------------------------------

    def _append(self, batch: _Batch) -> None:
        if not self._epochs or self._epochs[-1][0] != batch.epoch:
            self._epochs.append((batch.epoch, batch.base_offset))
        self._batches.append(batch)
        self._base_offsets.append(batch.base_offset)

    def _batch_index(self, offset: int) -> int:
        """The index of the batch holding ``offset`` (``len`` at the log end)."""
        if offset >= self.end_offset:
            return len(self._batches)
        return bisect.bisect_right(self._base_offsets, offset) - 1

    def _boundary_index(self, offset: int) -> int:
        """The index of the batch starting at ``offset``; raises if it is not a boundary."""
        if offset == self.end_offset:
            return len(self._batches)
        index = bisect.bisect_left(self._base_offsets, offset)
        if index == len(self._base_offsets) or self._base_offsets[index] != offset:
            raise ValueError(f"offset {offset} is not a batch boundary")
        return index


def _epoch_of(entry: tuple[int, int]) -> int:
    return entry[0]


def _epochs_of(batches: Sequence[_Batch]) -> list[tuple[int, int]]:
    epochs: list[tuple[int, int]] = []
    for batch in batches:
        if not epochs or epochs[-1][0] != batch.epoch:
            epochs.append((batch.epoch, batch.base_offset))
    return epochs
