"""Writing rows to Highwater inside a Spark task, with the client library's idempotent Producer.

The sink writes the columns spark-sql-kafka writes: ``value`` (required), ``key``, ``topic``
(unless the ``topic`` option names one, which then wins), ``partition`` (else the
partitioner chooses) and ``headers``; both ``key`` and ``value`` may be strings or binary.
Other columns are ignored. Each task produces its rows, flushes, and reports what was
written in a :class:`WrittenRecords` commit message; a record that could not be delivered
fails the task. The producer's ``batch.size`` is :data:`SINK_BATCH_SIZE` unless the
options give one.

Rows for the ``topic`` option with no ``partition`` or ``headers`` column (the common case)
go through :meth:`~highwater.client.producer.Producer.produce_batch`: the Arrow batch's key
and value buffers are encoded into RecordBatch v2 directly, partitioned by murmur2 of the key
column in the same pass, with one delivery report per batch. Other rows are produced one by
one.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

import pyarrow as pa
from highwater.errors import HighwaterError
from pyspark.sql.datasource import WriterCommitMessage
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    IntegerType,
    StringType,
    StructType,
)

if TYPE_CHECKING:
    from highwater.client.producer import BatchMetadata, Message

__all__ = [
    "SINK_BATCH_SIZE",
    "DeliveryError",
    "SinkSchemaError",
    "WrittenRecords",
    "check_sink_schema",
    "write_batches",
]

_BYTES_TYPES: Final = (StringType, BinaryType)
#: Flush delivery reports every so many records, so the queue of callbacks stays short.
_POLL_EVERY: Final = 2_000
#: The sink's ``batch.size`` unless ``highwater.batch.size`` gives one: 512 KiB, under the
#: broker's default ``message.max.bytes`` (1 MiB). A task hands over whole Arrow batches of
#: rows at once, so batches fill at once and linger nowhere; at the producer's default of
#: 16 KiB (about 145 records of 100 bytes) the sender's work per batch and per request, not
#: the records, was most of a task's time.
SINK_BATCH_SIZE: Final = 512 * 1024


class SinkSchemaError(ValueError):
    """The DataFrame's columns cannot be written (a missing value, a wrongly typed column)."""


class DeliveryError(RuntimeError):
    """Records could not be written; the task fails."""


@dataclass
class WrittenRecords(WriterCommitMessage):
    """What one task wrote: a record count and, per partition, the first and last offset."""

    records: int = 0
    ranges: dict[tuple[str, int], tuple[int, int]] = field(default_factory=dict)

    def note(self, topic: str, partition: int, offset: int, count: int = 1) -> None:
        """Count ``count`` delivered records, at ``offset`` and after."""
        self.records += count
        key = (topic, partition)
        last = offset + count - 1
        low, high = self.ranges.get(key, (offset, last))
        self.ranges[key] = (min(low, offset), max(high, last))


def _is_header_type(data_type: DataType) -> bool:
    if not isinstance(data_type, ArrayType) or not isinstance(data_type.elementType, StructType):
        return False
    fields = {f.name: f.dataType for f in data_type.elementType.fields}
    return (
        set(fields) == {"key", "value"}
        and isinstance(fields["key"], StringType)
        and isinstance(fields["value"], _BYTES_TYPES)
    )


def check_sink_schema(schema: StructType, topic_option: str | None) -> None:
    """Raise :class:`SinkSchemaError` unless rows of ``schema`` can be written."""
    types = {f.name.lower(): f.dataType for f in schema.fields}
    if "value" not in types:
        raise SinkSchemaError(
            "the Highwater sink needs a 'value' column (string or binary); columns: "
            + ", ".join(schema.fieldNames())
        )
    for name in ("key", "value"):
        if name in types and not isinstance(types[name], _BYTES_TYPES):
            raise SinkSchemaError(
                f"column {name!r} must be string or binary, not {types[name].simpleString()}; "
                f"cast it, e.g. CAST({name} AS STRING)"
            )
    if "topic" in types and not isinstance(types["topic"], StringType):
        raise SinkSchemaError(
            f"column 'topic' must be a string, not {types['topic'].simpleString()}"
        )
    if "topic" not in types and topic_option is None:
        raise SinkSchemaError("no topic to write to: give the 'topic' option or a 'topic' column")
    if "partition" in types and not isinstance(types["partition"], IntegerType):
        raise SinkSchemaError(
            f"column 'partition' must be an int, not {types['partition'].simpleString()}"
        )
    if "headers" in types and not _is_header_type(types["headers"]):
        raise SinkSchemaError(
            "column 'headers' must be array<struct<key: string, value: binary>>, not "
            + types["headers"].simpleString()
        )


