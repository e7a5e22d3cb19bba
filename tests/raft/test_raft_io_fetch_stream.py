"""The fetching side of ``FetchStream`` against a real gRPC server on loopback: answers
matched in order, one overdue-answer timer per stream, and an overdue answer breaking
the stream so that the next fetch opens a new call."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import grpc.aio
import pytest
from highwater.internal.v1 import raft_pb2, raft_pb2_grpc
from highwater.raft.codec import RaftResponse
from highwater.raft.messages import FetchRequest, FetchResponse
from highwater.raft.transport import Transport
from highwater.v1.common_pb2 import ErrorCode

pytestmark = pytest.mark.timeout(60)

STALLED_OFFSET = 999
"""A fetch at this offset is never answered by :class:`_Leader`."""


class _Leader(raft_pb2_grpc.RaftServicer):
    """Answers each streamed fetch at once, except one at ``STALLED_OFFSET``: after it the
    stream answers nothing more (answers are in order). Counts the streams opened."""

    def __init__(self) -> None:
        self.streams = 0

    async def FetchStream(
        self, request_iterator: AsyncIterator[raft_pb2.RaftFetchRequest], context: object
    ) -> AsyncIterator[raft_pb2.RaftFetchResponse]:
        self.streams += 1
        async for request in request_iterator:
            if request.fetch_offset == STALLED_OFFSET:
                await asyncio.Event().wait()
            yield raft_pb2.RaftFetchResponse(
                error=ErrorCode.NONE,
                leader_id=1,
                leader_epoch=request.current_leader_epoch,
                high_watermark=request.fetch_offset,
            )


@pytest.fixture
async def leader() -> AsyncIterator[tuple[_Leader, str]]:
    servicer = _Leader()
    server = grpc.aio.server()
    raft_pb2_grpc.add_RaftServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield servicer, f"127.0.0.1:{port}"
    finally:
        await server.stop(grace=None)


def _fetch(offset: int, max_wait_ms: int = 0) -> FetchRequest:
    return FetchRequest(
        source=2,
        destination=1,
        cluster_id="c",
        current_leader_epoch=3,
        fetch_offset=offset,
        last_fetched_epoch=3,
        max_wait_ms=max_wait_ms,
    )


def _transport(address: str, timeout_ms: int, responses: list[RaftResponse]) -> Transport:
    """A transport to the leader at ``address`` that keeps every response it steps in."""
    return Transport(
        {1: address},
        timeout_ms=timeout_ms,
        max_message_bytes=1 << 20,
        on_response=responses.append,
        on_unreachable=lambda _: None,
    )


async def _answers(responses: list[RaftResponse], count: int) -> None:
    async with asyncio.timeout(20):
        while len(responses) < count:
            await asyncio.sleep(0.001)


async def test_many_fetches_leave_a_bounded_number_of_timers(
    leader: tuple[_Leader, str],
) -> None:
    servicer, address = leader
    responses: list[RaftResponse] = []
    transport = _transport(address, 2000, responses)
    loop = asyncio.get_running_loop()
    # asyncio keeps pending (and recently cancelled) timers in the loop's heap.
    timers_before = len(loop._scheduled)  # type: ignore[attr-defined]
    try:
        for offset in range(300):
            transport.send(_fetch(offset, max_wait_ms=500))
            await _answers(responses, offset + 1)
        timers_after = len(loop._scheduled)  # type: ignore[attr-defined]
    finally:
        await transport.close()
    assert [r.high_watermark for r in responses if isinstance(r, FetchResponse)] == list(range(300))
    assert servicer.streams == 1
    # One 2.5 s timer per fetch would leave 300 here; the stream's own is one (gRPC's
    # channel keeps a few of its own).
    assert timers_after - timers_before < 20


async def test_an_overdue_answer_breaks_the_stream_and_the_next_fetch_opens_another(
    leader: tuple[_Leader, str],
) -> None:
    servicer, address = leader
    responses: list[RaftResponse] = []
    transport = _transport(address, 300, responses)
    loop = asyncio.get_running_loop()
    try:
        # Answered fetches first, so the stalled one's deadline is watched by a timer
        # re-armed after theirs.
        for offset in range(3):
            transport.send(_fetch(offset, max_wait_ms=200))
        await _answers(responses, 3)
        stalled_at = loop.time()
        transport.send(_fetch(STALLED_OFFSET))
        async with asyncio.timeout(10):
            while servicer.streams < 2:
                transport.send(_fetch(10))  # queued behind the stalled one until it breaks
                await asyncio.sleep(0.05)
        broke_after_s = loop.time() - stalled_at
        await _answers(responses, 4)
    finally:
        await transport.close()
    assert len(responses) >= 4
    assert [r.high_watermark for r in responses[:4] if isinstance(r, FetchResponse)] == [
        0,
        1,
        2,
        10,
    ]
    # Not before the stalled fetch's deadline (300 ms), and soon after it.
    assert 0.3 <= broke_after_s < 5
