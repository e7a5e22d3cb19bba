"""The Spark data source ``highwater``: batch and streaming reads and writes of Highwater topics.

The thin glue between PySpark's Python Data Source API and the pure planning in
:mod:`pyspark_highwater.offsets` / :mod:`pyspark_highwater.options`: the driver plans offset
ranges (:mod:`pyspark_highwater.cluster`), the tasks read them
(:mod:`pyspark_highwater.reading`) and write rows (:mod:`pyspark_highwater.writing`).
A streaming query's offsets live in Spark's checkpoint as per-partition JSON; no consumer
group is used.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from pyspark_highwater.cluster import ClusterOffsets, UnknownTopicError
from pyspark_highwater.offsets import (
    OffsetRange,
    PartitionOffsets,
    TopicPartitionKey,
    from_json_dict,
    missing_partitions,
    next_end,
    offsets_went_back,
    plan_ranges,
    reconcile_start,
    records_waiting,
    to_json_dict,
)
from pyspark_highwater.options import (
    HighwaterOptionError,
    OffsetBound,
    ReadOptions,
    Subscription,
    WriteOptions,
    parse_read_options,
    parse_write_options,
)
from pyspark_highwater.reading import DataLossError, data_loss_hint, read_range
from pyspark_highwater.records import source_schema
from pyspark_highwater.writing import WrittenRecords, check_sink_schema, write_batches

__all__ = ["HighwaterDataSource"]

log = logging.getLogger(__name__)

#: How often the driver asks for the latest offsets when some are below the micro-batch's
#: start, and how long it waits between the questions (spark-sql-kafka's
#: ``fetchOffset.numRetries`` and ``fetchOffset.retryIntervalMs``): a leader that has just
#: taken over may answer with a high watermark that has not caught up yet.
LATEST_ATTEMPTS = 3
LATEST_RETRY_INTERVAL_S = 0.5


class RangePartition(InputPartition):
    """One Spark partition: an offset range of one Highwater partition."""

    def __init__(self, value: OffsetRange) -> None:
        super().__init__(value)
        self.range = value


class HighwaterDataSource(DataSource):
    """``format("highwater")``: read and write Highwater topics (see docs/spark.md)."""

    @classmethod
    def name(cls) -> str:
        """The format name Spark knows the source by."""
        return "highwater"

    def _read_options(self, check_client_settings: bool = False) -> ReadOptions:
        return parse_read_options(dict(self.options), check_client_settings=check_client_settings)

    def schema(self) -> StructType:
        """The fixed columns; the options are checked, the cluster is not asked.

        Spark asks for the schema when the DataFrame is defined (``load()``): the
        ``highwater.<setting>`` options are checked here, not again in the Python processes
        that plan the query's reads (:meth:`reader`, :meth:`streamReader`). As in
        spark-sql-kafka, defining the DataFrame needs none of its topics: the same
        ``load()`` starts a stream afresh, restarts one from its checkpoint after a topic
        was deleted, or defines a batch read, and the schema cannot tell them apart. A batch
        read fails on a missing topic when it is planned (:class:`BatchReader`); a stream
        sees no partitions of it until it appears (:class:`StreamReader`)."""
        options = self._read_options(check_client_settings=True)
        return source_schema(options.include_headers)

    def _check_schema(self, options: ReadOptions, schema: StructType) -> None:
        expected = source_schema(options.include_headers)
        if schema != expected:
            raise HighwaterOptionError(
                "the Highwater source has a fixed schema and takes no user-specified one; "
                f"its columns are {', '.join(expected.fieldNames())}"
            )

    def reader(self, schema: StructType) -> DataSourceReader:
        """A batch read from ``startingOffsets`` to ``endingOffsets``."""
        options = self._read_options()
        self._check_schema(options, schema)
        return BatchReader(options)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        """A streaming read, offsets checkpointed by Spark."""
        options = self._read_options()
        self._check_schema(options, schema)
        options.stream_start()
        return StreamReader(options)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceArrowWriter:
        """A batch write of the DataFrame's rows (appended: a topic cannot be overwritten)."""
        if overwrite:
            raise HighwaterOptionError(
                "mode overwrite is not possible for a Highwater topic: records are appended; "
                'use mode("append")'
            )
        options = parse_write_options(dict(self.options))
        _check_sink(options, schema)
        return BatchWriter(options)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamArrowWriter:
        """A streaming write, one Spark task's rows at a time."""
        options = parse_write_options(dict(self.options))
        _check_sink(options, schema)
        return StreamWriter(options)


