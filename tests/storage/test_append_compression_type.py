"""A topic's ``compression.type``: batches stored in its codec, whatever the producer sent.

Kafka's ``LogValidator`` rebuilds a produced batch whose codec is not the topic's (unless
``compression.type`` is ``producer``). Covered: every source codec into every target,
the records and every header field kept (offsets, timestamps, producer id, epoch and
sequence, the transactional flag), a retry of the producer's original bytes still known
for a duplicate, ``producer`` storing batches as sent, a damaged batch refused rather
than given a valid CRC, ``max.message.bytes`` judging what is stored, and a follower's
append (the leader's bytes) left as it is.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from highwater.errors import InvalidRecordError, RecordTooLargeError
from highwater.records import SimpleRecord, build_batch
from highwater.records.batch import iter_batches
from highwater.records.header import Compression
from highwater.storage.log import PartitionLog
from highwater.storage.producer_state import AppendOrigin
from storage_helpers import BASE_TS, FakeClock, open_log, read_all

CODECS = {
    "uncompressed": Compression.NONE,
    "gzip": Compression.GZIP,
    "snappy": Compression.SNAPPY,
    "lz4": Compression.LZ4,
    "zstd": Compression.ZSTD,
}


def batch(compression: Compression, *, producer_id: int = -1, base_sequence: int = -1) -> bytes:
    records = [
        SimpleRecord(key=b"k%d" % i, value=b"value-%d" % i * 20, timestamp=BASE_TS + i)
        for i in range(30)
    ]
    return build_batch(
        records,
        compression=compression,
        producer_id=producer_id,
        producer_epoch=0 if producer_id >= 0 else -1,
        base_sequence=base_sequence,
    )


def stored_codecs(log: PartitionLog) -> list[Compression]:
    return [b.compression for b in iter_batches(log.read(0, 1 << 20).records)]


@pytest.mark.parametrize("source", list(CODECS.values()), ids=list(CODECS))
@pytest.mark.parametrize("target", list(CODECS), ids=list(CODECS))
def test_batches_are_stored_in_the_topics_codec(
    tmp_path: Path, source: Compression, target: str
) -> None:
    log = open_log(tmp_path / "t-0", FakeClock(), **{"compression.type": target})
    sent = batch(source, producer_id=7, base_sequence=0)
    info = log.append_as_leader(sent, 3)
    assert (info.first_offset, info.last_offset) == (0, 29)
    assert stored_codecs(log) == [CODECS[target]]
    stored = next(iter_batches(log.read(0, 1 << 20).records))
    original = next(iter_batches(sent))
    kept = ("producer_id", "producer_epoch", "base_sequence", "max_timestamp")
    kept += ("base_timestamp", "timestamp_type", "is_transactional", "last_offset_delta")
    for field in kept:
        assert getattr(stored, field) == getattr(original, field), field
    assert [(r.offset, r.key, r.value, r.timestamp) for r in read_all(log)] == [
        (r.offset, r.key, r.value, r.timestamp) for r in original.records()
    ]
    # The producer's retry of the same bytes is its duplicate, not a second append.
    again = log.append_as_leader(sent, 3)
    assert (again.first_offset, log.log_end_offset) == (0, 30)


def test_producer_keeps_what_was_sent(tmp_path: Path) -> None:
    log = open_log(tmp_path / "t-0", FakeClock(), **{"compression.type": "producer"})
    for codec in (Compression.GZIP, Compression.NONE, Compression.ZSTD):
        log.append_as_leader(batch(codec), 0)
    assert stored_codecs(log) == [Compression.GZIP, Compression.NONE, Compression.ZSTD]


def test_a_damaged_batch_is_refused_not_rebuilt(tmp_path: Path) -> None:
    log = open_log(tmp_path / "t-0", FakeClock(), **{"compression.type": "zstd"})
    damaged = bytearray(batch(Compression.GZIP))
    damaged[-5] ^= 0xFF  # inside the compressed records: the CRC no longer matches
    with pytest.raises(InvalidRecordError, match="CRC"):
        log.append_as_leader(bytes(damaged), 0)
    assert log.log_end_offset == 0


def test_max_message_bytes_judges_the_batch_as_stored(tmp_path: Path) -> None:
    sent = batch(Compression.ZSTD)
    stored_size = len(batch(Compression.NONE))
    assert len(sent) < stored_size
    log = open_log(
        tmp_path / "t-0",
        FakeClock(),
        **{"compression.type": "uncompressed", "max.message.bytes": stored_size - 1},
    )
    with pytest.raises(RecordTooLargeError):
        log.append_as_leader(sent, 0)
    assert log.log_end_offset == 0


def test_a_followers_append_is_the_leaders_bytes(tmp_path: Path) -> None:
    leader = open_log(tmp_path / "leader-0", FakeClock(), **{"compression.type": "lz4"})
    leader.append_as_leader(batch(Compression.NONE), 0)
    replicated = leader.read(0, 1 << 20).records
    follower = open_log(tmp_path / "follower-0", FakeClock(), **{"compression.type": "gzip"})
    follower.append_as_follower(bytes(replicated))
    assert stored_codecs(follower) == [Compression.LZ4]
    # A client batch on a compacted topic goes the same way (the reference path).
    compacted = open_log(
        tmp_path / "compacted-0",
        FakeClock(),
        **{"compression.type": "gzip", "cleanup.policy": "compact"},
    )
    compacted.append_as_leader(batch(Compression.NONE), 0, origin=AppendOrigin.CLIENT)
    assert stored_codecs(compacted) == [Compression.GZIP]
