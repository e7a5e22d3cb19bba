"""Sparse, memory-mapped segment indexes: ``.index`` (offset -> position) and ``.timeindex``.

Both files are arrays of fixed-size big-endian entries, kept sorted, so lookups are binary
searches over the memory map:

* ``.index``: 8-byte entries ``(relative_offset: int32, position: int32)``; the relative
  offset is the *last* offset of a batch minus the segment's base offset, the position the
  byte where that batch starts in the ``.log`` file.
* ``.timeindex``: 12-byte entries ``(timestamp: int64, relative_offset: int32)``; an entry
  is added when the largest timestamp seen in the segment grows, and points at the batch
  that carried it.

The index of the active segment is preallocated to ``segment.index.bytes`` and trimmed to
its entries when the segment rolls or the log closes. An index holds no file descriptor of
its own: it opens its file for a resize or an fsync and closes it again, and the memory
map (which keeps a duplicate descriptor) exists only once the index has an entry. A broker
with 10,000 idle partitions then holds one descriptor per partition (its ``.log``), not
five, and stays under a limit of 20,000 open files. An index is never trusted blindly:
:meth:`SparseIndex.sanity_check` rejects files whose entries are not increasing, and a
segment rebuilds its indexes from the log whenever one fails.
"""

from __future__ import annotations

import mmap
import os
import struct
from pathlib import Path
from typing import ClassVar

from highwater.errors import KafkaStorageError
from highwater.records.header import OFFSET_INDEX_ENTRY, TIME_INDEX_ENTRY


class CorruptIndexError(KafkaStorageError):
    """An index file whose entries are inconsistent; the segment rebuilds it from the log."""


class IndexFullError(KafkaStorageError):
    """The preallocated index has no room left: the segment must roll."""


_ZEROING_IN_PLACE_MAX = 64 * 1024
"""Up to this many bytes of entries are zeroed through the mapping; more, by resizing."""


_pack_offset_entry = OFFSET_INDEX_ENTRY.pack_into


