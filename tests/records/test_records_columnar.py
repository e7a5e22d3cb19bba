"""The columnar paths (``highwater.records.columnar``): compiled against pure Python, and both
against the record decoder.

Decoding: the compiled ``RecordColumns`` and :class:`PureRecordColumns` give the same Arrow
buffers for the same batches (compressed or not, with and without headers), those buffers
read back through pyarrow are the records :meth:`RecordBatch.records` decodes, and a
corrupted, truncated or adversarial batch raises the error the record decoder raises, after
the same records. Encoding: ``encode_rows`` and ``partition_rows`` give the reference's
bytes and rows, and what they encode decodes to the columns' rows.
"""

from __future__ import annotations

import os
from typing import Any

import pyarrow as pa
import pytest
from highwater.errors import HighwaterError
from highwater.records import BATCH_HEADER_SIZE, Compression, RecordBatch, build_batch
from highwater.records import columnar as col
from highwater.records.batch import _finish_batch
from highwater.records.header import TimestampType
from highwater.records.implementation import PURE_PYTHON_ENV, codec
from highwater.records.partitioner import partition_for_key
from highwater.records.record import SimpleRecord
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from records_helpers import replace_records, resign, simple_records

if codec is None and os.environ.get(PURE_PYTHON_ENV, "") in ("", "0"):
    raise RuntimeError("highwater.records._codec is not built: `make compiled` builds it")

SLOW = [HealthCheck.too_slow]
IMPLEMENTATIONS = [col.PureRecordColumns] + ([] if codec is None else [codec.RecordColumns])


def columns_outcome(cls: Any, batches: list[bytes], include_headers: bool) -> tuple[Any, ...]:
    """The buffers of the records decoded into ``cls`` columns, and the error if one was
    raised (type and message), with what was decoded before it."""
    columns = cls(include_headers=include_headers)
    error = None
    try:
        for data in batches:
            RecordBatch(data).read_columns(columns)
    except HighwaterError as e:
        error = (type(e).__name__, str(e))
    return col.finish_columns(columns), error


def records_outcome(batches: list[bytes]) -> tuple[list[Any], Any]:
    """What the record decoder gives for the same batches."""
    out: list[Any] = []
    try:
        for data in batches:
            batch = RecordBatch(data)
            kind = int(batch.timestamp_type)
            for r in batch.records():
                out.append((r.key, r.value, list(r.headers), r.offset, r.timestamp, kind))
    except HighwaterError as e:
        return out, (type(e).__name__, str(e))
    return out, None


def _buffer(data: bytes) -> pa.Buffer:
    return pa.py_buffer(data)


