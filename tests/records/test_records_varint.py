"""Zigzag varint/varlong codec: round trips, known encodings, overflow and truncation."""

from __future__ import annotations

import warnings

import pytest
from highwater.errors import CorruptRecordError, HighwaterError, InvalidRecordError
from highwater.records.varint import (
    INT32_MAX,
    INT32_MIN,
    INT64_MAX,
    INT64_MIN,
    decode_varint,
    decode_varlong,
    encode_varint,
    encode_varlong,
    size_of_varint,
    size_of_varlong,
    skip_varint,
    write_varint,
    write_varlong,
)
from hypothesis import given
from hypothesis import strategies as st

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)  # kafka-python's import-time noise
    from kafka.record import util as kafka_util

int32s = st.integers(min_value=INT32_MIN, max_value=INT32_MAX)
int64s = st.integers(min_value=INT64_MIN, max_value=INT64_MAX)


@pytest.mark.parametrize(
    ("value", "encoded"),
    [
        (0, b"\x00"),
        (-1, b"\x01"),
        (1, b"\x02"),
        (-2, b"\x03"),
        (63, b"\x7e"),
        (-64, b"\x7f"),
        (64, b"\x80\x01"),
        (-65, b"\x81\x01"),
        (300, b"\xd8\x04"),
        (INT32_MAX, b"\xfe\xff\xff\xff\x0f"),
        (INT32_MIN, b"\xff\xff\xff\xff\x0f"),
    ],
)
def test_known_varint_encodings(value: int, encoded: bytes) -> None:
    assert encode_varint(value) == encoded
    assert encode_varlong(value) == encoded
    assert decode_varint(encoded, 0) == (value, len(encoded))
    assert decode_varlong(encoded, 0) == (value, len(encoded))
    assert size_of_varint(value) == len(encoded)


@pytest.mark.parametrize(
    ("value", "encoded"),
    [
        (INT64_MAX, b"\xfe" + b"\xff" * 8 + b"\x01"),
        (INT64_MIN, b"\xff" * 9 + b"\x01"),
        (1 << 31, b"\x80\x80\x80\x80\x10"),
    ],
)
def test_known_varlong_encodings(value: int, encoded: bytes) -> None:
    assert encode_varlong(value) == encoded
    assert decode_varlong(encoded, 0) == (value, len(encoded))
    assert size_of_varlong(value) == len(encoded)


@given(int32s, st.binary(max_size=8), st.binary(max_size=8))
def test_varint_round_trip_at_any_position(value: int, before: bytes, after: bytes) -> None:
    out = bytearray(before)
    write_varint(out, value)
    end = len(out)
    out += after
    assert end - len(before) == size_of_varint(value) <= 5
    for buf in (bytes(out), out, memoryview(out)):
        assert decode_varint(buf, len(before)) == (value, end)
        assert skip_varint(buf, len(before)) == end
    assert encode_varint(value) == bytes(out[len(before) : end])


@given(int64s, st.binary(max_size=8), st.binary(max_size=8))
def test_varlong_round_trip_at_any_position(value: int, before: bytes, after: bytes) -> None:
    out = bytearray(before)
    write_varlong(out, value)
    end = len(out)
    out += after
    assert end - len(before) == size_of_varlong(value) <= 10
    for buf in (bytes(out), out, memoryview(out)):
        assert decode_varlong(buf, len(before)) == (value, end)
        assert skip_varint(buf, len(before)) == end
    assert encode_varlong(value) == bytes(out[len(before) : end])


@given(int64s)
def test_varlong_matches_kafka_python(value: int) -> None:
    theirs = bytearray()
    kafka_util.encode_varint(value, theirs.append)
    assert encode_varlong(value) == bytes(theirs)
    assert kafka_util.decode_varint(encode_varlong(value), 0) == (value, len(theirs))


@given(int32s)
def test_varint_decodes_as_varlong(value: int) -> None:
    assert decode_varlong(encode_varint(value), 0) == (value, size_of_varint(value))


@pytest.mark.parametrize("value", [INT32_MAX + 1, INT32_MIN - 1, 1 << 40])
def test_varint_encoding_out_of_range(value: int) -> None:
    with pytest.raises(InvalidRecordError):
        encode_varint(value)
    with pytest.raises(InvalidRecordError):
        write_varint(bytearray(), value)


@pytest.mark.parametrize("value", [INT64_MAX + 1, INT64_MIN - 1, 1 << 80])
def test_varlong_encoding_out_of_range(value: int) -> None:
    with pytest.raises(InvalidRecordError):
        encode_varlong(value)
    with pytest.raises(InvalidRecordError):
        write_varlong(bytearray(), value)


@pytest.mark.parametrize(
    "encoded",
    [
        b"\x80\x80\x80\x80\x80\x00",  # six bytes
        b"\xff\xff\xff\xff\xff\xff\xff",
        b"\x80\x80\x80\x80\x10",  # 2**32: five bytes, but 33 bits
        b"\xff\xff\xff\xff\x7f",
    ],
)
def test_varint_overflow(encoded: bytes) -> None:
    with pytest.raises(CorruptRecordError, match="varint at byte 0"):
        decode_varint(encoded, 0)


@pytest.mark.parametrize(
    "encoded",
    [
        b"\x80" * 10 + b"\x00",  # eleven bytes
        b"\xff" * 9 + b"\x02",  # ten bytes, but 65 bits
        b"\xff" * 9 + b"\x7f",
    ],
)
def test_varlong_overflow(encoded: bytes) -> None:
    with pytest.raises(CorruptRecordError, match="varlong at byte 0"):
        decode_varlong(encoded, 0)


def test_skip_rejects_overlong() -> None:
    with pytest.raises(CorruptRecordError):
        skip_varint(b"\x80" * 11, 0)
    with pytest.raises(CorruptRecordError):
        skip_varint(b"\x80" * 5 + b"\x00", 0, max_size=5)
    assert skip_varint(b"\x80" * 4 + b"\x00", 0, max_size=5) == 5


@given(int64s.filter(lambda v: not -64 <= v < 64), st.data())
def test_every_truncation_is_corrupt(value: int, data: st.DataObject) -> None:
    encoded = encode_varlong(value)
    cut = data.draw(st.integers(min_value=0, max_value=len(encoded) - 1))
    prefix = b"\x00\x00" + encoded[:cut]
    with pytest.raises(CorruptRecordError, match="truncated"):
        decode_varlong(prefix, 2)
    with pytest.raises(CorruptRecordError, match="truncated"):
        skip_varint(prefix, 2)
    if INT32_MIN <= value <= INT32_MAX:
        with pytest.raises(CorruptRecordError, match="truncated"):
            decode_varint(prefix, 2)


def test_empty_buffer_and_position_past_the_end() -> None:
    for decode in (decode_varint, decode_varlong, skip_varint):
        with pytest.raises(CorruptRecordError):
            decode(b"", 0)
        with pytest.raises(CorruptRecordError):
            decode(b"\x00\x00", 2)


@given(st.binary(max_size=12), st.integers(min_value=0, max_value=12))
def test_arbitrary_bytes_decode_or_raise_typed_errors(buf: bytes, pos: int) -> None:
    for decode in (decode_varint, decode_varlong):
        try:
            value, end = decode(buf, pos)
        except HighwaterError:
            continue
        assert pos < end <= len(buf)
        assert INT64_MIN <= value <= INT64_MAX
