"""One producer run for bench/telemetry.py, in a process of its own (telemetry is per process).

``python -m bench._telemetry_producer BOOTSTRAP TOPIC RECORDS MODE`` produces RECORDS
100-byte records with acks=1 as the broker suite's producer does, after setting up
telemetry as MODE says, and prints ``{"records": N, "seconds": S}``:

- ``none``: no telemetry set up (and, run with an older ``highwater`` on PYTHONPATH, the
  client library as it was before it was instrumented);
- ``metrics``: a meter provider with an in-memory reader, collected once at the end;
- ``tracing``: what the OTEL_* variables say (the benchmark points them at an OTLP sink).
"""

from __future__ import annotations

import asyncio
import json
import sys

from bench.broker import produce_with_client


def main(bootstrap: str, topic: str, records: int, mode: str) -> None:
    telemetry = None
    if mode != "none":
        from highwater.telemetry import configure_telemetry

        readers = []
        if mode == "metrics":
            from opentelemetry.sdk.metrics.export import InMemoryMetricReader

            readers.append(InMemoryMetricReader())
        telemetry = configure_telemetry("bench-producer", metric_readers=readers)
    try:
        counted = asyncio.run(produce_with_client(bootstrap, topic, "1", records))
    finally:
        if telemetry is not None:
            telemetry.shutdown()
    print(json.dumps({"records": counted.records, "seconds": counted.seconds}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4])
