"""The client's lazy paths give what the eager ones give: a consumer's
:class:`MessageBatch` views against ``consume()``'s messages, record for record and error
for error, on the compiled codec and on the pure-Python reference (``make test`` runs this
module again with ``HIGHWATER_PURE_PYTHON=1``; the columns' pure twin runs here either way).
"""

from __future__ import annotations

import struct
from typing import Any

import pytest
from compiled_codec import compiled_only
from highwater.client.consumer import AsyncConsumer, MessageBatch, TopicPartition
from highwater.client.consumer.fetcher import PartitionState
from highwater.client.consumer.message_batch import pure_binary_column
from highwater.client.message import Message
from highwater.errors import CorruptRecordError
from highwater.records import Compression, SimpleRecord, TimestampType, build_batch
from highwater.records.columnar import PureRecordColumns, RecordColumns, finish_columns
from highwater.records.header import ATTRIBUTES_OFFSET, CRC_OFFSET, crc32c
from highwater.records.implementation import codec
from highwater.v1 import broker_pb2 as pb
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

small = st.none() | st.binary(max_size=40)
headers = st.lists(
    st.tuples(st.text(max_size=6), st.none() | st.binary(max_size=10)), max_size=3
).map(tuple)
records = st.lists(
    st.builds(SimpleRecord, small, small, headers, st.integers(0, 1 << 42)),
    min_size=1,
    max_size=12,
)
batch_specs = st.lists(
    st.tuples(
        records,
        st.sampled_from([Compression.NONE, Compression.GZIP]),
        st.sampled_from(list(TimestampType)),
        st.integers(0, 3),  # an offset gap before the batch (a compacted log's)
        st.integers(-1, 2),  # the partition leader epoch (-1: none)
    ),
    min_size=1,
    max_size=4,
)


def fields(message: Message) -> tuple[Any, ...]:
    """Everything a caller can read from a message."""
    return (
        message.topic(),
        message.partition(),
        message.offset(),
        message.key(),
        message.value(),
        message.headers(),
        message.timestamp(),
        message.error(),
        len(message),
        message.leader_epoch(),
    )


def fetched(specs: list[Any]) -> tuple[bytes, int]:
    """The batches of ``specs`` as one fetched answer, and the offset after them."""
    data = b""
    offset = 0
    for batch_records, compression, timestamp_type, gap, epoch in specs:
        offset += gap
        data += build_batch(
            batch_records,
            base_offset=offset,
            compression=compression,
            timestamp_type=timestamp_type,
            partition_leader_epoch=epoch,
        )
        offset += len(batch_records)
    return data, offset


def eager(data: bytes, position: int) -> tuple[list[tuple[Any, ...]], int | None, Any]:
    """What consume()'s path takes: messages, the position after, the pending error."""
    state = PartitionState("t", 3, position=position)
    state.buffer(position, data, True)
    messages: list[Message] = []
    state.take(messages, 1 << 30)
    return [fields(m) for m in messages], state.position, state.pending_error


def lazy(
    data: bytes, position: int, columns_type: Any
) -> tuple[list[tuple[Any, ...]], int | None, Any]:
    """What consume_batches()' path takes, read back through a MessageBatch view."""
    state = PartitionState("t", 3, position=position)
    state.buffer(position, data, True)
    columns = columns_type(include_headers=True)
    epochs: list[tuple[int, int]] = []
    state.take_columns(columns, 1 << 30, epochs)
    view = MessageBatch("t", 3, finish_columns(columns), epochs=epochs)
    got = [fields(m) for m in view]
    assert [fields(view[i]) for i in range(len(view))] == got
    assert view.offsets() == [f[2] for f in got]
    assert view.values() == [f[4] for f in got]
    assert view.keys() == [f[3] for f in got]
    return got, state.position, state.pending_error


@given(specs=batch_specs, start=st.integers(0, 60))
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_message_batch_views_give_the_records_consume_gives(specs: list[Any], start: int) -> None:
    data, end = fetched(specs)
    position = min(start, end)
    expected = eager(data, position)
    # each message carries its batch's partition leader epoch (None where there is none)
    epoch_at = {}
    offset = 0
    for batch_records, _, _, gap, epoch in specs:
        offset += gap
        for _ in batch_records:
            epoch_at[offset] = None if epoch < 0 else epoch
            offset += 1
    assert [m[-1] for m in expected[0]] == [epoch_at[m[2]] for m in expected[0]]
    assert lazy(data, position, RecordColumns) == expected
    assert lazy(data, position, PureRecordColumns) == expected


