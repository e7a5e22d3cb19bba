"""The source's row schema and the conversion of fetched records into Arrow record batches.

The columns are spark-sql-kafka's: ``key`` and ``value`` (binary), ``topic``, ``partition``,
``offset``, ``timestamp`` (UTC), ``timestampType`` (0 create time, 1 log-append time, as
Kafka's ``TimestampType`` ids, which the codec's columns hold as they are) and, with
``includeHeaders``, ``headers`` (an array of ``key``/``value`` structs). Records go to Spark
as Arrow batches, whose schema must be exactly the one Spark derives from the row schema.
"""

from __future__ import annotations

import bisect
from typing import Final

import pyarrow as pa
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


def _buffer(data: bytes) -> pa.Buffer:
    return pa.py_buffer(data)


class RecordBatchBuilder:
    """Collects consumed records column by column and hands them out as Arrow batches.

    The records are decoded straight into Arrow's buffers (:attr:`columns`, a
    :data:`~highwater.records.columnar.RecordColumns`, which the consumer fills with
    :meth:`~highwater.client.consumer.Consumer.consume_columns`), compiled in C with the
    compiled codec: no Python object per record. :meth:`take` wraps the buffers as arrays,
    without copying them.
    """

    def __init__(self, include_headers: bool) -> None:
        self.include_headers = include_headers
        self.schema = to_arrow_schema(source_schema(include_headers), timezone="UTC")
        from highwater.records.columnar import RecordColumns

        self.columns = RecordColumns(include_headers=include_headers)

    def __len__(self) -> int:
        return len(self.columns)

    def take(self, topic: str, partition: int, end: int | None = None) -> pa.RecordBatch:
        """The collected records of ``topic``/``partition`` (those before offset ``end``
        when it is given) as one batch; starts afresh."""
        # Imported here, not with the module: pyarrow.compute costs about 40 ms of CPU, and
        # of the Python processes Spark starts for a query only the tasks' take batches.
        import pyarrow.compute as pc
        from highwater.records.columnar import finish_columns

        b = finish_columns(self.columns)
        count = b.length
        if end is not None:
            with memoryview(b.offsets).cast("q") as offsets:
                count = bisect.bisect_left(offsets, end)
        n = b.length
        fields = self.schema
        timestamps = pa.Array.from_buffers(pa.int64(), n, [None, _buffer(b.timestamps)])
        columns = [
            pa.Array.from_buffers(
                pa.binary(),
                n,
                [_buffer(b.key_validity), _buffer(b.key_offsets), _buffer(b.key_data)],
            ),
            pa.Array.from_buffers(
                pa.binary(),
                n,
                [_buffer(b.value_validity), _buffer(b.value_offsets), _buffer(b.value_data)],
            ),
            pa.repeat(pa.scalar(topic, fields.field("topic").type), n),
            pa.repeat(pa.scalar(partition, fields.field("partition").type), n),
            pa.Array.from_buffers(pa.int64(), n, [None, _buffer(b.offsets)]),
            pc.multiply(timestamps, 1000).view(fields.field("timestamp").type),
            pa.Array.from_buffers(pa.int32(), n, [None, _buffer(b.timestamp_types)]),
        ]
        if self.include_headers:
            list_type = fields.field("headers").type
            struct_type = list_type.value_type
            total = len(b.header_key_offsets) // 4 - 1
            structs = pa.StructArray.from_arrays(
                [
                    pa.Array.from_buffers(
                        pa.string(),
                        total,
                        [None, _buffer(b.header_key_offsets), _buffer(b.header_key_data)],
                    ),
                    pa.Array.from_buffers(
                        pa.binary(),
                        total,
                        [
                            _buffer(b.header_value_validity),
                            _buffer(b.header_value_offsets),
                            _buffer(b.header_value_data),
                        ],
                    ),
                ],
                fields=list(struct_type),
            )
            columns.append(
                pa.ListArray.from_buffers(
                    list_type, n, [None, _buffer(b.header_offsets)], children=[structs]
                )
            )
        batch = pa.RecordBatch.from_arrays(columns, schema=self.schema)
        return batch if count == n else batch.slice(0, count)
