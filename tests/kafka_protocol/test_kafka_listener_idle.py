"""The Kafka listener closes idle connections (``connections.max.idle.ms``), in process over
loopback: a connection on which no byte moved for that long and no request is in flight is
closed, as Kafka's ``Selector`` closes it; a request parked longer than that (a long poll,
a produce waiting on the ISR) keeps its connection, and so does a client that keeps
asking; with -1 nothing is closed."""

from __future__ import annotations

import asyncio
import struct
import time
from typing import Any, cast

import pytest
from highwater.broker.kafka_protocol.apis import KafkaApis, api_versions_response
from highwater.broker.kafka_protocol.codec import KafkaRequest
from highwater.broker.kafka_protocol.listener import KafkaListener
from kafka.protocol.metadata import ApiVersionsRequest
from kafka_servers import request_frame

pytestmark = pytest.mark.timeout(30)

IDLE_MS = 400


class Apis:
    """Answers ApiVersions at once, except the request of correlation id 99, held until
    :attr:`release` is set."""

    def __init__(self) -> None:
        self.release = asyncio.Event()

    async def handle(self, request: KafkaRequest) -> Any:
        if request.correlation_id == 99:
            await self.release.wait()
        return api_versions_response(0)


async def ask(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, correlation_id: int
) -> None:
    writer.write(request_frame(ApiVersionsRequest(), 0, correlation_id))
    await writer.drain()
    (size,) = struct.unpack(">i", await reader.readexactly(4))
    answer = await reader.readexactly(size)
    assert struct.unpack(">i", answer[:4]) == (correlation_id,)


async def closed_within(reader: asyncio.StreamReader, timeout_s: float) -> bool:
    try:
        return await asyncio.wait_for(reader.read(), timeout_s) == b""
    except TimeoutError:
        return False


async def test_an_idle_connection_is_closed_and_a_busy_one_is_not() -> None:
    apis = Apis()
    listener = KafkaListener(
        cast(KafkaApis, apis), host="127.0.0.1", port=0, connections_max_idle_ms=IDLE_MS
    )
    await listener.start()
    try:
        idle_reader, idle_writer = await asyncio.open_connection("127.0.0.1", listener.port)
        busy_reader, busy_writer = await asyncio.open_connection("127.0.0.1", listener.port)
        parked_reader, parked_writer = await asyncio.open_connection("127.0.0.1", listener.port)
        await ask(idle_reader, idle_writer, 1)
        last = time.monotonic()
        parked_writer.write(request_frame(ApiVersionsRequest(), 0, 99))
        await parked_writer.drain()

        # The busy client asks every 100 ms for three idle periods; the idle one is
        # closed between one and one and a quarter of the period after its answer.
        closing = asyncio.ensure_future(closed_within(idle_reader, 5))
        for i in range(12):
            await ask(busy_reader, busy_writer, 10 + i)
            await asyncio.sleep(0.1)
        assert closing.done() and closing.result()
        assert not busy_reader.at_eof()
        idle_writer.close()

        # Parked for the whole time: still open; answered, then idle, then closed.
        assert not parked_reader.at_eof()
        apis.release.set()
        (size,) = struct.unpack(">i", await parked_reader.readexactly(4))
        await parked_reader.readexactly(size)
        answered = time.monotonic()
        assert await closed_within(parked_reader, 5)
        assert time.monotonic() - answered >= IDLE_MS / 1000 * 0.9
        assert answered - last > 3 * IDLE_MS / 1000  # it was parked past three periods
        for writer in (busy_writer, parked_writer):
            writer.close()
    finally:
        await listener.stop()


async def test_minus_one_closes_nothing() -> None:
    listener = KafkaListener(
        cast(KafkaApis, Apis()), host="127.0.0.1", port=0, connections_max_idle_ms=-1
    )
    await listener.start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", listener.port)
        await ask(reader, writer, 1)
        assert not await closed_within(reader, 3 * IDLE_MS / 1000)
        await ask(reader, writer, 2)  # still served
        writer.close()
    finally:
        await listener.stop()
