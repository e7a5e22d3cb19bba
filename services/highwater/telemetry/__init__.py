"""OpenTelemetry for every Highwater process: traces, metrics and log correlation.

* :mod:`~highwater.telemetry.configure` sets up opentelemetry-sdk from the standard
  ``OTEL_*`` environment variables (OTLP export when an endpoint is set, the console
  exporter when asked, nothing otherwise) and serves Prometheus metrics on
  ``--metrics-listen``;
* :mod:`~highwater.telemetry.messaging` makes the messaging spans (``send``, ``receive``,
  ``process``) of OpenTelemetry's semantic conventions and carries the trace context in
  record headers (``traceparent``);
* :mod:`~highwater.telemetry.rpc` is the gRPC side: a server span and a duration
  histogram for every call, the trace context in the call's metadata;
* :mod:`~highwater.telemetry.instruments` names every metric Highwater reports;
* :mod:`~highwater.telemetry.logs` puts trace and span ids into log lines.

Instrumented code uses OpenTelemetry's global API, as libraries do: a program that uses
the client library and configures the SDK itself gets the client's spans and metrics.
Nothing is recorded, and next to nothing is spent, until a provider is configured.
"""

from highwater.telemetry.configure import Telemetry, configure_telemetry, tracing_enabled

__all__ = ["Telemetry", "configure_telemetry", "tracing_enabled"]
