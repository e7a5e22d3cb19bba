"""What a process exports, decided from its OTEL_* variables and --metrics-listen; the trace
context a record's headers carry; log lines with trace ids."""

from __future__ import annotations

import json
import logging

import grpc
import grpc.aio
import pytest
from google.protobuf.message import DecodeError
from grpc_health.v1 import health, health_pb2_grpc
from highwater.cli.main import configure_logging
from highwater.telemetry.configure import TelemetryConfigError, parse_listen, telemetry_plan
from highwater.telemetry.logs import JsonFormatter, TextFormatter, TraceContextFilter
from highwater.telemetry.messaging import record_context
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

TRACE_ID = 0x0AF7651916CD43DD8448EB211C80319C
SPAN_ID = 0xB7AD6B7169203331


def plan(environ: dict[str, str], metrics_listen: str | None = None):  # type: ignore[no-untyped-def]
    return telemetry_plan(
        environ, default_service_name="highwater-broker", metrics_listen=metrics_listen
    )


def test_nothing_is_exported_without_settings() -> None:
    nothing = plan({})
    assert not nothing.tracing and not nothing.metrics
    assert nothing.service_name == "highwater-broker"


def test_an_otlp_endpoint_exports_traces_and_metrics_over_otlp() -> None:
    both = plan({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317"})
    assert both.trace_exporters == {"otlp"} and both.metric_exporters == {"otlp"}
    traces_only = plan({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4317"})
    assert traces_only.trace_exporters == {"otlp"} and not traces_only.metric_exporters


def test_exporters_named_in_the_variables_win() -> None:
    chosen = plan(
        {
            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317",
            "OTEL_TRACES_EXPORTER": "console",
            "OTEL_METRICS_EXPORTER": "none",
        }
    )
    assert chosen.trace_exporters == {"console"} and not chosen.metrics
    both = plan({"OTEL_TRACES_EXPORTER": "console, otlp"})
    assert both.trace_exporters == {"console", "otlp"}


def test_metrics_listen_serves_prometheus_and_the_sdk_switch_turns_exporters_off() -> None:
    served = plan({}, "127.0.0.1:9464")
    assert served.prometheus_listen == ("127.0.0.1", 9464) and served.metrics
    assert plan({"OTEL_METRICS_EXPORTER": "prometheus"}, "[::1]:0").prometheus_listen == ("::1", 0)
    disabled = plan({"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "console"})
    assert not disabled.tracing and not disabled.metric_exporters


def test_the_service_name_of_the_environment_is_kept() -> None:
    assert plan({"OTEL_SERVICE_NAME": "orders-broker"}).service_name is None
    assert plan({"OTEL_RESOURCE_ATTRIBUTES": "service.name=b1,team=x"}).service_name is None


@pytest.mark.parametrize(
    ("environ", "metrics_listen", "named"),
    [
        ({"OTEL_TRACES_EXPORTER": "jaeger"}, None, "OTEL_TRACES_EXPORTER"),
        ({"OTEL_METRICS_EXPORTER": "statsd"}, None, "OTEL_METRICS_EXPORTER"),
        ({"OTEL_METRICS_EXPORTER": "prometheus"}, None, "--metrics-listen"),
        (
            {
                "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318",
                "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            },
            None,
            "OTEL_EXPORTER_OTLP_PROTOCOL",
        ),
        ({}, "9464", "--metrics-listen"),
        ({}, "localhost:http", "--metrics-listen"),
        ({}, "localhost:70000", "--metrics-listen"),
    ],
)
def test_bad_settings_are_typed_errors_naming_the_setting(
    environ: dict[str, str], metrics_listen: str | None, named: str
) -> None:
    with pytest.raises(TelemetryConfigError, match=named):
        plan(environ, metrics_listen)


def test_parse_listen() -> None:
    assert parse_listen("0.0.0.0:9464") == ("0.0.0.0", 9464)


def test_a_records_traceparent_header_is_its_trace_context() -> None:
    headers = [
        ("app", b"x"),
        ("traceparent", f"00-{TRACE_ID:032x}-{SPAN_ID:016x}-01".encode()),
    ]
    context = record_context(headers)
    assert context is not None
    span_context = trace.get_current_span(context).get_span_context()
    assert (span_context.trace_id, span_context.span_id) == (TRACE_ID, SPAN_ID)
    assert span_context.is_remote and span_context.trace_flags.sampled
    assert record_context([("app", b"x")]) is None
    assert record_context(None) is None
    garbled = record_context([("traceparent", b"00-not-a-trace-context")])
    assert garbled is not None
    assert not trace.get_current_span(garbled).get_span_context().is_valid


def _record(message: str) -> logging.LogRecord:
    record = logging.LogRecord("highwater.broker", logging.INFO, __file__, 1, message, (), None)
    TraceContextFilter().filter(record)
    return record


def test_log_lines_carry_the_trace_and_span_ids_of_their_span() -> None:
    outside = _record("no span")
    assert TextFormatter("%(levelname)s %(message)s").format(outside) == "INFO no span"
    span = NonRecordingSpan(SpanContext(TRACE_ID, SPAN_ID, False, TraceFlags(1)))
    with trace.use_span(span):
        inside = _record("in a span")
    text = TextFormatter("%(levelname)s %(message)s").format(inside)
    assert text == f"INFO in a span trace_id={TRACE_ID:032x} span_id={SPAN_ID:016x}"
    entry = json.loads(JsonFormatter().format(inside))
    assert entry["message"] == "in a span" and entry["level"] == "INFO"
    assert (entry["trace_id"], entry["span_id"]) == (f"{TRACE_ID:032x}", f"{SPAN_ID:016x}")
    assert entry["logger"] == "highwater.broker" and entry["time"].endswith("+00:00")


async def test_an_undecodable_request_is_one_warning_line_not_a_traceback(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A request gRPC cannot decode is logged as one WARNING line; an exception raised by
    a service (even a DecodeError) keeps its ERROR line and traceback."""

    def boom(_request: bytes, _context: grpc.aio.ServicerContext) -> bytes:
        raise DecodeError("raised by the service itself")

    configure_logging("WARNING")
    server = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                "test.Service", {"Boom": grpc.unary_unary_rpc_method_handler(boom)}
            ),
        )
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            for method in ("/grpc.health.v1.Health/Check", "/test.Service/Boom"):
                with pytest.raises(grpc.aio.AioRpcError):
                    await channel.unary_unary(method)(b"\xff\xff\xff")
    finally:
        await server.stop(None)
    err = capsys.readouterr().err
    undecodable = [line for line in err.splitlines() if "Health/Check" in line]
    assert len(undecodable) == 1
    assert (
        " WARNING grpc._cython.cygrpc: refused a request to /grpc.health.v1.Health/Check "
        "that does not decode: Error parsing message"
    ) in undecodable[0]
    assert err.count("Traceback") == 1  # the service's own exception
    assert "ERROR" in err and "raised by the service itself" in err
