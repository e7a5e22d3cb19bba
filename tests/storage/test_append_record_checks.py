"""A leader's append walks every record of every batch before it writes anything.

Kafka's ``LogValidator`` decodes each record of a produced batch (decompressing a
compressed one) and refuses the produce with ``INVALID_RECORD`` when the records are not
what the header says; it checks each record's timestamp against the topic's window and
stamps the batch with the records' largest (``setMaxTimestamp``); ``UnifiedLog.append``
refuses an append larger than a segment with ``RECORD_LIST_TOO_LARGE``. Each case runs on
whichever implementation is loaded (the compiled append and its pure fallback, or the
pure-Python one under ``HIGHWATER_PURE_PYTHON=1``).
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from highwater.errors import (
    InvalidRecordError,
    InvalidTimestampError,
    RecordListTooLargeError,
    RecordTooLargeError,
)
from highwater.records import SimpleRecord, build_batch
from highwater.records.batch import RecordBatch
from highwater.records.compression import compress
from highwater.records.header import (
    BATCH_HEADER_SIZE,
    HEADER_STRUCT,
    LOG_OVERHEAD,
    Compression,
    TimestampType,
    check_batch,
    crc32c,
)
from highwater.records.record import encode_record
from highwater.records.varint import encode_varint, encode_varlong
from highwater.storage.log import PartitionLog
from storage_helpers import BASE_TS, FakeClock, open_log

HOUR = 3_600_000


def raw_batch(
    body: bytes,
    count: int,
    *,
    last_offset_delta: int | None = None,
    base_timestamp: int = BASE_TS,
    max_timestamp: int = BASE_TS,
    attributes: int = 0,
) -> bytes:
    """A batch with a valid header and CRC around ``body``, whatever ``body`` holds."""
    last = count - 1 if last_offset_delta is None else last_offset_delta
    length = BATCH_HEADER_SIZE - LOG_OVERHEAD + len(body)
    head = HEADER_STRUCT.pack(
        0, length, -1, 2, 0, attributes, last, base_timestamp, max_timestamp, -1, -1, -1, count
    )
    data = bytearray(head + body)
    struct.pack_into(">I", data, 17, crc32c(memoryview(data)[21:]))
    return bytes(data)


def raw_record(*fields: bytes) -> bytes:
    """A record of hand-encoded fields after the attributes, its length prefixed."""
    inner = b"\x00" + b"".join(fields)
    return encode_varint(len(inner)) + inner


def records(n: int, *, timestamp: int = BASE_TS) -> bytes:
    return b"".join(
        encode_record(i, timestamp - BASE_TS, b"k%d" % i, b"v" * 10, (("h", b"x"),))
        for i in range(n)
    )


@pytest.fixture
def log(tmp_path: Path) -> PartitionLog:
    return open_log(tmp_path / "t-0", FakeClock())


def assert_refused(log: PartitionLog, data: bytes, error: type[Exception]) -> None:
    end, size = log.log_end_offset, log.size
    with pytest.raises(error):
        log.append_as_leader(data, 0)
    assert (log.log_end_offset, log.size) == (end, size)


ZIGZAG = encode_varint  # lengths and counts are zigzag varints


BAD_BODIES: dict[str, tuple[bytes, int]] = {
    "declares-3-holds-1": (records(1), 3),
    "garbage": (b"\x01\x02not-a-record", 1),
    "a-byte-after-the-last-record": (records(2) + b"\x00", 2),
    "more-records-than-declared": (records(3), 2),
    "record-length-overruns-the-batch": (records(2)[:-1], 2),
    "record-length-longer-than-its-fields": (
        raw_record(encode_varlong(0), ZIGZAG(0), ZIGZAG(-1), ZIGZAG(1), b"v", ZIGZAG(0), b"\x00"),
        1,
    ),
    "negative-key-length": (
        raw_record(encode_varlong(0), ZIGZAG(0), ZIGZAG(-2), ZIGZAG(-1), ZIGZAG(0)),
        1,
    ),
    "key-overruns-the-record": (
        raw_record(encode_varlong(0), ZIGZAG(0), ZIGZAG(40), b"k", ZIGZAG(-1), ZIGZAG(0)),
        1,
    ),
    "negative-value-length": (
        raw_record(encode_varlong(0), ZIGZAG(0), ZIGZAG(-1), ZIGZAG(-3), ZIGZAG(0)),
        1,
    ),
    "negative-header-count": (
        raw_record(encode_varlong(0), ZIGZAG(0), ZIGZAG(-1), ZIGZAG(-1), ZIGZAG(-1)),
        1,
    ),
    "negative-header-key-length": (
        raw_record(
            encode_varlong(0), ZIGZAG(0), ZIGZAG(-1), ZIGZAG(-1), ZIGZAG(1), ZIGZAG(-1), ZIGZAG(-1)
        ),
        1,
    ),
    "header-key-not-utf8": (
        raw_record(
            encode_varlong(0),
            ZIGZAG(0),
            ZIGZAG(-1),
            ZIGZAG(-1),
            ZIGZAG(1),
            ZIGZAG(1),
            b"\xff",
            ZIGZAG(-1),
        ),
        1,
    ),
    "header-value-length-below-minus-1": (
        raw_record(
            encode_varlong(0),
            ZIGZAG(0),
            ZIGZAG(-1),
            ZIGZAG(-1),
            ZIGZAG(1),
            ZIGZAG(1),
            b"h",
            ZIGZAG(-2),
        ),
        1,
    ),
    "offset-deltas-not-increasing": (
        encode_record(0, 0, None, b"a") + encode_record(0, 0, None, b"b"),
        2,
    ),
    "overlong-varint": (b"\xff\xff\xff\xff\xff\x01" + records(1), 1),
}


@pytest.mark.parametrize("name", sorted(BAD_BODIES))
def test_a_batch_whose_records_are_not_what_its_header_says_is_refused(
    log: PartitionLog, name: str
) -> None:
    body, count = BAD_BODIES[name]
    assert_refused(log, raw_batch(body, count), InvalidRecordError)


@pytest.mark.parametrize("name", sorted(BAD_BODIES))
def test_a_compressed_batch_whose_records_are_not_what_its_header_says_is_refused(
    log: PartitionLog, name: str
) -> None:
    body, count = BAD_BODIES[name]
    compressed = compress(Compression.GZIP, body)
    assert_refused(log, raw_batch(compressed, count, attributes=1), InvalidRecordError)


def test_a_compressed_payload_that_does_not_decompress_is_refused(log: PartitionLog) -> None:
    assert_refused(log, raw_batch(b"not gzip at all", 1, attributes=1), InvalidRecordError)


def test_a_bad_batch_among_good_ones_refuses_the_whole_append(log: PartitionLog) -> None:
    good = raw_batch(records(2), 2)
    assert_refused(log, good + raw_batch(records(1), 3) + good, InvalidRecordError)
    info = log.append_as_leader(good + good, 0)
    assert (info.first_offset, info.last_offset) == (0, 3)


@pytest.mark.parametrize("compression", [Compression.NONE, Compression.GZIP])
def test_records_that_match_their_header_are_appended(
    log: PartitionLog, compression: Compression
) -> None:
    batch = build_batch(
        [SimpleRecord(b"k", b"v" * 300, (("h", b"x"), ("é", None)), BASE_TS + i) for i in range(5)]
        + [SimpleRecord(None, None, (), BASE_TS)],
        compression=compression,
    )
    info = log.append_as_leader(batch, 0)
    assert (info.first_offset, info.last_offset, info.max_timestamp) == (0, 5, BASE_TS + 4)


def test_a_record_outside_the_window_is_refused_whatever_the_header_says(
    tmp_path: Path,
) -> None:
    log = open_log(tmp_path / "t-0", FakeClock(), **{"message.timestamp.after.max.ms": HOUR})
    body = encode_record(0, 0, None, b"now") + encode_record(1, 10 * HOUR, None, b"later")
    assert_refused(log, raw_batch(body, 2, max_timestamp=BASE_TS), InvalidTimestampError)
    log = open_log(tmp_path / "u-0", FakeClock(), **{"message.timestamp.before.max.ms": HOUR})
    body = encode_record(0, 0, None, b"now") + encode_record(1, -10 * HOUR, None, b"earlier")
    assert_refused(log, raw_batch(body, 2, max_timestamp=BASE_TS), InvalidTimestampError)


@pytest.mark.parametrize("compression", [Compression.NONE, Compression.GZIP])
def test_the_stored_max_timestamp_is_the_records_largest(
    log: PartitionLog, compression: Compression
) -> None:
    """A header whose max timestamp is not its records' largest is stamped with it and
    signed again (Kafka's ``setMaxTimestamp``): the append's info, the stored batch, and the
    lookups by time that read it say the record's timestamp."""
    body = encode_record(0, 0, None, b"a") + encode_record(1, 5000, None, b"b")
    payload = body if compression is Compression.NONE else compress(compression, body)
    log.append_as_leader(raw_batch(records(1), 1), 0)
    info = log.append_as_leader(raw_batch(payload, 2, attributes=int(compression)), 0)
    assert (info.max_timestamp, info.offset_of_max_timestamp) == (BASE_TS + 5000, 2)
    stored = log.read(1, 1 << 20).records
    header = check_batch(stored, 0)  # the CRC holds
    assert header.max_timestamp == BASE_TS + 5000
    assert [r.timestamp for r in RecordBatch(stored)] == [BASE_TS, BASE_TS + 5000]
    assert log.max_timestamp_and_offset(log.log_end_offset) == (BASE_TS + 5000, 2)
    assert log.offset_for_timestamp(BASE_TS + 1) == (BASE_TS + 5000, 2)


def test_a_record_without_a_timestamp_is_not_judged_by_the_window(tmp_path: Path) -> None:
    """Kafka's ``validateTimestamp`` skips NO_TIMESTAMP (-1)."""
    log = open_log(tmp_path / "t-0", FakeClock(), **{"message.timestamp.before.max.ms": HOUR})
    body = encode_record(0, 0, None, b"a")
    info = log.append_as_leader(raw_batch(body, 1, base_timestamp=-1, max_timestamp=-1), 0)
    assert (info.first_offset, info.max_timestamp) == (0, -1)


@pytest.mark.parametrize("timestamp_type", ["CreateTime", "LogAppendTime"])
def test_a_producer_batch_flagged_log_append_time_is_refused(
    tmp_path: Path, timestamp_type: str
) -> None:
    log = open_log(tmp_path / "t-0", FakeClock(), **{"message.timestamp.type": timestamp_type})
    batch = build_batch(
        [SimpleRecord(None, b"v", (), BASE_TS)], timestamp_type=TimestampType.LOG_APPEND_TIME
    )
    assert_refused(log, batch, InvalidTimestampError)


def test_an_append_larger_than_a_segment_is_record_list_too_large(tmp_path: Path) -> None:
    """Kafka's ``UnifiedLog.append``: the whole append against ``segment.bytes``
    (``RECORD_LIST_TOO_LARGE``); one batch against ``max.message.bytes``
    (``MESSAGE_TOO_LARGE``)."""
    log = open_log(
        tmp_path / "t-0", FakeClock(), **{"segment.bytes": 2000, "max.message.bytes": 1500}
    )
    small = build_batch([SimpleRecord(None, b"x" * 800, (), BASE_TS)])
    assert_refused(log, small * 3, RecordListTooLargeError)
    big = build_batch([SimpleRecord(None, b"x" * 1600, (), BASE_TS)])
    assert_refused(log, big, RecordTooLargeError)
    assert log.append_as_leader(small * 2, 0).last_offset == 1
