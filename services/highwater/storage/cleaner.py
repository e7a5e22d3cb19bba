"""The log cleaner: compaction of ``cleanup.policy=compact`` logs, keeping the last value per key.

Kafka's log cleaner, for one data directory (one :class:`LogManager`).

**Which log.** The ``cleaner-offset-checkpoint`` file holds, per partition, the offset up
to which the log has been cleaned, its *first dirty offset*::

    log start        first dirty offset          first uncleanable offset
        | clean section  |    dirty section          |  uncleanable section, active segment

The *first uncleanable offset* is the smallest of the active segment's base offset, the
high watermark and the base offset of the first dirty segment whose largest timestamp is
within ``min.compaction.lag.ms`` of now.
Only whole non-active segments that end at or below the first uncleanable offset are ever
read or rewritten: the active segment, anything at or above the high watermark, and
segments younger than ``min.compaction.lag.ms`` are never touched. A log is *cleanable*
when its dirty ratio (dirty bytes / clean + dirty bytes) is above
``min.cleanable.dirty.ratio`` (strictly, as Kafka: 1.0 never cleans by ratio), when it has
dirty bytes and the earliest first-batch timestamp (above 0) of its dirty non-active
segments is older than ``max.compaction.lag.ms``, or when a tombstone's delete horizon has
passed (see below).
The dirtiest cleanable log is cleaned first.

**One pass** (:meth:`LogCleaner.clean_log`):

1. Build the *offset map*, key -> offset of its last record, over the dirty section, one
   segment at a time. When the map would hold more than ``dedupe_buffer_entries`` keys the
   pass ends before that segment (at a segment boundary, as Kafka does; if not even the
   first dirty segment fits, after the last batch that does). Where the map ends is the
   pass's *end offset*.
2. Rewrite every segment from the log start up to the end offset, in groups of adjacent
   segments whose sizes sum to at most ``segment.bytes`` and whose offsets fit one
   segment's 32-bit relative offsets, so that small cleaned segments merge again. A record
   is kept when its key is absent from the map or its offset is at least the map's offset
   for the key; records without a key are dropped (a compacted topic requires keys).
   A batch whose records are all kept is copied byte for byte; otherwise it is rebuilt
   with its base offset, ``last_offset_delta``, producer id/epoch/base sequence, partition
   leader epoch, compression and timestamp type, so offsets and idempotent producers'
   sequence ranges stay as they were. Its records keep their offset deltas; their
   timestamp deltas count from the first kept record's timestamp (or the delete horizon),
   as :func:`~highwater.records.batch.build_batch` writes them. With the compiled codec the
   map's step and this filtering run in C, a batch at a time (:meth:`RecordBatch.map_keys`,
   :meth:`RecordBatch.filter_records`): the kept records' bytes are copied from their key
   on and only their first fields written again, the same bytes as the reference
   (:meth:`LogCleaner._filter`, record by record), which runs for whatever the C code does
   not take. A batch left empty is dropped, unless it is the last
   batch of an active producer (kept empty, so producer state survives a rebuild from the
   log) or the last batch of its group (kept empty so that the cleaned segment spans its
   group's whole offset range, which makes crash recovery exact, see below).
3. Each group is written to a ``.cleaned`` segment, flushed, and swapped in for the old
   segments with :meth:`PartitionLog.replace_segments`: ``.cleaned`` -> ``.swap`` (the
   commit point), old segments -> ``.deleted``, ``.swap`` -> live. After a crash the loader
   removes ``.cleaned`` files and completes any ``.swap``, so a crash leaves each group
   either as it was before the pass or as the pass rewrote it, never a mix.
4. The checkpoint moves to the end offset.

**Tombstones** (records with a null value) follow KIP-534. The first pass that keeps a
tombstone rewrites its batch with a *delete horizon*, ``now + delete.retention.ms``, stored
in the batch header (the delete-horizon attribute and the base timestamp). A later pass
removes the tombstones of batches whose horizon has passed, giving consumers that read
from the log start at least ``delete.retention.ms`` to see the deletion. By then every
older record of the key is gone: the pass that first kept the tombstone had it (or a
later record of the key) in its map. Records at or above the end offset of a pass are
never dropped nor given a horizon. A horizon lengthens each record's timestamp delta by
a few bytes; a batch that would thereby outgrow ``segment.bytes`` (which recovery
rejects) is written without one, its tombstones kept. The cleaner remembers, in memory,
the earliest horizon each log still holds, and cleans a log whose horizon has passed even
when it has no dirty data (after a restart that memory is empty: such tombstones go with
the next pass).

**Threads.** :meth:`LogCleaner.clean_once_async` runs on the event loop that owns the
logs: map building and the rewriting of each group run in worker threads, the swaps on
the loop. Before each swap it checks that the segments the pass read are still the log's
(retention or truncation may have removed them meanwhile); if not, the ``.cleaned`` files
are discarded and the pass stops without moving the checkpoint.
"""

