"""The follower's gRPC transport (``GrpcFetchTransport``) against a leader that answers
one fetch and then falls silent: a fetch past its deadline fails as a timeout, the task's
own cancellation taken back, and a fetch cancelled from outside stays cancelled."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc.aio
import pytest
from highwater.broker.replica_fetcher import GrpcFetchTransport, ReplicaFetchError
from highwater.internal.v1 import replication_pb2 as rpb
from highwater.internal.v1 import replication_pb2_grpc


class SilentAfterFirst(replication_pb2_grpc.ReplicaFetchServiceServicer):
    """Answers each stream's first fetch; never the ones after it."""

    async def ReplicaFetch(
        self,
        request_iterator: AsyncIterator[rpb.ReplicaFetchRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[rpb.ReplicaFetchResponse]:
        answered = False
        async for request in request_iterator:
            if not answered:
                answered = True
                yield rpb.ReplicaFetchResponse(session_id=request.replica_id)


@pytest.fixture
async def transport() -> AsyncIterator[GrpcFetchTransport]:
    server = grpc.aio.server()
    replication_pb2_grpc.add_ReplicaFetchServiceServicer_to_server(SilentAfterFirst(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    fetches = GrpcFetchTransport(f"127.0.0.1:{port}")
    try:
        yield fetches
    finally:
        await fetches.close()
        await server.stop(None)


async def test_a_fetch_past_its_deadline_times_out_and_takes_its_cancel_back(
    transport: GrpcFetchTransport,
) -> None:
    assert (await transport.fetch(rpb.ReplicaFetchRequest(replica_id=7), 5)).session_id == 7
    with pytest.raises(ReplicaFetchError, match="timed out"):
        await transport.fetch(rpb.ReplicaFetchRequest(replica_id=8), 0.05)
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0
    # The call ended with the timeout: the next fetch opens another and is answered.
    assert (await transport.fetch(rpb.ReplicaFetchRequest(replica_id=9), 5)).session_id == 9


async def test_a_fetch_cancelled_from_outside_stays_cancelled(
    transport: GrpcFetchTransport,
) -> None:
    await transport.fetch(rpb.ReplicaFetchRequest(replica_id=7), 5)
    waiting = asyncio.create_task(transport.fetch(rpb.ReplicaFetchRequest(replica_id=8), 5))
    await asyncio.sleep(0.05)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
