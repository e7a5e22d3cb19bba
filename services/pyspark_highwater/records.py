"""The source's row schema and the conversion of fetched records into Arrow record batches.

The columns are spark-sql-kafka's: ``key`` and ``value`` (binary), ``topic``, ``partition``,
``offset``, ``timestamp`` (UTC), ``timestampType`` (0 create time, 1 log-append time, as
Kafka's ``TimestampType`` ids) and, with ``includeHeaders``, ``headers`` (an array of
``key``/``value`` structs). Records go to Spark as Arrow batches, whose schema must be exactly
the one Spark derives from the row schema.
"""

from __future__ import annotations

from typing import Final

import pyarrow as pa
from highwater.client.producer import TIMESTAMP_LOG_APPEND_TIME, Message
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

__all__ = ["HEADER_TYPE", "RecordBatchBuilder", "source_schema"]

HEADER_TYPE: Final = ArrayType(
    StructType([StructField("key", StringType()), StructField("value", BinaryType())])
)

#: spark-sql-kafka's timestampType values.
_CREATE_TIME: Final = 0
_LOG_APPEND_TIME: Final = 1


def source_schema(include_headers: bool) -> StructType:
    """The source's columns; ``headers`` only with ``includeHeaders``."""
    fields = [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
    ]
    if include_headers:
        fields.append(StructField("headers", HEADER_TYPE))
    return StructType(fields)


class RecordBatchBuilder:
    """Collects consumed records column by column and hands them out as Arrow batches."""

    def __init__(self, include_headers: bool) -> None:
        self.include_headers = include_headers
        self.schema = to_arrow_schema(source_schema(include_headers), timezone="UTC")
        self._reset()

    def _reset(self) -> None:
        self._keys: list[bytes | None] = []
        self._values: list[bytes | None] = []
        self._offsets: list[int] = []
        self._timestamps: list[int] = []
        self._types: list[int] = []
        self._headers: list[list[dict[str, object]]] = []

    def __len__(self) -> int:
        return len(self._offsets)

    def add(self, messages: list[Message]) -> None:
        """Append records (all of one partition, errors excluded)."""
        for message in messages:
            kind, timestamp = message.timestamp()
            self._keys.append(message.key())
            self._values.append(message.value())
            self._offsets.append(message.offset())
            self._timestamps.append(timestamp * 1000)
            self._types.append(
                _LOG_APPEND_TIME if kind == TIMESTAMP_LOG_APPEND_TIME else _CREATE_TIME
            )
            if self.include_headers:
                self._headers.append([{"key": k, "value": v} for k, v in (message.headers() or ())])

    def take(self, topic: str, partition: int) -> pa.RecordBatch:
        """The collected records of ``topic``/``partition`` as one batch; starts afresh."""
        count = len(self._offsets)
        fields = self.schema
        columns = [
            pa.array(self._keys, type=fields.field("key").type),
            pa.array(self._values, type=fields.field("value").type),
            pa.array([topic] * count, type=fields.field("topic").type),
            pa.array([partition] * count, type=fields.field("partition").type),
            pa.array(self._offsets, type=fields.field("offset").type),
            pa.array(self._timestamps, type=fields.field("timestamp").type),
            pa.array(self._types, type=fields.field("timestampType").type),
        ]
        if self.include_headers:
            columns.append(pa.array(self._headers, type=fields.field("headers").type))
        self._reset()
        return pa.RecordBatch.from_arrays(columns, schema=self.schema)
