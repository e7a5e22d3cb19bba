"""Tests of ``highwater dump-log`` on files the storage engine wrote, and of the group itself."""

from __future__ import annotations

import importlib.metadata
import logging
import os
import re
import shutil
import struct
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from highwater import __version__
from highwater.cli.main import main
from highwater.config.topic import LogConfig
from highwater.records import Compression, SimpleRecord, build_batch
from highwater.records.header import read_header
from highwater.storage.checkpoint import (
    REPLICATION_OFFSET_CHECKPOINT,
    OffsetCheckpointFile,
)
from highwater.storage.log import PartitionLog
from highwater.storage.log_loader import load_partition_log
from highwater.storage.producer_state import AppendOrigin
from highwater.storage.topic_partition import TopicPartition

TS = 1570792689308
OFFSET_ENTRY = struct.Struct(">ii")
TIME_ENTRY = struct.Struct(">qi")
FIELD = re.compile(r"(\w+): (\S+)")


@pytest.fixture(autouse=True)
def _restore_root_logger() -> Iterator[None]:
    """The group configures the root logger; put it back as it was after each test."""
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    yield
    root.setLevel(level)
    root.handlers[:] = handlers


def dump(*args: str | Path) -> Result:
    return CliRunner().invoke(main, ["dump-log", *map(str, args)], catch_exceptions=False)


def fields(line: str) -> dict[str, str]:
    return dict(FIELD.findall(line))


def batch_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("baseOffset: ")]


def record_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("| offset: ")]


def seg(directory: Path, base: int, suffix: str) -> Path:
    return directory / f"{base:020d}{suffix}"


def open_log(directory: Path, segment_bytes: int = 1024) -> PartitionLog:
    return load_partition_log(
        directory,
        LogConfig.from_properties({"segment.bytes": segment_bytes, "index.interval.bytes": 100}),
    )


@dataclass
class Written:
    """What a test appended: the client batches (as built) and the offsets they got."""

    batches: list[bytes]
    base_offsets: list[int]


def append(
    log: PartitionLog, batch: bytes, epoch: int = 0, origin: AppendOrigin = AppendOrigin.CLIENT
) -> int:
    return log.append_as_leader(batch, leader_epoch=epoch, origin=origin).first_offset


@pytest.fixture
def partition(tmp_path: Path) -> Iterator[tuple[Path, Written]]:
    """Twelve 3-record batches over two segments, then an idempotent producer's batch."""
    directory = tmp_path / "t-0"
    log = open_log(directory)
    written = Written([], [])
    for i in range(12):
        batch = build_batch(
            [
                SimpleRecord(
                    key=b"k%d" % i, value=b"hello %d.%d" % (i, j), timestamp=TS + 10 * i + j
                )
                for j in range(3)
            ]
        )
        written.batches.append(batch)
        written.base_offsets.append(append(log, batch))
    producer_batch = build_batch(
        [SimpleRecord(key=b"p", value=b"x%d" % j, timestamp=TS + 500) for j in range(3)],
        producer_id=7,
        producer_epoch=2,
        base_sequence=0,
    )
    written.batches.append(producer_batch)
    written.base_offsets.append(append(log, producer_batch, epoch=1))
    log.roll()
    log.close()
    yield directory, written


def segment_bases(directory: Path) -> list[int]:
    return sorted(int(p.name.split(".")[0]) for p in directory.glob("*.log"))


# --- .log files ----------------------------------------------------------------------------


