"""Topics for the Spark tests: unique names, records produced and read back with the client."""

from __future__ import annotations

import asyncio
import itertools
import os
from pathlib import Path

from highwater.client.admin import AdminClient, NewTopic
from highwater.client.consumer import Consumer, Message, TopicPartition
from highwater.client.producer import Producer

_names = itertools.count()


def unique_topic(prefix: str) -> str:
    """A topic name no other test uses."""
    return f"{prefix}-{os.getpid()}-{next(_names)}"


def create_topic(address: str, name: str, partitions: int) -> None:
    """Create ``name`` with ``partitions`` partitions (one replica)."""

    async def create() -> None:
        async with AdminClient(address) as admin:
            results = await admin.create_topics([NewTopic(name, partitions, 1)])
            results[name].raise_for_error()

    asyncio.run(create())


def produce(
    address: str,
    topic: str,
    values: list[str],
    *,
    partitions: int,
    start: int = 0,
) -> None:
    """Produce ``values`` round-robin over ``partitions``, keyed ``k<i>`` from ``start``."""
    with Producer({"bootstrap.servers": address, "linger.ms": 1}) as producer:
        for i, value in enumerate(values, start):
            producer.produce(topic, value, f"k{i}", partition=i % partitions)
        assert producer.flush(30) == 0


def consume_all(address: str, topic: str, partitions: int) -> list[Message]:
    """Every record of ``topic`` up to its high watermark, read with the client library."""
    with Consumer({"bootstrap.servers": address, "auto.offset.reset": "earliest"}) as consumer:
        ends = {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p))[1]
            for p in range(partitions)
        }
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        messages: list[Message] = []
        total = sum(ends.values())
        while len(messages) < total:
            batch = consumer.consume(min(1000, total - len(messages)), timeout=5)
            assert batch, f"expected {total} records, got {len(messages)}"
            for message in batch:
                assert message.error() is None, message.error()
            messages.extend(batch)
        return messages


def checkpoint(tmp_path: Path, name: str = "checkpoint") -> str:
    """A checkpoint directory for a streaming query."""
    return str(tmp_path / name)
