"""The fixed 61-byte header of a Kafka RecordBatch v2: layout, parsing, validation and stamping.

Layout (big-endian), as Kafka's ``DefaultRecordBatch`` defines it::

    offset  size  field
         0     8  base_offset
         8     4  batch_length            bytes that follow this field
        12     4  partition_leader_epoch
        16     1  magic                   always 2
        17     4  crc                     CRC-32C of bytes 21..end (uint32)
        21     2  attributes              compression:3, timestamp_type:1, transactional:1,
                                          control:1, has_delete_horizon:1
        23     4  last_offset_delta
        27     8  base_timestamp
        35     8  max_timestamp
        43     8  producer_id
        51     2  producer_epoch
        53     4  base_sequence
        57     4  records_count
        61        records...

Base offset, batch length, partition leader epoch and magic lie outside the CRC, so a
broker stamps offsets and the leader epoch without touching the checksum.
"""

from __future__ import annotations

import enum
import mmap
import struct
from collections.abc import Callable
from typing import Any, NamedTuple

import crc32c as _crc32c

from highwater.errors import CorruptRecordError, HighwaterError, UnsupportedForMessageFormatError

from .implementation import codec

HEADER_STRUCT = struct.Struct(">qiibIhiqqqhii")
BATCH_HEADER_SIZE = HEADER_STRUCT.size  # 61
LOG_OVERHEAD = 12  # base_offset + batch_length: the part of the header batch_length excludes
MAGIC = 2

BASE_OFFSET_OFFSET = 0
LENGTH_OFFSET = 8
PARTITION_LEADER_EPOCH_OFFSET = 12
MAGIC_OFFSET = 16
CRC_OFFSET = 17
ATTRIBUTES_OFFSET = 21
MAX_TIMESTAMP_OFFSET = 35
RECORDS_OFFSET = BATCH_HEADER_SIZE

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1
NO_PARTITION_LEADER_EPOCH = -1
NO_TIMESTAMP = -1

ReadableBuffer = bytes | bytearray | memoryview | mmap.mmap
"""Anything a batch can be read from: bytes, a view of them, or a memory-mapped file."""

_INT32 = struct.Struct(">i")
_INT64 = struct.Struct(">q")
_UINT32 = struct.Struct(">I")
_INT16 = struct.Struct(">h")
_OFFSET_LENGTH_EPOCH = struct.Struct(">qii")


class Compression(enum.IntEnum):
    """The compression codec in attribute bits 0-2."""

    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4

    @classmethod
    def parse(cls, name: str) -> Compression:
        try:
            return cls[name.upper()]
        except KeyError:
            raise ValueError(f"unknown compression type {name!r}") from None


class TimestampType(enum.IntEnum):
    """Attribute bit 3: who set the timestamps of a batch."""

    CREATE_TIME = 0
    LOG_APPEND_TIME = 1


COMPRESSION_MASK = 0x07
TIMESTAMP_TYPE_MASK = 0x08
TRANSACTIONAL_FLAG = 0x10
CONTROL_FLAG = 0x20
DELETE_HORIZON_FLAG = 0x40


class BatchHeader(NamedTuple):
    """The decoded header of one batch."""

    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int

    @property
    def size(self) -> int:
        """Bytes the whole batch takes in a log file."""
        return self.batch_length + LOG_OVERHEAD

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1

    @property
    def compression(self) -> Compression:
        return Compression(self.attributes & COMPRESSION_MASK)

    @property
    def timestamp_type(self) -> TimestampType:
        return TimestampType((self.attributes & TIMESTAMP_TYPE_MASK) >> 3)

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_FLAG)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_FLAG)

    @property
    def has_delete_horizon(self) -> bool:
        return bool(self.attributes & DELETE_HORIZON_FLAG)

    @property
    def has_producer_id(self) -> bool:
        return self.producer_id >= 0

    @property
    def last_sequence(self) -> int:
        """The sequence of the last record, wrapping at 2**31 as Kafka's sequences do."""
        if self.base_sequence == NO_SEQUENCE:
            return NO_SEQUENCE
        return (self.base_sequence + self.last_offset_delta) % (1 << 31)


