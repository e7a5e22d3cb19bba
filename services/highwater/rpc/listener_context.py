"""Which named listener a call arrived on, for the handlers that answer with addresses.

A process with several listeners (``listeners=INTERNAL://...,EXTERNAL://...``) runs one
gRPC server per listener (:class:`~highwater.rpc.server.GrpcHost`), each with a
:class:`ListenerInterceptor` that runs every handler with :func:`current_listener` set
to its listener's name. A broker's Metadata and FindCoordinator answers name each
broker's and coordinator's address on that listener (Kafka's rule: a client that
bootstrapped through EXTERNAL is told only EXTERNAL addresses). ``None`` outside a
call, or on a server that has no listener name.
"""

from __future__ import annotations

import contextvars
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import grpc.aio

__all__ = ["ListenerInterceptor", "current_listener"]

_LISTENER: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "highwater_listener", default=None
)


def current_listener() -> str | None:
    """The name of the listener the call being handled arrived on, if it has one."""
    return _LISTENER.get()


class ListenerInterceptor(grpc.aio.ServerInterceptor):
    """Runs every handler of a server with :func:`current_listener` set to ``name``."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._handlers: dict[str, grpc.RpcMethodHandler | None] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        method = handler_call_details.method
        if method not in self._handlers:
            handler = await continuation(handler_call_details)
            self._handlers[method] = None if handler is None else self._wrap(handler)
        return self._handlers[method]

    def _wrap(self, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        kinds = (
            ("unary_unary", grpc.unary_unary_rpc_method_handler),
            ("unary_stream", grpc.unary_stream_rpc_method_handler),
            ("stream_unary", grpc.stream_unary_rpc_method_handler),
            ("stream_stream", grpc.stream_stream_rpc_method_handler),
        )
        for attribute, make in kinds:
            behaviour = getattr(handler, attribute)
            if behaviour is not None:
                return make(
                    self._in_listener(behaviour),
                    request_deserializer=handler.request_deserializer,
                    response_serializer=handler.response_serializer,
                )
        return handler

    def _in_listener(self, behaviour: Callable[..., Any]) -> Callable[..., Any]:
        name = self.name
        if inspect.isasyncgenfunction(behaviour):

            async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
                _LISTENER.set(name)
                async for item in behaviour(request, context):
                    yield item

            return stream

        async def call(request: Any, context: grpc.aio.ServicerContext) -> Any:
            # Each call runs in a task of its own: the value set here is this call's.
            _LISTENER.set(name)
            result = behaviour(request, context)
            return await result if inspect.isawaitable(result) else result

        return call
