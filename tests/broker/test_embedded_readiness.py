"""Health of the embedded server: NOT_SERVING until each service can serve what it
promises, so that a client that waits for SERVING can use the cluster at once.

Before, grpc.health.v1 said SERVING as soon as the port was open, before the broker had
registered: a CreateTopics right after answered INVALID_REPLICATION_FACTOR ("0 broker(s)
are registered"), and ``highwater.broker.ready`` did not exist on the embedded server.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc.aio
import pytest
from embedded_servers import free_port
from grpc_health.v1 import health_pb2, health_pb2_grpc
from highwater.embedded import EmbeddedServer
from highwater.v1 import admin_pb2, broker_pb2_grpc
from highwater.v1.common_pb2 import ErrorCode

pytestmark = pytest.mark.timeout(60)

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
SERVICES = (
    "",
    "highwater.v1.Raft",
    "highwater.v1.Controller",
    "highwater.internal.v1.Raft",
    "highwater.internal.v1.Controller",
    "highwater.v1.Broker",
    "highwater.v1.GroupCoordinator",
    "highwater.broker.ready",
)


async def test_serving_means_ready_for_requests(tmp_path: Path) -> None:
    address = f"127.0.0.1:{free_port()}"
    server = EmbeddedServer(listen=address, data_dir=tmp_path)
    # The broker and the coordinator report nothing until they have started: the whole
    # server stays NOT_SERVING while the controller's port is already open.
    await server.controller.start()
    try:
        async with grpc.aio.insecure_channel(address) as channel:
            health = health_pb2_grpc.HealthStub(channel)

            async def status(service: str) -> int:
                answer = await health.Check(health_pb2.HealthCheckRequest(service=service))
                return int(answer.status)

            assert await status("highwater.v1.Raft") == SERVING
            assert await status("highwater.v1.Broker") == NOT_SERVING
            assert await status("") == NOT_SERVING

            await server.broker.start()
            await server.coordinator.start()
            for _ in range(500):
                if await status("") == SERVING:
                    break
                await asyncio.sleep(0.01)
            assert [await status(s) for s in SERVICES] == [SERVING] * len(SERVICES)

            # SERVING: a topic can be created at once, with the cluster's defaults.
            created = await broker_pb2_grpc.BrokerStub(channel).CreateTopics(
                admin_pb2.CreateTopicsRequest(topics=[admin_pb2.CreatableTopic(name="t")])
            )
            assert (created.error, created.topics[0].error) == (ErrorCode.NONE, ErrorCode.NONE)

            # A controlled shutdown takes the broker out of service first.
            await server.coordinator.stop()
            await server.broker.stop()
            for _ in range(500):
                if await status("highwater.v1.Broker") == NOT_SERVING:
                    break
                await asyncio.sleep(0.01)
            assert await status("highwater.v1.Broker") == NOT_SERVING
            assert await status("highwater.v1.GroupCoordinator") == NOT_SERVING
            assert await status("") == NOT_SERVING
    finally:
        await server.stop()