def _check_sink(options: WriteOptions, schema: StructType) -> None:
    check_sink_schema(schema, options.topic)
    if options.topic is not None:
        ClusterOffsets(options.bootstrap_servers).partitions(
            Subscription("subscribe", topics=(options.topic,))
        )


def _check_named_partitions(options: ReadOptions, partitions: Sequence[TopicPartitionKey]) -> None:
    """Per-partition offsets or times must name exactly the partitions the query reads, as
    spark-sql-kafka requires ("you must specify all TopicPartitions"): an offset for a
    partition the topic does not have is a mistake, and so is a partition left out, which
    would otherwise be read from a place nobody chose (a partition added to the topic
    after the JSON was written, say). -2 and -1 name the earliest and the latest offset."""
    for bound in (options.starting, options.ending):
        if bound is None or bound.kind not in ("offsets", "timestamps"):
            continue
        unknown = missing_partitions(bound.named, partitions)
        if unknown:
            topic, partition = unknown[0]
            count = sum(1 for t, _ in partitions if t == topic)
            raise UnknownTopicError(
                f"{bound.option} names {topic}-{partition}, which does not exist ({topic!r} "
                f"has {count} partition(s))"
            )
        unnamed = missing_partitions(partitions, bound.named)
        if unnamed:
            text = ", ".join(f"{t}-{p}" for t, p in unnamed)
            if bound.kind == "timestamps":
                raise HighwaterOptionError(
                    f"{bound.option} gives no time for {text}: it must give one for every "
                    "partition the query reads"
                )
            raise HighwaterOptionError(
                f"{bound.option} gives no offset for {text}: it must name every partition "
                "the query reads (-2 for the earliest offset, -1 for the latest)"
            )


def _check_batch_order(
    starting: OffsetBound, ending: OffsetBound, start: PartitionOffsets, end: PartitionOffsets
) -> None:
    """A batch query's start may not be after its end (spark-sql-kafka fails the read too):
    reading nothing there would hide a wrong offset or a damaged topic. The message names
    the options as given (offsets or timestamps)."""
    for went_back in offsets_went_back(start, end):
        raise HighwaterOptionError(
            f"{starting.option or 'startingOffsets'}: {went_back.topic}-{went_back.partition} "
            f"starts at {went_back.start}, after its end {went_back.end} "
            f"({ending.option or 'endingOffsets'}, or the partition's latest offset)"
        )


def _read(options: ReadOptions, partition: InputPartition) -> Iterator[pa.RecordBatch]:
    assert isinstance(partition, RangePartition)
    return read_range(
        options.consumer_config(),
        partition.range,
        include_headers=options.include_headers,
        fail_on_data_loss=options.fail_on_data_loss,
        poll_timeout_ms=options.poll_timeout_ms,
    )


def _checked_start(
    options: ReadOptions, start: PartitionOffsets, earliest: PartitionOffsets
) -> PartitionOffsets:
    """``start`` moved up to the earliest offsets; a loss fails the query or is logged."""
    adjusted, losses = reconcile_start(start, earliest)
    for loss in losses:
        if options.fail_on_data_loss:
            raise DataLossError(loss.describe() + data_loss_hint())
        log.warning("%s; skipped (failOnDataLoss=false)", loss.describe())
    return adjusted


def _ranges(
    options: ReadOptions, start: PartitionOffsets, end: PartitionOffsets
) -> list[RangePartition]:
    return [
        RangePartition(r)
        for r in plan_ranges(
            start,
            end,
            min_partitions=options.min_partitions,
            max_records_per_partition=options.max_records_per_partition,
        )
    ]


class BatchReader(DataSourceReader):
    """Plans the batch's ranges once, on the driver, when Spark asks for partitions."""

    def __init__(self, options: ReadOptions) -> None:
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        """The offset ranges between the resolved start and end offsets."""
        options = self.options
        starting, ending = options.batch_bounds()
        cluster = ClusterOffsets(options.bootstrap_servers)
        with cluster.session():
            partitions = cluster.partitions(options.subscription)
            _check_named_partitions(options, partitions)
            earliest = cluster.earliest(partitions)
            latest = cluster.latest(partitions)
            start = cluster.resolve(
                starting, partitions, no_record=options.starting_by_timestamp_strategy
            )
            end = cluster.resolve(ending, partitions)
        _check_batch_order(starting, ending, start, end)
        start = _checked_start(options, start, earliest)
        for tp, offset in end.items():
            if offset > latest[tp]:
                raise HighwaterOptionError(
                    f"endingOffsets: {tp[0]}-{tp[1]} ends at {offset}, beyond its latest "
                    f"offset {latest[tp]}"
                )
        return _ranges(options, start, end)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """The range's records, in a task."""
        return _read(self.options, partition)


class StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches between checkpointed offsets; honours read limits and AvailableNow."""

    def __init__(self, options: ReadOptions) -> None:
        self.options = options
        self.cluster = ClusterOffsets(options.bootstrap_servers)
        self.target: PartitionOffsets | None = None
        """The offsets Trigger.AvailableNow stops at (set when the query starts)."""
        self.last_trigger = -math.inf
        """When (``time.monotonic()``) the last micro-batch was let run under
        ``minOffsetsPerTrigger``: the first one runs whatever waits, as in spark-sql-kafka."""

    def initialOffset(self) -> dict[str, Any]:
        """Where a new query starts: ``startingOffsets`` (default latest). An offset given
        beyond its partition's latest offset is refused. A subscribed topic (or assigned
        partition) that does not exist yet has no start: it is read from its beginning once
        it appears, as a new partition, as in spark-sql-kafka."""
        with self.cluster.session():
            partitions = self.cluster.partitions(self.options.subscription, missing_ok=True)
            _check_named_partitions(self.options, partitions)
            bound = self.options.stream_start()
            start = self.cluster.resolve(
                bound, partitions, no_record=self.options.starting_by_timestamp_strategy
            )
            if bound.kind == "offsets":
                latest = self.cluster.latest(partitions)
                for went_back in offsets_went_back(start, latest):
                    # the first micro-batch would take it for a recreated topic
                    raise HighwaterOptionError(
                        f"startingOffsets: {went_back.topic}-{went_back.partition} starts at "
                        f"{went_back.start}, beyond its latest offset {went_back.end}"
                    )
        return to_json_dict(start)

    def getDefaultReadLimit(self) -> ReadLimit:
        """``maxOffsetsPerTrigger`` records per micro-batch, else ``minOffsetsPerTrigger``
        (wait for that many), else everything available. PySpark has no composite limit: with
        both options the maximum is Spark's limit and the minimum is the source's own."""
        options = self.options
        if options.max_offsets_per_trigger is not None:
            return ReadMaxRows(options.max_offsets_per_trigger)
        if options.min_offsets_per_trigger is not None:
            return ReadMinRows(options.min_offsets_per_trigger)
        return ReadAllAvailable()

    def _min_records(
        self, limit: ReadLimit, begin: PartitionOffsets, latest: PartitionOffsets
    ) -> int | None:
        """The records a micro-batch waits for under ``limit``: none once
        ``maxTriggerDelay`` passed since the last one ran, or enough wait (that micro-batch
        runs now); none when Spark asks for everything, or under Trigger.AvailableNow."""
        if isinstance(limit, ReadMinRows):
            wanted: int | None = limit.min_rows
        elif isinstance(limit, ReadMaxRows):
            wanted = self.options.min_offsets_per_trigger
        else:
            wanted = None
        if wanted is None or self.target is not None:
            return None
        now = time.monotonic()
        overdue = now - self.last_trigger >= self.options.max_trigger_delay_ms / 1000
        if overdue or records_waiting(begin, latest) >= wanted:
            self.last_trigger = now
            return None
        return wanted

    def prepareForTriggerAvailableNow(self) -> None:
        """Remember the latest offsets now: the query stops once it has read up to them."""
        self.target = self._latest()

    def _latest(self) -> PartitionOffsets:
        with self.cluster.session():
            partitions = self.cluster.partitions(self.options.subscription, missing_ok=True)
            return self.cluster.latest(partitions)

    def _start_with_new(
        self, start: PartitionOffsets, latest: PartitionOffsets
    ) -> PartitionOffsets:
        """``start`` plus partitions that appeared since, from their earliest offsets."""
        new = [tp for tp in latest if tp not in start]
        return {**start, **self.cluster.earliest(new)} if new else dict(start)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        """The end of the next micro-batch: the latest offsets, cut by ``limit`` and by the
        AvailableNow target."""
        begin = from_json_dict(start, "start offset")
        with self.cluster.session():
            latest = self._latest()
            for _ in range(LATEST_ATTEMPTS - 1):
                if not offsets_went_back(begin, latest):
                    break
                time.sleep(LATEST_RETRY_INTERVAL_S)
                latest = self._latest()
            begin = self._start_with_new(begin, latest)
        end = next_end(
            begin,
            latest,
            max_records=limit.max_rows if isinstance(limit, ReadMaxRows) else None,
            min_records=self._min_records(limit, begin, latest),
            target=self.target,
        )
        return to_json_dict(end)

    def reportLatestOffset(self) -> dict[str, Any] | None:
        """The latest offsets, for the query's progress reports."""
        return to_json_dict(self._latest())

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        """The ranges of a micro-batch; lost records and deleted partitions are checked
        against ``failOnDataLoss``."""
        begin = from_json_dict(start, "start offset")
        until = from_json_dict(end, "end offset")
        if begin == until:
            return []
        with self.cluster.session():
            return self._ranges_between(begin, until)

    def _ranges_between(
        self, begin: PartitionOffsets, until: PartitionOffsets
    ) -> Sequence[InputPartition]:
        """The ranges from ``begin`` to ``until``, checked against the earliest offsets and
        for offsets that went back (an end below its start: nothing is read there, and the
        next micro-batch starts at the lower end)."""
        options = self.options
        current = self.cluster.partitions(options.subscription, missing_ok=True)
        # deleted since the micro-batch was planned (in its end), or before (left out of it)
        gone = missing_partitions({**begin, **until}, current)
        if gone:
            text = ", ".join(f"{t}-{p}" for t, p in gone)
            message = f"partitions {text} no longer exist (was the topic deleted?)"
            if options.fail_on_data_loss:
                raise DataLossError(message + data_loss_hint())
            log.warning("%s; skipped (failOnDataLoss=false)", message)
            until = {tp: o for tp, o in until.items() if tp not in set(gone)}
        earliest = self.cluster.earliest(list(until))
        # a partition that appeared since the last micro-batch is read from its beginning,
        # offset 0, as in spark-sql-kafka: records already removed below its log start
        # (retention, deleted records) are data loss like any other, not skipped in silence
        begin = {**dict.fromkeys(until, 0), **begin}
        for went_back in offsets_went_back(begin, until):
            if options.fail_on_data_loss:
                raise DataLossError(went_back.describe() + data_loss_hint())
            log.warning("%s; skipped (failOnDataLoss=false)", went_back.describe())
        begin = _checked_start(options, {tp: begin[tp] for tp in until}, earliest)
        return _ranges(options, begin, until)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """The range's records, in a task."""
        return _read(self.options, partition)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to do: the offsets are in Spark's checkpoint, not in a consumer group."""