from __future__ import annotations

import asyncio
import logging
import os
import struct
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from highwater.config.definition import UNLIMITED
from highwater.config.topic import LogConfig
from highwater.errors import CorruptSegmentError, HighwaterError
from highwater.records.batch import RecordBatch, build_batch, build_batch_of_records
from highwater.records.header import (
    ATTRIBUTES_OFFSET,
    BATCH_HEADER_SIZE,
    CRC_OFFSET,
    MAX_TIMESTAMP_OFFSET,
    BatchHeader,
    crc32c,
    read_header,
    read_size,
)
from highwater.storage.segment import CLEANED_SUFFIX, INT32_MAX, LogSegment, file_name
from highwater.storage.topic_partition import TopicPartition

if TYPE_CHECKING:
    from highwater.storage.log import PartitionLog
    from highwater.storage.log_manager import LogManager

log = logging.getLogger(__name__)

__all__ = ["CleanerStats", "LogCleaner", "LogToClean", "OffsetMap"]

DEFAULT_DEDUPE_BUFFER_ENTRIES = 4_000_000
"""Keys one pass may map (Kafka sizes this in bytes, ``log.cleaner.dedupe.buffer.size``)."""

_READ_CHUNK = 1 << 20  # bytes read from a segment at a time (Kafka's cleaner I/O buffer)
_WRITE_CHUNK = 1 << 20  # bytes of cleaned batches gathered before one write
_BASE_TIMESTAMP_OFFSET = MAX_TIMESTAMP_OFFSET - 8
_TIMESTAMPS = struct.Struct(">qq")  # base timestamp, max timestamp (adjacent in the header)
_TIME_INDEX_ENTRY = 12  # bytes per time index entry, the larger of the two indexes' entries


@dataclass(slots=True)
class CleanerStats:
    """What one cleaning pass did."""

    topic_partition: TopicPartition | None = None
    first_dirty_offset: int = 0
    end_offset: int = 0  # where this pass stopped: the new cleaner checkpoint
    map_bytes_read: int = 0
    map_records_read: int = 0
    map_keys: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    records_read: int = 0
    records_retained: int = 0
    tombstones_removed: int = 0
    keyless_records_removed: int = 0  # Kafka's "invalid messages": no key in a compacted log
    segments_before: int = 0  # segments in the log before the pass
    segments_after: int = 0  # and after it
    duration_s: float = 0.0
    aborted: bool = False  # the log changed under the pass; nothing after that was swapped

    def __str__(self) -> str:
        return (
            f"{self.topic_partition}: offsets [{self.first_dirty_offset}, {self.end_offset}) "
            f"mapped ({self.map_keys} keys); read {self.bytes_read} bytes / "
            f"{self.records_read} records, wrote {self.bytes_written} bytes / "
            f"{self.records_retained} records, removed {self.tombstones_removed} tombstones; "
            f"segments {self.segments_before} -> {self.segments_after} in "
            f"{self.duration_s:.3f}s{' (aborted)' if self.aborted else ''}"
        )


@dataclass(frozen=True, slots=True)
class LogToClean:
    """A compacted log's cleanable range and how dirty it is (Kafka's ``LogToClean``)."""

    topic_partition: TopicPartition
    log: PartitionLog
    first_dirty_offset: int
    first_uncleanable_offset: int
    clean_bytes: int
    cleanable_bytes: int
    needs_compaction_now: bool  # max.compaction.lag.ms has passed for a dirty segment
    tombstones_expired: bool  # a delete horizon has passed

    @property
    def total_bytes(self) -> int:
        return self.clean_bytes + self.cleanable_bytes

    @property
    def cleanable_ratio(self) -> float:
        total = self.total_bytes
        return self.cleanable_bytes / total if total else 0.0

    @property
    def should_clean(self) -> bool:
        """Kafka's ``grabFilthiestCompactedLog``: dirty bytes that ``max.compaction.lag.ms``
        forces, or a dirty ratio strictly above ``min.cleanable.dirty.ratio`` (so 1.0
        never cleans by ratio); or a delete horizon that has passed."""
        if self.cleanable_bytes > 0 and (
            self.needs_compaction_now
            or self.cleanable_ratio > self.log.config.min_cleanable_dirty_ratio
        ):
            return True
        return self.tombstones_expired


class OffsetMap:
    """Key -> offset of the key's last record in the mapped range (Kafka's ``OffsetMap``).

    Keys are kept whole, so there are no hash collisions; ``capacity`` bounds the number
    of keys. ``latest_offset`` is the last offset mapped.
    """

    __slots__ = ("_offsets", "capacity", "latest_offset")

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"an offset map needs room for at least one key, not {capacity}")
        self.capacity = capacity
        self._offsets: dict[bytes, int] = {}
        self.latest_offset = -1

    def get(self, key: bytes) -> int | None:
        return self._offsets.get(key)

    def __len__(self) -> int:
        return len(self._offsets)

    def __contains__(self, key: object) -> bool:
        return key in self._offsets

    @property
    def utilization(self) -> float:
        return len(self._offsets) / self.capacity