def test_batch_lines_carry_the_header_values(partition: tuple[Path, Written]) -> None:
    directory, written = partition
    bases = segment_bases(directory)
    assert len(bases) >= 2, "the fixture should span several segments"
    result = dump(*(seg(directory, b, ".log") for b in bases))
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    for base in bases:
        at = lines.index(f"Dumping {seg(directory, base, '.log')}")
        assert lines[at + 1] == f"Log starting offset: {base}"
    printed = [fields(line) for line in batch_lines(result.stdout)]
    assert len(printed) == len(written.batches)
    position_in_segment = 0
    for n, (got, batch, base_offset) in enumerate(
        zip(printed, written.batches, written.base_offsets, strict=True)
    ):
        header = read_header(batch)
        if base_offset in bases:
            position_in_segment = 0
        is_producer = n == len(written.batches) - 1
        assert got == {
            "baseOffset": str(base_offset),
            "lastOffset": str(base_offset + 2),
            "count": "3",
            "baseSequence": "0" if is_producer else "-1",
            "lastSequence": "2" if is_producer else "-1",
            "producerId": "7" if is_producer else "-1",
            "producerEpoch": "2" if is_producer else "-1",
            "partitionLeaderEpoch": "1" if is_producer else "0",
            "isTransactional": "false",
            "isControl": "false",
            "deleteHorizonMs": "OptionalLong.empty",
            "position": str(position_in_segment),
            "CreateTime": str(header.max_timestamp),
            "size": str(len(batch)),
            "magic": "2",
            "compresscodec": "none",
            # The CRC covers neither the base offset nor the leader epoch the log stamped.
            "crc": str(header.crc),
            "isvalid": "true",
        }
        position_in_segment += len(batch)
    assert record_lines(result.stdout) == []


def test_print_data_log_prints_every_record(tmp_path: Path) -> None:
    directory = tmp_path / "t-0"
    log = open_log(directory, segment_bytes=1 << 20)
    append(
        log,
        build_batch(
            [
                SimpleRecord(key=b"k", value=b"hello", timestamp=TS),
                SimpleRecord(key=None, value=b"line1\nline2", timestamp=TS + 1),
                SimpleRecord(key=b"gone", value=None, timestamp=TS + 2),
                SimpleRecord(
                    key=b"\xff\xfe",
                    value="h\u00e9".encode(),
                    headers=[("trace", b"1"), ("origin", None)],
                    timestamp=TS + 3,
                ),
            ]
        ),
    )
    append(
        log,
        build_batch(
            [SimpleRecord(key=b"a", value=b"b", timestamp=TS + 9)] * 2,
            producer_id=3,
            producer_epoch=0,
            base_sequence=2**31 - 1,
        ),
        origin=AppendOrigin.REPLICATION,  # a leader refuses a new producer not at sequence 0
    )
    log.close()
    result = dump("--print-data-log", seg(directory, 0, ".log"))
    assert result.exit_code == 0, result.output
    assert record_lines(result.stdout) == [
        f"| offset: 0 CreateTime: {TS} keySize: 1 valueSize: 5 sequence: -1 headerKeys: [] "
        "key: k payload: hello",
        f"| offset: 1 CreateTime: {TS + 1} keySize: -1 valueSize: 11 sequence: -1 headerKeys: [] "
        "payload: line1\\nline2",
        f"| offset: 2 CreateTime: {TS + 2} keySize: 4 valueSize: -1 sequence: -1 headerKeys: [] "
        "key: gone",
        f"| offset: 3 CreateTime: {TS + 3} keySize: 2 valueSize: 3 sequence: -1 "
        "headerKeys: [trace,origin] key: \ufffd\ufffd payload: h\u00e9",
        # Sequences wrap at 2**31, like Kafka's.
        f"| offset: 4 CreateTime: {TS + 9} keySize: 1 valueSize: 1 sequence: {2**31 - 1} "
        "headerKeys: [] key: a payload: b",
        f"| offset: 5 CreateTime: {TS + 9} keySize: 1 valueSize: 1 sequence: 0 "
        "headerKeys: [] key: a payload: b",
    ]
    lines = result.stdout.splitlines()
    # Each batch line comes before its records.
    assert lines[2].startswith("baseOffset: 0 lastOffset: 3 count: 4 ")
    assert lines[7].startswith("baseOffset: 4 lastOffset: 5 count: 2 baseSequence: 2147483647 ")
    assert fields(lines[7])["lastSequence"] == "0"


