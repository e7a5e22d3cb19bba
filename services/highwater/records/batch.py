"""RecordBatch v2: building batches (one-shot and incrementally) and reading them without copies.

A batch is the 61-byte header of :mod:`.header` followed by its records, compressed
together when the attributes name a codec. :class:`RecordBatch` is a validated view over
the bytes of one batch wherever they lie (a produce request, a segment read, a fetch
reply); it decodes records only when asked. :func:`build_batch` and
:class:`RecordBatchBuilder` write batches that any Kafka client reads.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, TypeVar

from highwater.errors import CorruptRecordError, InvalidRecordError, RecordTooLargeError

from .columnar import read_columns
from .compression import DEFAULT_MAX_DECOMPRESSED_SIZE, compress_buffer, decompress
from .header import (
    ATTRIBUTES_OFFSET,
    BATCH_HEADER_SIZE,
    COMPRESSION_MASK,
    CONTROL_FLAG,
    CRC_OFFSET,
    DELETE_HORIZON_FLAG,
    HEADER_STRUCT,
    LOG_OVERHEAD,
    MAGIC,
    NO_PARTITION_LEADER_EPOCH,
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    NO_SEQUENCE,
    NO_TIMESTAMP,
    TIMESTAMP_TYPE_MASK,
    TRANSACTIONAL_FLAG,
    BatchHeader,
    Compression,
    TimestampType,
    check_batch,
    crc32c,
)
from .implementation import codec
from .record import (
    MIN_RECORD_SIZE,
    Header,
    Record,
    RecordFactory,
    RecordFields,
    SimpleRecordLike,
    SlotFactory,
    encode_record,
    encode_records,
    read_record,
    read_records,
    record_size,
    write_record,
)
from .varint import (
    INT32_MAX,
    INT32_MIN,
    INT64_MAX,
    INT64_MIN,
    Buffer,
    decode_varint,
    skip_varint,
)

_T = TypeVar("_T")

_UINT32 = struct.Struct(">I")
_INT16_MIN, _INT16_MAX = -(1 << 15), (1 << 15) - 1
# Smallest body of a record (its length prefix excluded).
_MIN_BODY = MIN_RECORD_SIZE - 1

DEFAULT_BATCH_SIZE = 16384  # the producer's batch.size


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _check_range(name: str, value: int, low: int, high: int) -> None:
    if not low <= value <= high:
        raise InvalidRecordError(f"{name} {value} is outside [{low}, {high}]")


def _check_producer_state(
    producer_id: int,
    producer_epoch: int,
    base_sequence: int,
    is_transactional: bool,
    is_control: bool,
) -> None:
    """The rules Kafka's ``MemoryRecordsBuilder`` enforces on the producer fields."""
    _check_range("producer id", producer_id, INT64_MIN, INT64_MAX)
    _check_range("producer epoch", producer_epoch, _INT16_MIN, _INT16_MAX)
    _check_range("base sequence", base_sequence, INT32_MIN, INT32_MAX)
    if is_transactional and producer_id == NO_PRODUCER_ID:
        raise InvalidRecordError("a transactional batch needs a producer id")
    if producer_id != NO_PRODUCER_ID:
        if producer_epoch == NO_PRODUCER_EPOCH:
            raise InvalidRecordError(f"producer id {producer_id} without a producer epoch")
        if base_sequence == NO_SEQUENCE and not is_control:
            raise InvalidRecordError(f"producer id {producer_id} without a base sequence")


def _attributes(
    compression: Compression,
    timestamp_type: TimestampType,
    is_transactional: bool,
    is_control: bool,
    has_delete_horizon: bool,
) -> int:
    attributes = int(compression)
    if timestamp_type == TimestampType.LOG_APPEND_TIME:
        attributes |= TIMESTAMP_TYPE_MASK
    if is_transactional:
        attributes |= TRANSACTIONAL_FLAG
    if is_control:
        attributes |= CONTROL_FLAG
    if has_delete_horizon:
        attributes |= DELETE_HORIZON_FLAG
    return attributes


