"""Setting up opentelemetry-sdk for a Highwater process from the standard ``OTEL_*`` variables.

What is exported is decided by :func:`telemetry_plan`, a pure function of the
environment, and set up by :func:`configure_telemetry`:

* traces: ``OTEL_TRACES_EXPORTER`` (``otlp``, ``console``, ``none``, comma-separated); when
  it is not set, OTLP if an endpoint is (``OTEL_EXPORTER_OTLP_ENDPOINT`` or
  ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``), else nothing. The sampler is the SDK's, from
  ``OTEL_TRACES_SAMPLER`` and ``OTEL_TRACES_SAMPLER_ARG`` (parent-based always-on by
  default); batching from ``OTEL_BSP_*``.
* metrics: ``OTEL_METRICS_EXPORTER`` (``otlp``, ``console``, ``prometheus``, ``none``) the
  same way, plus a Prometheus endpoint when the server command was given
  ``--metrics-listen HOST:PORT`` (``prometheus`` in the variable needs that address),
  served over HTTPS with ``--metrics-tls`` (:class:`MetricsTls`: the process's own
  certificate and key; with its CA file, scrapers must present a certificate it signed).
* ``OTEL_SDK_DISABLED=true`` turns all of it off; ``OTEL_SERVICE_NAME`` and
  ``OTEL_RESOURCE_ATTRIBUTES`` name the process (by default ``highwater-<role>``).

OTLP goes over gRPC (``OTEL_EXPORTER_OTLP_PROTOCOL`` ``grpc``, the only protocol shipped);
the exporters read their endpoint, headers and timeouts from the environment themselves.

The SDK is imported by :func:`configure_telemetry` only, not with this module: the client
library asks :func:`tracing_enabled` on its paths, and a program that uses it with
telemetry off does not pay for loading the SDK (tens of milliseconds).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from opentelemetry import metrics, trace

from highwater.errors import HighwaterError

if TYPE_CHECKING:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import MetricReader
    from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter

__all__ = [
    "MetricsTls",
    "Telemetry",
    "TelemetryConfigError",
    "TelemetryPlan",
    "configure_telemetry",
    "metrics_enabled",
    "telemetry_plan",
    "tracing_enabled",
]

log = logging.getLogger(__name__)

TRACE_EXPORTERS = frozenset({"otlp", "console", "none"})
METRIC_EXPORTERS = frozenset({"otlp", "console", "prometheus", "none"})


class TelemetryConfigError(HighwaterError, ValueError):
    """An ``OTEL_*`` variable or ``--metrics-listen`` that cannot be honoured."""


@dataclass(frozen=True, slots=True)
class MetricsTls:
    """HTTPS for the Prometheus endpoint: the certificate and key it presents, and the CA
    whose certificates scrapers must present (``None``: any scraper). The files are read
    once, when the endpoint starts."""

    cert_file: str
    key_file: str
    ca_file: str | None = None


@dataclass(frozen=True, slots=True)
class TelemetryPlan:
    """What a process exports, decided from its environment (see the module docstring)."""

    service_name: str | None
    """``service.name`` to set, or None when the environment names the service itself."""
    trace_exporters: frozenset[str] = frozenset()
    metric_exporters: frozenset[str] = frozenset()
    prometheus_listen: tuple[str, int] | None = None

    @property
    def tracing(self) -> bool:
        return bool(self.trace_exporters)

    @property
    def metrics(self) -> bool:
        return bool(self.metric_exporters) or self.prometheus_listen is not None


def _exporters(
    environ: Mapping[str, str],
    variable: str,
    known: frozenset[str],
    endpoint_variables: Sequence[str],
) -> frozenset[str]:
    raw = environ.get(variable, "").strip()
    if not raw:
        has_endpoint = any(environ.get(name, "").strip() for name in endpoint_variables)
        return frozenset({"otlp"}) if has_endpoint else frozenset()
    names = {name.strip().lower() for name in raw.split(",") if name.strip()}
    unknown = names - known
    if unknown:
        raise TelemetryConfigError(
            f"{variable}={raw!r}: unknown exporter {', '.join(sorted(unknown))} "
            f"(known: {', '.join(sorted(known))})"
        )
    return frozenset(names - {"none"})


def parse_listen(value: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6) as ``(host, port)``; port 0 picks a free one."""
    host, sep, port_text = value.rpartition(":")
    if not sep or not host or not port_text.isdigit() or int(port_text) > 65535:
        raise TelemetryConfigError(f"--metrics-listen {value!r}: expected HOST:PORT")
    return host.strip("[]"), int(port_text)


