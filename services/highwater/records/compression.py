"""Batch payload codecs: gzip, snappy (xerial framing), LZ4 frames and zstd, via ``cramjam``.

What each codec writes is what Kafka's Java client writes, so that any Kafka client can
read Highwater's batches and the other way round:

- ``GZIP``: one gzip member (``compression.gzip.level``, default 6).
- ``SNAPPY``: the xerial ``SnappyOutputStream`` framing: the magic ``\\x82SNAPPY\\x00``,
  version 1 and compatible version 1 as big-endian int32s, then blocks, each a big-endian
  int32 length followed by the raw snappy compression of up to 32 KiB of input. Decoding
  also accepts a payload of plain raw snappy, which some clients write.
- ``LZ4``: the standard LZ4 frame format, with independent blocks (Kafka's reader does not
  support linked blocks), fast mode.
- ``ZSTD``: a standard zstd frame (``compression.zstd.level``, default 3).

Decompression is bounded: ``max_size`` caps the output, and the decoders write into a
buffer of at most ``max_size + 1`` bytes, so a decompression bomb costs neither the
memory nor the time it would take to inflate it.
"""

from __future__ import annotations

import struct
from typing import Any

import cramjam

from highwater.errors import CorruptRecordError, RecordTooLargeError

from .header import Compression

Buffer = bytes | bytearray | memoryview

# Kafka's defaults for compression.gzip.level and compression.zstd.level. For LZ4, Kafka's
# default level means its fast compressor, which is level 0 of the frame API (cramjam's own
# default, 4, is the slower high-compression mode).
DEFAULT_LEVELS: dict[Compression, int | None] = {
    Compression.GZIP: 6,
    Compression.SNAPPY: None,
    Compression.LZ4: 0,
    Compression.ZSTD: 3,
}

# The default bound on what one batch payload may decompress to.
DEFAULT_MAX_DECOMPRESSED_SIZE = 64 * 1024 * 1024

XERIAL_MAGIC = b"\x82SNAPPY\x00"
XERIAL_VERSION = 1
XERIAL_COMPATIBLE_VERSION = 1
XERIAL_HEADER = XERIAL_MAGIC + struct.pack(">ii", XERIAL_VERSION, XERIAL_COMPATIBLE_VERSION)
XERIAL_BLOCK_SIZE = 32 * 1024

_INT32 = struct.Struct(">i")
_UINT32_LE = struct.Struct("<I")
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_LZ4_MAGIC = b"\x04\x22\x4d\x18"
_MIN_INITIAL_CAPACITY = 64 * 1024
# What cramjam's decoders report when the output buffer is full: the message of Rust's
# ``io::ErrorKind::WriteZero`` from ``write_all``.
_OUTPUT_FULL = "failed to write whole buffer"


def _codec_name(codec: Compression) -> str:
    return codec.name.lower()


def compress(codec: Compression, data: Buffer, *, level: int | None = None) -> bytes:
    """Compress a batch payload with ``codec``; ``level`` overrides the codec's default.

    ``Compression.NONE`` returns the data unchanged (as bytes).
    """
    return bytes(compress_buffer(codec, data, level=level))


def compress_buffer(codec: Compression, data: Buffer, *, level: int | None = None) -> Buffer:
    """Like :func:`compress`, but returns whatever buffer the codec produced, without a copy."""
    if level is None:
        level = DEFAULT_LEVELS.get(codec)
    if codec == Compression.GZIP:
        return memoryview(cramjam.gzip.compress(data, level=level))
    if codec == Compression.ZSTD:
        return memoryview(cramjam.zstd.compress(data, level=level))
    if codec == Compression.LZ4:
        compressor = cramjam.lz4.Compressor(level=level, content_checksum=False, block_linked=False)
        # The streaming compressor (the only one that writes independent blocks) takes
        # nothing but bytes.
        compressor.compress(data if type(data) is bytes else bytes(data))
        return memoryview(compressor.finish())
    if codec == Compression.SNAPPY:
        return _xerial_compress(data)
    if codec == Compression.NONE:
        return data
    raise ValueError(f"unknown compression codec {codec!r}")


def _xerial_compress(data: Buffer) -> bytearray:
    view = memoryview(data)
    out = bytearray(XERIAL_HEADER)
    for start in range(0, len(view), XERIAL_BLOCK_SIZE):
        block = cramjam.snappy.compress_raw(view[start : start + XERIAL_BLOCK_SIZE])
        out += _INT32.pack(len(block))
        out += block
    return out


def decompress(
    codec: Compression, data: Buffer, *, max_size: int = DEFAULT_MAX_DECOMPRESSED_SIZE
) -> bytearray:
    """Decompress a batch payload written with ``codec`` into a new buffer.

    Raises :class:`CorruptRecordError` (naming the codec) if the payload does not
    decompress, and :class:`RecordTooLargeError` if it decompresses to more than
    ``max_size`` bytes. ``Compression.NONE`` returns a copy of the data.
    """
    if codec == Compression.NONE:
        if len(data) > max_size:
            raise _too_large(codec, max_size)
        return bytearray(data)
    if codec == Compression.SNAPPY:
        view = memoryview(data)
        if len(view) >= len(XERIAL_HEADER) and view[: len(XERIAL_MAGIC)] == XERIAL_MAGIC:
            return _xerial_decompress(view, max_size)
        return _raw_snappy_decompress(view, max_size)
    module: Any
    if codec == Compression.GZIP:
        module = cramjam.gzip
    elif codec == Compression.LZ4:
        module = cramjam.lz4
    elif codec == Compression.ZSTD:
        module = cramjam.zstd
    else:
        raise CorruptRecordError(f"unknown compression codec {int(codec)}")
    return _bounded_decompress(codec, module, data, max_size)


