"""Reading one offset range inside a Spark task, with the blocking client library's Consumer.

The consumer is assigned the range's partition at its start offset, without a group and with
``auto.offset.reset=none``: it fetches from the partition's leader (following leader moves),
and a start below the log start offset comes back as an out-of-range error instead of a
silent jump. Records arrive as Arrow batches of about :data:`BATCH_RECORDS` records, decoded
straight into Arrow's buffers (:meth:`~highwater.client.consumer.Consumer.consume_columns`),
not into a message per record. The next batch's records are fetched and decoded on the
consumer's thread (:meth:`~highwater.client.consumer.Consumer.consume_columns_ahead`) while
Spark takes the last batch from the task, instead of after it.

A fetched RecordBatch is decoded whole, so the builder usually holds somewhat more than
:data:`BATCH_RECORDS` when a batch is handed to Spark: the surplus stays in that batch (up to
:data:`BATCH_RECORDS_MAX`) instead of following as a small batch of its own, which cutting at
exactly :data:`BATCH_RECORDS` made of every other batch (about 1,300 records after 10,000, with
the benchmark's 256 KiB producer batches).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Final

import pyarrow as pa
from highwater.errors import OffsetOutOfRangeError

from pyspark_highwater.offsets import DataLoss, OffsetRange, OffsetsWentBack
from pyspark_highwater.records import RecordBatchBuilder

if TYPE_CHECKING:
    from highwater.client.consumer import Consumer

__all__ = ["BATCH_RECORDS", "BATCH_RECORDS_MAX", "DataLossError", "ReadTimeoutError", "read_range"]

log = logging.getLogger(__name__)

#: The records gathered before an Arrow batch is handed to Spark.
BATCH_RECORDS: Final = 10_000
#: The most records in one Arrow batch handed to Spark (a larger one is cut into slices).
BATCH_RECORDS_MAX: Final = 2 * BATCH_RECORDS
#: The most bytes of keys, values and headers in one Arrow batch (its binary columns' int32
#: offsets hold at most 2 GiB).
BATCH_BYTES: Final = 64 << 20


class DataLossError(RuntimeError):
    """Records the query should have read are gone, and ``failOnDataLoss`` is true."""


class ReadTimeoutError(RuntimeError):
    """A range's records did not arrive within ``pollTimeoutMs``."""


def data_loss_hint() -> str:
    """What the user can do about data loss, appended to every such error."""
    return (
        "; the query fails so that the loss is not silent. Set failOnDataLoss=false to skip "
        "the lost records and go on."
    )