def _finish_batch(
    out: bytearray,
    *,
    records_count: int,
    last_offset_delta: int,
    base_timestamp: int,
    max_timestamp: int,
    base_offset: int,
    partition_leader_epoch: int,
    compression: Compression,
    timestamp_type: TimestampType,
    producer_id: int,
    producer_epoch: int,
    base_sequence: int,
    is_transactional: bool,
    is_control: bool,
    has_delete_horizon: bool,
    compression_level: int | None,
) -> bytes:
    """Compress the records in ``out[61:]``, write the header and the CRC; return the batch.

    A batch without records is written uncompressed, as Kafka writes empty batches.
    """
    _check_range("base offset", base_offset, INT64_MIN, INT64_MAX)
    _check_range("partition leader epoch", partition_leader_epoch, INT32_MIN, INT32_MAX)
    _check_range("last offset delta", last_offset_delta, 0, INT32_MAX)
    _check_range("records count", records_count, 0, INT32_MAX)
    _check_range("max timestamp", max_timestamp, INT64_MIN, INT64_MAX)
    _check_producer_state(producer_id, producer_epoch, base_sequence, is_transactional, is_control)
    if records_count == 0:
        compression = Compression.NONE
    if compression != Compression.NONE:
        body = memoryview(out)[BATCH_HEADER_SIZE:]
        try:
            compressed = compress_buffer(compression, body, level=compression_level)
        finally:
            body.release()
        del out[BATCH_HEADER_SIZE:]
        out += compressed
    if len(out) - LOG_OVERHEAD > INT32_MAX:
        raise RecordTooLargeError(f"a batch of {len(out)} bytes does not fit a batch length")
    HEADER_STRUCT.pack_into(
        out,
        0,
        base_offset,
        len(out) - LOG_OVERHEAD,
        partition_leader_epoch,
        MAGIC,
        0,
        _attributes(compression, timestamp_type, is_transactional, is_control, has_delete_horizon),
        last_offset_delta,
        base_timestamp,
        max_timestamp,
        producer_id,
        producer_epoch,
        base_sequence,
        records_count,
    )
    with memoryview(out) as view:
        crc = crc32c(view[ATTRIBUTES_OFFSET:])
    _UINT32.pack_into(out, CRC_OFFSET, crc)
    return bytes(out)


def build_batch(
    records: Iterable[SimpleRecordLike],
    *,
    base_offset: int = 0,
    compression: Compression = Compression.NONE,
    timestamp_type: TimestampType = TimestampType.CREATE_TIME,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = NO_PRODUCER_EPOCH,
    base_sequence: int = NO_SEQUENCE,
    partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH,
    is_transactional: bool = False,
    is_control: bool = False,
    delete_horizon_ms: int | None = None,
    last_offset_delta: int | None = None,
    compression_level: int | None = None,
) -> bytes:
    """Encode ``records`` as one batch.

    Each record gives ``key``, ``value``, ``headers`` and ``timestamp`` (milliseconds;
    ``None`` means now). Its offset delta is its ``offset_delta`` attribute if it has one
    that is not ``None``; a :class:`Record` (read from another batch) keeps its offset, at
    ``offset - base_offset``; any other record follows the previous one. Deltas must
    increase. ``last_offset_delta`` defaults to the last record's delta; a larger value
    keeps the offset range of a batch whose last records were removed, which is how the
    log cleaner keeps an empty batch for a producer's state.

    The base timestamp is the first record's timestamp, or ``delete_horizon_ms`` when one
    is given (and the delete-horizon attribute is set): record timestamps are deltas from
    it. The max timestamp is the largest record timestamp. ``compression_level`` overrides
    the codec's default (Kafka's ``compression.<codec>.level``).

    Raises :class:`InvalidRecordError` for values that do not fit their fields or break
    Kafka's rules on producer fields (a transactional batch needs a producer id...).
    """
    out = bytearray(BATCH_HEADER_SIZE)
    base_timestamp = delete_horizon_ms
    if base_timestamp is not None:
        _check_range("delete horizon", base_timestamp, INT64_MIN, INT64_MAX)
    max_timestamp = NO_TIMESTAMP
    count = 0
    previous_delta = -1
    now: int | None = None
    for record in records:
        timestamp = record.timestamp
        if timestamp is None:
            if now is None:
                now = _now_ms()
            timestamp = now
        offset_delta: int | None = getattr(record, "offset_delta", None)
        if offset_delta is None:
            if isinstance(record, Record):
                offset_delta = record.offset - base_offset
            else:
                offset_delta = previous_delta + 1
        if offset_delta <= previous_delta:
            raise InvalidRecordError(
                f"offset delta {offset_delta} does not follow {previous_delta}: "
                f"offsets must increase within a batch"
            )
        if not INT64_MIN <= timestamp <= INT64_MAX:
            raise InvalidRecordError(f"timestamp {timestamp} does not fit in an int64")
        if base_timestamp is None:
            base_timestamp = timestamp
        if count == 0 or timestamp > max_timestamp:
            max_timestamp = timestamp
        write_record(
            out,
            offset_delta,
            timestamp - base_timestamp,
            record.key,
            record.value,
            record.headers,
        )
        previous_delta = offset_delta
        count += 1
    if last_offset_delta is None:
        last_offset_delta = max(previous_delta, 0)
    elif last_offset_delta < previous_delta:
        raise InvalidRecordError(
            f"last offset delta {last_offset_delta} is below the last record's {previous_delta}"
        )
    return _finish_batch(
        out,
        records_count=count,
        last_offset_delta=last_offset_delta,
        base_timestamp=NO_TIMESTAMP if base_timestamp is None else base_timestamp,
        max_timestamp=max_timestamp,
        base_offset=base_offset,
        partition_leader_epoch=partition_leader_epoch,
        compression=compression,
        timestamp_type=timestamp_type,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        is_transactional=is_transactional,
        is_control=is_control,
        has_delete_horizon=delete_horizon_ms is not None,
        compression_level=compression_level,
    )


