"""Fetches and produce requests to one broker over long-lived streaming calls: how
consumers, followers and producers reach brokers.

A unary ``Fetch`` or ``Produce`` sets up a call for every request: on grpc.aio that costs
about twice what a request over an open stream does, client and broker together.

:class:`FetchStream` keeps ``FetchStream`` calls open and writes each fetch to one, reading
the one answer the broker writes back; fetches made at the same time use calls of their
own, each reused once answered. A fetch that fails, times out or is cancelled ends its call,
whose next answer would be out of step with the requests; the next fetch opens another.

:class:`ProduceStream` pipelines a producer's requests over one ``ProduceStream`` call, in
the order they are made, as Kafka does over a connection: the broker appends each as it
arrives, while those before it may still wait for the ISR, and answers them in order. So
the batches of a partition reach the log in the order of their sequence numbers; requests
on calls of their own could overtake one another and come back ``OUT_OF_ORDER_SEQUENCE_NUMBER``
(a retry after ``retry.backoff.ms``). A request that times out ends the call and fails the
requests still in flight on it, which the producer retries in order.

Both look like unary calls to their users: :meth:`FetchStream.fetch` and
:meth:`ProduceStream.produce` return the answer or raise ``grpc.aio.AioRpcError``
(``DEADLINE_EXCEEDED`` once the timeout passes, ``UNAVAILABLE`` when the broker ended the
call). A broker that does not serve the stream (one of an older version, during a rolling
upgrade) answers ``UNIMPLEMENTED``: from then on the requests are unary calls.

A call made with a SASL session ends ``UNAUTHENTICATED`` when the session expires
(``rpc/auth.py``): the broker has answered every request it read and read none after.
Both then send the requests the ended call left unanswered again on a new call (whose
channel has authenticated again by then, ``rpc/client_auth.py``), so a session's expiry
fails no request.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Final

import grpc
import grpc.aio

from highwater.security.authentication import SESSION_EXPIRED
from highwater.v1 import broker_pb2 as pb
from highwater.v1 import broker_pb2_grpc

__all__ = [
    "CLIENT_ID_METADATA_KEY",
    "Expiry",
    "FetchStream",
    "ProduceStream",
    "session_expired",
]

CLIENT_ID_METADATA_KEY: Final = "client-id"
"""The call metadata that carries a client's ``client.id`` (Kafka's request header field),
which brokers' client quotas count by."""


