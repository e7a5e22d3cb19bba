"""Building and reading RecordBatch v2: round trips for every codec, the builder, views."""

from __future__ import annotations

import mmap
import time
from pathlib import Path

import pytest
from highwater.errors import CorruptRecordError, InvalidRecordError
from highwater.records import (
    BATCH_HEADER_SIZE,
    Compression,
    Record,
    RecordBatch,
    RecordBatchBuilder,
    SimpleRecord,
    TimestampType,
    build_batch,
    check_batch,
    iter_batches,
)
from highwater.records.header import set_base_offset, set_log_append_time
from hypothesis import given, settings
from hypothesis import strategies as st
from records_helpers import simple_records


def expected(records: list[SimpleRecord], base_offset: int = 0) -> list[Record]:
    return [
        Record(base_offset + i, r.timestamp or 0, r.key, r.value, tuple(r.headers))
        for i, r in enumerate(records)
    ]


@pytest.mark.parametrize("compression", list(Compression))
@given(
    records=simple_records(),
    base_offset=st.integers(0, 1 << 60),
    producer=st.one_of(
        st.just((-1, -1, -1, False)),
        st.tuples(
            st.integers(0, 1 << 62),
            st.integers(0, 32767),
            st.integers(0, (1 << 31) - 1),
            st.booleans(),
        ),
    ),
    partition_leader_epoch=st.integers(-1, 1 << 30),
)
@settings(max_examples=40)
def test_round_trip(
    compression: Compression,
    records: list[SimpleRecord],
    base_offset: int,
    producer: tuple[int, int, int, bool],
    partition_leader_epoch: int,
) -> None:
    producer_id, producer_epoch, base_sequence, transactional = producer
    buf = build_batch(
        records,
        base_offset=base_offset,
        compression=compression,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        is_transactional=transactional,
        partition_leader_epoch=partition_leader_epoch,
    )
    batch = RecordBatch(buf)
    assert list(batch.records()) == expected(records, base_offset)
    assert list(batch) == expected(records, base_offset)
    assert list(batch.iter_keys()) == [
        (base_offset + i, r.key, r.value is None) for i, r in enumerate(records)
    ]
    assert batch.size == len(buf)
    assert batch.compression == compression
    assert batch.base_offset == base_offset
    assert batch.last_offset == base_offset + len(records) - 1
    assert batch.next_offset == batch.last_offset + 1
    assert batch.records_count == len(records)
    assert batch.base_timestamp == records[0].timestamp
    assert batch.max_timestamp == max(r.timestamp or 0 for r in records)
    assert batch.producer_id == producer_id
    assert batch.producer_epoch == producer_epoch
    assert batch.base_sequence == base_sequence
    assert batch.is_transactional == transactional
    assert not batch.is_control
    assert batch.partition_leader_epoch == partition_leader_epoch
    assert batch.timestamp_type == TimestampType.CREATE_TIME
    assert batch.delete_horizon_ms is None
    assert batch.magic == 2


@pytest.mark.parametrize("compression", list(Compression))
def test_builder_writes_what_build_batch_writes(compression: Compression) -> None:
    records = [
        SimpleRecord(b"k%d" % i, b"value %d " % i * 20, [("trace", b"%d" % i)], 1000 + i % 7)
        for i in range(300)
    ]
    builder = RecordBatchBuilder(
        max_bytes=1 << 20,
        compression=compression,
        producer_id=7,
        producer_epoch=1,
        base_sequence=42,
    )
    for r in records:
        assert builder.append(r.key, r.value, r.headers, r.timestamp)
    assert builder.records_count == 300
    assert builder.base_timestamp == 1000
    assert builder.max_timestamp == 1006
    built = builder.build()
    assert built == build_batch(
        records, compression=compression, producer_id=7, producer_epoch=1, base_sequence=42
    )
    assert builder.build() is built
    assert builder.is_built
    assert list(RecordBatch(built)) == expected(records)


