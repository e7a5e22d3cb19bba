"""Fetched batches as one message per record, for fetches in ``RECORD_FORMAT_PLAIN``.

A client in a language without a RecordBatch v2 codec asks for plain records: the broker
reads the same whole batches it would send, then decodes and decompresses them into
``FetchedRecord`` messages, from the fetch offset on (the first batch may start before
it), as many as fit the fetch's ``max_bytes`` counted in the answer's own bytes (a
batch's records, decompressed, may take many times its bytes; the first record always
comes). Each record carries its batch's timestamp type
and partition leader epoch. A batch that does not decode is the partition's
``CORRUPT_MESSAGE``, as a consumer's own codec would have found it.

With the compiled codec (:data:`highwater.records.IMPLEMENTATION` ``"compiled"``), a
batch's records go from its bytes to the protobuf wire form of ``FetchedRecord`` entries
in C (``_codec.plain_records``), and the answer takes them in one parse
(``MergeFromString``), without a Python object per record: about a third of the
broker's CPU per record of building each message from Python. A batch the compiled code
does not take whole (anything unusual or corrupt) is decoded by the pure-Python path,
which stays the reference and raises the typed errors, so both give the same records.
"""

from __future__ import annotations

from typing import Final, NamedTuple

from google.protobuf.internal.containers import RepeatedCompositeFieldContainer

from highwater.errors import HighwaterError
from highwater.records import RecordBatch, TimestampType, iter_batches
from highwater.records.implementation import codec
from highwater.v1 import broker_pb2 as pb

__all__ = ["PlainAdded", "add_plain_records"]

_TIMESTAMP_TYPES = {
    TimestampType.CREATE_TIME: pb.TIMESTAMP_TYPE_CREATE_TIME,
    TimestampType.LOG_APPEND_TIME: pb.TIMESTAMP_TYPE_LOG_APPEND_TIME,
}
_COMPILED: Final = codec if hasattr(codec, "plain_records") else None
"""The compiled walk, when the extension has it (an older build does not)."""
_WIRE_TAG: Final = (pb.FetchPartitionResponse.PLAIN_RECORDS_FIELD_NUMBER << 3) | 2
"""``plain_records`` entries on the wire: field 8, length-delimited; one byte, which the
entries' sizes (:func:`_entry_size`, :func:`_entries_within`) count on."""
assert _WIRE_TAG < 0x80


class PlainAdded(NamedTuple):
    """What :func:`add_plain_records` added to an answer."""

    records: int
    bytes: int
    """The records' entries in the answer's wire form, their field tags and lengths
    included: what the answer grew by."""


def add_plain_records(
    answer: pb.FetchPartitionResponse,
    batches: bytes,
    fetch_offset: int,
    max_records: int | None = None,
    max_bytes: int | None = None,
    *,
    at_least_one: bool = True,
) -> PlainAdded:
    """Append the records of ``batches`` at or after ``fetch_offset`` to ``answer``.

    With ``max_records``, at most that many: the batches after are not decoded (a consumer
    session out of credit for more). With ``max_bytes``, the records' entries come to at
    most that many bytes of the answer, except that the first record comes whatever its
    size when ``at_least_one`` (so that a fetch always progresses): a batch's records are
    decompressed, so they may take many times its bytes, and the answer must still fit
    the receiver (gRPC's default 4 MiB in most languages). Raises
    :class:`~highwater.errors.HighwaterError` (CORRUPT_MESSAGE and the like) for a batch
    that does not decode; nothing of the answer's records is kept then."""
    out = answer.plain_records
    added = size = 0
    wire = bytearray()  # the compiled batches' records, not merged into ``answer`` yet
    try:
        for batch in iter_batches(batches):
            if max_records is not None and added >= max_records:
                break
            if max_bytes is not None and size >= max_bytes and (added or not at_least_one):
                break
            if batch.is_control or batch.next_offset <= fetch_offset:
                continue
            room = None if max_records is None else max_records - added
            compiled = None if _COMPILED is None else _compiled_batch(batch, fetch_offset, room)
            if compiled is not None:
                entries, count = compiled
                full = max_bytes is not None and size + len(entries) > max_bytes
                if full:
                    assert max_bytes is not None
                    entries, count = _entries_within(
                        entries, max_bytes - size, at_least_one and not added
                    )
                wire += entries
                added += count
                size += len(entries)
                if full:
                    break  # the rest of the batch and the batches after: the next fetch
                continue
            if wire:  # the records before this batch go first
                answer.MergeFromString(bytes(wire))
                wire.clear()
            count, grew, full = _pure_batch(
                out,
                batch,
                fetch_offset,
                room,
                None if max_bytes is None else max_bytes - size,
                at_least_one and not added,
            )
            added += count
            size += grew
            if full:
                break
        if wire:
            answer.MergeFromString(bytes(wire))
    except HighwaterError:
        del out[:]
        raise
    return PlainAdded(added, size)