def _clamp_first_dirty(checkpoint: int | None, partition_log: PartitionLog) -> int:
    """The first dirty offset from the checkpoint, as Kafka clamps it."""
    start = partition_log.log_start_offset
    if checkpoint is None or checkpoint < start or checkpoint > partition_log.log_end_offset:
        # No checkpoint, retention passed it, or the log was truncated below it.
        return start
    return checkpoint


def _first_uncleanable_offset(
    partition_log: PartitionLog, segments: tuple[LogSegment, ...], first_dirty: int, now_ms: int
) -> int:
    """min(active segment base, high watermark, first segment within min.compaction.lag.ms)."""
    candidates = [segments[-1].base_offset, partition_log.high_watermark]
    lag = partition_log.config.min_compaction_lag_ms
    if lag > 0:
        for segment in segments[:-1]:
            if segment.next_offset <= first_dirty:
                continue
            if segment.largest_timestamp > now_ms - lag:
                candidates.append(segment.base_offset)
                break
    return min(candidates)


def _max_compaction_lag_passed(
    segments: tuple[LogSegment, ...], first_dirty: int, clean_until_ms: int
) -> bool:
    """Whether a dirty segment must be compacted now: Kafka's ``maxCompactionDelay`` > 0.

    The earliest first-batch timestamp over every dirty non-active segment (not only the
    first: timestamps need not grow from one segment to the next), counting only
    timestamps above 0, is older than ``clean_until_ms`` (now - ``max.compaction.lag.ms``).
    A segment without such a timestamp never forces a compaction: its file's mtime is no
    record's time.
    """
    earliest: int | None = None
    for segment in segments[:-1]:
        if segment.next_offset <= first_dirty:
            continue
        timestamp = segment.first_batch_timestamp
        if timestamp is not None and timestamp > 0 and (earliest is None or timestamp < earliest):
            earliest = timestamp
    return earliest is not None and earliest < clean_until_ms


def _cleanable_prefix(
    segments: tuple[LogSegment, ...], log_start: int, first_uncleanable: int
) -> list[LogSegment]:
    """The non-active segments that end at or below ``first_uncleanable`` (and hold live data)."""
    prefix = []
    for segment in segments[:-1]:
        if segment.next_offset > first_uncleanable:
            break
        if segment.next_offset > log_start:
            prefix.append(segment)
    return prefix


def _segment_batches(segment: LogSegment, position: int = 0) -> Iterator[RecordBatch]:
    """Every batch of a non-active segment from ``position``, read in large chunks, CRC checked."""
    size = segment.size
    while position < size:
        data = segment.read_bytes(position, min(_READ_CHUNK, size - position))
        end = len(data)
        pos = 0
        try:
            while end - pos >= BATCH_HEADER_SIZE:
                batch_size = read_size(data, pos)
                if batch_size > end - pos:
                    break
                batch = RecordBatch(data, pos)
                yield batch
                pos += batch.size
            if pos == 0:
                # One batch larger than the chunk: read it whole.
                if end < BATCH_HEADER_SIZE:
                    raise CorruptSegmentError(
                        str(segment.log_path), position, f"truncated batch header ({end} bytes)"
                    )
                batch_size = read_size(data, 0)
                if batch_size < BATCH_HEADER_SIZE or position + batch_size > size:
                    raise CorruptSegmentError(
                        str(segment.log_path), position, f"batch size {batch_size} is invalid"
                    )
                data = segment.read_bytes(position, batch_size)
                batch = RecordBatch(data, 0)
                yield batch
                pos = batch.size
        except CorruptSegmentError:
            raise
        except HighwaterError as error:
            raise CorruptSegmentError(str(segment.log_path), position + pos, str(error)) from error
        position += pos


def _empty_batch(header: BatchHeader) -> bytes:
    """An empty batch in place of ``header``'s: same offsets, producer fields and max timestamp.

    ``build_batch`` writes an empty batch without timestamps; Kafka's empty batch keeps the
    original max timestamp (producer expiration and retention read it), so it is patched in
    and the CRC recomputed.
    """
    data = bytearray(
        build_batch(
            (),
            base_offset=header.base_offset,
            last_offset_delta=header.last_offset_delta,
            timestamp_type=header.timestamp_type,
            producer_id=header.producer_id,
            producer_epoch=header.producer_epoch,
            base_sequence=header.base_sequence,
            partition_leader_epoch=header.partition_leader_epoch,
            is_transactional=header.is_transactional,
        )
    )
    _TIMESTAMPS.pack_into(data, _BASE_TIMESTAMP_OFFSET, header.max_timestamp, header.max_timestamp)
    struct.pack_into(">I", data, CRC_OFFSET, crc32c(memoryview(data)[ATTRIBUTES_OFFSET:]))
    return bytes(data)


