"""What :meth:`~highwater.client.producer.AsyncProducer.produce_batch` takes: many records as
columns, given as an Arrow table or record batch (pyarrow, imported only when one is given)
or as a mapping of column name to a sequence, read into the buffers of Arrow binary columns
(:data:`~highwater.records.columnar.BinaryColumnArg`) that the codec encodes in one pass.

The columns are ``value`` (required) and ``key`` (optional), binary or string (the same
bytes: UTF-8); null entries are null keys and tombstones. Other columns are refused, so
that a ``headers`` or ``partition`` column is not silently dropped.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, TypeAlias

from highwater.records.columnar import BinaryColumnArg

__all__ = ["RecordsArg", "column_chunks"]

RecordsArg: TypeAlias = Any
"""A ``pyarrow.Table`` or ``pyarrow.RecordBatch`` with a ``value`` and maybe a ``key``
column, or a mapping ``{"value": [...], "key": [...]}`` of sequences of bytes, str or None."""

_COLUMNS = frozenset({"key", "value"})


def column_chunks(records: RecordsArg) -> Iterator[tuple[BinaryColumnArg | None, BinaryColumnArg]]:
    """``(keys, values)`` column pairs of ``records``, chunk by chunk (an Arrow table may
    hold several); raises TypeError or ValueError for what cannot be produced."""
    if isinstance(records, Mapping):
        yield _from_sequences(records)
        return
    try:
        import pyarrow as pa
    except ImportError:  # pragma: no cover - pyarrow is installed with the spark extra
        raise TypeError("records must be a mapping of columns (pyarrow is not installed)") from None
    if isinstance(records, pa.Table):
        batches = records.to_batches()
    elif isinstance(records, pa.RecordBatch):
        batches = [records]
    else:
        raise TypeError(
            "records must be a pyarrow Table or RecordBatch or a mapping of columns, not "
            + type(records).__name__
        )
    for batch in batches:
        names = set(batch.schema.names)
        _check_names(names)
        values = _arrow_column(pa, batch.column("value"), "value")
        keys = _arrow_column(pa, batch.column("key"), "key") if "key" in names else None
        if batch.num_rows:
            yield keys, values


def _check_names(names: set[str]) -> None:
    if "value" not in names:
        raise ValueError("produce_batch needs a 'value' column")
    extra = names - _COLUMNS
    if extra:
        raise ValueError(
            f"produce_batch takes 'key' and 'value' columns, not {sorted(extra)}: records with "
            "headers or partitions of their own go through produce()"
        )


def _arrow_column(pa: Any, array: Any, name: str) -> BinaryColumnArg:
    if pa.types.is_large_binary(array.type) or pa.types.is_large_string(array.type):
        array = array.cast(pa.binary())
    if not (pa.types.is_binary(array.type) or pa.types.is_string(array.type)):
        raise TypeError(f"the {name!r} column must be binary or string, not {array.type}")
    validity, offsets, data = array.buffers()
    return (validity, offsets, b"" if data is None else data, array.offset, len(array))


def _from_sequences(
    columns: Mapping[str, Sequence[Any]],
) -> tuple[BinaryColumnArg | None, BinaryColumnArg]:
    _check_names(set(columns))
    values = _sequence_column(columns["value"], "value")
    keys = _sequence_column(columns["key"], "key") if "key" in columns else None
    if keys is not None and keys[4] != values[4]:
        raise ValueError(f"the key column has {keys[4]} rows and the value column {values[4]}")
    return keys, values


def _sequence_column(items: Sequence[Any], name: str) -> BinaryColumnArg:
    validity = bytearray((len(items) + 7) // 8)
    offsets = array("i", [0])
    data = bytearray()
    for i, item in enumerate(items):
        if item is not None:
            if isinstance(item, str):
                item = item.encode()
            elif not isinstance(item, bytes | bytearray | memoryview):
                raise TypeError(f"{name} must be str, bytes or None, not {type(item).__name__}")
            data += item
            validity[i >> 3] |= 1 << (i & 7)
        offsets.append(len(data))
    return (bytes(validity), offsets.tobytes(), bytes(data), 0, len(items))
