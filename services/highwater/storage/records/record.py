"""One record of a RecordBatch v2: the ``Record`` value and the codec of its varint-framed body.

A record on the wire, as Kafka's ``DefaultRecord`` defines it::

    length          varint   bytes that follow
    attributes      int8     unused, 0
    timestampDelta  varlong  from the batch's base timestamp
    offsetDelta     varint   from the batch's base offset
    keyLength       varint   -1 for a null key
    key             bytes
    valueLength     varint   -1 for a null value (a tombstone)
    value           bytes
    headersCount    varint
    headers         [keyLength varint, key utf-8, valueLength varint (-1 null), value]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from highwater.errors import CorruptRecordError

from .varint import (
    Buffer,
    decode_varint,
    decode_varlong,
    encode_varint,
    write_varint,
    write_varlong,
)

Header = tuple[str, bytes | None]
Headers = tuple[Header, ...]

# length(1) attributes(1) timestampDelta(1) offsetDelta(1) keyLength(1) valueLength(1)
# headersCount(1): the smallest record there is.
MIN_RECORD_SIZE = 7


@dataclass(frozen=True, slots=True)
class Record:
    """A record read from a batch, with its absolute offset and timestamp."""

    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: Headers = ()


# A faster path to a Record than its generated __init__, which goes through
# object.__setattr__ once per field because the class is frozen: set the slots directly.
_new_object = object.__new__
_set_offset = Record.__dict__["offset"].__set__
_set_timestamp = Record.__dict__["timestamp"].__set__
_set_key = Record.__dict__["key"].__set__
_set_value = Record.__dict__["value"].__set__
_set_headers = Record.__dict__["headers"].__set__


def _new_record(
    offset: int, timestamp: int, key: bytes | None, value: bytes | None, headers: Headers
) -> Record:
    record: Record = _new_object(Record)
    _set_offset(record, offset)
    _set_timestamp(record, timestamp)
    _set_key(record, key)
    _set_value(record, value)
    _set_headers(record, headers)
    return record


class SimpleRecordLike(Protocol):
    """What :func:`~highwater.storage.records.batch.build_batch` needs of a record.

    ``timestamp`` ``None`` means now. An ``offset_delta`` attribute, if present and not
    ``None``, places the record at that delta from the base offset (compacted batches
    have gaps); otherwise records take consecutive deltas.
    """

    @property
    def key(self) -> bytes | None: ...

    @property
    def value(self) -> bytes | None: ...

    @property
    def headers(self) -> Sequence[Header]: ...

    @property
    def timestamp(self) -> int | None: ...


@dataclass(frozen=True, slots=True)
class SimpleRecord:
    """A record to write: what a producer hands over, before it has an offset."""

    key: bytes | None = None
    value: bytes | None = None
    headers: Sequence[Header] = ()
    timestamp: int | None = None
    offset_delta: int | None = None


def write_record(
    out: bytearray,
    offset_delta: int,
    timestamp_delta: int,
    key: bytes | bytearray | memoryview | None,
    value: bytes | bytearray | memoryview | None,
    headers: Sequence[Header] = (),
) -> int:
    """Append one length-prefixed record body to ``out``; return how many bytes it took.

    Raises :class:`~highwater.errors.InvalidRecordError` if a delta does not fit its type.
    """
    start = len(out)
    out.append(0)  # attributes
    write_varlong(out, timestamp_delta)
    write_varint(out, offset_delta)
    if key is None:
        out.append(1)  # -1
    else:
        write_varint(out, len(key))
        out += key
    if value is None:
        out.append(1)
    else:
        write_varint(out, len(value))
        out += value
    if headers:
        write_varint(out, len(headers))
        for header_key, header_value in headers:
            encoded = header_key.encode()
            write_varint(out, len(encoded))
            out += encoded
            if header_value is None:
                out.append(1)
            else:
                write_varint(out, len(header_value))
                out += header_value
    else:
        out.append(0)
    prefix = encode_varint(len(out) - start)
    out[start:start] = prefix
    return len(out) - start


def encode_record(
    offset_delta: int,
    timestamp_delta: int,
    key: bytes | None,
    value: bytes | None,
    headers: Sequence[Header] = (),
) -> bytes:
    """One length-prefixed record body."""
    out = bytearray()
    write_record(out, offset_delta, timestamp_delta, key, value, headers)
    return bytes(out)


def _corrupt(pos: int, what: str) -> CorruptRecordError:
    return CorruptRecordError(f"record at byte {pos}: {what}")


def decode_record(
    buf: Buffer,
    pos: int,
    *,
    base_offset: int = 0,
    base_timestamp: int = 0,
    log_append_time: int | None = None,
    end: int | None = None,
) -> tuple[Record, int]:
    """Decode the record body at ``pos``; return it and the position after it.

    The record gets ``base_offset + offsetDelta`` as offset and ``base_timestamp +
    timestampDelta`` as timestamp, or ``log_append_time`` if that is given. ``end`` bounds
    the record (default: the end of ``buf``). Every length is checked against the
    record's own; any inconsistency raises :class:`CorruptRecordError`.
    """
    return read_record(
        buf, pos, len(buf) if end is None else end, base_offset, base_timestamp, log_append_time
    )


def read_record(
    buf: Buffer,
    pos: int,
    end: int,
    base_offset: int,
    base_timestamp: int,
    log_append_time: int | None,
) -> tuple[Record, int]:
    """:func:`decode_record` with positional arguments only, for loops over a batch."""
    start = pos
    length, pos = decode_varint(buf, pos)
    if length < MIN_RECORD_SIZE - 1:
        raise _corrupt(start, f"length {length} is smaller than any record")
    record_end = pos + length
    if record_end > end:
        raise _corrupt(start, f"length {length} overruns the batch by {record_end - end} bytes")
    pos += 1  # attributes: unused
    timestamp_delta, pos = decode_varlong(buf, pos)
    offset_delta, pos = decode_varint(buf, pos)

    key_length, pos = decode_varint(buf, pos)
    if key_length < 0:
        if key_length != -1:
            raise _corrupt(start, f"negative key length {key_length}")
        key = None
    else:
        if pos + key_length > record_end:
            raise _corrupt(start, f"key length {key_length} overruns the record")
        key = bytes(buf[pos : pos + key_length])
        pos += key_length

    value_length, pos = decode_varint(buf, pos)
    if value_length < 0:
        if value_length != -1:
            raise _corrupt(start, f"negative value length {value_length}")
        value = None
    else:
        if pos + value_length > record_end:
            raise _corrupt(start, f"value length {value_length} overruns the record")
        value = bytes(buf[pos : pos + value_length])
        pos += value_length

    count, pos = decode_varint(buf, pos)
    headers: Headers = ()
    if count:
        headers = _decode_headers(buf, pos, count, record_end, start)
    elif pos != record_end:
        raise _corrupt(
            start, f"length {length} does not match its contents ({pos - record_end:+d} bytes)"
        )
    return _new_record(
        base_offset + offset_delta,
        base_timestamp + timestamp_delta if log_append_time is None else log_append_time,
        key,
        value,
        headers,
    ), record_end


def _decode_headers(buf: Buffer, pos: int, count: int, record_end: int, start: int) -> Headers:
    # Each header takes at least two bytes (two lengths), which bounds a corrupt count.
    if count < 0 or 2 * count > record_end - pos:
        raise _corrupt(start, f"invalid header count {count}")
    headers: list[Header] = []
    for _ in range(count):
        key_length, pos = decode_varint(buf, pos)
        if key_length < 0:
            raise _corrupt(start, f"negative header key length {key_length}")
        if pos + key_length > record_end:
            raise _corrupt(start, f"header key length {key_length} overruns the record")
        try:
            header_key = str(buf[pos : pos + key_length], "utf-8")
        except UnicodeDecodeError as e:
            raise _corrupt(start, f"header key is not UTF-8: {e}") from None
        pos += key_length
        value_length, pos = decode_varint(buf, pos)
        if value_length < 0:
            if value_length != -1:
                raise _corrupt(start, f"negative header value length {value_length}")
            headers.append((header_key, None))
            continue
        if pos + value_length > record_end:
            raise _corrupt(start, f"header value length {value_length} overruns the record")
        headers.append((header_key, bytes(buf[pos : pos + value_length])))
        pos += value_length
    if pos != record_end:
        raise _corrupt(start, f"length does not match its contents ({pos - record_end:+d} bytes)")
    return tuple(headers)
