"""The Kafka listener's requests in flight, in process over loopback with an ``apis`` that
parks each request until the test lets it go: a connection lost (reset) or closed by the
client (FIN) while a request is parked cancels the request's work; a failed request with
the in-flight queue full closes the connection and cancels what was queued; a later
request done first is answered after the earlier one."""

from __future__ import annotations

import asyncio
import socket
import struct
from typing import Any, cast

import pytest
from highwater.broker.kafka_protocol.apis import KafkaApis, api_versions_response
from highwater.broker.kafka_protocol.codec import KafkaRequest
from highwater.broker.kafka_protocol.listener import KafkaListener
from kafka.protocol.metadata import ApiVersionsRequest, MetadataRequest
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


@pytest.mark.parametrize("max_in_flight", [1, 5])
async def test_a_clean_close_with_requests_parked_cancels_them(max_in_flight: int) -> None:
    """A client that closes its socket (FIN) is gone as surely as one that resets it: as
    Kafka's SocketServer closes the channel at once, the work parked for it is cancelled,
    also while the listener waits for room for the next request (one in flight). It was
    kept until it ended (a fetch's ``max_wait_ms``) to answer nobody."""
    apis = ParkedApis()
    listener = KafkaListener(
        cast(KafkaApis, apis), host="127.0.0.1", port=0, max_in_flight=max_in_flight
    )
    await listener.start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", listener.port)
        writer.write(b"".join(request_frame(MetadataRequest(topics=None), 12, i) for i in (7, 8)))
        await writer.drain()
        assert await asyncio.wait_for(apis.started.get(), 5) == 7
        writer.write_eof()
        assert await asyncio.wait_for(apis.cancelled.get(), 5) == 7
        assert await asyncio.wait_for(reader.read(), 5) == b""  # closed, unanswered
        writer.close()
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


async def test_a_failed_request_with_the_in_flight_queue_full_closes_and_cancels_the_rest(
    caplog: pytest.LogCaptureFixture,
) -> None:
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
        port = writer.get_extra_info("sockname")[1]
        assert f"closing its connection, from ('127.0.0.1', {port})" in caplog.text
        writer.close()
    finally:
        await listener.stop()


class HeldFirstApis:
    """Holds the request of correlation id 1 until :attr:`release` is set; answers every
    request with the versions served."""

    def __init__(self) -> None:
        self.release = asyncio.Event()

    async def handle(self, request: KafkaRequest) -> Any:
        if request.correlation_id == 1:
            await self.release.wait()
        return api_versions_response(0)


async def test_a_later_request_done_first_is_answered_after_the_earlier_one() -> None:
    """(No defect: pipelining order with the earlier request parked, in process.)"""
    apis = HeldFirstApis()
    listener = KafkaListener(cast(KafkaApis, apis), host="127.0.0.1", port=0)
    await listener.start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", listener.port)
        writer.write(b"".join(request_frame(ApiVersionsRequest(), 0, i) for i in (1, 2)))
        with pytest.raises(TimeoutError):  # the second is done, and waits for the first
            await asyncio.wait_for(reader.readexactly(8), 0.3)
        apis.release.set()
        ids = []
        for _ in range(2):
            (size,) = struct.unpack(">i", await reader.readexactly(4))
            ids.append(struct.unpack(">i", (await reader.readexactly(size))[:4])[0])
        assert ids == [1, 2]
        writer.close()
    finally:
        await listener.stop()
