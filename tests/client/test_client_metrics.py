"""The client's metrics: the sent-records counter, one point per topic with the messaging
attributes; and a program that imports the client with telemetry off does not load
OpenTelemetry's SDK, while one that installs the SDK afterwards gets the client's metrics
and spans."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from highwater.client import metrics as client_metrics
from highwater.client.metrics import ClientMetrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader


def test_sent_records_are_counted_per_topic(monkeypatch: pytest.MonkeyPatch) -> None:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    monkeypatch.setattr(client_metrics, "meter", lambda name: provider.get_meter(name))
    recorder = ClientMetrics()
    for topic, count in (("orders", 3), ("audit", 2), ("orders", 4)):
        recorder.sent(topic, count)
    data = reader.get_metrics_data()
    assert data is not None
    points = {
        point.attributes["messaging.destination.name"]: (point.value, dict(point.attributes))
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
        if metric.name == "messaging.client.sent.messages"
        for point in metric.data.data_points
    }
    assert {topic: value for topic, (value, _) in points.items()} == {"orders": 7, "audit": 2}
    assert points["audit"][1] == {
        "messaging.system": client_metrics.MESSAGING_SYSTEM,
        "messaging.destination.name": "audit",
    }
    provider.shutdown()


# Run in a fresh interpreter: this process has long since loaded the SDK, and OpenTelemetry's
# global providers can be set once per process.
_SDK_AFTER_THE_CLIENT = textwrap.dedent(
    """
    import sys

    import highwater.client.admin
    import highwater.client.consumer
    import highwater.client.producer
    from highwater.client.metrics import CLIENT_METRICS
    from highwater.telemetry.configure import metrics_enabled, tracing_enabled

    CLIENT_METRICS.sent("before", 1)  # to the API's no-op meter: nothing is kept
    off = (tracing_enabled(), metrics_enabled())
    loaded = sorted(name for name in sys.modules if name.startswith("opentelemetry.sdk"))
    print("off", off, loaded[:3])

    from opentelemetry import metrics, trace
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider

    reader = InMemoryMetricReader()
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
    trace.set_tracer_provider(TracerProvider())
    CLIENT_METRICS.sent("after", 2)
    points = {
        point.attributes["messaging.destination.name"]: point.value
        for resource in reader.get_metrics_data().resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
        if metric.name == "messaging.client.sent.messages"
        for point in metric.data.data_points
    }
    print("on", (tracing_enabled(), metrics_enabled()), points)
    """
)


def test_the_sdk_is_loaded_only_by_a_program_that_turns_telemetry_on() -> None:
    ran = subprocess.run(
        [sys.executable, "-c", _SDK_AFTER_THE_CLIENT],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.splitlines() == [
        "off (False, False) []",
        "on (True, True) {'after': 2}",
    ]
