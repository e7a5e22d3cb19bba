"""One log segment: a ``.log`` file of record batches with its ``.index`` and ``.timeindex``.

A segment is named by its base offset, zero-padded to 20 digits
(``00000000000003257573.log``). The ``.log`` file is a plain concatenation of RecordBatch
v2 batches exactly as they arrived (offsets and leader epoch stamped in); nothing else is
in it. Appends go to the end; a segment is only ever cut from the end (truncation) or
replaced whole (compaction, through ``.cleaned`` and ``.swap`` files).

Reads translate an offset to a file position with the sparse offset index, then scan batch
headers forward from there. Every header read is checked for structure; a position that
does not hold a batch is reported as :class:`CorruptSegmentError` with file and byte.
"""

from __future__ import annotations

import logging
import mmap
import os
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from highwater.config.topic import LogConfig
from highwater.errors import CorruptSegmentError, HighwaterError, KafkaStorageError
from highwater.records.header import (
    BATCH_HEADER_SIZE,
    HEADER_STRUCT,
    LOG_OVERHEAD,
    MAGIC,
    BatchHeader,
    check_batch,
    scan_batches,
    write_stamped,
)
from highwater.storage.index import CorruptIndexError, OffsetIndex, TimeIndex

log = logging.getLogger(__name__)

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIME_INDEX_SUFFIX = ".timeindex"
SNAPSHOT_SUFFIX = ".snapshot"
DELETED_SUFFIX = ".deleted"
CLEANED_SUFFIX = ".cleaned"
SWAP_SUFFIX = ".swap"
INT32_MAX = 2**31 - 1

_INT32 = struct.Struct(">i")
_INT64 = struct.Struct(">q")
_PREFIX = struct.Struct(">qiib")  # base offset, batch length, partition leader epoch, magic
_IOV_MAX = 1024
_SCAN_CHUNK = 16 * 1024
_READ_ENDS_KEPT = 8
"""How many earlier reads' end positions a segment keeps (:meth:`LogSegment.read`): one
for each reader at its tail (a consumer, the followers)."""


def _write_fully(fd: int, pieces: list[bytes | bytearray | memoryview], total: int) -> None:
    """writev ``pieces`` to ``fd``, continuing after short writes.

    The seam every segment write goes through (the simulation's disk faults replace it):
    a leader's append, written by the compiled ``write_stamped`` while this function is the
    one defined here, gives its pieces to a replacement instead
    (:meth:`LogSegment.append_stamped`)."""
    if len(pieces) <= _IOV_MAX:
        written = os.writev(fd, pieces)
        if written == total:
            return
        views = [memoryview(p) for p in pieces]
        remaining = total - written
        _drop_written(views, written)
    else:
        views = [memoryview(p) for p in pieces]
        remaining = total
    while remaining:
        written = os.writev(fd, views[:_IOV_MAX])
        remaining -= written
        _drop_written(views, written)


_WRITE_FULLY = _write_fully
"""The seam as defined here: while ``_write_fully`` is it, a leader's append is written by
the compiled ``write_stamped`` (the same ``writev``, without a Python list of pieces)."""


def _drop_written(views: list[memoryview], written: int) -> None:
    while written and views:
        if written >= len(views[0]):
            written -= len(views[0])
            views.pop(0)
        else:
            views[0] = views[0][written:]
            written = 0


def _interleaved(
    heads: bytes, view: memoryview, headers: list[BatchHeader]
) -> list[bytes | bytearray | memoryview]:
    """The pieces of stamped batches as the seam takes them: each stamped header (a slice
    of ``heads``), then the rest of its batch from ``view``."""
    pieces: list[bytes | bytearray | memoryview] = []
    position = 0
    for i, header in enumerate(headers):
        end = position + header[1] + LOG_OVERHEAD
        pieces.append(heads[i * BATCH_HEADER_SIZE : (i + 1) * BATCH_HEADER_SIZE])
        pieces.append(view[position + BATCH_HEADER_SIZE : end])
        position = end
    return pieces


def file_name(base_offset: int, suffix: str) -> str:
    """``00000000000000000042.log`` for base offset 42 and suffix ``.log``."""
    return f"{base_offset:020d}{suffix}"


def base_offset_of(name: str) -> int | None:
    """The base offset a segment file name encodes, or None when it is not one."""
    stem = name.split(".", 1)[0]
    if len(stem) == 20 and stem.isdigit():
        return int(stem)
    return None


