"""The Kafka listener's requests in flight, in process over loopback with an ``apis`` that
parks each request until the test lets it go: a connection lost (reset) while a request is
parked cancels the request's work."""

from __future__ import annotations

import asyncio
import socket
import struct
from typing import Any, cast

import pytest
from highwater.broker.kafka_protocol.apis import KafkaApis
from highwater.broker.kafka_protocol.codec import KafkaRequest
from highwater.broker.kafka_protocol.listener import KafkaListener
from kafka.protocol.metadata import MetadataRequest
from kafka_servers import request_frame

pytestmark = pytest.mark.timeout(30)


class ParkedApis:
    """Parks every request until it is cancelled; says which were started and cancelled."""

    def __init__(self) -> None:
        self.started: asyncio.Queue[int] = asyncio.Queue()
        self.cancelled: asyncio.Queue[int] = asyncio.Queue()

    async def handle(self, request: KafkaRequest) -> Any:
        await self.started.put(request.correlation_id)
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            await self.cancelled.put(request.correlation_id)
            raise


async def test_a_connection_reset_with_a_request_parked_cancels_the_request() -> None:
    apis = ParkedApis()
    listener = KafkaListener(cast(KafkaApis, apis), host="127.0.0.1", port=0)
    await listener.start()
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", listener.port)
        writer.write(request_frame(MetadataRequest(topics=None), 12, 7))
        await writer.drain()
        assert await asyncio.wait_for(apis.started.get(), 5) == 7
        # A reset, not an end of stream: the client is gone and nothing can be answered.
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.close()
        assert await asyncio.wait_for(apis.cancelled.get(), 5) == 7
    finally:
        await listener.stop()


class FailingFirstApis(ParkedApis):
    """Fails the request of correlation id 1 (a handler's unexpected error); parks the
    others."""

    async def handle(self, request: KafkaRequest) -> Any:
        if request.correlation_id == 1:
            await self.started.put(1)
            raise RuntimeError("a handler's bug")
        return await super().handle(request)


async def test_a_failed_request_with_the_in_flight_queue_full_closes_and_cancels_the_rest() -> None:
    """The failed request closes the connection while the reader waits for room for the
    next request: the reader stops too, and the request queued behind is cancelled."""
    apis = FailingFirstApis()
    listener = KafkaListener(cast(KafkaApis, apis), host="127.0.0.1", port=0, max_in_flight=1)
    await listener.start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", listener.port)
        writer.write(
            b"".join(request_frame(MetadataRequest(topics=None), 12, i) for i in (1, 2, 3))
        )
        await writer.drain()
        assert await reader.read() == b""  # closed, unanswered
        assert await asyncio.wait_for(apis.cancelled.get(), 5) == 2
        writer.close()
    finally:
        await listener.stop()