def build_batch_of_records(
    records: bytes,
    records_count: int,
    *,
    base_offset: int,
    last_offset_delta: int,
    base_timestamp: int,
    max_timestamp: int,
    compression: Compression,
    timestamp_type: TimestampType,
    producer_id: int,
    producer_epoch: int,
    base_sequence: int,
    partition_leader_epoch: int,
    is_transactional: bool,
    delete_horizon_ms: int | None,
) -> bytes:
    """A batch of records already encoded as :func:`build_batch` encodes them (relative to
    ``base_timestamp``; ``delete_horizon_ms`` when given, as there): its last step, the
    compression, header and CRC. What the log cleaner writes for a batch it filtered
    (:meth:`RecordBatch.filter_records`), byte for byte what :func:`build_batch` of the
    kept records would give."""
    if delete_horizon_ms is not None:
        _check_range("delete horizon", delete_horizon_ms, INT64_MIN, INT64_MAX)
    out = bytearray(BATCH_HEADER_SIZE)
    out += records
    return _finish_batch(
        out,
        records_count=records_count,
        last_offset_delta=last_offset_delta,
        base_timestamp=base_timestamp,
        max_timestamp=max_timestamp,
        base_offset=base_offset,
        partition_leader_epoch=partition_leader_epoch,
        compression=compression,
        timestamp_type=timestamp_type,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        is_transactional=is_transactional,
        is_control=False,
        has_delete_horizon=delete_horizon_ms is not None,
        compression_level=None,
    )


