"""One record body: round trips, Kafka's byte layout, and every way its framing can lie."""

from __future__ import annotations

import dataclasses

import pytest
from highwater.errors import CorruptRecordError, HighwaterError
from highwater.records.record import (
    Record,
    decode_record,
    encode_record,
    write_record,
)
from highwater.records.varint import encode_varint, encode_varlong
from hypothesis import given
from hypothesis import strategies as st
from records_helpers import header_lists, keys, values


def body(*parts: bytes) -> bytes:
    """A record: the length varint, then the parts."""
    inner = b"".join(parts)
    return encode_varint(len(inner)) + inner


V = encode_varint


def test_layout_of_a_record() -> None:
    encoded = encode_record(3, 10, b"key", b"value", [("h", b"v"), ("n", None)])
    assert encoded == body(
        b"\x00",  # attributes
        encode_varlong(10),
        V(3),
        V(3) + b"key",
        V(5) + b"value",
        V(2),
        V(1) + b"h" + V(1) + b"v",
        V(1) + b"n" + V(-1),
    )
    assert encode_record(0, 0, None, None) == body(b"\x00", V(0), V(0), V(-1), V(-1), V(0))


def test_record_is_frozen_with_slots() -> None:
    record = Record(1, 2, b"k", None, ())
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.offset = 5  # type: ignore[misc]
    assert not hasattr(record, "__dict__")
    assert Record(1, 2, b"k", None) == record


@given(
    key=keys,
    value=values,
    headers=header_lists,
    offset_delta=st.integers(0, (1 << 31) - 1),
    timestamp_delta=st.integers(-(1 << 62), 1 << 62),
    base_offset=st.integers(0, 1 << 62),
    base_timestamp=st.integers(0, 1 << 40),
)
def test_round_trip(
    key: bytes | None,
    value: bytes | None,
    headers: tuple[tuple[str, bytes | None], ...],
    offset_delta: int,
    timestamp_delta: int,
    base_offset: int,
    base_timestamp: int,
) -> None:
    out = bytearray(b"prefix")
    size = write_record(out, offset_delta, timestamp_delta, key, value, headers)
    assert size == len(out) - 6
    out += b"next record"
    record, end = decode_record(
        out, 6, base_offset=base_offset, base_timestamp=base_timestamp, end=6 + size
    )
    assert end == 6 + size
    assert record == Record(
        base_offset + offset_delta, base_timestamp + timestamp_delta, key, value, headers
    )
    assert type(record.key) in (bytes, type(None))
    appended, _ = decode_record(out, 6, base_timestamp=5, log_append_time=99)
    assert appended.timestamp == 99


def test_memoryview_and_bytearray_inputs_give_bytes() -> None:
    encoded = encode_record(0, 0, b"k", b"v", [("h", b"x")])
    for buf in (encoded, bytearray(encoded), memoryview(encoded)):
        record, _ = decode_record(buf, 0)
        assert record == Record(0, 0, b"k", b"v", (("h", b"x"),))
        assert type(record.key) is bytes and type(record.value) is bytes
        assert type(record.headers[0][1]) is bytes


GOOD_TAIL = (b"\x00", V(0), V(0))  # attributes, timestamp delta, offset delta


@pytest.mark.parametrize(
    ("record", "message"),
    [
        (body(*GOOD_TAIL, V(-2), V(-1), V(0)), "negative key length -2"),
        (body(*GOOD_TAIL, V(-1), V(-7), V(0)), "negative value length -7"),
        (body(*GOOD_TAIL, V(1 << 30) + b"k", V(-1), V(0)), "key length 1073741824 overruns"),
        (body(*GOOD_TAIL, V(-1), V(100) + b"v", V(0)), "value length 100 overruns"),
        (body(*GOOD_TAIL, V(-1), V(-1), V(-1)), "invalid header count -1"),
        (body(*GOOD_TAIL, V(-1), V(-1), V((1 << 31) - 1)), "invalid header count"),
        (body(*GOOD_TAIL, V(-1), V(-1), V(1), V(-1), V(-1)), "negative header key length"),
        (body(*GOOD_TAIL, V(-1), V(-1), V(1), V(50) + b"h", V(-1)), "header key length 50"),
        (body(*GOOD_TAIL, V(-1), V(-1), V(1), V(1) + b"h", V(-3)), "negative header value"),
        (body(*GOOD_TAIL, V(-1), V(-1), V(1), V(1) + b"h", V(9) + b"v"), "header value length"),
        (body(*GOOD_TAIL, V(-1), V(-1), V(1), V(2) + b"\xff\xfe", V(-1)), "not UTF-8"),
        (body(*GOOD_TAIL, V(-1), V(-1), V(0), b"extra"), "does not match its contents"),
        (
            body(*GOOD_TAIL, V(-1), V(-1), V(1), V(1) + b"h", V(-1), b"extra"),
            "does not match its contents",
        ),
        (V(3) + b"\x00\x00\x00", "smaller than any record"),
        (V(-5) + b"\x00" * 10, "smaller than any record"),
        (V(1 << 30) + b"\x00" * 10, "overruns the batch"),
    ],
)
def test_corrupt_records(record: bytes, message: str) -> None:
    with pytest.raises(CorruptRecordError, match=message):
        decode_record(record, 0)


def test_length_is_checked_against_the_given_end() -> None:
    encoded = encode_record(0, 0, b"key", b"value")
    with pytest.raises(CorruptRecordError, match="overruns the batch"):
        decode_record(encoded + b"more", 0, end=len(encoded) - 1)


def test_varints_running_past_the_record_are_caught() -> None:
    # The length says 6 bytes but the key length varint spills into the next record.
    record = V(6) + b"\x00" + V(0) + V(0) + b"\x80\x80" + b"\x01" + V(-1) + V(0)
    with pytest.raises(CorruptRecordError):
        decode_record(record, 0)


@given(st.binary(max_size=40))
def test_arbitrary_bytes_decode_or_raise_typed_errors(data: bytes) -> None:
    try:
        _, end = decode_record(data, 0)
    except HighwaterError:
        return
    assert 0 < end <= len(data)


@given(st.data())
def test_every_truncation_is_corrupt(data: st.DataObject) -> None:
    encoded = encode_record(
        data.draw(st.integers(0, 1000)),
        data.draw(st.integers(-(10**6), 10**6)),
        data.draw(keys),
        data.draw(values),
        data.draw(header_lists),
    )
    cut = data.draw(st.integers(0, len(encoded) - 1))
    with pytest.raises(CorruptRecordError):
        decode_record(encoded[:cut], 0)