def test_builder_respects_max_bytes_but_always_takes_the_first_record() -> None:
    builder = RecordBatchBuilder(max_bytes=200)
    assert builder.estimated_size == BATCH_HEADER_SIZE
    assert builder.append(b"big", b"x" * 500, timestamp=1)  # first: always fits
    size = builder.estimated_size
    assert size > 500
    assert not builder.append(b"k", b"v", timestamp=2)
    assert builder.estimated_size == size and builder.records_count == 1

    builder = RecordBatchBuilder(max_bytes=BATCH_HEADER_SIZE + 30)
    assert builder.append(b"k", b"v" * 10, timestamp=5)
    assert builder.append(b"k", b"v", timestamp=3)
    assert not builder.append(b"k", b"v" * 10, timestamp=9)
    batch = RecordBatch(builder.build())
    assert [r.timestamp for r in batch] == [5, 3]
    assert batch.max_timestamp == 5
    assert builder.estimated_size == batch.size


def test_builder_estimate_is_the_uncompressed_size() -> None:
    builder = RecordBatchBuilder(compression=Compression.ZSTD)
    builder.append(b"k", b"a" * 10_000, timestamp=1)
    estimated = builder.estimated_size
    assert estimated == len(build_batch([SimpleRecord(b"k", b"a" * 10_000, (), 1)]))
    assert len(builder.build()) < estimated


def test_builder_producer_state_set_at_drain() -> None:
    builder = RecordBatchBuilder()
    builder.append(None, b"v", timestamp=1)
    builder.set_producer_state(5, 0, 10, is_transactional=True)
    batch = RecordBatch(builder.build())
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence) == (5, 0, 10)
    assert batch.is_transactional
    assert batch.last_sequence == 10
    with pytest.raises(RuntimeError):
        builder.append(None, b"v")
    with pytest.raises(RuntimeError):
        builder.set_producer_state(1, 1, 1)


def test_builder_rolls_back_a_record_that_fails_to_encode() -> None:
    builder = RecordBatchBuilder()
    builder.append(b"a", b"b", timestamp=0)
    size = builder.estimated_size
    with pytest.raises(InvalidRecordError):
        builder.append(b"a", b"b", timestamp=1 << 63)
    with pytest.raises(InvalidRecordError):
        builder.append(b"a", b"b", timestamp=-(1 << 63) - 1)
    assert builder.estimated_size == size and builder.records_count == 1
    assert len(list(RecordBatch(builder.build()))) == 1


def test_missing_timestamps_mean_now() -> None:
    before = int(time.time() * 1000)
    buf = build_batch([SimpleRecord(b"k", b"v")])
    builder = RecordBatchBuilder()
    builder.append(b"k", b"v")
    after = int(time.time() * 1000) + 1
    for batch in (RecordBatch(buf), RecordBatch(builder.build())):
        (record,) = batch
        assert before <= record.timestamp <= after


def test_log_append_time() -> None:
    records = [SimpleRecord(b"k", b"v", (), t) for t in (10, 30, 20)]
    batch = RecordBatch(build_batch(records, timestamp_type=TimestampType.LOG_APPEND_TIME))
    assert batch.timestamp_type == TimestampType.LOG_APPEND_TIME
    assert [r.timestamp for r in batch] == [30, 30, 30]

    stamped = bytearray(build_batch(records, compression=Compression.LZ4))
    set_log_append_time(stamped, 0, 5000)
    set_base_offset(stamped, 0, 100)
    batch = RecordBatch(stamped)
    assert batch.timestamp_type == TimestampType.LOG_APPEND_TIME
    assert [(r.offset, r.timestamp) for r in batch] == [(100, 5000), (101, 5000), (102, 5000)]


def test_delete_horizon() -> None:
    records = [SimpleRecord(b"k", None, (), 1000), SimpleRecord(b"j", b"v", (), 900)]
    batch = RecordBatch(build_batch(records, delete_horizon_ms=86_400_000))
    assert batch.delete_horizon_ms == 86_400_000
    assert batch.base_timestamp == 86_400_000
    assert batch.max_timestamp == 1000
    assert [r.timestamp for r in batch] == [1000, 900]
    assert batch.header.has_delete_horizon