def _entry_size(message_bytes: int) -> int:
    """The bytes of one ``plain_records`` entry whose message is ``message_bytes`` long:
    its tag, its length's varint and the message."""
    return 1 + _varint_bytes(message_bytes) + message_bytes


def _varint_bytes(value: int) -> int:
    """How many bytes the protobuf varint of ``value`` (not negative) takes."""
    return max(1, (value.bit_length() + 6) // 7)


def _entries_within(entries: bytes, limit: int, first: bool) -> tuple[bytes, int]:
    """The leading ``plain_records`` entries of ``entries`` (the compiled wire form) that
    come to at most ``limit`` bytes, and how many; with ``first``, the first one whatever
    its size."""
    pos = count = 0
    end = len(entries)
    while pos < end:
        length = shift = 0
        at = pos + 1  # after the one-byte tag (field 8, length-delimited)
        while True:
            byte = entries[at]
            at += 1
            length |= (byte & 0x7F) << shift
            if byte < 0x80:
                break
            shift += 7
        after = at + length
        if after > limit and not (first and count == 0):
            break
        pos = after
        count += 1
    return entries[:pos], count


def _compiled_batch(
    batch: RecordBatch, fetch_offset: int, room: int | None
) -> tuple[bytes, int] | None:
    """The batch's records from ``fetch_offset`` on (at most ``room``) as wire entries and
    their count, or None where the compiled code stopped short of the batch's end (the
    pure path then decodes the batch, or says what is wrong with it)."""
    h = batch.header
    data, pos, end = batch.records_payload()
    log_append_time = (
        h.max_timestamp if batch.timestamp_type is TimestampType.LOG_APPEND_TIME else None
    )
    wire, pos, decoded, _, added = _COMPILED.plain_records(  # type: ignore[union-attr]
        data,
        pos,
        end,
        h.records_count,
        h.base_offset,
        h.base_timestamp,
        log_append_time,
        h.last_offset_delta,
        fetch_offset,
        _TIMESTAMP_TYPES[batch.timestamp_type],
        h.partition_leader_epoch,
        -1 if room is None else room,
        _WIRE_TAG,
    )
    if decoded == h.records_count and pos == end:
        return wire, added
    if room is not None and added >= room:  # out of room: the rest is not wanted
        return wire, added
    return None


def _pure_batch(
    out: RepeatedCompositeFieldContainer[pb.FetchedRecord],
    batch: RecordBatch,
    fetch_offset: int,
    room: int | None,
    max_bytes: int | None,
    first: bool,
) -> tuple[int, int, bool]:
    """The batch's records from ``fetch_offset`` on (at most ``room``, their entries at most
    ``max_bytes``, but with ``first`` the first whatever its size), added to ``out`` one
    message at a time; how many, their entries' bytes, and whether ``max_bytes`` stopped
    them."""
    timestamp_type = _TIMESTAMP_TYPES[batch.timestamp_type]
    leader_epoch = batch.partition_leader_epoch
    added = size = 0
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
        grew = _entry_size(item.ByteSize())
        if max_bytes is not None and size + grew > max_bytes and not (first and added == 0):
            del out[-1]
            return added, size, True
        added += 1
        size += grew
        if room is not None and added >= room:
            break
    return added, size, False
