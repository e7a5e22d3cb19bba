"""The client's sent-records counter: one point per topic, with the messaging attributes."""

from __future__ import annotations

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
