"""Idempotent producer state of one partition: sequence/epoch validation, duplicates, snapshots.

This is Kafka's ``ProducerStateManager`` without transactions. For every producer id that
has written to the partition it remembers the epoch and the metadata of the last
:data:`NUM_BATCHES_TO_RETAIN` batches, which is what lets the leader

* reject a batch from a fenced (older) epoch or with a gap in its sequence numbers, and
* recognise a retried batch it already appended and answer with the original offsets
  instead of writing the records twice.

The state is a pure function of the log: the log calls :meth:`ProducerStateManager.update`
for every batch it appends, snapshots it to ``<offset>.snapshot`` files next to the
segments, and after a restart or a truncation rebuilds it by loading the newest usable
snapshot and replaying the batches above it with :attr:`AppendOrigin.REPLICATION`.
"""

from __future__ import annotations

import enum
import logging
import os
import re
import struct
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from highwater.errors import (
    CorruptCheckpointError,
    DuplicateSequenceError,
    InvalidProducerEpochError,
    OutOfOrderSequenceError,
    UnknownProducerIdError,
)
from highwater.records.header import NO_SEQUENCE, BatchHeader, crc32c
from highwater.storage.checkpoint import TMP_SUFFIX, fsync_dir, write_atomically

__all__ = [
    "MAX_SEQUENCE",
    "NUM_BATCHES_TO_RETAIN",
    "SNAPSHOT_SUFFIX",
    "SNAPSHOT_VERSION",
    "AppendOrigin",
    "BatchMetadata",
    "DuplicateBatchError",
    "ProducerStateEntry",
    "ProducerStateManager",
    "decode_snapshot",
    "encode_snapshot",
    "in_sequence",
    "next_sequence",
    "read_snapshot",
    "snapshot_file_name",
]

log = logging.getLogger(__name__)

NUM_BATCHES_TO_RETAIN = 5
"""Batches remembered per producer: a producer has at most 5 requests in flight per partition."""

MAX_SEQUENCE = (1 << 31) - 1
"""Sequences are non-negative int32s; the one after ``MAX_SEQUENCE`` is 0."""

SNAPSHOT_SUFFIX = ".snapshot"
SNAPSHOT_VERSION = 1

_SNAPSHOT_NAME = re.compile(r"^(\d{20})\.snapshot$")

_PREFIX = struct.Struct(">hI")  # version, crc
_BODY_HEADER = struct.Struct(">qi")  # map end offset, producer count
_PRODUCER = struct.Struct(">qhqb")  # producer id, epoch, last timestamp, batch count
_BATCH = struct.Struct(">iiqiq")  # first seq, last seq, last offset, offset delta, timestamp


class AppendOrigin(enum.Enum):
    """Who is appending a batch, which decides how much of it is validated."""

    CLIENT = "client"
    """A producer's batch on the leader: epoch, sequence and duplicates are checked."""
    REPLICATION = "replication"
    """A follower copying the leader, or log recovery replaying the log: applied as it is."""
    COORDINATOR = "coordinator"
    """A coordinator writing to an internal topic: validated like a client."""


@dataclass(frozen=True, slots=True)
class BatchMetadata:
    """What is remembered of one appended batch: enough to recognise and answer a retry."""

    first_seq: int
    last_seq: int
    last_offset: int
    offset_delta: int
    timestamp: int

    @property
    def first_offset(self) -> int:
        return self.last_offset - self.offset_delta

    @classmethod
    def of(cls, header: BatchHeader) -> BatchMetadata:
        """The metadata of a batch whose offsets have been assigned."""
        return cls(
            first_seq=header.base_sequence,
            last_seq=header.last_sequence,
            last_offset=header.last_offset,
            offset_delta=header.last_offset_delta,
            timestamp=header.max_timestamp,
        )


