"""A Kafka connection's frames (``FrameConnection``, the listener's BufferedProtocol): bytes
arriving in any cut come out as the frames that were sent, in order and byte for byte; a
large frame is received in a buffer of its own, handed over as a view and, once released,
reused for the next large frame; a frame over the limit is refused before its bytes are
read; a connection that ends inside a frame says so. The protocol is driven as a transport
drives it (``get_buffer``, ``buffer_updated``, ``connection_lost``). And the decoder's
contract the reuse relies on: a decoded produce request's records are bytes of their own,
not a view of the frame."""

from __future__ import annotations

import asyncio
import struct
from typing import Any

import pytest
from highwater.broker.kafka_protocol.codec import decode_request
from highwater.broker.kafka_protocol.connection import (
    SCRATCH_BYTES,
    FrameConnection,
    FrameTooLargeError,
    IncompleteFrameError,
)
from kafka.protocol.api_header import RequestHeader
from kafka.protocol.producer import ProduceRequest


class Transport:
    """What the protocol asks of its transport: reading paused and resumed."""

    def __init__(self) -> None:
        self.paused = False
        self.pauses = 0

    def pause_reading(self) -> None:
        self.paused = True
        self.pauses += 1

    def resume_reading(self) -> None:
        self.paused = False

    def close(self) -> None:
        pass


async def _serve(_connection: FrameConnection) -> None:
    return None


def connect(limit: int = 100 * 1024 * 1024) -> tuple[FrameConnection, Transport]:
    connection = FrameConnection(_serve, request_max_bytes=limit, loop=asyncio.get_running_loop())
    transport = Transport()
    connection.connection_made(transport)  # type: ignore[arg-type]
    return connection, transport


def feed(connection: FrameConnection, data: bytes, cut: int) -> None:
    """``data`` as a transport hands it over: into the protocol's buffer, at most ``cut``
    bytes (and at most the buffer's room) per read."""
    at = 0
    while at < len(data):
        buffer = connection.get_buffer(-1)
        assert len(buffer) > 0
        n = min(cut, len(buffer), len(data) - at)
        buffer[:n] = data[at : at + n]
        connection.buffer_updated(n)
        at += n


def framed(body: bytes) -> bytes:
    return struct.pack(">i", len(body)) + body