def test_a_corrupt_record_ends_the_view_where_consume_ends_with_the_same_error() -> None:
    batches = [
        build_batch(
            [SimpleRecord(None, b"v%d" % (5 * b + i), (), 7) for i in range(5)], base_offset=5 * b
        )
        for b in range(3)
    ]
    corrupt = bytearray(batches[1])
    corrupt[-1] = 0x02  # the last record claims a header it does not hold
    struct.pack_into(">I", corrupt, CRC_OFFSET, crc32c(memoryview(corrupt)[ATTRIBUTES_OFFSET:]))
    data = batches[0] + bytes(corrupt) + batches[2]
    messages, position, error = eager(data, 0)
    for columns_type in (RecordColumns, PureRecordColumns):
        got, got_position, got_error = lazy(data, 0, columns_type)
        assert [m[2] for m in got] == [m[2] for m in messages] == list(range(9))
        assert got_position == position == 9
        assert isinstance(got_error, CorruptRecordError) and str(got_error) == str(error)


async def test_consume_batches_returns_what_consume_returns_in_views() -> None:
    """Two consumers fed the same fetched answers (two partitions, a corrupt record after
    some): consume_batches() gives the records, order, positions and errors consume() gives,
    one view per partition's run, the error as an empty batch after the records."""
    good = [
        build_batch(
            [
                SimpleRecord(b"k%d" % i, b"v%d" % (10 * b + i), (("h", b"x"),) if i == 2 else (), 7)
                for i in range(10)
            ],
            base_offset=10 * b,
        )
        for b in range(2)
    ]
    corrupt = bytearray(good[1])
    corrupt[-1] = 0x02  # the last record claims a header it does not hold
    struct.pack_into(">I", corrupt, CRC_OFFSET, crc32c(memoryview(corrupt)[ATTRIBUTES_OFFSET:]))

    def answer(data: bytes) -> pb.FetchPartitionResponse:
        return pb.FetchPartitionResponse(
            partition=0, high_watermark=100, log_start_offset=0, records=data
        )

    outcomes = []
    for method in ("consume", "consume_batches"):
        async with AsyncConsumer({"bootstrap.servers": "127.0.0.1:1"}) as consumer:
            consumer.assign([TopicPartition("t", 0, 3), TopicPartition("u", 0, 0)])
            consumer._handle_answer(consumer._states[("t", 0)], 3, answer(good[0] + bytes(corrupt)))
            consumer._handle_answer(consumer._states[("u", 0)], 0, answer(good[0] + good[1]))
            if method == "consume":
                taken = await consumer.consume(1000, timeout=0)
                got = [(fields(m), m.error() is not None) for m in taken]
            else:
                views = await consumer.consume_batches(1000, timeout=0)
                assert [(v.topic(), len(v), v.error() is not None) for v in views] == [
                    ("t", 16, False),
                    ("t", 0, True),
                    ("u", 20, False),
                ]
                assert views[1].first_offset() == 19 and list(views[1]) == []
                assert views[0][-1].offset() == 18 and views[0][1:3][0].offset() == 4
                with pytest.raises(IndexError):
                    views[0][16]
                got = []
                for view in views:
                    if view.error() is not None:
                        error = Message(
                            view.topic(),
                            view.partition(),
                            None,
                            None,
                            [],
                            -1,
                            view.first_offset(),
                            view.error(),
                        )
                        got.append((fields(error), True))
                    got += [(fields(m), False) for m in view]
            positions = consumer.position([TopicPartition("t", 0), TopicPartition("u", 0)])
            outcomes.append(([g if not e else g[:7] for g, e in got], positions))
    assert outcomes[0] == outcomes[1]
    assert len(outcomes[0][0]) == 16 + 1 + 20


@st.composite
def binary_columns(draw: st.DrawFn) -> tuple[bytes, memoryview, bytes, int]:
    """An Arrow binary column as the decoder writes it: validity bits, offsets, data."""
    rows = draw(st.lists(st.none() | st.binary(max_size=12), max_size=40))
    bits = sum(1 << row for row, value in enumerate(rows) if value is not None)
    validity = bits.to_bytes((len(rows) + 7) // 8, "little")
    offsets = [0]
    for value in rows:
        offsets.append(offsets[-1] + len(value or b""))
    data = b"".join(value or b"" for value in rows)
    packed = memoryview(struct.pack(f"{len(offsets)}i", *offsets)).cast("i")
    return validity, packed, data, draw(st.integers(0, len(rows)))


@settings(max_examples=40, deadline=None)
@given(binary_columns())
def test_a_binary_column_is_sliced_as_the_reference_slices_it(
    column: tuple[bytes, memoryview, bytes, int],
) -> None:
    validity, offsets, data, length = column
    expected = pure_binary_column(validity, offsets, data, length)
    assert len(expected) == length
    if codec is not None:
        assert codec.binary_column(validity, offsets, data, length) == expected


@compiled_only
def test_the_compiled_slicer_reads_nothing_past_its_buffers() -> None:
    offsets = memoryview(struct.pack("3i", 0, 2, 5)).cast("i")
    assert codec.binary_column(b"\x03", offsets, b"abcde", 2) == [b"ab", b"cde"]
    with pytest.raises(ValueError, match="offset outside the data"):
        codec.binary_column(b"\x03", offsets, b"abc", 2)
    with pytest.raises(ValueError, match="fewer offsets than rows"):
        codec.binary_column(b"\x07", offsets, b"abcde", 3)
