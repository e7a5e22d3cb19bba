"""Batch payload codecs: round trips, Kafka's framings, corrupt payloads and bombs."""

from __future__ import annotations

import contextlib
import gzip
import struct
import warnings

import lz4.frame
import pytest
import snappy
import zstandard
from highwater.errors import CorruptRecordError, HighwaterError, RecordTooLargeError
from highwater.records.compression import (
    XERIAL_BLOCK_SIZE,
    XERIAL_HEADER,
    compress,
    decompress,
)
from highwater.records.header import Compression
from hypothesis import given, settings
from hypothesis import strategies as st

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)  # kafka-python's import-time noise
    from kafka import codec as kafka_codec

CODECS = [Compression.GZIP, Compression.SNAPPY, Compression.LZ4, Compression.ZSTD]


@pytest.mark.parametrize("codec", list(Compression))
@given(data=st.binary(max_size=5000))
@settings(max_examples=30)
def test_round_trip(codec: Compression, data: bytes) -> None:
    compressed = compress(codec, data)
    assert decompress(codec, compressed) == data
    assert decompress(codec, memoryview(b"xx" + compressed)[2:]) == data
    assert decompress(codec, bytearray(compressed)) == data


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("size", [0, 1, XERIAL_BLOCK_SIZE - 1, XERIAL_BLOCK_SIZE, 200_000])
def test_round_trip_sizes(codec: Compression, size: int) -> None:
    data = bytes(i % 251 for i in range(size))
    assert decompress(codec, compress(codec, data)) == data


def test_snappy_writes_xerial_framing() -> None:
    data = bytes(range(256)) * 300  # 76800 bytes: three blocks
    out = compress(Compression.SNAPPY, data)
    assert out[:16] == b"\x82SNAPPY\x00" + b"\x00\x00\x00\x01" * 2 == XERIAL_HEADER
    pos, blocks = 16, []
    while pos < len(out):
        (length,) = struct.unpack_from(">i", out, pos)
        blocks.append(snappy.decompress(out[pos + 4 : pos + 4 + length]))
        pos += 4 + length
    assert pos == len(out)
    assert [len(b) for b in blocks] == [32768, 32768, 11264]
    assert b"".join(blocks) == data


def test_snappy_decodes_raw_and_xerial_from_other_writers() -> None:
    data = b"the quick brown fox " * 1000
    assert decompress(Compression.SNAPPY, snappy.compress(data)) == data
    assert decompress(Compression.SNAPPY, kafka_codec.snappy_encode(data)) == data
    small_blocks = kafka_codec.snappy_encode(data, xerial_blocksize=100)
    assert decompress(Compression.SNAPPY, small_blocks) == data
    assert decompress(Compression.SNAPPY, XERIAL_HEADER) == b""


def test_lz4_writes_independent_blocks() -> None:
    out = compress(Compression.LZ4, b"x" * 300_000)
    assert out[:4] == b"\x04\x22\x4d\x18"
    flags = out[4]
    assert flags >> 6 == 1  # version 01
    assert flags & 0x20  # block independence: Kafka's reader needs it
    assert lz4.frame.decompress(out) == b"x" * 300_000


@pytest.mark.parametrize("codec", CODECS)
def test_other_writers_decode(codec: Compression) -> None:
    data = b"highwater " * 10_000
    encoded = {
        Compression.GZIP: gzip.compress(data),
        Compression.SNAPPY: kafka_codec.snappy_encode(data),
        Compression.LZ4: lz4.frame.compress(data, block_linked=False),
        Compression.ZSTD: zstandard.ZstdCompressor().compress(data),
    }[codec]
    assert decompress(codec, encoded) == data


@pytest.mark.parametrize("codec", CODECS)
def test_other_readers_decode(codec: Compression) -> None:
    data = b"highwater " * 10_000
    out = compress(codec, data)
    decoded = {
        Compression.GZIP: kafka_codec.gzip_decode,
        Compression.SNAPPY: kafka_codec.snappy_decode,
        Compression.LZ4: kafka_codec.lz4_decode,
        Compression.ZSTD: kafka_codec.zstd_decode,
    }[codec](out)
    assert decoded == data