def test_deep_iteration_prints_records_without_data(partition: tuple[Path, Written]) -> None:
    directory, _ = partition
    result = dump("--deep-iteration", seg(directory, 0, ".log"))
    assert result.exit_code == 0
    records = record_lines(result.stdout)
    assert len(records) == 3 * len(batch_lines(result.stdout))
    assert records[4] == (
        f"| offset: 4 CreateTime: {TS + 11} keySize: 2 valueSize: 9 sequence: -1 headerKeys: []"
    )
    assert "payload" not in result.stdout


@pytest.mark.parametrize("compression", [Compression.GZIP, Compression.ZSTD, Compression.LZ4])
def test_compressed_batches(tmp_path: Path, compression: Compression) -> None:
    directory = tmp_path / "t-0"
    log = open_log(directory, segment_bytes=1 << 20)
    values = [b"value %d " % i * 20 for i in range(5)]
    append(
        log,
        build_batch(
            [SimpleRecord(key=None, value=v, timestamp=TS) for v in values],
            compression=compression,
        ),
    )
    log.close()
    result = dump("--print-data-log", seg(directory, 0, ".log"))
    assert result.exit_code == 0, result.output
    (line,) = batch_lines(result.stdout)
    assert fields(line)["compresscodec"] == compression.name.lower()
    payloads = [line.split(" payload: ")[1] for line in record_lines(result.stdout)]
    assert payloads == [v.decode() for v in values]


def test_log_append_time_batches(tmp_path: Path) -> None:
    directory = tmp_path / "t-0"
    log = load_partition_log(
        directory,
        LogConfig.from_properties({"message.timestamp.type": "LogAppendTime"}),
        clock=lambda: TS + 1000,
    )
    append(log, build_batch([SimpleRecord(value=b"v", timestamp=TS)] * 2))
    log.close()
    result = dump("--deep-iteration", seg(directory, 0, ".log"))
    assert result.exit_code == 0
    assert fields(batch_lines(result.stdout)[0])["LogAppendTime"] == str(TS + 1000)
    assert all(f"LogAppendTime: {TS + 1000} " in line for line in record_lines(result.stdout))


def test_max_bytes_stops_before_the_batch_that_does_not_fit(
    partition: tuple[Path, Written],
) -> None:
    directory, written = partition
    size = len(written.batches[0])
    result = dump("--max-bytes", str(2 * size + 10), seg(directory, 0, ".log"))
    assert result.exit_code == 0
    assert [fields(line)["baseOffset"] for line in batch_lines(result.stdout)] == ["0", "3"]


# --- damaged logs --------------------------------------------------------------------------


def test_a_flipped_byte_makes_the_batch_invalid(partition: tuple[Path, Written]) -> None:
    directory, written = partition
    log_file = seg(directory, 0, ".log")
    data = bytearray(log_file.read_bytes())
    second = len(written.batches[0])
    data[second + 100] ^= 0x01  # inside the records of the second batch
    log_file.write_bytes(bytes(data))
    result = dump(log_file, directory / "leader-epoch-checkpoint")
    assert result.exit_code == 1
    valid = [fields(line)["isvalid"] for line in batch_lines(result.stdout)]
    assert valid[1] == "false"
    assert valid[0] == "true" and set(valid[2:]) == {"true"}
    # The file after it is dumped all the same.
    assert f"Dumping {directory / 'leader-epoch-checkpoint'}" in result.stdout
    assert "epoch: 0 startOffset: 0" in result.stdout


def test_records_that_do_not_decode_are_reported(partition: tuple[Path, Written]) -> None:
    directory, _ = partition
    log_file = seg(directory, 0, ".log")
    data = bytearray(log_file.read_bytes())
    data[61] = 0x7E  # the first record's length varint: now far longer than the batch
    log_file.write_bytes(bytes(data))
    result = dump("--deep-iteration", log_file)
    assert result.exit_code == 1
    assert "| cannot read the records of the batch at position 0: record at byte" in result.stdout
    first, second = batch_lines(result.stdout)[:2]
    assert fields(first)["isvalid"] == "false"
    # The next batch and its records are dumped as usual.
    assert fields(second)["isvalid"] == "true"
    assert [fields(line)["offset"] for line in record_lines(result.stdout)][:3] == ["3", "4", "5"]


