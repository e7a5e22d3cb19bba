"""An OTLP/gRPC endpoint that accepts spans and metrics and discards them, for bench/telemetry.py.

``python -m bench._otlp_sink PORT_FILE`` serves OpenTelemetry's ``TraceService`` and
``MetricsService`` on a free loopback port, writes the port to PORT_FILE and runs until
SIGTERM: what a collector costs the exporting processes, without a collector's own work.
"""

from __future__ import annotations

import signal
import sys
import threading
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
from opentelemetry.proto.collector.metrics.v1 import (
    metrics_service_pb2,
    metrics_service_pb2_grpc,
)
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc


class _Traces(trace_service_pb2_grpc.TraceServiceServicer):
    def Export(self, request: Any, context: Any) -> Any:
        return trace_service_pb2.ExportTraceServiceResponse()


class _Metrics(metrics_service_pb2_grpc.MetricsServiceServicer):
    def Export(self, request: Any, context: Any) -> Any:
        return metrics_service_pb2.ExportMetricsServiceResponse()


def main(port_file: Path) -> None:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_Traces(), server)
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(_Metrics(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    port_file.write_text(str(port))
    stop.wait()
    server.stop(grace=None)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
