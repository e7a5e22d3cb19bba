"""Every metric Highwater reports: its name, unit and meaning, in one place.

The services create their instruments here and report to them; gauges of state that a
service already keeps (partitions, ISR sizes, the image) are observed when a reader
collects, through a callback on the service held by a weak reference, so that a stopped
service reports nothing and is not kept alive by its gauges.

Names follow OpenTelemetry's conventions (``rpc.server.call.duration`` as the RPC
semantic conventions name it, ``highwater.<component>.<what>`` for the rest); a
Prometheus scrape shows them with dots as underscores and the unit as a suffix
(``highwater_broker_under_replicated_partitions``, ``rpc_server_call_duration_seconds``).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable
from typing import Final, TypeVar

from opentelemetry import metrics, trace
from opentelemetry.metrics import CallbackOptions, Observation

from highwater import __version__
from highwater.telemetry.configure import tracing_enabled
from highwater.telemetry.messaging import SCHEMA_URL

__all__ = [
    "DURATION_BUCKETS_S",
    "meter",
    "observe",
    "tracer",
]

_T = TypeVar("_T")

DURATION_BUCKETS_S: Final = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip
"""Histogram bucket bounds for call, commit and rebalance durations, in seconds."""


def tracer(component: str) -> trace.Tracer | None:
    """The tracer of ``highwater.<component>`` while tracing is on (an SDK tracer provider
    is installed), else None: callers skip their spans altogether."""
    if not tracing_enabled():
        return None
    return trace.get_tracer(f"highwater.{component}", __version__, schema_url=SCHEMA_URL)


def meter(component: str) -> metrics.Meter:
    """The meter of ``highwater.<component>`` (global provider; no-op until one is set)."""
    return metrics.get_meter(f"highwater.{component}", __version__, schema_url=SCHEMA_URL)


def observe(
    meter_: metrics.Meter,
    name: str,
    owner: _T,
    read: Callable[[_T], Iterable[Observation]],
    *,
    unit: str = "1",
    description: str = "",
) -> None:
    """An observable gauge ``name`` whose value ``read(owner)`` gives at each collection,
    while ``owner`` lives."""
    ref = weakref.ref(owner)

    def callback(_options: CallbackOptions) -> Iterable[Observation]:
        target = ref()
        return () if target is None else list(read(target))

    meter_.create_observable_gauge(name, [callback], unit=unit, description=description)


def duration_histogram(meter_: metrics.Meter, name: str, description: str) -> metrics.Histogram:
    """A histogram of durations in seconds with :data:`DURATION_BUCKETS_S`."""
    return meter_.create_histogram(
        name,
        unit="s",
        description=description,
        explicit_bucket_boundaries_advisory=list(DURATION_BUCKETS_S),
    )
