"""Records as columns in Arrow's layout: batches decoded into column buffers, and records
encoded from binary columns, with no Python object per record.

Decoding: a :data:`RecordColumns` collects the records of batches
(:meth:`~.batch.RecordBatch.read_columns`) as Arrow's buffers: ``key`` and ``value`` binary
columns (a validity bitmap, int32 offsets, the bytes), ``offset`` and ``timestamp`` (ms)
int64 columns, ``timestamp_type`` int32 (0 create time, 1 log-append time, Kafka's
``TimestampType`` ids) and, when asked, the headers as a list of ``(key string, value
binary)`` structs. :func:`finish_columns` hands them out as :class:`ColumnBuffers`, bytes
objects that ``pyarrow.Array.from_buffers`` takes as they are (this package does not need
pyarrow). The buffers are little-endian, Arrow's order on the hosts Highwater runs on.

Encoding: :func:`encode_rows` writes the record bodies of a batch from a key and a value
column given as :data:`BinaryColumnArg` (the buffers of an Arrow binary array), and
:func:`partition_rows` splits rows by ``to_positive(murmur2(key)) % partitions`` in the
same pass over the keys, as the default partitioner places keyed records.

The compiled codec does each in C (``RecordColumns``, ``encode_rows``,
``partition_rows``); the pure-Python classes and functions here are the reference, give
the same bytes, and take over the records the compiled loop leaves (anything unusual or
corrupt), so a corrupt batch raises the very :class:`~highwater.errors.CorruptRecordError`
that :meth:`~.batch.RecordBatch.read_records` raises.
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Sequence
from typing import Any, NamedTuple, TypeAlias

from .implementation import codec
from .partitioner import pure_murmur2
from .record import Header, pure_read_records
from .varint import Buffer, size_of_varint, write_varint

__all__ = [
    "BinaryColumnArg",
    "ColumnBuffers",
    "PureRecordColumns",
    "RecordColumns",
    "encode_rows",
    "finish_columns",
    "partition_rows",
    "pure_encode_rows",
    "pure_partition_rows",
    "read_columns",
]

BinaryColumnArg: TypeAlias = tuple[Buffer | None, Buffer, Buffer, int, int]
"""An Arrow binary (or string) column: ``(validity bitmap or None, int32 offsets, data,
array offset, length)``, the buffers of ``pyarrow.Array.buffers()`` and the array's
``offset`` and ``len``."""


class ColumnBuffers(NamedTuple):
    """The columns of decoded records, as Arrow buffers (see the module docstring).

    The ``header_*`` buffers are empty unless the columns were made with headers:
    ``header_offsets`` are the list offsets (one per record, plus one) into the headers'
    ``header_key_*`` (string, never null) and ``header_value_*`` (binary) columns.
    """

    length: int
    """How many records (the length of every column but the headers' children)."""
    key_validity: bytes
    key_offsets: bytes
    key_data: bytes
    value_validity: bytes
    value_offsets: bytes
    value_data: bytes
    offsets: bytes
    timestamps: bytes
    timestamp_types: bytes
    header_offsets: bytes
    header_key_offsets: bytes
    header_key_data: bytes
    header_value_validity: bytes
    header_value_offsets: bytes
    header_value_data: bytes


_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
_INT32_MAX = (1 << 31) - 1


class _Binary:
    """One binary column being filled: validity bitmap, int32 offsets, bytes."""

    __slots__ = ("data", "length", "offsets", "validity")

    def __init__(self) -> None:
        self.validity = bytearray()
        self.offsets = array("i", [0])
        self.data = bytearray()
        self.length = 0

    def push(self, value: Buffer | None, what: str) -> None:
        if value is not None and not isinstance(value, bytes | bytearray | memoryview):
            raise TypeError(f"a record's {what} must be bytes or None, not {type(value).__name__}")
        if value is not None and len(self.data) + len(value) > _INT32_MAX:
            raise OverflowError("a column holds more than 2 GiB of bytes: take the columns sooner")
        index = self.length
        if not index & 7:
            self.validity.append(0)
        if value is not None:
            self.validity[-1] |= 1 << (index & 7)
            self.data += value
        self.offsets.append(len(self.data))
        self.length += 1


class PureRecordColumns:
    """Decoded records as column buffers: the pure-Python twin of the compiled
    ``RecordColumns``. ``columns(key, value, headers, timestamp, offset)`` appends one
    record with the current :attr:`timestamp_type`; :func:`read_columns` fills it from a
    batch's records."""

    __slots__ = (
        "_header_keys",
        "_header_offsets",
        "_header_values",
        "_keys",
        "_offsets",
        "_timestamp_type",
        "_timestamps",
        "_types",
        "_values",
        "include_headers",
    )

    def __init__(self, include_headers: bool = False) -> None:
        self.include_headers = bool(include_headers)
        self._timestamp_type = 0
        self._reset()

    def _reset(self) -> None:
        self._keys = _Binary()
        self._values = _Binary()
        self._header_keys = _Binary()
        self._header_values = _Binary()
        self._header_offsets = array("i", [0])
        self._offsets = array("q")
        self._timestamps = array("q")
        self._types = array("i")

    def __len__(self) -> int:
        return len(self._offsets)

    @property
    def nbytes(self) -> int:
        """Bytes held: keys, values and headers, and 20 per record for the fixed columns."""
        return (
            len(self._keys.data)
            + len(self._values.data)
            + len(self._header_keys.data)
            + len(self._header_values.data)
            + 20 * len(self._offsets)
        )

    @property
    def last_offset(self) -> int:
        """The last record's offset (-1: none yet)."""
        return self._offsets[-1] if self._offsets else -1

    @property
    def timestamp_type(self) -> int:
        """The timestamp type of the records appended next (0 create, 1 log-append)."""
        return self._timestamp_type

    @timestamp_type.setter
    def timestamp_type(self, value: int) -> None:
        if value not in (0, 1):
            raise ValueError("timestamp_type is 0 (create time) or 1 (log-append)")
        self._timestamp_type = value

    def __call__(
        self,
        key: Buffer | None,
        value: Buffer | None,
        headers: Sequence[Header],
        timestamp: int,
        offset: int,
    ) -> None:
        if not (_INT64_MIN <= timestamp <= _INT64_MAX and _INT64_MIN <= offset <= _INT64_MAX):
            raise OverflowError("a record's timestamp or offset is not an int64")
        for header in headers:
            if not isinstance(header, tuple) or len(header) != 2 or not isinstance(header[0], str):
                raise TypeError("a header must be a (str, bytes | None) pair")
        self._keys.push(key, "key")
        self._values.push(value, "value")
        if self.include_headers:
            for header_key, header_value in headers:
                self._header_keys.push(header_key.encode(), "header key")
                self._header_values.push(header_value, "header value")
            self._header_offsets.append(self._header_keys.length)
        self._offsets.append(offset)
        self._timestamps.append(timestamp)
        self._types.append(self._timestamp_type)

    def finish(self) -> tuple[Any, ...]:
        """The buffers (the fields of :class:`ColumnBuffers`); starts afresh."""
        keys, values = self._keys, self._values
        h = self.include_headers
        hk, hv = self._header_keys, self._header_values
        result = (
            len(self._offsets),
            bytes(keys.validity),
            keys.offsets.tobytes(),
            bytes(keys.data),
            bytes(values.validity),
            values.offsets.tobytes(),
            bytes(values.data),
            self._offsets.tobytes(),
            self._timestamps.tobytes(),
            self._types.tobytes(),
            self._header_offsets.tobytes() if h else b"",
            hk.offsets.tobytes() if h else b"",
            bytes(hk.data) if h else b"",
            bytes(hv.validity) if h else b"",
            hv.offsets.tobytes() if h else b"",
            bytes(hv.data) if h else b"",
        )
        self._reset()
        return result


RecordColumns: Any = PureRecordColumns if codec is None else codec.RecordColumns
"""The class the decoders fill: compiled when the codec is loaded, else the pure twin.
``RecordColumns(include_headers=False)``; ``len()``, ``nbytes``, ``last_offset``,
``timestamp_type``."""


def finish_columns(columns: Any) -> ColumnBuffers:
    """The records collected in ``columns`` as :class:`ColumnBuffers`; ``columns`` starts
    afresh."""
    return ColumnBuffers._make(columns.finish())


def read_columns(
    columns: Any,
    buf: bytes,
    pos: int,
    end: int,
    count: int,
    base_offset: int,
    base_timestamp: int,
    log_append_time: int | None,
    last_offset_delta: int,
) -> int:
    """:func:`~.record.read_records` into ``columns``: up to ``count`` records from
    ``pos``; returns the position after the last. The compiled columns decode what they
    take in C; the rest (anything unusual or corrupt) goes through the pure function,
    which decodes it or raises :class:`~highwater.errors.CorruptRecordError`."""
    columns.timestamp_type = 0 if log_append_time is None else 1
    previous = -1
    done = 0
    if type(columns) is not PureRecordColumns:
        pos, done, previous = columns.read_records(
            buf,
            pos,
            end,
            count,
            base_offset,
            base_timestamp,
            log_append_time,
            last_offset_delta,
        )
        if done >= count or pos >= end:
            return int(pos)
    return pure_read_records(
        buf,
        pos,
        end,
        count - done,
        base_offset,
        base_timestamp,
        log_append_time,
        last_offset_delta,
        [],
        columns,
        previous,
    )


# --- encoding ---------------------------------------------------------------------------

_I32 = struct.Struct("<i")


class _Column:
    """A :data:`BinaryColumnArg` checked and opened for reading rows."""

    __slots__ = ("data", "length", "offset", "offsets", "validity", "what")

    def __init__(self, arg: BinaryColumnArg | None, what: str) -> None:
        self.what = what
        if arg is None:
            self.validity = None
            self.offsets = memoryview(b"")
            self.data = memoryview(b"")
            self.offset = self.length = 0
            return
        if not isinstance(arg, tuple) or len(arg) != 5:
            raise TypeError(f"the {what} column is (validity, offsets, data, offset, length)")
        validity, offsets, data, self.offset, self.length = arg
        try:
            self.validity = None if validity is None else memoryview(validity).cast("B")
            self.offsets = memoryview(offsets).cast("B")
            self.data = memoryview(data).cast("B")
        except TypeError:
            raise TypeError(f"the {what} column's buffers must be bytes-like") from None
        if (
            self.offset < 0
            or self.length < 0
            or len(self.offsets) < (self.offset + self.length + 1) * 4
            or (
                self.validity is not None
                and len(self.validity) < (self.offset + self.length + 7) // 8
            )
        ):
            raise ValueError(f"the {what} column's buffers are shorter than its length")

    def value(self, row: int) -> bytes | None:
        i = self.offset + row
        validity = self.validity
        if validity is not None and not (validity[i >> 3] >> (i & 7)) & 1:
            return None
        (start,) = _I32.unpack_from(self.offsets, 4 * i)
        (stop,) = _I32.unpack_from(self.offsets, 4 * (i + 1))
        if start < 0 or stop < start or stop > len(self.data):
            raise ValueError(
                f"the {self.what} column's offsets at row {row} are not inside its data"
            )
        return bytes(self.data[start:stop])


def _rows(rows: Buffer | None, length: int) -> Sequence[int]:
    if rows is None:
        return range(length)
    try:
        view = memoryview(rows).cast("B")
    except TypeError:
        raise TypeError("rows must be an int32 buffer or None") from None
    return view[: len(view) // 4 * 4].cast("i")


def pure_encode_rows(
    keys: BinaryColumnArg | None,
    values: BinaryColumnArg | None,
    rows: Buffer | None,
    start: int,
    max_bytes: int,
) -> tuple[bytes, int]:
    """The bodies of records from ``rows[start:]`` (``rows`` an int32 buffer of row
    numbers, None for every row in order): offset deltas from 0, timestamp delta 0, no
    headers, until the next record would take them past ``max_bytes`` (one at least).
    Returns them and where the next batch starts. A column that is None is all nulls."""
    key_column = _Column(keys, "key")
    value_column = _Column(values, "value")
    if keys is not None and values is not None and key_column.length != value_column.length:
        raise ValueError("the key and value columns differ in length")
    length = value_column.length if values is not None else key_column.length
    selected = _rows(rows, length)
    if not 0 <= start <= len(selected):
        raise ValueError("start is outside the rows")
    out = bytearray()
    i = start
    while i < len(selected):
        row = selected[i]
        if not 0 <= row < length:
            raise ValueError(f"row {row} is outside the columns' {length} rows")
        key = key_column.value(row) if keys is not None else None
        value = value_column.value(row) if values is not None else None
        delta = i - start
        if delta > _INT32_MAX:
            break
        body = (
            2
            + size_of_varint(delta)
            + (1 if key is None else size_of_varint(len(key)) + len(key))
            + (1 if value is None else size_of_varint(len(value)) + len(value))
            + 1
        )
        if i > start and len(out) + size_of_varint(body) + body > max_bytes:
            break
        write_varint(out, body)
        out += b"\x00\x00"  # attributes, timestamp delta
        write_varint(out, delta)
        for field in (key, value):
            if field is None:
                out.append(1)
            else:
                write_varint(out, len(field))
                out += field
        out.append(0)  # no headers
        i += 1
    return bytes(out), i


def pure_partition_rows(keys: BinaryColumnArg, num_partitions: int) -> tuple[bytes, ...]:
    """The rows of each partition, by ``to_positive(murmur2(key)) % num_partitions``, as
    int32 buffers in row order, and last those with a null key (the sticky partitioner's)."""
    if not 1 <= num_partitions <= _INT32_MAX:
        raise ValueError("num_partitions must be at least 1")
    if keys is None:
        raise TypeError("partition_rows needs a key column")
    column = _Column(keys, "key")
    if column.length > _INT32_MAX:
        raise ValueError("more than 2**31 rows")
    parts = [array("i") for _ in range(num_partitions + 1)]
    for row in range(column.length):
        key = column.value(row)
        part = num_partitions if key is None else (pure_murmur2(key) & 0x7FFFFFFF) % num_partitions
        parts[part].append(row)
    return tuple(p.tobytes() for p in parts)


encode_rows = pure_encode_rows
partition_rows = pure_partition_rows
if codec is not None:
    encode_rows = codec.encode_rows
    partition_rows = codec.partition_rows
