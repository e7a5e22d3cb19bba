"""The floor of a Python data source in Spark: a source and a sink that only hand Arrow over.

The Spark suite runs these beside ``format("highwater")`` to show the floor that PySpark's
Python Data Source API sets on this machine, with no Highwater code, client or server in the
way:

- the source ``highwater-floor`` reads ``records`` offsets in :data:`PARTITIONS` ranges and
  yields Arrow batches of the Highwater source's columns (a 100-byte value, a short key),
  built once per task and handed out again and again, so that its reading costs nothing;
- its sink takes a task's Arrow batches, counts their rows and drops them.

Neither imports Highwater: the Python processes Spark starts for them import only PySpark
and pyarrow, as a data source with no dependencies would. Spark's workers import this module
by name (the suite puts the repository on their ``PYTHONPATH``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

#: How many Spark partitions the source plans: the Highwater topic's partition count.
PARTITIONS = 2
#: Rows per Arrow batch: the Highwater source's ``BATCH_RECORDS``.
BATCH_ROWS = 10_000
VALUE_BYTES = 100

_SCHEMA = StructType(
    [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
    ]
)
_ARROW_SCHEMA = pa.schema(
    [
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp", pa.timestamp("us", tz="UTC")),
        ("timestampType", pa.int32()),
    ]
)


class FloorSource(DataSource):
    """``format("highwater-floor")``: option ``records`` (source), nothing (sink)."""

    @classmethod
    def name(cls) -> str:
        """The format name."""
        return "highwater-floor"

    def schema(self) -> StructType:
        """The Highwater source's columns, without headers."""
        return _SCHEMA

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        """Offsets 0 to ``records``, all available at once."""
        return FloorReader(int(self.options.get("records", "0")))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamArrowWriter:
        """A sink that counts and drops."""
        return FloorWriter()


class FloorRange(InputPartition):
    """Offsets ``[start, end)`` of partition ``partition``."""

    def __init__(self, partition: int, start: int, end: int) -> None:
        super().__init__((partition, start, end))
        self.partition = partition
        self.start = start
        self.end = end


def _batch(partition: int, rows: int) -> pa.RecordBatch:
    padding = b"x" * (VALUE_BYTES - 12)
    return pa.RecordBatch.from_arrays(
        [
            pa.array([b"k%d" % i for i in range(rows)], pa.binary()),
            pa.array([b"%012d" % i + padding for i in range(rows)], pa.binary()),
            pa.repeat(pa.scalar("floor", pa.string()), rows),
            pa.repeat(pa.scalar(partition, pa.int32()), rows),
            pa.array(range(rows), pa.int64()),
            pa.repeat(pa.scalar(1_764_000_000_000_000, pa.timestamp("us", tz="UTC")), rows),
            pa.repeat(pa.scalar(0, pa.int32()), rows),
        ],
        schema=_ARROW_SCHEMA,
    )


class FloorReader(DataSourceStreamReader):
    """One micro-batch of ``records`` offsets, split evenly over :data:`PARTITIONS`."""

    def __init__(self, records: int) -> None:
        self.records = records

    def initialOffset(self) -> dict[str, Any]:
        """The start: offset 0."""
        return {"offset": 0}

    def latestOffset(self) -> dict[str, Any]:
        """Everything, at once."""
        return {"offset": self.records}

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        """The micro-batch's offsets in :data:`PARTITIONS` ranges."""
        first, last = int(start["offset"]), int(end["offset"])
        step = -(-(last - first) // PARTITIONS)
        return [
            FloorRange(p, s, min(s + step, last))
            for p, s in enumerate(range(first, last, step or 1))
        ]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """The range's rows: one prepared batch (and its slice for the tail) over and over."""
        assert isinstance(partition, FloorRange)
        batch = _batch(partition.partition, BATCH_ROWS)
        for start in range(partition.start, partition.end, BATCH_ROWS):
            rows = min(BATCH_ROWS, partition.end - start)
            yield batch if rows == BATCH_ROWS else batch.slice(0, rows)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing kept."""


@dataclass
class CountedRows(WriterCommitMessage):
    """What one task of the sink dropped."""

    rows: int


class FloorWriter(DataSourceStreamArrowWriter):
    """Counts a task's rows and drops them."""

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        """Every batch read, none kept."""
        return CountedRows(sum(batch.num_rows for batch in iterator))

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing to do."""

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing to undo."""
