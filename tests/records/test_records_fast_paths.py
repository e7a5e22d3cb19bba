"""The batch-at-a-time codecs against the one-record ones they stand in for.

:func:`record_size` and :func:`encode_records` (a producer's batch, encoded when sealed)
must give what :func:`write_record` writes; :meth:`RecordBatch.read_records` (the
consumer's decoder) must give what :meth:`RecordBatch.records` yields, and fail where it
fails, keeping the records before the failure.
"""

from __future__ import annotations

import pytest
from highwater.errors import CorruptRecordError, InvalidRecordError
from highwater.records import (
    BATCH_HEADER_SIZE,
    Compression,
    RecordBatch,
    RecordBatchBuilder,
    SimpleRecord,
    build_batch,
)
from highwater.records.record import (
    Headers,
    encode_records,
    record_size,
    write_record,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from records_helpers import header_lists, keys, resign, simple_records

# Lengths around the one- and two-byte varint boundaries of the look-up tables.
sized_values = st.none() | st.integers(0, 9000).map(lambda n: bytes(n % 251 for _ in range(n)))


@given(
    key=keys,
    value=sized_values,
    headers=header_lists,
    offset_delta=st.integers(-(1 << 31), (1 << 31) - 1),
    timestamp_delta=st.integers(-(1 << 63), (1 << 63) - 1) | st.integers(-100, 10_000),
)
def test_record_size_is_what_write_record_writes(
    key: bytes | None,
    value: bytes | None,
    headers: tuple[tuple[str, bytes | None], ...],
    offset_delta: int,
    timestamp_delta: int,
) -> None:
    out = bytearray()
    written = write_record(out, offset_delta, timestamp_delta, key, value, headers)
    assert record_size(offset_delta, timestamp_delta, key, value, headers) == written == len(out)


@pytest.mark.parametrize(
    ("offset_delta", "timestamp_delta"),
    [(0, 1 << 63), (0, -(1 << 63) - 1), (1 << 31, 0), (-(1 << 31) - 1, 0)],
)
def test_record_size_rejects_what_write_record_rejects(
    offset_delta: int, timestamp_delta: int
) -> None:
    with pytest.raises(InvalidRecordError):
        write_record(bytearray(), offset_delta, timestamp_delta, None, b"v")
    with pytest.raises(InvalidRecordError):
        record_size(offset_delta, timestamp_delta, None, b"v")


@given(
    records=st.lists(
        st.tuples(keys, sized_values, header_lists, st.integers(-(1 << 40), 1 << 40)),
        min_size=1,
        max_size=30,
    ),
    spread=st.sampled_from([0, 100, 10_000, 1 << 40]),
)
def test_encode_records_is_write_record_for_each(
    records: list[tuple[bytes | None, bytes | None, tuple[tuple[str, bytes | None], ...], int]],
    spread: int,
) -> None:
    base = records[0][3]
    records = [(k, v, h, base + (t % (spread + 1))) for k, v, h, t in records]
    expected = bytearray()
    for delta, (key, value, headers, timestamp) in enumerate(records):
        write_record(expected, delta, timestamp - base, key, value, headers)
    assert encode_records(records, base) == expected
    # Given each record's size, as a batch builder gives them.
    sizes = [record_size(d, t - base, k, v, h) for d, (k, v, h, t) in enumerate(records)]
    assert encode_records(records, base, sizes) == expected


def test_encode_records_past_the_tables() -> None:
    records = [(None, b"x" * 9000, (), 5 + i * 10_000) for i in range(8200)]
    expected = bytearray()
    for delta, (key, value, headers, timestamp) in enumerate(records):
        write_record(expected, delta, timestamp - 5, key, value, headers)
    assert encode_records(records, 5) == expected
    sizes = [record_size(d, t - 5, k, v, h) for d, (k, v, h, t) in enumerate(records)]
    assert encode_records(records, 5, sizes) == expected


@pytest.mark.parametrize("length", [0, 1, 50, 62, 63, 64, 8188, 8189, 8190, 8191, 8192, 70_000])
def test_encode_records_with_sizes_at_the_varint_boundaries(length: int) -> None:
    records = [(None, b"v" * length, (), 7), (b"k" * length, None, (), 8)]
    expected = bytearray()
    for delta, (key, value, headers, timestamp) in enumerate(records):
        write_record(expected, delta, timestamp - 7, key, value, headers)
    sizes = [record_size(d, t - 7, k, v, h) for d, (k, v, h, t) in enumerate(records)]
    assert encode_records(records, 7, sizes) == expected


def test_encode_records_rejects_a_timestamp_delta_beyond_int64() -> None:
    with pytest.raises(InvalidRecordError):
        encode_records([(None, b"v", (), 1 << 62), (None, b"v", (), -(1 << 62) - 10)], 1 << 62)


@pytest.mark.parametrize("compression", [Compression.NONE, Compression.LZ4])
@given(records=simple_records(max_size=40))
@settings(max_examples=50)
def test_the_builder_builds_what_build_batch_does(
    compression: Compression, records: list[SimpleRecord]
) -> None:
    builder = RecordBatchBuilder(max_bytes=1 << 30, compression=compression)
    for r in records:
        assert r.timestamp is not None
        added = builder.append_fields((r.key, r.value, r.headers, r.timestamp))
        assert added > 0
    assert builder.records_count == len(records)
    built = builder.build()
    assert built == build_batch(records, compression=compression)
    assert builder.estimated_size == len(built) or compression != Compression.NONE
    assert [f[0] for f in builder.records] == [r.key for r in records]


def test_append_fields_reports_the_bytes_and_zero_when_full() -> None:
    builder = RecordBatchBuilder(max_bytes=BATCH_HEADER_SIZE + 20)
    first = builder.append_fields((None, b"v" * 10, (), 1))
    assert first == builder.estimated_size - BATCH_HEADER_SIZE
    assert builder.append_fields((None, b"v" * 10, (), 2)) == 0
    assert builder.records_count == 1


RecordTuple = tuple[int, int, bytes | None, bytes | None, Headers]
"""``(offset, timestamp, key, value, headers)``: a decoded record, compared field by field."""


def as_tuple(
    key: bytes | None, value: bytes | None, headers: Headers, timestamp: int, offset: int
) -> RecordTuple:
    """The factory :meth:`RecordBatch.read_records` is given here."""
    return (offset, timestamp, key, value, headers)


def as_tuples(batch: RecordBatch) -> tuple[list[RecordTuple], bool]:
    """What records() yields before it stops, and whether it raised."""
    got: list[RecordTuple] = []
    try:
        for r in batch.records():
            got.append((r.offset, r.timestamp, r.key, r.value, r.headers))
    except CorruptRecordError:
        return got, True
    return got, False


def read(batch: RecordBatch) -> tuple[list[RecordTuple], bool]:
    out: list[RecordTuple] = []
    try:
        batch.read_records(out, as_tuple)
    except CorruptRecordError:
        return out, True
    return out, False


@pytest.mark.parametrize("compression", [Compression.NONE, Compression.GZIP])
@given(
    records=simple_records(max_size=80),
    base_offset=st.integers(0, 1 << 60),
    gaps=st.lists(st.integers(0, 100), min_size=80, max_size=80),
)
@settings(max_examples=60)
def test_read_records_gives_what_records_yields(
    compression: Compression, records: list[SimpleRecord], base_offset: int, gaps: list[int]
) -> None:
    delta = -1
    placed = []
    for r, gap in zip(records, gaps, strict=False):
        delta += 1 + gap  # offset deltas with gaps, as compaction leaves them
        placed.append(SimpleRecord(r.key, r.value, r.headers, r.timestamp, delta))
    batch = RecordBatch(build_batch(placed, base_offset=base_offset, compression=compression))
    expected, failed = as_tuples(batch)
    assert not failed
    assert read(batch) == (expected, False)


def test_read_records_of_log_append_time_and_memoryviews() -> None:
    from highwater.records import TimestampType

    records = [SimpleRecord(b"k" * 70, b"v" * 200, (("h", b"1"),), 10 + i) for i in range(100)]
    data = build_batch(records, timestamp_type=TimestampType.LOG_APPEND_TIME)
    for buf in (data, bytearray(data), memoryview(data)):
        batch = RecordBatch(buf)
        out, failed = read(batch)
        assert not failed and (out, False) == as_tuples(batch)
        assert all(type(t[2]) is bytes and type(t[3]) is bytes for t in out)


@given(
    records=simple_records(min_size=2, max_size=20),
    flips=st.lists(st.tuples(st.integers(0, 1 << 20), st.integers(1, 255)), min_size=1, max_size=3),
    cut=st.integers(0, 40),
)
@settings(max_examples=300)
def test_read_records_fails_where_records_fails(
    records: list[SimpleRecord], flips: list[tuple[int, int]], cut: int
) -> None:
    data = bytearray(build_batch(records))
    for position, mask in flips:
        data[BATCH_HEADER_SIZE + position % (len(data) - BATCH_HEADER_SIZE)] ^= mask
    if cut:  # drop bytes at the end, the batch length fixed up
        del data[-cut:]
        data[8:12] = (len(data) - 12).to_bytes(4, "big")
    try:
        batch = RecordBatch(bytes(resign(data)))
    except CorruptRecordError:
        return
    assert read(batch) == as_tuples(batch)