class RecordBatchBuilder:
    """Accumulates records into one batch, the way a producer fills a ``batch.size`` buffer.

    An append only checks the record and adds its encoded size (:func:`record_size`);
    the records are encoded together by :meth:`build`, in one pass (:func:`encode_records`),
    which is much cheaper per record than encoding each on its own, and then compressed,
    given a header and a CRC. The size limit applies to :attr:`estimated_size`, the
    header plus the records before compression (an upper bound for compressible data).

    With the compiled codec the builder keeps no Python object per record: its
    ``_buffer`` (``highwater.records._codec.RecordBuffer``) writes each appended record's
    varint-framed body into one block of bytes at once and keeps the count, the size and
    the timestamps in C; :attr:`records` decodes them back when asked (the producer's
    delivery callbacks and handles), and :meth:`build` takes the block as it is. The bytes
    built are the same either way (tests/records/test_records_compiled.py).
    """

    __slots__ = (
        "_base_offset",
        "_base_sequence",
        "_base_timestamp",
        "_buffer",
        "_built",
        "_compression",
        "_compression_level",
        "_encoded",
        "_is_transactional",
        "_max_bytes",
        "_max_timestamp",
        "_partition_leader_epoch",
        "_producer_epoch",
        "_producer_id",
        "_records",
        "_size",
        "_sizes",
        "_timestamp_type",
    )

    def __init__(
        self,
        *,
        max_bytes: int = DEFAULT_BATCH_SIZE,
        compression: Compression = Compression.NONE,
        timestamp_type: TimestampType = TimestampType.CREATE_TIME,
        base_offset: int = 0,
        partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH,
        producer_id: int = NO_PRODUCER_ID,
        producer_epoch: int = NO_PRODUCER_EPOCH,
        base_sequence: int = NO_SEQUENCE,
        is_transactional: bool = False,
        compression_level: int | None = None,
    ) -> None:
        self._max_bytes = max_bytes
        self._compression = compression
        self._compression_level = compression_level
        self._timestamp_type = timestamp_type
        self._base_offset = base_offset
        self._partition_leader_epoch = partition_leader_epoch
        self._producer_id = producer_id
        self._producer_epoch = producer_epoch
        self._base_sequence = base_sequence
        self._is_transactional = is_transactional
        self._records: list[RecordFields] = []
        self._sizes: list[int] = []  # each record's, for the encoding
        self._size = BATCH_HEADER_SIZE
        self._base_timestamp: int | None = None
        self._max_timestamp = NO_TIMESTAMP
        self._built: bytes | None = None
        self._encoded: tuple[bytes, int] | None = None
        self._buffer: Any = (
            None if codec is None else codec.RecordBuffer(max_bytes, BATCH_HEADER_SIZE)
        )

    def append(
        self,
        key: bytes | None,
        value: bytes | None,
        headers: Sequence[Header] = (),
        timestamp: int | None = None,
    ) -> bool:
        """Add a record; ``False`` (and nothing added) if it would make the batch exceed
        ``max_bytes``. The first record is always accepted, whatever its size.

        ``timestamp`` is in milliseconds, ``None`` meaning now. Raises
        :class:`InvalidRecordError` (and adds nothing) for a record that cannot be encoded.
        """
        fields = (key, value, headers, _now_ms() if timestamp is None else timestamp)
        return append_fields(self, fields) > 0

    def append_fields(self, fields: RecordFields) -> int:
        """:meth:`append` of a record given as ``(key, value, headers, timestamp)``, kept
        as it is; returns the bytes it adds to :attr:`estimated_size`, 0 if it does not fit.

        The producer's way in: one call per record, nothing repacked.
        """
        if self._built is not None or self._encoded is not None:
            raise RuntimeError("the batch has been built; start a new one")
        key, value, headers, timestamp = fields
        if not INT64_MIN <= timestamp <= INT64_MAX:
            raise InvalidRecordError(f"timestamp {timestamp} does not fit in an int64")
        buffer = self._buffer
        if buffer is not None:  # what the compiled append leaves: checked and written here
            count = buffer.count
            delta = 0 if count == 0 else timestamp - buffer.base_timestamp
            size = record_size(count, delta, key, value, headers)
            if count and buffer.size + size > self._max_bytes:
                return 0
            buffer.append_encoded(encode_record(count, delta, key, value, headers), timestamp)
            return size
        records = self._records
        base_timestamp = self._base_timestamp
        if base_timestamp is None:
            size = record_size(0, 0, key, value, headers)
            self._base_timestamp = self._max_timestamp = timestamp
        else:
            size = record_size(len(records), timestamp - base_timestamp, key, value, headers)
            if self._size + size > self._max_bytes:
                return 0
            if timestamp > self._max_timestamp:
                self._max_timestamp = timestamp
        self._size += size
        records.append(fields)
        self._sizes.append(size)
        return size

    def adopt_records(self, records: bytes, count: int, timestamp: int) -> None:
        """Take ``records``, ``count`` record bodies encoded already (offset deltas 0 to
        ``count - 1``, timestamp deltas from ``timestamp``, as
        :func:`~highwater.records.columnar.encode_rows` writes them), as the whole batch:
        the columnar way in, with nothing kept per record. The builder must be empty, and
        takes no record after them."""
        if (
            self._built is not None
            or self._records
            or self._encoded is not None
            or (self._buffer is not None and self._buffer.count)
        ):
            raise RuntimeError("records are adopted by an empty builder only")
        if not 0 < count <= INT32_MAX:
            raise InvalidRecordError(f"records count {count} is outside [1, {INT32_MAX}]")
        if not INT64_MIN <= timestamp <= INT64_MAX:
            raise InvalidRecordError(f"timestamp {timestamp} does not fit in an int64")
        self._encoded = (records, count)
        self._base_timestamp = self._max_timestamp = timestamp
        self._size = BATCH_HEADER_SIZE + len(records)
        self._built = None

    def set_producer_state(
        self,
        producer_id: int,
        producer_epoch: int,
        base_sequence: int,
        is_transactional: bool | None = None,
    ) -> None:
        """Set the idempotence fields, which a producer assigns when it drains the batch."""
        if self._built is not None:
            raise RuntimeError("the batch has been built")
        self._producer_id = producer_id
        self._producer_epoch = producer_epoch
        self._base_sequence = base_sequence
        if is_transactional is not None:
            self._is_transactional = is_transactional

    @property
    def records_count(self) -> int:
        if self._encoded is not None:
            return self._encoded[1]
        return len(self._records) if self._buffer is None else int(self._buffer.count)

    @property
    def records(self) -> list[RecordFields]:
        """The records appended, as ``(key, value, headers, timestamp)``, in order (kept
        after :meth:`build`: a producer reports on them). Do not modify the list.

        With the compiled codec they are decoded from the batch's bytes (once for each
        number of records): keys and values as bytes, headers as a tuple of pairs."""
        if self._buffer is None or self._encoded is not None:
            return self._records
        records: list[RecordFields] = self._buffer.records()
        return records

    @property
    def estimated_size(self) -> int:
        """Header plus records as they will be encoded, before compression."""
        if self._built is not None:
            return len(self._built)
        if self._buffer is None or self._encoded is not None:
            return self._size
        return int(self._buffer.size)

    @property
    def max_bytes(self) -> int:
        return self._max_bytes

    @property
    def base_timestamp(self) -> int | None:
        """The first record's timestamp; ``None`` before any append."""
        if self._buffer is None or self._encoded is not None:
            return self._base_timestamp
        base: int | None = self._buffer.base_timestamp
        return base

    @property
    def max_timestamp(self) -> int:
        if self._buffer is None or self._encoded is not None:
            return self._max_timestamp
        return int(self._buffer.max_timestamp)

    @property
    def is_built(self) -> bool:
        return self._built is not None

    def build(self) -> bytes:
        """The finished batch. The builder is closed afterwards; calling again returns it."""
        if self._built is None:
            count = self.records_count
            base_timestamp = self.base_timestamp
            buffer = self._buffer
            if self._encoded is not None:
                out = bytearray(BATCH_HEADER_SIZE)
                out += self._encoded[0]
            elif buffer is not None:
                out = buffer.batch()  # the header's room, then the records as written
            elif count:
                out = bytearray(BATCH_HEADER_SIZE)
                assert base_timestamp is not None
                out += encode_records(self._records, base_timestamp, self._sizes)
            else:
                out = bytearray(BATCH_HEADER_SIZE)
            self._built = _finish_batch(
                out,
                records_count=count,
                last_offset_delta=max(count - 1, 0),
                base_timestamp=NO_TIMESTAMP if base_timestamp is None else base_timestamp,
                max_timestamp=self.max_timestamp,
                base_offset=self._base_offset,
                partition_leader_epoch=self._partition_leader_epoch,
                compression=self._compression,
                timestamp_type=self._timestamp_type,
                producer_id=self._producer_id,
                producer_epoch=self._producer_epoch,
                base_sequence=self._base_sequence,
                is_transactional=self._is_transactional,
                is_control=False,
                has_delete_horizon=False,
                compression_level=self._compression_level,
            )
        return self._built