@dataclass(slots=True)
class ProducerStateEntry:
    """The state of one producer id: its epoch and its last batches, oldest first."""

    producer_id: int
    producer_epoch: int
    batches: deque[BatchMetadata] = field(
        default_factory=lambda: deque(maxlen=NUM_BATCHES_TO_RETAIN)
    )
    last_timestamp: int = -1

    def __post_init__(self) -> None:
        if not isinstance(self.batches, deque) or self.batches.maxlen != NUM_BATCHES_TO_RETAIN:
            self.batches = deque(self.batches, maxlen=NUM_BATCHES_TO_RETAIN)

    @property
    def is_empty(self) -> bool:
        return not self.batches

    @property
    def first_seq(self) -> int:
        return self.batches[0].first_seq if self.batches else NO_SEQUENCE

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq if self.batches else NO_SEQUENCE

    @property
    def first_data_offset(self) -> int:
        return self.batches[0].first_offset if self.batches else -1

    @property
    def last_data_offset(self) -> int:
        return self.batches[-1].last_offset if self.batches else -1

    @property
    def last_offset_delta(self) -> int:
        return self.batches[-1].offset_delta if self.batches else 0

    def maybe_update_producer_epoch(self, producer_epoch: int) -> bool:
        """Move to ``producer_epoch``, forgetting the batches of the old one; True if it changed."""
        if producer_epoch == self.producer_epoch:
            return False
        self.producer_epoch = producer_epoch
        self.batches.clear()
        return True

    def add_batch(self, producer_epoch: int, batch: BatchMetadata) -> None:
        """Remember an appended batch, dropping the oldest one beyond the five kept."""
        self.maybe_update_producer_epoch(producer_epoch)
        self.batches.append(batch)
        self.last_timestamp = batch.timestamp

    def find_duplicate(self, first_seq: int, last_seq: int) -> BatchMetadata | None:
        """The cached batch with exactly this sequence range, if any."""
        for batch in self.batches:
            if batch.first_seq == first_seq and batch.last_seq == last_seq:
                return batch
        return None

    def copy(self) -> ProducerStateEntry:
        return ProducerStateEntry(
            self.producer_id, self.producer_epoch, deque(self.batches), self.last_timestamp
        )


class DuplicateBatchError(DuplicateSequenceError):
    """A retry of a batch that is already in the log; ``metadata`` holds its original offsets.

    A :class:`~highwater.errors.DuplicateSequenceError`, so code that only needs the error
    code catches it as such; the leader answers the produce request with success and
    ``metadata.first_offset`` as the base offset, without writing anything.
    """

    def __init__(self, producer_id: int, producer_epoch: int, metadata: BatchMetadata) -> None:
        super().__init__(
            f"producer {producer_id} epoch {producer_epoch}: batch with sequences "
            f"{metadata.first_seq}..{metadata.last_seq} is a duplicate of the batch at offsets "
            f"{metadata.first_offset}..{metadata.last_offset}"
        )
        self.producer_id = producer_id
        self.producer_epoch = producer_epoch
        self.metadata = metadata


def next_sequence(last_seq: int) -> int:
    """The sequence after ``last_seq``: sequences wrap from 2**31-1 to 0."""
    return 0 if last_seq == MAX_SEQUENCE else last_seq + 1


def in_sequence(last_seq: int, next_seq: int) -> bool:
    """Whether ``next_seq`` directly follows ``last_seq``."""
    return next_seq == next_sequence(last_seq)


def _is_tracked(header: BatchHeader) -> bool:
    # Control batches only exist for transactions, which Highwater does not implement.
    return header.has_producer_id and not header.is_control


def _validate(header: BatchHeader, entry: ProducerStateEntry | None) -> None:
    """Check one idempotent batch against its producer's current state (Kafka's rules)."""
    producer_id, epoch, first_seq = header.producer_id, header.producer_epoch, header.base_sequence
    if entry is None:
        if first_seq != 0:
            raise UnknownProducerIdError(
                f"producer {producer_id} is unknown to this partition (expired, or never in its "
                f"log) and its batch starts at sequence {first_seq}, not 0"
            )
        return
    if epoch < entry.producer_epoch:
        raise InvalidProducerEpochError(
            f"producer {producer_id}: epoch {epoch} is older than the current epoch "
            f"{entry.producer_epoch}"
        )
    if epoch > entry.producer_epoch:
        if first_seq != 0:
            raise OutOfOrderSequenceError(
                f"producer {producer_id}: the first batch of new epoch {epoch} (current "
                f"{entry.producer_epoch}) must start at sequence 0, received {first_seq}"
            )
        return
    duplicate = entry.find_duplicate(first_seq, header.last_sequence)
    if duplicate is not None:
        raise DuplicateBatchError(producer_id, epoch, duplicate)
    expected = 0 if entry.is_empty else next_sequence(entry.last_seq)
    if first_seq != expected:
        raise OutOfOrderSequenceError(
            f"producer {producer_id} epoch {epoch}: out of order sequence number, expected "
            f"{expected}, received {first_seq}"
        )


