"""Bad input: every malformed batch gets a typed Highwater error, never an IndexError."""

from __future__ import annotations

import contextlib
import struct

import pytest
from highwater.errors import (
    CorruptRecordError,
    HighwaterError,
    RecordTooLargeError,
    UnsupportedForMessageFormatError,
)
from highwater.records import (
    BATCH_HEADER_SIZE,
    Compression,
    RecordBatch,
    SimpleRecord,
    build_batch,
    check_batch,
)
from highwater.records.compression import compress
from highwater.records.record import encode_record
from highwater.records.varint import encode_varint
from hypothesis import given, settings
from hypothesis import strategies as st
from records_helpers import patch, replace_records, resign, simple_records

RECORDS = [
    SimpleRecord(b"key-0", b"value-0", [("h", b"1")], 1000),
    SimpleRecord(None, b"value-1", [], 1001),
    SimpleRecord(b"key-2", None, [("a", None), ("b", b"")], 999),
]
SMALL = build_batch(RECORDS, base_offset=100, producer_id=1, producer_epoch=0, base_sequence=0)

# Header field offsets.
LENGTH, EPOCH, MAGIC, ATTRIBUTES, LAST_DELTA, COUNT = 8, 12, 16, 21, 23, 57


def consume(batch: RecordBatch) -> None:
    list(batch.records())


def consume_keys(batch: RecordBatch) -> None:
    list(batch.iter_keys())


READERS = [consume, consume_keys]


def test_small_batch_is_valid() -> None:
    assert len(list(RecordBatch(SMALL))) == 3


@pytest.mark.parametrize("position", range(ATTRIBUTES - 4, len(SMALL)))
def test_every_flipped_byte_under_the_crc_is_caught(position: int) -> None:
    corrupt = bytearray(SMALL)
    corrupt[position] ^= 0x40
    with pytest.raises(CorruptRecordError, match="CRC mismatch"):
        RecordBatch(corrupt)
    # The same bytes read without CRC check still fail or decode, but never crash.
    try:
        batch = RecordBatch(corrupt, verify_crc=False)
        consume(batch)
        consume_keys(batch)
    except HighwaterError:
        pass