def read_range(
    consumer_config: dict[str, Any],
    r: OffsetRange,
    *,
    include_headers: bool,
    fail_on_data_loss: bool,
    poll_timeout_ms: int,
) -> Iterator[pa.RecordBatch]:
    """The records of ``r`` (offsets ``[start, end)``) as Arrow batches, in offset order.

    Offsets with no record (compacted away, control batches) are skipped. Records removed by
    retention before they were read, and a range beyond the end of the partition's log (an
    offset out of range above it, or no record for ``poll_timeout_ms`` at its high
    watermark: the topic was recreated or its log truncated since the range was planned),
    raise :class:`DataLossError` or are skipped, as ``fail_on_data_loss`` says, as in
    spark-sql-kafka. No record for ``poll_timeout_ms`` below the high watermark raises
    :class:`ReadTimeoutError`.
    """
    from highwater.client.consumer import Consumer, TopicPartition

    builder = RecordBatchBuilder(include_headers)
    tp = TopicPartition(r.topic, r.partition, r.start)
    consumer = Consumer(consumer_config)
    timeout_s = poll_timeout_ms / 1000
    position = r.start

    def consume_ahead() -> Future[BaseException | None]:
        """The next records, fetched and decoded into the builder on the consumer's thread."""
        return consumer.consume_columns_ahead(
            tp,
            builder.columns,
            max(min(BATCH_RECORDS - len(builder), r.end - position), 1),
            timeout=min(1.0, timeout_s),
        )

    ahead: Future[BaseException | None] | None = None
    try:
        consumer.assign([tp])
        deadline = time.monotonic() + timeout_s
        before = 0
        while position < r.end:
            if ahead is None:
                before = len(builder)
                ahead = consume_ahead()
            error = ahead.result()
            ahead = None
            if len(builder) > before:
                deadline = time.monotonic() + timeout_s
                position = builder.columns.last_offset + 1
            if error is not None:
                position = _after_error(consumer, r, position, error, fail_on_data_loss)
                if position < r.end:
                    consumer.seek(TopicPartition(r.topic, r.partition, position))
            elif len(builder) == before:
                current = consumer.position([TopicPartition(r.topic, r.partition)])[0].offset
                if current is not None and current >= r.end:
                    break  # only offsets without records were left
                if time.monotonic() > deadline:
                    _, high = consumer.get_watermark_offsets(
                        TopicPartition(r.topic, r.partition), cached=True
                    )
                    if 0 <= high <= position:
                        _log_ends_early(r, high, fail_on_data_loss)
                        break
                    raise ReadTimeoutError(
                        f"{r.topic}-{r.partition}: no record arrived for {poll_timeout_ms} ms "
                        f"at offset {position} (the range ends at {r.end}); is the partition's "
                        "leader reachable? (pollTimeoutMs sets the wait)"
                    )
                continue
            if len(builder) >= BATCH_RECORDS or builder.columns.nbytes >= BATCH_BYTES:
                batch = builder.take(r.topic, r.partition, r.end)
                if position < r.end:  # fill the emptied builder while Spark takes the batch
                    before = 0
                    ahead = consume_ahead()
                yield from _split(batch)
        if len(builder):
            yield from _split(builder.take(r.topic, r.partition, r.end))
    finally:
        if ahead is not None:  # the task ends early (Spark stopped reading, or an error)
            with contextlib.suppress(Exception):
                ahead.result()
        consumer.close()


def _split(batch: pa.RecordBatch) -> Iterator[pa.RecordBatch]:
    """``batch`` as it is, or in slices of :data:`BATCH_RECORDS` rows when it holds more than
    :data:`BATCH_RECORDS_MAX` (no copy)."""
    if batch.num_rows <= BATCH_RECORDS_MAX:
        yield batch
        return
    for start in range(0, batch.num_rows, BATCH_RECORDS):
        yield batch.slice(start, BATCH_RECORDS)


def _after_error(
    consumer: Consumer,
    r: OffsetRange,
    position: int,
    error: BaseException,
    fail_on_data_loss: bool,
) -> int:
    """Where to go on after an error message at ``position``; raises what cannot be
    handled."""
    from highwater.client.consumer import NoOffsetForPartitionError, TopicPartition

    if not isinstance(error, OffsetOutOfRangeError | NoOffsetForPartitionError):
        raise error
    earliest, high = consumer.get_watermark_offsets(TopicPartition(r.topic, r.partition))
    if position >= high:
        _log_ends_early(r, high, fail_on_data_loss)
        return r.end
    if position >= earliest:
        raise error
    loss = DataLoss(r.topic, r.partition, position, earliest)
    if fail_on_data_loss:
        raise DataLossError(loss.describe() + data_loss_hint())
    log.warning("%s; skipped (failOnDataLoss=false)", loss.describe())
    return min(earliest, r.end)


def _log_ends_early(r: OffsetRange, high: int, fail_on_data_loss: bool) -> None:
    """The partition's log ends at ``high``, before the range's end: it was planned when the
    partition held more (the topic was deleted and created again, or its log truncated).
    Raises :class:`DataLossError`, or logs that the rest of the range is skipped."""
    went_back = OffsetsWentBack(r.topic, r.partition, r.end, high)
    if fail_on_data_loss:
        raise DataLossError(went_back.describe() + data_loss_hint())
    log.warning("%s; skipped (failOnDataLoss=false)", went_back.describe())
