"""Kafka's zigzag varints: int32 ``varint`` and int64 ``varlong``, as record bodies use them.

A value is zigzag-mapped to an unsigned integer (0, -1, 1, -2... become 0, 1, 2, 3...) and
written little-endian in 7-bit groups, the high bit of each byte saying another follows.
An int32 takes at most 5 bytes and an int64 at most 10. Decoding is strict: an encoding
longer than that, or one whose value does not fit the type, is corrupt, as is one that
runs off the end of the buffer. Decoders take a buffer and a position and return
``(value, new_position)`` so that a record can be parsed without slicing.
"""

from __future__ import annotations

from highwater.errors import CorruptRecordError, InvalidRecordError

Buffer = bytes | bytearray | memoryview

INT32_MIN = -(1 << 31)
INT32_MAX = (1 << 31) - 1
INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1

MAX_VARINT_SIZE = 5
MAX_VARLONG_SIZE = 10

# The one-byte encodings, which are by far the most common (lengths of small keys,
# attributes, offset deltas of small batches, the -1 of a null key).
_ONE_BYTE = tuple(bytes((((v << 1) ^ (v >> 63)) & 0xFF,)) for v in range(-64, 64))


def _truncated(buf: Buffer, pos: int, kind: str) -> CorruptRecordError:
    return CorruptRecordError(f"truncated {kind} at byte {pos}: the buffer ends at {len(buf)}")


def decode_varint(buf: Buffer, pos: int) -> tuple[int, int]:
    """Decode the zigzag int32 at ``pos``; return ``(value, position after it)``.

    Raises :class:`CorruptRecordError` if the buffer ends inside the varint, if it is
    longer than 5 bytes, or if its value does not fit in 32 bits.
    """
    # Unrolled: a loop costs more than the branches in CPython.
    try:
        b = buf[pos]
        if b < 0x80:
            return (b >> 1) ^ -(b & 1), pos + 1
        value = b & 0x7F
        b = buf[pos + 1]
        if b < 0x80:
            value |= b << 7
            return (value >> 1) ^ -(value & 1), pos + 2
        value |= (b & 0x7F) << 7
        b = buf[pos + 2]
        if b < 0x80:
            value |= b << 14
            return (value >> 1) ^ -(value & 1), pos + 3
        value |= (b & 0x7F) << 14
        b = buf[pos + 3]
        if b < 0x80:
            value |= b << 21
            return (value >> 1) ^ -(value & 1), pos + 4
        value |= (b & 0x7F) << 21
        b = buf[pos + 4]
    except IndexError:
        raise _truncated(buf, pos, "varint") from None
    if b >= 0x80:
        raise CorruptRecordError(f"varint at byte {pos} is longer than {MAX_VARINT_SIZE} bytes")
    if b > 0x0F:
        raise CorruptRecordError(f"varint at byte {pos} does not fit in 32 bits")
    value |= b << 28
    return (value >> 1) ^ -(value & 1), pos + 5


def decode_varlong(buf: Buffer, pos: int) -> tuple[int, int]:
    """Decode the zigzag int64 at ``pos``; return ``(value, position after it)``.

    Raises :class:`CorruptRecordError` if the buffer ends inside the varlong, if it is
    longer than 10 bytes, or if its value does not fit in 64 bits.
    """
    try:
        b = buf[pos]
        if b < 0x80:
            return (b >> 1) ^ -(b & 1), pos + 1
        value = b & 0x7F
        shift = 7
        p = pos + 1
        while True:
            b = buf[p]
            p += 1
            if b < 0x80:
                break
            value |= (b & 0x7F) << shift
            shift += 7
            if shift > 63:
                raise CorruptRecordError(
                    f"varlong at byte {pos} is longer than {MAX_VARLONG_SIZE} bytes"
                )
        value |= b << shift
    except IndexError:
        raise _truncated(buf, pos, "varlong") from None
    if value > 0xFFFFFFFFFFFFFFFF:
        raise CorruptRecordError(f"varlong at byte {pos} does not fit in 64 bits")
    return (value >> 1) ^ -(value & 1), p


def skip_varint(buf: Buffer, pos: int, max_size: int = MAX_VARLONG_SIZE) -> int:
    """The position after the varint or varlong at ``pos``, without decoding its value."""
    end = pos + max_size
    p = pos
    try:
        while buf[p] >= 0x80:
            p += 1
            if p >= end:
                raise CorruptRecordError(f"varint at byte {pos} is longer than {max_size} bytes")
    except IndexError:
        raise _truncated(buf, pos, "varint") from None
    return p + 1


def _write_unsigned(out: bytearray, value: int) -> None:
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def write_varint(out: bytearray, value: int) -> None:
    """Append the zigzag encoding of the int32 ``value`` to ``out``.

    Raises :class:`InvalidRecordError` if ``value`` does not fit in 32 bits.
    """
    if -64 <= value < 64:
        out += _ONE_BYTE[value + 64]
        return
    if not INT32_MIN <= value <= INT32_MAX:
        raise InvalidRecordError(f"{value} does not fit in a varint (int32)")
    _write_unsigned(out, (value << 1) ^ (value >> 31))


def write_varlong(out: bytearray, value: int) -> None:
    """Append the zigzag encoding of the int64 ``value`` to ``out``.

    Raises :class:`InvalidRecordError` if ``value`` does not fit in 64 bits.
    """
    if -64 <= value < 64:
        out += _ONE_BYTE[value + 64]
        return
    if not INT64_MIN <= value <= INT64_MAX:
        raise InvalidRecordError(f"{value} does not fit in a varlong (int64)")
    _write_unsigned(out, (value << 1) ^ (value >> 63))


def encode_varint(value: int) -> bytes:
    """The zigzag encoding of the int32 ``value``."""
    if -64 <= value < 64:
        return _ONE_BYTE[value + 64]
    out = bytearray()
    write_varint(out, value)
    return bytes(out)


def encode_varlong(value: int) -> bytes:
    """The zigzag encoding of the int64 ``value``."""
    if -64 <= value < 64:
        return _ONE_BYTE[value + 64]
    out = bytearray()
    write_varlong(out, value)
    return bytes(out)


def size_of_varint(value: int) -> int:
    """How many bytes the zigzag encoding of the int32 ``value`` takes."""
    return max(1, (((value << 1) ^ (value >> 31)).bit_length() + 6) // 7)


def size_of_varlong(value: int) -> int:
    """How many bytes the zigzag encoding of the int64 ``value`` takes."""
    return max(1, (((value << 1) ^ (value >> 63)).bit_length() + 6) // 7)
