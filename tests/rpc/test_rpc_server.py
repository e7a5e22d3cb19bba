"""The process's gRPC host: its services, health and reflection on one port; a port taken
by another process is refused; readiness reported per service (NOT_SERVING until its role
says otherwise, the whole server while any service is not); and channels opened to it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import grpc.aio
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from highwater.rpc.channels import open_blocking_channel, open_channel
from highwater.rpc.server import GrpcHost, GrpcService
from highwater.v1 import broker_pb2 as pb
from highwater.v1 import broker_pb2_grpc

BROKER = pb.DESCRIPTOR.services_by_name["Broker"].full_name


class Broker(broker_pb2_grpc.BrokerServicer):
    async def Metadata(
        self, request: pb.MetadataRequest, context: grpc.aio.ServicerContext
    ) -> pb.MetadataResponse:
        return pb.MetadataResponse(cluster_id="hosted")


def broker_service() -> GrpcService:
    return GrpcService(
        BROKER, lambda server: broker_pb2_grpc.add_BrokerServicer_to_server(Broker(), server)
    )


@pytest.fixture
async def host() -> AsyncIterator[GrpcHost]:
    host = GrpcHost("127.0.0.1:0", [broker_service()], max_message_bytes=1 << 20)
    await host.start()
    try:
        yield host
    finally:
        await host.enter_graceful_shutdown()
        await host.stop(0)


async def health_of(channel: grpc.aio.Channel, service: str) -> int:
    reply = await health_pb2_grpc.HealthStub(channel).Check(
        health_pb2.HealthCheckRequest(service=service), timeout=5
    )
    return reply.status


async def settle(channel: grpc.aio.Channel, service: str, status: int) -> None:
    """Wait (briefly) for health to publish what was reported."""
    for _ in range(100):
        if await health_of(channel, service) == status:
            return
    assert await health_of(channel, service) == status


async def test_a_service_serving_at_start_needs_no_report() -> None:
    service = GrpcService(
        BROKER,
        lambda server: broker_pb2_grpc.add_BrokerServicer_to_server(Broker(), server),
        serving_at_start=True,
    )
    host = GrpcHost("127.0.0.1:0", [service], max_message_bytes=1 << 20)
    host.report_serving("highwater.test.ready", True)  # before the start: kept
    await host.start()
    try:
        async with open_channel(f"127.0.0.1:{host.port}") as channel:
            assert await health_of(channel, "") == health_pb2.HealthCheckResponse.SERVING
            assert await health_of(channel, "highwater.test.ready") == (
                health_pb2.HealthCheckResponse.SERVING
            )
    finally:
        await host.stop(0)


async def test_the_host_serves_its_services_with_health_and_reflection(host: GrpcHost) -> None:
    assert host.port > 0
    async with open_channel(f"127.0.0.1:{host.port}", max_message_bytes=1 << 20) as channel:
        reply = await broker_pb2_grpc.BrokerStub(channel).Metadata(pb.MetadataRequest(), timeout=5)
        assert reply.cluster_id == "hosted"
        # Served, but not SERVING until the role behind the service reports it can serve.
        assert await health_of(channel, "") == health_pb2.HealthCheckResponse.NOT_SERVING
        assert await health_of(channel, BROKER) == health_pb2.HealthCheckResponse.NOT_SERVING
        host.report_serving(BROKER, True)
        for _ in range(100):
            if await health_of(channel, "") == health_pb2.HealthCheckResponse.SERVING:
                break
        assert await health_of(channel, BROKER) == health_pb2.HealthCheckResponse.SERVING
        assert await health_of(channel, "") == health_pb2.HealthCheckResponse.SERVING
        replies = reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5
        )
        names = {s.name async for r in replies for s in r.list_services_response.service}
        assert names == {
            BROKER,
            "grpc.health.v1.Health",
            "grpc.reflection.v1alpha.ServerReflection",
        }


async def test_a_service_reports_its_own_readiness_until_the_host_shuts_down(
    host: GrpcHost,
) -> None:
    async with open_channel(f"127.0.0.1:{host.port}", traced=True) as channel:
        host.report_serving(BROKER, True)
        host.report_serving("highwater.test.ready", False)
        await settle(channel, "highwater.test.ready", health_pb2.HealthCheckResponse.NOT_SERVING)
        host.report_serving("highwater.test.ready", True)
        await settle(channel, "highwater.test.ready", health_pb2.HealthCheckResponse.SERVING)
        # A readiness of its own is not one of the host's services: the whole server stays
        # SERVING whatever it says.
        host.report_serving("highwater.test.ready", False)
        await settle(channel, "highwater.test.ready", health_pb2.HealthCheckResponse.NOT_SERVING)
        assert await health_of(channel, "") == health_pb2.HealthCheckResponse.SERVING
        await host.enter_graceful_shutdown()
        assert await health_of(channel, BROKER) == health_pb2.HealthCheckResponse.NOT_SERVING


async def test_a_port_in_use_is_refused_with_os_error(host: GrpcHost) -> None:
    second = GrpcHost(f"127.0.0.1:{host.port}", [broker_service()], max_message_bytes=1 << 20)
    with pytest.raises(OSError, match="cannot listen"):
        await second.start()
    with pytest.raises(RuntimeError, match="not started"):
        _ = second.port


def test_a_blocking_channel_reaches_the_same_host(host: GrpcHost) -> None:
    with open_blocking_channel(f"127.0.0.1:{host.port}") as channel:
        grpc.channel_ready_future(channel).result(timeout=5)
