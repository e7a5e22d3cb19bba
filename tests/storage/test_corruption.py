"""Damaged data directories and bad input: a clear typed error or a safe repair, never silent loss.

Each test builds a real data directory (several small segments, records that are a function
of their offset, non-monotonic timestamps), damages it the way disks, crashes and people do,
and opens it again. What must hold (DESIGN.md §4):

* damage in the unflushed tail (above the recovery point) is cut away after a crash, with
  everything before it intact and a warning logged;
* damage to flushed data is reported as :class:`CorruptSegmentError` naming the file and
  byte, and the files are left as they were; a trusted (clean) segment never serves damaged
  bytes as good ones;
* indexes are derived data: any damage to them is repaired and every read stays right;
* unknown files are refused (:class:`StrayFileError`) without touching anything, leftovers
  of interrupted work are removed;
* a bad checkpoint is :class:`CorruptCheckpointError`, a bad producer snapshot is rebuilt;
* a bad append raises a typed error and leaves the log exactly as it was;
* one data directory has one owner.
"""

from __future__ import annotations

import hashlib
import logging
import random
import shutil
import struct
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import pytest
from highwater.config.topic import LogConfig
from highwater.errors import (
    CorruptCheckpointError,
    CorruptRecordError,
    CorruptSegmentError,
    DuplicateSequenceError,
    HighwaterError,
    InvalidRecordError,
    KafkaStorageError,
    OutOfOrderSequenceError,
    RecordListTooLargeError,
    RecordTooLargeError,
    StrayFileError,
    UnexpectedAppendOffsetError,
    UnsupportedForMessageFormatError,
)
from highwater.records import (
    BATCH_HEADER_SIZE,
    BatchHeader,
    Compression,
    RecordBatch,
    SimpleRecord,
    build_batch,
    check_batch,
    iter_batches,
    read_header,
)
from highwater.records.header import ATTRIBUTES_OFFSET, CRC_OFFSET, crc32c
from highwater.storage.checkpoint import (
    LOG_START_OFFSET_CHECKPOINT,
    RECOVERY_POINT_CHECKPOINT,
    REPLICATION_OFFSET_CHECKPOINT,
    OffsetCheckpointFile,
)
from highwater.storage.log import PartitionLog
from highwater.storage.log_manager import CLEAN_SHUTDOWN_FILE, LogManager
from highwater.storage.topic_partition import TopicPartition

TP = TopicPartition("t", 0)
OTHER_TP = TopicPartition("alpha", 0)  # sorts, and so loads, before TP
TIMESTAMP_BASE = 1_650_000_000_000
PRODUCER_ID = 77
SEGMENT_BYTES = 16 * 1024
INDEX_INTERVAL_BYTES = 512
CONFIG = LogConfig.from_properties(
    {"segment.bytes": SEGMENT_BYTES, "index.interval.bytes": INDEX_INTERVAL_BYTES}
)
LOADER_LOGGER = "highwater.storage.log_loader"
MAX_MESSAGE_BYTES = 8000  # for the bad-append tests: above any batch write_data_dir writes

# Byte positions inside a batch (RecordBatch v2 header layout).
LENGTH_LOW_BYTE = 11
MAGIC_BYTE = 16


# -- records that can be checked anywhere ----------------------------------------------------------


def timestamp_for(offset: int) -> int:
    """Mostly increasing with the offset, with spikes: a segment's largest timestamp is
    usually not its last one, as with real producers."""
    return TIMESTAMP_BASE + offset + (90_000 if offset % 23 == 7 else 0)