def test_frames_without_declared_size_grow_the_output() -> None:
    # Streaming writers (Kafka's Java client among them) do not declare content sizes,
    # so the output buffer must grow past its first guess.
    data = b"\x00" * 3_000_000
    stream = zstandard.ZstdCompressor(write_content_size=False).compressobj()
    zstd_frame = stream.compress(data) + stream.flush()
    assert decompress(Compression.ZSTD, zstd_frame) == data
    lz4_frame = lz4.frame.compress(data, store_size=False)
    assert decompress(Compression.LZ4, lz4_frame) == data
    # Two gzip members: the size trailer covers the last one only.
    two_members = gzip.compress(data) + gzip.compress(b"tail")
    assert decompress(Compression.GZIP, two_members) == data + b"tail"


@pytest.mark.parametrize("codec", CODECS)
def test_garbage_is_corrupt_and_names_the_codec(codec: Compression) -> None:
    garbage = b"this is not a compressed payload at all, no matter the codec" * 3
    with pytest.raises(CorruptRecordError, match=codec.name.lower()):
        decompress(codec, garbage)


@pytest.mark.parametrize("codec", CODECS)
def test_every_truncation_is_corrupt(codec: Compression) -> None:
    data = bytes(i * 7 % 256 for i in range(3000))
    out = compress(codec, data)
    for cut in range(len(out)):
        try:
            result = decompress(codec, out[:cut])
        except CorruptRecordError as e:
            assert codec.name.lower() in str(e)
        else:
            # A cut at a snappy block boundary leaves a valid, shorter stream.
            assert codec == Compression.SNAPPY
            assert data.startswith(result)


@pytest.mark.parametrize("codec", CODECS)
@given(data=st.data())
@settings(max_examples=40)
def test_flipped_bytes_raise_typed_errors(codec: Compression, data: st.DataObject) -> None:
    payload = bytearray(compress(codec, b"abcdefgh" * 200))
    for _ in range(data.draw(st.integers(1, 4))):
        payload[data.draw(st.integers(0, len(payload) - 1))] ^= data.draw(st.integers(1, 255))
    with contextlib.suppress(HighwaterError):
        decompress(codec, payload, max_size=100_000)


@pytest.mark.parametrize(
    "bad",
    [
        XERIAL_HEADER + b"\x00\x00",  # truncated block length
        XERIAL_HEADER + b"\xff\xff\xff\xff" + b"x" * 10,  # negative block length
        XERIAL_HEADER + b"\x00\x00\x10\x00" + b"x" * 10,  # block overruns the payload
        XERIAL_HEADER + b"\x00\x00\x00\x03\xff\xff\xff",  # corrupt block
    ],
)
def test_bad_xerial_framing(bad: bytes) -> None:
    with pytest.raises(CorruptRecordError, match="snappy"):
        decompress(Compression.SNAPPY, bad)


@pytest.mark.parametrize("codec", CODECS)
def test_decompression_bomb_is_bounded(codec: Compression) -> None:
    bomb = compress(codec, bytes(20_000_000))
    with pytest.raises(RecordTooLargeError, match="more than 1000000 bytes"):
        decompress(codec, bomb, max_size=1_000_000)
    assert len(decompress(codec, bomb, max_size=20_000_000)) == 20_000_000
    with pytest.raises(RecordTooLargeError):
        decompress(codec, bomb, max_size=19_999_999)


def test_gzip_with_a_lying_size_trailer() -> None:
    payload = bytearray(gzip.compress(b"abc" * 100))
    payload[-4:] = b"\xff\xff\xff\xff"  # ISIZE: 4 GiB
    with pytest.raises(CorruptRecordError, match="gzip"):
        decompress(Compression.GZIP, payload)


def test_raw_snappy_declaring_a_huge_size() -> None:
    # A raw snappy block starts with its uncompressed length: 2**31, then nothing.
    with pytest.raises(RecordTooLargeError):
        decompress(Compression.SNAPPY, b"\x80\x80\x80\x80\x08\x00", max_size=1 << 20)


def test_none_passes_through_within_bounds() -> None:
    assert compress(Compression.NONE, b"abc") == b"abc"
    assert decompress(Compression.NONE, b"abc") == b"abc"
    with pytest.raises(RecordTooLargeError):
        decompress(Compression.NONE, b"abcd", max_size=3)