def test_a_truncated_tail_is_reported(partition: tuple[Path, Written]) -> None:
    directory, _ = partition
    log_file = seg(directory, 0, ".log")
    before = batch_lines(dump(log_file).stdout)
    last = fields(before[-1])
    position, size = int(last["position"]), int(last["size"])
    cut = position + size - 10  # the header is whole, the records are not
    os.truncate(log_file, cut)
    result = dump(log_file, seg(directory, 0, ".timeindex"))
    assert result.exit_code == 1
    assert batch_lines(result.stdout) == before[:-1]
    assert (
        f"Found {cut - position} invalid bytes at the end of {log_file} "
        f"(position {position}): truncated batch at offset {last['baseOffset']}"
    ) in result.stdout
    # The time index beside it still names the lost batch.
    assert f"Mismatches in {seg(directory, 0, '.timeindex')}" in result.stdout


@pytest.mark.parametrize(
    ("tail", "reason"),
    [(b"\x00" * 20, "a batch header needs 61 bytes, only 20 remain"), (b"\x07" * 80, "magic")],
)
def test_garbage_after_the_last_batch_is_reported(
    partition: tuple[Path, Written], tail: bytes, reason: str
) -> None:
    directory, _ = partition
    log_file = seg(directory, 0, ".log")
    size = log_file.stat().st_size
    with log_file.open("ab") as f:
        f.write(tail)
    result = dump(log_file)
    assert result.exit_code == 1
    line = result.stdout.splitlines()[-1]
    assert line.startswith(
        f"Found {len(tail)} invalid bytes at the end of {log_file} (position {size}): "
    )
    assert reason in line


def test_offsets_that_go_back_are_reported(partition: tuple[Path, Written]) -> None:
    directory, _ = partition
    original = seg(directory, 0, ".log")
    once = batch_lines(dump(original).stdout)
    next_offset = int(fields(once[-1])["lastOffset"]) + 1
    data = original.read_bytes()
    copy = directory.parent / "copy" / original.name
    copy.parent.mkdir()
    copy.write_bytes(data + data)
    result = dump(copy)
    assert result.exit_code == 1
    assert (
        f"Offsets go back in {copy} at position {len(data)}: base offset 0, "
        f"expected {next_offset} or more"
    ) in result.stdout
    base_offsets = [fields(line)["baseOffset"] for line in once]
    assert [fields(line)["baseOffset"] for line in batch_lines(result.stdout)] == 2 * base_offsets


# --- indexes -------------------------------------------------------------------------------


def read_entries(path: Path, entry: struct.Struct) -> list[tuple[int, int]]:
    return [(int(a), int(b)) for a, b in entry.iter_unpack(path.read_bytes())]


def test_index_lines_match_the_index_file(partition: tuple[Path, Written]) -> None:
    directory, _ = partition
    for base in segment_bases(directory):
        index = seg(directory, base, ".index")
        entries = read_entries(index, OFFSET_ENTRY)
        if base == 0:
            assert len(entries) >= 3
        result = dump(index)
        assert result.exit_code == 0, result.output
        assert result.stdout.splitlines() == [f"Dumping {index}"] + [
            f"offset: {base + relative} position: {position}" for relative, position in entries
        ]


def test_index_entries_point_at_batches_with_that_last_offset(
    partition: tuple[Path, Written],
) -> None:
    directory, _ = partition
    log_dump = dump(seg(directory, 0, ".log"))
    by_position = {
        fields(line)["position"]: fields(line)["lastOffset"]
        for line in batch_lines(log_dump.stdout)
    }
    index_dump = dump(seg(directory, 0, ".index"))
    for line in index_dump.stdout.splitlines()[1:]:
        entry = fields(line)
        assert by_position[entry["position"]] == entry["offset"]