def crc32c(data: bytes | bytearray | memoryview) -> int:
    """CRC-32C (Castagnoli) of any buffer, without copying it; hardware accelerated.

    The ``crc32c`` package is used rather than ``google-crc32c`` because it accepts
    memoryview slices and mmaps directly (google-crc32c insists on ``bytes``, which
    would cost a copy of every batch) and releases the GIL while it runs.
    """
    return int(_crc32c.crc32c(data))


def read_header(buf: bytes | bytearray | memoryview, pos: int = 0) -> BatchHeader:
    """Decode the header at ``pos`` without checking anything but that 61 bytes are there."""
    if len(buf) - pos < BATCH_HEADER_SIZE:
        raise CorruptRecordError(
            f"truncated batch header: {len(buf) - pos} bytes, need {BATCH_HEADER_SIZE}"
        )
    return BatchHeader._make(HEADER_STRUCT.unpack_from(buf, pos))


def read_size(buf: bytes | bytearray | memoryview, pos: int = 0) -> int:
    """The whole size of the batch at ``pos``, from its length field alone."""
    return int(_INT32.unpack_from(buf, pos + LENGTH_OFFSET)[0]) + LOG_OVERHEAD


def check_batch(buf: ReadableBuffer, pos: int = 0, *, verify_crc: bool = True) -> BatchHeader:
    """Validate the batch at ``pos`` (sizes, magic, CRC) and return its header.

    ``buf`` may hold more bytes after the batch; the batch must lie entirely in it.
    Raises :class:`CorruptRecordError` or :class:`UnsupportedForMessageFormatError`.

    The compiled twin (:mod:`.implementation`) runs the same checks and computes the CRC
    itself; a batch that fails any of them is handed to this function, which raises.
    """
    available = len(buf) - pos
    if available < BATCH_HEADER_SIZE:
        raise CorruptRecordError(
            f"truncated batch: {available} bytes, a header needs {BATCH_HEADER_SIZE}"
        )
    header = BatchHeader._make(HEADER_STRUCT.unpack_from(buf, pos))
    base_offset, batch_length, _, magic, crc, attributes, last_offset_delta = header[:7]
    if magic != MAGIC:
        raise UnsupportedForMessageFormatError(
            f"batch at offset {base_offset}: magic {magic}, only magic 2 is supported"
        )
    if batch_length < BATCH_HEADER_SIZE - LOG_OVERHEAD:
        raise CorruptRecordError(
            f"batch at offset {base_offset}: length {batch_length} is smaller than a header"
        )
    size = batch_length + LOG_OVERHEAD
    if size > available:
        raise CorruptRecordError(
            f"batch at offset {base_offset}: truncated, length {batch_length} "
            f"but only {available - LOG_OVERHEAD} bytes follow"
        )
    if last_offset_delta < 0 or header[12] < 0:
        raise CorruptRecordError(
            f"batch at offset {base_offset}: negative last offset delta or record count"
        )
    if attributes & COMPRESSION_MASK > Compression.ZSTD:
        raise CorruptRecordError(
            f"batch at offset {base_offset}: unknown compression codec "
            f"{attributes & COMPRESSION_MASK}"
        )
    if verify_crc:
        actual = crc32c(memoryview(buf)[pos + ATTRIBUTES_OFFSET : pos + size])
        if actual != crc:
            raise CorruptRecordError(
                f"batch at offset {base_offset}: CRC mismatch, stored {crc:#010x}, "
                f"computed {actual:#010x}"
            )
    return header


pure_check_batch = check_batch
"""The pure-Python :func:`check_batch`, whichever is loaded (for the tests that compare)."""

