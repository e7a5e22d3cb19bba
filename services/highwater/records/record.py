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

import itertools
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeAlias, TypeVar

from highwater.errors import CorruptRecordError, InvalidRecordError

from .implementation import codec
from .varint import (
    INT32_MAX,
    INT32_MIN,
    INT64_MAX,
    INT64_MIN,
    Buffer,
    decode_varint,
    decode_varlong,
    encode_varint,
    encode_varlong,
    size_of_varint,
    size_of_varlong,
    write_varint,
    write_varlong,
)

Header = tuple[str, bytes | None]
Headers = tuple[Header, ...]
Bytes: TypeAlias = bytes | bytearray | memoryview
RecordFields: TypeAlias = tuple[bytes | None, bytes | None, Sequence[Header], int]
"""``(key, value, headers, timestamp)``: a record to write, as :func:`encode_records` takes it."""

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
    """What :func:`~highwater.records.batch.build_batch` needs of a record.

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


# The zigzag encodings of -64..8191, which take one or two bytes: the record lengths,
# offset deltas, timestamp deltas and key and value lengths of typical records. Looking
# one up is several times cheaper than encoding it, which matters at a producer's rate of
# records (about 300 KB of small bytes objects, built once).
_TABLE_MIN = -64
_TABLE_END = 8192
_VARINTS: tuple[bytes, ...] = tuple(encode_varlong(v) for v in range(_TABLE_MIN, _TABLE_END))
# The same, followed by the attributes byte (0) that comes after the length of every record.
_LENGTHS_AND_ATTRIBUTES: tuple[bytes, ...] = tuple(b + b"\x00" for b in _VARINTS)
_NULL = b"\x01"  # varint -1: a null key or value
_NO_HEADERS = b"\x00"  # varint 0: the header count


def _varint_bytes(value: int) -> bytes:
    """The zigzag int32 encoding of ``value`` (looked up when it is small)."""
    if _TABLE_MIN <= value < _TABLE_END:
        return _VARINTS[value - _TABLE_MIN]
    return encode_varint(value)


def record_size(
    offset_delta: int,
    timestamp_delta: int,
    key: Bytes | None,
    value: Bytes | None,
    headers: Sequence[Header] = (),
) -> int:
    """How many bytes :func:`write_record` appends for this record, length prefix included.

    Raises :class:`~highwater.errors.InvalidRecordError` where :func:`write_record` would,
    so that a batch can check a record and defer its encoding (:func:`encode_records`).
    """
    # Called once per record a producer appends: the common record (no headers, deltas
    # and lengths in varints of one or two bytes) is sized with inline comparisons,
    # everything else by the general code below.
    if not headers and -8192 <= timestamp_delta < 8192 and 0 <= offset_delta < 8192:
        # attributes, deltas, header count
        size = (4 if -64 <= timestamp_delta < 64 else 5) + (0 if offset_delta < 64 else 1)
        if key is None:
            size += 1
        else:
            n = len(key)
            size += (1 if n < 64 else 2 if n < 8192 else _length_size(n)) + n
        if value is None:
            size += 1
        else:
            n = len(value)
            size += (1 if n < 64 else 2 if n < 8192 else _length_size(n)) + n
        return size + (1 if size < 64 else 2 if size < 8192 else _length_size(size))
    if not INT64_MIN <= timestamp_delta <= INT64_MAX:
        raise InvalidRecordError(f"{timestamp_delta} does not fit in a varlong (int64)")
    if not INT32_MIN <= offset_delta <= INT32_MAX:
        raise InvalidRecordError(f"offset delta {offset_delta} does not fit in a varint (int32)")
    size = 1 + size_of_varlong(timestamp_delta) + size_of_varint(offset_delta)
    size += 1 if key is None else _length_size(len(key)) + len(key)
    size += 1 if value is None else _length_size(len(value)) + len(value)
    size += _length_size(len(headers))
    for header_key, header_value in headers:
        n = len(header_key.encode())
        size += _length_size(n) + n
        if header_value is None:
            size += 1
        else:
            size += _length_size(len(header_value)) + len(header_value)
    return size + _length_size(size)


def _length_size(n: int) -> int:
    """The size of the varint of the length ``n``; InvalidRecordError beyond int32."""
    if n > INT32_MAX:
        raise InvalidRecordError(f"{n} does not fit in a varint (int32)")
    return size_of_varint(n)


def encode_records(
    records: Sequence[RecordFields], base_timestamp: int, sizes: Sequence[int] | None = None
) -> bytes:
    """The bodies of ``records``, with offset deltas 0, 1, 2... and timestamps as deltas
    from ``base_timestamp``: what :func:`write_record` writes for each, concatenated.

    A batch's records are encoded in this one loop when the batch is sealed (instead of
    one :func:`write_record` call per append): each record is a handful of table look-ups
    and one ``extend``, and the batch one ``bytes.join``. ``sizes`` are the records'
    :func:`record_size`, which a batch builder has from the appends (they are computed
    here otherwise). Raises :class:`~highwater.errors.InvalidRecordError` like
    :func:`write_record`.
    """
    if sizes is None:
        sizes = [
            record_size(offset_delta, timestamp - base_timestamp, key, value, headers)
            for offset_delta, (key, value, headers, timestamp) in enumerate(records)
        ]
    parts: list[Bytes] = []
    extend = parts.extend
    varints = _VARINTS
    heads = _HEADS_BY_SIZE
    low, end = _TABLE_MIN, _TABLE_END
    for offset_delta, ((key, value, headers, timestamp), size) in enumerate(
        zip(records, sizes, strict=True)
    ):
        delta = timestamp - base_timestamp
        ts = varints[delta - low] if low <= delta < end else encode_varlong(delta)
        od = varints[offset_delta - low] if offset_delta < end else encode_varint(offset_delta)
        if key is None:
            kl, key = _NULL, b""
        else:
            n = len(key)
            kl = varints[n - low] if n < end else encode_varint(n)
        if value is None:
            vl, value = _NULL, b""
        else:
            n = len(value)
            vl = varints[n - low] if n < end else encode_varint(n)
        hs = _encode_headers(headers) if headers else _NO_HEADERS
        if size < len(heads):
            head = heads[size]
        else:  # the body is what the size leaves after the length's own varint
            n = size - 1
            while len(encode_varint(n)) + n > size:
                n -= 1
            head = encode_varint(n) + b"\x00"
        extend((head, ts, od, kl, key, vl, value, hs))
    return b"".join(parts)


def _head_for_size(size: int) -> bytes:
    """The length varint and attributes byte of a record of ``size`` bytes in all."""
    n = size - 1 if size <= 64 else size - 2  # a length below 64 takes one byte, else two
    return _LENGTHS_AND_ATTRIBUTES[n - _TABLE_MIN]


# By a record's whole size (length prefix included), its length prefix and attributes
# byte; up to the sizes whose length takes two bytes. (A record of 65 bytes cannot be.)
_HEADS_BY_SIZE: tuple[bytes, ...] = tuple(_head_for_size(size) for size in range(_TABLE_END))


def _encode_headers(headers: Sequence[Header]) -> bytes:
    """The header count and headers of a record."""
    out = bytearray(_varint_bytes(len(headers)))
    for header_key, header_value in headers:
        encoded = header_key.encode()
        out += _varint_bytes(len(encoded))
        out += encoded
        if header_value is None:
            out += _NULL
        else:
            out += _varint_bytes(len(header_value))
            out += header_value
    return bytes(out)


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


_ZIGZAGS = [(v >> 1) ^ -(v & 1) for v in range(1 << 14)]  # of the 14-bit unsigned values
_ZIGZAG_VARINTS: tuple[int, ...] = tuple(
    itertools.chain.from_iterable(
        _ZIGZAGS[:0x80] + _ZIGZAGS[c << 7 : (c + 1) << 7] for c in range(0x80)
    )
)
"""The values of the zigzag varints of one and two bytes, a look-up instead of the
arithmetic: of one byte ``b`` (< 0x80) at ``b``; of two bytes ``b`` (>= 0x80) and ``c``
(< 0x80) at ``b + (c << 8)``. Each 256 entries hold the one-byte values, then the two-byte
values whose second byte is ``c``."""
del _ZIGZAGS

_T = TypeVar("_T")

RecordFactory: TypeAlias = Callable[[bytes | None, bytes | None, Headers, int, int], _T]
"""``make(key, value, headers, timestamp, offset)``: what :func:`read_records` turns each
decoded record into (the consumer passes its message class, bound to the partition)."""


def read_records(
    buf: bytes,
    pos: int,
    end: int,
    count: int,
    base_offset: int,
    base_timestamp: int,
    log_append_time: int | None,
    last_offset_delta: int,
    out: list[_T],
    make: RecordFactory[_T],
    previous: int = -1,
) -> int:
    """Decode up to ``count`` records from ``pos`` (before ``end``) of ``buf``, appending
    ``make(key, value, headers, timestamp, offset)`` of each to ``out``; return the
    position after the last one.

    What :func:`read_record` does in a loop, without a :class:`Record` per record, for
    readers that make their own objects (the consumer makes a message of each). The
    common record (no headers; length, deltas and key and value lengths in varints of one
    or two bytes) is decoded inline, which is several times cheaper; any other record,
    and any that does not add up, goes through :func:`read_record`, which decodes it or
    raises :class:`CorruptRecordError` with the reason. Stops early at ``end`` (the
    caller checks the count); the records decoded before an error stay in ``out``. Offset
    deltas must increase and not pass ``last_offset_delta``, as in a batch; ``previous``
    is the offset delta of the record before ``pos`` (-1: none).
    """
    append = out.append
    zigzag = _ZIGZAG_VARINTS
    for _ in range(count):
        if pos >= end:
            break
        start = pos
        # Each varint: one byte (< 0x80), else two (the second < 0x80), else the slow path.
        # Lengths need no check of their own: a record is taken only if its fields end
        # exactly at its length, on its header count 0, inside the batch.
        try:
            b = buf[pos]
            if b < 0x80:
                record_end = pos + 1 + zigzag[b]
                pos += 2  # and the attributes
            else:
                c = buf[pos + 1]
                if c >= 0x80:
                    raise _Unusual
                record_end = pos + 2 + zigzag[b + (c << 8)]
                pos += 3
            if record_end > end:
                raise _Unusual
            b = buf[pos]
            if b < 0x80:
                timestamp_delta = zigzag[b]
                pos += 1
            else:
                c = buf[pos + 1]
                if c >= 0x80:
                    raise _Unusual
                timestamp_delta = zigzag[b + (c << 8)]
                pos += 2
            b = buf[pos]
            if b < 0x80:
                offset_delta = zigzag[b]
                pos += 1
            else:
                c = buf[pos + 1]
                if c >= 0x80:
                    raise _Unusual
                offset_delta = zigzag[b + (c << 8)]
                pos += 2
            b = buf[pos]
            if b == 1:  # -1: a null key
                key = None
                pos += 1
            elif b < 0x80 and not b & 1:
                key = buf[pos + 1 : pos + 1 + (b >> 1)]
                pos += 1 + (b >> 1)
            else:
                raise _Unusual
            b = buf[pos]
            if b < 0x80:
                n = zigzag[b]
                pos += 1
            else:
                c = buf[pos + 1]
                if c >= 0x80:
                    raise _Unusual
                n = zigzag[b + (c << 8)]
                pos += 2
            if n >= 0:
                value = buf[pos : pos + n]
                pos += n
            elif n == -1:
                value = None
            else:
                raise _Unusual
            if pos + 1 != record_end or buf[pos]:  # headers, or a length that lies
                raise _Unusual
            pos = record_end
        except (_Unusual, IndexError):
            record, pos = read_record(buf, start, end, base_offset, base_timestamp, log_append_time)
            offset_delta = record.offset - base_offset
            if offset_delta <= previous or offset_delta > last_offset_delta:
                raise _delta_error(base_offset, offset_delta, previous, last_offset_delta) from None
            previous = offset_delta
            append(make(record.key, record.value, record.headers, record.timestamp, record.offset))
            continue
        if offset_delta <= previous or offset_delta > last_offset_delta:
            raise _delta_error(base_offset, offset_delta, previous, last_offset_delta)
        previous = offset_delta
        append(
            make(
                key,
                value,
                (),
                base_timestamp + timestamp_delta if log_append_time is None else log_append_time,
                base_offset + offset_delta,
            )
        )
    return pos


def _delta_error(base_offset: int, delta: int, previous: int, last: int) -> CorruptRecordError:
    return CorruptRecordError(
        f"batch at offset {base_offset}: offset delta {delta} after {previous} "
        f"(last offset delta {last})"
    )


class _Unusual(Exception):
    """A record :func:`read_records` leaves to :func:`read_record`."""


def _slot_setter(cls: type, name: str) -> Callable[[object, object], None]:
    descriptor = getattr(cls, name)
    if not isinstance(descriptor, types.MemberDescriptorType):
        raise TypeError(f"{name!r} is not a writable slot of {cls!r}")
    return descriptor.__set__


class SlotFactory:
    """``make(key, value, headers, timestamp, offset)``: an instance of a ``__slots__`` class
    with those five slots and some constant ones set, its ``__init__`` not run.

    What a reader that makes objects of its own hands :func:`read_records` (the consumer
    makes its messages so). The compiled twin fills the slots from C, which is several
    times cheaper than a call of the class.
    """

    __slots__ = ("_cls", "_constants", "_fields")

    def __init__(self, cls: type, fields: tuple[str, ...], constants: dict[str, object]) -> None:
        if len(fields) != 5:
            raise ValueError("fields names the slots of the five record fields")
        self._cls = cls
        self._fields = tuple(_slot_setter(cls, name) for name in fields)
        self._constants = tuple((_slot_setter(cls, name), v) for name, v in constants.items())

    def __call__(
        self, key: bytes | None, value: bytes | None, headers: Headers, timestamp: int, offset: int
    ) -> object:
        obj: object = _new_object(self._cls)
        set_key, set_value, set_headers, set_timestamp, set_offset = self._fields
        set_key(obj, key)
        set_value(obj, value)
        set_headers(obj, headers)
        set_timestamp(obj, timestamp)
        set_offset(obj, offset)
        for setter, constant in self._constants:
            setter(obj, constant)
        return obj


# The pure-Python functions, whichever implementation is loaded: the reference that the
# compiled twins hand over to and that the tests compare them with.
NO_TIMESTAMP = -1
NO_TIMESTAMPS: tuple[int, int] = (INT64_MAX, INT64_MIN)
"""What :func:`check_records` answers for records that carry no timestamp but -1."""


def check_records(
    buf: Buffer, pos: int, end: int, count: int, last_offset_delta: int, base_timestamp: int
) -> tuple[int, int]:
    """Walk the ``count`` records of ``buf[pos:end]`` (one batch's, decompressed if it was
    compressed) as a leader takes them from a client; return the least and the largest of
    their timestamps other than NO_TIMESTAMP (-1), :data:`NO_TIMESTAMPS` if none has one.

    Kafka's ``LogValidator`` iterates every record of every batch before it appends
    (``DefaultRecordBatch``'s iterator, ``DefaultRecord.readFrom``): a batch whose records
    are not what its header says would be appended and then fail every reader at its
    offset. The rules are exactly those :meth:`~.batch.RecordBatch.records` reads by (this
    decodes each record with :func:`read_record`): each record's length inside the batch
    and its fields ending exactly there; key and value lengths -1 or >= 0, a header count
    >= 0, header keys of UTF-8; offset deltas increasing and at most
    ``last_offset_delta``; exactly ``count`` records and nothing after the last. A
    timestamp (``base_timestamp`` + delta) must fit 64 bits, as the batch's max timestamp
    field it may become. Raises :class:`CorruptRecordError`, which an append answers as
    ``INVALID_RECORD``. The compiled twin walks the common record without a Python object.
    """
    low, high = NO_TIMESTAMPS
    previous = -1
    for decoded in range(count):
        if pos >= end:
            raise CorruptRecordError(
                f"records_count is {count} but the records end after {decoded}"
            )
        record, pos = read_record(buf, pos, end, 0, base_timestamp, None)
        delta = record.offset
        if delta <= previous or delta > last_offset_delta:
            raise _delta_error(0, delta, previous, last_offset_delta)
        previous = delta
        timestamp = record.timestamp
        if timestamp != NO_TIMESTAMP:
            if not INT64_MIN <= timestamp <= INT64_MAX:
                raise CorruptRecordError(
                    f"record at offset delta {delta}: timestamp {timestamp} does not fit 64 bits"
                )
            low, high = min(low, timestamp), max(high, timestamp)
    if pos != end:
        raise CorruptRecordError(f"{end - pos} bytes follow the last of the {count} records")
    return low, high


pure_check_records = check_records
pure_record_size = record_size
pure_encode_records = encode_records
pure_read_records = read_records
PureSlotFactory = SlotFactory

if codec is not None:
    codec.bind(record_size=pure_record_size)
    record_size = codec.record_size

    def check_records(
        buf: Buffer, pos: int, end: int, count: int, last_offset_delta: int, base_timestamp: int
    ) -> tuple[int, int]:
        """:func:`pure_check_records`, compiled: what it refuses, the pure walk raises."""
        found: tuple[int, int] | None = codec.check_records(
            buf, pos, end, count, last_offset_delta, base_timestamp
        )
        if found is None:
            return pure_check_records(buf, pos, end, count, last_offset_delta, base_timestamp)
        return found

    SlotFactory = codec.SlotFactory  # type: ignore[misc]

    def encode_records(
        records: Sequence[RecordFields], base_timestamp: int, sizes: Sequence[int] | None = None
    ) -> bytes:
        """:func:`pure_encode_records`, compiled (the sizes are recomputed there)."""
        if sizes is None or len(sizes) == len(records):
            encoded: bytes | None = codec.encode_records(records, base_timestamp)
            if encoded is not None:
                return encoded
        return pure_encode_records(records, base_timestamp, sizes)

    def read_records(
        buf: bytes,
        pos: int,
        end: int,
        count: int,
        base_offset: int,
        base_timestamp: int,
        log_append_time: int | None,
        last_offset_delta: int,
        out: list[_T],
        make: RecordFactory[_T],
        previous: int = -1,
    ) -> int:
        """:func:`pure_read_records`, compiled: the records it does not take (anything
        unusual or corrupt), and those after, are left to the pure function."""
        if previous != -1:
            return pure_read_records(
                buf,
                pos,
                end,
                count,
                base_offset,
                base_timestamp,
                log_append_time,
                last_offset_delta,
                out,
                make,
                previous,
            )
        pos, done, previous = codec.read_records(
            buf,
            pos,
            end,
            count,
            base_offset,
            base_timestamp,
            log_append_time,
            last_offset_delta,
            out,
            make,
        )
        if done < count and pos < end:
            return pure_read_records(
                buf,
                pos,
                end,
                count - done,
                base_offset,
                base_timestamp,
                log_append_time,
                last_offset_delta,
                out,
                make,
                previous,
            )
        return int(pos)