def frames(sizes: list[int]) -> list[bytes]:
    """Frames of distinct bytes."""
    made = []
    for i, size in enumerate(sizes):
        pattern = bytes((i + j) % 256 for j in range(251))
        made.append((pattern * (size // 251 + 1))[:size])
    return made


AROUND_SCRATCH = [0, 1, 300, SCRATCH_BYTES - 4, SCRATCH_BYTES - 3, 70_000, 5]
"""Frame sizes around the scratch buffer's: small, the largest that fits, larger."""


@pytest.mark.parametrize(
    ("cut", "sizes"),
    [
        (1, [0, 1, 300, 5, 17]),
        (13, AROUND_SCRATCH),
        (4096, [*AROUND_SCRATCH, 1_100_000, 17]),
        (70_000, [*AROUND_SCRATCH, 1_100_000, 17]),
        (10_000_000, [*AROUND_SCRATCH, 1_100_000, 17]),
    ],
)
async def test_frames_come_out_as_sent_whatever_the_reads(cut: int, sizes: list[int]) -> None:
    sent = frames(sizes)
    connection, _ = connect()
    stream = b"".join(framed(body) for body in sent)
    received: list[bytes] = []

    async def read_all() -> None:
        while (frame := await connection.read_frame()) is not None:
            received.append(bytes(frame))
            connection.release(frame)

    reader = asyncio.create_task(read_all())
    for at in range(0, len(stream), 400_000):  # the reader runs between deliveries
        feed(connection, stream[at : at + 400_000], cut)
        await asyncio.sleep(0)
    connection.connection_lost(None)
    await asyncio.wait_for(reader, 10)
    assert received == sent


async def test_a_large_frame_is_received_in_place_and_its_buffer_reused() -> None:
    connection, _ = connect()
    first, second = b"a" * 300_000, b"b" * 200_000
    feed(connection, framed(first), 100_000)
    frame = await connection.read_frame()
    assert isinstance(frame, memoryview) and bytes(frame) == first
    buffer = frame.obj
    connection.release(frame)
    feed(connection, framed(second), 100_000)
    again = await connection.read_frame()
    assert isinstance(again, memoryview) and bytes(again) == second
    assert again.obj is buffer, "the released buffer took the next large frame"


async def test_a_frame_still_read_keeps_its_buffer() -> None:
    connection, _ = connect()
    feed(connection, framed(b"x" * 100_000) + framed(b"y" * 100_000), 1_000_000)
    first = await connection.read_frame()
    second = await connection.read_frame()
    assert isinstance(first, memoryview) and isinstance(second, memoryview)
    assert first.obj is not second.obj
    assert bytes(first) == b"x" * 100_000


async def test_a_frame_over_the_limit_is_refused_after_the_frames_before_it() -> None:
    connection, transport = connect(limit=1000)
    feed(connection, framed(b"ok") + struct.pack(">i", 1001) + b"z" * 50, 4096)
    assert await connection.read_frame() == b"ok"
    with pytest.raises(FrameTooLargeError, match="1001 bytes"):
        await connection.read_frame()
    assert transport.paused, "nothing more is read"


async def test_a_negative_size_is_refused() -> None:
    connection, _ = connect()
    feed(connection, struct.pack(">i", -5), 4)
    with pytest.raises(FrameTooLargeError):
        await connection.read_frame()


@pytest.mark.parametrize(
    "partial", [b"\x00\x00", framed(b"q" * 10)[:9], framed(b"q" * 99_999)[:70_000]]
)
async def test_a_connection_that_ends_inside_a_frame_says_so(partial: bytes) -> None:
    connection, _ = connect()
    feed(connection, framed(b"whole") + partial, 4096)
    connection.connection_lost(None)
    assert await connection.read_frame() == b"whole"
    with pytest.raises(IncompleteFrameError):
        await connection.read_frame()


async def test_reading_pauses_while_frames_wait_and_resumes_as_they_are_read() -> None:
    connection, transport = connect()
    feed(connection, b"".join(framed(b"%d" % i) for i in range(40)), 1_000_000)
    assert transport.paused
    read = [await connection.read_frame() for _ in range(40)]
    assert read == [b"%d" % i for i in range(40)]
    assert not transport.paused


def produce_frame(records: bytes) -> bytes:
    R = ProduceRequest
    body: Any = R(
        acks=1,
        timeout_ms=1000,
        transactional_id=None,
        topic_data=[
            R.TopicProduceData(
                name="t",
                partition_data=[R.TopicProduceData.PartitionProduceData(index=0, records=records)],
            )
        ],
    )
    header = RequestHeader(
        request_api_key=0, request_api_version=7, correlation_id=9, client_id="c"
    )
    return bytes(header.encode(flexible=False)) + bytes(body.encode(version=7))


def test_decoded_records_do_not_share_the_frames_buffer() -> None:
    records = bytes(range(256)) * 400
    buffer = bytearray(produce_frame(records))
    request = decode_request(memoryview(buffer))
    buffer[:] = bytes(len(buffer))  # the connection's next large frame
    decoded = request.body.topic_data[0].partition_data[0].records
    assert isinstance(decoded, bytes) and decoded == records
    assert request.client_id == "c" and request.correlation_id == 9


async def test_the_clients_end_of_stream_ends_the_requests_but_keeps_the_connection() -> None:
    connection, _ = connect()
    feed(connection, framed(b"last") + framed(b"cut")[:5], 4096)
    assert connection.eof_received() is True, "the answers still go out; the listener closes"
    assert await connection.read_frame() == b"last"
    with pytest.raises(IncompleteFrameError):
        await connection.read_frame()
    await connection.drain()  # not lost: answers may still be written
