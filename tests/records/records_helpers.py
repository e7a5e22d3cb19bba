"""Shared strategies and byte-surgery helpers for the RecordBatch codec tests."""

from __future__ import annotations

import struct

from highwater.records.header import ATTRIBUTES_OFFSET, CRC_OFFSET, crc32c
from highwater.records.record import SimpleRecord
from hypothesis import strategies as st

keys = st.none() | st.binary(max_size=64)
values = st.none() | st.binary(max_size=512)
header_lists = st.lists(
    st.tuples(st.text(max_size=16), st.none() | st.binary(max_size=32)), max_size=4
).map(tuple)
timestamps = st.integers(min_value=-1, max_value=(1 << 62))


@st.composite
def simple_records(draw: st.DrawFn, *, min_size: int = 1, max_size: int = 20) -> list[SimpleRecord]:
    """Records with close timestamps (as producers write them) or scattered ones."""
    base = draw(timestamps)
    spread = draw(st.sampled_from([0, 1000, 1 << 40]))
    count = draw(st.integers(min_value=min_size, max_value=max_size))
    return [
        SimpleRecord(
            key=draw(keys),
            value=draw(values),
            headers=draw(header_lists),
            timestamp=base + draw(st.integers(min_value=-spread, max_value=spread)),
        )
        for _ in range(count)
    ]


def resign(buf: bytearray) -> bytearray:
    """Recompute the CRC of the batch at the start of ``buf`` after it was edited."""
    struct.pack_into(">I", buf, CRC_OFFSET, crc32c(memoryview(buf)[ATTRIBUTES_OFFSET:]))
    return buf


def patch(buf: bytes, fmt: str, offset: int, value: int, *, sign: bool = True) -> bytearray:
    """A copy of ``buf`` with one big-endian field rewritten, CRC recomputed if ``sign``."""
    out = bytearray(buf)
    struct.pack_into(">" + fmt, out, offset, value)
    return resign(out) if sign else out


def replace_records(batch: bytes, payload: bytes) -> bytearray:
    """The batch with its records section replaced, batch length and CRC fixed up."""
    out = bytearray(batch[:61]) + payload
    struct.pack_into(">i", out, 8, len(out) - 12)
    return resign(out)
