"""PLAIN records built by the compiled codec (``_codec.plain_records``, protobuf wire
merged into the answer) are exactly those of the pure-Python path, record for record:
keys and values absent, empty and present, headers (with absent values), LogAppendTime,
compressed batches, a fetch offset inside a batch, a record limit, negative leader epochs,
and a batch the compiled code does not take (a header key that is not UTF-8) or that is
corrupt, where both raise the same typed error and keep nothing.
"""

from __future__ import annotations

import pytest
from highwater.broker import plain_records
from highwater.errors import HighwaterError
from highwater.records import Compression, SimpleRecord, TimestampType, build_batch
from highwater.records.header import crc32c
from highwater.records.implementation import codec
from highwater.v1 import broker_pb2 as pb

pytestmark = pytest.mark.skipif(
    codec is None or not hasattr(codec, "plain_records"),
    reason="the compiled codec is not built (make compiled)",
)


LOG_APPEND, CREATE = TimestampType.LOG_APPEND_TIME, TimestampType.CREATE_TIME


def records(count: int, seed: int) -> list[SimpleRecord]:
    out = []
    for i in range(count):
        key = None if i % 5 == 0 else (b"" if i % 7 == 0 else b"key-%d-%d" % (seed, i))
        value = None if i % 11 == 3 else b"v" * (i * 37 % 300)
        headers = tuple((f"h{j}-é", None if (i + j) % 3 == 0 else b"hv" * j) for j in range(i % 4))
        out.append(SimpleRecord(key=key, value=value, headers=headers, timestamp=1_700_000 + i))
    return out


def log() -> bytes:
    """Batches as a log holds them: offsets moving on, epochs -1 to 3, four kinds."""
    data = b""
    offset = 0
    for n, (compression, log_append) in enumerate(
        [
            (Compression.NONE, False),
            (Compression.GZIP, False),
            (Compression.NONE, True),
            (Compression.LZ4, False),
            (Compression.ZSTD, True),
        ]
    ):
        batch = records(17 + n, n)
        data += build_batch(
            batch,
            base_offset=offset,
            compression=compression,
            partition_leader_epoch=n - 1,
            timestamp_type=TimestampType.LOG_APPEND_TIME
            if log_append
            else TimestampType.CREATE_TIME,
        )
        offset += len(batch)
    return data


def both(
    data: bytes,
    fetch_offset: int,
    max_records: int | None,
    monkeypatch: pytest.MonkeyPatch,
    max_bytes: int | None = None,
    at_least_one: bool = True,
) -> tuple[
    pb.FetchPartitionResponse,
    pb.FetchPartitionResponse,
    plain_records.PlainAdded,
    plain_records.PlainAdded,
]:
    def add(answer: pb.FetchPartitionResponse) -> plain_records.PlainAdded:
        return plain_records.add_plain_records(
            answer, data, fetch_offset, max_records, max_bytes, at_least_one=at_least_one
        )

    compiled = pb.FetchPartitionResponse()
    added_compiled = add(compiled)
    with monkeypatch.context() as patched:
        patched.setattr(plain_records, "_COMPILED", None)
        pure = pb.FetchPartitionResponse()
        added_pure = add(pure)
    return compiled, pure, added_compiled, added_pure


@pytest.mark.parametrize(
    ("fetch_offset", "max_records"), [(0, None), (5, None), (20, 3), (30, 40), (90, None), (0, 1)]
)
def test_the_compiled_records_are_the_pure_ones(
    fetch_offset: int, max_records: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    compiled, pure, added_compiled, added_pure = both(log(), fetch_offset, max_records, monkeypatch)
    assert added_compiled == added_pure
    assert added_pure.records == len(pure.plain_records) > 0
    assert added_pure.bytes == pure.ByteSize()  # what the answer grew by
    assert compiled == pure
    assert compiled.SerializeToString() == pure.SerializeToString()


@pytest.mark.parametrize("fetch_offset", [0, 20])
@pytest.mark.parametrize("max_bytes", [0, 1, 100, 1000, 4000, 10_000])
@pytest.mark.parametrize("at_least_one", [True, False])
def test_a_byte_limit_cuts_both_paths_at_the_same_record(
    fetch_offset: int, max_bytes: int, at_least_one: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The records' entries come to at most ``max_bytes`` (inside a batch too), except the
    first one when ``at_least_one``; the next record would not have fit."""
    compiled, pure, added_compiled, added_pure = both(
        log(), fetch_offset, None, monkeypatch, max_bytes, at_least_one
    )
    assert added_compiled == added_pure
    assert compiled.SerializeToString() == pure.SerializeToString()
    assert added_pure.bytes == pure.ByteSize()
    everything = pb.FetchPartitionResponse()
    plain_records.add_plain_records(everything, log(), fetch_offset)
    count = added_pure.records
    assert list(pure.plain_records) == list(everything.plain_records[:count])
    if count > 1 or not at_least_one:
        assert added_pure.bytes <= max_bytes
    if count == 0:
        assert not at_least_one
    if count < len(everything.plain_records):
        with_next = pb.FetchPartitionResponse()
        with_next.plain_records.extend(everything.plain_records[: count + 1])
        assert with_next.ByteSize() > max_bytes


def test_a_batch_the_compiled_code_does_not_take_fails_as_the_pure_path_says(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A header key that is not UTF-8, in a batch whose CRC is right: the compiled code
    leaves it to the pure path, which refuses it; nothing of the answer is kept."""
    good = build_batch([SimpleRecord(b"k", b"v", (("ok", b"x"),), 5)], base_offset=95)
    odd = bytearray(good)
    at = odd.index(b"ok")
    odd[at : at + 2] = b"\xff\xfe"
    odd[17:21] = crc32c(bytes(odd[21:])).to_bytes(4, "big")
    data = log() + bytes(odd)
    errors = []
    for compiled in (True, False):
        answer = pb.FetchPartitionResponse()
        with monkeypatch.context() as patched:
            if not compiled:
                patched.setattr(plain_records, "_COMPILED", None)
            with pytest.raises(HighwaterError) as refused:
                plain_records.add_plain_records(answer, data, 0)
        assert not answer.plain_records
        errors.append((type(refused.value), str(refused.value)))
    assert errors[0] == errors[1]
    assert "utf" in errors[0][1].lower() or "header" in errors[0][1].lower(), errors[0]
