"""An OTLP trace receiver on loopback for the telemetry tests: what processes export, kept.

It serves OpenTelemetry's ``TraceService.Export`` (the OTLP/gRPC protocol a collector
speaks) with the generated servicer of ``opentelemetry-proto``, and keeps every span with
its resource's ``service.name``. The processes under test export to it as they would to a
collector (``OTEL_EXPORTER_OTLP_ENDPOINT``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    return None if kind is None else getattr(value, kind)


def _attributes(pairs: Any) -> dict[str, Any]:
    return {pair.key: _value(pair.value) for pair in pairs if isinstance(pair, KeyValue)}


@dataclass(frozen=True)
class ReceivedSpan:
    service: str
    name: str
    kind: int
    trace_id: str
    span_id: str
    parent_span_id: str
    attributes: dict[str, Any]
    links: tuple[tuple[str, str], ...]
    """``(trace_id, span_id)`` of each link."""


class OtlpReceiver(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self._lock = threading.Lock()

    def Export(
        self, request: trace_service_pb2.ExportTraceServiceRequest, context: Any
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        received = []
        for resource_spans in request.resource_spans:
            service = _attributes(resource_spans.resource.attributes).get("service.name", "")
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    received.append(
                        ReceivedSpan(
                            service=service,
                            name=span.name,
                            kind=span.kind,
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_span_id=span.parent_span_id.hex(),
                            attributes=_attributes(span.attributes),
                            links=tuple((ln.trace_id.hex(), ln.span_id.hex()) for ln in span.links),
                        )
                    )
        with self._lock:
            self.spans.extend(received)
        return trace_service_pb2.ExportTraceServiceResponse()

    def of(self, service: str, name_prefix: str = "") -> list[ReceivedSpan]:
        with self._lock:
            return [
                s for s in self.spans if s.service == service and s.name.startswith(name_prefix)
            ]

    def wait_for(
        self, check: Callable[[OtlpReceiver], bool], what: str, timeout_s: float = 30
    ) -> None:
        deadline = time.monotonic() + timeout_s
        while not check(self):
            if time.monotonic() > deadline:
                services = sorted({(s.service, s.name) for s in self.spans})
                raise AssertionError(f"{what}: not received in {timeout_s} s; have {services}")
            time.sleep(0.1)


@contextmanager
def otlp_receiver() -> Iterator[tuple[OtlpReceiver, str]]:
    """A running receiver and its endpoint (``http://127.0.0.1:PORT``)."""
    receiver = OtlpReceiver()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(receiver, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield receiver, f"http://127.0.0.1:{port}"
    finally:
        server.stop(grace=None)