def test_timeindex_lines_match_the_file(partition: tuple[Path, Written]) -> None:
    directory, _ = partition
    index = seg(directory, 0, ".timeindex")
    entries = read_entries(index, TIME_ENTRY)
    assert len(entries) >= 3
    result = dump(index)
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [f"Dumping {index}"] + [
        f"timestamp: {timestamp} offset: {relative}" for timestamp, relative in entries
    ]
    # Each entry names the batch that holds the largest timestamp so far.
    batches = {
        fields(line)["lastOffset"]: fields(line)["CreateTime"]
        for line in batch_lines(dump(seg(directory, 0, ".log")).stdout)
    }
    for timestamp, relative in entries:
        assert batches[str(relative)] == str(timestamp)


def test_dumping_does_not_modify_an_active_preallocated_index(tmp_path: Path) -> None:
    directory = tmp_path / "t-0"
    log = open_log(directory, segment_bytes=1 << 20)
    try:
        for i in range(10):
            append(log, build_batch([SimpleRecord(value=b"v" * 50, timestamp=TS + i)] * 2))
        log.flush()
        files = [seg(directory, 0, suffix) for suffix in (".index", ".timeindex", ".log")]
        before = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in files}
        index_size = files[0].stat().st_size
        assert index_size > 8 * 10, "the active index should be preallocated"
        result = dump(*files)
        sanity = dump("--index-sanity-check", *files[:2])
        after = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in files}
    finally:
        log.close()
    assert before == after
    assert result.exit_code == 0, result.output
    assert sanity.exit_code == 0, sanity.output
    offsets = [line for line in result.stdout.splitlines() if line.startswith("offset: ")]
    assert 0 < len(offsets) < 10  # the zeroed, preallocated slots are not entries
    assert "offset: 0 position: 0" not in result.stdout


def test_index_sanity_check_passes_for_intact_indexes(partition: tuple[Path, Written]) -> None:
    directory, _ = partition
    indexes = sorted(directory.glob("*index"))
    result = dump("--index-sanity-check", *indexes)
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        line for path in indexes for line in (f"Dumping {path}", f"{path} passed sanity check.")
    ]


def test_index_sanity_check_without_the_log(partition: tuple[Path, Written]) -> None:
    directory, _ = partition
    index = seg(directory, 0, ".index")
    alone = directory.parent / "alone" / index.name
    alone.parent.mkdir()
    shutil.copy(index, alone)
    result = dump("--index-sanity-check", alone)
    assert result.exit_code == 0
    assert f"{alone} passed sanity check. (no {seg(directory, 0, '.log').name} beside it" in (
        result.stdout
    )


def rewrite_entry(path: Path, entry: struct.Struct, n: int, a: int, b: int) -> None:
    data = bytearray(path.read_bytes())
    entry.pack_into(data, n * entry.size, a, b)
    path.write_bytes(bytes(data))


def test_index_entry_with_the_wrong_offset_is_a_mismatch(partition: tuple[Path, Written]) -> None:
    directory, _ = partition
    index = seg(directory, 0, ".index")
    (first_relative, first_position), (second_relative, second_position) = read_entries(
        index, OFFSET_ENTRY
    )[:2]
    rewrite_entry(index, OFFSET_ENTRY, 1, second_relative - 1, second_position)
    result = dump("--index-sanity-check", index)
    assert result.exit_code == 1
    assert result.stdout.splitlines() == [
        f"Dumping {index}",
        f"Mismatches in {index}",
        f"  Index offset: {second_relative - 1}, log offset: {second_relative}",
        f"{index} failed sanity check: 1 problems",
    ]
    # Without --index-sanity-check the entries are printed, then the same finding.
    result = dump(index)
    assert result.exit_code == 1
    assert f"offset: {first_relative} position: {first_position}" in result.stdout
    assert result.stdout.splitlines()[-2:] == [
        f"Mismatches in {index}",
        f"  Index offset: {second_relative - 1}, log offset: {second_relative}",
    ]


