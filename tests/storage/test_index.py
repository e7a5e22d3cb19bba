"""The sparse offset and time indexes: lookups, appends, trimming, sanity checks."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from highwater.storage.index import CorruptIndexError, IndexFullError, OffsetIndex, TimeIndex


def test_offset_index_lookup_finds_last_entry_at_or_below(tmp_path: Path) -> None:
    index = OffsetIndex(tmp_path / "x.index", 100, 800, writable=True)
    for i in range(1, 50):
        index.append(100 + i * 10, i * 1000)
    assert index.lookup(99) == (100, 0)  # below the first entry: the segment start
    assert index.lookup(105) == (100, 0)
    assert index.lookup(110) == (110, 1000)
    assert index.lookup(115) == (110, 1000)
    assert index.lookup(590) == (590, 49000)
    assert index.lookup(10**9) == (590, 49000)
    assert index.last_entry() == (590, 49000)
    index.close()


def test_offset_index_finds_the_last_batch_start_at_or_below_a_position(tmp_path: Path) -> None:
    index = OffsetIndex(tmp_path / "x.index", 100, 800, writable=True)
    assert index.batch_start_at_most(5000) is None
    for i in range(1, 50):
        index.append(100 + i * 10, i * 1000)
    assert index.batch_start_at_most(999) is None
    assert index.batch_start_at_most(1000) == 1000
    assert index.batch_start_at_most(2500) == 2000
    assert index.batch_start_at_most(10**9) == 49000
    index.close()


def test_offset_index_rejects_entries_that_do_not_increase(tmp_path: Path) -> None:
    index = OffsetIndex(tmp_path / "x.index", 0, 800, writable=True)
    index.append(10, 100)
    with pytest.raises(CorruptIndexError):
        index.append(10, 200)
    with pytest.raises(CorruptIndexError):
        index.append(11, 100)
    index.close()


def test_offset_index_is_preallocated_then_trimmed(tmp_path: Path) -> None:
    path = tmp_path / "x.index"
    index = OffsetIndex(path, 0, 800, writable=True)
    assert path.stat().st_size == 0  # the room is made with the first entry
    index.append(5, 50)
    assert path.stat().st_size == 800
    index.append(9, 90)
    index.trim()
    assert path.stat().st_size == 16
    index.close()
    reopened = OffsetIndex(path, 0, 800, writable=False)
    assert reopened.entries == 2
    assert reopened.lookup(9) == (9, 90)
    reopened.close()


def test_indexes_hold_a_descriptor_only_once_they_have_an_entry(tmp_path: Path) -> None:
    """A broker holds thousands of idle logs: their empty indexes keep no file open (a
    map keeps a duplicate descriptor), and one with entries keeps only its map's."""

    def open_descriptors() -> int:
        return len(os.listdir("/proc/self/fd"))

    before = open_descriptors()
    indexes = [
        (
            OffsetIndex(tmp_path / f"{n}.index", 0, 800, writable=True),
            TimeIndex(tmp_path / f"{n}.timeindex", 0, 1200, writable=True),
        )
        for n in range(20)
    ]
    assert open_descriptors() == before
    offsets, times = indexes[0]
    offsets.append(5, 50)
    times.maybe_append(1_000, 5)
    assert open_descriptors() == before + 2
    assert offsets.lookup(7) == (5, 50) and times.lookup_before(2_000) == (1_000, 5)
    offsets.flush()
    times.flush()
    for offset_index, time_index in indexes:
        offset_index.trim()
        offset_index.close()
        time_index.close()
    assert open_descriptors() == before
    assert (tmp_path / "0.index").stat().st_size == 8
    assert OffsetIndex(tmp_path / "0.index", 0, 800, writable=False).lookup(9) == (5, 50)


def test_offset_index_full(tmp_path: Path) -> None:
    index = OffsetIndex(tmp_path / "x.index", 0, 24, writable=True)
    for i in range(3):
        index.append(i + 1, (i + 1) * 10)
    assert index.is_full
    with pytest.raises(IndexFullError):
        index.append(10, 100)
    index.close()


