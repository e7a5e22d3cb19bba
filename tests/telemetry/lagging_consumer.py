"""Run as a process by the telemetry tests: a consumer that reads part of a partition and
prints the lag and consumed-records metrics it reports, as JSON.

``python lagging_consumer.py BOOTSTRAP TOPIC GROUP N`` reads N records of partition 0
from the start (in group GROUP for the metrics' attributes, assigned by hand) and prints
``{"lag": {...}, "consumed": ...}`` from an in-memory metric reader.
"""

from __future__ import annotations

import asyncio
import json
import sys

from highwater.client.consumer import AsyncConsumer, TopicPartition
from highwater.telemetry import configure_telemetry
from opentelemetry.sdk.metrics.export import InMemoryMetricReader


async def main(
    bootstrap: str, topic: str, group: str, wanted: int, reader: InMemoryMetricReader
) -> None:
    consumer = AsyncConsumer({"bootstrap.servers": bootstrap, "group.id": group})
    consumer.assign([TopicPartition(topic, 0, 0)])
    got = 0
    while got < wanted:
        got += len(await consumer.consume(wanted - got, timeout=10))
    data = reader.get_metrics_data()
    report: dict[str, object] = {"lag": {}, "consumed": 0}
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    attributes = dict(point.attributes or {})
                    if metric.name == "highwater.consumer.lag":
                        topic = attributes["messaging.destination.name"]
                        key = f"{topic}-{attributes['messaging.destination.partition.id']}"
                        report["lag"][key] = [
                            point.value,
                            attributes.get("messaging.consumer.group.name"),
                        ]  # type: ignore[index]
                    elif metric.name == "messaging.client.consumed.messages":
                        report["consumed"] = point.value
    await consumer.close()
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    reader = InMemoryMetricReader()
    telemetry = configure_telemetry("lagging-consumer", metric_readers=[reader])
    try:
        asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), reader))
    finally:
        telemetry.shutdown()
