"""Fetches and produce requests to one broker over long-lived streaming calls: how
consumers, followers and producers reach brokers.

A unary ``Fetch`` or ``Produce`` sets up a call for every request: on grpc.aio that costs
about twice what a request over an open stream does, client and broker together.
:class:`FetchStream` and :class:`ProduceStream` keep ``FetchStream`` and ``ProduceStream``
calls open instead and write each request to one, reading the one answer the broker writes
back (the broker answers a stream's requests one at a time, in order). They look like
unary calls to their users: :meth:`FetchStream.fetch` and :meth:`ProduceStream.produce`
return the answer or raise ``grpc.aio.AioRpcError`` (``DEADLINE_EXCEEDED`` once the timeout
passes, ``UNAVAILABLE`` when the broker ended the call).

A request that fails, times out or is cancelled ends its call, whose next answer would be
out of step with the requests; the next request opens another. Requests made at the same
time (a producer's requests in flight) use calls of their own, each reused once answered.
A broker that does not serve the stream (one of an older version, during a rolling
upgrade) answers ``UNIMPLEMENTED``: from then on the requests are unary calls.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

import grpc
import grpc.aio

from highwater.v1 import broker_pb2 as pb
from highwater.v1 import broker_pb2_grpc

__all__ = ["FetchStream", "ProduceStream"]

_Request = TypeVar("_Request")
_Response = TypeVar("_Response")


class _RequestStream(Generic[_Request, _Response]):
    """Requests of one kind to one broker over stream calls kept open."""

    def __init__(
        self,
        open_call: Callable[[], grpc.aio.StreamStreamCall[_Request, _Response]],
        unary: Callable[[_Request, float], Awaitable[_Response]],
        what: str,
    ) -> None:
        self._open_call = open_call
        self._unary_call = unary
        self._what = what
        self._idle: list[grpc.aio.StreamStreamCall[_Request, _Response]] = []
        self._unary = False
        self._closed = False
        self.calls_opened = 0
        """How many stream calls were opened (one per request in flight at once, while
        nothing fails)."""

    @property
    def is_unary(self) -> bool:
        """Whether the broker turned the stream down, so that requests are unary calls."""
        return self._unary

    async def _request(self, request: _Request, timeout_s: float) -> _Response:
        """``request`` answered by the broker within ``timeout_s`` seconds."""
        if self._unary:
            return await self._unary_call(request, timeout_s)
        call = self._idle.pop() if self._idle else None
        if call is None or call.done():  # none yet, or the broker ended it (it stopped)
            call = self._open_call()
            self.calls_opened += 1
        try:
            async with asyncio.timeout(timeout_s):
                await call.write(request)
                reply = await call.read()
        except TimeoutError:
            call.cancel()
            raise _rpc_error(
                grpc.StatusCode.DEADLINE_EXCEEDED, f"the {self._what} timed out"
            ) from None
        except (grpc.aio.UsageError, asyncio.InvalidStateError) as e:  # the call had ended
            call.cancel()
            raise _rpc_error(grpc.StatusCode.UNAVAILABLE, str(e)) from e
        except grpc.aio.AioRpcError as e:
            call.cancel()
            if e.code() != grpc.StatusCode.UNIMPLEMENTED:
                raise
            self._unary = True
            return await self._unary_call(request, timeout_s)
        except BaseException:  # cancelled: the answer, if any, would come to the next request
            call.cancel()
            raise
        if reply is grpc.aio.EOF:
            raise _rpc_error(
                grpc.StatusCode.UNAVAILABLE, f"the broker ended the {self._what} stream"
            )
        if self._closed:
            call.cancel()
        else:
            self._idle.append(call)
        return reply

    def close(self) -> None:
        """End the calls kept open; requests still under way end their own calls."""
        self._closed = True
        for call in self._idle:
            call.cancel()
        self._idle.clear()


class FetchStream(_RequestStream[pb.FetchRequest, pb.FetchResponse]):
    """The fetches to the broker behind ``stub``."""

    def __init__(self, stub: broker_pb2_grpc.BrokerStub) -> None:
        super().__init__(
            stub.FetchStream,
            lambda request, timeout_s: stub.Fetch(request, timeout=timeout_s),
            "fetch",
        )

    async def fetch(self, request: pb.FetchRequest, timeout_s: float) -> pb.FetchResponse:
        """``request`` answered by the broker within ``timeout_s`` seconds."""
        return await self._request(request, timeout_s)


class ProduceStream(_RequestStream[pb.ProduceRequest, pb.ProduceResponse]):
    """The produce requests to the broker behind ``stub``."""

    def __init__(self, stub: broker_pb2_grpc.BrokerStub) -> None:
        super().__init__(
            stub.ProduceStream,
            lambda request, timeout_s: stub.Produce(request, timeout=timeout_s),
            "produce request",
        )

    async def produce(self, request: pb.ProduceRequest, timeout_s: float) -> pb.ProduceResponse:
        """``request`` answered by the broker within ``timeout_s`` seconds."""
        return await self._request(request, timeout_s)


def _rpc_error(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    """The error a unary call would have raised."""
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details)