def test_offset_index_truncate_to(tmp_path: Path) -> None:
    index = OffsetIndex(tmp_path / "x.index", 0, 800, writable=True)
    for i in range(1, 11):
        index.append(i * 10, i * 100)
    index.truncate_to(55)
    assert index.entries == 5
    assert index.last_entry() == (50, 500)
    index.truncate_to(50)
    assert index.last_entry() == (40, 400)
    index.append(45, 450)  # appending continues after the cut
    assert index.lookup(47) == (45, 450)
    index.close()


def test_offset_index_sanity_check(tmp_path: Path) -> None:
    path = tmp_path / "x.index"
    index = OffsetIndex(path, 0, 800, writable=True)
    index.append(10, 100)
    index.append(20, 200)
    index.trim()
    index.sanity_check(log_size=1000)
    with pytest.raises(CorruptIndexError, match="past the log"):
        index.sanity_check(log_size=150)
    index.close()
    raw = bytearray(path.read_bytes())
    raw[8:16] = raw[0:8]  # a repeated entry
    path.write_bytes(bytes(raw))
    broken = OffsetIndex(path, 0, 800, writable=False)
    with pytest.raises(CorruptIndexError):
        broken.sanity_check(log_size=1000)
    broken.close()


def test_index_with_torn_size_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "x.index"
    path.write_bytes(b"\x00" * 13)
    with pytest.raises(CorruptIndexError, match="multiple"):
        OffsetIndex(path, 0, 800, writable=False)


def test_time_index_keeps_only_growing_timestamps(tmp_path: Path) -> None:
    index = TimeIndex(tmp_path / "x.timeindex", 1000, 1200, writable=True)
    index.maybe_append(500, 1001)
    index.maybe_append(400, 1002)  # older: ignored
    index.maybe_append(500, 1003)  # equal: ignored
    index.maybe_append(800, 1004)
    assert index.entries == 2
    assert index.last_entry() == (800, 1004)
    assert index.lookup_before(500) is None  # strictly below
    assert index.lookup_before(501) == (500, 1001)
    assert index.lookup_before(10_000) == (800, 1004)
    with pytest.raises(CorruptIndexError):
        index.maybe_append(900, 1003)  # offset going back
    index.truncate_to(1004)
    assert index.last_entry() == (500, 1001)
    index.close()


def test_time_index_final_entry_may_exceed_preallocation(tmp_path: Path) -> None:
    index = TimeIndex(tmp_path / "x.timeindex", 0, 24, writable=True)
    index.maybe_append(1, 1)
    index.maybe_append(2, 2)
    assert index.is_full
    index.maybe_append(3, 3, skip_full_check=True)
    assert index.last_entry() == (3, 3)
    index.close()


def test_flush_syncs_an_index_only_when_it_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    index = OffsetIndex(tmp_path / "0.index", 0, 1024, writable=True)
    synced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd))[1])
    index.flush()  # never flushed since opened: synced
    assert len(synced) == 1
    index.flush()  # unchanged: nothing to sync
    assert len(synced) == 1
    index.append(10, 4096)
    index.flush()
    assert len(synced) == 2
    index.truncate_to(5)
    index.flush()
    assert len(synced) == 3
    index.trim()  # a new size is a change too
    index.flush()
    assert len(synced) == 4
    index.close()
    reopened = OffsetIndex(tmp_path / "0.index", 0, 1024, writable=False)
    assert reopened.entries == 0
    reopened.flush()  # a file just opened may hold pages not yet on disk: synced
    assert len(synced) == 5
    reopened.close()


def test_a_preallocated_index_reopened_untrimmed_resets_to_zeros(tmp_path: Path) -> None:
    """After an unclean shutdown the whole preallocated region counts as entries; reset
    empties it (by resizing the file when the region is large) and the index works on."""
    path = tmp_path / "x.index"
    size = 4 * 1024 * 1024
    index = OffsetIndex(path, 0, size, writable=True)
    for i in range(1, 100):
        index.append(i * 10, i * 100)
    index.flush()
    index.close()  # not trimmed: as a crashed broker leaves it
    reopened = OffsetIndex(path, 0, size, writable=True)
    assert reopened.entries == size // 8
    reopened.reset()
    assert reopened.entries == 0
    assert os.path.getsize(path) == size
    reopened.append(5, 50)
    assert reopened.lookup(7) == (5, 50)
    reopened.flush()
    reopened.close()
    data = path.read_bytes()
    assert data[8:] == bytes(size - 8)
