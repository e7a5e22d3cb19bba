"""The log of one partition: an ordered list of segments with offsets, epochs and producer state.

``PartitionLog`` is what a broker holds per partition replica. It assigns offsets to
appends from producers (``append_as_leader``), accepts already-offset batches from the
leader (``append_as_follower``), serves reads by offset or timestamp, truncates for
replication, rolls segments, applies retention and moves the log start offset.

Offsets it tracks::

    log_start_offset <= first record kept ... recovery_point <= log_end_offset
    (high watermark lives in [log_start_offset, log_end_offset])

* ``log_end_offset`` (LEO): the offset the next appended record gets.
* ``recovery_point``: everything below it is fsynced; recovery after a crash re-checks only
  the segments from there on.
* ``high_watermark``: kept here (as Kafka's ``UnifiedLog`` does) so that it is
  checkpointed with the log, but moved only by the replication layer.

**A failed disk takes the log offline** (Kafka's ``maybeHandleIOException``): an I/O error
(an ``OSError``, or a :class:`~highwater.errors.KafkaStorageError` caused by one) in an
append, a read, a roll, a flush, a truncation or retention marks the log ``offline``,
calls ``on_io_error`` (the log manager takes the whole log directory offline) and is
raised as ``KafkaStorageError``; every later call of those methods is refused the same
way, so a log whose files may be half-written is never read or written again by this
process. Corrupt data (:class:`~highwater.errors.CorruptSegmentError`) is not an I/O
failure and does not take the log offline.

fsync never runs on the caller's thread unless asked: :meth:`flush` is meant to be run in a
worker thread (see :mod:`highwater.storage.log_manager`), and only it and truncation take
the log's flush lock.
"""

from __future__ import annotations

import bisect
import contextlib
import errno
import functools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Concatenate, Final, NamedTuple, NoReturn, ParamSpec, TypeVar

from highwater.config.topic import LogConfig
from highwater.errors import (
    CorruptCheckpointError,
    CorruptRecordError,
    CorruptSegmentError,
    InvalidRecordError,
    InvalidTimestampError,
    KafkaStorageError,
    OffsetOutOfRangeError,
    RecordListTooLargeError,
    RecordTooLargeError,
    UnexpectedAppendOffsetError,
)
from highwater.records.batch import build_batch_of_records, iter_batches
from highwater.records.header import (
    BATCH_HEADER_SIZE,
    CONTROL_FLAG,
    LOG_OVERHEAD,
    TIMESTAMP_TYPE_MASK,
    BatchHeader,
    Compression,
    check_batch,
    set_max_timestamp,
    stamp_batches,
    stamped_header,
)
from highwater.records.implementation import codec
from highwater.records.record import NO_TIMESTAMP, NO_TIMESTAMPS, check_records
from highwater.storage.leader_epoch import LeaderEpochCache
from highwater.storage.producer_state import (
    AppendOrigin,
    DuplicateBatchError,
    ProducerStateManager,
)
from highwater.storage.retention import SegmentSummary, deletable_segments
from highwater.storage.segment import DELETED_SUFFIX, LogSegment, SegmentRead
from highwater.storage.topic_partition import TopicPartition

log = logging.getLogger(__name__)

_P = ParamSpec("_P")
_R = TypeVar("_R")

IoErrorHandler = Callable[["PartitionLog", BaseException], None]
"""Told when a log meets an I/O error (the log manager takes its directory offline)."""


DISK_FAILURE_ERRNOS: Final = frozenset(
    {
        errno.EIO,
        errno.EROFS,
        errno.ENOTDIR,
        errno.ENOENT,
        errno.EACCES,
        errno.EPERM,
        errno.ENXIO,
        errno.ENODEV,
        errno.ESTALE,
    }
)
"""The errors that mean the directory or its disk failed. Not among them: running out of
a process's resources (EMFILE, EFBIG, ENOMEM), which a write undoes cleanly and which pass,
and a full disk (ENOSPC): its appends fail one by one and the directory serves again once
space is freed (Kafka takes it offline; the chaos campaign's disk-full fault relies on
recovering)."""


def is_io_failure(error: BaseException) -> bool:
    """Whether ``error`` is the disk failing (not bad data, not a passing shortage): an
    ``OSError`` with an errno of :data:`DISK_FAILURE_ERRNOS`, or a ``KafkaStorageError``
    raised because of one."""
    if isinstance(error, CorruptSegmentError | CorruptCheckpointError):
        return False
    if isinstance(error, KafkaStorageError):
        error = error.__cause__  # type: ignore[assignment]
    return isinstance(error, OSError) and error.errno in DISK_FAILURE_ERRNOS


