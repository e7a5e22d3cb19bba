"""Requests that do not decode are answered INVALID_ARGUMENT by every server of the package
(``rpc/undecodable.py``), of each kind of method, over a real server from ``new_server``:
gRPC alone answered them UNKNOWN, with its own exception in the log. On a stream of
requests, the ones read before the undecodable one are answered first."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import grpc.aio
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from highwater.internal.v1 import replication_pb2 as rpb
from highwater.internal.v1 import replication_pb2_grpc
from highwater.rpc.server import new_server

pytestmark = pytest.mark.timeout(30)

GARBAGE = b"\xff\xff\xff"  # a field tag whose varint never ends
HEALTH = "/grpc.health.v1.Health/"
REPLICA_FETCH = "/highwater.internal.v1.ReplicaFetchService/ReplicaFetch"


class Echo(replication_pb2_grpc.ReplicaFetchServiceServicer):
    """Answers each request of the stream with its replica id; notes what it read."""

    def __init__(self) -> None:
        self.read: list[int] = []

    async def ReplicaFetch(self, request_iterator, context):  # type: ignore[no-untyped-def]
        async for request in request_iterator:
            self.read.append(request.replica_id)
            yield rpb.ReplicaFetchResponse(session_id=request.replica_id)


@pytest.fixture
async def server() -> AsyncIterator[tuple[str, Echo]]:
    server = new_server(max_message_bytes=1 << 20)
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
    echo = Echo()
    replication_pb2_grpc.add_ReplicaFetchServiceServicer_to_server(echo, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}", echo
    finally:
        await server.stop(None)


async def test_a_request_that_does_not_decode_is_an_invalid_argument(
    server: tuple[str, Echo], caplog: pytest.LogCaptureFixture
) -> None:
    address, _ = server
    async with grpc.aio.insecure_channel(address) as channel:
        # One request, one answer; one request, a stream of answers.
        for call in (
            channel.unary_unary(HEALTH + "Check")(GARBAGE),
            anext(aiter(channel.unary_stream(HEALTH + "Watch")(GARBAGE))),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await call
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "does not decode" in (refused.value.details() or "")
        # The well-formed request is served as ever.
        check = channel.unary_unary(
            HEALTH + "Check",
            request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
            response_deserializer=health_pb2.HealthCheckResponse.FromString,
        )
        answer = await check(health_pb2.HealthCheckRequest())
        assert answer.status == health_pb2.HealthCheckResponse.SERVING
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any(f"refused a request to {HEALTH}Check that does not decode" in w for w in warnings)
    assert not [r for r in caplog.records if r.levelname == "ERROR"]


async def test_on_a_stream_the_requests_before_the_undecodable_one_are_answered(
    server: tuple[str, Echo],
) -> None:
    address, echo = server
    async with grpc.aio.insecure_channel(address) as channel:
        stream = channel.stream_stream(REPLICA_FETCH)()  # raw bytes both ways
        await stream.write(rpb.ReplicaFetchRequest(replica_id=7).SerializeToString())
        first = rpb.ReplicaFetchResponse.FromString(await stream.read())
        assert first.session_id == 7
        await stream.write(GARBAGE)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            async with asyncio.timeout(10):
                await stream.read()
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "does not decode" in (refused.value.details() or "")
        assert echo.read == [7]
