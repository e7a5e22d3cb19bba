"""The Raft service on the network: requests from peers stepped in, the node's requests sent out.

Inbound, :class:`RaftServicer` serves ``highwater.internal.v1.Raft``: each request is handed to the
driver (:meth:`RaftRequestHandler.serve`), which converts it to the core's message, steps
it into the node and waits in :class:`InboundCalls` for the response the node emits for
it (matched by the request's source and type; a long-poll fetch waits until the node
answers it; a newer request of the same type from the same replica supersedes it).

Outbound, :class:`Transport` keeps one channel per peer voter: the node's requests are
sent and their replies handed back (a timeout hands back nothing: the node's own timers
retry; a peer that refuses the connection is reported as unreachable, so that the node
stops waiting for a leader that is gone). Fetches go over one ``FetchStream`` call per
peer: a message on an open stream costs a fraction of a unary call's set-up, and a fetch
round trip is on the path of every commit.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, Final, Protocol

import grpc
import grpc.aio

from highwater.internal.v1 import raft_pb2, raft_pb2_grpc
from highwater.raft.codec import (
    RESPONSE_FOR,
    ProtoRequest,
    ProtoResponse,
    RaftRequest,
    RaftResponse,
    request_to_proto,
    response_from_proto,
)
from highwater.raft.messages import (
    BeginQuorumEpochRequest,
    EndQuorumEpochRequest,
    FetchRequest,
    FetchSnapshotRequest,
    VoteRequest,
)
from highwater.rpc.channels import open_channel

__all__ = [
    "RAFT_HEALTH_ALIASES",
    "RAFT_SERVICE_NAME",
    "InboundCalls",
    "RaftRequestHandler",
    "RaftServicer",
    "Superseded",
    "Transport",
    "abort",
    "expire",
]

log = logging.getLogger(__name__)

RAFT_SERVICE_NAME: Final = raft_pb2.DESCRIPTOR.services_by_name["Raft"].full_name
RAFT_HEALTH_ALIASES: Final = ("highwater.v1.Raft",)
"""The Raft service's name before it moved to ``highwater.internal.v1``: liveness probes
ask health for it."""


# --- inbound calls: requests waiting for the node's answer ----------------------------------


class Superseded(Exception):
    """A newer request of the same type from the same replica replaced this one."""


_REQUEST_FOR: dict[type, type] = {response: request for request, response in RESPONSE_FOR.items()}
_RequestKey = tuple[int, type]


class InboundCalls:
    """Requests being served, keyed by (source, request type), waiting for their response."""

    def __init__(self) -> None:
        self._waiting: dict[_RequestKey, asyncio.Future[RaftResponse]] = {}

    def expect(self, request: RaftRequest) -> asyncio.Future[RaftResponse]:
        key = (request.source, type(request))
        previous = self._waiting.get(key)
        if previous is not None and not previous.done():
            previous.set_exception(Superseded())
        future: asyncio.Future[RaftResponse] = asyncio.get_running_loop().create_future()
        self._waiting[key] = future
        return future

    def forget(self, request: RaftRequest, future: asyncio.Future[RaftResponse]) -> None:
        key = (request.source, type(request))
        if self._waiting.get(key) is future:
            del self._waiting[key]

    def complete(self, response: RaftResponse) -> bool:
        key = (response.destination, _REQUEST_FOR[type(response)])
        future = self._waiting.pop(key, None)
        if future is None or future.done():
            return False
        future.set_result(response)
        return True

    def fail_all(self) -> None:
        for future in self._waiting.values():
            if not future.done():
                future.set_exception(Superseded())
        self._waiting.clear()


# --- outbound: the node's requests to its peers ----------------------------------------------


class Transport:
    """One channel per peer; sends a request and hands the reply to ``on_response``."""

    def __init__(
        self,
        peers: Mapping[int, str],
        *,
        timeout_ms: int,
        max_message_bytes: int,
        on_response: Callable[[RaftResponse], None],
        on_unreachable: Callable[[int], None],
    ) -> None:
        self._peers = dict(peers)
        self._on_unreachable = on_unreachable
        self._timeout_s = timeout_ms / 1000
        self._max_message_bytes = max_message_bytes
        self._on_response = on_response
        self._channels: dict[int, grpc.aio.Channel] = {}
        self._stubs: dict[int, raft_pb2_grpc.RaftStub] = {}
        self._fetch_streams: dict[int, _PeerFetchStream] = {}
        self._in_flight: set[asyncio.Task[None]] = set()

    def set_peers(self, peers: Mapping[int, str]) -> None:
        """Use these addresses from now on (a dynamic quorum's voter set changed): the
        channel of a peer that moved or left is closed."""
        for node_id in list(self._channels):
            if peers.get(node_id) != self._peers.get(node_id):
                stream = self._fetch_streams.pop(node_id, None)
                if stream is not None:
                    stream.close()
                self._stubs.pop(node_id, None)
                channel = self._channels.pop(node_id)
                task = asyncio.create_task(channel.close(grace=None))
                self._in_flight.add(task)
                task.add_done_callback(self._in_flight.discard)
        self._peers = dict(peers)

    def send(self, request: RaftRequest) -> None:
        stub = self._stub(request.destination)
        if stub is None:
            log.warning("no address for node %d: dropping %r", request.destination, request)
            return
        if isinstance(request, FetchRequest):
            stream = self._fetch_streams.get(request.destination)
            if stream is None:
                stream = self._fetch_streams[request.destination] = _PeerFetchStream(
                    stub,
                    timeout_s=self._timeout_s,
                    on_response=self._on_response,
                    on_unreachable=self._on_unreachable,
                )
            stream.send(request)
            return
        task = asyncio.create_task(self._call(stub, request))
        self._in_flight.add(task)
        task.add_done_callback(self._in_flight.discard)

    def _stub(self, node_id: int) -> raft_pb2_grpc.RaftStub | None:
        stub = self._stubs.get(node_id)
        if stub is None:
            address = self._peers.get(node_id)
            if address is None:
                return None
            channel = open_channel(address, max_message_bytes=self._max_message_bytes)
            self._channels[node_id] = channel
            stub = self._stubs[node_id] = raft_pb2_grpc.RaftStub(channel)
        return stub

    async def _call(self, stub: raft_pb2_grpc.RaftStub, request: RaftRequest) -> None:
        wire = request_to_proto(request)
        method: Any
        match request:
            case VoteRequest():
                method = stub.Vote
            case BeginQuorumEpochRequest():
                method = stub.BeginQuorumEpoch
            case EndQuorumEpochRequest():
                method = stub.EndQuorumEpoch
            case FetchRequest():
                method = stub.Fetch
            case FetchSnapshotRequest():
                method = stub.FetchSnapshot
        timeout_s = self._timeout_s
        if isinstance(request, FetchRequest):
            timeout_s += request.max_wait_ms / 1000
        try:
            reply: ProtoResponse = await method(wire, timeout=timeout_s)
        except grpc.aio.AioRpcError as e:
            log.debug(
                "%s to node %d failed: %s", type(request).__name__, request.destination, e.code()
            )
            if e.code() == grpc.StatusCode.UNAVAILABLE:
                # Refused or reset: the peer's process is gone (a slow peer times out).
                self._on_unreachable(request.destination)
            return
        self._on_response(response_from_proto(reply, request))

    async def wait_idle(self, timeout_s: float) -> None:
        """Wait (at most ``timeout_s``) for the calls in flight to finish."""
        if self._in_flight:
            await asyncio.wait(set(self._in_flight), timeout=timeout_s)

    async def close(self) -> None:
        for stream in self._fetch_streams.values():
            stream.close()
        self._fetch_streams.clear()
        for task in list(self._in_flight):
            task.cancel()
        if self._in_flight:
            await asyncio.wait(set(self._in_flight), timeout=1)
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()
        self._stubs.clear()


class _PeerFetchStream:
    """The fetches to one peer over one ``FetchStream`` call: a writer task writes them in
    order, a reader task hands each response to the request it answers (the oldest
    waiting). An error, the peer ending the call or an overdue answer breaks the stream:
    the requests waiting are dropped (the node's timers fetch again) and the next fetch
    opens a new call.

    Overdue answers are watched by one timer per stream, not one per fetch: a fetch arms
    it at its deadline when none is pending (or the pending one is later), and when it fires it
    breaks the stream if a request still waiting is overdue, else re-arms at the
    earliest deadline of those now waiting (if any). A stream whose fetches are answered in time
    schedules one timer per timeout, whatever the number of fetches."""

    def __init__(
        self,
        stub: raft_pb2_grpc.RaftStub,
        *,
        timeout_s: float,
        on_response: Callable[[RaftResponse], None],
        on_unreachable: Callable[[int], None],
    ) -> None:
        self._stub = stub
        self._timeout_s = timeout_s
        self._on_response = on_response
        self._on_unreachable = on_unreachable
        self._call: Any = None
        self._tasks: list[asyncio.Task[None]] = []
        self._outbox: asyncio.Queue[FetchRequest] = asyncio.Queue()
        # Each waiting request with its answer's deadline (the loop's clock).
        self._waiting: collections.deque[tuple[FetchRequest, float]] = collections.deque()
        self._deadline_timer: asyncio.TimerHandle | None = None

    def send(self, request: FetchRequest) -> None:
        if self._call is None:
            call = self._call = self._stub.FetchStream()
            self._tasks = [
                asyncio.create_task(self._write(call)),
                asyncio.create_task(self._read(call)),
            ]
        self._outbox.put_nowait(request)

    async def _write(self, call: Any) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                request = await self._outbox.get()
                deadline = loop.time() + self._timeout_s + request.max_wait_ms / 1000
                self._waiting.append((request, deadline))
                timer = self._deadline_timer
                if timer is None or deadline < timer.when():
                    if timer is not None:
                        timer.cancel()  # a shorter max_wait_ms than a waiting long poll's
                    self._deadline_timer = loop.call_at(deadline, self._check_answered, call)
                await call.write(request_to_proto(request))
        except (grpc.aio.AioRpcError, grpc.aio.UsageError) as e:
            self._break(call, e)

    async def _read(self, call: Any) -> None:
        try:
            while True:
                reply = await call.read()
                if reply is grpc.aio.EOF or not self._waiting:
                    self._break(call, None)
                    return
                request, _ = self._waiting.popleft()
                self._on_response(response_from_proto(reply, request))
        except grpc.aio.AioRpcError as e:
            self._break(call, e)

    def _check_answered(self, call: Any) -> None:
        """The deadline timer fired: break the stream if a waiting request is overdue,
        else re-arm at the earliest deadline of those waiting (none waiting: unarmed)."""
        self._deadline_timer = None
        if call is not self._call or not self._waiting:
            return
        # Deadlines need not be in the order sent (max_wait_ms differs): the earliest.
        loop = asyncio.get_running_loop()
        now = loop.time()
        next_deadline = min(deadline for _, deadline in self._waiting)
        if next_deadline <= now:
            self._break(call, None)
        else:
            self._deadline_timer = loop.call_at(next_deadline, self._check_answered, call)

    def _break(self, call: Any, error: grpc.aio.AioRpcError | None) -> None:
        if call is not self._call:
            return
        destination = self._waiting[0][0].destination if self._waiting else None
        self._call = None
        self._waiting.clear()
        if self._deadline_timer is not None:
            self._deadline_timer.cancel()
            self._deadline_timer = None
        while not self._outbox.empty():
            self._outbox.get_nowait()
        call.cancel()
        for task in self._tasks:
            if task is not asyncio.current_task():
                task.cancel()
        if (
            error is not None
            and error.code() == grpc.StatusCode.UNAVAILABLE
            and destination is not None
        ):
            self._on_unreachable(destination)

    def close(self) -> None:
        if self._call is not None:
            self._break(self._call, None)


# --- the gRPC service ---------------------------------------------------------------------


class RaftRequestHandler(Protocol):
    """What the servicer hands requests to: the driver, which steps them into the node."""

    async def serve(
        self, wire: ProtoRequest, context: grpc.aio.ServicerContext, *, timed: bool = True
    ) -> ProtoResponse:
        """Step a request into the node and wait for the node's answer to it (``timed``:
        for no longer than the request's timeout)."""
        ...

    def describe_quorum_response(self) -> raft_pb2.DescribeQuorumResponse:
        """DescribeQuorum's answer, as the node describes the quorum now."""
        ...


class RaftServicer(raft_pb2_grpc.RaftServicer):
    """``highwater.internal.v1.Raft``: steps each request into the node and returns its answer."""

    def __init__(self, server: RaftRequestHandler) -> None:
        self._server = server

    async def Vote(
        self, request: raft_pb2.VoteRequest, context: grpc.aio.ServicerContext
    ) -> raft_pb2.VoteResponse:
        return await self._server.serve(request, context)  # type: ignore[return-value]

    async def BeginQuorumEpoch(
        self, request: raft_pb2.BeginQuorumEpochRequest, context: grpc.aio.ServicerContext
    ) -> raft_pb2.BeginQuorumEpochResponse:
        return await self._server.serve(request, context)  # type: ignore[return-value]

    async def EndQuorumEpoch(
        self, request: raft_pb2.EndQuorumEpochRequest, context: grpc.aio.ServicerContext
    ) -> raft_pb2.EndQuorumEpochResponse:
        return await self._server.serve(request, context)  # type: ignore[return-value]

    async def Fetch(
        self, request: raft_pb2.RaftFetchRequest, context: grpc.aio.ServicerContext
    ) -> raft_pb2.RaftFetchResponse:
        return await self._server.serve(request, context)  # type: ignore[return-value]

    async def FetchStream(
        self,
        request_iterator: AsyncIterator[raft_pb2.RaftFetchRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[raft_pb2.RaftFetchResponse]:
        # Untimed: the fetching replica breaks the stream if an answer is overdue
        # (``_PeerFetchStream``), which cancels the wait here; a timer per message would
        # cost a loop timer scheduled and cancelled on the path of every commit.
        async for request in request_iterator:
            yield await self._server.serve(request, context, timed=False)  # type: ignore[misc]

    async def FetchSnapshot(
        self, request: raft_pb2.FetchSnapshotRequest, context: grpc.aio.ServicerContext
    ) -> raft_pb2.FetchSnapshotResponse:
        return await self._server.serve(request, context)  # type: ignore[return-value]

    async def DescribeQuorum(
        self, request: raft_pb2.DescribeQuorumRequest, context: grpc.aio.ServicerContext
    ) -> raft_pb2.DescribeQuorumResponse:
        return self._server.describe_quorum_response()


async def abort(context: grpc.aio.ServicerContext, code: grpc.StatusCode, details: str) -> Any:
    """End the call with a gRPC status (``abort`` raises; this never returns)."""
    await context.abort(code, details)
    raise AssertionError("unreachable: abort raises")


def expire(future: asyncio.Future[RaftResponse]) -> None:
    """Fail a request still waiting for the node's answer with :class:`TimeoutError`."""
    if not future.done():
        future.set_exception(TimeoutError())