class FetchStream:
    """The fetches to the broker behind ``stub``; ``metadata`` goes with every call (the
    client's ``client-id``)."""

    def __init__(
        self, stub: broker_pb2_grpc.BrokerStub, metadata: tuple[tuple[str, str], ...] = ()
    ) -> None:
        self._stub = stub
        self._metadata = metadata or None
        self._idle: list[grpc.aio.StreamStreamCall[pb.FetchRequest, pb.FetchResponse]] = []
        self._unary = False
        self._closed = False
        self.calls_opened = 0
        """How many ``FetchStream`` calls were opened (one per fetch under way at once,
        while nothing fails)."""

    @property
    def is_unary(self) -> bool:
        """Whether the broker turned the stream down, so that fetches are unary calls."""
        return self._unary

    async def fetch(self, request: pb.FetchRequest, timeout_s: float) -> pb.FetchResponse:
        """``request`` answered by the broker within ``timeout_s`` seconds."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            try:
                return await self._fetch(request, timeout_s)
            except grpc.aio.AioRpcError as e:
                timeout_s = deadline - loop.time()
                if not session_expired(e) or timeout_s <= 0:
                    raise

    async def _fetch(self, request: pb.FetchRequest, timeout_s: float) -> pb.FetchResponse:
        if self._unary:
            return await self._stub.Fetch(request, timeout=timeout_s, metadata=self._metadata)
        call = self._idle.pop() if self._idle else None
        if call is None or call.done():  # none yet, or the broker ended it (it stopped)
            call = self._stub.FetchStream(metadata=self._metadata)
            self.calls_opened += 1
        # The deadline is a bare timer that cancels this task, as ``asyncio.timeout`` does
        # but without its context manager's two coroutines and object per fetch: about 4 µs
        # of a follower's CPU per fetch of the 6 that ``asyncio.timeout`` cost on uvloop
        # (docs/broker.md, "The tail"). A cancellation of our own becomes DEADLINE_EXCEEDED;
        # one from outside (or both at once) stays a cancellation, as with asyncio.timeout.
        expiry = Expiry(timeout_s)
        try:
            try:
                await call.write(request)
                reply = await call.read()
            finally:
                expiry.disarm()  # before any await below, which it would cancel
        except asyncio.CancelledError:
            call.cancel()  # the answer, if any, would come to the next fetch
            if expiry.expired():
                raise _rpc_error(grpc.StatusCode.DEADLINE_EXCEEDED, "the fetch timed out") from None
            raise
        except (grpc.aio.UsageError, asyncio.InvalidStateError) as e:  # the call had ended
            call.cancel()
            if call.done() and await _ended_by_expiry(call):
                raise _rpc_error(grpc.StatusCode.UNAUTHENTICATED, SESSION_EXPIRED) from e
            raise _rpc_error(grpc.StatusCode.UNAVAILABLE, str(e)) from e
        except grpc.aio.AioRpcError as e:
            call.cancel()
            if e.code() != grpc.StatusCode.UNIMPLEMENTED:
                raise
            self._unary = True
            return await self._stub.Fetch(request, timeout=timeout_s, metadata=self._metadata)
        except BaseException:
            call.cancel()
            raise
        if reply is grpc.aio.EOF:
            if await _ended_by_expiry(call):
                raise _rpc_error(grpc.StatusCode.UNAUTHENTICATED, SESSION_EXPIRED)
            raise _rpc_error(grpc.StatusCode.UNAVAILABLE, "the broker ended the fetch stream")
        if self._closed:
            call.cancel()
        else:
            self._idle.append(call)
        return reply

    def close(self) -> None:
        """End the calls kept open; fetches still under way end their own calls."""
        self._closed = True
        for call in self._idle:
            call.cancel()
        self._idle.clear()


class Expiry:
    """A request's deadline on a stream (a fetch, a produce request, a follower's
    ``ReplicaFetch``), as ``asyncio.timeout`` but without its context manager's coroutines
    and object: a bare timer handle that cancels the current task when it fires.

    Made on entry (armed for ``timeout_s``), :meth:`disarm` in a ``finally`` before any
    other await; on a ``CancelledError``, :meth:`expired` says whether this deadline caused
    it and, if so, takes its cancellation back (``task.uncancel()``), so that the caller
    raises its timeout error; a cancellation from outside (or both at once) stays one.
    """

    __slots__ = ("_cancelling", "_timer", "fired", "task")

    def __init__(self, timeout_s: float) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.task = task
        self.fired = False
        self._cancelling = task.cancelling()
        self._timer = task.get_loop().call_later(timeout_s, self._fire)

    def _fire(self) -> None:
        self.fired = True
        self.task.cancel()

    def disarm(self) -> None:
        """The request ended (answered, failed or cancelled): the timer will not fire."""
        self._timer.cancel()

    def expired(self) -> bool:
        """After a ``CancelledError``: True if this deadline fired and its cancellation was
        the only one (taken back now); False for a cancellation from outside."""
        return self.fired and self.task.uncancel() <= self._cancelling


class ProduceStream:
    """The produce requests to the broker behind ``stub``, pipelined over one call;
    ``metadata`` goes with every call (the client's ``client-id``)."""

    def __init__(
        self, stub: broker_pb2_grpc.BrokerStub, metadata: tuple[tuple[str, str], ...] = ()
    ) -> None:
        self._stub = stub
        self._metadata = metadata or None
        self._pipeline: _Pipeline | None = None
        self._write_lock = asyncio.Lock()
        self._unary = False
        self._closed = False
        self.calls_opened = 0
        """How many ``ProduceStream`` calls were opened (one, while nothing fails)."""

    @property
    def is_unary(self) -> bool:
        """Whether the broker turned the stream down, so that requests are unary calls."""
        return self._unary

    async def produce(self, request: pb.ProduceRequest, timeout_s: float) -> pb.ProduceResponse:
        """``request`` answered by the broker within ``timeout_s`` seconds; requests are
        written in the order of the calls."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            try:
                return await self._produce(request, timeout_s)
            except grpc.aio.AioRpcError as e:
                timeout_s = deadline - loop.time()
                if not session_expired(e) or timeout_s <= 0:
                    raise

    async def _produce(self, request: pb.ProduceRequest, timeout_s: float) -> pb.ProduceResponse:
        if self._unary or self._closed:
            return await self._stub.Produce(request, timeout=timeout_s, metadata=self._metadata)
        answer: asyncio.Future[pb.ProduceResponse] = asyncio.get_running_loop().create_future()
        pipeline: _Pipeline | None = None
        # The deadline is the bare timer of FetchStream's fetches (Expiry), not an
        # asyncio.timeout: the same rules, about 4 µs less per request.
        expiry = Expiry(timeout_s)
        try:
            try:
                async with self._write_lock:
                    pipeline = self._pipeline
                    if pipeline is None or pipeline.ended:
                        pipeline = self._pipeline = _Pipeline(
                            self._stub.ProduceStream(metadata=self._metadata)
                        )
                        self.calls_opened += 1
                    pipeline.pending.append(answer)
                    await pipeline.write(request)
                return await answer
            finally:
                expiry.disarm()
        except asyncio.CancelledError:
            if not expiry.expired():
                raise
            error = _rpc_error(grpc.StatusCode.DEADLINE_EXCEEDED, "the produce request timed out")
            if pipeline is not None:  # the answers after it would wait behind it
                pipeline.end(error)
            raise error from None
        except grpc.aio.AioRpcError as e:
            if e.code() != grpc.StatusCode.UNIMPLEMENTED:
                raise
            self._unary = True
            return await self._stub.Produce(request, timeout=timeout_s, metadata=self._metadata)

    def close(self) -> None:
        """End the call; the requests still in flight on it fail as ``CANCELLED``."""
        self._closed = True
        if self._pipeline is not None:
            self._pipeline.end(_rpc_error(grpc.StatusCode.CANCELLED, "the producer closed"))


class _Pipeline:
    """One ``ProduceStream`` call: requests written in order, answers matched in order."""

    def __init__(self, call: grpc.aio.StreamStreamCall[pb.ProduceRequest, pb.ProduceResponse]):
        self.call = call
        self.pending: deque[asyncio.Future[pb.ProduceResponse]] = deque()
        self.ended = False
        self._reader = asyncio.create_task(self._read())

    async def write(self, request: pb.ProduceRequest) -> None:
        try:
            await self.call.write(request)
        except grpc.aio.AioRpcError as e:
            self.end(e)
        except (grpc.aio.UsageError, asyncio.InvalidStateError) as e:  # the call had ended
            if self.call.done() and await _ended_by_expiry(self.call):
                self.end(_rpc_error(grpc.StatusCode.UNAUTHENTICATED, SESSION_EXPIRED))
            else:
                self.end(_rpc_error(grpc.StatusCode.UNAVAILABLE, str(e)))

    async def _read(self) -> None:
        """Hand each answer to the oldest request waiting; fail them all once the call ends."""
        error: grpc.aio.AioRpcError
        try:
            while True:
                reply = await self.call.read()
                if reply is grpc.aio.EOF or not self.pending:
                    error = _rpc_error(grpc.StatusCode.UNAVAILABLE, "the broker ended the stream")
                    break
                answer = self.pending.popleft()
                if not answer.done():  # its caller may have given up waiting
                    answer.set_result(reply)
        except grpc.aio.AioRpcError as e:
            error = e
        except (grpc.aio.UsageError, asyncio.InvalidStateError) as e:
            error = _rpc_error(grpc.StatusCode.UNAVAILABLE, str(e))
        except asyncio.CancelledError:
            error = _rpc_error(grpc.StatusCode.CANCELLED, "the produce stream was closed")
        self.end(error)

    def end(self, error: grpc.aio.AioRpcError) -> None:
        """End the call: every request still waiting fails with ``error``."""
        self.ended = True
        self.call.cancel()
        while self.pending:
            answer = self.pending.popleft()
            if not answer.done():
                answer.set_exception(error)


def session_expired(error: grpc.aio.AioRpcError) -> bool:
    """Whether ``error`` ended a call because its SASL session expired (``rpc/auth.py``):
    its unanswered requests were not read, and may be sent again on a new call."""
    return error.code() == grpc.StatusCode.UNAUTHENTICATED and error.details() == SESSION_EXPIRED


async def _ended_by_expiry(call: grpc.aio.Call) -> bool:
    try:
        return (await call.code() == grpc.StatusCode.UNAUTHENTICATED) and (
            await call.details() == SESSION_EXPIRED
        )
    except asyncio.CancelledError:
        raise
    except Exception:  # the call's outcome is unknown: not an expiry
        return False


def _rpc_error(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    """The error a unary call would have raised."""
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details)