def telemetry_plan(
    environ: Mapping[str, str], *, default_service_name: str, metrics_listen: str | None = None
) -> TelemetryPlan:
    """What to export, from ``environ`` (``OTEL_*``) and the ``--metrics-listen`` option.

    Raises :class:`TelemetryConfigError` for an unknown exporter, an unsupported OTLP
    protocol, ``prometheus`` without an address, or a malformed address.
    """
    prometheus = parse_listen(metrics_listen) if metrics_listen else None
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return TelemetryPlan(service_name=None, prometheus_listen=prometheus)
    traces = _exporters(
        environ,
        "OTEL_TRACES_EXPORTER",
        TRACE_EXPORTERS,
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"),
    )
    metric_exporters = _exporters(
        environ,
        "OTEL_METRICS_EXPORTER",
        METRIC_EXPORTERS,
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"),
    )
    if "prometheus" in metric_exporters and prometheus is None:
        raise TelemetryConfigError(
            "OTEL_METRICS_EXPORTER names prometheus: give the server --metrics-listen HOST:PORT"
        )
    metric_exporters -= {"prometheus"}
    if "otlp" in traces | metric_exporters:
        for variable in (
            "OTEL_EXPORTER_OTLP_PROTOCOL",
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
            "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL",
        ):
            protocol = environ.get(variable, "grpc").strip().lower()
            if protocol != "grpc":
                raise TelemetryConfigError(
                    f"{variable}={protocol!r}: Highwater exports OTLP over grpc only"
                )
    names_itself = "OTEL_SERVICE_NAME" in environ or "service.name=" in environ.get(
        "OTEL_RESOURCE_ATTRIBUTES", ""
    )
    return TelemetryPlan(
        service_name=None if names_itself else default_service_name,
        trace_exporters=traces,
        metric_exporters=metric_exporters,
        prometheus_listen=prometheus,
    )


@dataclass
class Telemetry:
    """The providers a process set up; :meth:`shutdown` flushes and stops them."""

    plan: TelemetryPlan
    tracer_provider: TracerProvider | None = None
    meter_provider: MeterProvider | None = None
    metrics_address: tuple[str, int] | None = None
    """Where the Prometheus endpoint listens (the port it got, for port 0)."""
    _http: Any = field(default=None, repr=False)

    def shutdown(self) -> None:
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None
        if self.tracer_provider is not None:
            self.tracer_provider.shutdown()
        if self.meter_provider is not None:
            self.meter_provider.shutdown()


def _span_exporter(name: str) -> SpanExporter:
    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()


def _metric_reader(name: str) -> MetricReader:
    from opentelemetry.sdk.metrics.export import (
        ConsoleMetricExporter,
        PeriodicExportingMetricReader,
    )

    if name == "console":
        return PeriodicExportingMetricReader(ConsoleMetricExporter())
    from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter

    return PeriodicExportingMetricReader(OTLPMetricExporter())


def configure_telemetry(
    default_service_name: str,
    *,
    metrics_listen: str | None = None,
    metrics_tls: MetricsTls | None = None,
    environ: Mapping[str, str] | None = None,
    span_processors: Sequence[SpanProcessor] = (),
    metric_readers: Sequence[MetricReader] = (),
) -> Telemetry:
    """Set up the SDK as :func:`telemetry_plan` says and install it as OpenTelemetry's
    global providers (once per process: OpenTelemetry refuses to replace them).

    ``span_processors`` and ``metric_readers`` are added to what the environment asks for
    (tests pass in-memory ones). Raises :class:`TelemetryConfigError` for bad settings and
    ``OSError`` when the metrics address cannot be bound.
    """
    environ = os.environ if environ is None else environ
    plan = telemetry_plan(
        environ, default_service_name=default_service_name, metrics_listen=metrics_listen
    )
    telemetry = Telemetry(plan)
    sdk_disabled = environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true"
    if sdk_disabled and not (span_processors or metric_readers):
        if plan.prometheus_listen is not None:
            log.warning("OTEL_SDK_DISABLED=true: --metrics-listen serves nothing")
        return telemetry
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    attributes = {} if plan.service_name is None else {"service.name": plan.service_name}
    resource = Resource.create(attributes)
    if plan.tracing or span_processors:
        provider = TracerProvider(resource=resource)
        for name in sorted(plan.trace_exporters):
            provider.add_span_processor(BatchSpanProcessor(_span_exporter(name)))
        for processor in span_processors:
            provider.add_span_processor(processor)
        trace.set_tracer_provider(provider)
        telemetry.tracer_provider = provider
    readers = [_metric_reader(name) for name in sorted(plan.metric_exporters)]
    readers.extend(metric_readers)
    if plan.prometheus_listen is not None:
        from opentelemetry.exporter.prometheus import PrometheusMetricReader
        from prometheus_client import start_http_server

        readers.append(PrometheusMetricReader())
        host, port = plan.prometheus_listen
        if metrics_tls is None:
            http, _thread = start_http_server(port, addr=host)
        else:
            http, _thread = start_http_server(
                port,
                addr=host,
                certfile=metrics_tls.cert_file,
                keyfile=metrics_tls.key_file,
                client_cafile=metrics_tls.ca_file,
                client_auth_required=metrics_tls.ca_file is not None,
            )
        telemetry._http = http
        telemetry.metrics_address = (host, http.server_port)
    if readers:
        meter_provider = MeterProvider(resource=resource, metric_readers=readers)
        metrics.set_meter_provider(meter_provider)
        telemetry.meter_provider = meter_provider
    return telemetry


def tracing_enabled() -> bool:
    """Whether spans are recorded: an SDK tracer provider is installed (by
    :func:`configure_telemetry` or by the program that uses the client library).

    Asked without importing the SDK: while its trace module is not loaded, no provider of
    its kind can have been made, so the answer is no."""
    sdk_trace = sys.modules.get("opentelemetry.sdk.trace")
    return sdk_trace is not None and isinstance(
        trace.get_tracer_provider(), sdk_trace.TracerProvider
    )


def metrics_enabled() -> bool:
    """Whether an SDK meter provider is installed (asked as :func:`tracing_enabled` is)."""
    sdk_metrics = sys.modules.get("opentelemetry.sdk.metrics")
    return sdk_metrics is not None and isinstance(
        metrics.get_meter_provider(), sdk_metrics.MeterProvider
    )