def _too_large(codec: Compression, max_size: int) -> RecordTooLargeError:
    return RecordTooLargeError(
        f"{_codec_name(codec)} batch payload decompresses to more than {max_size} bytes"
    )


def _corrupt(codec: Compression, error: Exception | str) -> CorruptRecordError:
    return CorruptRecordError(f"{_codec_name(codec)}: cannot decompress batch payload: {error}")


def _bounded_decompress(codec: Compression, module: Any, data: Buffer, max_size: int) -> bytearray:
    """Decompress into a buffer that grows fourfold up to ``max_size + 1`` bytes.

    cramjam's ``decompress_into`` fails as soon as the output buffer is full, having done
    work proportional to the buffer only, so each attempt is bounded. A size declared in
    the frame (zstd and LZ4 content size, gzip ISIZE) makes the first attempt exact.
    """
    decompress_into = module.decompress_into
    limit = max_size + 1
    hint = _declared_size(codec, data)
    capacity = min(limit, hint if hint is not None else max(4 * len(data), _MIN_INITIAL_CAPACITY))
    while True:
        out = bytearray(capacity)
        try:
            written = int(decompress_into(data, out))
        except (cramjam.DecompressionError, ValueError, OSError) as e:
            if _OUTPUT_FULL not in str(e):
                raise _corrupt(codec, e) from None
            if capacity >= limit:
                raise _too_large(codec, max_size) from None
            capacity = min(limit, capacity * 4)
            continue
        if written > max_size:
            raise _too_large(codec, max_size)
        del out[written:]
        return out


def _declared_size(codec: Compression, data: Buffer) -> int | None:
    """The decompressed size a frame declares, if it does: a hint, never trusted.

    Deflate cannot expand more than 1032-fold, nor LZ4 more than 255-fold, so a larger
    claim is a lie and is capped, to not allocate for it.
    """
    n = len(data)
    if codec == Compression.GZIP:
        if n >= 18:
            return min(int(_UINT32_LE.unpack_from(data, n - 4)[0]), 1032 * n) or None
        return None
    if codec == Compression.LZ4:
        # magic(4) FLG(1) BD(1) [content size(8)] HC(1)
        if n >= 15 and bytes(data[:4]) == _LZ4_MAGIC and data[4] & 0x08:
            return min(int.from_bytes(data[6:14], "little"), 255 * n)
        return None
    if codec == Compression.ZSTD:
        if n < 6 or bytes(data[:4]) != _ZSTD_MAGIC:
            return None
        descriptor = data[4]
        single_segment = (descriptor >> 5) & 1
        fcs_flag = descriptor >> 6
        pos = 5 + (0 if single_segment else 1) + (0, 1, 2, 4)[descriptor & 3]
        fcs_size = (single_segment, 2, 4, 8)[fcs_flag]
        if fcs_size == 0 or pos + fcs_size > n:
            return None
        size = int.from_bytes(data[pos : pos + fcs_size], "little")
        return size + 256 if fcs_size == 2 else size
    return None


def _snappy_raw_length(block: memoryview) -> int:
    try:
        return int(cramjam.snappy.decompress_raw_len(block))
    except (cramjam.DecompressionError, ValueError, OSError) as e:
        raise _corrupt(Compression.SNAPPY, e) from None


def _raw_snappy_decompress(view: memoryview, max_size: int) -> bytearray:
    length = _snappy_raw_length(view)
    if length > max_size:
        raise _too_large(Compression.SNAPPY, max_size)
    out = bytearray(length)
    try:
        written = int(cramjam.snappy.decompress_raw_into(view, out))
    except (cramjam.DecompressionError, ValueError, OSError) as e:
        raise _corrupt(Compression.SNAPPY, e) from None
    if written != length:
        raise _corrupt(Compression.SNAPPY, f"declared {length} bytes but produced {written}")
    return out


def _xerial_decompress(view: memoryview, max_size: int) -> bytearray:
    # Kafka ignores the version fields (some producers write them little-endian).
    blocks: list[tuple[memoryview, int]] = []
    total = 0
    pos, end = len(XERIAL_HEADER), len(view)
    while pos < end:
        if end - pos < 4:
            raise _corrupt(Compression.SNAPPY, f"truncated xerial block length at byte {pos}")
        block_length = _INT32.unpack_from(view, pos)[0]
        pos += 4
        if block_length < 0 or block_length > end - pos:
            raise _corrupt(
                Compression.SNAPPY,
                f"xerial block at byte {pos - 4} declares {block_length} bytes, {end - pos} remain",
            )
        block = view[pos : pos + block_length]
        pos += block_length
        length = _snappy_raw_length(block)
        total += length
        if total > max_size:
            raise _too_large(Compression.SNAPPY, max_size)
        blocks.append((block, length))
    out = bytearray(total)
    target = memoryview(out)
    at = 0
    for block, length in blocks:
        try:
            written = int(cramjam.snappy.decompress_raw_into(block, target[at : at + length]))
        except (cramjam.DecompressionError, ValueError, OSError) as e:
            raise _corrupt(Compression.SNAPPY, e) from None
        if written != length:
            raise _corrupt(Compression.SNAPPY, f"block declared {length} bytes, gave {written}")
        at += length
    target.release()
    return out