class BatchWriter(DataSourceArrowWriter):
    """Each task produces its rows; records are visible once written (at-least-once)."""

    def __init__(self, options: WriteOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        """Produce the task's rows and flush."""
        return write_batches(self.options.producer_config(), self.options.topic, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        """Every task wrote its rows: log how many."""
        total = sum(m.records for m in messages if isinstance(m, WrittenRecords))
        log.info("highwater sink: %d records written", total)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """A task failed: records already written stay (a log cannot take them back)."""
        total = sum(m.records for m in messages if isinstance(m, WrittenRecords))
        log.warning(
            "highwater sink: the write was aborted; %d records written by finished tasks "
            "stay in the topic (at-least-once)",
            total,
        )


class StreamWriter(DataSourceStreamArrowWriter):
    """A micro-batch's tasks produce their rows; a replayed batch writes them again."""

    def __init__(self, options: WriteOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        """Produce the task's rows and flush."""
        return write_batches(self.options.producer_config(), self.options.topic, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """The micro-batch is written."""
        total = sum(m.records for m in messages if isinstance(m, WrittenRecords))
        log.info("highwater sink: micro-batch %d: %d records written", batchId, total)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """The micro-batch failed; what its finished tasks wrote stays, and is written
        again when the batch is replayed (at-least-once)."""
        total = sum(m.records for m in messages if isinstance(m, WrittenRecords))
        log.warning(
            "highwater sink: micro-batch %d aborted; %d records already written stay",
            batchId,
            total,
        )
