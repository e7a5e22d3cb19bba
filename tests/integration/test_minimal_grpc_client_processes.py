"""The minimal client of tests/support/minimal_grpc_client.py against a standalone broker
process, whose admin calls go to a controller in another process.

The embedded server answers admin calls with its own controller; here the broker forwards
each of them over the network to the active controller, which is what a client of a real
cluster sees. The client sets only each request's required fields, on stubs generated from
the protos at test time.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import grpc.aio
import pytest
from broker_processes import ProcessCluster, process_cluster
from grpc_health.v1 import health_pb2, health_pb2_grpc
from highwater.v1.common_pb2 import ErrorCode
from proto_stubs import generate_stubs, run_minimal_client

pytestmark = pytest.mark.timeout(150)

BROKER = 2  # the controller is node 1


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[ProcessCluster]:
    cluster = process_cluster(tmp_path, (BROKER,))
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.kill()


async def test_a_standalone_broker_serves_a_minimal_client_and_forwards_its_admin_calls(
    cluster: ProcessCluster, tmp_path: Path
) -> None:
    stubs = generate_stubs(tmp_path / "stubs")
    address = cluster.brokers[BROKER].address
    # As a client would: wait for the broker's health to say SERVING (registered and
    # unfenced), then go; no request of the client is retried.
    async with grpc.aio.insecure_channel(address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        async with asyncio.timeout(60):
            while True:
                answer = await health.Check(
                    health_pb2.HealthCheckRequest(), wait_for_ready=True, timeout=60
                )
                if answer.status == health_pb2.HealthCheckResponse.SERVING:
                    break
                await asyncio.sleep(0.1)
    answers = await run_minimal_client(stubs, address, "forwarded")
    assert answers["create_topics"]["topic_error"] == ErrorCode.NONE
    assert answers["produce"] == {"error": ErrorCode.NONE, "base_offset": 0}
    fetch = answers["fetch"]
    assert (fetch["error"], fetch["high_watermark"]) == (ErrorCode.NONE, 2)
    assert answers["list_offsets_latest"] == {"error": ErrorCode.NONE, "offset": 2}
    assert answers["init_producer_id"]["producer_epoch"] == 0
    assert answers["describe_configs"]["values"] == {"cleanup.policy": "delete"}
    assert answers["delete_topics"] == {"error": ErrorCode.NONE, "topic_error": ErrorCode.NONE}
