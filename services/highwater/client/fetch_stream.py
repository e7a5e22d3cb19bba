"""Fetches to one broker over a long-lived ``FetchStream`` call: how consumers and followers fetch.

A unary ``Fetch`` sets up a call for every request: on grpc.aio that is about half of what a
fetch costs the broker. :class:`FetchStream` keeps a ``FetchStream`` call open instead and
writes each request to it, reading the one answer the broker writes back (the broker answers
a stream's requests one at a time, in order). It looks like a unary call to its user:
:meth:`FetchStream.fetch` returns the answer or raises ``grpc.aio.AioRpcError``
(``DEADLINE_EXCEEDED`` once the timeout passes, ``UNAVAILABLE`` when the broker ended the
call).

A fetch that fails, times out or is cancelled ends its call, whose next answer would be out
of step with the requests; the next fetch opens another. Fetches made at the same time use
calls of their own. A broker that does not serve the stream (one of an older version,
during a rolling upgrade) answers ``UNIMPLEMENTED``: from then on the fetches are unary calls.
"""

from __future__ import annotations

import asyncio
from typing import TypeAlias

import grpc
import grpc.aio

from highwater.v1 import broker_pb2 as pb
from highwater.v1 import broker_pb2_grpc

__all__ = ["FetchStream"]

_Call: TypeAlias = "grpc.aio.StreamStreamCall[pb.FetchRequest, pb.FetchResponse]"


class FetchStream:
    """The fetches to the broker behind ``stub``."""

    def __init__(self, stub: broker_pb2_grpc.BrokerStub) -> None:
        self._stub = stub
        self._idle: list[_Call] = []
        self._unary = False
        self._closed = False
        self.calls_opened = 0
        """How many ``FetchStream`` calls were opened (one, while nothing fails)."""

    @property
    def is_unary(self) -> bool:
        """Whether the broker turned the stream down, so that fetches are unary calls."""
        return self._unary

    async def fetch(self, request: pb.FetchRequest, timeout_s: float) -> pb.FetchResponse:
        """``request`` answered by the broker within ``timeout_s`` seconds."""
        if self._unary:
            return await self._stub.Fetch(request, timeout=timeout_s)
        call = self._idle.pop() if self._idle else None
        if call is None or call.done():  # none yet, or the broker ended it (it stopped)
            call = self._stub.FetchStream()
            self.calls_opened += 1
        try:
            async with asyncio.timeout(timeout_s):
                await call.write(request)
                reply = await call.read()
        except TimeoutError:
            call.cancel()
            raise _rpc_error(grpc.StatusCode.DEADLINE_EXCEEDED, "the fetch timed out") from None
        except (grpc.aio.UsageError, asyncio.InvalidStateError) as e:  # the call had ended
            call.cancel()
            raise _rpc_error(grpc.StatusCode.UNAVAILABLE, str(e)) from e
        except grpc.aio.AioRpcError as e:
            call.cancel()
            if e.code() != grpc.StatusCode.UNIMPLEMENTED:
                raise
            self._unary = True
            return await self._stub.Fetch(request, timeout=timeout_s)
        except BaseException:  # cancelled: the answer, if any, would come to the next fetch
            call.cancel()
            raise
        if reply is grpc.aio.EOF:
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


def _rpc_error(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    """The error a unary call would have raised."""
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details)