def as_rows(buffers: col.ColumnBuffers, include_headers: bool) -> list[Any]:
    """The columns read back through pyarrow, one tuple per record."""
    n = buffers.length
    keys = pa.Array.from_buffers(pa.binary(), n, [_buffer(b) for b in buffers[1:4]]).to_pylist()
    values = pa.Array.from_buffers(pa.binary(), n, [_buffer(b) for b in buffers[4:7]]).to_pylist()
    offsets = pa.Array.from_buffers(pa.int64(), n, [None, _buffer(buffers.offsets)]).to_pylist()
    stamps = pa.Array.from_buffers(pa.int64(), n, [None, _buffer(buffers.timestamps)]).to_pylist()
    kinds = pa.Array.from_buffers(
        pa.int32(), n, [None, _buffer(buffers.timestamp_types)]
    ).to_pylist()
    headers: list[Any] = [[] for _ in range(n)]
    if include_headers:
        total = (len(buffers.header_key_offsets) // 4) - 1
        hkeys = pa.Array.from_buffers(
            pa.string(),
            total,
            [None, _buffer(buffers.header_key_offsets), _buffer(buffers.header_key_data)],
        )
        hvalues = pa.Array.from_buffers(
            pa.binary(),
            total,
            [
                _buffer(buffers.header_value_validity),
                _buffer(buffers.header_value_offsets),
                _buffer(buffers.header_value_data),
            ],
        )
        structs = pa.StructArray.from_arrays([hkeys, hvalues], names=["key", "value"])
        lists = pa.ListArray.from_buffers(
            pa.list_(structs.type), n, [None, _buffer(buffers.header_offsets)], children=[structs]
        )
        headers = [[(h["key"], h["value"]) for h in row] for row in lists.to_pylist()]
    return [
        (k, v, h, o, t, kind)
        for k, v, h, o, t, kind in zip(keys, values, headers, offsets, stamps, kinds, strict=True)
    ]


def check_alike(batches: list[bytes]) -> None:
    expected, error = records_outcome(batches)
    for include_headers in (False, True):
        outcomes = [columns_outcome(cls, batches, include_headers) for cls in IMPLEMENTATIONS]
        assert all(o == outcomes[0] for o in outcomes[1:])
        buffers, got_error = outcomes[0]
        assert got_error == error
        want = [
            (k, v, h if include_headers else [], o, t, kind) for k, v, h, o, t, kind in expected
        ]
        assert as_rows(buffers, include_headers) == want


@given(
    st.lists(simple_records(max_size=8), min_size=1, max_size=3),
    st.sampled_from([Compression.NONE, Compression.GZIP, Compression.LZ4]),
    st.sampled_from(list(TimestampType)),
)
@settings(max_examples=40, deadline=None, suppress_health_check=SLOW)
def test_batches_decode_into_the_records_columns(
    groups: list[list[SimpleRecord]], compression: Compression, timestamp_type: TimestampType
) -> None:
    batches = []
    base = 0
    for records in groups:
        batches.append(
            build_batch(
                records, base_offset=base, compression=compression, timestamp_type=timestamp_type
            )
        )
        base += len(records) + 3
    check_alike(batches)


@st.composite
def damaged_batches(draw: st.DrawFn) -> bytes:
    records = draw(simple_records(max_size=5))
    data = bytearray(build_batch(records))
    for _ in range(draw(st.integers(0, 4))):
        position = draw(st.integers(BATCH_HEADER_SIZE, len(data) - 1))
        data[position] = draw(st.integers(0, 255))
    if draw(st.booleans()):
        cut = draw(st.integers(BATCH_HEADER_SIZE, len(data)))
        data = replace_records(bytes(data), bytes(data[BATCH_HEADER_SIZE:cut]))
    return bytes(resign(data))


@given(damaged_batches())
@settings(max_examples=80, deadline=None, suppress_health_check=SLOW)
def test_damaged_batches_raise_the_record_decoders_error(data: bytes) -> None:
    check_alike([data])


@given(st.binary(max_size=120))
@settings(max_examples=80, deadline=None, suppress_health_check=SLOW)
def test_random_payloads_raise_the_record_decoders_error(payload: bytes) -> None:
    template = build_batch([SimpleRecord(b"k", b"v", (), 0)] * 3)
    check_alike([bytes(replace_records(template, payload))])


@pytest.mark.parametrize("cls", IMPLEMENTATIONS)
def test_a_timestamp_past_int64_is_a_corrupt_record(cls: Any) -> None:
    data = bytearray(build_batch([SimpleRecord(None, b"v", (), 5)]))
    data[27:35] = ((1 << 63) - 1).to_bytes(8, "big")  # the base timestamp: int64 max
    data[BATCH_HEADER_SIZE + 2] = 2  # the timestamp delta: +1
    resign(data)
    with pytest.raises(HighwaterError, match="not an int64"):
        RecordBatch(bytes(data)).read_columns(cls())


# --- encoding ---------------------------------------------------------------------------


def arg(array: pa.Array | None) -> col.BinaryColumnArg | None:
    if array is None:
        return None
    validity, offsets, data = array.buffers()
    return (validity, offsets, data if data is not None else b"", array.offset, len(array))


ROW_VALUES = st.none() | st.binary(max_size=300)


@given(
    st.lists(st.tuples(ROW_VALUES, ROW_VALUES), max_size=40),
    st.integers(0, 5),
    st.sampled_from([30, 200, 1 << 20]),
    st.booleans(),
    st.booleans(),
)
@settings(max_examples=50, deadline=None, suppress_health_check=SLOW)
def test_encode_rows_gives_the_references_bytes_and_records(
    rows: list[tuple[bytes | None, bytes | None]],
    skip: int,
    max_bytes: int,
    with_keys: bool,
    select: bool,
) -> None:
    keys = pa.array([None, *[k for k, _ in rows]], pa.binary())[1:] if with_keys else None
    values = pa.array([v for _, v in rows], pa.binary())
    chosen = list(range(len(rows)))[::-1][: len(rows) - skip] if select else None
    selected = None if chosen is None else pa.array(chosen, pa.int32()).buffers()[1]
    wanted = chosen if chosen is not None else list(range(len(rows)))
    start, decoded = 0, []
    while start < len(wanted):
        body, following = col.encode_rows(arg(keys), arg(values), selected, start, max_bytes)
        assert (body, following) == col.pure_encode_rows(
            arg(keys), arg(values), selected, start, max_bytes
        )
        assert following > start and (following - start == 1 or len(body) <= max_bytes)
        count = following - start
        out = bytearray(BATCH_HEADER_SIZE) + body
        batch = _finish_batch(
            out,
            records_count=count,
            last_offset_delta=count - 1,
            base_timestamp=7,
            max_timestamp=7,
            base_offset=start,
            partition_leader_epoch=-1,
            compression=Compression.NONE,
            timestamp_type=TimestampType.CREATE_TIME,
            producer_id=-1,
            producer_epoch=-1,
            base_sequence=-1,
            is_transactional=False,
            is_control=False,
            has_delete_horizon=False,
            compression_level=None,
        )
        decoded += [(r.key, r.value, r.offset, r.timestamp) for r in RecordBatch(batch).records()]
        start = following
    assert decoded == [
        (rows[row][0] if with_keys else None, rows[row][1], i, 7) for i, row in enumerate(wanted)
    ]


@given(st.lists(st.none() | st.binary(max_size=20), max_size=60), st.integers(1, 7))
@settings(max_examples=60, deadline=None, suppress_health_check=SLOW)
def test_partition_rows_is_the_default_partitioner(keys: list[bytes | None], n: int) -> None:
    array = pa.array(keys, pa.binary())
    parts = col.partition_rows(arg(array), n)
    assert parts == col.pure_partition_rows(arg(array), n)
    expected: list[list[int]] = [[] for _ in range(n + 1)]
    for row, key in enumerate(keys):
        expected[n if key is None else partition_for_key(key, n)].append(row)
    assert [pa.py_buffer(p).to_pybytes() for p in parts] == [
        pa.array(rows, pa.int32()).buffers()[1].to_pybytes() if rows else b"" for rows in expected
    ]


def test_a_sliced_array_encodes_its_own_rows() -> None:
    values = pa.array([b"a", b"bb", None, b"dddd"], pa.binary()).slice(1, 2)
    body, following = col.encode_rows(None, arg(values), None, 0, 1 << 20)
    assert following == 2
    assert (body, following) == col.pure_encode_rows(None, arg(values), None, 0, 1 << 20)


@pytest.mark.parametrize(
    "fn", [col.encode_rows, col.pure_encode_rows], ids=["implementation", "reference"]
)
def test_bad_columns_are_refused_alike(fn: Any) -> None:
    values = pa.array([b"abc", b"de"], pa.binary())
    validity, offsets, data = values.buffers()
    with pytest.raises(ValueError, match="shorter than its length"):
        fn(None, (validity, offsets, data, 0, 5), None, 0, 100)
    lying = pa.array([0, 99, 100], pa.int32()).buffers()[1]
    with pytest.raises(ValueError, match="offsets at row 0 are not inside its data"):
        fn(None, (None, lying, data, 0, 2), None, 0, 100)
    outside = pa.array([5], pa.int32()).buffers()[1]
    with pytest.raises(ValueError, match="row 5 is outside the columns' 2 rows"):
        fn(None, arg(values), outside, 0, 100)
    with pytest.raises(TypeError):
        fn(None, (None, 3, data, 0, 2), None, 0, 100)