def test_index_entry_inside_a_batch_and_out_of_order(partition: tuple[Path, Written]) -> None:
    directory, _ = partition
    index = seg(directory, 0, ".index")
    entries = read_entries(index, OFFSET_ENTRY)
    rewrite_entry(index, OFFSET_ENTRY, 2, entries[2][0], entries[0][1] - 7)
    result = dump("--index-sanity-check", index)
    assert result.exit_code == 1
    lines = result.stdout.splitlines()
    assert lines[1] == f"Mismatches in {index}"
    assert (
        f"  Entry 2 (offset: {entries[2][0]} position: {entries[0][1] - 7}) does not follow "
        f"(offset: {entries[1][0]} position: {entries[1][1]})"
    ) in lines
    assert (
        f"  Index offset: {entries[2][0]}, position: {entries[0][1] - 7} "
        "is not the start of a batch"
    ) in lines
    assert lines[-1].startswith(f"{index} failed sanity check")


def test_timeindex_entry_with_the_wrong_timestamp(partition: tuple[Path, Written]) -> None:
    directory, _ = partition
    index = seg(directory, 0, ".timeindex")
    entries = read_entries(index, TIME_ENTRY)
    timestamp, relative = entries[1]
    rewrite_entry(index, TIME_ENTRY, 1, timestamp - 1, relative)
    result = dump("--index-sanity-check", index)
    assert result.exit_code == 1
    assert result.stdout.splitlines()[1:] == [
        f"Mismatches in {index}",
        f"  Index timestamp: {timestamp - 1}, log timestamp: {timestamp} (offset: {relative})",
        f"{index} failed sanity check: 1 problems",
    ]


def test_index_with_a_partial_entry(partition: tuple[Path, Written]) -> None:
    directory, _ = partition
    index = seg(directory, 0, ".index")
    with index.open("ab") as f:
        f.write(b"\x01\x02\x03")
    result = dump("--index-sanity-check", index)
    assert result.exit_code == 1
    assert "  3 bytes at the end do not make a whole entry (entries are 8 bytes)" in result.stdout


# --- snapshots and checkpoints -------------------------------------------------------------


def test_snapshot_lists_each_producer(partition: tuple[Path, Written]) -> None:
    directory, written = partition
    end = written.base_offsets[-1] + 3
    snapshot = seg(directory, end, ".snapshot")
    assert snapshot.exists()
    result = dump("--deep-iteration", snapshot)
    assert result.exit_code == 0, result.output
    last = written.base_offsets[-1] + 2
    assert result.stdout.splitlines() == [
        f"Dumping {snapshot}",
        f"Snapshot offset: {end} producers: 1",
        f"producerId: 7 producerEpoch: 2 lastSequence: 2 lastOffset: {last} "
        f"lastTimestamp: {TS + 500} firstSequence: 0 firstOffset: {last - 2} batches: 1",
        f"| firstSequence: 0 lastSequence: 2 firstOffset: {last - 2} lastOffset: {last} "
        f"timestamp: {TS + 500}",
    ]


def test_corrupt_snapshot_is_an_error(partition: tuple[Path, Written]) -> None:
    directory, written = partition
    snapshot = seg(directory, written.base_offsets[-1] + 3, ".snapshot")
    data = bytearray(snapshot.read_bytes())
    data[-1] ^= 0xFF
    snapshot.write_bytes(bytes(data))
    result = dump(snapshot)
    assert result.exit_code == 1
    assert f"Error: {snapshot}: " in result.stderr
    assert "CRC mismatch" in result.stderr


def test_leader_epoch_checkpoint(partition: tuple[Path, Written]) -> None:
    directory, written = partition
    result = dump(directory / "leader-epoch-checkpoint")
    assert result.exit_code == 0
    assert result.stdout.splitlines()[1:] == [
        "epoch: 0 startOffset: 0",
        f"epoch: 1 startOffset: {written.base_offsets[-1]}",
    ]


def test_offset_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / REPLICATION_OFFSET_CHECKPOINT
    OffsetCheckpointFile(path).write(
        {
            TopicPartition("orders", 0): 42,
            TopicPartition("orders", 3): 7,
            TopicPartition("audit", 1): 0,
        }
    )
    result = dump(path)
    assert result.exit_code == 0
    assert result.stdout.splitlines() == [
        f"Dumping {path}",
        "topic: audit partition: 1 offset: 0",
        "topic: orders partition: 0 offset: 42",
        "topic: orders partition: 3 offset: 7",
    ]