pure_append_fields = RecordBatchBuilder.append_fields
"""The pure-Python :meth:`RecordBatchBuilder.append_fields`."""


def append_fields(builder: RecordBatchBuilder, fields: RecordFields) -> int:
    """``builder.append_fields(fields)``: what a producer calls once per record; compiled
    with the compiled codec (the builder's slots are updated from C, the pure method taking
    over for anything unusual, such as a timestamp out of range)."""
    return pure_append_fields(builder, fields)


if codec is not None:
    codec.bind(builder_type=RecordBatchBuilder, append_fields=pure_append_fields)
    append_fields = codec.append_fields


class RecordBatch:
    """A validated, read-only view over the bytes of one batch in ``buf`` at ``pos``.

    Construction checks sizes, magic and (unless ``verify_crc`` is false) the CRC,
    raising :class:`CorruptRecordError` or ``UnsupportedForMessageFormatError``.
    Records are decoded, and decompressed, only by :meth:`records` and
    :meth:`iter_keys`, which check the record framing as they go.

    The view keeps a reference to ``buf``; do not mutate it while the view is in use.
    """

    __slots__ = ("_buf", "_pos", "header")

    header: BatchHeader

    def __init__(self, buf: Buffer, pos: int = 0, verify_crc: bool = True) -> None:
        self.header = check_batch(buf, pos, verify_crc=verify_crc)
        self._buf = buf
        self._pos = pos

    # --- where the bytes are --------------------------------------------------------

    @property
    def size(self) -> int:
        """Bytes the batch takes, header included."""
        return self.header.batch_length + LOG_OVERHEAD

    @property
    def position(self) -> int:
        """Where the batch starts in the buffer it was read from."""
        return self._pos

    def view(self) -> memoryview:
        """The batch's bytes, without a copy (what a broker appends or serves)."""
        return memoryview(self._buf)[self._pos : self._pos + self.size]

    def to_bytes(self) -> bytes:
        """A copy of the batch's bytes."""
        return bytes(self._buf[self._pos : self._pos + self.size])

    # --- header fields --------------------------------------------------------------

    @property
    def base_offset(self) -> int:
        return self.header.base_offset

    @property
    def last_offset_delta(self) -> int:
        return self.header.last_offset_delta

    @property
    def last_offset(self) -> int:
        return self.header.base_offset + self.header.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.header.base_offset + self.header.last_offset_delta + 1

    @property
    def records_count(self) -> int:
        return self.header.records_count

    @property
    def partition_leader_epoch(self) -> int:
        return self.header.partition_leader_epoch

    @property
    def magic(self) -> int:
        return self.header.magic

    @property
    def crc(self) -> int:
        return self.header.crc

    @property
    def attributes(self) -> int:
        return self.header.attributes

    @property
    def compression(self) -> Compression:
        return self.header.compression

    @property
    def timestamp_type(self) -> TimestampType:
        return self.header.timestamp_type

    @property
    def is_transactional(self) -> bool:
        return self.header.is_transactional

    @property
    def is_control(self) -> bool:
        return self.header.is_control

    @property
    def base_timestamp(self) -> int:
        """The base of record timestamp deltas (the delete horizon when one is set)."""
        return self.header.base_timestamp

    @property
    def max_timestamp(self) -> int:
        return self.header.max_timestamp

    @property
    def delete_horizon_ms(self) -> int | None:
        """When the cleaner may drop this batch's tombstones, if it has recorded that."""
        return self.header.base_timestamp if self.header.has_delete_horizon else None

    @property
    def producer_id(self) -> int:
        return self.header.producer_id

    @property
    def producer_epoch(self) -> int:
        return self.header.producer_epoch

    @property
    def has_producer_id(self) -> bool:
        return self.header.producer_id >= 0

    @property
    def base_sequence(self) -> int:
        return self.header.base_sequence

    @property
    def last_sequence(self) -> int:
        return self.header.last_sequence

    def __repr__(self) -> str:
        h = self.header
        return (
            f"RecordBatch(base_offset={h.base_offset}, last_offset={self.last_offset}, "
            f"records={h.records_count}, size={self.size}, compression={self.compression.name}, "
            f"producer_id={h.producer_id}, base_sequence={h.base_sequence})"
        )

    # --- records --------------------------------------------------------------------

    def records_payload(
        self, *, max_decompressed_size: int = DEFAULT_MAX_DECOMPRESSED_SIZE
    ) -> tuple[Buffer, int, int]:
        """The records' bytes as ``(buffer, start, end)``, decompressed if need be, for a
        decoder of their own (the broker's plain records); the same checks as
        :meth:`records` makes before its first record."""
        data, pos, end = self._payload(max_decompressed_size)
        self._check_count(pos, end)
        return data, pos, end

    def _payload(self, max_decompressed_size: int) -> tuple[Buffer, int, int]:
        """The records' bytes, decompressed if need be, as ``(buffer, start, end)``."""
        h = self.header
        start = self._pos + BATCH_HEADER_SIZE
        end = self._pos + h.batch_length + LOG_OVERHEAD
        codec = h.attributes & COMPRESSION_MASK
        if codec and h.records_count:
            with memoryview(self._buf) as view:
                data = decompress(
                    Compression(codec), view[start:end], max_size=max_decompressed_size
                )
            return memoryview(data), 0, len(data)
        buf = self._buf
        return (buf if type(buf) is bytes else memoryview(buf)), start, end

    def _check_count(self, start: int, end: int) -> None:
        count = self.header.records_count
        if count * MIN_RECORD_SIZE > end - start:
            raise CorruptRecordError(
                f"batch at offset {self.header.base_offset}: records_count {count} cannot fit "
                f"in {end - start} bytes of records"
            )

    def _count_error(self, decoded: int) -> CorruptRecordError:
        return CorruptRecordError(
            f"batch at offset {self.header.base_offset}: records_count is "
            f"{self.header.records_count} but the records end after {decoded}"
        )

    def _trailing_error(self, trailing: int) -> CorruptRecordError:
        return CorruptRecordError(
            f"batch at offset {self.header.base_offset}: {trailing} bytes follow the last of "
            f"its {self.header.records_count} records"
        )

    def _delta_error(self, delta: int, previous: int) -> CorruptRecordError:
        return CorruptRecordError(
            f"batch at offset {self.header.base_offset}: offset delta {delta} after {previous} "
            f"(last offset delta {self.header.last_offset_delta})"
        )

    def records(
        self, *, max_decompressed_size: int = DEFAULT_MAX_DECOMPRESSED_SIZE
    ) -> Iterator[Record]:
        """Decode the records, decompressing first if the batch is compressed.

        Each record gets its absolute offset and timestamp (with LogAppendTime, every
        record's timestamp is the batch's max timestamp). Raises
        :class:`CorruptRecordError` as soon as the framing is wrong: a record that
        overruns the batch, offset deltas that do not increase or exceed the last
        offset delta, fewer records than ``records_count`` or bytes after the last one;
        and :class:`RecordTooLargeError` if the payload decompresses to more than
        ``max_decompressed_size`` bytes.
        """
        h = self.header
        count = h.records_count
        data, pos, end = self._payload(max_decompressed_size)
        self._check_count(pos, end)
        base_offset = h.base_offset
        base_timestamp = h.base_timestamp
        log_append_time = h.max_timestamp if h.attributes & TIMESTAMP_TYPE_MASK else None
        last_delta = h.last_offset_delta
        previous = -1
        first = 0
        if codec is not None:  # the records it takes, then the pure loop from there on
            decoded: list[Record] = []
            pos, first, previous = codec.read_records(
                data,
                pos,
                end,
                count,
                base_offset,
                base_timestamp,
                log_append_time,
                last_delta,
                decoded,
                _MAKE_RECORD,
            )
            yield from decoded
        for i in range(first, count):
            if pos >= end:
                raise self._count_error(i)
            record, pos = read_record(data, pos, end, base_offset, base_timestamp, log_append_time)
            delta = record.offset - base_offset
            if delta <= previous or delta > last_delta:
                raise self._delta_error(delta, previous)
            previous = delta
            yield record
        # An empty compressed batch is not decompressed (as in Kafka): nothing to check.
        if pos != end and (count or not h.attributes & COMPRESSION_MASK):
            raise self._trailing_error(end - pos)

    def __iter__(self) -> Iterator[Record]:
        return self.records()

    def read_records(
        self,
        out: list[_T],
        make: RecordFactory[_T],
        *,
        max_decompressed_size: int = DEFAULT_MAX_DECOMPRESSED_SIZE,
    ) -> None:
        """Append ``make(key, value, headers, timestamp, offset)`` of each record to ``out``.

        :meth:`records` for readers that make objects of their own (the consumer makes its
        messages): no :class:`Record` per record, and the common record decoded inline
        (:func:`~highwater.records.record.read_records`). Checks and raises as
        :meth:`records` does; the records before the error are in ``out`` when it raises.
        """
        h = self.header
        count = h.records_count
        data, pos, end = self._payload(max_decompressed_size)
        self._check_count(pos, end)
        if type(data) is not bytes:  # one copy, so that keys and values are plain slices
            data = bytes(data[pos:end])
            pos, end = 0, len(data)
        log_append_time = h.max_timestamp if h.attributes & TIMESTAMP_TYPE_MASK else None
        before = len(out)
        pos = read_records(
            data,
            pos,
            end,
            count,
            h.base_offset,
            h.base_timestamp,
            log_append_time,
            h.last_offset_delta,
            out,
            make,
        )
        if len(out) - before < count:
            raise self._count_error(len(out) - before)
        if pos != end and (count or not h.attributes & COMPRESSION_MASK):
            raise self._trailing_error(end - pos)

    def read_columns(
        self,
        columns: Any,
        *,
        max_decompressed_size: int = DEFAULT_MAX_DECOMPRESSED_SIZE,
    ) -> None:
        """Append the batch's records to ``columns`` (a
        :data:`~highwater.records.columnar.RecordColumns`): :meth:`read_records` into Arrow's
        column buffers, with no object per record. Checks and raises as :meth:`records`
        does; the records before the error are in ``columns`` when it raises.
        """
        h = self.header
        count = h.records_count
        data, pos, end = self._payload(max_decompressed_size)
        self._check_count(pos, end)
        if type(data) is not bytes:
            data = bytes(data[pos:end])
            pos, end = 0, len(data)
        log_append_time = h.max_timestamp if h.attributes & TIMESTAMP_TYPE_MASK else None
        before = len(columns)
        try:
            pos = read_columns(
                columns,
                data,
                pos,
                end,
                count,
                h.base_offset,
                h.base_timestamp,
                log_append_time,
                h.last_offset_delta,
            )
        except OverflowError as e:
            raise CorruptRecordError(f"batch at offset {h.base_offset}: {e}") from None
        if len(columns) - before < count:
            raise self._count_error(len(columns) - before)
        if pos != end and (count or not h.attributes & COMPRESSION_MASK):
            raise self._trailing_error(end - pos)

    def iter_keys(
        self, *, max_decompressed_size: int = DEFAULT_MAX_DECOMPRESSED_SIZE
    ) -> Iterator[tuple[int, bytes | None, bool]]:
        """Yield ``(offset, key, value_is_null)`` for each record, for the log cleaner.

        Values and headers are skipped, not copied nor parsed; the framing that leads to
        them (lengths, offset deltas) is checked as in :meth:`records`.
        """
        h = self.header
        count = h.records_count
        data, pos, end = self._payload(max_decompressed_size)
        self._check_count(pos, end)
        base_offset = h.base_offset
        last_delta = h.last_offset_delta
        previous = -1
        first = 0
        if codec is not None:  # the records it takes, then the pure loop from there on
            keys, pos, first, previous = codec.scan_keys(
                data, pos, end, count, base_offset, last_delta
            )
            yield from keys
        for i in range(first, count):
            if pos >= end:
                raise self._count_error(i)
            try:
                # Varints are inlined for their one-byte form, the common case.
                b = data[pos]
                if b < 0x80:
                    length = (b >> 1) ^ -(b & 1)
                    p = pos + 1
                else:
                    length, p = decode_varint(data, pos)
                record_end = p + length
                if length < _MIN_BODY or record_end > end:
                    raise CorruptRecordError(
                        f"record at byte {pos}: length {length} is too small or overruns the batch"
                    )
                p += 1  # attributes
                p = p + 1 if data[p] < 0x80 else skip_varint(data, p)  # timestamp delta
                b = data[p]
                if b < 0x80:
                    delta = (b >> 1) ^ -(b & 1)
                    p += 1
                else:
                    delta, p = decode_varint(data, p)
                if delta <= previous or delta > last_delta:
                    raise self._delta_error(delta, previous)
                b = data[p]
                if b < 0x80:
                    key_length = (b >> 1) ^ -(b & 1)
                    p += 1
                else:
                    key_length, p = decode_varint(data, p)
                if key_length >= 0:
                    key_end = p + key_length
                    if key_end > record_end:
                        raise CorruptRecordError(
                            f"record at byte {pos}: key length {key_length} overruns the record"
                        )
                    key: bytes | None = bytes(data[p:key_end])
                    p = key_end
                elif key_length == -1:
                    key = None
                else:
                    raise CorruptRecordError(
                        f"record at byte {pos}: negative key length {key_length}"
                    )
                b = data[p]
                if b < 0x80:
                    value_length = (b >> 1) ^ -(b & 1)
                    p += 1
                else:
                    value_length, p = decode_varint(data, p)
                # The value, then at least one byte of header count, must fit.
                if value_length < -1 or p + max(value_length, 0) >= record_end:
                    raise CorruptRecordError(
                        f"record at byte {pos}: value length {value_length} does not fit the record"
                    )
            except IndexError:
                raise CorruptRecordError(f"record at byte {pos}: truncated") from None
            previous = delta
            pos = record_end
            yield base_offset + delta, key, value_length == -1
        if pos != end and (count or not h.attributes & COMPRESSION_MASK):
            raise self._trailing_error(end - pos)

    def map_keys(
        self,
        offsets: dict[bytes, int],
        min_offset: int,
        *,
        max_decompressed_size: int = DEFAULT_MAX_DECOMPRESSED_SIZE,
    ) -> None:
        """``offsets[key] = offset`` for each record with a key at ``min_offset`` or above:
        the log cleaner's offset map, one batch at a time. The reference is the loop over
        :meth:`iter_keys`; the compiled codec stores the keys without a tuple per record,
        and leaves a batch it does not take whole to that loop (which stores the same
        values again and raises the same error)."""
        if codec is not None:
            h = self.header
            count = h.records_count
            data, pos, end = self._payload(max_decompressed_size)
            self._check_count(pos, end)
            done, pos = codec.map_keys(
                data, pos, end, count, h.base_offset, h.last_offset_delta, min_offset, offsets
            )
            if done == count and (pos == end or (not count and h.attributes & COMPRESSION_MASK)):
                return
        for offset, key, _ in self.iter_keys(max_decompressed_size=max_decompressed_size):
            if key is not None and offset >= min_offset:
                offsets[key] = offset

    def filter_records(
        self,
        offsets: dict[bytes, int],
        now: int,
        horizon: int | None,
        new_horizon: int,
        *,
        max_decompressed_size: int = DEFAULT_MAX_DECOMPRESSED_SIZE,
    ) -> tuple[int, int, int, bool, int | None, bytes | None, int, int] | None:
        """The log cleaner's pass over this batch's records, compiled; None on the
        pure-Python implementation, or for a batch the compiled pass does not take (the
        cleaner then runs its own loop, the reference).

        A record is dropped without a key, below ``offsets[key]``, or as a tombstone once
        the batch's delete ``horizon`` (None: none) has passed at ``now``; the horizon to
        write is the batch's, else ``new_horizon`` if a tombstone is kept. Returns ``(kept,
        keyless_removed, tombstones_removed, tombstones_kept, horizon, records,
        base_timestamp, max_timestamp)``: ``records`` is None when the batch is to be copied
        as it is, else the kept records encoded as :func:`build_batch` writes them (offset
        deltas kept, timestamp deltas from ``base_timestamp``: the horizon, or the first
        kept record's timestamp), for :func:`build_batch_of_records`."""
        if codec is None:
            return None
        h = self.header
        data, pos, end = self._payload(max_decompressed_size)
        self._check_count(pos, end)
        log_append_time = h.max_timestamp if h.attributes & TIMESTAMP_TYPE_MASK else None
        found: tuple[int, int, int, bool, int | None, bytes | None, int, int] | None
        found = codec.filter_records(
            data, pos, end, h.records_count, h.base_offset, h.last_offset_delta,
            h.base_timestamp, log_append_time, offsets, now, horizon, new_horizon,
        )  # fmt: skip
        return found


_MAKE_RECORD = SlotFactory(Record, ("key", "value", "headers", "timestamp", "offset"), {})
"""A :class:`Record` of the fields of a decoded record, for the compiled decoder."""


def iter_batches(buf: Buffer, verify_crc: bool = True) -> Iterator[RecordBatch]:
    """Yield a :class:`RecordBatch` for each of the whole batches that ``buf`` holds.

    Raises :class:`CorruptRecordError` at the first batch that is invalid or cut short.
    """
    pos, end = 0, len(buf)
    while pos < end:
        batch = RecordBatch(buf, pos, verify_crc)
        yield batch
        pos += batch.size