if codec is not None:
    codec.bind(check_batch=pure_check_batch, header_type=BatchHeader)
    check_batch = codec.check_batch


OFFSET_INDEX_ENTRY = struct.Struct(">ii")
"""An entry of a segment's ``.index``: (last offset of a batch - base offset, position)."""
TIME_INDEX_ENTRY = struct.Struct(">qi")
"""An entry of a segment's ``.timeindex``: (largest timestamp so far, its offset - base)."""


class BatchScan(NamedTuple):
    """What :func:`scan_batches` found: the valid batches from its start, in one pass."""

    end: int
    """The position after the last valid batch (where the first invalid one starts)."""
    next_offset: int
    """The offset after the last valid batch's last offset."""
    max_timestamp: int
    offset_of_max_timestamp: int
    since_index_entry: int
    """Bytes of batches after the last index entry."""
    offset_index: bytes
    """The offset-index entries (:data:`OFFSET_INDEX_ENTRY`, relative to the scan's
    ``index_base_offset``) of the batches where one falls, in order, as the file holds them."""
    time_index: bytes
    """The time-index entries (:data:`TIME_INDEX_ENTRY`) written beside them, as an empty
    time index takes them: the first, then one whenever the largest timestamp grew."""
    notable: list[BatchHeader]
    """The headers of the batches that raise the partition leader epoch above every earlier
    one of the scan, or carry a producer id: the only ones recovery needs to see."""


def scan_batches(
    buf: ReadableBuffer,
    pos: int,
    end: int,
    *,
    next_offset: int,
    max_offset: int,
    max_batch_size: int,
    index_interval: int,
    since_index_entry: int = 0,
    max_timestamp: int = -1,
    offset_of_max_timestamp: int = 0,
    index_base_offset: int = 0,
) -> BatchScan:
    """Walk and check (:func:`check_batch`, CRC included) the batches of ``buf[pos:end]``
    as crash recovery does, stopping at the first that is invalid, starts below
    ``next_offset``, ends past ``max_offset`` or is larger than ``max_batch_size``.

    An index entry falls at a batch once more than ``index_interval`` bytes of batches
    went by since the last one (``since_index_entry`` counts those before ``pos``); the
    largest timestamp is carried along with the offset that has it. The entries come
    encoded as a segment based at ``index_base_offset`` holds them, so that recovery writes
    each index with one copy (an offset or position that does not fit an entry raises
    ``struct.error``, as appending it to the index would). The compiled twin does the
    whole walk in C, with no Python object per batch but the notable ones.
    """
    offset_entries = bytearray()
    time_entries = bytearray()
    pack_offset, pack_time = OFFSET_INDEX_ENTRY.pack, TIME_INDEX_ENTRY.pack
    last_time_entry: int | None = None
    notable: list[BatchHeader] = []
    since = since_index_entry
    epoch = -1
    valid = pos
    end = min(end, len(buf))
    while valid < end:
        try:
            header = check_batch(buf, valid, verify_crc=True)
        except HighwaterError:
            break
        base_offset, batch_size = header[0], header[1] + LOG_OVERHEAD
        last_offset = base_offset + header[6]
        if (
            base_offset < next_offset
            or last_offset > max_offset
            or batch_size > max_batch_size
            or valid + batch_size > end
        ):
            break
        if header[8] > max_timestamp:
            max_timestamp, offset_of_max_timestamp = header[8], last_offset
        if since > index_interval:
            offset_entries += pack_offset(last_offset - index_base_offset, valid)
            if last_time_entry is None or max_timestamp > last_time_entry:
                time_entries += pack_time(
                    max_timestamp, offset_of_max_timestamp - index_base_offset
                )
                last_time_entry = max_timestamp
            since = 0
        since += batch_size
        if header[2] > epoch or header[9] >= 0:
            epoch = max(epoch, header[2])
            notable.append(header)
        next_offset = last_offset + 1
        valid += batch_size
    return BatchScan(
        valid,
        next_offset,
        max_timestamp,
        offset_of_max_timestamp,
        since,
        bytes(offset_entries),
        bytes(time_entries),
        notable,
    )