# --- Snapshot files --------------------------------------------------------------------


def snapshot_file_name(offset: int) -> str:
    """``00000000000000001234.snapshot``: the file holding the state at ``offset``."""
    return f"{offset:020d}{SNAPSHOT_SUFFIX}"


def encode_snapshot(map_end_offset: int, entries: Iterable[ProducerStateEntry]) -> bytes:
    """The bytes of a snapshot file (format: see :class:`ProducerStateManager`)."""
    ordered = sorted(entries, key=lambda e: e.producer_id)
    body = bytearray(_BODY_HEADER.pack(map_end_offset, len(ordered)))
    for entry in ordered:
        body += _PRODUCER.pack(
            entry.producer_id, entry.producer_epoch, entry.last_timestamp, len(entry.batches)
        )
        for b in entry.batches:
            body += _BATCH.pack(b.first_seq, b.last_seq, b.last_offset, b.offset_delta, b.timestamp)
    return _PREFIX.pack(SNAPSHOT_VERSION, crc32c(body)) + bytes(body)


def decode_snapshot(data: bytes, name: str) -> tuple[int, list[ProducerStateEntry]]:
    """Parse a snapshot into (map end offset, entries); :class:`CorruptCheckpointError` if bad.

    ``name`` (usually the file's path) is only used in error messages.
    """

    def corrupt(reason: str) -> CorruptCheckpointError:
        return CorruptCheckpointError(f"{name}: corrupt producer state snapshot: {reason}")

    if len(data) < _PREFIX.size + _BODY_HEADER.size:
        raise corrupt(f"{len(data)} bytes is too short")
    version, crc = _PREFIX.unpack_from(data, 0)
    if version != SNAPSHOT_VERSION:
        raise corrupt(f"unknown version {version}, expected {SNAPSHOT_VERSION}")
    body = memoryview(data)[_PREFIX.size :]
    actual = crc32c(body)
    if actual != crc:
        raise corrupt(f"CRC mismatch, stored {crc:#010x}, computed {actual:#010x}")
    try:
        offset, count = _BODY_HEADER.unpack_from(body, 0)
        if offset < 0 or count < 0:
            raise corrupt(f"negative offset {offset} or producer count {count}")
        pos = _BODY_HEADER.size
        entries: dict[int, ProducerStateEntry] = {}
        for _ in range(count):
            producer_id, epoch, last_timestamp, batch_count = _PRODUCER.unpack_from(body, pos)
            pos += _PRODUCER.size
            if producer_id < 0 or producer_id in entries:
                raise corrupt(f"invalid or repeated producer id {producer_id}")
            if not 0 <= batch_count <= NUM_BATCHES_TO_RETAIN:
                raise corrupt(f"producer {producer_id} has {batch_count} batches")
            entry = ProducerStateEntry(producer_id, epoch, last_timestamp=last_timestamp)
            for _ in range(batch_count):
                batch = BatchMetadata(*_BATCH.unpack_from(body, pos))
                pos += _BATCH.size
                if batch.offset_delta < 0 or not 0 <= batch.first_offset <= batch.last_offset:
                    raise corrupt(f"producer {producer_id} has a batch with bad offsets {batch}")
                if batch.last_offset >= offset:
                    raise corrupt(
                        f"producer {producer_id} has a batch ending at {batch.last_offset}, "
                        f"at or above the snapshot offset {offset}"
                    )
                entry.batches.append(batch)
            entries[producer_id] = entry
    except struct.error as e:
        raise corrupt(f"truncated: {e}") from None
    if pos != len(body):
        raise corrupt(f"{len(body) - pos} unexpected bytes after the last producer")
    return offset, list(entries.values())


def read_snapshot(path: Path) -> tuple[int, list[ProducerStateEntry]]:
    """Read and check one snapshot file; its offset must match its name."""
    offset, entries = decode_snapshot(path.read_bytes(), str(path))
    match = _SNAPSHOT_NAME.match(path.name)
    if match is not None and int(match.group(1)) != offset:
        raise CorruptCheckpointError(
            f"{path}: corrupt producer state snapshot: holds offset {offset}, "
            f"the file name says {int(match.group(1))}"
        )
    return offset, entries