@pytest.mark.parametrize("compression", [c for c in Compression if c != Compression.NONE])
def test_flipped_byte_in_a_compressed_batch(compression: Compression) -> None:
    buf = bytearray(build_batch(RECORDS * 20, compression=compression))
    buf[len(buf) // 2] ^= 0x01
    with pytest.raises(CorruptRecordError, match="CRC mismatch"):
        RecordBatch(buf)


def test_fields_outside_the_crc_are_not_covered() -> None:
    # Base offset and partition leader epoch are stamped by the broker without re-signing.
    restamped = patch(SMALL, "q", 0, 5000, sign=False)
    struct.pack_into(">i", restamped, EPOCH, 7)
    batch = RecordBatch(restamped)
    assert (batch.base_offset, batch.partition_leader_epoch) == (5000, 7)
    assert [r.offset for r in batch] == [5000, 5001, 5002]


@pytest.mark.parametrize("magic", [0, 1, 3, -1])
def test_wrong_magic(magic: int) -> None:
    with pytest.raises(UnsupportedForMessageFormatError, match=f"magic {magic}"):
        RecordBatch(patch(SMALL, "b", MAGIC, magic, sign=False))


@pytest.mark.parametrize("codec", [5, 6, 7])
def test_unknown_compression_codec(codec: int) -> None:
    with pytest.raises(CorruptRecordError, match="unknown compression codec"):
        RecordBatch(patch(SMALL, "h", ATTRIBUTES, codec))


@pytest.mark.parametrize("cut", range(len(SMALL)))
def test_truncated_at_every_cut_point(cut: int) -> None:
    for verify_crc in (True, False):
        with pytest.raises(CorruptRecordError, match="truncated"):
            RecordBatch(SMALL[:cut], verify_crc=verify_crc)


@pytest.mark.parametrize("compression", list(Compression))
def test_records_truncated_at_every_cut_point_with_a_consistent_header(
    compression: Compression,
) -> None:
    # A batch whose length and CRC agree with records cut short: only the record
    # framing (or the codec) can tell.
    buf = build_batch(RECORDS, compression=compression)
    payload = buf[BATCH_HEADER_SIZE:]
    for cut in range(len(payload)):
        batch = RecordBatch(replace_records(buf, payload[:cut]))
        for read in READERS:
            with pytest.raises(CorruptRecordError):
                read(batch)


@pytest.mark.parametrize(
    "length", [-1, 0, BATCH_HEADER_SIZE - 13, 1 << 30, (1 << 31) - 1, -(1 << 31)]
)
def test_bad_batch_lengths(length: int) -> None:
    with pytest.raises(CorruptRecordError):
        RecordBatch(patch(SMALL, "i", LENGTH, length, sign=False))


@pytest.mark.parametrize("compression", list(Compression))
@pytest.mark.parametrize("count", [0, 1, 2, 4, 5, 1000, (1 << 31) - 1])
def test_records_count_mismatch(compression: Compression, count: int) -> None:
    buf = patch(build_batch(RECORDS, compression=compression), "i", COUNT, count)
    batch = RecordBatch(buf)
    for read in READERS:
        if count == 0 and compression != Compression.NONE:
            read(batch)  # an empty compressed batch is not decompressed (as in Kafka)
            continue
        with pytest.raises(CorruptRecordError, match=r"records_count|follow the last"):
            read(batch)


def test_negative_records_count_and_last_offset_delta() -> None:
    with pytest.raises(CorruptRecordError, match="negative"):
        RecordBatch(patch(SMALL, "i", COUNT, -1))
    with pytest.raises(CorruptRecordError, match="negative"):
        RecordBatch(patch(SMALL, "i", LAST_DELTA, -1))


@pytest.mark.parametrize("compression", list(Compression))
def test_offset_delta_beyond_last_offset_delta(compression: Compression) -> None:
    batch = RecordBatch(patch(build_batch(RECORDS, compression=compression), "i", LAST_DELTA, 1))
    for read in READERS:
        with pytest.raises(CorruptRecordError, match="offset delta 2 after 1"):
            read(batch)


@pytest.mark.parametrize(
    "deltas",
    [[0, 0], [1, 0], [-1, 0], [0, -5]],
)
def test_offset_deltas_that_do_not_increase(deltas: list[int]) -> None:
    payload = b"".join(encode_record(d, 0, b"k", b"v") for d in deltas)
    buf = replace_records(build_batch([SimpleRecord(b"k", b"v", (), 0)] * 2), payload)
    for read in READERS:
        with pytest.raises(CorruptRecordError, match="offset delta"):
            read(RecordBatch(buf))


@pytest.mark.parametrize("compression", [c for c in Compression if c != Compression.NONE])
def test_corrupt_compressed_payload(compression: Compression) -> None:
    buf = build_batch(RECORDS, compression=compression)
    garbage = b"\x00\x01\x02\x03 definitely not a valid payload \xff\xfe" * 2
    if compression == Compression.SNAPPY:
        garbage = b"\x82SNAPPY\x00" + garbage
    batch = RecordBatch(replace_records(buf, garbage))
    for read in READERS:
        with pytest.raises(CorruptRecordError, match=compression.name.lower()):
            read(batch)


@pytest.mark.parametrize("compression", [c for c in Compression if c != Compression.NONE])
def test_compressed_payload_that_holds_bad_records(compression: Compression) -> None:
    buf = build_batch(RECORDS, compression=compression)
    inner = encode_varint(1 << 20) + b"\x00" * 20  # one record claiming a megabyte
    batch = RecordBatch(replace_records(buf, compress(compression, inner)))
    for read in READERS:
        with pytest.raises(CorruptRecordError, match="overruns the batch"):
            read(batch)


@pytest.mark.parametrize("compression", [c for c in Compression if c != Compression.NONE])
def test_decompression_bomb_in_a_batch(compression: Compression) -> None:
    bomb = compress(compression, bytes(5_000_000))
    batch = RecordBatch(replace_records(build_batch(RECORDS, compression=compression), bomb))
    with pytest.raises(RecordTooLargeError):
        list(batch.records(max_decompressed_size=1_000_000))
    with pytest.raises(RecordTooLargeError):
        list(batch.iter_keys(max_decompressed_size=1_000_000))


def record(*parts: bytes) -> bytes:
    inner = b"".join(parts)
    return encode_varint(len(inner)) + inner


V = encode_varint
HEAD = (b"\x00", V(0), V(0))


@pytest.mark.parametrize(
    "payload",
    [
        record(*HEAD, V(-2), V(-1), V(0)),  # negative key length
        record(*HEAD, V(-1), V(-9), V(0)),  # negative value length
        record(*HEAD, V((1 << 31) - 1), V(-1), V(0)),  # huge key length
        record(*HEAD, V(-1), V((1 << 31) - 1), V(0)),  # huge value length
        record(*HEAD, V(1) + b"k", V(-1), V(-4)),  # negative header count
        record(*HEAD, V(1) + b"k", V(-1), V(1 << 30)),  # huge header count
        V((1 << 31) - 1) + b"\x00" * 10,  # huge record length
        V(-3) + b"\x00" * 10,  # negative record length
        b"\xff\xff\xff\xff\xff\xff",  # overlong varint
        record(*HEAD, b"\x80\x80\x80\x80\x80\x80", V(-1), V(0)),  # overlong key length
        record(b"\x00", b"\x80" * 11, V(0), V(-1), V(-1), V(0)),  # overlong timestamp delta
    ],
)
def test_lying_lengths(payload: bytes) -> None:
    batch = RecordBatch(replace_records(build_batch([SimpleRecord(b"k", b"v", (), 0)]), payload))
    with pytest.raises(CorruptRecordError):
        consume(batch)
    try:
        consume_keys(batch)  # headers are not parsed here, the rest of the framing is
    except CorruptRecordError:
        pass
    else:
        assert payload == record(*HEAD, V(1) + b"k", V(-1), V(-4)) or payload == record(
            *HEAD, V(1) + b"k", V(-1), V(1 << 30)
        )


def test_trailing_bytes_after_the_last_record() -> None:
    buf = replace_records(SMALL, SMALL[BATCH_HEADER_SIZE:] + b"\x00")
    for read in READERS:
        with pytest.raises(CorruptRecordError, match="1 bytes follow the last of its 3"):
            read(RecordBatch(buf))
    empty = replace_records(build_batch([]), b"\x00\x00")
    for read in READERS:
        with pytest.raises(CorruptRecordError, match="2 bytes follow"):
            read(RecordBatch(empty))


@given(records=simple_records(max_size=5), data=st.data())
@settings(max_examples=200)
def test_mutated_records_raise_typed_errors(
    records: list[SimpleRecord], data: st.DataObject
) -> None:
    buf = bytearray(build_batch(records))
    for _ in range(data.draw(st.integers(1, 3))):
        position = data.draw(st.integers(BATCH_HEADER_SIZE, len(buf) - 1))
        buf[position] = data.draw(st.integers(0, 255))
    if data.draw(st.booleans()):
        cut = data.draw(st.integers(BATCH_HEADER_SIZE, len(buf)))
        buf = replace_records(bytes(buf), bytes(buf[BATCH_HEADER_SIZE:cut]))
    batch = RecordBatch(resign(buf))
    try:
        decoded = list(batch.records())
    except HighwaterError:
        decoded = None
    try:
        keys = list(batch.iter_keys())
    except HighwaterError:
        assert decoded is None  # iter_keys checks a subset of what records() does
    else:
        if decoded is not None:
            assert keys == [(r.offset, r.key, r.value is None) for r in decoded]


@given(st.binary(min_size=BATCH_HEADER_SIZE, max_size=200))
def test_random_bytes_raise_typed_errors(data: bytes) -> None:
    for verify_crc in (True, False):
        try:
            batch = RecordBatch(data, verify_crc=verify_crc)
            consume(batch)
            consume_keys(batch)
        except HighwaterError:
            pass


@given(st.binary(max_size=300), st.sampled_from(list(Compression)))
@settings(max_examples=200)
def test_random_payloads_under_a_valid_header(payload: bytes, compression: Compression) -> None:
    batch = RecordBatch(replace_records(build_batch(RECORDS, compression=compression), payload))
    for read in READERS:
        with contextlib.suppress(HighwaterError):
            read(batch)


def test_check_batch_errors_are_highwater_errors() -> None:
    for bad in (b"", SMALL[:60], patch(SMALL, "b", MAGIC, 1, sign=False)):
        with pytest.raises(HighwaterError):
            check_batch(bad)