pure_scan_batches = scan_batches
"""The pure-Python :func:`scan_batches`."""

if codec is not None:

    def scan_batches(  # the compiled walk; the pure one for arguments out of its range
        buf: ReadableBuffer,
        pos: int,
        end: int,
        *,
        next_offset: int,
        max_offset: int,
        max_batch_size: int,
        index_interval: int,
        since_index_entry: int = 0,
        max_timestamp: int = -1,
        offset_of_max_timestamp: int = 0,
        index_base_offset: int = 0,
    ) -> BatchScan:
        """:func:`pure_scan_batches`, compiled."""
        found = codec.scan_batches(
            buf, pos, end, next_offset, max_offset, max_batch_size, index_interval,
            since_index_entry, max_timestamp, offset_of_max_timestamp, index_base_offset,
        )  # fmt: skip
        if found is None:
            return pure_scan_batches(
                buf, pos, end, next_offset=next_offset, max_offset=max_offset,
                max_batch_size=max_batch_size, index_interval=index_interval,
                since_index_entry=since_index_entry, max_timestamp=max_timestamp,
                offset_of_max_timestamp=offset_of_max_timestamp,
                index_base_offset=index_base_offset,
            )  # fmt: skip
        return BatchScan._make(found)


StampBatches = Callable[
    [ReadableBuffer, int, int, int, int, int, int, int, int, int],
    tuple[bytes, list[BatchHeader], Any, bool] | None,
]

stamp_batches: StampBatches | None = codec.stamp_batches if codec is not None else None
"""A leader's append in one compiled call, or None on the pure-Python implementation:
``stamp_batches(data, next_offset, leader_epoch, max_batch_size, segment_bytes, now,
before_ms, after_ms, log_append_time, log_start_offset)`` makes every check
:meth:`~highwater.storage.log.PartitionLog.append_as_leader` makes of client batches
(:func:`check_batch`'s with the CRC, ``max.message.bytes`` for each batch and
``segment.bytes`` for the whole append, ``records_count == last_offset_delta + 1``, every
record walked as :func:`~.record.check_records` walks it, no batch flagged LogAppendTime,
and, when ``log_append_time`` is negative, each record's timestamp but -1 in the window
``[now - before_ms, now + after_ms]``; it takes no control batch, no compressed batch
(the log decompresses it to walk its records) and no batch with a producer id but a
negative base sequence, which the log refuses from clients) and returns ``(stamped,
headers, info, tracked)``: ``stamped`` holds the batches with their offsets assigned from
``next_offset`` and the leader epoch stamped (with LogAppendTime also the timestamp type,
the max timestamp and the CRC, as :func:`set_log_append_time`; with CreateTime the max
timestamp and CRC where the header's is not its records' largest, as
:func:`set_max_timestamp`) as their stamped 61-byte headers one after another, whatever
the request's size (no batch is copied): :data:`write_stamped` writes each beside the
rest of its batch from ``data``
(:meth:`~highwater.storage.segment.LogSegment.append_stamped`); ``headers`` the stamped
headers as tuples where the log reads them, for two batches or more (the segment indexes
each) or when a batch carries a producer id (the producer state checks each), else empty:
the one batch of a producer without a producer id needs no Python object of its own;
``info`` the append's :class:`~highwater.storage.log.AppendInfo` (its type is the storage
layer's, which binds it to the codec: typed ``Any`` here); ``tracked`` whether a batch
carries a producer id. It returns None, and the log runs the same checks in Python (the
reference, which raises the typed error), for anything they refuse or any value out of
its range, and before the storage layer has bound its type. The storage tests compare the
two paths."""