def record_for(offset: int) -> SimpleRecord:
    digest = hashlib.sha256(b"%d" % offset).digest()
    length = 40 + digest[0] + digest[1]
    value = (digest * (length // len(digest) + 1))[:length]
    return SimpleRecord(key=b"k%d" % offset, value=value, timestamp=timestamp_for(offset))


def batch_for(
    base_offset: int, count: int, compression: Compression = Compression.NONE, *, sequence: int = -1
) -> bytes:
    """The producer batch for offsets ``base_offset..+count-1`` (sequence = offset by default)."""
    return build_batch(
        [record_for(base_offset + i) for i in range(count)],
        compression=compression,
        producer_id=PRODUCER_ID,
        producer_epoch=0,
        base_sequence=base_offset if sequence < 0 else sequence,
    )


# -- a data directory and its map ------------------------------------------------------------------


@dataclass(frozen=True)
class StoredBatch:
    """One batch as it lies in a segment file."""

    segment: Path
    position: int
    header: BatchHeader
    data: bytes

    @property
    def base_offset(self) -> int:
        return self.header.base_offset

    @property
    def next_offset(self) -> int:
        return self.header.next_offset


@dataclass(frozen=True)
class Layout:
    """A cleanly shut-down data directory and where every batch of ``TP`` lies."""

    data_dir: Path
    batches: tuple[StoredBatch, ...]
    segments: tuple[Path, ...]  # the .log files, oldest first

    @property
    def partition_dir(self) -> Path:
        return self.data_dir / TP.dir_name

    @property
    def end(self) -> int:
        return self.batches[-1].next_offset

    def in_segment(self, n: int) -> list[StoredBatch]:
        path = self.segments[n]
        return [b for b in self.batches if b.segment == path]


def map_batches_of(path: Path, data: bytes) -> list[StoredBatch]:
    batches = []
    position = 0
    while position < len(data):
        header = check_batch(data, position)
        batches.append(StoredBatch(path, position, header, data[position : position + header.size]))
        position += header.size
    return batches


def map_batches(partition_dir: Path) -> tuple[StoredBatch, ...]:
    return tuple(
        batch
        for path in sorted(partition_dir.glob("*.log"))
        for batch in map_batches_of(path, path.read_bytes())
    )


def write_data_dir(
    data_dir: Path, *, segments: int, config: LogConfig, partitions: tuple[TopicPartition, ...]
) -> None:
    """Write ``segments`` segments to each partition, then shut down cleanly."""
    rng = random.Random(1)
    manager = LogManager(data_dir, default_config=config)
    manager.startup()
    for tp in partitions:
        log = manager.get_or_create_log(tp)
        while len(log.segments) < segments or log.active_segment.size < SEGMENT_BYTES // 3:
            offset = log.log_end_offset
            count = rng.choice([1, 2, 4, 8])
            log.append_as_leader(batch_for(offset, count, rng.choice(list(Compression))), 0)
    manager.shutdown()


class MakeLayout(Protocol):
    def __call__(
        self,
        *,
        segments: int = 5,
        config: LogConfig = CONFIG,
        partitions: tuple[TopicPartition, ...] = (TP,),
    ) -> Layout: ...


@pytest.fixture(scope="module")
def pristine_data_dirs() -> dict[tuple[object, ...], Path]:
    return {}


@pytest.fixture
def make_layout(
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
    pristine_data_dirs: dict[tuple[object, ...], Path],
) -> MakeLayout:
    """A fresh copy, in ``tmp_path``, of a data directory written once per module (writing
    one costs dozens of fsyncs; copying it, none)."""

    def make(
        *,
        segments: int = 5,
        config: LogConfig = CONFIG,
        partitions: tuple[TopicPartition, ...] = (TP,),
    ) -> Layout:
        key = (segments, tuple(sorted(config.overrides().items())), partitions)
        if key not in pristine_data_dirs:
            pristine = tmp_path_factory.mktemp("pristine") / "data"
            write_data_dir(pristine, segments=segments, config=config, partitions=partitions)
            pristine_data_dirs[key] = pristine
        data_dir = tmp_path / "data"
        shutil.copytree(pristine_data_dirs[key], data_dir)
        partition_dir = data_dir / TP.dir_name
        segment_paths = tuple(sorted(partition_dir.glob("*.log")))
        return Layout(data_dir, map_batches(partition_dir), segment_paths)

    return make


def make_unclean(layout: Layout, recovery_point: int) -> None:
    """Turn the clean directory into what a crash leaves: no marker, an older recovery point."""
    (layout.data_dir / CLEAN_SHUTDOWN_FILE).unlink()
    checkpoint = OffsetCheckpointFile(layout.data_dir / RECOVERY_POINT_CHECKPOINT)
    points = checkpoint.read()
    points[TP] = recovery_point
    checkpoint.write(points)


@contextmanager
def opened(data_dir: Path, config: LogConfig = CONFIG) -> Iterator[tuple[LogManager, PartitionLog]]:
    manager = LogManager(data_dir, default_config=config)
    manager.startup()
    try:
        log = manager.get_log(TP)
        assert log is not None
        yield manager, log
    finally:
        manager.shutdown()


def tree(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` (relative name -> contents), to prove nothing changed."""
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def log_files(root: Path) -> dict[str, bytes]:
    return {name: data for name, data in tree(root).items() if name.endswith(".log")}


def flip(path: Path, position: int, mask: int = 0xFF) -> None:
    with open(path, "r+b") as f:
        f.seek(position)
        byte = f.read(1)[0]
        f.seek(position)
        f.write(bytes([byte ^ mask]))


def warnings_about(caplog: pytest.LogCaptureFixture, path: Path) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.WARNING and str(path) in r.getMessage()
    ]


# -- checks ----------------------------------------------------------------------------------------


def assert_reads_exact(log: PartitionLog, batches: Sequence[StoredBatch]) -> None:
    """A one-batch read at the first and last offset of each batch returns exactly its bytes."""
    for batch in batches:
        for offset in (batch.base_offset, batch.header.last_offset):
            fetch = log.read(offset, 1)
            assert fetch.records == batch.data, f"read({offset}) did not return its batch"
            assert fetch.first_offset == batch.base_offset


def assert_timestamp_lookups(log: PartitionLog) -> None:
    """ListOffsets by time finds, for every record's timestamp, the first record at or after it."""
    end = log.log_end_offset
    stamps = [timestamp_for(o) for o in range(end)]
    for target in [*sorted(set(stamps))[:: max(1, len(stamps) // 150)], max(stamps)]:
        expected = next((stamps[o], o) for o in range(end) if stamps[o] >= target)
        assert log.offset_for_timestamp(target) == expected, f"lookup of timestamp {target}"
    assert log.offset_for_timestamp(max(stamps) + 1) is None


def assert_indexes_sound(log: PartitionLog) -> None:
    """Both indexes of every segment are populated and point where they claim to."""
    for segment in log.segments:
        if segment.size == 0:
            continue
        records = range(segment.base_offset, segment.next_offset)
        assert segment.max_timestamp == max(timestamp_for(o) for o in records), (
            f"{segment.log_path.name}: wrong largest timestamp"
        )
        index = segment.offset_index
        if segment.size > 3 * INDEX_INTERVAL_BYTES:
            assert index.entries > 0, f"{index.path.name} was left empty, not rebuilt"
        for n in range(index.entries):
            offset, position = index.entry(n)
            header = read_header(segment.read_bytes(position, BATCH_HEADER_SIZE))
            assert header.last_offset == offset, f"{index.path.name} entry {n} is wrong"
        time_index = segment.time_index
        assert time_index.entries > 0, f"{time_index.path.name} was left empty, not rebuilt"
        for n in range(time_index.entries):
            timestamp, offset = time_index.entry(n)
            assert segment.base_offset <= offset < segment.next_offset
            assert timestamp == max(
                timestamp_for(o) for o in range(segment.base_offset, offset + 1)
            )


# -- damage to segment files -----------------------------------------------------------------------


# Where in a batch a byte is damaged, and how.
FIELDS: dict[str, Callable[[StoredBatch], tuple[int, int]]] = {
    "payload": lambda b: (BATCH_HEADER_SIZE + (b.header.size - BATCH_HEADER_SIZE) // 2, 0x10),
    "crc": lambda b: (CRC_OFFSET + 2, 0x01),
    "attributes": lambda b: (ATTRIBUTES_OFFSET + 1, 0x40),
    "length": lambda b: (LENGTH_LOW_BYTE, 0x01),
    "magic": lambda b: (MAGIC_BYTE, 0x03),
}


def damage(batch: StoredBatch, field: str) -> int:
    """Flip a byte of ``batch`` in ``field``; return its position in the segment file."""
    within, mask = FIELDS[field](batch)
    flip(batch.segment, batch.position + within, mask)
    return batch.position + within


@pytest.mark.parametrize("field", sorted(FIELDS))
@pytest.mark.parametrize("where", ["recovery-point-segment", "later-segment"])
def test_damage_above_the_recovery_point_cuts_the_log_at_that_batch(
    make_layout: MakeLayout, caplog: pytest.LogCaptureFixture, where: str, field: str
) -> None:
    layout = make_layout()
    in_segment_1 = layout.in_segment(1)
    recovery_point = in_segment_1[2].next_offset
    victim = in_segment_1[5] if where == "recovery-point-segment" else layout.in_segment(3)[4]
    assert victim.base_offset >= recovery_point
    make_unclean(layout, recovery_point)
    before = log_files(layout.data_dir)
    damage(victim, field)
    later_segments = [p for p in layout.segments if p > victim.segment]

    caplog.set_level(logging.WARNING, logger=LOADER_LOGGER)
    with opened(layout.data_dir) as (manager, log):
        assert not manager.had_clean_shutdown
        assert log.log_end_offset == victim.base_offset
        assert log.active_segment.log_path == victim.segment
        assert victim.segment.stat().st_size == victim.position
        kept = [b for b in layout.batches if b.next_offset <= victim.base_offset]
        assert_reads_exact(log, kept)
        assert_indexes_sound(log)
        # The log goes on from the cut.
        info = log.append_as_leader(batch_for(victim.base_offset, 3), 0)
        assert info.first_offset == victim.base_offset
    assert warnings_about(caplog, victim.segment), "the cut must be logged"
    for path in later_segments:
        for suffix in (".log", ".index", ".timeindex", ".snapshot"):
            assert not path.with_suffix(suffix).exists(), f"{path.with_suffix(suffix)} was kept"
    after = log_files(layout.data_dir)
    for name, data in before.items():
        path = layout.data_dir / name
        if path < victim.segment:
            assert after[name] == data, f"{name} changed"
    with opened(layout.data_dir) as (manager, log):
        assert manager.had_clean_shutdown
        assert log.log_end_offset == victim.base_offset + 3


@pytest.mark.parametrize("field", sorted(FIELDS))
def test_damage_below_the_recovery_point_is_reported_and_left_alone(
    make_layout: MakeLayout, field: str
) -> None:
    layout = make_layout()
    in_segment_2 = layout.in_segment(2)
    victim = in_segment_2[1]
    recovery_point = in_segment_2[-2].next_offset
    make_unclean(layout, recovery_point)
    original = tree(layout.data_dir)
    damaged_at = damage(victim, field)
    damaged = {n: d for n, d in tree(layout.data_dir).items() if not n.endswith("index")}

    for _ in range(2):  # a second attempt finds the same, as nothing was changed
        with pytest.raises(CorruptSegmentError) as caught:
            LogManager(layout.data_dir, default_config=CONFIG).startup()
        error = caught.value
        assert error.path == str(victim.segment)
        assert error.position == victim.position
        assert str(victim.segment) in str(error) and f"byte {victim.position}" in str(error)
        after = {n: d for n, d in tree(layout.data_dir).items() if not n.endswith("index")}
        assert after == damaged, "a failed load must not change the segments or checkpoints"

    # Nothing was lost: once the byte is repaired the directory loads with every record.
    flip(victim.segment, damaged_at, FIELDS[field](victim)[1])
    assert log_files(layout.data_dir) == log_files_of(original)
    with opened(layout.data_dir) as (_, log):
        assert log.log_end_offset == layout.end
        assert_reads_exact(log, layout.batches)


def log_files_of(files: dict[str, bytes]) -> dict[str, bytes]:
    return {name: data for name, data in files.items() if name.endswith(".log")}


@pytest.mark.parametrize("field", sorted(FIELDS))
@pytest.mark.parametrize("load", ["clean", "unclean-older-segment"])
def test_damage_in_a_trusted_segment_is_never_served_as_good(
    make_layout: MakeLayout, load: str, field: str
) -> None:
    """A trusted segment (clean shutdown, or below the recovery point's segment) is not
    re-validated on load, so the damage surfaces on read: as an error, never as data."""
    layout = make_layout()
    batches = layout.in_segment(1)
    victim = batches[len(batches) // 3]
    # Before the segment's last index entry, where loading a trusted segment does not look.
    index = victim.segment.with_suffix(".index").read_bytes()
    assert struct.unpack_from(">ii", index, len(index) - 8)[1] > victim.position
    if load == "unclean-older-segment":
        make_unclean(layout, layout.in_segment(3)[1].next_offset)
    damage(victim, field)
    damaged = log_files(layout.data_dir)

    with opened(layout.data_dir) as (_, log):
        assert log.log_end_offset == layout.end
        for offset in range(victim.base_offset, victim.next_offset):
            assert_not_served(log, offset, victim.segment)
        # Every other offset reads either its own batch or an error, never other data.
        for batch in layout.batches:
            if batch is victim:
                continue
            try:
                fetch = log.read(batch.base_offset, 1)
            except CorruptSegmentError as error:
                assert error.path == str(victim.segment)
                continue
            if fetch.records != batch.data:
                assert_not_served(log, batch.base_offset, victim.segment)
        # A large read starting before the damage either fails, stops short of the damaged
        # batch, or hands out bytes that fail to decode there.
        try:
            fetch = log.read(batches[0].base_offset, 1 << 20)
        except CorruptSegmentError as error:
            assert error.path == str(victim.segment)
        else:
            if fetch.next_offset > victim.base_offset:
                with pytest.raises((CorruptRecordError, UnsupportedForMessageFormatError)):
                    for decoded in iter_batches(fetch.records):
                        list(decoded.records())
        assert log_files(layout.data_dir) == damaged, "reading damaged data must not cut the file"


def assert_not_served(log: PartitionLog, offset: int, segment: Path) -> None:
    """Reading ``offset`` fails, in the read or in decoding what it returned."""
    try:
        fetch = log.read(offset, 1)
    except CorruptSegmentError as error:
        assert error.path == str(segment)
        return
    try:
        batch = RecordBatch(fetch.records)
        list(batch.records())
    except (CorruptRecordError, UnsupportedForMessageFormatError):
        return
    raise AssertionError(
        f"read({offset}) served the batch {batch.base_offset}..{batch.last_offset} as good data"
    )


# -- damage to indexes -----------------------------------------------------------------------------


def _entry_size(path: Path) -> int:
    return 8 if path.suffix == ".index" else 12


def _flip_bytes(path: Path, rng: random.Random) -> None:
    data = bytearray(path.read_bytes())
    for _ in range(3):
        if data:
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    path.write_bytes(bytes(data))


def _truncate_odd(path: Path, rng: random.Random) -> None:
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.truncate(size - 3 if size >= 3 else 5)


def _delete(path: Path, rng: random.Random) -> None:
    path.unlink()


def _zeros(path: Path, rng: random.Random) -> None:
    path.write_bytes(bytes(max(path.stat().st_size, 4 * _entry_size(path))))


def _non_monotonic(path: Path, rng: random.Random) -> None:
    size = _entry_size(path)
    data = bytearray(path.read_bytes())
    if len(data) < 2 * size:
        fmt = ">ii" if size == 8 else ">qi"
        data = bytearray(struct.pack(fmt, 9, 9) + struct.pack(fmt, 5, 5))
    else:
        data[:size], data[size : 2 * size] = data[size : 2 * size], data[:size]
    path.write_bytes(bytes(data))


def _plausible_but_wrong(path: Path, rng: random.Random) -> None:
    """Entries still increasing and in range, but lying: one offset-index entry points at the
    batch after the right one; the last time-index entry claims a later timestamp."""
    data = bytearray(path.read_bytes())
    if path.suffix == ".timeindex":
        if data:
            timestamp, relative = struct.unpack_from(">qi", data, len(data) - 12)
            struct.pack_into(">qi", data, len(data) - 12, timestamp + 3_600_000, relative)
        path.write_bytes(bytes(data))
        return
    log_data = path.with_suffix(".log").read_bytes()
    boundaries = [b.position for b in map_batches_of(path.with_suffix(".log"), log_data)]
    entries = [struct.unpack_from(">ii", data, 8 * n) for n in range(len(data) // 8)]
    for n, (relative, position) in enumerate(entries):
        limit = entries[n + 1][1] if n + 1 < len(entries) else len(log_data)
        later = [b for b in boundaries if position < b < limit]
        if later:
            struct.pack_into(">ii", data, 8 * n, relative, later[0])
            break
    path.write_bytes(bytes(data))


INDEX_DAMAGE: dict[str, Callable[[Path, random.Random], None]] = {
    "plausible-but-wrong": _plausible_but_wrong,
    "flip-bytes": _flip_bytes,
    "truncate-to-odd-size": _truncate_odd,
    "delete": _delete,
    "fill-with-zeros": _zeros,
    "non-monotonic": _non_monotonic,
}


@pytest.mark.parametrize("load", ["clean", "unclean"])
@pytest.mark.parametrize("suffix", [".index", ".timeindex"])
@pytest.mark.parametrize("kind", sorted(INDEX_DAMAGE))
def test_damaged_indexes_are_rebuilt(
    make_layout: MakeLayout, kind: str, suffix: str, load: str
) -> None:
    layout = make_layout()
    if load == "unclean":
        # Segments 0-1 are trusted (their indexes only checked), 2-4 re-validated.
        make_unclean(layout, layout.in_segment(2)[3].next_offset)
    rng = random.Random(f"{kind}{suffix}{load}")
    for path in sorted(layout.partition_dir.glob(f"*{suffix}")):
        INDEX_DAMAGE[kind](path, rng)
    logs_before = log_files(layout.data_dir)

    with opened(layout.data_dir) as (_, log):
        assert log.log_end_offset == layout.end
        assert_reads_exact(log, layout.batches)
        assert_timestamp_lookups(log)
        assert_indexes_sound(log)
    assert log_files(layout.data_dir) == logs_before
    with opened(layout.data_dir) as (_, log):  # and what was rebuilt was saved right
        assert_indexes_sound(log)
        assert_reads_exact(log, layout.batches)


def test_index_flips_never_misdirect_reads(make_layout: MakeLayout) -> None:
    """Many random bit flips in both indexes of every segment, several seeds: every read and
    timestamp lookup stays right."""
    layout = make_layout(segments=3)
    pristine = tree(layout.partition_dir)
    for seed in range(12):
        rng = random.Random(seed)
        for name, data in pristine.items():
            (layout.partition_dir / name).write_bytes(data)
        for path in sorted(layout.partition_dir.glob("*index")):
            _flip_bytes(path, rng)
        (layout.data_dir / CLEAN_SHUTDOWN_FILE).touch()
        with opened(layout.data_dir) as (_, log):
            assert_reads_exact(log, layout.batches)
            assert_timestamp_lookups(log)


# -- torn writes at the tail -----------------------------------------------------------------------


TEAR_AT: dict[str, Callable[[int], int]] = {
    "after-1-byte": lambda size: 1,
    "inside-the-header": lambda size: 30,
    "after-the-header": lambda size: BATCH_HEADER_SIZE,
    "last-byte-missing": lambda size: size - 1,
}


@pytest.mark.parametrize("zeros", [0, 4096], ids=["cut", "cut-then-zeros"])
@pytest.mark.parametrize("tear", sorted(TEAR_AT))
def test_torn_write_at_the_tail_is_truncated(
    make_layout: MakeLayout, caplog: pytest.LogCaptureFixture, tear: str, zeros: int
) -> None:
    layout = make_layout()
    last = layout.batches[-1]
    make_unclean(layout, last.base_offset)
    kept_bytes = TEAR_AT[tear](last.header.size)
    with open(last.segment, "r+b") as f:
        f.truncate(last.position + kept_bytes)
        f.seek(0, 2)
        f.write(bytes(zeros))  # blocks allocated but never written, as after a power cut
    # A record ends with its header count, 0: when only the last byte was lost, zeros put
    # back exactly what was there and the batch is whole again (only the zeros after it go).
    whole = (last.data[:kept_bytes] + bytes(zeros))[: last.header.size] == last.data
    assert whole == (tear == "last-byte-missing" and zeros > 0)
    survivors = layout.batches if whole else layout.batches[:-1]

    caplog.set_level(logging.WARNING, logger=LOADER_LOGGER)
    with opened(layout.data_dir) as (_, log):
        assert log.log_end_offset == survivors[-1].next_offset
        assert survivors[-1].segment.stat().st_size == survivors[-1].position + len(
            survivors[-1].data
        )
        assert_reads_exact(log, survivors)
        assert_indexes_sound(log)
        entry = log.producer_state.last_entry(PRODUCER_ID)
        assert entry is not None and entry.last_seq == survivors[-1].next_offset - 1
        # The producer retries the last batch: written again if it was lost, else a duplicate.
        info = log.append_as_leader(last.data, 0)
        assert info.duplicate == whole
        assert (info.first_offset, info.last_offset) == (last.base_offset, last.header.last_offset)
    assert warnings_about(caplog, last.segment)


def test_torn_only_batch_of_the_newest_segment(make_layout: MakeLayout) -> None:
    layout = make_layout()
    with opened(layout.data_dir) as (_, log):
        log.roll()
        log.append_as_leader(batch_for(layout.end, 4), 0)
    newest = max(layout.partition_dir.glob("*.log"))
    assert newest.name == f"{layout.end:020d}.log"
    make_unclean(layout, layout.end)
    with open(newest, "r+b") as f:
        f.truncate(100)
    with opened(layout.data_dir) as (_, log):
        assert log.log_end_offset == layout.end
        assert_reads_exact(log, layout.batches)
        info = log.append_as_leader(batch_for(layout.end, 4), 0)
        assert info.first_offset == layout.end


# -- files that do not belong ----------------------------------------------------------------------


def assert_refused(data_dir: Path, name: str) -> None:
    before = tree(data_dir)
    with pytest.raises(StrayFileError) as caught:
        LogManager(data_dir, default_config=CONFIG).startup()
    assert name in str(caught.value)
    assert tree(data_dir) == before, "a refused directory must be left exactly as it was"


@pytest.mark.parametrize(
    "name",
    [
        "notes.txt",
        "00000000000000000000.log.bak",
        "0000000000000000000.log",  # 19 digits
        "00000000000000000000.idx",
        "00000000000000000000",
        "0000000000000000000a.log",
        "core",
    ],
)
def test_stray_file_in_a_partition_directory_is_refused(make_layout: MakeLayout, name: str) -> None:
    layout = make_layout(segments=2, partitions=(OTHER_TP, TP))
    (layout.partition_dir / name).write_bytes(b"not ours")
    assert_refused(layout.data_dir, name)


def test_directory_inside_a_partition_directory_is_refused(make_layout: MakeLayout) -> None:
    layout = make_layout(segments=2)
    (layout.partition_dir / "backup").mkdir()
    assert_refused(layout.data_dir, "backup")


@pytest.mark.parametrize("name", ["backup", "t-01", "t-+1", "-0", "bad topic-0", "t-2147483648"])
def test_directory_that_is_not_a_partition_is_refused(make_layout: MakeLayout, name: str) -> None:
    layout = make_layout(segments=2)
    (layout.data_dir / name).mkdir()
    (layout.data_dir / name / "00000000000000000000.log").write_bytes(b"")
    assert_refused(layout.data_dir, name)


def test_stray_file_in_the_data_directory_is_refused(make_layout: MakeLayout) -> None:
    layout = make_layout(segments=2)
    (layout.data_dir / "notes.txt").write_text("hello")
    assert_refused(layout.data_dir, "notes.txt")


@pytest.mark.parametrize("load", ["clean", "unclean"])
def test_leftovers_of_interrupted_work_are_removed(make_layout: MakeLayout, load: str) -> None:
    layout = make_layout()
    first, second = layout.segments[0], layout.segments[1]
    log_start = layout.in_segment(1)[0].base_offset
    partition_dir = layout.partition_dir
    # Retention had renamed the first segment .deleted (and moved the log start) when the
    # process stopped; the cleaner had a .cleaned copy of the second under way; checkpoint and
    # snapshot writes had left their temporary files.
    for suffix in (".log", ".index", ".timeindex"):
        path = first.with_suffix(suffix)
        path.rename(path.with_name(path.name + ".deleted"))
    OffsetCheckpointFile(layout.data_dir / LOG_START_OFFSET_CHECKPOINT).write({TP: log_start})
    (partition_dir / (second.name + ".cleaned")).write_bytes(second.read_bytes()[:500])
    (partition_dir / (second.with_suffix(".index").name + ".cleaned")).write_bytes(bytes(16))
    (partition_dir / "leader-epoch-checkpoint.tmp").write_bytes(b"0\n1\n")
    (partition_dir / f"{layout.end:020d}.snapshot.tmp").write_bytes(b"half")
    (layout.data_dir / (RECOVERY_POINT_CHECKPOINT + ".tmp")).write_bytes(b"0\n")
    if load == "unclean":
        make_unclean(layout, layout.in_segment(3)[0].base_offset)
    kept = [b for b in layout.batches if b.segment != first]

    with opened(layout.data_dir) as (_, log):
        assert log.log_start_offset == log_start
        assert log.log_end_offset == layout.end
        assert_reads_exact(log, kept)
        assert_indexes_sound(log)
    names = sorted(p.name for p in partition_dir.iterdir())
    assert [n for n in names if n.endswith((".deleted", ".cleaned", ".tmp"))] == []
    assert first.name not in names


# -- checkpoints and snapshots ---------------------------------------------------------------------


CHECKPOINT_GARBAGE = {
    "binary": b"\xff\xfe\x00garbage\x81",
    "wrong-version": b"7\n1\nt 0 5\n",
    "short": b"0\n3\nt 0 5\n",
    "not-a-number": b"0\n1\nt 0 five\n",
    "bad-topic": b"0\n1\nt/x 0 5\n",
}


@pytest.mark.parametrize("garbage", sorted(CHECKPOINT_GARBAGE))
@pytest.mark.parametrize(
    "checkpoint",
    [RECOVERY_POINT_CHECKPOINT, REPLICATION_OFFSET_CHECKPOINT, LOG_START_OFFSET_CHECKPOINT],
)
def test_corrupt_checkpoint_is_reported(
    make_layout: MakeLayout, checkpoint: str, garbage: str
) -> None:
    layout = make_layout(segments=2)
    path = layout.data_dir / checkpoint
    good = path.read_bytes()
    path.write_bytes(CHECKPOINT_GARBAGE[garbage])
    before = tree(layout.data_dir)
    with pytest.raises(CorruptCheckpointError) as caught:
        LogManager(layout.data_dir, default_config=CONFIG).startup()
    assert str(path) in str(caught.value)
    assert tree(layout.data_dir) == before
    path.write_bytes(good)  # repaired, the directory opens (the lock was released)
    with opened(layout.data_dir) as (_, log):
        assert_reads_exact(log, layout.batches)


SNAPSHOT_DAMAGE: dict[str, Callable[[bytes], bytes]] = {
    "garbage": lambda data: b"\x00garbage" * 5,
    "truncated": lambda data: data[: len(data) // 2],
    "empty": lambda data: b"",
    "flipped-byte": lambda data: data[:-3] + bytes([data[-3] ^ 0x20]) + data[-2:],
}


@pytest.mark.parametrize("load", ["clean", "unclean"])
@pytest.mark.parametrize("kind", sorted(SNAPSHOT_DAMAGE))
def test_corrupt_producer_snapshot_is_rebuilt_from_the_log(
    make_layout: MakeLayout, caplog: pytest.LogCaptureFixture, kind: str, load: str
) -> None:
    layout = make_layout(segments=3)
    snapshots = sorted(layout.partition_dir.glob("*.snapshot"))
    assert snapshots[-1].name == f"{layout.end:020d}.snapshot"
    for snapshot in snapshots:
        snapshot.write_bytes(SNAPSHOT_DAMAGE[kind](snapshot.read_bytes()))
    if load == "unclean":
        make_unclean(layout, layout.in_segment(1)[2].next_offset)

    caplog.set_level(logging.WARNING)
    with opened(layout.data_dir) as (_, log):
        assert log.log_end_offset == layout.end
        entry = log.producer_state.last_entry(PRODUCER_ID)
        assert entry is not None and entry.last_seq == layout.end - 1
        last = layout.batches[-1]
        assert log.append_as_leader(last.data, 0).duplicate  # a retry is still recognised
        with pytest.raises(OutOfOrderSequenceError):
            log.append_as_leader(batch_for(layout.end, 1, sequence=layout.end + 5), 0)
        info = log.append_as_leader(batch_for(layout.end, 2), 0)
        assert info.first_offset == layout.end
    assert any("snapshot" in r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING)


# -- bad input on append ---------------------------------------------------------------------------


def _resigned(data: bytearray) -> bytes:
    struct.pack_into(">I", data, CRC_OFFSET, crc32c(memoryview(data)[ATTRIBUTES_OFFSET:]))
    return bytes(data)


def _bad_crc(end: int) -> bytes:
    data = bytearray(batch_for(end, 3))
    data[-5] ^= 0x01
    return bytes(data)


def _wrong_magic(end: int) -> bytes:
    data = bytearray(batch_for(end, 3))
    data[MAGIC_BYTE] = 1
    return bytes(data)


def _count_mismatch(end: int) -> bytes:
    data = bytearray(batch_for(end, 3))
    struct.pack_into(">i", data, 57, 2)  # records_count 2, last offset delta 2
    return _resigned(data)


def _negative_length(end: int) -> bytes:
    data = bytearray(batch_for(end, 3))
    struct.pack_into(">i", data, 8, -20)
    return bytes(data)


# name -> (make the input from the log end, how it is appended, error type, words in the message)
BAD_APPENDS: dict[str, tuple[Callable[[int], bytes], str, type[HighwaterError], str]] = {
    "bad-crc": (_bad_crc, "leader", CorruptRecordError, "CRC"),
    "wrong-magic": (_wrong_magic, "leader", UnsupportedForMessageFormatError, "magic"),
    "truncated-batch": (lambda e: batch_for(e, 3)[:-7], "leader", CorruptRecordError, "truncated"),
    "truncated-header": (lambda e: batch_for(e, 3)[:30], "leader", CorruptRecordError, "truncated"),
    "negative-length": (_negative_length, "leader", CorruptRecordError, "length"),
    "records-count-mismatch": (_count_mismatch, "leader", InvalidRecordError, "records"),
    "good-then-bad-crc": (
        lambda e: batch_for(e, 2) + _bad_crc(e + 2),
        "leader",
        CorruptRecordError,
        "CRC",
    ),
    "good-then-trailing-bytes": (
        lambda e: batch_for(e, 2) + b"\x00" * 20,
        "leader",
        CorruptRecordError,
        "truncated",
    ),
    "over-max-message-bytes": (
        lambda e: build_batch([SimpleRecord(b"k", bytes(MAX_MESSAGE_BYTES), (), TIMESTAMP_BASE)]),
        "leader",
        RecordTooLargeError,
        "max.message.bytes",
    ),
    "over-segment-bytes": (
        lambda e: build_batch(
            [SimpleRecord(b"k", bytes(SEGMENT_BYTES), (), TIMESTAMP_BASE)], base_offset=e
        ),
        "follower",
        RecordListTooLargeError,
        "segment.bytes",
    ),
    "follower-offsets-go-backwards": (
        lambda e: build_batch([record_for(e - 3)], base_offset=e - 3),
        "follower",
        UnexpectedAppendOffsetError,
        "offset",
    ),
    "follower-batches-out-of-order": (
        lambda e: (
            build_batch([record_for(e + 5)], base_offset=e + 5)
            + build_batch([record_for(e)], base_offset=e)
        ),
        "follower",
        UnexpectedAppendOffsetError,
        "offset",
    ),
    "empty": (lambda e: b"", "leader", InvalidRecordError, "no record batch"),
}


@pytest.mark.parametrize("case", sorted(BAD_APPENDS))
def test_bad_append_is_refused_and_changes_nothing(make_layout: MakeLayout, case: str) -> None:
    make_input, role, error_type, words = BAD_APPENDS[case]
    config = CONFIG.with_overrides({"max.message.bytes": MAX_MESSAGE_BYTES})
    layout = make_layout(segments=2, config=config)
    with opened(layout.data_dir, config) as (_, log):
        end, size = log.log_end_offset, log.size
        files = log_files(layout.data_dir)
        data = make_input(end)
        with pytest.raises(error_type) as caught:
            if role == "leader":
                log.append_as_leader(data, 0)
            else:
                log.append_as_follower(data)
        assert words.lower() in str(caught.value).lower(), str(caught.value)
        assert (log.log_end_offset, log.size) == (end, size)
        assert log_files(layout.data_dir) == files
        entry = log.producer_state.last_entry(PRODUCER_ID)
        assert entry is not None and entry.last_seq == end - 1
        assert_reads_exact(log, layout.batches)
        # The producer's next batch still fits right after.
        assert log.append_as_leader(batch_for(end, 2), 0).first_offset == end
    with opened(layout.data_dir, config) as (_, log):
        assert log.log_end_offset == end + 2


def test_leader_batch_over_segment_bytes_is_refused(make_layout: MakeLayout) -> None:
    config = CONFIG.with_overrides({"max.message.bytes": 4 * SEGMENT_BYTES})
    layout = make_layout(segments=2, config=config)
    with opened(layout.data_dir, config) as (_, log):
        end = log.log_end_offset
        big = build_batch(
            [SimpleRecord(b"k", bytes(SEGMENT_BYTES), (), TIMESTAMP_BASE)],
            producer_id=PRODUCER_ID,
            producer_epoch=0,
            base_sequence=end,
        )
        with pytest.raises(RecordListTooLargeError, match=r"segment\.bytes"):
            log.append_as_leader(big, 0)
        assert log.log_end_offset == end
        assert_reads_exact(log, layout.batches)


def test_empty_follower_append_is_a_no_op(make_layout: MakeLayout) -> None:
    layout = make_layout(segments=2)
    before = log_files(layout.data_dir)
    with opened(layout.data_dir) as (_, log):
        assert log.append_as_follower(b"") is None
        assert log.log_end_offset == layout.end
    assert log_files(layout.data_dir) == before


def test_duplicate_is_not_an_error_but_writes_nothing(make_layout: MakeLayout) -> None:
    layout = make_layout(segments=2)
    with opened(layout.data_dir) as (_, log):
        info = log.append_as_leader(layout.batches[-1].data, 0)
        assert info.duplicate and info.first_offset == layout.batches[-1].base_offset
        assert log.log_end_offset == layout.end
        with pytest.raises(DuplicateSequenceError):
            log.append_as_leader(layout.batches[-1].data + layout.batches[-1].data, 0)
        assert log.log_end_offset == layout.end


# -- one owner per data directory ------------------------------------------------------------------


_SECOND_PROCESS = """
import sys
from pathlib import Path
from highwater.storage.log_manager import LogManager
try:
    LogManager(Path(sys.argv[1])).startup()
except Exception as error:
    print(type(error).__name__, error)
else:
    print("opened")
"""


def test_a_second_owner_is_refused(make_layout: MakeLayout) -> None:
    layout = make_layout(segments=2)
    with opened(layout.data_dir) as (manager, log):
        before = tree(layout.data_dir)
        with pytest.raises(KafkaStorageError, match="in use"):
            LogManager(layout.data_dir, default_config=CONFIG).startup()
        child = subprocess.Popen(
            [sys.executable, "-c", _SECOND_PROCESS, str(layout.data_dir)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        try:
            out, err = child.communicate(timeout=60)
        finally:
            if child.poll() is None:
                child.kill()
            child.wait()
        assert child.returncode == 0, err.decode()
        assert out.decode().startswith("KafkaStorageError"), out.decode() + err.decode()
        assert tree(layout.data_dir) == before
        # The owner is unaffected.
        assert log.append_as_leader(batch_for(layout.end, 2), 0).first_offset == layout.end
        assert manager.get_log(TP) is log
    with opened(layout.data_dir) as (_, log):  # released on shutdown
        assert log.log_end_offset == layout.end + 2