def _column(batch: pa.RecordBatch, name: str) -> list[Any] | None:
    names = {n.lower(): i for i, n in enumerate(batch.schema.names)}
    index = names.get(name)
    return None if index is None else batch.column(index).to_pylist()


def write_batches(
    producer_config: dict[str, Any], topic_option: str | None, batches: Iterable[pa.RecordBatch]
) -> WrittenRecords:
    """Produce every row of ``batches``, flush, and report what was written; raises
    :class:`DeliveryError` if any record failed."""
    written = WrittenRecords()
    failures: list[str] = []

    def delivered(error: BaseException | None, message: Message) -> None:
        if error is not None:
            if len(failures) < 5:
                failures.append(f"{message.topic()}: {error}")
            return
        written.note(message.topic(), message.partition(), message.offset())

    def delivered_batch(error: BaseException | None, batch: BatchMetadata) -> None:
        if error is not None:
            if len(failures) < 5:
                failures.append(f"{batch.topic}: {error}")
            return
        written.note(batch.topic, batch.partition, batch.offset, batch.record_count)

    from highwater.client.producer import Producer

    producer = Producer({"batch.size": SINK_BATCH_SIZE, **producer_config})
    sent = 0
    try:
        for batch in _batches(batches):
            columnar = _columnar(batch, topic_option)
            if columnar is not None:
                try:
                    producer.produce_batch(
                        topic_option or "", columnar, on_delivery_batch=delivered_batch
                    )
                except HighwaterError as e:
                    raise DeliveryError(f"records could not be written: {topic_option}: {e}") from e
                producer.poll(0)
                if failures:
                    break
                continue
            count = batch.num_rows
            values = _column(batch, "value") or [None] * count
            keys = _column(batch, "key") or [None] * count
            topics = [topic_option] * count if topic_option else _column(batch, "topic")
            partitions = _column(batch, "partition") or [None] * count
            headers = _column(batch, "headers") or [None] * count
            assert topics is not None
            for value, key, topic, partition, header in zip(
                values, keys, topics, partitions, headers, strict=True
            ):
                if topic is None:
                    raise DeliveryError("a row's topic is null and no 'topic' option is given")
                producer.produce(
                    topic,
                    value,
                    key,
                    partition=partition,
                    headers=[(h["key"], h["value"]) for h in header] if header else None,
                    on_delivery=delivered,
                )
                sent += 1
                if sent % _POLL_EVERY == 0:
                    producer.poll(0)
                    if failures:
                        break
            if failures:
                break
        producer.flush()
    finally:
        producer.close()
    if failures:
        raise DeliveryError("records could not be written: " + "; ".join(failures))
    return written


def _columnar(batch: pa.RecordBatch, topic_option: str | None) -> pa.RecordBatch | None:
    """The ``key`` and ``value`` columns of a batch that
    :meth:`~highwater.client.producer.Producer.produce_batch` can write as they are: the
    topic given by the option, no partition or headers column; None otherwise."""
    names = {n.lower(): i for i, n in enumerate(batch.schema.names)}
    if topic_option is None or "partition" in names or "headers" in names:
        return None
    columns = {"value": batch.column(names["value"])}
    if "key" in names:
        columns["key"] = batch.column(names["key"])
    return pa.RecordBatch.from_pydict(columns)


def _batches(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    for batch in batches:
        if batch.num_rows:
            yield batch
