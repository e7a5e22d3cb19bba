"""The client honours ``throttle_time_ms``: after an answer that carries it, no produce or
fetch request goes to that broker until that long after the request was sent; every such
request carries the client's ``client.id`` as the ``client-id`` metadata.

The broker here is a small gRPC server in this process that answers at once (as a broker
that throttles by muting rather than by holding its answers would) and notes when each
request came and with which client id.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator

import grpc
import grpc.aio
import pytest
from embedded_servers import free_port
from highwater.client.cluster import ClusterMetadata
from highwater.client.producer import AsyncProducer
from highwater.v1 import broker_pb2 as pb
from highwater.v1 import broker_pb2_grpc

pytestmark = pytest.mark.timeout(30)

THROTTLE_MS = 300
TOPIC = "t"


class ThrottlingBroker(broker_pb2_grpc.BrokerServicer):
    """Leads partition 0 of ``t``; answers every produce and fetch at once, throttled."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.arrivals: list[float] = []
        self.client_ids: set[str] = set()

    def _arrived(self, context: grpc.aio.ServicerContext) -> None:
        self.arrivals.append(asyncio.get_running_loop().time())
        self.client_ids.update(v for k, v in context.invocation_metadata() if k == "client-id")

    async def Metadata(
        self, request: pb.MetadataRequest, context: grpc.aio.ServicerContext
    ) -> pb.MetadataResponse:
        reply = pb.MetadataResponse(controller_id=-1)
        reply.brokers.add(node_id=1, host="127.0.0.1", port=self.port)
        topic = reply.topics.add(name=TOPIC, topic_id="t-id")
        topic.partitions.add(partition=0, leader_id=1, leader_epoch=0, replicas=[1], isr=[1])
        return reply

    async def ProduceStream(
        self,
        request_iterator: AsyncIterator[pb.ProduceRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[pb.ProduceResponse]:
        async for request in request_iterator:
            self._arrived(context)
            reply = pb.ProduceResponse(throttle_time_ms=THROTTLE_MS)
            for topic in request.topics:
                answered = reply.topics.add(topic=topic.topic)
                for item in topic.partitions:
                    answered.partitions.add(partition=item.partition, base_offset=0)
            yield reply

    async def FetchStream(
        self, request_iterator: AsyncIterator[pb.FetchRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.FetchResponse]:
        async for _request in request_iterator:
            self._arrived(context)
            yield pb.FetchResponse(throttle_time_ms=THROTTLE_MS)


@pytest.fixture
async def broker() -> AsyncIterator[tuple[str, ThrottlingBroker]]:
    port = free_port()
    servicer = ThrottlingBroker(port)
    server = grpc.aio.server()
    broker_pb2_grpc.add_BrokerServicer_to_server(servicer, server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    try:
        yield f"127.0.0.1:{port}", servicer
    finally:
        await server.stop(0)


def waited(arrivals: list[float]) -> bool:
    """Whether each request came a throttle after the one before: the throttle counts from
    when the client sent, so a gap may be short of it by the first request's transit time
    (unthrottled, the gaps are milliseconds)."""
    gaps = [later - earlier for earlier, later in itertools.pairwise(arrivals)]
    return len(gaps) == 2 and all(gap >= THROTTLE_MS / 1000 * 2 / 3 for gap in gaps)


async def test_the_producer_waits_out_a_throttle(broker: tuple[str, ThrottlingBroker]) -> None:
    address, servicer = broker
    config = {
        "bootstrap.servers": address,
        "client.id": "app",
        "enable.idempotence": False,
        "acks": "1",
        "linger.ms": 0,
    }
    async with AsyncProducer(config) as producer:
        for i in range(3):
            await producer.send(TOPIC, f"r{i}".encode(), partition=0)
    assert waited(servicer.arrivals), servicer.arrivals
    assert servicer.client_ids == {"app"}


async def test_fetches_wait_out_a_throttle(broker: tuple[str, ThrottlingBroker]) -> None:
    address, servicer = broker
    cluster = ClusterMetadata(address, client_id="reader")
    try:
        request = pb.FetchRequest()
        request.topics.add(topic=TOPIC).partitions.add(partition=0, fetch_offset=0)
        for _ in range(3):
            reply = await cluster.fetch(address, request, timeout_s=5)
            assert reply.throttle_time_ms == THROTTLE_MS
    finally:
        await cluster.close()
    assert waited(servicer.arrivals), servicer.arrivals
    assert servicer.client_ids == {"reader"}