def _discard(segment: LogSegment) -> None:
    try:
        segment.delete_files()
    except OSError as error:  # the loader removes .cleaned leftovers anyway
        log.warning("could not remove cleaned segment %s: %s", segment.log_path, error)


class _CleaningPass:
    """One pass over one log: the plan taken on the owner thread, then the work.

    :meth:`build_offset_map` and :meth:`clean_group` only read the segments captured at
    construction and write ``.cleaned`` files, so they may run in a worker thread; the
    rest runs on the log's owner thread.
    """

    def __init__(
        self,
        partition_log: PartitionLog,
        *,
        first_dirty: int,
        now_ms: int,
        dedupe_buffer_entries: int,
    ) -> None:
        self.log = partition_log
        self.config: LogConfig = partition_log.config
        self.now_ms = now_ms
        segments = partition_log.segments
        self.first_uncleanable = _first_uncleanable_offset(
            partition_log, segments, first_dirty, now_ms
        )
        self.prefix = _cleanable_prefix(
            segments, partition_log.log_start_offset, self.first_uncleanable
        )
        boundary = self.prefix[-1].next_offset if self.prefix else segments[0].base_offset
        self.first_dirty = min(first_dirty, max(boundary, partition_log.log_start_offset))
        self.dirty = [s for s in self.prefix if s.next_offset > self.first_dirty]
        self.offset_map = OffsetMap(dedupe_buffer_entries)
        self.end_offset = self.first_dirty
        # Kafka keeps the last batch of each producer the log's producer state knows of.
        self.last_offsets_of_active_producers = {
            producer_id: entry.last_data_offset
            for producer_id, entry in partition_log.producer_state.active_producers.items()
        }
        self.stats = CleanerStats(
            topic_partition=partition_log.topic_partition,
            first_dirty_offset=self.first_dirty,
            end_offset=self.first_dirty,
            segments_before=len(segments),
        )
        # The segments the pass depends on (read for the map or to be rewritten), replaced
        # by the cleaned segments as they are swapped in.
        self.required: list[LogSegment] = list(self.prefix)
        self.earliest_horizon: int | None = None

    # -- step 1: the offset map (worker thread) -----------------------------------------

    def build_offset_map(self) -> None:
        """Map key -> last offset over the dirty segments; set the pass's end offset."""
        offsets = self.offset_map._offsets
        capacity = self.offset_map.capacity
        first_dirty = self.first_dirty
        stats = self.stats
        end = self.first_dirty
        for segment in self.dirty:
            start = 0
            if segment.base_offset < first_dirty:
                found = segment.translate_offset(first_dirty)
                if found is None:
                    end = segment.next_offset
                    continue
                start = found[0]
            if (
                len(offsets) + segment.next_offset - max(segment.base_offset, first_dirty)
                <= capacity
            ):
                # Even if every offset held a new key the map could not fill: map directly.
                for batch in _segment_batches(segment, start):
                    header = batch.header
                    if header.last_offset < first_dirty:
                        continue
                    batch.map_keys(offsets, first_dirty)
                    stats.map_bytes_read += header.size
                    stats.map_records_read += header.records_count
                    self.offset_map.latest_offset = header.last_offset
                end = segment.next_offset
                continue
            segment_offsets: dict[bytes, int] = {}
            new_keys = 0  # keys of this segment not in the map yet
            latest = self.offset_map.latest_offset
            full_at: int | None = None
            for batch in _segment_batches(segment, start):
                header = batch.header
                if header.last_offset < first_dirty:
                    continue
                keys = [
                    (offset, key)
                    for offset, key, _ in batch.iter_keys()
                    if key is not None and offset >= first_dirty
                ]
                if len(offsets) + new_keys + len(keys) > capacity and (offsets or segment_offsets):
                    # Might not fit: count exactly the keys this batch would add.
                    seen: set[bytes] = set()
                    for _, key in keys:
                        if key not in offsets and key not in segment_offsets:
                            seen.add(key)
                    if len(offsets) + new_keys + len(seen) > capacity:
                        full_at = header.base_offset
                        break
                for offset, key in keys:
                    if key not in segment_offsets and key not in offsets:
                        new_keys += 1
                    segment_offsets[key] = offset
                stats.map_bytes_read += header.size
                stats.map_records_read += header.records_count
                latest = header.last_offset
            if full_at is not None and offsets:
                # Kafka stops at the segment boundary: this segment waits for the next pass.
                log.debug(
                    "%s: offset map full (%d keys); this pass ends at offset %d",
                    self.log.topic_partition,
                    len(offsets),
                    segment.base_offset,
                )
                break
            offsets.update(segment_offsets)
            self.offset_map.latest_offset = latest
            if full_at is not None:
                # Not even the first dirty segment fits: the pass ends inside it.
                end = full_at
                break
            end = segment.next_offset
        self.end_offset = end
        stats.end_offset = end
        stats.map_keys = len(offsets)
        self.required = [s for s in self.prefix if s.base_offset < end]

    # -- step 2: groups (owner thread) --------------------------------------------------

    def groups(self) -> list[list[LogSegment]]:
        """The segments below the end offset in groups that each fit one segment."""
        segments = [s for s in self.prefix if s.base_offset < self.end_offset]
        config = self.config
        max_size = config.segment_bytes
        bytes_per_entry = max(config.index_interval_bytes + 1, BATCH_HEADER_SIZE)

        def index_bytes(size: int) -> int:
            # At most one index entry per ``index.interval.bytes`` written, plus one.
            return (size // bytes_per_entry + 2) * _TIME_INDEX_ENTRY

        groups: list[list[LogSegment]] = []
        i = 0
        while i < len(segments):
            group = [segments[i]]
            size = segments[i].size
            i += 1
            while i < len(segments):
                candidate = segments[i]
                total = size + candidate.size
                if total > max_size or index_bytes(total) > config.segment_index_bytes:
                    break
                if candidate.size and candidate.next_offset - 1 - group[0].base_offset > INT32_MAX:
                    break
                group.append(candidate)
                size = total
                i += 1
            groups.append(group)
        return groups

    # -- step 3: rewriting a group (worker thread) --------------------------------------

    def clean_group(self, group: list[LogSegment]) -> LogSegment | None:
        """Write the kept records of ``group`` into a flushed ``.cleaned`` segment.

        Returns None when the group holds no batch at all (nothing to swap).
        """
        if not any(segment.size for segment in group):
            return None
        config = self.config
        base = group[0].base_offset
        directory = self.log.directory
        for suffix in (".log", ".index", ".timeindex"):
            (directory / file_name(base, suffix + CLEANED_SUFFIX)).unlink(missing_ok=True)
        cleaned = LogSegment.for_config(
            directory,
            base,
            config,
            active=True,
            suffix=CLEANED_SUFFIX,
        )
        try:
            self._clean_into(group, cleaned)
            cleaned.on_become_inactive()
            cleaned.flush()
            # As in Kafka, the cleaned segment keeps the old segments' modification time,
            # which retention falls back on when batches carry no timestamps.
            mtime = max(os.stat(segment.log_path).st_mtime_ns for segment in group)
            os.utime(cleaned.log_path, ns=(mtime, mtime))
        except BaseException:
            _discard(cleaned)
            raise
        return cleaned

    def _clean_into(self, group: list[LogSegment], cleaned: LogSegment) -> None:
        end = self.end_offset
        last_of_producer = self.last_offsets_of_active_producers
        stats = self.stats
        out = bytearray()
        written: list[tuple[int, BatchHeader]] = []
        dropped: BatchHeader | None = None  # the last batch read, if it was dropped

        def write(data: bytes | memoryview, header: BatchHeader) -> None:
            nonlocal out, written, dropped
            written.append((len(out), header))
            out += data
            stats.bytes_written += header.size
            dropped = None
            if len(out) >= _WRITE_CHUNK:
                cleaned.append(out, written)
                out, written = bytearray(), []

        for segment in group:
            for batch in _segment_batches(segment):
                header = batch.header
                stats.bytes_read += header.size
                stats.records_read += header.records_count
                if header.base_offset >= end or header.is_control:
                    # Past the mapped range (or a control batch): kept exactly as it is.
                    stats.records_retained += header.records_count
                    write(batch.view(), header)
                    continue
                horizon = header.base_timestamp if header.has_delete_horizon else None
                filtered = self._filter_compiled(batch, horizon)
                if filtered is None:
                    filtered = self._filter(batch, horizon)
                kept, tombstones_kept, data = filtered
                count = header.records_count
                if not kept:
                    if (
                        header.has_producer_id
                        and last_of_producer.get(header.producer_id) == header.last_offset
                    ):
                        empty = _empty_batch(header)
                        write(empty, read_header(empty))
                    else:
                        dropped = header
                    continue
                if data is None:
                    write(batch.view(), header)
                    written_horizon = horizon
                else:
                    new_header = read_header(data)
                    write(data, new_header)
                    written_horizon = (
                        new_header.base_timestamp if new_header.has_delete_horizon else None
                    )
                stats.records_retained += kept if data is not None else count
                if (
                    tombstones_kept
                    and written_horizon is not None
                    and (self.earliest_horizon is None or written_horizon < self.earliest_horizon)
                ):
                    self.earliest_horizon = written_horizon
        if dropped is not None:
            # Keep the group's last offset so the segment spans the group's whole range:
            # after a crash, completing the swap then removes exactly the old segments.
            data = _empty_batch(dropped)
            write(data, read_header(data))
        if written:
            cleaned.append(out, written)

    def _filter(self, batch: RecordBatch, horizon: int | None) -> tuple[int, bool, bytes | None]:
        """Which records of ``batch`` (not a control batch, below the end offset) the pass
        keeps: ``(kept, tombstones_kept, data)``, ``data`` the rewritten batch or None to
        copy it as it is. The reference, record by record in Python; it counts the records
        removed in the stats."""
        offset_map = self.offset_map._offsets
        now = self.now_ms
        stats = self.stats
        kept: list[int] = []
        count = 0
        tombstones_kept = False
        for offset, key, value_is_null in batch.iter_keys():
            count += 1
            if key is None:
                stats.keyless_records_removed += 1
                continue
            latest = offset_map.get(key)
            if latest is not None and offset < latest:
                if value_is_null:
                    stats.tombstones_removed += 1
                continue
            if value_is_null:
                if horizon is not None and now >= horizon:
                    stats.tombstones_removed += 1
                    continue
                tombstones_kept = True
            kept.append(offset)
        new_horizon = horizon
        if tombstones_kept and new_horizon is None:
            new_horizon = now + self.config.delete_retention_ms
        data: bytes | None = None  # None: every record kept, copy the batch as it is
        if kept and (len(kept) < count or new_horizon != horizon):
            data = self._rebuild(batch, kept, count, horizon, new_horizon)
        return len(kept), tombstones_kept, data

    def _filter_compiled(
        self, batch: RecordBatch, horizon: int | None
    ) -> tuple[int, bool, bytes | None] | None:
        """:meth:`_filter` in one compiled call (:meth:`RecordBatch.filter_records`): the
        kept records' bytes are copied with their offset deltas, only their timestamp deltas
        re-encoded, so the batch written is the one :meth:`_rebuild` would build. None when
        the compiled pass does not take the batch, or when the rewritten batch would pass
        ``segment.bytes`` with a new horizon (the reference then writes it without one)."""
        now = self.now_ms
        found = batch.filter_records(
            self.offset_map._offsets, now, horizon, now + self.config.delete_retention_ms
        )
        if found is None:
            return None
        kept, keyless, tombstones_removed, tombstones_kept, new_horizon, records = found[:6]
        data: bytes | None = None
        if records is not None:
            header = batch.header
            data = build_batch_of_records(
                records,
                kept,
                base_offset=header.base_offset,
                last_offset_delta=header.last_offset_delta,
                base_timestamp=found[6],
                max_timestamp=found[7],
                compression=header.compression,
                timestamp_type=header.timestamp_type,
                producer_id=header.producer_id,
                producer_epoch=header.producer_epoch,
                base_sequence=header.base_sequence,
                partition_leader_epoch=header.partition_leader_epoch,
                is_transactional=header.is_transactional,
                delete_horizon_ms=new_horizon,
            )
            if len(data) > self.config.segment_bytes and new_horizon != horizon:
                return None
        self.stats.keyless_records_removed += keyless
        self.stats.tombstones_removed += tombstones_removed
        return kept, tombstones_kept, data

    def _rebuild(
        self,
        batch: RecordBatch,
        kept: list[int],
        count: int,
        horizon: int | None,
        new_horizon: int | None,
    ) -> bytes | None:
        """The batch with only the ``kept`` offsets, stamped with ``new_horizon``.

        None means: copy the original. A delete horizon makes each record's timestamp delta
        longer; a batch that would grow past ``segment.bytes`` (which recovery rejects) is
        written without a new horizon instead, its tombstones left for a later pass.
        """
        header = batch.header
        keep = set(kept)
        records = [r for r in batch.records() if r.offset in keep]

        def build(delete_horizon_ms: int | None) -> bytes:
            return build_batch(
                records,
                base_offset=header.base_offset,
                last_offset_delta=header.last_offset_delta,
                compression=header.compression,
                timestamp_type=header.timestamp_type,
                producer_id=header.producer_id,
                producer_epoch=header.producer_epoch,
                base_sequence=header.base_sequence,
                partition_leader_epoch=header.partition_leader_epoch,
                is_transactional=header.is_transactional,
                delete_horizon_ms=delete_horizon_ms,
            )

        data = build(new_horizon)
        if len(data) > self.config.segment_bytes and new_horizon != horizon:
            if len(kept) == count:
                return None
            data = build(horizon)
        return data

    # -- step 4: swapping (owner thread) ------------------------------------------------

    def still_current(self) -> bool:
        """Whether every segment the pass depends on is still a non-active segment of the log."""
        segments = self.log.segments
        live = {id(s) for s in segments[:-1]}
        return all(id(s) in live for s in self.required)

    def swap(self, cleaned: LogSegment, group: list[LogSegment]) -> None:
        try:
            self.log.replace_segments(cleaned, group)
        except Exception:
            if cleaned.suffix == CLEANED_SUFFIX:  # the swap had not committed
                _discard(cleaned)
            raise
        doomed = {id(s) for s in group}
        position = next(i for i, s in enumerate(self.required) if id(s) in doomed)
        self.required = [s for s in self.required if id(s) not in doomed]
        self.required.insert(position, cleaned)

    def finish(self, started: float) -> CleanerStats:
        stats = self.stats
        stats.segments_after = len(self.log.segments)
        stats.duration_s = time.monotonic() - started
        return stats


class LogCleaner:
    """Compacts the ``cleanup.policy=compact`` logs of one :class:`LogManager`.

    ``dedupe_buffer_entries`` bounds the keys one pass maps (Kafka's
    ``log.cleaner.dedupe.buffer.size``, counted in keys); ``clock`` (milliseconds) defaults
    to the manager's.
    """

    def __init__(
        self,
        manager: LogManager,
        *,
        dedupe_buffer_entries: int = DEFAULT_DEDUPE_BUFFER_ENTRIES,
        clock: Callable[[], int] | None = None,
    ) -> None:
        if dedupe_buffer_entries < 1:
            raise ValueError(f"dedupe_buffer_entries must be positive, not {dedupe_buffer_entries}")
        self.manager = manager
        self.dedupe_buffer_entries = dedupe_buffer_entries
        self.clock: Callable[[], int] = clock if clock is not None else manager.clock
        # Earliest delete horizon among the tombstones each log still holds (KIP-534), so
        # that a log is cleaned once it passes even without new dirty data. In memory only.
        self._delete_horizons: weakref.WeakKeyDictionary[PartitionLog, int] = (
            weakref.WeakKeyDictionary()
        )
        # Logs a pass is running on: two passes on one log would write the same .cleaned files.
        self._in_progress: weakref.WeakSet[PartitionLog] = weakref.WeakSet()
        # Logs a background pass failed on (a corrupt batch...): skipped until the process
        # restarts, as Kafka marks such partitions uncleanable rather than failing every backoff.
        self._uncleanable: weakref.WeakSet[PartitionLog] = weakref.WeakSet()

    def _record_delete_horizon(self, cleaning: _CleaningPass) -> None:
        """Remember when the earliest tombstone the pass kept may go."""
        if cleaning.earliest_horizon is None:
            self._delete_horizons.pop(cleaning.log, None)
        else:
            self._delete_horizons[cleaning.log] = cleaning.earliest_horizon

    # -- choosing a log ---------------------------------------------------------------------

    def log_to_clean(
        self,
        topic_partition: TopicPartition,
        partition_log: PartitionLog,
        now_ms: int,
        checkpoint: int | None,
    ) -> LogToClean:
        """The cleanable range of one log and its dirtiness (Kafka's ``cleanableOffsets``)."""
        config = partition_log.config
        segments = partition_log.segments
        first_dirty = _clamp_first_dirty(checkpoint, partition_log)
        first_uncleanable = _first_uncleanable_offset(partition_log, segments, first_dirty, now_ms)
        clean_bytes = cleanable_bytes = 0
        for segment in _cleanable_prefix(
            segments, partition_log.log_start_offset, first_uncleanable
        ):
            if segment.next_offset <= first_dirty:
                clean_bytes += segment.size
            else:
                cleanable_bytes += segment.size
        needs_now = config.max_compaction_lag_ms < UNLIMITED and _max_compaction_lag_passed(
            segments, first_dirty, now_ms - config.max_compaction_lag_ms
        )
        horizon = self._delete_horizons.get(partition_log)
        return LogToClean(
            topic_partition=topic_partition,
            log=partition_log,
            first_dirty_offset=first_dirty,
            first_uncleanable_offset=first_uncleanable,
            clean_bytes=clean_bytes,
            cleanable_bytes=cleanable_bytes,
            needs_compaction_now=needs_now,
            tombstones_expired=horizon is not None and horizon <= now_ms,
        )

    def logs_to_clean(
        self, now_ms: int | None = None, checkpoints: dict[TopicPartition, int] | None = None
    ) -> list[LogToClean]:
        """The compacted logs due for cleaning, dirtiest first."""
        now = self.clock() if now_ms is None else now_ms
        if checkpoints is None:
            checkpoints = self.manager.cleaner_checkpoint.read()
        due = []
        for tp, partition_log in self.manager.logs.items():
            if (
                not partition_log.config.compact
                or partition_log in self._in_progress
                or partition_log in self._uncleanable
            ):
                continue
            candidate = self.log_to_clean(tp, partition_log, now, checkpoints.get(tp))
            if candidate.should_clean:
                due.append(candidate)
        due.sort(key=lambda c: c.cleanable_ratio, reverse=True)
        return due

    def cleanable_logs(
        self, now_ms: int | None = None
    ) -> list[tuple[TopicPartition, PartitionLog, float]]:
        """(partition, log, dirty ratio) of each compacted log due for cleaning, dirtiest first.

        A log is due when its dirty ratio is above ``min.cleanable.dirty.ratio``, when a
        dirty segment's first batch is older than ``max.compaction.lag.ms``, or when
        tombstones it holds have passed their delete horizon (:attr:`LogToClean.should_clean`).
        """
        return [(c.topic_partition, c.log, c.cleanable_ratio) for c in self.logs_to_clean(now_ms)]

    # -- cleaning ---------------------------------------------------------------------------

    def _start(
        self, partition_log: PartitionLog, checkpoint: int | None, now: int
    ) -> _CleaningPass:
        if not partition_log.config.compact:
            raise ValueError(f"{partition_log.topic_partition}: cleanup.policy has no 'compact'")
        if partition_log in self._in_progress:
            raise RuntimeError(f"{partition_log.topic_partition}: already being cleaned")
        return _CleaningPass(
            partition_log,
            first_dirty=_clamp_first_dirty(checkpoint, partition_log),
            now_ms=now,
            dedupe_buffer_entries=self.dedupe_buffer_entries,
        )

    def clean_log(self, partition_log: PartitionLog, now_ms: int | None = None) -> CleanerStats:
        """Run one full pass over ``partition_log`` on this thread (the log's owner)."""
        started = time.monotonic()
        now = self.clock() if now_ms is None else now_ms
        tp = partition_log.topic_partition
        cleaning = self._start(partition_log, self.manager.cleaner_checkpoint.read().get(tp), now)
        self._in_progress.add(partition_log)
        try:
            cleaning.build_offset_map()
            for group in cleaning.groups():
                cleaned = cleaning.clean_group(group)
                if cleaned is not None:
                    cleaning.swap(cleaned, group)
            self._update_checkpoint(tp, cleaning.end_offset)
            self._record_delete_horizon(cleaning)
        finally:
            self._in_progress.discard(partition_log)
        stats = cleaning.finish(started)
        log.info("cleaned %s", stats)
        return stats

    async def clean_once_async(self) -> CleanerStats | None:
        """Clean the dirtiest due log, if any; blocking work runs in worker threads.

        Call it on the event loop that owns the logs. Returns the pass's stats, or None when
        no log was due. A pass that fails (a corrupt segment...) raises, and its log is not
        chosen again until the process restarts.
        """
        started = time.monotonic()
        checkpoints = await asyncio.to_thread(self.manager.cleaner_checkpoint.read)
        now = self.clock()
        due = self.logs_to_clean(now, checkpoints)
        if not due:
            return None
        chosen = due[0]
        partition_log, tp = chosen.log, chosen.topic_partition
        cleaning = self._start(partition_log, checkpoints.get(tp), now)
        self._in_progress.add(partition_log)
        try:
            try:
                await asyncio.to_thread(cleaning.build_offset_map)
                for group in cleaning.groups():
                    cleaned = await asyncio.to_thread(cleaning.clean_group, group)
                    if cleaned is None:
                        continue
                    if not cleaning.still_current():
                        await asyncio.to_thread(_discard, cleaned)
                        return self._aborted(cleaning, started)
                    cleaning.swap(cleaned, group)
            except Exception:
                if not cleaning.still_current():
                    # Retention or truncation removed segments the pass was reading.
                    return self._aborted(cleaning, started)
                self._uncleanable.add(partition_log)
                log.error("%s: cleaning failed; not cleaned again until restart", tp)
                raise
            if not cleaning.still_current():
                return self._aborted(cleaning, started)
            present = set(self.manager.logs)
            await asyncio.to_thread(self._update_checkpoint, tp, cleaning.end_offset, present)
            self._record_delete_horizon(cleaning)
        finally:
            self._in_progress.discard(partition_log)
        stats = cleaning.finish(started)
        log.info("cleaned %s", stats)
        return stats

    def _aborted(self, cleaning: _CleaningPass, started: float) -> CleanerStats:
        cleaning.stats.aborted = True
        stats = cleaning.finish(started)
        log.info(
            "%s: cleaning aborted, the log changed under the pass; %s",
            cleaning.log.topic_partition,
            stats,
        )
        return stats

    def _update_checkpoint(
        self, tp: TopicPartition, offset: int, present: set[TopicPartition] | None = None
    ) -> None:
        """Record that ``tp`` is clean below ``offset``, dropping partitions not in ``present``."""
        checkpoint = self.manager.cleaner_checkpoint
        offsets = checkpoint.read()
        if present is not None:
            offsets = {other: value for other, value in offsets.items() if other in present}
        offsets[tp] = offset
        checkpoint.write(offsets)