def test_explicit_offset_deltas_with_gaps() -> None:
    records = [
        SimpleRecord(b"a", b"1", (), 1, offset_delta=0),
        SimpleRecord(b"b", b"2", (), 2, offset_delta=5),
        SimpleRecord(b"c", b"3", (), 3),  # follows: 6
        SimpleRecord(b"d", None, (), 4, offset_delta=40),
    ]
    for compression in Compression:
        batch = RecordBatch(build_batch(records, base_offset=1000, compression=compression))
        assert [r.offset for r in batch] == [1000, 1005, 1006, 1040]
        assert [o for o, _, _ in batch.iter_keys()] == [1000, 1005, 1006, 1040]
        assert batch.last_offset_delta == 40
        assert batch.records_count == 4


def test_cleaner_rebuilds_from_records() -> None:
    original = RecordBatch(
        build_batch(
            [SimpleRecord(b"k%d" % (i % 3), b"v%d" % i, (), i) for i in range(10)],
            base_offset=500,
            producer_id=3,
            producer_epoch=0,
            base_sequence=0,
        )
    )
    latest = {r.key: r for r in original}
    kept = sorted(latest.values(), key=lambda r: r.offset)
    cleaned = RecordBatch(
        build_batch(
            kept,
            base_offset=original.base_offset,
            producer_id=original.producer_id,
            producer_epoch=original.producer_epoch,
            base_sequence=original.base_sequence,
            last_offset_delta=original.last_offset_delta,
        )
    )
    assert list(cleaned) == kept
    assert [r.offset for r in cleaned] == [507, 508, 509]
    assert cleaned.last_offset == original.last_offset
    assert cleaned.last_sequence == original.last_sequence


def test_empty_batch_keeps_an_offset_range() -> None:
    for compression in Compression:
        buf = build_batch(
            [],
            base_offset=10,
            compression=compression,
            last_offset_delta=4,
            producer_id=1,
            producer_epoch=0,
            base_sequence=20,
        )
        batch = RecordBatch(buf)
        assert len(buf) == BATCH_HEADER_SIZE
        assert batch.records_count == 0 and list(batch) == [] and list(batch.iter_keys()) == []
        assert batch.compression == Compression.NONE
        assert (batch.last_offset, batch.next_offset, batch.last_sequence) == (14, 15, 24)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"is_transactional": True}, "transactional batch needs a producer id"),
        ({"producer_id": 1}, "without a producer epoch"),
        ({"producer_id": 1, "producer_epoch": 0}, "without a base sequence"),
        ({"producer_id": 1, "producer_epoch": 1 << 15, "base_sequence": 0}, "producer epoch"),
        ({"base_sequence": 1 << 31}, "base sequence"),
        ({"base_offset": 1 << 63}, "base offset"),
        ({"partition_leader_epoch": 1 << 31}, "partition leader epoch"),
        ({"last_offset_delta": 0}, "below the last record's 1"),
        ({"delete_horizon_ms": 1 << 63}, "delete horizon"),
    ],
)
def test_invalid_batch_fields(kwargs: dict[str, int], message: str) -> None:
    records = [SimpleRecord(b"a", b"b", (), 1), SimpleRecord(b"a", b"b", (), 2)]
    with pytest.raises(InvalidRecordError, match=message):
        build_batch(records, **kwargs)  # type: ignore[arg-type]


def test_control_batch_needs_no_sequence() -> None:
    batch = RecordBatch(
        build_batch(
            [SimpleRecord(b"\x00\x00\x00\x01", b"\x00\x00\x00\x00\x00\x00", (), 5)],
            producer_id=9,
            producer_epoch=2,
            is_transactional=True,
            is_control=True,
        )
    )
    assert batch.is_control and batch.is_transactional and batch.base_sequence == -1


@pytest.mark.parametrize(
    "records",
    [
        [SimpleRecord(b"a", b"b", (), 1, offset_delta=3), SimpleRecord(b"a", b"b", (), 1, 3)],
        [SimpleRecord(b"a", b"b", (), 1, offset_delta=3), SimpleRecord(b"a", b"b", (), 1, 2)],
        [SimpleRecord(b"a", b"b", (), 1, offset_delta=-1)],
    ],
)
def test_offset_deltas_must_increase(records: list[SimpleRecord]) -> None:
    with pytest.raises(InvalidRecordError, match="offsets must increase"):
        build_batch(records)


