"""Requests that do not decode: answered INVALID_ARGUMENT, not gRPC's UNKNOWN.

gRPC decodes each request with its method's deserializer before any service code runs. A
message that does not parse (random bytes, an encoding cut short) raises there, and gRPC
answers the call UNKNOWN ("Unexpected error") and logs the exception as its own error.
DESIGN.md wants bad input answered with a clear, typed error, so :class:`DecodeInterceptor`
(on every server :func:`~highwater.rpc.server.new_server` makes) gives each method a
deserializer that reads such a message as an :class:`Undecodable`, and answers it:

- a call whose one request does not decode ends INVALID_ARGUMENT, naming the method and
  protobuf's error, before its servicer runs;
- on a stream of requests, one that does not decode ends the requests its servicer reads,
  as a client's half-close would: the servicer answers those it had read, and the call
  then ends INVALID_ARGUMENT.

Each is logged as one WARNING line (``refused a request to METHOD that does not decode``),
as the sender's mistake. The wrapped handler of each method is made at the method's first
call and kept (:class:`~highwater.rpc.method_wrapping.MethodWrappingInterceptor`).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from typing import Any, NoReturn

import grpc
import grpc.aio
from google.protobuf.message import DecodeError

from highwater.rpc.method_wrapping import MethodWrappingInterceptor

__all__ = ["DecodeInterceptor", "Undecodable"]

log = logging.getLogger(__name__)


class Undecodable:
    """A request that does not decode, as its method's deserializer reads it."""

    __slots__ = ("error",)

    def __init__(self, error: DecodeError) -> None:
        self.error = error


class DecodeInterceptor(MethodWrappingInterceptor):
    """Answers requests that do not decode with INVALID_ARGUMENT (the module docstring)."""

    def wrap(self, method: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        if handler.request_deserializer is None:  # (raw bytes: nothing to decode)
            return handler
        return _refusing(method, handler)


def _refusing(method: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    """``handler`` with its requests read by :func:`_decoding` and what does not decode
    answered INVALID_ARGUMENT."""
    decode = _decoding(handler.request_deserializer)
    serialize = handler.response_serializer
    if handler.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(
            _one_request(method, handler.unary_unary), decode, serialize
        )
    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(
            _one_request_answered_by_a_stream(method, handler.unary_stream), decode, serialize
        )
    if handler.stream_unary is not None:
        return grpc.stream_unary_rpc_method_handler(
            _requests(method, handler.stream_unary), decode, serialize
        )
    return grpc.stream_stream_rpc_method_handler(
        _requests_answered_by_a_stream(method, handler.stream_stream), decode, serialize
    )


def _decoding(deserializer: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    def decode(data: bytes) -> Any:
        try:
            return deserializer(data)
        except DecodeError as error:
            return Undecodable(error)

    return decode


async def _refuse(method: str, request: Undecodable, context: grpc.aio.ServicerContext) -> NoReturn:
    log.warning("refused a request to %s that does not decode: %s", method, request.error)
    await context.abort(
        grpc.StatusCode.INVALID_ARGUMENT,
        f"a request to {method} does not decode: {request.error}",
    )
    raise AssertionError("ServicerContext.abort returned")  # (it raises AbortError)


def _one_request(method: str, behavior: Callable[..., Any]) -> Callable[..., Any]:
    async def call(request: Any, context: grpc.aio.ServicerContext) -> Any:
        if type(request) is Undecodable:
            await _refuse(method, request, context)
        return await behavior(request, context)

    return call


def _one_request_answered_by_a_stream(
    method: str, behavior: Callable[..., Any]
) -> Callable[..., Any]:
    async def call(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        if type(request) is Undecodable:
            await _refuse(method, request, context)
        result = behavior(request, context)
        if hasattr(result, "__aiter__"):
            async for answer in result:
                yield answer
        else:  # (a servicer that writes with context.write)
            await result

    return call


def _requests(method: str, behavior: Callable[..., Any]) -> Callable[..., Any]:
    async def call(requests: Any, context: grpc.aio.ServicerContext) -> Any:
        decoded = _Decoded(requests)
        answer = await behavior(decoded, context)
        if decoded.undecodable is not None:
            await _refuse(method, decoded.undecodable, context)
        return answer

    return call


def _requests_answered_by_a_stream(method: str, behavior: Callable[..., Any]) -> Callable[..., Any]:
    async def call(requests: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        decoded = _Decoded(requests)
        result = behavior(decoded, context)
        if hasattr(result, "__aiter__"):
            async for answer in result:
                yield answer
        else:
            await result
        if decoded.undecodable is not None:
            await _refuse(method, decoded.undecodable, context)

    return call


class _Decoded:
    """A stream's requests up to the first that does not decode, which ends them (kept in
    :attr:`undecodable`)."""

    __slots__ = ("_requests", "undecodable")

    def __init__(self, requests: Any) -> None:
        self._requests = aiter(requests)
        self.undecodable: Undecodable | None = None

    def __aiter__(self) -> _Decoded:
        return self

    async def __anext__(self) -> Any:
        if self.undecodable is not None:
            raise StopAsyncIteration
        request = await anext(self._requests)
        if type(request) is Undecodable:
            self.undecodable = request
            raise StopAsyncIteration
        return request