WriteStamped = Callable[[int, bytes, ReadableBuffer], None]

write_stamped: WriteStamped | None = codec.write_stamped if codec is not None else None
"""The write of a leader's append, compiled (present whenever :data:`stamp_batches` is):
``write_stamped(fd, stamped, data)`` writes the batches of ``data`` to ``fd``, each one's
first 61 bytes taken from ``stamped`` (what :data:`stamp_batches` returned) and the rest from
``data`` in place, with one ``writev`` made without the GIL, continued after a short write
and retried on EINTR as ``os.writev`` is. It raises ``OSError`` (some bytes may be written:
the segment cuts the file back), or ``ValueError`` before writing anything when ``stamped``
does not hold one header per batch of ``data``. It spares a 16 KiB append the Python of a
``writev`` call (the list of pieces, a memoryview, the buffers taken one by one): about a
microsecond, an eighth of the ``write`` itself."""


def set_base_offset(buf: bytearray | memoryview, pos: int, base_offset: int) -> None:
    """Stamp the base offset of the batch at ``pos`` (outside the CRC)."""
    _INT64.pack_into(buf, pos + BASE_OFFSET_OFFSET, base_offset)


def set_partition_leader_epoch(buf: bytearray | memoryview, pos: int, epoch: int) -> None:
    """Stamp the partition leader epoch of the batch at ``pos`` (outside the CRC)."""
    _INT32.pack_into(buf, pos + PARTITION_LEADER_EPOCH_OFFSET, epoch)


def stamped_header(
    buf: ReadableBuffer, pos: int, base_offset: int, partition_leader_epoch: int
) -> bytes:
    """A copy of the 61-byte header at ``pos`` with a new base offset and leader epoch."""
    length = _INT32.unpack_from(buf, pos + LENGTH_OFFSET)[0]
    return _OFFSET_LENGTH_EPOCH.pack(base_offset, length, partition_leader_epoch) + bytes(
        memoryview(buf)[pos + MAGIC_OFFSET : pos + BATCH_HEADER_SIZE]
    )


def set_log_append_time(buf: bytearray | memoryview, pos: int, timestamp: int) -> None:
    """Mark the batch at ``pos`` as LogAppendTime with ``timestamp`` as its max, and re-sign it."""
    set_max_timestamp(buf, pos, timestamp, TimestampType.LOG_APPEND_TIME)


def set_max_timestamp(
    buf: bytearray | memoryview,
    pos: int,
    timestamp: int,
    timestamp_type: TimestampType = TimestampType.CREATE_TIME,
) -> None:
    """Set the max timestamp and timestamp type of the batch at ``pos`` and re-sign it
    (Kafka's ``DefaultRecordBatch.setMaxTimestamp``; both lie inside the CRC)."""
    size = read_size(buf, pos)
    attributes = _INT16.unpack_from(buf, pos + ATTRIBUTES_OFFSET)[0] & ~TIMESTAMP_TYPE_MASK
    if timestamp_type is TimestampType.LOG_APPEND_TIME:
        attributes |= TIMESTAMP_TYPE_MASK
    _INT16.pack_into(buf, pos + ATTRIBUTES_OFFSET, attributes)
    _INT64.pack_into(buf, pos + MAX_TIMESTAMP_OFFSET, timestamp)
    view = memoryview(buf)[pos + ATTRIBUTES_OFFSET : pos + size]
    _UINT32.pack_into(buf, pos + CRC_OFFSET, crc32c(view))


def iter_headers(
    buf: bytes | bytearray | memoryview, *, verify_crc: bool = True
) -> list[tuple[int, BatchHeader]]:
    """Split a buffer of whole batches into (position, header) pairs, validating each."""
    result = []
    pos, end = 0, len(buf)
    while pos < end:
        header = check_batch(buf, pos, verify_crc=verify_crc)
        result.append((pos, header))
        pos += header.size
    return result