@pytest.mark.parametrize("timestamps", [[1 << 63], [-(1 << 63) - 1], [-(1 << 63), (1 << 63) - 1]])
def test_timestamps_must_fit(timestamps: list[int]) -> None:
    with pytest.raises(InvalidRecordError):
        build_batch([SimpleRecord(b"a", b"b", (), t) for t in timestamps])


def test_extreme_timestamps_round_trip() -> None:
    records = [SimpleRecord(None, None, (), t) for t in ((1 << 63) - 1, 0, -1)]
    batch = RecordBatch(build_batch(records))
    assert [r.timestamp for r in batch] == [(1 << 63) - 1, 0, -1]


def test_iter_batches_over_views_at_any_position(tmp_path: Path) -> None:
    batches = [
        build_batch(
            [SimpleRecord(b"k", b"v" * i, (), i) for i in range(1, n + 1)],
            base_offset=offset,
            compression=compression,
        )
        for offset, n, compression in [
            (0, 3, Compression.NONE),
            (3, 5, Compression.GZIP),
            (8, 1, Compression.ZSTD),
        ]
    ]
    log = b"".join(batches)
    with open(tmp_path / "segment.log", "w+b") as f:
        f.write(log)
        f.flush()
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            view = memoryview(mapped)
            for buf in (log, bytearray(log), memoryview(log), view):
                found = list(iter_batches(buf))
                assert [b.base_offset for b in found] == [0, 3, 8]
                assert [b.position for b in found] == [
                    0,
                    len(batches[0]),
                    len(log) - len(batches[2]),
                ]
                assert [b.to_bytes() for b in found] == batches
                assert [bytes(b.view()) for b in found] == batches
                assert [r.offset for b in found for r in b] == list(range(9))
                assert [o for b in found for o, _, _ in b.iter_keys()] == list(range(9))
                del found
            view.release()
    assert list(iter_batches(b"")) == []
    with pytest.raises(CorruptRecordError, match="truncated"):
        list(iter_batches(log + batches[0][:30]))
    with pytest.raises(CorruptRecordError, match="truncated"):
        list(iter_batches(log[:-1]))


def test_batch_reads_in_a_larger_buffer() -> None:
    buf = build_batch([SimpleRecord(b"k", b"v", (), 1)], base_offset=7)
    batch = RecordBatch(b"garbage" + buf + b"more", 7)
    assert [r.offset for r in batch] == [7]
    assert check_batch(b"garbage" + buf, 7) == batch.header
    assert "base_offset=7" in repr(batch)


def test_iter_keys_reports_tombstones_and_null_keys() -> None:
    records = [
        SimpleRecord(b"a", b"1", [("h", None)], 1),
        SimpleRecord(b"a", None, (), 2),
        SimpleRecord(None, b"x", (), 3),
        SimpleRecord(b"", b"", (), 4),
        SimpleRecord(b"\x80" * 300, b"y" * 70_000, [("k" * 200, b"v" * 200)], 5),
    ]
    for compression in Compression:
        batch = RecordBatch(build_batch(records, base_offset=41, compression=compression))
        assert list(batch.iter_keys()) == [
            (41, b"a", False),
            (42, b"a", True),
            (43, None, False),
            (44, b"", False),
            (45, b"\x80" * 300, False),
        ]


@pytest.mark.parametrize("compression", [Compression.GZIP, Compression.LZ4, Compression.ZSTD])
def test_compression_level(compression: Compression) -> None:
    records = [SimpleRecord(b"k%d" % i, b"value %d " % (i % 50) * 30, (), i) for i in range(400)]
    fast = build_batch(records, compression=compression, compression_level=1)
    small = build_batch(records, compression=compression, compression_level=9)
    assert fast != small
    builder = RecordBatchBuilder(max_bytes=1 << 20, compression=compression, compression_level=9)
    for r in records:
        builder.append(r.key, r.value, r.headers, r.timestamp)
    assert builder.build() == small
    assert list(RecordBatch(fast)) == list(RecordBatch(small)) == expected(records)
