"""gRPC telemetry: a server span and a duration for every unary call, the trace context in metadata.

:func:`server_interceptors` gives the gRPC servers of a process, when telemetry is on,
an interceptor that times every unary call into ``rpc.server.call.duration`` (by
``rpc.service``, ``rpc.method`` and ``rpc.grpc.status_code``: the request rate is its
count) and, with tracing on, runs it in a SERVER span that continues the caller's trace
(W3C ``traceparent`` in the call's metadata). Long-lived streams (the Raft
``FetchStream``) get neither: they last as long as the connection.
:func:`client_interceptors` puts the current trace context into the metadata of calls a
channel makes, so that a server's span is a child of the client span that made the call.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any, Final

import grpc
import grpc.aio
from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.semconv._incubating.attributes import rpc_attributes as rpc
from opentelemetry.semconv._incubating.metrics import rpc_metrics
from opentelemetry.trace import SpanKind, Status, StatusCode

from highwater.telemetry.configure import metrics_enabled, tracing_enabled
from highwater.telemetry.instruments import duration_histogram, meter, tracer

__all__ = ["client_interceptors", "metrics_enabled", "server_interceptors"]

_GRPC: Final = rpc.RpcSystemValues.GRPC.value


class ServerTelemetryInterceptor(grpc.aio.ServerInterceptor):
    """Times every unary call and, with ``tracing``, runs it in a SERVER span."""

    def __init__(self, *, tracing: bool) -> None:
        self._tracer = tracer("rpc") if tracing else None
        self._duration = duration_histogram(
            meter("rpc"), rpc_metrics.RPC_SERVER_CALL_DURATION, "Duration of unary calls served"
        )
        self._handlers: dict[str, grpc.RpcMethodHandler | None] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        method = handler_call_details.method
        if method in self._handlers:
            cached = self._handlers[method]
            if cached is not None:
                return cached
            return await continuation(handler_call_details)
        handler = await continuation(handler_call_details)
        wrapped = None
        if handler is not None and handler.unary_unary is not None:
            wrapped = grpc.unary_unary_rpc_method_handler(
                self._wrap(method, handler.unary_unary),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        self._handlers[method] = wrapped
        return handler if wrapped is None else wrapped

    def _wrap(
        self, method: str, behavior: Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]
    ) -> Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]:
        service, _, name = method.lstrip("/").rpartition("/")
        attributes = {rpc.RPC_SYSTEM: _GRPC, rpc.RPC_SERVICE: service, rpc.RPC_METHOD: name}
        span_name = f"{service}/{name}"
        tracer = self._tracer
        duration = self._duration

        async def call(request: Any, context: grpc.aio.ServicerContext) -> Any:
            started = time.perf_counter()
            code = grpc.StatusCode.OK
            span = token = None
            if tracer is not None:
                parent = propagate.extract(dict(context.invocation_metadata() or ()))
                span = tracer.start_span(
                    span_name, context=parent, kind=SpanKind.SERVER, attributes=attributes
                )
                token = otel_context.attach(trace.set_span_in_context(span))
            try:
                return await behavior(request, context)
            except BaseException:
                code = _code_of(context, grpc.StatusCode.UNKNOWN)
                raise
            finally:
                code = _code_of(context, code)
                duration.record(
                    time.perf_counter() - started,
                    {**attributes, rpc.RPC_GRPC_STATUS_CODE: code.value[0]},
                )
                if span is not None:
                    span.set_attribute(rpc.RPC_GRPC_STATUS_CODE, code.value[0])
                    if code is not grpc.StatusCode.OK:
                        span.set_status(Status(StatusCode.ERROR, code.name))
                    span.end()
                if token is not None:
                    otel_context.detach(token)

        return call


def _code_of(context: grpc.aio.ServicerContext, default: grpc.StatusCode) -> grpc.StatusCode:
    """The status the servicer set on ``context`` (with ``abort`` or ``set_code``), if any."""
    code = context.code()
    if isinstance(code, grpc.StatusCode):
        return code
    if isinstance(code, int):  # the aio context may report the numeric code
        return next((c for c in grpc.StatusCode if c.value[0] == code), default)
    return default


def server_interceptors() -> list[grpc.aio.ServerInterceptor]:
    """The interceptors a process's gRPC servers take: none while telemetry is off."""
    tracing = tracing_enabled()
    if not tracing and not metrics_enabled():
        return []
    return [ServerTelemetryInterceptor(tracing=tracing)]


class _TraceContextInjector(grpc.aio.UnaryUnaryClientInterceptor):
    """Adds the current trace context to a unary call's metadata."""

    async def intercept_unary_unary(
        self,
        continuation: Callable[[grpc.aio.ClientCallDetails, Any], Awaitable[Any]],
        client_call_details: grpc.aio.ClientCallDetails,
        request: Any,
    ) -> Any:
        if trace.get_current_span().get_span_context().is_valid:
            carrier: dict[str, str] = {}
            propagate.inject(carrier)
            metadata = grpc.aio.Metadata(*(client_call_details.metadata or ()))
            for key, value in carrier.items():
                metadata.add(key, value)
            client_call_details = client_call_details._replace(metadata=metadata)
        return await continuation(client_call_details, request)


def client_interceptors() -> list[grpc.aio.ClientInterceptor]:
    """The interceptors a client's channels take: none while tracing is off."""
    return [_TraceContextInjector()] if tracing_enabled() else []
