"""Run as a process by the telemetry tests: lists topics inside a span of its own.

``python traced_admin.py BOOTSTRAP`` sets up OpenTelemetry from its OTEL_* variables, as a
program using the client library would, lists the topics inside the span ``operator-task``
and prints that span's trace id and span id.
"""

from __future__ import annotations

import asyncio
import sys

from highwater.client.admin import AdminClient
from highwater.telemetry import configure_telemetry
from opentelemetry import trace


async def main(bootstrap: str) -> None:
    tracer = trace.get_tracer("traced-admin")
    async with AdminClient(bootstrap) as admin:
        with tracer.start_as_current_span("operator-task") as span:
            await admin.list_topics()
            context = span.get_span_context()
    print(f"{context.trace_id:032x} {context.span_id:016x}", flush=True)


if __name__ == "__main__":
    telemetry = configure_telemetry("traced-admin")
    try:
        asyncio.run(main(sys.argv[1]))
    finally:
        telemetry.shutdown()
