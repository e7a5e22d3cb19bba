"""Cross-check against kafka-python's independent RecordBatch v2 code, in both directions.

Batches kafka-python builds must read the same with Highwater (CRC included), and
batches Highwater builds must pass kafka-python's ``validate_crc()`` and read the same
there, for every codec, with the idempotence and transaction fields set.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
from highwater.records import (
    Compression,
    Record,
    RecordBatch,
    SimpleRecord,
    TimestampType,
    build_batch,
    check_batch,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from records_helpers import simple_records

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)  # kafka-python's import-time noise
    from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

producer_fields = st.one_of(
    st.just((-1, -1, -1, False)),
    st.tuples(
        st.integers(0, (1 << 63) - 1),
        st.integers(0, (1 << 15) - 1),
        st.integers(0, (1 << 31) - 1),
        st.booleans(),
    ),
)


def kafka_python_build(
    records: list[SimpleRecord],
    compression: Compression,
    producer: tuple[int, int, int, bool],
) -> bytes:
    producer_id, producer_epoch, base_sequence, transactional = producer
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=int(compression),
        is_transactional=transactional,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        batch_size=1 << 30,
    )
    for delta, r in enumerate(records):
        assert builder.append(delta, r.timestamp, r.key, r.value, list(r.headers)) is not None
    return bytes(builder.build())


def kafka_python_read(buf: bytes) -> tuple[Any, list[Record]]:
    batch = DefaultRecordBatch(buf)
    assert batch.validate_crc()
    records = [Record(r.offset, r.timestamp, r.key, r.value, tuple(r.headers)) for r in batch]
    return batch, records


def assert_same_header(ours: RecordBatch, theirs: Any) -> None:
    assert ours.base_offset == theirs.base_offset
    assert ours.size == theirs.size_in_bytes
    assert ours.partition_leader_epoch == theirs.leader_epoch
    assert ours.crc == theirs.crc
    assert ours.attributes == theirs.attributes
    assert ours.compression == theirs.compression_type
    assert ours.timestamp_type == theirs.timestamp_type
    assert ours.is_transactional == theirs.is_transactional
    assert ours.is_control == theirs.is_control_batch
    assert ours.last_offset_delta == theirs.last_offset_delta
    assert ours.base_timestamp == theirs.first_timestamp
    assert ours.max_timestamp == theirs.max_timestamp
    assert ours.producer_id == theirs.producer_id
    assert ours.producer_epoch == theirs.producer_epoch
    assert ours.base_sequence == theirs.base_sequence
    assert ours.last_sequence == theirs.last_sequence
    assert ours.records_count == theirs.records_count


def as_records(records: list[SimpleRecord], base_offset: int = 0) -> list[Record]:
    return [
        Record(base_offset + i, r.timestamp or 0, r.key, r.value, tuple(r.headers))
        for i, r in enumerate(records)
    ]


@pytest.mark.parametrize("compression", list(Compression))
@given(records=simple_records(), producer=producer_fields)
@settings(max_examples=40)
def test_kafka_python_batches_read_the_same(
    compression: Compression, records: list[SimpleRecord], producer: tuple[int, int, int, bool]
) -> None:
    buf = kafka_python_build(records, compression, producer)
    check_batch(buf)  # sizes, magic and CRC
    ours = RecordBatch(buf)
    theirs, their_records = kafka_python_read(buf)
    assert list(ours.records()) == their_records == as_records(records)
    assert list(ours.iter_keys()) == [(r.offset, r.key, r.value is None) for r in their_records]
    assert_same_header(ours, theirs)


@pytest.mark.parametrize("compression", list(Compression))
@given(
    records=simple_records(),
    producer=producer_fields,
    base_offset=st.integers(0, 1 << 62),
    partition_leader_epoch=st.integers(-1, (1 << 31) - 1),
    timestamp_type=st.sampled_from(TimestampType),
)
@settings(max_examples=40)
def test_our_batches_read_the_same_in_kafka_python(
    compression: Compression,
    records: list[SimpleRecord],
    producer: tuple[int, int, int, bool],
    base_offset: int,
    partition_leader_epoch: int,
    timestamp_type: TimestampType,
) -> None:
    producer_id, producer_epoch, base_sequence, transactional = producer
    buf = build_batch(
        records,
        base_offset=base_offset,
        compression=compression,
        timestamp_type=timestamp_type,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        is_transactional=transactional,
        partition_leader_epoch=partition_leader_epoch,
    )
    theirs, their_records = kafka_python_read(buf)
    ours = RecordBatch(buf)
    assert their_records == list(ours.records())
    if timestamp_type == TimestampType.LOG_APPEND_TIME:
        max_timestamp = max(r.timestamp or 0 for r in records)
        assert [r.timestamp for r in their_records] == [max_timestamp] * len(records)
    else:
        assert their_records == as_records(records, base_offset)
    assert_same_header(ours, theirs)


@pytest.mark.parametrize("compression", list(Compression))
def test_compressed_both_ways(compression: Compression) -> None:
    # Compressible values, so that kafka-python (which falls back to no compression when
    # it does not pay) really compresses too.
    records = [
        SimpleRecord(b"user-%d" % (i % 17), b'{"event": "click", "n": %d}' % i * 10, [], 1000 + i)
        for i in range(500)
    ]
    producer = (123456789, 3, 1000, True)
    theirs_buf = kafka_python_build(records, compression, producer)
    ours_buf = build_batch(
        records,
        compression=compression,
        producer_id=123456789,
        producer_epoch=3,
        base_sequence=1000,
        is_transactional=True,
        partition_leader_epoch=0,
    )
    for buf in (theirs_buf, ours_buf):
        ours = RecordBatch(buf)
        theirs, their_records = kafka_python_read(buf)
        assert ours.compression == compression
        assert list(ours) == their_records == as_records(records)
        assert_same_header(ours, theirs)
    if compression == Compression.NONE:
        assert ours_buf == theirs_buf  # byte for byte


def test_uncompressed_bytes_are_identical() -> None:
    records = [
        SimpleRecord(None, b"v", [("a", None), ("é", b"")], 1_700_000_000_000),
        SimpleRecord(b"k" * 200, None, [], 1_700_000_000_000 - 5),
        SimpleRecord(b"", b"x" * 70_000, [("h" * 100, b"y" * 1000)], 1_700_000_100_000),
    ]
    ours = build_batch(
        records,
        producer_id=1,
        producer_epoch=0,
        base_sequence=5,
        partition_leader_epoch=0,
    )
    assert ours == kafka_python_build(records, Compression.NONE, (1, 0, 5, False))


def test_control_batch_reads_as_a_commit_marker() -> None:
    # A control record's key is version (int16) and type (int16, 1 = commit).
    buf = build_batch(
        [SimpleRecord(b"\x00\x00\x00\x01", b"\x00\x00\x00\x00\x00\x07", [], 50)],
        producer_id=42,
        producer_epoch=1,
        is_transactional=True,
        is_control=True,
    )
    theirs = DefaultRecordBatch(buf)
    assert theirs.validate_crc() and theirs.is_control_batch
    (marker,) = list(theirs)
    assert marker.commit and marker.version == 0