@dataclass(frozen=True, slots=True)
class SegmentRead:
    """Whole batches read from one segment, starting at the batch that holds ``first_offset``."""

    data: bytes
    position: int
    first_offset: int  # base offset of the first batch returned
    next_offset: int  # offset after the last batch returned


class LogSegment:
    """A segment's three files and the running state needed to append to it."""

    def __init__(
        self,
        directory: Path,
        base_offset: int,
        *,
        index_interval_bytes: int,
        max_index_size: int,
        active: bool,
        suffix: str = "",
        created_ms: int | None = None,
    ) -> None:
        self.directory = directory
        self.base_offset = base_offset
        self.index_interval_bytes = index_interval_bytes
        self.suffix = suffix
        self.log_path = directory / file_name(base_offset, LOG_SUFFIX + suffix)
        self._fd = os.open(self.log_path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        self._size = os.fstat(self._fd).st_size
        self._failed: KafkaStorageError | None = None
        """Set when a failed write could not be undone: no append is taken after it."""
        self.created_ms = created_ms
        self.active = active
        self.needs_index_rebuild = False
        self._open_indexes(max_index_size, active)
        self._bytes_since_last_index_entry = 0
        self._max_timestamp = -1
        self._offset_of_max_timestamp = base_offset
        self._next_offset: int | None = None
        self._first_batch_timestamp: int | None = None
        self._read_ends: dict[int, int] = {}
        """Where earlier reads ended: the offset after a read's last batch -> the file
        position after it (the next batch's start), oldest first; forgotten when the file
        is cut (truncation, recovery)."""

    @classmethod
    def for_config(
        cls,
        directory: Path,
        base_offset: int,
        config: LogConfig,
        *,
        active: bool,
        suffix: str = "",
        created_ms: int | None = None,
    ) -> LogSegment:
        """Open (or create) a segment with the index settings of a topic's ``config``."""
        return cls(
            directory,
            base_offset,
            index_interval_bytes=config.index_interval_bytes,
            max_index_size=config.segment_index_bytes,
            active=active,
            suffix=suffix,
            created_ms=created_ms,
        )

    def _open_indexes(self, max_index_size: int, active: bool) -> None:
        paths = [
            self.directory / file_name(self.base_offset, suffix + self.suffix)
            for suffix in (INDEX_SUFFIX, TIME_INDEX_SUFFIX)
        ]
        if self._size and not (paths[0].exists() and paths[1].exists()):
            # A lost index file would come back empty: rebuild rather than trust that.
            self.needs_index_rebuild = True
        try:
            self.offset_index = OffsetIndex(
                paths[0], self.base_offset, max_index_size, writable=active
            )
        except CorruptIndexError:
            # A torn index file (size not a multiple of its entries): start it anew.
            paths[0].unlink()
            self.offset_index = OffsetIndex(
                paths[0], self.base_offset, max_index_size, writable=active
            )
            self.needs_index_rebuild = True
        try:
            self.time_index = TimeIndex(paths[1], self.base_offset, max_index_size, writable=active)
        except CorruptIndexError:
            paths[1].unlink()
            self.time_index = TimeIndex(paths[1], self.base_offset, max_index_size, writable=active)
            self.needs_index_rebuild = True

    # -- state ------------------------------------------------------------------------

    @property
    def size(self) -> int:
        return self._size

    @property
    def next_offset(self) -> int:
        """The offset after the last batch in the segment (its base offset when empty)."""
        if self._next_offset is None:
            self.load_tail_state()
        assert self._next_offset is not None
        return self._next_offset

    @property
    def max_timestamp(self) -> int:
        if self._next_offset is None:
            self.load_tail_state()
        return self._max_timestamp

    @property
    def offset_of_max_timestamp(self) -> int:
        if self._next_offset is None:
            self.load_tail_state()
        return self._offset_of_max_timestamp

    @property
    def largest_timestamp(self) -> int:
        """What retention compares: the largest record timestamp, else the file's mtime."""
        if self.max_timestamp >= 0:
            return self.max_timestamp
        return int(os.fstat(self._fd).st_mtime * 1000)

    @property
    def first_batch_timestamp(self) -> int | None:
        """The max timestamp of the first batch: what ``segment.ms`` rolls by (Kafka's rule)."""
        if self._first_batch_timestamp is None and self._size >= BATCH_HEADER_SIZE:
            header = self._header_at(0)
            self._first_batch_timestamp = header.max_timestamp
        return self._first_batch_timestamp

    def should_roll(
        self,
        incoming: int,
        last_offset: int,
        max_timestamp: int,
        segment_bytes: int,
        roll_after_ms: int,
    ) -> bool:
        """Kafka's roll rules for an append of ``incoming`` bytes ending at ``last_offset``
        whose largest timestamp is ``max_timestamp``: roll when the offset does not fit the
        32-bit relative offsets, or, unless the segment is empty, when the bytes would pass
        ``segment_bytes``, when the records are more than ``roll_after_ms`` (``segment.ms``
        less its jitter) younger than the first batch's, or when an index is full. Read
        from the fields directly: every append asks."""
        if not 0 <= last_offset - self.base_offset <= INT32_MAX:
            return True
        size = self._size
        if size == 0:
            return False
        if size > segment_bytes - incoming:
            return True
        first_ts = self._first_batch_timestamp
        if first_ts is None:
            first_ts = self.first_batch_timestamp
        if first_ts is not None and max_timestamp - first_ts > roll_after_ms:
            return True
        return self.offset_index.is_full or self.time_index.is_full

    def can_convert_to_relative_offset(self, offset: int) -> bool:
        return 0 <= offset - self.base_offset <= INT32_MAX

    # -- appending --------------------------------------------------------------------

    def append(
        self, data: bytes | bytearray | memoryview, batches: list[tuple[int, BatchHeader]]
    ) -> None:
        """Append whole, validated batches (``batches`` gives each one's position in ``data``)."""
        self.append_pieces([data], batches, len(data))

    def append_pieces(
        self,
        pieces: list[bytes | bytearray | memoryview],
        batches: list[tuple[int, BatchHeader]],
        total: int,
    ) -> None:
        """Append batches given as consecutive pieces of bytes, written with one ``writev``.

        ``batches`` gives each batch's position within the concatenation of the pieces,
        ``total`` the pieces' combined length.
        """
        if not batches:
            return
        if self._failed is not None:
            raise self._failed
        start = self._size
        try:
            _write_fully(self._fd, pieces, total)
        except OSError as e:
            self._undo_partial_write(start, e)
        self._note_appended(start, total, [header for _, header in batches])

    def append_stamped(
        self,
        stamped: bytes,
        data: bytes | memoryview,
        headers: list[BatchHeader],
        last_offset: int,
        max_timestamp: int,
    ) -> None:
        """Append whole, validated batches (a leader's append) ending at ``last_offset``,
        whose largest timestamp is ``max_timestamp``: ``data`` holds them as the producer
        sent them, ``stamped`` (from :data:`~highwater.records.header.stamp_batches`) their
        stamped 61-byte headers one after another, and ``headers``, when there are several,
        the same as tuples in order (one batch needs none: what a producer's request
        carries per partition). :data:`~highwater.records.header.write_stamped` writes each
        stamped header followed by the rest of its batch from ``data``, which is not copied
        (``data`` is ``bytes`` or a memoryview of bytes), in one compiled ``writev``; while
        the write seam :func:`_write_fully` is replaced (the simulation's disk faults), the
        same pieces go to the replacement instead, so that no write escapes it."""
        if self._failed is not None:
            raise self._failed
        start = self._size
        total = len(data)
        several = len(headers) > 1
        try:
            if _write_fully is _WRITE_FULLY and write_stamped is not None:
                write_stamped(self._fd, stamped, data)
            elif several:
                _write_fully(self._fd, _interleaved(stamped, memoryview(data), headers), total)
            else:
                _write_fully(self._fd, [stamped, memoryview(data)[BATCH_HEADER_SIZE:]], total)
        except OSError as e:
            self._undo_partial_write(start, e)
        if several:
            self._note_appended(start, total, headers)
            return
        # One batch: _note_appended's steps, inline (this runs per produce request).
        if max_timestamp > self._max_timestamp:
            self._max_timestamp = max_timestamp
            self._offset_of_max_timestamp = last_offset
        since = self._bytes_since_last_index_entry
        if since > self.index_interval_bytes:
            self.offset_index.append(last_offset, start)
            self.time_index.maybe_append(self._max_timestamp, self._offset_of_max_timestamp)
            since = 0
        self._bytes_since_last_index_entry = since + total
        if start == 0 and self._first_batch_timestamp is None:
            self._first_batch_timestamp = max_timestamp
        self._size = start + total
        self._next_offset = last_offset + 1

    def _note_appended(self, start: int, total: int, headers: list[BatchHeader]) -> None:
        """The bookkeeping after ``total`` bytes of consecutive batches were written at
        ``start``: largest timestamp, sparse index entries, size and next offset."""
        interval = self.index_interval_bytes
        since = self._bytes_since_last_index_entry
        position = start
        for header in headers:
            last_offset = header[0] + header[6]
            if header[8] > self._max_timestamp:
                self._max_timestamp = header[8]
                self._offset_of_max_timestamp = last_offset
            if since > interval:
                self.offset_index.append(last_offset, position)
                self.time_index.maybe_append(self._max_timestamp, self._offset_of_max_timestamp)
                since = 0
            size = header[1] + LOG_OVERHEAD
            since += size
            position += size
        self._bytes_since_last_index_entry = since
        if self._first_batch_timestamp is None and start == 0:
            self._first_batch_timestamp = headers[0][8]
        self._size = start + total
        last = headers[-1]
        self._next_offset = last[0] + last[6] + 1

    def _undo_partial_write(self, size: int, error: OSError) -> NoReturn:
        """A write failed (ENOSPC, EIO) after writing part of its bytes, or none: cut the
        file back to ``size``, so that the log ends at its last whole batch, and raise
        :class:`KafkaStorageError`. If even that fails, the segment refuses every later
        append: a torn batch must never have batches appended after it."""
        try:
            os.ftruncate(self._fd, size)
        except OSError as cut:
            self._failed = KafkaStorageError(
                f"{self.log_path}: a write failed ({error.strerror}) and its partial bytes "
                f"could not be removed ({cut.strerror}); the segment takes no more appends"
            )
            raise self._failed from error
        raise KafkaStorageError(
            f"{self.log_path}: write failed: {error.strerror or error}; nothing was appended"
        ) from error

    # -- reading ----------------------------------------------------------------------

    def _header_at(self, position: int) -> BatchHeader:
        raw = os.pread(self._fd, BATCH_HEADER_SIZE, position)
        if len(raw) < BATCH_HEADER_SIZE:
            raise CorruptSegmentError(
                str(self.log_path), position, f"truncated batch header ({len(raw)} bytes)"
            )
        header = BatchHeader._make(HEADER_STRUCT.unpack_from(raw))
        if (
            header.magic != MAGIC
            or header.batch_length < BATCH_HEADER_SIZE - LOG_OVERHEAD
            or position + header.size > self._size
            or header.last_offset_delta < 0
            or header.base_offset < self.base_offset
        ):
            raise CorruptSegmentError(
                str(self.log_path),
                position,
                f"no valid batch header (magic {header.magic}, length {header.batch_length}, "
                f"base offset {header.base_offset})",
            )
        return header

    def iter_headers(self, position: int = 0) -> Iterator[tuple[int, BatchHeader]]:
        """Batch headers from ``position`` to the end, as (position, header).

        The file is read in chunks, so a scan costs one read per chunk, not per batch.
        """
        size = self._size
        while position < size:
            chunk = os.pread(self._fd, min(_SCAN_CHUNK, size - position), position)
            pos, end = 0, len(chunk)
            while pos + BATCH_HEADER_SIZE <= end:
                header = BatchHeader._make(HEADER_STRUCT.unpack_from(chunk, pos))
                if (
                    header[3] != MAGIC
                    or header[1] < BATCH_HEADER_SIZE - LOG_OVERHEAD
                    or position + pos + header[1] + LOG_OVERHEAD > size
                    or header[6] < 0
                    or header[0] < self.base_offset
                ):
                    self._header_at(position + pos)  # raises CorruptSegmentError, with detail
                yield position + pos, header
                pos += header[1] + LOG_OVERHEAD
            if pos == 0:
                self._header_at(position)  # less than a header left: raises
            position += pos

    def translate_offset(
        self, offset: int, starting_position: int = 0
    ) -> tuple[int, BatchHeader] | None:
        """The first batch whose last offset is >= ``offset``, as (position, header).

        The index entry used is checked against the batch it points at; an index that
        disagrees with the log is rebuilt from the log and the lookup retried.
        """
        indexed_offset, position = self.offset_index.lookup(offset)
        if position > starting_position:
            try:
                found = self._scan_for(offset, position, expect_last_offset=indexed_offset)
            except (CorruptSegmentError, CorruptIndexError) as problem:
                log.warning("%s: rebuilding indexes: %s", self.log_path, problem)
                self.rebuild_indexes()
                position = max(self.offset_index.lookup(offset)[1], starting_position)
                return self._scan_for(offset, position)
            return found
        return self._scan_for(offset, starting_position)

    def _scan_for(
        self, offset: int, position: int, *, expect_last_offset: int | None = None
    ) -> tuple[int, BatchHeader] | None:
        """Scan batch headers from ``position`` in chunks for the batch holding ``offset``."""
        size = self._size
        fd = self._fd
        while position < size:
            chunk = os.pread(fd, min(_SCAN_CHUNK, size - position), position)
            end = len(chunk)
            pos = 0
            while pos + BATCH_HEADER_SIZE <= end:
                base_offset, length, _, magic = _PREFIX.unpack_from(chunk, pos)
                last_offset = base_offset + _INT32.unpack_from(chunk, pos + 23)[0]
                batch_size = length + LOG_OVERHEAD
                if (
                    magic != MAGIC
                    or length < BATCH_HEADER_SIZE - LOG_OVERHEAD
                    or position + pos + batch_size > size
                    or last_offset < base_offset
                    or base_offset < self.base_offset
                ):
                    raise CorruptSegmentError(
                        str(self.log_path),
                        position + pos,
                        f"no valid batch header (magic {magic}, length {length}, "
                        f"base offset {base_offset})",
                    )
                if expect_last_offset is not None:
                    if last_offset != expect_last_offset:
                        raise CorruptIndexError(
                            f"{self.offset_index.path}: entry for offset {expect_last_offset} "
                            f"points at the batch ending at {last_offset}"
                        )
                    expect_last_offset = None
                if last_offset >= offset:
                    header = BatchHeader._make(HEADER_STRUCT.unpack_from(chunk, pos))
                    return position + pos, header
                pos += batch_size
            if pos == 0:
                # Less than a header left before the end of the file.
                self._header_at(position)
            position += pos
        return None

    def read(
        self,
        start_offset: int,
        max_bytes: int,
        *,
        max_offset: int | None = None,
        min_one_batch: bool = True,
    ) -> SegmentRead | None:
        """Whole batches from the one holding ``start_offset``, at most ``max_bytes`` of them;
        ``None`` if this segment has none at or after ``start_offset`` below ``max_offset``.

        Batches whose base offset is ``max_offset`` or more are left out (a consumer reads up
        to the high watermark). With ``min_one_batch`` the first batch is returned even when
        it is larger than ``max_bytes``, so that a consumer always makes progress; without
        it, a first batch larger than ``max_bytes`` gives an empty read that ends where it
        started.

        A read that starts where an earlier one ended (a consumer's or a follower's next
        fetch, at the offset after the last batch it got) starts at that read's end
        position (:attr:`_read_ends`): one ``pread`` of the batches, where the index lookup
        and header scan take one or two more (the index's entry is the batch before, and a
        batch larger than the scan's 16 KiB chunk takes a second chunk). The entry is kept
        after it is used, so every reader at the tail (at RF 3 two followers and a consumer
        read each new batch from the same offset) takes the short way.
        """
        size = self._size
        position = self._read_ends.get(start_offset, -1)
        data: bytes | None = None
        first: BatchHeader | None = None
        if position >= 0 and position + BATCH_HEADER_SIZE <= size:
            want = min(max_bytes, size - position)
            boundary = self.offset_index.batch_start_at_most(position + want)
            if want < size - position and boundary is not None and boundary > position:
                want = boundary - position
            data = os.pread(self._fd, max(want, BATCH_HEADER_SIZE), position)
            first = self._batch_at_read_end(data, start_offset)
            if first is None:
                data = None
                self._read_ends.pop(start_offset, None)
        if first is None:
            found = self.translate_offset(start_offset)
            if found is None:
                return None
            position, first = found
        if max_offset is not None and first.base_offset >= max_offset:
            return None
        want = max(max_bytes, first.size) if min_one_batch else max_bytes
        want = min(want, size - position)
        if want < first.size:
            # No room for the first batch (without ``min_one_batch``): nothing is read, and
            # the next read starts here again; a later batch must not be returned instead.
            return SegmentRead(b"", position, start_offset, start_offset)
        if data is None or len(data) < first.size:
            if want < size - position:
                # Up to the last indexed batch start within reach: the read then ends at a
                # batch boundary and is returned as read, not copied to cut a partial batch
                # off (a wrong entry only means a partial batch, cut as before).
                boundary = self.offset_index.batch_start_at_most(position + want)
                if boundary is not None and boundary >= position + first.size:
                    want = boundary - position
            data = os.pread(self._fd, want, position)
        available = len(data)
        end = first.size
        last_position = 0
        while end + BATCH_HEADER_SIZE <= available:
            base_offset, length, _, magic = _PREFIX.unpack_from(data, end)
            if magic != MAGIC or length < BATCH_HEADER_SIZE - LOG_OVERHEAD:
                raise CorruptSegmentError(
                    str(self.log_path), position + end, "no valid batch header"
                )
            batch_size = length + LOG_OVERHEAD
            if end + batch_size > available:
                break
            if max_offset is not None and base_offset >= max_offset:
                break
            last_position = end
            end += batch_size
        if last_position:
            last_base = _INT64.unpack_from(data, last_position)[0]
            next_offset = last_base + _INT32.unpack_from(data, last_position + 23)[0] + 1
        else:
            next_offset = first.next_offset
        # The entry this read started from stays: the other readers at the tail (each
        # follower, the consumers) start there too.
        read_ends = self._read_ends
        if next_offset not in read_ends:
            if len(read_ends) >= _READ_ENDS_KEPT:
                del read_ends[next(iter(read_ends))]  # the oldest
            read_ends[next_offset] = position + end
        return SegmentRead(
            data=data if end == available else data[:end],
            position=position,
            first_offset=first.base_offset,
            next_offset=next_offset,
        )

    def _batch_at_read_end(self, data: bytes, start_offset: int) -> BatchHeader | None:
        """The header at the start of ``data``, read at an earlier read's end position for
        ``start_offset``, if it is the batch such a read starts with (a sound header whose
        last offset is at or after ``start_offset``); None: look the offset up instead."""
        if len(data) < BATCH_HEADER_SIZE:
            return None
        header = BatchHeader._make(HEADER_STRUCT.unpack_from(data, 0))
        if (
            header.magic != MAGIC
            or header.batch_length < BATCH_HEADER_SIZE - LOG_OVERHEAD
            or header.base_offset < self.base_offset
            or header.last_offset_delta < 0
            or header.base_offset + header.last_offset_delta < start_offset
        ):
            return None
        return header

    def read_bytes(self, position: int, size: int) -> bytes:
        return os.pread(self._fd, size, position)

    def find_offset_by_timestamp(
        self, timestamp: int, starting_offset: int
    ) -> tuple[int, int] | None:
        """The first record at or after ``timestamp`` with offset >= ``starting_offset``.

        Returns (record timestamp, offset), or None when every record here is older.
        """
        from highwater.records.batch import RecordBatch

        if self.max_timestamp < timestamp:
            return None
        entry = self.time_index.lookup_before(timestamp)
        position = 0
        if entry is not None:
            found = self.translate_offset(entry[1])
            if (
                found is None
                or found[1].last_offset != entry[1]
                or found[1].max_timestamp != entry[0]
            ):
                log.warning(
                    "%s: rebuilding indexes: time index disagrees with the log", self.log_path
                )
                self.rebuild_indexes()
                return self.find_offset_by_timestamp(timestamp, starting_offset)
            position = found[0]
        start = self.translate_offset(starting_offset)
        if start is None:
            return None
        position = max(position, start[0])
        for pos, header in self.iter_headers(position):
            if header.max_timestamp < timestamp:
                continue
            batch = RecordBatch(self.read_bytes(pos, header.size))
            for record in batch.records():
                if record.timestamp >= timestamp and record.offset >= starting_offset:
                    return record.timestamp, record.offset
        return None

    # -- recovery ---------------------------------------------------------------------

    def load_tail_state(self) -> None:
        """Find next offset, largest timestamp and index bookkeeping from the indexes' tails.

        Used when a segment is opened without recovery (its contents are trusted): only the
        batches after the last offset-index entry are read. Each offset-index entry is made
        with a time-index entry for the largest timestamp so far when it grew, so that
        largest timestamp is the time index's last entry or in those batches. A time index
        that is empty beside an offset index that is not (lost in a crash, say, beside a
        log that was not) breaks that: then every batch is read, as Kafka's
        ``loadLargestTimestamp`` reads from the time index's last entry, so that a
        segment's largest timestamp is never taken from its last batches alone (lookups by
        time would skip it, and time retention delete it early).
        """
        size = self._size
        last_ts_entry = self.time_index.last_entry()
        if last_ts_entry is not None:
            max_timestamp, offset_of_max = last_ts_entry
        else:
            max_timestamp, offset_of_max = -1, self.base_offset
        _, index_position = self.offset_index.last_entry()
        if index_position >= size:
            index_position = 0
        timestamp_position = 0 if last_ts_entry is None else index_position
        next_offset = self.base_offset
        since = 0
        for position, header in self.iter_headers(timestamp_position):
            if header.max_timestamp > max_timestamp:
                max_timestamp = header.max_timestamp
                offset_of_max = header.last_offset
            if position >= index_position:
                since += header.size
            next_offset = header.next_offset
        self._max_timestamp, self._offset_of_max_timestamp = max_timestamp, offset_of_max
        self._bytes_since_last_index_entry = since
        self._next_offset = next_offset

    def recover(
        self,
        *,
        max_batch_size: int,
        on_batch: Callable[[BatchHeader], None] | None = None,
        protect_below: int = 0,
    ) -> int:
        """Re-validate every batch, rebuild both indexes and cut a torn or corrupt tail.

        Returns the number of bytes truncated. ``on_batch`` sees, in order, each valid batch
        that raises the partition leader epoch above the segment's earlier batches or carries
        a producer id (:func:`~highwater.records.header.scan_batches`): what recovery
        re-derives the epoch cache and the producers' state from.
        When the first invalid batch holds offsets below ``protect_below`` (the recovery
        point: data known to be flushed) nothing is cut and :class:`CorruptSegmentError`
        names the file and byte instead.
        """
        self.offset_index.make_writable()
        self.time_index.make_writable()
        self.offset_index.reset()
        self.time_index.reset()
        self._bytes_since_last_index_entry = 0
        self._max_timestamp, self._offset_of_max_timestamp = -1, self.base_offset
        self._first_batch_timestamp = None
        valid = 0
        next_offset = self.base_offset
        size = self._size
        if size:
            with mmap.mmap(self._fd, size, access=mmap.ACCESS_READ) as mm:
                # One walk over the whole segment (compiled, with the compiled codec): no
                # Python object per batch but the notable batches; the index entries come
                # encoded as the index files hold them, each index written with one copy.
                scan = scan_batches(
                    mm,
                    0,
                    size,
                    next_offset=next_offset,
                    max_offset=self.base_offset + INT32_MAX,
                    max_batch_size=max_batch_size,
                    index_interval=self.index_interval_bytes,
                    offset_of_max_timestamp=self.base_offset,
                    index_base_offset=self.base_offset,
                )
            self.offset_index.append_encoded(scan.offset_index)
            self.time_index.append_encoded(scan.time_index)
            if on_batch is not None:
                for header in scan.notable:
                    on_batch(header)
            valid, next_offset = scan.end, scan.next_offset
            self._max_timestamp = scan.max_timestamp
            self._offset_of_max_timestamp = scan.offset_of_max_timestamp
            self._bytes_since_last_index_entry = scan.since_index_entry
        truncated = size - valid
        if truncated and next_offset < protect_below:
            raise CorruptSegmentError(
                str(self.log_path),
                valid,
                f"invalid batch at offset {next_offset}, below the recovery point "
                f"{protect_below}: flushed data is damaged; the segment was left as it is",
            )
        if truncated:
            os.ftruncate(self._fd, valid)
            self._size = valid
            self._read_ends.clear()
        self._next_offset = next_offset
        self.needs_index_rebuild = False
        if not self.active:
            self.offset_index.trim()
            self.time_index.trim()
        return truncated

    def rebuild_indexes(self) -> None:
        """Rebuild both indexes from the log (which must be valid up to its end).

        The log is never cut here: an invalid batch raises :class:`CorruptSegmentError`
        naming its byte and leaves the file as it is (only crash recovery cuts a torn tail).
        """
        try:
            self.recover(max_batch_size=INT32_MAX, protect_below=2**63 - 1)
        except CorruptSegmentError as error:
            raise CorruptSegmentError(
                str(self.log_path),
                error.position,
                "invalid batch found while rebuilding indexes; the segment was left as it is",
            ) from None

    def sanity_check(self) -> None:
        """Check the indexes against the log; raise CorruptIndexError when they disagree.

        Both indexes must be ordered and inside the log, and the last entry of each must
        match the batch it points at (so the segment's largest timestamp, which retention
        uses, is right). Other entries are checked when a lookup uses them.
        """
        self.offset_index.sanity_check(self._size)
        if self.offset_index.entries:
            indexed_offset, position = self.offset_index.last_entry()
            header = self._header_at(position)
            if header.last_offset != indexed_offset:
                raise CorruptIndexError(
                    f"{self.offset_index.path}: last entry ({indexed_offset}, {position}) points "
                    f"at the batch ending at {header.last_offset}"
                )
        if self._next_offset is None:
            self.load_tail_state()
        self.time_index.sanity_check(self.next_offset)
        last = self.time_index.last_entry()
        if last is not None:
            found = (
                self._scan_for(last[1], 0)
                if not self.offset_index.entries
                else (self.translate_offset(last[1]))
            )
            if (
                found is None
                or found[1].last_offset != last[1]
                or found[1].max_timestamp != last[0]
            ):
                raise CorruptIndexError(
                    f"{self.time_index.path}: last entry ({last[0]}, {last[1]}) does not match "
                    f"the batch it points at"
                )

    def verify(self) -> Iterator[tuple[int, BatchHeader | None, str | None]]:
        """Check every batch's structure and CRC: (position, header or None, problem or None)."""
        position = 0
        while position < self._size:
            raw = os.pread(self._fd, BATCH_HEADER_SIZE, position)
            if len(raw) < BATCH_HEADER_SIZE:
                yield position, None, f"truncated batch header ({len(raw)} bytes)"
                return
            length = _INT32.unpack_from(raw, 8)[0]
            size = length + LOG_OVERHEAD
            data = os.pread(self._fd, max(size, BATCH_HEADER_SIZE), position)
            try:
                header = check_batch(data, 0, verify_crc=True)
            except HighwaterError as error:
                yield position, None, str(error)
                return
            yield position, header, None
            position += header.size

    # -- truncation and lifecycle -----------------------------------------------------

    def truncate_to(self, offset: int) -> int | None:
        """Remove every batch whose last offset is >= ``offset``.

        Truncation happens at a batch boundary: a batch that straddles ``offset`` goes too.
        Returns the base offset of the first batch removed, or None when none was.
        """
        found = self.translate_offset(offset)
        if found is None:
            return None
        position, header = found
        self.offset_index.truncate_to(header.base_offset)
        self.time_index.truncate_to(header.base_offset)
        os.ftruncate(self._fd, position)
        self._size = position
        self._read_ends.clear()
        if position == 0:
            self._first_batch_timestamp = None
        self._next_offset = None
        self.load_tail_state()
        return int(header.base_offset)

    def on_become_inactive(self) -> None:
        """Called when the segment rolls: record the final largest timestamp, trim indexes."""
        if self.max_timestamp >= 0:
            self.time_index.maybe_append(
                self._max_timestamp, self._offset_of_max_timestamp, skip_full_check=True
            )
        self.offset_index.trim()
        self.time_index.trim()
        self.active = False

    def make_active(self) -> None:
        self.offset_index.make_writable()
        self.time_index.make_writable()
        self.active = True

    @property
    def index_full(self) -> bool:
        return self.offset_index.is_full or self.time_index.is_full

    def flush(self, *, indexes: bool = True) -> None:
        """fsync the log and (unless ``indexes`` is false) both indexes. Safe to run in a
        worker thread. An index left unsynced stays marked changed, so the next flush that
        includes the indexes syncs it."""
        fd = self._fd
        if fd >= 0:
            os.fsync(fd)
        if indexes:
            self.flush_indexes()

    def flush_indexes(self) -> None:
        """fsync both indexes where they changed since their last sync."""
        self.offset_index.flush()
        self.time_index.flush()

    def close(self) -> None:
        self.offset_index.trim()
        self.time_index.trim()
        self.offset_index.close()
        self.time_index.close()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    @property
    def closed(self) -> bool:
        return self._fd < 0

    def files(self) -> list[Path]:
        return [self.log_path, self.offset_index.path, self.time_index.path]

    def change_suffix(self, old: str, new: str) -> None:
        """Rename all three files from suffix ``old`` to ``new`` (``.deleted``, ``.swap``...)."""

        def renamed(path: Path) -> Path:
            name = path.name[: len(path.name) - len(old)] if old else path.name
            return path.with_name(name + new)

        target = renamed(self.log_path)
        os.replace(self.log_path, target)
        self.log_path = target
        for index in (self.offset_index, self.time_index):
            if index.path.exists():
                index.rename(renamed(index.path))
            else:
                index.path = renamed(index.path)
        self.suffix = new

    def delete_files(self) -> None:
        """Close the segment and remove its files. The indexes are not trimmed first:
        nothing of them is kept, and their paths may no longer name their files. A segment
        pending deletion shares its ``.deleted`` names with a later one of the same base
        offset doomed meanwhile (a follower truncated twice to one segment boundary within
        ``file.delete.delay.ms``), whose rename replaced its files; the first deletion
        then removes the second's files, and trimming by path would fail on them (an I/O
        error that took the log directory offline)."""
        self.offset_index.close()
        self.time_index.close()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        for path in self.files():
            path.unlink(missing_ok=True)

    def __repr__(self) -> str:
        return f"LogSegment({self.log_path.name}, size={self._size})"