def _remove_temp_files(directory: Path) -> None:
    """Delete snapshots a crash left half written."""
    if not directory.is_dir():
        return
    for name in os.listdir(directory):
        if name.endswith(SNAPSHOT_SUFFIX + TMP_SUFFIX):
            (directory / name).unlink(missing_ok=True)


# --- The manager -----------------------------------------------------------------------


class ProducerStateManager:
    """The producer state of one partition and its snapshot files.

    Usage by the log: before writing a batch as leader, :meth:`check_append` (which raises
    :class:`DuplicateBatchError` for a retry that is already in the log); after writing any
    batch, leader or follower, :meth:`update` with the header carrying its final offsets.
    On a segment roll or a clean shutdown, :meth:`take_snapshot`. On startup,
    :meth:`load`, then replay the log from the offset it returns with
    ``update(header, AppendOrigin.REPLICATION)``; after a truncation, the same with
    :meth:`truncate_and_reload`. When the log start moves (retention, DeleteRecords),
    :meth:`on_log_start_offset_incremented`. Nothing here reads a clock (the caller passes
    the time) or starts a thread; the snapshot directory is the only I/O.

    Validation follows Kafka's classic rules for idempotent producers: an unknown producer
    must start at sequence 0 (else ``UNKNOWN_PRODUCER_ID``, and the client resets), an
    older epoch is fenced (``INVALID_PRODUCER_EPOCH``), a newer epoch must start at 0 and
    replaces the old epoch's batches, and within an epoch a batch must continue the last
    sequence (``OUT_OF_ORDER_SEQUENCE_NUMBER``) unless it repeats one of the last five
    batches exactly, which makes it a duplicate. Sequences wrap from 2**31-1 to 0.
    Batches without a producer id, and control batches, are not tracked.

    Producers are forgotten only when idle for ``producer_id_expiration_ms``
    (:meth:`remove_expired_producers`, which the log runs at each retention check), never
    because the log start moved past their last batch: since KIP-360 Kafka keeps them
    (``onLogStartOffsetIncremented`` evicts nothing), so that a producer whose records were
    deleted by retention or DeleteRecords still has its retry recognised as a duplicate
    and its next batch accepted, instead of the retry written twice and the next batch
    refused ``UNKNOWN_PRODUCER_ID``.

    Snapshot file ``<20-digit map end offset>.snapshot``, version 1, big-endian::

        size  field
           2  version                 1
           4  crc                     CRC-32C (uint32) of every byte after this field
           8  map_end_offset          the state covers offsets below it; equals the name
           4  producer_count
        producer_count times, by ascending producer id:
           8  producer_id
           2  producer_epoch
           8  last_timestamp
           1  batch_count             0..5
           batch_count times, oldest first:
              4  first_seq
              4  last_seq
              8  last_offset
              4  offset_delta         last_offset - first offset of the batch
              8  timestamp            the batch's max timestamp

    Unlike Kafka's snapshot (which keeps one batch per producer), all five batches are
    kept, so duplicate detection is as good after a restart as before it. A snapshot
    that fails its checks raises :class:`~highwater.errors.CorruptCheckpointError`;
    :meth:`load` deletes such a file with a warning and falls back to an older one or to
    the log start, since the state can always be rebuilt from the log.
    """

    def __init__(self, directory: Path | None, producer_id_expiration_ms: int = 86_400_000) -> None:
        self.directory = directory
        self.producer_id_expiration_ms = producer_id_expiration_ms
        self._producers: dict[int, ProducerStateEntry] = {}
        self._map_end_offset = 0
        # The offset whose state is already what a restart would load (a snapshot file
        # written or loaded there, or the empty state at the log start that load() falls
        # back to): take_snapshot() at that offset has nothing new to write.
        self._durable_offset: int | None = 0

    # --- State ---------------------------------------------------------------------------

    @property
    def map_end_offset(self) -> int:
        """The offset after the last batch applied: the state reflects the log below it."""
        return self._map_end_offset

    @property
    def active_producers(self) -> Mapping[int, ProducerStateEntry]:
        """A read-only view of producer id -> entry."""
        return MappingProxyType(self._producers)

    def last_entry(self, producer_id: int) -> ProducerStateEntry | None:
        return self._producers.get(producer_id)

    @property
    def is_empty(self) -> bool:
        return not self._producers

    # --- Appends -------------------------------------------------------------------------

    def check_append(self, header: BatchHeader, origin: AppendOrigin) -> None:
        """Validate one batch before it is written; changes nothing.

        Raises :class:`~highwater.errors.UnknownProducerIdError`,
        :class:`~highwater.errors.InvalidProducerEpochError`,
        :class:`~highwater.errors.OutOfOrderSequenceError`, or :class:`DuplicateBatchError`
        (a :class:`~highwater.errors.DuplicateSequenceError` carrying the original batch).
        Replicated batches and batches without a producer id always pass.
        """
        self.check_appends((header,), origin)

    def check_appends(self, headers: Iterable[BatchHeader], origin: AppendOrigin) -> None:
        """Validate batches to be written together, each against the state the earlier ones leave.

        For a produce request carrying several batches of one producer: the second must
        continue the first even though the first is not applied yet.
        """
        if origin is AppendOrigin.REPLICATION:
            return
        pending: dict[int, ProducerStateEntry] = {}
        for header in headers:
            if not _is_tracked(header):
                continue
            producer_id = header.producer_id
            entry = pending.get(producer_id)
            if entry is None:
                entry = self._producers.get(producer_id)
            _validate(header, entry)
            updated = (
                entry.copy()
                if entry is not None
                else ProducerStateEntry(producer_id, header.producer_epoch)
            )
            updated.add_batch(header.producer_epoch, BatchMetadata.of(header))
            pending[producer_id] = updated

    def update(self, header: BatchHeader, origin: AppendOrigin) -> None:
        """Apply a batch that has been appended (offsets assigned); never validates.

        Call it for every batch, tracked or not: it advances :attr:`map_end_offset` to the
        batch's next offset. ``origin`` does not change what is applied; the log validates
        client batches with :meth:`check_append` before writing them.
        """
        del origin  # applied the same way whoever appended the batch
        if _is_tracked(header):
            entry = self._producers.get(header.producer_id)
            if entry is None:
                entry = ProducerStateEntry(header.producer_id, header.producer_epoch)
                self._producers[header.producer_id] = entry
            entry.add_batch(header.producer_epoch, BatchMetadata.of(header))
        self._map_end_offset = header.next_offset

    def remove_expired_producers(self, now_ms: int) -> list[int]:
        """Forget producers idle for ``producer_id_expiration_ms``; returns their ids."""
        expired = [
            producer_id
            for producer_id, entry in self._producers.items()
            if self._is_expired(entry, now_ms)
        ]
        for producer_id in expired:
            del self._producers[producer_id]
        return expired

    def _is_expired(self, entry: ProducerStateEntry, now_ms: int) -> bool:
        """Kafka's ``isProducerExpired``: idle since its last batch's max timestamp."""
        return now_ms - entry.last_timestamp >= self.producer_id_expiration_ms

    def on_log_start_offset_incremented(self, new_log_start_offset: int) -> None:
        """The log start moved up (retention, DeleteRecords): keep every producer.

        Kafka's ``onLogStartOffsetIncremented``: only the map's start moves (to the new log
        start, if the map ended below it) and the snapshots below it are deleted; a
        producer whose last batch is gone stays until it expires (class docstring).
        """
        self._map_end_offset = max(self._map_end_offset, new_log_start_offset)
        self.delete_snapshots_below(new_log_start_offset)

    def advance_map_end_offset(self, offset: int) -> None:
        """Record that the log now ends at ``offset`` through batches without a producer id.

        The log calls :meth:`update` only for batches of idempotent producers, and this
        before a snapshot, so that a snapshot is named after the log end it reflects.
        """
        self._map_end_offset = max(self._map_end_offset, offset)

    def truncate_fully_and_start_at(self, offset: int) -> None:
        """The whole log was replaced (a follower far behind): drop all state and snapshots."""
        self._producers.clear()
        self._delete_snapshots(self.snapshot_offsets())
        self._map_end_offset = offset
        self._durable_offset = offset  # the log starts here now: load() falls back to it

    # --- Snapshots -----------------------------------------------------------------------

    def prepare_snapshot(self) -> tuple[int, bytes]:
        """The snapshot of the state now, as (offset, file contents), to write later."""
        return self._map_end_offset, encode_snapshot(self._map_end_offset, self._producers.values())

    def write_snapshot(self, offset: int, data: bytes) -> Path | None:
        """Write a snapshot made by :meth:`prepare_snapshot` (in a worker thread, say)."""
        if self.directory is None:
            return None
        path = self.directory / snapshot_file_name(offset)
        write_atomically(path, data)
        if offset == self._map_end_offset:
            self._durable_offset = offset
        return path

    def take_snapshot(self) -> Path | None:
        """Write the state at :attr:`map_end_offset` to its snapshot file, atomically,
        unless a restart would already load this state: a snapshot written or loaded at
        this offset, or an empty state at the log start (as Kafka's ``takeSnapshot``
        writes only when the map end moved past the last snapshot). A broker closing a
        thousand idle partitions then writes nothing for them.

        Returns the file written, or None when nothing was (or there is no directory).
        """
        if self.directory is None or self._durable_offset == self._map_end_offset:
            return None
        path = self.directory / snapshot_file_name(self._map_end_offset)
        write_atomically(path, encode_snapshot(self._map_end_offset, self._producers.values()))
        self._durable_offset = self._map_end_offset
        return path

    def snapshot_offsets(self) -> list[int]:
        """Offsets of the snapshot files in the directory, ascending."""
        if self.directory is None or not self.directory.is_dir():
            return []
        offsets = []
        for name in os.listdir(self.directory):
            match = _SNAPSHOT_NAME.match(name)
            if match is not None:
                offsets.append(int(match.group(1)))
        return sorted(offsets)

    def latest_snapshot_offset(self) -> int | None:
        offsets = self.snapshot_offsets()
        return offsets[-1] if offsets else None

    def oldest_snapshot_offset(self) -> int | None:
        offsets = self.snapshot_offsets()
        return offsets[0] if offsets else None

    def delete_snapshots_below(self, offset: int) -> None:
        self._delete_snapshots(o for o in self.snapshot_offsets() if o < offset)

    def load(self, log_start_offset: int, log_end_offset: int) -> int:
        """Replace the state with the newest usable snapshot in [log start, log end].

        Snapshots above ``log_end_offset`` (left by a truncation) and below
        ``log_start_offset`` are deleted, as are corrupt ones (with a warning). Every
        producer of the snapshot is kept, whether or not its last batch lies below the log
        start (Kafka's ``loadFromSnapshot`` also skips those already expired; here they go
        at the log's next expiration check). Returns the snapshot's offset, or
        ``log_start_offset`` with an empty state if there is none: the caller replays the
        log from there with ``update(header, AppendOrigin.REPLICATION)``. A log start above
        the log end (a truncation to a batch boundary below a log start inside that batch)
        leaves no snapshot usable, as in Kafka, rather than raising.
        """
        self._producers.clear()
        self._map_end_offset = log_start_offset
        self._durable_offset = log_start_offset  # what load() falls back to without a file
        if self.directory is None:
            return log_start_offset
        _remove_temp_files(self.directory)
        offsets = self.snapshot_offsets()
        self._delete_snapshots(o for o in offsets if not log_start_offset <= o <= log_end_offset)
        for offset in reversed([o for o in offsets if log_start_offset <= o <= log_end_offset]):
            path = self.directory / snapshot_file_name(offset)
            try:
                _, entries = read_snapshot(path)
            except CorruptCheckpointError as error:
                log.warning("ignoring producer state snapshot, rebuilding from the log: %s", error)
                self._delete_snapshots((offset,))
                continue
            self._producers = {e.producer_id: e for e in entries}
            self._map_end_offset = offset
            self._durable_offset = offset
            return offset
        return log_start_offset

    def truncate_and_reload(self, log_start_offset: int, log_end_offset: int) -> int:
        """The log was truncated to ``log_end_offset``: drop the state and :meth:`load` again.

        Snapshots above the new end describe records that no longer exist and are deleted.
        Returns the offset to replay the log from.
        """
        return self.load(log_start_offset, log_end_offset)

    def _delete_snapshots(self, offsets: Iterable[int]) -> None:
        if self.directory is None:
            return
        deleted = False
        for offset in offsets:
            (self.directory / snapshot_file_name(offset)).unlink(missing_ok=True)
            deleted = True
            if offset == self._durable_offset:
                self._durable_offset = None
        if deleted:
            # A deleted snapshot that came back after a crash could be at an offset the
            # log reaches again with different records: make the deletion durable.
            fsync_dir(self.directory)