class SparseIndex:
    """The shared machinery of the two index files: a resizable mmap of sorted entries."""

    ENTRY: ClassVar[struct.Struct]
    SUFFIX: ClassVar[str]

    def __init__(
        self, path: Path, base_offset: int, max_index_size: int, *, writable: bool
    ) -> None:
        self.path = path
        self.base_offset = base_offset
        entry_size = self.ENTRY.size
        self._entry_size = entry_size
        self.max_index_size = max_index_size
        self._max_entries = max(1, max_index_size // entry_size)
        exists = path.exists()
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            file_size = os.fstat(fd).st_size
        finally:
            os.close(fd)
        self._file_size = file_size
        if file_size % entry_size:
            raise CorruptIndexError(
                f"{path}: size {file_size} is not a multiple of the entry size {entry_size}"
            )
        self._entries = file_size // entry_size if exists else 0
        self.is_full = False
        """Whether no entry fits any more (the segment rolls): a field, kept with the entry
        count and the room wherever either changes, because every append reads it."""
        self._mmap: mmap.mmap | None = None
        self._dirty = True
        """Changed since the last :meth:`flush` (or not flushed since opened: its pages
        may still be only in the page cache). A sparse index changes only every
        ``index.interval.bytes``, so most flushes of the log have nothing to sync here."""
        if writable:
            self.resize(self._max_entries * entry_size)
        else:
            self._map(file_size)
            self._max_entries = self._entries
            self.is_full = True
        self._last: tuple[int, int] | None = (
            self._entry(self._entries - 1) if self._entries else None
        )

    def make_writable(self) -> None:
        """Preallocate the file again (the segment became the active one)."""
        self.resize(max(self.max_index_size, self.size_in_bytes))

    # -- file mapping -----------------------------------------------------------------

    def _map(self, size: int) -> None:
        if self._mmap is not None:
            self._mmap.close()
            self._mmap = None
        if size > 0:
            fd = os.open(self.path, os.O_RDWR)
            try:
                self._mmap = mmap.mmap(fd, size)
            finally:
                os.close(fd)

    def _set_file_size(self, size: int) -> None:
        if size != self._file_size:
            fd = os.open(self.path, os.O_RDWR)
            try:
                os.ftruncate(fd, size)
            finally:
                os.close(fd)
            self._file_size = size

    def resize(self, new_size: int) -> None:
        """Set the file size (rounded down to whole entries, never below the entries held).
        An index without entries keeps an empty file and no map: room for ``new_size``
        is made when the first entry is written."""
        entry_size = self._entry_size
        new_size = max(new_size - new_size % entry_size, self._entries * entry_size)
        self._max_entries = new_size // entry_size
        self.is_full = self._entries >= self._max_entries
        if self._entries == 0:
            self._map(0)
            self._set_file_size(0)
            self._dirty = True
            return
        if self._mmap is not None and self._mmap.size() == new_size:
            return
        self._map(0)
        self._set_file_size(new_size)
        self._map(new_size)
        self._dirty = True

    def trim(self) -> None:
        """Cut the preallocated tail so that the file holds exactly its entries."""
        self.resize(self._entries * self._entry_size)

    def flush(self) -> None:
        """Write the mapped entries back and fsync, unless nothing changed since the last
        flush. Safe in a worker thread while the owner appends: a change made meanwhile
        marks the index dirty again for the next flush."""
        if not self._dirty:
            return
        self._dirty = False
        if self._mmap is not None:
            self._mmap.flush()
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return  # renamed for deletion meanwhile: nothing left to make durable
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def close(self) -> None:
        self._map(0)

    def rename(self, new_path: Path) -> None:
        os.replace(self.path, new_path)
        self.path = new_path

    def delete(self) -> None:
        self.close()
        self.path.unlink(missing_ok=True)

    # -- entries ----------------------------------------------------------------------

    @property
    def entries(self) -> int:
        return self._entries

    @property
    def size_in_bytes(self) -> int:
        return self._entries * self._entry_size

    def _entry(self, n: int) -> tuple[int, int]:
        assert self._mmap is not None
        a, b = self.ENTRY.unpack_from(self._mmap, n * self._entry_size)
        return a, b

    def _write_entry(self, a: int, b: int) -> None:
        if self._entries >= self._max_entries:
            raise IndexFullError(f"{self.path}: index is full ({self._entries} entries)")
        if self._mmap is None:  # the first entry: make the room resize() left unmade
            size = self._max_entries * self._entry_size
            self._set_file_size(size)
            self._map(size)
        assert self._mmap is not None
        self.ENTRY.pack_into(self._mmap, self._entries * self._entry_size, a, b)
        self._entries += 1
        self.is_full = self._entries >= self._max_entries
        self._last = (a, b)
        self._dirty = True

    def _write_entries(self, data: bytes) -> None:
        """Write whole encoded entries after the last one with one copy into the map.

        The caller vouches that they are ordered as the file requires and follow the last
        entry (crash recovery's walk encodes them so: :attr:`BatchScan.offset_index
        <highwater.records.header.BatchScan.offset_index>`). Entries beyond the room left
        raise :class:`IndexFullError` and none is written.
        """
        entry_size = self._entry_size
        count, partial = divmod(len(data), entry_size)
        if partial:
            raise ValueError(f"{len(data)} bytes are not whole {entry_size}-byte entries")
        if not count:
            return
        if self._entries + count > self._max_entries:
            raise IndexFullError(
                f"{self.path}: index is full ({self._entries} entries, {count} more to write)"
            )
        if self._mmap is None:
            size = self._max_entries * entry_size
            self._set_file_size(size)
            self._map(size)
        assert self._mmap is not None
        start = self._entries * entry_size
        self._mmap[start : start + len(data)] = data
        self._entries += count
        self.is_full = self._entries >= self._max_entries
        a, b = self.ENTRY.unpack_from(data, len(data) - entry_size)
        self._last = (a, b)
        self._dirty = True

    def _largest_at_most(self, key: int, key_field: int) -> int:
        """Slot of the last entry whose ``key_field`` is <= key, or -1."""
        lo, hi = 0, self._entries - 1
        result = -1
        if hi < 0:
            return result
        last = self._last
        if last is not None and last[key_field] <= key:
            # Past the last entry: a read at the log's tail (a follower's fetch, a caught
            # up consumer's) needs no search.
            return hi
        unpack = self.ENTRY.unpack_from
        mm = self._mmap
        assert mm is not None
        size = self._entry_size
        while lo <= hi:
            mid = (lo + hi) >> 1
            if unpack(mm, mid * size)[key_field] <= key:
                result = mid
                lo = mid + 1
            else:
                hi = mid - 1
        return result

    def truncate_entries(self, n: int) -> None:
        """Keep the first ``n`` entries, zeroing the rest of the preallocated region."""
        n = max(0, min(n, self._entries))
        if self._mmap is not None and n < self._entries:
            start, end = n * self._entry_size, self._entries * self._entry_size
            if end - start <= _ZEROING_IN_PLACE_MAX:
                self._mmap[start:end] = bytes(end - start)
            else:
                # A preallocated index reopened after an unclean shutdown counts its whole
                # region as entries. Cutting the file and growing it back zeroes the tail
                # without touching its pages (writing zeros through the mapping cost 17 ms
                # per 10 MiB index: seconds for a broker with a thousand partitions).
                mapped = self._mmap.size()
                self._map(0)
                self._set_file_size(start)
                self._set_file_size(mapped)
                self._map(mapped)
            self._dirty = True
        self._entries = n
        self.is_full = n >= self._max_entries
        self._last = self._entry(n - 1) if n else None

    def reset(self) -> None:
        self.truncate_entries(0)


class OffsetIndex(SparseIndex):
    """The ``.index`` file: last offset of a batch (relative) -> file position of the batch."""

    ENTRY = OFFSET_INDEX_ENTRY
    SUFFIX = ".index"

    def last_entry(self) -> tuple[int, int]:
        """The (absolute offset, position) of the last entry, or (base_offset, 0)."""
        if self._entries == 0:
            return self.base_offset, 0
        relative, position = self._entry(self._entries - 1)
        return self.base_offset + relative, position

    def entry(self, n: int) -> tuple[int, int]:
        relative, position = self._entry(n)
        return self.base_offset + relative, position

    def lookup(self, offset: int) -> tuple[int, int]:
        """The last entry at or below ``offset`` as (absolute offset, position), or (base, 0)."""
        slot = self._largest_at_most(offset - self.base_offset, 0)
        if slot < 0:
            return self.base_offset, 0
        relative, position = self._entry(slot)
        return self.base_offset + relative, position

    def batch_start_at_most(self, position: int) -> int | None:
        """The last indexed batch's file position at or below ``position``, or ``None``."""
        slot = self._largest_at_most(position, 1)
        return None if slot < 0 else self._entry(slot)[1]

    def append(self, offset: int, position: int) -> None:
        relative = offset - self.base_offset
        last = self._last
        if last is not None and (relative <= last[0] or position <= last[1]):
            raise CorruptIndexError(
                f"{self.path}: entry ({offset}, {position}) does not follow "
                f"({self.base_offset + last[0]}, {last[1]})"
            )
        entries = self._entries
        if entries >= self._max_entries or self._mmap is None:
            self._write_entry(relative, position)  # the first entry, or a full index
            return
        # _write_entry's steps, inline: an append of a 16 KiB batch makes one entry.
        _pack_offset_entry(self._mmap, entries * 8, relative, position)
        entries += 1
        self._entries = entries
        self.is_full = entries >= self._max_entries
        self._last = (relative, position)
        self._dirty = True

    def append_encoded(self, data: bytes) -> None:
        """Append entries already encoded (crash recovery rebuilding the index in one copy).

        The first must follow the last entry held, as :meth:`append` checks; the rest
        follow one another by the encoder's construction."""
        if data and self._last is not None:
            relative, position = self.ENTRY.unpack_from(data)
            self._check_follows(relative, position)
        self._write_entries(data)

    def _check_follows(self, relative: int, position: int) -> None:
        assert self._last is not None
        last_relative, last_position = self._last
        if relative <= last_relative or position <= last_position:
            raise CorruptIndexError(
                f"{self.path}: entry ({self.base_offset + relative}, {position}) does not "
                f"follow ({self.base_offset + last_relative}, {last_position})"
            )

    def truncate_to(self, offset: int) -> None:
        """Remove the entries for offsets >= ``offset``."""
        self.truncate_entries(self._largest_at_most(offset - self.base_offset - 1, 0) + 1)

    def sanity_check(self, log_size: int) -> None:
        """Raise :class:`CorruptIndexError` unless offsets and positions strictly increase."""
        previous_relative, previous_position = -1, -1
        for n in range(self._entries):
            relative, position = self._entry(n)
            if relative <= previous_relative or position <= previous_position or position < 0:
                if n == 0 and relative == 0 and position == 0:
                    previous_relative, previous_position = 0, 0
                    continue
                raise CorruptIndexError(
                    f"{self.path}: entry {n} ({relative}, {position}) does not follow "
                    f"({previous_relative}, {previous_position})"
                )
            if position >= log_size:
                raise CorruptIndexError(
                    f"{self.path}: entry {n} points at byte {position}, past the log's "
                    f"{log_size} bytes"
                )
            previous_relative, previous_position = relative, position


class TimeIndex(SparseIndex):
    """The ``.timeindex`` file: largest timestamp so far -> the (relative) offset carrying it."""

    ENTRY = TIME_INDEX_ENTRY
    SUFFIX = ".timeindex"

    def last_entry(self) -> tuple[int, int] | None:
        """The (timestamp, absolute offset) of the last entry, or None when empty."""
        if self._entries == 0:
            return None
        timestamp, relative = self._entry(self._entries - 1)
        return timestamp, self.base_offset + relative

    def entry(self, n: int) -> tuple[int, int]:
        timestamp, relative = self._entry(n)
        return timestamp, self.base_offset + relative

    def lookup_before(self, timestamp: int) -> tuple[int, int] | None:
        """The last entry with a timestamp strictly below ``timestamp``, or None.

        Every record before that entry's offset has a smaller timestamp still, so a scan
        for the first record at or after ``timestamp`` may start at the entry's batch.
        """
        slot = self._largest_at_most(timestamp - 1, 0)
        if slot < 0:
            return None
        ts, relative = self._entry(slot)
        return ts, self.base_offset + relative

    def maybe_append(self, timestamp: int, offset: int, *, skip_full_check: bool = False) -> None:
        """Add an entry when ``timestamp`` is larger than the last one (and offset not smaller)."""
        relative = offset - self.base_offset
        if self._last is not None:
            last_ts, last_relative = self._last
            if timestamp <= last_ts:
                return
            if relative < last_relative:
                raise CorruptIndexError(
                    f"{self.path}: entry ({timestamp}, {offset}) goes back from offset "
                    f"{self.base_offset + last_relative}"
                )
        if skip_full_check and self.is_full:
            self.resize((self._entries + 1) * self._entry_size)
        self._write_entry(timestamp, relative)

    def append_encoded(self, data: bytes) -> None:
        """Append entries already encoded, as :meth:`maybe_append` would have taken them one
        by one (crash recovery rebuilding the index in one copy). The first must carry a
        larger timestamp than the last entry held and not go back in offsets."""
        if data and self._last is not None:
            timestamp, relative = self.ENTRY.unpack_from(data)
            last_ts, last_relative = self._last
            if timestamp <= last_ts or relative < last_relative:
                raise CorruptIndexError(
                    f"{self.path}: entry ({timestamp}, {self.base_offset + relative}) does "
                    f"not follow ({last_ts}, {self.base_offset + last_relative})"
                )
        self._write_entries(data)

    def truncate_to(self, offset: int) -> None:
        """Remove the entries pointing at offsets >= ``offset``."""
        keep = self._entries
        while keep > 0 and self._entry(keep - 1)[1] + self.base_offset >= offset:
            keep -= 1
        self.truncate_entries(keep)

    def sanity_check(self, next_offset: int) -> None:
        previous_ts, previous_relative = None, -1
        for n in range(self._entries):
            timestamp, relative = self._entry(n)
            if (
                previous_ts is not None and timestamp <= previous_ts
            ) or relative < previous_relative:
                raise CorruptIndexError(
                    f"{self.path}: entry {n} ({timestamp}, {relative}) does not follow "
                    f"({previous_ts}, {previous_relative})"
                )
            if self.base_offset + relative >= max(next_offset, self.base_offset + 1):
                raise CorruptIndexError(
                    f"{self.path}: entry {n} points at offset {self.base_offset + relative}, "
                    f"past the segment's end {next_offset}"
                )
            previous_ts, previous_relative = timestamp, relative