def _guards_io(
    method: Callable[Concatenate[PartitionLog, _P], _R],
) -> Callable[Concatenate[PartitionLog, _P], _R]:
    """Refuse calls on an offline log; take the log offline on an I/O error (see the
    module docstring)."""

    @functools.wraps(method)
    def guarded(self: PartitionLog, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        self._refuse_if_offline()
        try:
            return method(self, *args, **kwargs)
        except (OSError, KafkaStorageError) as e:
            self._io_failed(e)

    return guarded


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class AppendInfo(NamedTuple):
    """What an append did: the offsets it assigned and the timestamps it kept."""

    first_offset: int
    last_offset: int
    max_timestamp: int
    offset_of_max_timestamp: int
    log_append_time: int  # -1 unless the topic uses LogAppendTime
    log_start_offset: int
    records_count: int
    valid_bytes: int
    duplicate: bool = False  # an idempotent retry: nothing written, offsets are the original


if codec is not None:
    # A leader's compiled append (stamp_batches) returns its AppendInfo made in C.
    codec.bind(append_info_type=AppendInfo)


@dataclass(frozen=True, slots=True)
class FetchData:
    """Whole batches read from the log, and the log's bounds at the time of the read."""

    records: bytes
    first_offset: int  # base offset of the first batch (may precede the requested offset)
    next_offset: int  # where the next read continues
    log_start_offset: int
    log_end_offset: int

    @classmethod
    def empty(cls, offset: int, log_start_offset: int, log_end_offset: int) -> FetchData:
        return cls(b"", offset, offset, log_start_offset, log_end_offset)


@dataclass(slots=True)
class PendingDeletion:
    """Segments renamed ``.deleted``, to be removed from disk once ``due_ms`` has passed."""

    due_ms: int
    segments: list[LogSegment] = field(default_factory=list)


class _AppendLimits(NamedTuple):
    """What a leader's append reads of the topic config, read once per config object (a
    config change replaces :attr:`PartitionLog.config` whole): an append reads one tuple
    instead of a property and eight attributes."""

    config: LogConfig
    compacted: bool  # keys are checked record by record: the reference path
    log_append_time: bool
    max_message_bytes: int
    segment_bytes: int
    before_ms: int
    after_ms: int
    roll_after_ms: int
    recompress_to: Compression | None  # compression.type, None for "producer"

    @classmethod
    def of(cls, config: LogConfig) -> _AppendLimits:
        target = config.compression_type
        return cls(
            config,
            config.compact,
            config.message_timestamp_type == "LogAppendTime",
            config.max_message_bytes,
            config.segment_bytes,
            config.message_timestamp_before_max_ms,
            config.message_timestamp_after_max_ms,
            config.segment_ms - config.segment_jitter_ms,
            None if target == "producer" else _TOPIC_COMPRESSION[target],
        )


_TOPIC_COMPRESSION: Final = {
    "uncompressed": Compression.NONE,
    "gzip": Compression.GZIP,
    "snappy": Compression.SNAPPY,
    "lz4": Compression.LZ4,
    "zstd": Compression.ZSTD,
}
"""The codec a topic's ``compression.type`` stores its batches in (all but ``producer``)."""


def recompressed(data: bytes | bytearray | memoryview, target: Compression) -> bytes | None:
    """``data``'s batches with their records in ``target``'s compression, as a topic whose
    ``compression.type`` is not ``producer`` stores them (Kafka's ``LogValidator``: a batch
    whose codec is not the target's is rebuilt with it); None when every batch already is.

    Each rebuilt batch keeps every header field (offsets, timestamps, producer id, epoch
    and sequence, transactional flag) and gets a new length and CRC; its CRC is checked
    first, so a damaged batch is refused, not given a valid CRC. The checks of the append
    then judge the rebuilt batches (``max.message.bytes`` applies to what is stored).

    :raises CorruptRecordError: a batch that is damaged or does not decompress.
    """
    batches = list(iter_batches(data))
    if all(batch.compression is target for batch in batches):
        return None
    out = bytearray()
    for batch in batches:
        if batch.compression is target:
            out += batch.view()
            continue
        payload, start, end = batch.records_payload()
        out += build_batch_of_records(
            bytes(memoryview(payload)[start:end]),
            batch.records_count,
            base_offset=batch.base_offset,
            last_offset_delta=batch.last_offset_delta,
            base_timestamp=batch.base_timestamp,
            max_timestamp=batch.max_timestamp,
            compression=target,
            timestamp_type=batch.timestamp_type,
            producer_id=batch.producer_id,
            producer_epoch=batch.producer_epoch,
            base_sequence=batch.base_sequence,
            partition_leader_epoch=batch.partition_leader_epoch,
            is_transactional=batch.is_transactional,
            delete_horizon_ms=batch.delete_horizon_ms,
        )
    return bytes(out)


class PartitionLog:
    """One partition replica's log. Not thread-safe: one owner thread, except :meth:`flush`."""

    def __init__(
        self,
        directory: Path,
        topic_partition: TopicPartition,
        config: LogConfig,
        segments: list[LogSegment],
        *,
        log_start_offset: int,
        recovery_point: int,
        leader_epoch_cache: LeaderEpochCache,
        producer_state: ProducerStateManager,
        clock: Callable[[], int] = wall_clock_ms,
    ) -> None:
        assert segments, "a log always has an active segment"
        self.directory = directory
        self.topic_partition = topic_partition
        self.config = config
        self._segments = segments
        self._base_offsets = [s.base_offset for s in segments]
        self.log_start_offset = log_start_offset
        self.recovery_point = recovery_point
        self.leader_epoch_cache = leader_epoch_cache
        self.producer_state = producer_state
        self.clock = clock
        self.high_watermark = log_start_offset
        self._log_end_offset = segments[-1].next_offset
        self._latest_epoch = -1
        self._refresh_latest_epoch()
        self._flush_lock = threading.Lock()
        self._last_flush_ms = clock()
        self._roll_flush_offset = recovery_point
        self._pending_deletions: list[PendingDeletion] = []
        self._pending_snapshots: list[tuple[int, bytes]] = []
        self._closed = False
        self._deleted = False
        self._append_limits = _AppendLimits.of(config)
        self.offline = False
        """Set by an I/O error: the log takes no more reads or writes (module docstring)."""
        self.on_io_error: IoErrorHandler | None = None
        self.high_watermark = min(max(self.high_watermark, log_start_offset), self._log_end_offset)
        self.lost_high_watermark: int | None = None
        """Set by recovery when the log came back shorter than the high watermark this
        replica had checkpointed: the records up to it were committed and this copy lost
        them (a torn or unflushed tail). Cleared once appends bring the log end back up to
        it (:attr:`missing_committed_records`)."""

    @property
    def high_watermark_to_checkpoint(self) -> int:
        """What the ``replication-offset-checkpoint`` keeps: the high watermark, or, while
        this replica lacks committed records, the one it lost them below, so that one more
        crash before it has them again does not make it forget that it lacks them."""
        if self.missing_committed_records:
            assert self.lost_high_watermark is not None
            return self.lost_high_watermark
        return self.high_watermark

    @property
    def missing_committed_records(self) -> bool:
        """Whether this replica lacks committed records it once had
        (:attr:`lost_high_watermark`): it must not lead nor count in the ISR until it has
        fetched them again, or the followers would truncate them away."""
        lost = self.lost_high_watermark
        return lost is not None and self._log_end_offset < lost

    # -- offsets and segments ---------------------------------------------------------

    @property
    def log_end_offset(self) -> int:
        return self._log_end_offset

    @property
    def segments(self) -> tuple[LogSegment, ...]:
        return tuple(self._segments)

    @property
    def active_segment(self) -> LogSegment:
        return self._segments[-1]

    @property
    def size(self) -> int:
        return sum(s.size for s in self._segments)

    @property
    def unflushed_messages(self) -> int:
        return self._log_end_offset - self.recovery_point

    def _segment_index_for(self, offset: int) -> int:
        """Index of the segment whose base offset is the largest at or below ``offset``."""
        return max(0, bisect.bisect_right(self._base_offsets, offset) - 1)

    def _refuse_if_offline(self) -> None:
        if self.offline:
            raise KafkaStorageError(
                f"{self.topic_partition}: its log directory {self.directory.parent} is offline"
            )

    def _io_failed(self, e: OSError | KafkaStorageError) -> NoReturn:
        """Re-raise ``e``; an I/O failure first takes the log offline (see the module
        docstring), and is raised as ``KafkaStorageError``."""
        if self.offline or not is_io_failure(e):
            raise e  # bad data; or a nested guarded call (a roll in an append) reported it
        self.offline = True
        log.error("%s: I/O error, the log goes offline: %s", self.topic_partition, e)
        if self.on_io_error is not None:
            self.on_io_error(self, e)
        if isinstance(e, KafkaStorageError):
            raise e
        raise KafkaStorageError(f"{self.topic_partition}: I/O error: {e}") from e

    def _refresh_latest_epoch(self) -> None:
        latest = self.leader_epoch_cache.latest_epoch
        self._latest_epoch = -1 if latest is None else latest

    @_guards_io
    def assign_epoch_start(self, epoch: int, start_offset: int) -> None:
        """Record that leader ``epoch`` starts at ``start_offset`` (a new leader's epoch,
        before any record of it: Kafka's ``makeLeader``).

        Changes to the leader-epoch cache go through the log: an append assigns a batch's
        epoch only when it is newer than the latest the log knows, so a cache changed
        behind the log's back would leave the next append of that epoch unrecorded, the
        follower's fetches naming an older epoch, and the leader cutting its committed
        batches as diverging (seeds 100, 104 and 128 of docs/simulation.md).

        It writes the leader-epoch file: a failed disk takes the log offline here too.
        """
        self.leader_epoch_cache.assign(epoch, start_offset)
        self._refresh_latest_epoch()

    @_guards_io
    def forget_epochs_from(self, end_offset: int) -> None:
        """Forget the leader epochs that start at or past ``end_offset``: they hold no
        record of this log (an epoch this replica led without appending in it, or one a
        failed append recorded before its write failed)."""
        self.leader_epoch_cache.truncate_from_end(end_offset)
        self._refresh_latest_epoch()

    def update_high_watermark(self, offset: int) -> int:
        """Set the high watermark, clamped to [log start offset, log end offset]."""
        self.high_watermark = min(max(offset, self.log_start_offset), self._log_end_offset)
        return self.high_watermark

    # -- appends ----------------------------------------------------------------------

    def append_as_leader(
        self,
        data: bytes | bytearray | memoryview,
        leader_epoch: int,
        *,
        origin: AppendOrigin = AppendOrigin.CLIENT,
    ) -> AppendInfo:
        """Validate client batches, assign offsets, stamp the leader epoch and append them.

        The record bytes are not re-encoded: each batch's header is stamped (base offset
        and partition leader epoch lie outside the CRC). A duplicate retry of an idempotent
        producer's batch writes nothing and returns the offsets the first attempt got.

        With the compiled codec one call (:data:`~highwater.records.header.stamp_batches`)
        makes every check of the batches and returns their stamped 61-byte headers, which
        one ``writev`` appends each beside the rest of its batch, taken from ``data``
        without a copy (a 1 MiB batch is not copied in memory), and the append's
        :class:`AppendInfo`, made in C; header tuples only where they are read (several
        batches, or a producer id). The Python left per append is the producer state (for
        batches with a producer id), the roll rules and the index bookkeeping. Batches it
        does not take (anything a check refuses), compacted topics (whose keys are checked
        record by record) and the pure-Python implementation go through
        :meth:`_append_checked`, the reference, which raises the typed errors. Guarded as
        :func:`_guards_io` does, inline (this is the hottest call of a broker).
        """
        if self.offline:
            self._refuse_if_offline()
        try:
            limits = self._append_limits
            if limits[0] is not self.config:
                limits = self._append_limits = _AppendLimits.of(self.config)
            # One unpacking instead of a field lookup per limit (this runs per append).
            (
                _,
                compacted,
                append_time,
                max_bytes,
                segment_bytes,
                before,
                after,
                roll_after,
                recompress_to,
            ) = limits
            if recompress_to is not None and origin is AppendOrigin.CLIENT:
                try:
                    rebuilt = recompressed(data, recompress_to)
                except CorruptRecordError as e:
                    raise InvalidRecordError(str(e)) from e
                if rebuilt is not None:
                    data = rebuilt
            now = self.clock()
            log_append_time = now if append_time else -1
            stamped = (
                None
                if compacted or stamp_batches is None
                else stamp_batches(
                    data,
                    self._log_end_offset,
                    leader_epoch,
                    max_bytes,
                    segment_bytes,
                    now,
                    before,
                    after,
                    log_append_time,
                    self.log_start_offset,
                )
            )
            if stamped is None:
                return self._append_checked(data, leader_epoch, origin, now, log_append_time)
            stamped_bytes, headers, info, tracked = stamped
            if tracked:
                try:
                    self.producer_state.check_appends(headers, origin)
                except DuplicateBatchError as duplicate:
                    if len(headers) == 1:
                        return self._duplicate_info(duplicate)
                    raise
            first_offset, last_offset = info.first_offset, info.last_offset
            if leader_epoch >= 0 and leader_epoch > self._latest_epoch:
                self.leader_epoch_cache.assign(leader_epoch, first_offset)
                self._latest_epoch = leader_epoch
            if type(data) is not bytes:
                data = memoryview(data).cast("B")  # a memoryview's len() is in items
            segment = self._segments[-1]
            if segment.should_roll(
                info.valid_bytes, last_offset, info.max_timestamp, segment_bytes, roll_after
            ):
                segment = self.roll(first_offset)
            segment.append_stamped(stamped_bytes, data, headers, last_offset, info.max_timestamp)
            self._log_end_offset = last_offset + 1
            if self.lost_high_watermark is not None and last_offset >= self.lost_high_watermark:
                self.lost_high_watermark = None
            if tracked:
                update = self.producer_state.update
                for header in headers:
                    if header[9] >= 0:
                        update(header, AppendOrigin.CLIENT)
            return info
        except (OSError, KafkaStorageError) as e:
            self._io_failed(e)

    def _append_checked(
        self,
        data: bytes | bytearray | memoryview,
        leader_epoch: int,
        origin: AppendOrigin,
        now: int,
        log_append_time: int,
    ) -> AppendInfo:
        """:meth:`append_as_leader` with each check made in Python: the reference, whose
        errors the compiled checks leave it to raise.

        The checks in Kafka's order (``analyzeAndValidateRecords``, ``LogValidator``, then
        ``UnifiedLog.append``): each batch's header, CRC and ``max.message.bytes``; what a
        client may not send (a control batch, a producer id without a sequence); each
        batch's record count against its offsets; every record of every batch
        (:meth:`_check_records`, with the timestamps); the keys of a compacted topic; and
        the whole append against ``segment.bytes``. Nothing is written unless all pass."""
        view = memoryview(data)
        config = self.config
        batches = self._validate(view, config.max_message_bytes)
        if origin is AppendOrigin.CLIENT:
            self._check_client_batches(batches)
        for _, header in batches:
            if header.records_count != header[6] + 1:  # last_offset_delta + 1
                raise InvalidRecordError(
                    f"{self.topic_partition}: batch declares {header.records_count} records but "
                    f"its offsets span {header[6] + 1}"
                )
        maxima = self._check_records(view, batches, now, log_append_time)
        if config.compact:
            self._check_keys(view, batches)
        self._check_append_size(len(view))
        next_offset = self._log_end_offset
        stamped: list[tuple[int, BatchHeader]] = []
        tracked = False
        for (position, header), max_timestamp in zip(batches, maxima, strict=True):
            if log_append_time >= 0:
                assigned = header._replace(
                    base_offset=next_offset,
                    partition_leader_epoch=leader_epoch,
                    attributes=header.attributes | TIMESTAMP_TYPE_MASK,
                    max_timestamp=log_append_time,
                )
            else:
                assigned = header._replace(
                    base_offset=next_offset,
                    partition_leader_epoch=leader_epoch,
                    max_timestamp=max_timestamp,
                )
            tracked = tracked or assigned.producer_id >= 0
            stamped.append((position, assigned))
            next_offset += header.records_count
        if tracked:
            try:
                self.producer_state.check_appends([h for _, h in stamped], origin)
            except DuplicateBatchError as duplicate:
                if len(stamped) == 1:
                    return self._duplicate_info(duplicate)
                raise
        if leader_epoch >= 0 and leader_epoch > self._latest_epoch:
            self.leader_epoch_cache.assign(leader_epoch, self._log_end_offset)
            self._latest_epoch = leader_epoch
        pieces, stamped = self._stamped_pieces(view, batches, stamped)
        return self._write(pieces, stamped, log_append_time)

    @_guards_io
    def append_as_follower(self, data: bytes | bytearray | memoryview) -> AppendInfo | None:
        """Append batches fetched from the leader, offsets and epochs as they are."""
        view = memoryview(data)
        if not len(view):
            return None
        batches = self._validate(view, max_batch_size=None)
        self._check_append_size(len(view))
        expected = self._log_end_offset
        for _, header in batches:
            if header.base_offset < expected:
                raise UnexpectedAppendOffsetError(
                    f"{self.topic_partition}: batch at offset {header.base_offset} does not "
                    f"continue the log, whose end offset is {expected}"
                )
            expected = header.next_offset
        for _, header in batches:
            epoch = header.partition_leader_epoch
            if epoch >= 0 and epoch > self._latest_epoch:
                self.leader_epoch_cache.assign(epoch, header.base_offset)
                self._latest_epoch = epoch
        return self._write([view], batches, -1)

    def _validate(
        self, view: memoryview, max_batch_size: int | None
    ) -> list[tuple[int, BatchHeader]]:
        batches: list[tuple[int, BatchHeader]] = []
        position, end = 0, len(view)
        if end == 0:
            raise InvalidRecordError(f"{self.topic_partition}: no record batch to append")
        while position < end:
            header = check_batch(view, position)
            size = header[1] + LOG_OVERHEAD
            if max_batch_size is not None and size > max_batch_size:
                raise RecordTooLargeError(
                    f"{self.topic_partition}: batch of {size} bytes exceeds "
                    f"max.message.bytes={max_batch_size}"
                )
            batches.append((position, header))
            position += size
        return batches

    def _check_append_size(self, size: int) -> None:
        """Kafka's ``UnifiedLog.append``: an append no segment can hold is refused whole."""
        segment_bytes = self.config.segment_bytes
        if size > segment_bytes:
            raise RecordListTooLargeError(
                f"{self.topic_partition}: append of {size} bytes exceeds "
                f"segment.bytes={segment_bytes}"
            )

    def _check_records(
        self,
        view: memoryview,
        batches: list[tuple[int, BatchHeader]],
        now: int,
        log_append_time: int,
    ) -> list[int]:
        """Walk every record of every batch, decompressing a compressed one, and return
        each batch's largest record timestamp (-1 if none has one).

        Kafka's ``LogValidator`` (``assignOffsetsNonCompressed``,
        ``validateMessagesAndAssignOffsetsCompressed``): a batch whose records are not what
        its header says is ``INVALID_RECORD`` (:func:`~highwater.records.record.check_records`
        has the rules), else it would be committed and fail every reader at its offset. A
        producer may not flag a batch LogAppendTime (``validateTimestamp``,
        ``INVALID_TIMESTAMP``), whatever the topic's timestamp type. With CreateTime each
        record's timestamp but NO_TIMESTAMP (-1) must lie in ``[now -
        message.timestamp.before.max.ms, now + message.timestamp.after.max.ms]``; the
        header's max timestamp is not trusted: the one returned is the records' (Kafka's
        ``maxBatchTimestamp``), which the append stamps (``setMaxTimestamp``).
        """
        before, after = (
            self.config.message_timestamp_before_max_ms,
            self.config.message_timestamp_after_max_ms,
        )
        from highwater.records.batch import RecordBatch

        maxima: list[int] = []
        for position, header in batches:
            if header.attributes & TIMESTAMP_TYPE_MASK:
                raise InvalidTimestampError(
                    f"{self.topic_partition}: a producer should not set the timestamp type "
                    f"to LogAppendTime (batch {len(maxima)})"
                )
            try:
                batch = RecordBatch(view[position : position + header.size], verify_crc=False)
                data, start, end = batch.records_payload()
                low, high = check_records(
                    data, start, end, header.records_count, header[6], header.base_timestamp
                )
            except CorruptRecordError as e:
                raise InvalidRecordError(
                    f"{self.topic_partition}: batch {len(maxima)} of the append: {e}"
                ) from None
            outside = now - low > before or high - now > after
            if log_append_time < 0 and (low, high) != NO_TIMESTAMPS and outside:
                raise InvalidTimestampError(
                    f"{self.topic_partition}: record timestamps {low}..{high} are outside "
                    f"[now - {before}, now + {after}] (now {now})"
                )
            maxima.append(max(high, NO_TIMESTAMP))
        return maxima

    def _check_client_batches(self, batches: list[tuple[int, BatchHeader]]) -> None:
        """Kafka's ``LogValidator.validateBatch`` for a client's batches: no control batch
        (only the log's own writers write transaction markers) and no producer id without
        a base sequence; both ``INVALID_RECORD``. The compiled append leaves both to this."""
        for _, header in batches:
            if header.attributes & CONTROL_FLAG:
                raise InvalidRecordError(
                    f"{self.topic_partition}: clients are not allowed to write control records"
                )
            if header.producer_id >= 0 and header.base_sequence < 0:
                raise InvalidRecordError(
                    f"{self.topic_partition}: invalid sequence number {header.base_sequence} "
                    f"in a record batch of producer {header.producer_id}"
                )

    def _check_keys(self, view: memoryview, batches: list[tuple[int, BatchHeader]]) -> None:
        from highwater.records.batch import RecordBatch

        for position, header in batches:
            batch = RecordBatch(view[position : position + header.size], verify_crc=False)
            for offset, key, _ in batch.iter_keys():
                if key is None:
                    raise InvalidRecordError(
                        f"{self.topic_partition}: compacted topic requires keys, the record at "
                        f"offset delta {offset - header.base_offset} has none"
                    )

    def _stamped_pieces(
        self,
        view: memoryview,
        batches: list[tuple[int, BatchHeader]],
        stamped: list[tuple[int, BatchHeader]],
    ) -> tuple[list[bytes | bytearray | memoryview], list[tuple[int, BatchHeader]]]:
        """The bytes to write for each batch and its stamped header: the header's copy with
        the base offset and leader epoch (outside the CRC) beside the rest of the batch in
        place; where the max timestamp or its type changed, the whole batch copied with
        them set and re-signed (the header's CRC then the new one)."""
        pieces: list[bytes | bytearray | memoryview] = []
        signed: list[tuple[int, BatchHeader]] = []
        for (position, sent), (_, header) in zip(batches, stamped, strict=True):
            head = stamped_header(view, position, header.base_offset, header.partition_leader_epoch)
            body = view[position + BATCH_HEADER_SIZE : position + header[1] + LOG_OVERHEAD]
            if header.attributes == sent.attributes and header[8] == sent[8]:
                pieces.append(head)
                pieces.append(body)
                signed.append((position, header))
                continue
            whole = bytearray(head) + body
            set_max_timestamp(whole, 0, header[8], header.timestamp_type)
            pieces.append(whole)
            signed.append((position, check_batch(whole, 0, verify_crc=False)))
        return pieces, signed

    def _duplicate_info(self, duplicate: DuplicateBatchError) -> AppendInfo:
        metadata = duplicate.metadata
        first = metadata.last_offset - metadata.offset_delta
        return AppendInfo(
            first_offset=first,
            last_offset=metadata.last_offset,
            max_timestamp=metadata.timestamp,
            offset_of_max_timestamp=metadata.last_offset,
            log_append_time=-1,
            log_start_offset=self.log_start_offset,
            records_count=metadata.offset_delta + 1,
            valid_bytes=0,
            duplicate=True,
        )

    def _write(
        self,
        pieces: list[bytes | bytearray | memoryview],
        batches: list[tuple[int, BatchHeader]],
        log_append_time: int,
    ) -> AppendInfo:
        """Write validated batches (given as pieces of bytes) to the active segment."""
        first, last = batches[0][1], batches[-1][1]
        total = 0
        max_timestamp, offset_of_max = -1, first.base_offset
        records = 0
        positioned: list[tuple[int, BatchHeader]] = []
        update = self.producer_state.update
        for _, header in batches:
            positioned.append((total, header))
            total += header.batch_length + LOG_OVERHEAD
            records += header.records_count
            if header.max_timestamp > max_timestamp:
                max_timestamp, offset_of_max = header.max_timestamp, header.base_offset + header[6]
        segment = self._segments[-1]
        if self._should_roll(segment, total, last.base_offset + last[6], max_timestamp):
            segment = self.roll(first.base_offset)
        segment.append_pieces(pieces, positioned, total)
        self._log_end_offset = last.base_offset + last[6] + 1
        if (
            self.lost_high_watermark is not None
            and self._log_end_offset >= self.lost_high_watermark
        ):
            self.lost_high_watermark = None
        for _, header in positioned:
            if header.producer_id >= 0:
                update(header, AppendOrigin.CLIENT)
        return AppendInfo(
            first.base_offset,
            last.base_offset + last[6],
            max_timestamp,
            offset_of_max,
            log_append_time,
            self.log_start_offset,
            records,
            total,
        )

    # -- rolling ----------------------------------------------------------------------

    def _should_roll(
        self, segment: LogSegment, incoming: int, last_offset: int, max_timestamp: int
    ) -> bool:
        """Kafka's roll rules, checked before an append of ``incoming`` bytes ending at
        ``last_offset`` whose largest timestamp is ``max_timestamp`` (the append's, as
        Kafka's ``maybeRoll`` takes it: :meth:`LogSegment.should_roll`)."""
        config = self.config
        return segment.should_roll(
            incoming,
            last_offset,
            max_timestamp,
            config.segment_bytes,
            config.segment_ms - config.segment_jitter_ms,
        )

    @_guards_io
    def roll(self, expected_next_offset: int | None = None) -> LogSegment:
        """Close the active segment to appends and start a new one at the log end offset."""
        new_base = max(self._log_end_offset, expected_next_offset or 0)
        active = self._segments[-1]
        if active.size == 0 and active.base_offset == new_base:
            return active
        try:
            segment = LogSegment.for_config(
                self.directory,
                new_base,
                self.config,
                active=True,
                created_ms=self.clock(),
            )
        except OSError as e:  # nothing changed: the active segment stays active
            raise KafkaStorageError(
                f"{self.topic_partition}: cannot start a segment at offset {new_base}: {e}"
            ) from e
        if active.size == 0:
            # An empty active segment at the wrong base (a gap in a follower's offsets).
            self._segments.pop()
            self._base_offsets.pop()
            active.delete_files()
        else:
            active.on_become_inactive()
        self._segments.append(segment)
        self._base_offsets.append(new_base)
        # Producer state as of the new segment's base, written (and fsynced) by the next flush.
        self.producer_state.advance_map_end_offset(self._log_end_offset)
        self._pending_snapshots.append(self.producer_state.prepare_snapshot())
        self._roll_flush_offset = max(self._roll_flush_offset, new_base)
        log.debug("%s: rolled new segment at offset %d", self.topic_partition, new_base)
        return segment

    # -- reads ------------------------------------------------------------------------

    @_guards_io
    def read(
        self,
        start_offset: int,
        max_bytes: int,
        *,
        max_offset: int | None = None,
        min_one_batch: bool = True,
    ) -> FetchData:
        """Whole batches from the one holding ``start_offset``, up to ``max_bytes``.

        ``max_offset`` (exclusive) bounds what is returned: a consumer passes the high
        watermark, a follower nothing. Reading at the log end (or at ``max_offset``)
        returns no records; so does reading in a gap that compaction left before the end,
        whose ``next_offset`` is then the end of the gap. Reading outside [log start offset,
        log end offset] raises :class:`OffsetOutOfRangeError`.
        """
        end = self._log_end_offset
        if start_offset < self.log_start_offset or start_offset > end:
            raise OffsetOutOfRangeError(
                f"{self.topic_partition}: offset {start_offset} is outside "
                f"[{self.log_start_offset}, {end}]"
            )
        if start_offset == end or (max_offset is not None and start_offset >= max_offset):
            return FetchData.empty(start_offset, self.log_start_offset, end)
        segments = self._segments
        for i in range(self._segment_index_for(start_offset), len(segments)):
            result: SegmentRead | None = segments[i].read(
                start_offset, max_bytes, max_offset=max_offset, min_one_batch=min_one_batch
            )
            if result is not None:
                return FetchData(
                    result.data, result.first_offset, result.next_offset, self.log_start_offset, end
                )
            if (
                max_offset is not None
                and i + 1 < len(segments)
                and segments[i + 1].base_offset >= max_offset
            ):
                break
        # No batch at or after ``start_offset`` below the bound: the offsets up to it were
        # compacted away (and the log truncated after them), so the reader may skip them.
        gap_end = end if max_offset is None else min(end, max_offset)
        return FetchData(b"", start_offset, gap_end, self.log_start_offset, end)

    def iter_batches(
        self, start_offset: int | None = None
    ) -> Iterator[tuple[LogSegment, int, BatchHeader]]:
        """Batch headers from ``start_offset`` (default: the first): (segment, position, header).

        Guarded like the reads (a generator, so by hand): a leader that cannot read its
        own log goes offline here too, whichever request read it (ListOffsets' largest
        timestamp, the producer state's replay), instead of leading on over a disk that
        fails its reads."""
        self._refuse_if_offline()
        start = self.log_start_offset if start_offset is None else start_offset
        try:
            for segment in list(self._segments[self._segment_index_for(start) :]):
                found = segment.translate_offset(start)
                if found is None:
                    continue
                yield from ((segment, p, h) for p, h in segment.iter_headers(found[0]))
        except (OSError, KafkaStorageError) as e:
            self._io_failed(e)

    @_guards_io
    def offset_for_timestamp(self, timestamp: int) -> tuple[int, int] | None:
        """The first record with a timestamp >= ``timestamp``: (timestamp, offset), or None."""
        for segment in list(self._segments):
            if segment.size == 0 or segment.max_timestamp < timestamp:
                continue
            if segment.next_offset <= self.log_start_offset:
                continue
            found = segment.find_offset_by_timestamp(timestamp, self.log_start_offset)
            if found is not None:
                return found
        return None

    @_guards_io
    def max_timestamp_and_offset(self, before_offset: int) -> tuple[int, int] | None:
        """ListOffsets ``MAX_TIMESTAMP``: (largest timestamp, offset of the first record
        carrying it) among the batches below ``before_offset``, or None when there is none.

        The batch is the first with the largest max timestamp; the offset is that of its
        first record whose timestamp equals it, as Kafka's ``RecordBatch.offsetOfMaxTimestamp``
        answers (KAFKA-16310), not the batch's last offset. With LogAppendTime every record
        carries the batch's timestamp: its first record. Only that batch is decoded
        (decompressed if need be).
        """
        best: tuple[LogSegment, int, BatchHeader] | None = None
        for segment, position, header in self.iter_batches():
            if header.base_offset >= before_offset:
                break
            if best is None or header.max_timestamp > best[2].max_timestamp:
                best = (segment, position, header)
        if best is None:
            return None
        segment, position, header = best
        return header.max_timestamp, _offset_of_max_timestamp(
            segment.read_bytes(position, header.size), header
        )

    @_guards_io
    def epoch_of_batch_at(self, offset: int) -> int:
        """The partition leader epoch of the batch holding ``offset``, -1 if no batch of the
        log holds it: what ListOffsets answers beside a record it found by timestamp (Kafka's
        ``TimestampAndOffset.leaderEpoch``, the found batch's ``partitionLeaderEpoch``)."""
        if not self.log_start_offset <= offset < self._log_end_offset:
            return -1
        segment = self._segments[self._segment_index_for(offset)]
        found = segment.translate_offset(offset)
        if found is None or found[1].base_offset > offset:
            return -1
        return found[1].partition_leader_epoch

    @property
    def earliest_epoch(self) -> int:
        """The epoch of the leader epoch cache's first entry (the log start offset's), -1
        if it has none: ListOffsets ``EARLIEST`` (Kafka's ``fetchOffsetByTimestamp``)."""
        entry = self.leader_epoch_cache.earliest_entry
        return entry.epoch if entry is not None else -1

    def latest_epoch_end_offset(self, requested_epoch: int) -> tuple[int, int]:
        """OffsetsForLeaderEpoch: (largest epoch <= requested, the end offset of that epoch)."""
        return self.leader_epoch_cache.end_offset_for(requested_epoch, self._log_end_offset)

    # -- truncation and the log start offset -------------------------------------------

    @_guards_io
    def truncate_to(self, offset: int) -> bool:
        """Remove every record at or above ``offset`` (a replica that diverged from its leader).

        Truncation falls on a batch boundary at or below ``offset``: the new log end offset
        is the base offset of the first batch removed, or ``offset`` itself when it lies in
        a gap that compaction left (then a new active segment starts there, so that the log
        end survives a restart). Returns whether anything was removed.
        """
        if offset < 0:
            raise OffsetOutOfRangeError(f"{self.topic_partition}: cannot truncate to {offset}")
        if offset >= self._log_end_offset:
            return False
        if offset < self.log_start_offset:
            self.truncate_fully_and_start_at(offset)
            return True
        with self._flush_lock:
            doomed: list[LogSegment] = []
            while len(self._segments) > 1 and self._segments[-1].base_offset >= offset:
                doomed.append(self._segments.pop())
                self._base_offsets.pop()
            if doomed:
                self._schedule_deletion(doomed)
            active = self._segments[-1]
            removed_at = active.truncate_to(offset)
            if removed_at is None:
                removed_at = doomed[-1].base_offset if doomed else offset
            if doomed:
                active.make_active()
            self._log_end_offset = max(active.next_offset, min(offset, removed_at))
            emptied = self._log_end_offset < self.log_start_offset
            self._pending_snapshots = [
                p for p in self._pending_snapshots if p[0] <= self._log_end_offset
            ]
            self.recovery_point = min(self.recovery_point, self._log_end_offset)
            self._roll_flush_offset = min(self._roll_flush_offset, self._log_end_offset)
            self.high_watermark = min(self.high_watermark, self._log_end_offset)
        if emptied:
            # The batch holding ``offset`` also held the log start offset: nothing readable
            # is left, so the log starts afresh at its start offset.
            self.truncate_fully_and_start_at(self.log_start_offset)
            return True
        if self._log_end_offset > self._segments[-1].next_offset:
            self.roll()
            # The new end lies in a gap compaction left; when the segment that held it is
            # the only one and ends up empty, the roll replaces it, and the log now starts
            # where no record was below anyway — as it will when opened again.
            self.log_start_offset = max(self.log_start_offset, self._segments[0].base_offset)
            self.high_watermark = max(self.high_watermark, self.log_start_offset)
        self.leader_epoch_cache.truncate_from_end(self._log_end_offset)
        self._refresh_latest_epoch()
        self._reload_producer_state()
        return True

    @_guards_io
    def truncate_fully_and_start_at(self, offset: int) -> None:
        """Drop every segment and start an empty log at ``offset`` (a replica far behind)."""
        with self._flush_lock:
            self._schedule_deletion(list(self._segments))
            segment = LogSegment.for_config(
                self.directory,
                offset,
                self.config,
                active=True,
                created_ms=self.clock(),
            )
            self._segments = [segment]
            self._base_offsets = [offset]
            self._pending_snapshots = []
            self._log_end_offset = offset
            self.log_start_offset = offset
            self.recovery_point = offset
            self._roll_flush_offset = offset
            self.high_watermark = offset
        self.leader_epoch_cache.clear()
        self._refresh_latest_epoch()
        self.producer_state.truncate_and_reload(offset, offset)

    def _reload_producer_state(self) -> None:
        replay_from = self.producer_state.truncate_and_reload(
            self.log_start_offset, self._log_end_offset
        )
        for _, _, header in self.iter_batches(max(replay_from, self.log_start_offset)):
            if header.producer_id >= 0:
                self.producer_state.update(header, AppendOrigin.REPLICATION)
        self.producer_state.advance_map_end_offset(self._log_end_offset)

    @_guards_io
    def maybe_increment_log_start_offset(self, new_log_start_offset: int) -> bool:
        """DeleteRecords: move the log start offset up to ``new_log_start_offset``.

        It may not pass the high watermark. Segments wholly below it are deleted by the
        next retention pass. Idempotent producers whose batches all lie below it are kept
        (:meth:`ProducerStateManager.on_log_start_offset_incremented`).
        """
        if new_log_start_offset > self.high_watermark:
            raise OffsetOutOfRangeError(
                f"{self.topic_partition}: cannot move the log start offset to "
                f"{new_log_start_offset}, above the high watermark {self.high_watermark}"
            )
        if new_log_start_offset <= self.log_start_offset:
            return False
        self.log_start_offset = new_log_start_offset
        self.leader_epoch_cache.truncate_from_start(new_log_start_offset)
        self.producer_state.on_log_start_offset_incremented(new_log_start_offset)
        return True

    # -- retention --------------------------------------------------------------------

    @_guards_io
    def delete_old_segments(self) -> int:
        """Apply retention (log start offset, size, time: all three in one pass, as
        :func:`~highwater.storage.retention.deletable_segments` says); return the segments
        deleted.

        It also forgets the idempotent producers idle for ``producer.id.expiration.ms``:
        the only way a producer leaves the producer state (Kafka checks on its own
        schedule, ``producer.id.expiration.check.interval.ms``; here the retention check's).
        """
        now = self.clock()
        config = self.config
        self.producer_state.remove_expired_producers(now)
        summaries = [
            SegmentSummary(s.base_offset, s.size, s.largest_timestamp) for s in self._segments
        ]
        count, reasons = deletable_segments(
            summaries,
            now_ms=now,
            retention_ms=config.retention_ms,
            retention_bytes=config.retention_bytes,
            delete_policy=config.delete,
            log_start_offset=self.log_start_offset,
            log_end_offset=self._log_end_offset,
            high_watermark=self.high_watermark,
        )
        if not count:
            return 0
        if count == len(self._segments):
            # Every segment expired: roll a fresh active segment first so the log keeps one.
            self.roll()
        doomed = self._segments[:count]
        del self._segments[:count]
        del self._base_offsets[:count]
        self._schedule_deletion(doomed)
        new_start = max(self.log_start_offset, self._segments[0].base_offset)
        if new_start > self.log_start_offset:
            self.log_start_offset = new_start
            self.leader_epoch_cache.truncate_from_start(new_start)
            self.producer_state.on_log_start_offset_incremented(new_start)
        self.high_watermark = max(self.high_watermark, self.log_start_offset)
        self.recovery_point = max(self.recovery_point, self.log_start_offset)
        log.info(
            "%s: deleted %d segment(s) by %s; log start offset is now %d",
            self.topic_partition,
            count,
            ", ".join(reason.value for reason in reasons),
            self.log_start_offset,
        )
        return count

    def _schedule_deletion(self, segments: list[LogSegment]) -> None:
        for segment in segments:
            segment.change_suffix("", DELETED_SUFFIX)
        self._pending_deletions.append(
            PendingDeletion(self.clock() + self.config.file_delete_delay_ms, segments)
        )

    @property
    def has_pending_deletions(self) -> bool:
        """Whether segments wait for their ``file.delete.delay.ms`` to be removed."""
        return bool(self._pending_deletions)

    @_guards_io
    def delete_pending_files(self, *, force: bool = False) -> int:
        """Remove ``.deleted`` segments whose ``file.delete.delay.ms`` has passed."""
        now = self.clock()
        removed = 0
        keep: list[PendingDeletion] = []
        for pending in self._pending_deletions:
            if force or pending.due_ms <= now:
                with self._flush_lock:
                    for segment in pending.segments:
                        segment.delete_files()
                        removed += 1
            else:
                keep.append(pending)
        self._pending_deletions = keep
        return removed

    # -- compaction support -------------------------------------------------------------

    @_guards_io
    def replace_segments(self, new_segment: LogSegment, old_segments: list[LogSegment]) -> None:
        """Swap cleaned ``new_segment`` (files suffixed ``.cleaned``) in for ``old_segments``.

        Crash-safe in Kafka's way: the new files become ``.swap`` (the commit point), the
        old ones ``.deleted``, then the ``.swap`` suffix is dropped. Recovery finishes a
        swap it finds half done and discards ``.cleaned`` files.
        """
        with self._flush_lock:
            new_segment.flush()
            new_segment.change_suffix(new_segment.suffix, ".swap")
            _fsync_directory(self.directory)
            old_bases = {s.base_offset for s in old_segments}
            self._segments = [s for s in self._segments if s.base_offset not in old_bases]
            self._schedule_deletion(old_segments)
            new_segment.change_suffix(".swap", "")
            _fsync_directory(self.directory)
            bisect.insort(self._segments, new_segment, key=lambda s: s.base_offset)
            self._base_offsets = [s.base_offset for s in self._segments]

    # -- flushing ---------------------------------------------------------------------

    def flush_target(self) -> int | None:
        """The offset to flush up to now by ``flush.messages``, ``flush.ms`` or a roll, or None."""
        config = self.config
        end = self._log_end_offset
        if end <= self.recovery_point:
            return None
        if self.unflushed_messages >= config.flush_messages:
            return end
        if self.clock() - self._last_flush_ms >= config.flush_ms:
            return end
        if self._roll_flush_offset > self.recovery_point:
            return self._roll_flush_offset
        return None

    @_guards_io
    def flush(self, up_to: int | None = None, *, indexes: bool = True) -> int:
        """fsync every segment holding offsets below ``up_to`` (default: the log end offset).

        Safe to call from a worker thread while the owner keeps appending; returns the new
        recovery point. ``indexes=False`` syncs the segments' logs only: for a log that is
        always loaded as after a crash from offset 0 (the metadata log,
        ``raft.partition_raft_log``), whose every segment is re-validated and has its
        indexes rebuilt from the log on every load, so synced indexes would never be read.
        An index left unsynced stays marked changed, and a later flush with ``indexes``
        (a clean :meth:`close`'s) syncs it.
        """
        with self._flush_lock:
            target = self._log_end_offset if up_to is None else min(up_to, self._log_end_offset)
            if target <= self.recovery_point:
                return self.recovery_point
            first = self._segment_index_for(self.recovery_point)
            segments = [s for s in self._segments[first:] if s.base_offset < target]
            for segment in segments:
                segment.flush(indexes=indexes)
            self.leader_epoch_cache.flush()
            snapshots, self._pending_snapshots = self._pending_snapshots, []
            for offset, data in snapshots:
                self.producer_state.write_snapshot(offset, data)
            self.recovery_point = max(self.recovery_point, target)
            self._last_flush_ms = self.clock()
            return self.recovery_point

    # -- lifecycle ----------------------------------------------------------------------

    def close(self) -> None:
        """Flush, write a producer-state snapshot at the log end, and close every file."""
        if self._closed:
            return
        if self.offline:  # nothing on a failed disk is written again: only let go of files
            for segment in self._segments:
                with contextlib.suppress(Exception):
                    segment.close()
            self._closed = True
            return
        self.flush()
        self.producer_state.advance_map_end_offset(self._log_end_offset)
        self.producer_state.take_snapshot()
        with self._flush_lock:
            for segment in self._segments:
                segment.close()
        self.delete_pending_files(force=True)
        self._closed = True

    def delete(self) -> None:
        """Remove the whole partition directory (the topic was deleted)."""
        with self._flush_lock:
            self._deleted = True
            for segment in self._segments:
                segment.delete_files()
        self.delete_pending_files(force=True)
        for path in self.directory.iterdir():
            path.unlink()
        self.directory.rmdir()
        self._closed = True

    def write_in_directory(self, write: Callable[[Path], None]) -> bool:
        """Run ``write(directory)`` (blocking, any thread) unless the log is closed or being
        deleted: under the lock :meth:`delete` takes first, so that no file appears in a
        directory being removed (its ``rmdir`` would fail, and take the log directory
        offline with it). False when it did not run."""
        with self._flush_lock:
            if self._closed or self._deleted:
                return False
            write(self.directory)
            return True

    def __repr__(self) -> str:
        return (
            f"PartitionLog({self.topic_partition}, start={self.log_start_offset}, "
            f"end={self._log_end_offset}, segments={len(self._segments)})"
        )


def _offset_of_max_timestamp(batch: bytes, header: BatchHeader) -> int:
    """The offset of the first record of ``batch`` whose timestamp is the batch's max
    timestamp (Kafka's ``RecordBatch.offsetOfMaxTimestamp``); the batch's last offset if no
    record's is (a producer's max timestamp field that none of its records carries)."""
    from highwater.records.batch import RecordBatch

    max_timestamp = header.max_timestamp
    for record in RecordBatch(batch).records():
        if record.timestamp == max_timestamp:
            return record.offset
    return header.last_offset


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