# --- file handling -------------------------------------------------------------------------


def test_unknown_and_missing_files_are_errors(partition: tuple[Path, Written]) -> None:
    directory, _ = partition
    unknown = directory / "meta.properties"
    unknown.write_text("node.id=1\n")
    missing = seg(directory, 999, ".log")
    result = dump(unknown, missing, directory / "leader-epoch-checkpoint")
    assert result.exit_code == 1
    errors = result.stderr.splitlines()
    assert errors[0].startswith(f"Error: {unknown}: unknown file type")
    assert errors[1] == f"Error: {missing}: no such file"
    assert result.stdout.splitlines()[0] == f"Dumping {directory / 'leader-epoch-checkpoint'}"


def test_files_option_and_transient_suffixes(partition: tuple[Path, Written]) -> None:
    directory, _ = partition
    deleted = directory / (seg(directory, 0, ".log").name + ".deleted")
    shutil.copy(seg(directory, 0, ".log"), deleted)
    index = seg(directory, 0, ".index")
    result = dump("--files", f"{deleted},{index}")
    assert result.exit_code == 0, result.output
    assert f"Dumping {deleted}\nLog starting offset: 0\nbaseOffset: 0 " in result.stdout
    assert f"Dumping {index}\noffset: " in result.stdout


def test_no_files_is_a_usage_error() -> None:
    result = dump()
    assert result.exit_code == 2
    assert "give at least one file" in result.stderr


def test_broken_pipe_ends_quietly(tmp_path: Path) -> None:
    directory = tmp_path / "t-0"
    log = open_log(directory, segment_bytes=1 << 24)
    for _ in range(100):
        append(log, build_batch([SimpleRecord(value=b"v" * 20, timestamp=TS)] * 50))
    log.close()
    log_file = str(seg(directory, 0, ".log"))
    process = subprocess.Popen(
        [sys.executable, "-m", "highwater", "dump-log", "--print-data-log", log_file],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert process.stdout is not None and process.stderr is not None
    process.stdout.readline()
    process.stdout.close()
    stderr = process.stderr.read()
    process.stderr.close()
    assert process.wait(timeout=30) == 1
    assert b"Traceback" not in stderr


# --- the highwater group -------------------------------------------------------------------


def test_python_dash_m_highwater_help() -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "highwater", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.startswith("Usage: highwater ")
    assert "replicated commit log" in completed.stdout
    assert "dump-log" in completed.stdout


def test_version() -> None:
    result = CliRunner().invoke(main, ["--version"])
    assert result.exit_code == 0
    assert result.stdout == f"highwater {__version__}\n"
    assert __version__ == importlib.metadata.version("highwater")


@pytest.mark.parametrize(("given", "level"), [("debug", logging.DEBUG), ("ERROR", logging.ERROR)])
def test_log_level_configures_logging(given: str, level: int) -> None:
    result = CliRunner().invoke(main, ["--log-level", given, "dump-log", "--help"])
    assert result.exit_code == 0
    assert logging.getLogger().level == level


def test_log_level_default_is_warning_and_records_reach_stderr() -> None:
    @main.command("log-something", hidden=True)
    def log_something() -> None:
        logging.getLogger("highwater.test").warning("a warning")
        logging.getLogger("highwater.test").info("not shown")

    try:
        result = CliRunner().invoke(main, ["log-something"])
        second = CliRunner().invoke(main, ["log-something"])
    finally:
        main.commands.pop("log-something")
    assert result.exit_code == 0
    assert logging.getLogger().level == logging.WARNING
    assert "WARNING highwater.test: a warning" in result.stderr
    assert "not shown" not in result.stderr
    # Configuring again does not add a second handler: each record is written once.
    assert second.stderr.count("a warning") == 1


def test_invalid_log_level_is_a_usage_error() -> None:
    result = CliRunner().invoke(main, ["--log-level", "LOUD", "dump-log", "x.log"])
    assert result.exit_code == 2
