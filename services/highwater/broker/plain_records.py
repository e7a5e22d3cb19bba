"""Fetched batches as one message per record, for fetches in ``RECORD_FORMAT_PLAIN``.

A client in a language without a RecordBatch v2 codec asks for plain records: the broker
reads the same whole batches it would send (the same ``max_bytes`` accounting), then
decodes and decompresses them into ``FetchedRecord`` messages, from the fetch offset on
(the first batch may start before it). Each record carries its batch's timestamp type
and partition leader epoch. A batch that does not decode is the partition's
``CORRUPT_MESSAGE``, as a consumer's own codec would have found it.
"""

from __future__ import annotations

from highwater.errors import HighwaterError
from highwater.records import TimestampType, iter_batches
from highwater.v1 import broker_pb2 as pb

__all__ = ["add_plain_records"]

_TIMESTAMP_TYPES = {
    TimestampType.CREATE_TIME: pb.TIMESTAMP_TYPE_CREATE_TIME,
    TimestampType.LOG_APPEND_TIME: pb.TIMESTAMP_TYPE_LOG_APPEND_TIME,
}


def add_plain_records(
    answer: pb.FetchPartitionResponse,
    batches: bytes,
    fetch_offset: int,
    max_records: int | None = None,
) -> int:
    """Append the records of ``batches`` at or after ``fetch_offset`` to ``answer``; how
    many. With ``max_records``, at most that many: the batches after are not decoded (a
    consumer session out of credit for more). Raises
    :class:`~highwater.errors.HighwaterError` (CORRUPT_MESSAGE and the like) for a batch
    that does not decode; nothing of the answer's records is kept then."""
    out = answer.plain_records
    added = 0
    try:
        for batch in iter_batches(batches):
            if max_records is not None and added >= max_records:
                break
            if batch.is_control or batch.next_offset <= fetch_offset:
                continue
            timestamp_type = _TIMESTAMP_TYPES[batch.timestamp_type]
            leader_epoch = batch.partition_leader_epoch
            for record in batch.records():
                if record.offset < fetch_offset:
                    continue
                item = out.add(
                    offset=record.offset,
                    timestamp_ms=record.timestamp,
                    timestamp_type=timestamp_type,
                    leader_epoch=leader_epoch,
                )
                if record.key is not None:
                    item.key = record.key
                if record.value is not None:
                    item.value = record.value
                for key, value in record.headers:
                    header = item.headers.add(key=key)
                    if value is not None:
                        header.value = value
                added += 1
                if max_records is not None and added >= max_records:
                    break
    except HighwaterError:
        del out[:]
        raise
    return added
