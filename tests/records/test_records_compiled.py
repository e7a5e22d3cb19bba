"""The compiled codec (``highwater.records._codec``) against the pure-Python reference.

Both run in this one process: :func:`pure` switches the batch layer to the pure-Python
functions, so each property compares the two on the same input: the same bytes encoded,
the same records decoded (compressed and not, every header field, varints at every
boundary), and on corrupt, truncated or adversarial batches the same typed error with the
same message, after the same records. One test repeats the adversarial corpus in a child
process under ``PYTHONMALLOC=debug``, whose allocator catches writes past a block and use
after free.
"""

from __future__ import annotations

import gc
import os
import random
import struct
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import crc32c as crc32c_package
import pytest
from compiled_codec import run_under_debug_allocator
from highwater.client.message import Message
from highwater.errors import HighwaterError
from highwater.records import (
    BATCH_HEADER_SIZE,
    Compression,
    RecordBatch,
    SimpleRecord,
    TimestampType,
    build_batch,
    header,
    record,
)
from highwater.records import batch as batch_module
from highwater.records.implementation import IMPLEMENTATION, PURE_PYTHON_ENV, codec
from highwater.records.partitioner import murmur2, pure_murmur2
from highwater.records.varint import encode_varint, encode_varlong
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from records_helpers import replace_records, resign, simple_records

if codec is None and os.environ.get(PURE_PYTHON_ENV, "") in ("", "0"):
    raise RuntimeError(
        "highwater.records._codec is not built: `make compiled` (or `pip install -e .`) builds it"
    )
pytestmark = pytest.mark.skipif(
    codec is None, reason=f"{PURE_PYTHON_ENV} is set: the pure-Python run of the suite"
)

# The comparisons run each example twice and the machine may be busy: no deadlines.
SLOW = [HealthCheck.too_slow]
_C: Any = codec  # the compiled module (typed loosely: it has no stub)

# Lengths and deltas around every varint boundary: 1/2/3/4/5-byte int32 encodings.
BOUNDARIES = sorted(
    {
        b + d
        for b in (0, 63, 64, 8191, 8192, (1 << 20) - 1, 1 << 20)
        for d in (-1, 0, 1)
        if b + d >= 0
    }
)
sized = st.none() | st.sampled_from([n for n in BOUNDARIES if n <= 70_000]).map(
    lambda n: bytes(i % 251 for i in range(n))
)
small = st.none() | st.binary(max_size=80)
header_keys = st.text(max_size=12)  # any code point: multi-byte UTF-8 keys
header_lists = st.lists(st.tuples(header_keys, st.none() | st.binary(max_size=20)), max_size=4).map(
    tuple
)
INT64 = (-(1 << 63), (1 << 63) - 1)
timestamps = st.integers(-1, 1 << 45) | st.sampled_from(INT64)


@contextmanager
def pure() -> Iterator[None]:
    """Run the batch layer on the pure-Python functions for the block's duration."""
    mp = pytest.MonkeyPatch()
    mp.setattr(batch_module, "codec", None)
    mp.setattr(batch_module, "check_batch", header.pure_check_batch)
    mp.setattr(batch_module, "read_records", record.pure_read_records)
    mp.setattr(batch_module, "record_size", record.pure_record_size)
    mp.setattr(batch_module, "encode_records", record.pure_encode_records)
    try:
        yield
    finally:
        mp.undo()


def outcome(fn: Callable[[], Any]) -> tuple[str, Any]:
    """What ``fn`` returns, or the type and message of the Highwater error it raises."""
    try:
        return "ok", fn()
    except HighwaterError as e:
        return type(e).__name__, str(e)


def both(fn: Callable[[], Any]) -> tuple[str, Any]:
    """``fn``'s outcome compiled, asserted equal to its outcome on the pure functions."""
    compiled = outcome(fn)
    with pure():
        reference = outcome(fn)
    assert compiled == reference
    return compiled


def as_tuple(key: Any, value: Any, headers: Any, timestamp: int, offset: int) -> tuple[Any, ...]:
    return (offset, timestamp, key, value, headers)


def decoded(buf: bytes | bytearray, verify_crc: bool = True) -> tuple[Any, ...]:
    """Everything a reader can take from a batch, each reader's records before its error."""

    def header() -> Any:
        return RecordBatch(buf, verify_crc=verify_crc).header

    def records() -> list[Any]:
        out: list[Any] = []
        try:
            for r in RecordBatch(buf, verify_crc=verify_crc).records():
                out.append((r.offset, r.timestamp, r.key, r.value, r.headers))
        except HighwaterError as e:
            out.append((type(e).__name__, str(e)))
        return out

    def keys() -> list[Any]:
        out: list[Any] = []
        try:
            out.extend(RecordBatch(buf, verify_crc=verify_crc).iter_keys())
        except HighwaterError as e:
            out.append((type(e).__name__, str(e)))
        return out

    def read(make: Callable[..., Any]) -> Callable[[], list[Any]]:
        def run() -> list[Any]:
            out: list[Any] = []
            try:
                RecordBatch(buf, verify_crc=verify_crc).read_records(out, make)
            except HighwaterError as e:
                out.append((type(e).__name__, str(e)))
            return [m if isinstance(m, tuple) else message_fields(m) for m in out]

        return run

    return (
        outcome(header),
        outcome(records),
        outcome(keys),
        outcome(read(as_tuple)),
        outcome(read(MESSAGE_FACTORY)),
    )


def decoded_both(buf: bytes | bytearray, verify_crc: bool = True) -> tuple[Any, ...]:
    compiled = decoded(buf, verify_crc)
    with pure():
        reference = decoded(buf, verify_crc)
    assert compiled == reference
    return compiled


def message_fields(m: Message) -> tuple[Any, ...]:
    return (m.topic(), m.partition(), m.key(), m.value(), m.headers(), m.timestamp(), m.offset())


MESSAGE_FIELDS = ("_key", "_value", "_headers", "_timestamp", "_offset")
MESSAGE_CONSTANTS = {"_topic": "t", "_partition": 3, "_error": None, "_timestamp_type": 1}
MESSAGE_FACTORY = record.SlotFactory(Message, MESSAGE_FIELDS, MESSAGE_CONSTANTS)


# --- which one is loaded --------------------------------------------------------------


@pytest.mark.parametrize(("env", "expected"), [(None, "compiled"), ("1", "pure-python")])
def test_the_implementation_is_named_and_selected_by_the_environment(
    env: str | None, expected: str
) -> None:
    environ = {k: v for k, v in os.environ.items() if k != PURE_PYTHON_ENV}
    if env is not None:
        environ[PURE_PYTHON_ENV] = env
    printed = subprocess.run(
        [sys.executable, "-c", "import highwater.records; print(highwater.records.IMPLEMENTATION)"],
        env=environ,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert printed == expected
    assert IMPLEMENTATION == "compiled"


# --- encoding -------------------------------------------------------------------------


@given(
    records=st.lists(
        st.tuples(small | sized, small | sized, header_lists, timestamps), max_size=12
    ),
    base=timestamps,
)
@settings(max_examples=150, deadline=None, suppress_health_check=SLOW)
def test_encode_records_and_record_size_give_the_reference_bytes(
    records: list[tuple[Any, Any, Any, int]], base: int
) -> None:
    def sizes() -> list[int]:
        return [record.record_size(d, t - base, k, v, h) for d, (k, v, h, t) in enumerate(records)]

    def pure_sizes() -> list[int]:
        return [
            record.pure_record_size(d, t - base, k, v, h) for d, (k, v, h, t) in enumerate(records)
        ]

    assert outcome(sizes) == outcome(pure_sizes)
    expected = outcome(lambda: record.pure_encode_records(records, base))
    assert outcome(lambda: record.encode_records(records, base)) == expected
    if expected[0] == "ok":
        assert record.encode_records(records, base, pure_sizes()) == expected[1]


@pytest.mark.parametrize("offset_delta", [0, 63, 64, (1 << 31) - 1, 1 << 31, -(1 << 31) - 1])
@pytest.mark.parametrize("timestamp_delta", [0, -65, *INT64, INT64[1] + 1, INT64[0] - 1])
def test_record_size_at_the_ranges_edges(offset_delta: int, timestamp_delta: int) -> None:
    for key, value, headers in [
        (None, b"v", ()),
        (bytearray(b"k"), memoryview(b"vv"), [("h", b"")]),
        (b"k", b"v", [["list", None]]),
    ]:
        args = (offset_delta, timestamp_delta, key, value, headers)
        assert outcome(lambda a=args: record.record_size(*a)) == outcome(
            lambda a=args: record.pure_record_size(*a)
        )


@pytest.mark.parametrize("compression", list(Compression))
@given(
    timestamp_type=st.sampled_from(list(TimestampType)),
    records=st.lists(
        st.tuples(small | sized, small, header_lists, timestamps), min_size=0, max_size=8
    ),
    base_offset=st.integers(0, 1 << 62) | st.just((1 << 63) - 5),
    producer=st.sampled_from([(-1, -1, -1), (7, 2, 0), (1 << 40, 32767, (1 << 31) - 3)]),
)
@settings(max_examples=12, deadline=None, suppress_health_check=SLOW)
def test_batches_built_and_read_alike(
    compression: Compression,
    timestamp_type: TimestampType,
    records: list[tuple[Any, Any, Any, int]],
    base_offset: int,
    producer: tuple[int, int, int],
) -> None:
    simple = [SimpleRecord(k, v, h, t) for k, v, h, t in records]
    producer_id, epoch, sequence = producer

    def build() -> bytes:
        return build_batch(
            simple,
            base_offset=base_offset,
            compression=compression,
            timestamp_type=timestamp_type,
            producer_id=producer_id,
            producer_epoch=epoch,
            base_sequence=sequence,
            partition_leader_epoch=5,
        )

    def builder() -> bytes:
        b = batch_module.RecordBatchBuilder(
            max_bytes=1 << 30,
            compression=compression,
            timestamp_type=timestamp_type,
            base_offset=base_offset,
            partition_leader_epoch=5,
            producer_id=producer_id,
            producer_epoch=epoch,
            base_sequence=sequence,
        )
        for k, v, h, t in records:
            b.append_fields((k, v, h, t))
        return b.build()

    kind, data = both(build)
    assert both(builder)[0] == kind
    if kind == "ok" and compression in (Compression.NONE, Compression.GZIP):
        decoded_both(data)


# --- decoding: boundary varints, hand-made records ------------------------------------


def body(*parts: bytes) -> bytes:
    inner = b"".join(parts)
    return encode_varint(len(inner)) + inner


def overlong(value: int, size: int) -> bytes:
    """The zigzag varint of ``value`` padded with continuation bytes to ``size`` bytes."""
    raw = bytearray(encode_varlong(value))
    while len(raw) < size:
        raw[-1] |= 0x80
        raw.append(0)
    return bytes(raw)


V = encode_varint
TEMPLATE = build_batch([SimpleRecord(b"k", b"v", (), 0)], base_offset=10)


@pytest.mark.parametrize(
    "payload",
    [
        body(b"\x00", encode_varlong(INT64[1]), V(0), V(1) + b"k", V(-1), V(0)),
        body(b"\x00", encode_varlong(INT64[0]), V(0), V(-1), V(1) + b"v", V(0)),
        body(b"\x00", overlong(5, 10), V(0), V(-1), V(-1), V(0)),  # a 10-byte varlong
        body(b"\x00", overlong(5, 11), V(0), V(-1), V(-1), V(0)),  # 11 bytes: corrupt
        body(b"\x00", b"\xff" * 9 + b"\x02", V(0), V(-1), V(-1), V(0)),  # past 64 bits
        body(b"\x00", V(0), overlong(0, 5), V(-1), V(-1), V(0)),  # a 5-byte varint
        body(b"\x00", V(0), b"\xff\xff\xff\xff\x10", V(-1), V(-1), V(0)),  # past 32 bits
        body(b"\x00", V(0), b"\xfe\xff\xff\xff\x0f", V(-1), V(-1), V(0)),  # int32 max delta
        body(b"\x00", V(0), V(0), overlong(1, 5) + b"k", V(-1), V(0)),
        body(b"\x00", V(0), V(0), V(-1), V(-1), V(1), V(2) + "é".encode(), V(-1)),
        body(b"\x00", V(0), V(0), V(-1), V(-1), V(1), V(1) + b"\xff", V(-1)),  # not UTF-8
        body(b"\x00", V(0), V(0), V(-1), V(-1), V(1), V(1) + b"h", V(-2)),
        body(b"\x00", V(0), V(0), V(-1), V(-1), V(2), V(1) + b"h", V(0)),  # count lies
        body(b"\x00", V(0), V(0), V(-1), V(-1), V(0)) + b"\x00",  # trailing byte
        body(b"\x00", V(0), V(0), V(-1), V(-1), V(0), b"\x00"),  # length lies
        body(b"\x00", V(0), V(0), V(-3), V(-1), V(0)),
        body(b"\x00", V(0), V(0), V(-1), V(-2), V(0)),
        body(b"\x00", V(0), V(0), V(5) + b"k", V(-1), V(0)),
        overlong(12, 5) + b"\x00" + V(0) + V(0) + V(-1) + V(-1) + V(0) + b"\x00" * 6,
        V(-1) + b"\x00" * 8,
        b"",
        b"\x80",
    ],
)
@pytest.mark.parametrize("verify_crc", [True, False])
def test_hand_made_records_decode_or_fail_alike(payload: bytes, verify_crc: bool) -> None:
    decoded_both(replace_records(TEMPLATE, payload), verify_crc)


@pytest.mark.parametrize(
    ("base_offset", "base_timestamp"),
    [((1 << 63) - 1, 0), (0, (1 << 63) - 1), (0, -(1 << 63)), (-(1 << 63), 5)],
)
def test_offsets_and_timestamps_past_int64_are_left_to_python(
    base_offset: int, base_timestamp: int
) -> None:
    payload = body(b"\x00", encode_varlong(INT64[1]), V(3), V(-1), V(1) + b"v", V(0))
    buf = replace_records(TEMPLATE, payload)
    struct.pack_into(">qq", buf, 27, base_timestamp, base_timestamp)
    struct.pack_into(">q", buf, 0, base_offset)
    struct.pack_into(">i", buf, 23, 3)  # last offset delta
    got = decoded_both(resign(buf))
    assert got[1][0] == "ok"


# --- decoding: corrupted, truncated and adversarial batches -----------------------------


@st.composite
def damaged_batches(draw: st.DrawFn) -> bytearray:
    records = draw(
        st.lists(st.tuples(small, small, header_lists, st.integers(0, 1 << 40)), max_size=6)
    )
    data = bytearray(build_batch([SimpleRecord(k, v, h, t) for k, v, h, t in records]))
    for _ in range(draw(st.integers(0, 4))):
        position = draw(st.integers(0, len(data) - 1))
        data[position] = draw(st.integers(0, 255))
    if draw(st.booleans()):
        cut = draw(st.integers(BATCH_HEADER_SIZE, len(data)))
        data = replace_records(bytes(data), bytes(data[BATCH_HEADER_SIZE:cut]))
    return resign(data) if draw(st.booleans()) else data


@given(data=damaged_batches(), verify_crc=st.booleans())
@settings(max_examples=200, deadline=None, suppress_health_check=SLOW)
def test_damaged_batches_fail_alike(data: bytearray, verify_crc: bool) -> None:
    decoded_both(data, verify_crc)


@given(st.binary(max_size=200), st.sampled_from(list(Compression)))
@settings(max_examples=100, deadline=None, suppress_health_check=SLOW)
def test_random_payloads_fail_alike(payload: bytes, compression: Compression) -> None:
    decoded_both(replace_records(build_batch([SimpleRecord(b"k", b"v", (), 0)] * 3), payload))


@given(st.binary(max_size=120), st.integers(-3, 130))
@settings(max_examples=150, deadline=None, suppress_health_check=SLOW)
def test_check_batch_on_random_bytes(data: bytes, pos: int) -> None:
    for crc in (True, False):
        got = outcome(lambda c=crc: header.check_batch(data, pos, verify_crc=c))
        assert got == outcome(lambda c=crc: header.pure_check_batch(data, pos, verify_crc=c))


def test_check_batch_takes_every_buffer_and_keyword() -> None:
    data = build_batch([SimpleRecord(b"k", b"v", (), 1)], base_offset=3)
    expected = header.pure_check_batch(data)
    for buf in (data, bytearray(data), memoryview(data)):
        assert header.check_batch(buf) == expected
        assert header.check_batch(buf, 0, verify_crc=False) == expected
        assert header.check_batch(buf=buf, pos=0) == expected
        assert type(header.check_batch(buf)) is type(expected)
    padded = b"\x00" * 7 + data
    assert header.check_batch(padded, 7) == expected


# --- the other compiled functions --------------------------------------------------------


@given(st.binary(max_size=300))
@settings(deadline=None, suppress_health_check=SLOW)
def test_murmur2_is_the_reference(data: bytes) -> None:
    assert murmur2(data) == pure_murmur2(data)
    assert murmur2(bytearray(data)) == pure_murmur2(data)


def test_murmur2_of_kafka_vectors() -> None:
    # Kafka's UtilsTest.testMurmur2.
    assert murmur2(b"21") == -973932308
    assert murmur2(b"foobar") == -790332482
    assert murmur2(b"a-little-bit-long-string") == -985981536
    assert murmur2(b"a-little-bit-longer-string") == -1486304829
    assert murmur2(b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8") == -58897971
    assert murmur2(b"abc") == 479470107


@given(st.binary(max_size=600), st.integers(0, 7))
@settings(deadline=None, suppress_health_check=SLOW)
def test_crc32c_is_the_packages(data: bytes, skip: int) -> None:
    view = memoryview(data)[min(skip, len(data)) :]
    assert _C.crc32c(view) == crc32c_package.crc32c(view)


@given(st.integers(0, 3 * 3 * 4096 + 900), st.integers(0, 7), st.integers(0, 1 << 32))
@settings(deadline=None, suppress_health_check=SLOW)
def test_crc32c_of_long_buffers_is_the_packages(length: int, skip: int, seed: int) -> None:
    """Buffers long enough for the three-stream blocks (3 x 256 and 3 x 4096 bytes) and
    the shifts that join them, and for the folding's 256-byte steps and 16-byte tail, at
    every alignment: by the path ``crc32c`` takes and by each one the CPU has."""
    data = random.Random(seed).randbytes(length + skip)
    view = memoryview(data)[skip:]
    expected = crc32c_package.crc32c(view)
    assert _C.crc32c(view) == expected
    assert _C.crc32c_by_path(view) == dict.fromkeys(_C.crc32c_by_path(view), expected)


@pytest.mark.parametrize("length", [0, 1, 15, 16, 255, 256, 257, 271, 272, 511, 512, 16_323])
def test_every_crc32c_path_agrees_at_its_boundaries(length: int) -> None:
    """Lengths at the edges of each path: the folding's minimum of 256 bytes, one 256-byte
    step and a 16-byte piece either side, a 16 KiB batch less its 61-byte header."""
    data = random.Random(length).randbytes(length)
    by_path = _C.crc32c_by_path(data)
    assert "table" in by_path
    assert set(by_path.values()) == {crc32c_package.crc32c(data)}


def test_crc32c_folds_where_the_cpu_can() -> None:
    """The folded path is offered exactly where the CPU has VPCLMULQDQ with AVX-512 (the
    flags Linux reports), and never below its 256 bytes."""
    flags = set()
    with suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    folds = {"avx512f", "avx512vl", "vpclmulqdq", "pclmulqdq", "sse4_2"} <= flags
    assert ("folded" in _C.crc32c_by_path(bytes(256))) == folds
    assert "folded" not in _C.crc32c_by_path(bytes(255))


def test_slot_factories_make_what_the_class_makes() -> None:
    args = (b"k", None, (("h", b"v"),), 12, 34)
    made = [
        f(*args)
        for f in (
            MESSAGE_FACTORY,
            record.PureSlotFactory(Message, MESSAGE_FIELDS, MESSAGE_CONSTANTS),
        )
    ]
    direct = Message("t", 3, b"k", None, (("h", b"v"),), 12, 34, None, 1)
    for m in made:
        assert type(m) is Message
        assert message_fields(m) == message_fields(direct) and m.error() is None
    for factory in (record.SlotFactory, record.PureSlotFactory):
        with pytest.raises(AttributeError):
            factory(Message, ("_key", "_value", "_headers", "_timestamp", "nope"), {})
        with pytest.raises(TypeError):
            factory(Message, ("_key", "_value", "_headers", "_timestamp", "offset"), {})
    with pytest.raises(TypeError):
        MESSAGE_FACTORY(b"k")


def test_messages_of_atomic_fields_are_left_out_of_the_cycle_collector() -> None:
    """The compiled factory untracks a message whose slots can reach no other object (as
    CPython does for tuples of such values): a consumer holding a fetched batch's
    thousands of messages no longer makes every collection walk them. Any field that
    could hold a cycle (a list of headers, a constant that is a container) keeps the
    message tracked, and an untracked one is still freed when dropped."""
    atomic = MESSAGE_FACTORY(b"k", b"v", (("h", b"x"), ("n", None)), 12, 34)
    assert not gc.is_tracked(atomic)
    assert not gc.is_tracked(MESSAGE_FACTORY(None, None, (), 0, 0))
    for fields in (
        (b"k", b"v", [("h", b"x")], 12, 34),  # a list: could come to hold anything
        (b"k", b"v", (("h", []),), 12, 34),
        (b"k", b"v", ((1, 2, 3),), 12, 34),
        ([], b"v", (), 12, 34),
    ):
        assert gc.is_tracked(MESSAGE_FACTORY(*fields)), fields
    holder = record.SlotFactory(Message, MESSAGE_FIELDS, {**MESSAGE_CONSTANTS, "_error": []})
    assert gc.is_tracked(holder(b"k", b"v", (), 12, 34))
    value = bytes(range(50))
    before = sys.getrefcount(value)
    made = MESSAGE_FACTORY(b"k", value, (), 12, 34)
    assert not gc.is_tracked(made) and sys.getrefcount(value) == before + 1
    del made  # freed by its reference count, as any message
    assert sys.getrefcount(value) == before
    # the pure reference makes ordinary (tracked) instances of the same fields
    assert message_fields(atomic) == message_fields(
        Message("t", 3, b"k", b"v", (("h", b"x"), ("n", None)), 12, 34, None, 1)
    )


# --- under the debug allocator ------------------------------------------------------------

DEBUG_SCRIPT = r"""
import os, random, struct, sys
sys.path[:0] = sys.argv[1:]
null = os.open(os.devnull, os.O_WRONLY)
from highwater.records import RecordBatch, SimpleRecord, build_batch, implementation
from highwater.records.header import check_batch
import highwater.storage.log  # binds AppendInfo, which stamp_batches returns
from highwater.records.columnar import RecordColumns, encode_rows, partition_rows
from highwater.errors import HighwaterError
from records_helpers import resign
assert implementation.IMPLEMENTATION == "compiled"
rng = random.Random(21)
make = lambda *fields: fields
for i in range(1500):
    records = [
        SimpleRecord(
            rng.randbytes(rng.randrange(4)) or None,
            rng.randbytes(rng.randrange(90)),
            [("h" * rng.randrange(3), rng.randbytes(2))] * rng.randrange(3),
            rng.randrange(1 << 40),
        )
        for _ in range(rng.randrange(1, 6))
    ]
    data = bytearray(build_batch(records))
    for _ in range(rng.randrange(4)):
        data[rng.randrange(61, len(data))] = rng.randrange(256)
    if rng.random() < 0.3:
        del data[rng.randrange(61, len(data)):]
        struct.pack_into(">i", data, 8, len(data) - 12)
    data = bytes(resign(data))
    try:
        batch = RecordBatch(data)
        list(batch.records()); list(batch.iter_keys()); batch.read_records([], make)
    except HighwaterError:
        pass
    try:
        RecordBatch(data).read_columns(RecordColumns(include_headers=i % 2 == 0))
    except HighwaterError:
        pass
    stamp_args = [rng.choice([0, 5, (1 << 63) - 3, "x"]), rng.choice([0, -1, 1 << 31]),
                  rng.choice([100, 1 << 20]), 1 << 30, 1 << 40, 1 << 62, 1 << 62,
                  rng.choice([-1, 7]), rng.choice([0, 5])]
    # data * 700: a request past 32 KiB (written as pieces all the same).
    for stamp_data in (data, data * 2, data[: rng.randrange(len(data) + 1)], bytearray(data),
                       data * 700):
        stamped = implementation.codec.stamp_batches(stamp_data, *stamp_args)
        if stamped is not None:  # written from C beside the caller's bytes (to /dev/null)
            implementation.codec.write_stamped(null, stamped[0], stamp_data)
        try:  # headers that do not match the batches
            implementation.codec.write_stamped(null, data[:61 * rng.randrange(3)], stamp_data)
        except ValueError:
            pass
    try:
        RecordBatch(data).filter_records({b"k": 5, b"": 1 << 70}, 0, None, 1)
        RecordBatch(data).map_keys({}, rng.randrange(-1, 9))
    except HighwaterError:
        pass
    column = (data[:2], data[: 4 * rng.randrange(1, 12)], data, rng.randrange(3), 8)
    for encode in (lambda: encode_rows(column, column, data[:8], 0, 100),
                   lambda: partition_rows(column, 3)):
        try:
            encode()
        except ValueError:
            pass
    for pos in (0, 1, len(data) - 61, len(data)):
        try:
            check_batch(data[: rng.randrange(len(data) + 1)], pos)
        except HighwaterError:
            pass
# The open batch's buffer: appends that grow it past its first block, odd records the
# pure code takes or refuses, its records read back and the batch built.
from highwater.records.batch import RecordBatchBuilder, append_fields
for i in range(300):
    builder = RecordBatchBuilder(max_bytes=rng.choice([0, 100, 5000, 1 << 16]))
    for _ in range(rng.randrange(1, 30)):
        headers = rng.choice([(), [("k", b"v")], [("k", 5)], [("\ud800", None)], ["x"]])
        value = rng.choice([None, rng.randbytes(rng.randrange(9000)), bytearray(b"ab"), 7])
        fields = (rng.choice([None, b"key"]), value, headers, rng.randrange(1 << 41))
        try:
            append_fields(builder, fields)
        except (HighwaterError, TypeError, ValueError, UnicodeError):
            pass
    builder.records
    if builder.records_count:
        list(RecordBatch(builder.build()).records())
print("ok")
"""


def test_the_adversarial_corpus_under_the_debug_allocator() -> None:
    run_under_debug_allocator(DEBUG_SCRIPT, Path(__file__).parent)


# --- the cleaner's passes ---------------------------------------------------------------------


@given(
    records=simple_records(max_size=8),
    compression=st.sampled_from(list(Compression)),
    damage=st.lists(st.tuples(st.integers(0, 1 << 16), st.integers(0, 255)), max_size=3),
    cut=st.none() | st.integers(0, 1 << 16),
    now=st.integers(0, 1 << 41),
)
@settings(max_examples=100, deadline=None, suppress_health_check=SLOW)
def test_the_cleaners_compiled_passes_take_only_what_the_reference_takes(
    records: list[SimpleRecord],
    compression: Compression,
    damage: list[tuple[int, int]],
    cut: int | None,
    now: int,
) -> None:
    """Records bytes damaged inside a batch re-signed as valid: the compiled offset map
    stores what the reference stores or defers to it, and the compiled filter answers only
    for a batch whose records the reference decodes whole (it raises on the others)."""
    data = bytearray(build_batch(records, base_offset=100, compression=compression))
    for position, value in damage:
        data[BATCH_HEADER_SIZE + position % max(1, len(data) - BATCH_HEADER_SIZE)] = value
    if cut is not None:
        del data[BATCH_HEADER_SIZE + cut % max(1, len(data) - BATCH_HEADER_SIZE) :]
        struct.pack_into(">i", data, 8, len(data) - 12)
    batch_bytes = bytes(resign(data))
    offsets = {r.key: 100 + i for i, r in enumerate(records) if r.key is not None and i % 2}

    def mapped() -> dict[bytes, int]:
        found: dict[bytes, int] = {}
        RecordBatch(batch_bytes).map_keys(found, 101)
        return found

    compiled_map = outcome(mapped)
    found = outcome(lambda: RecordBatch(batch_bytes).filter_records(offsets, now, None, now + 9))
    with pure():
        assert outcome(mapped) == compiled_map
        reference = outcome(lambda: list(RecordBatch(batch_bytes).records()))
        keys = outcome(lambda: list(RecordBatch(batch_bytes).iter_keys()))
    if found[0] == "ok" and found[1] is not None:
        assert reference[0] == keys[0] == "ok"
        kept, keyless = found[1][:2]
        assert kept + keyless <= len(reference[1]) == len(keys[1])


# --- the recovery walk ------------------------------------------------------------------------


@st.composite
def logs(draw: st.DrawFn) -> tuple[bytes, int]:
    """Batches as a segment holds them (offsets increasing, epochs and producers mixed),
    then damage: a flipped byte, a cut, an offset going back, or nothing."""
    out = bytearray()
    offset = draw(st.integers(0, 1000))
    for _ in range(draw(st.integers(0, 12))):
        count = draw(st.integers(1, 4))
        producer = draw(st.sampled_from([(-1, -1, -1), (9, 0, offset % 1000)]))
        batch = bytearray(
            build_batch(
                [SimpleRecord(None, b"v" * draw(st.integers(0, 300)), (), draw(timestamps))]
                * count,
                base_offset=offset,
                partition_leader_epoch=draw(st.integers(0, 3)),
                producer_id=producer[0],
                producer_epoch=producer[1],
                base_sequence=producer[2],
            )
        )
        offset += count + draw(st.sampled_from([0, 0, 0, 5, -2 * count]))
        out += batch
    damage = draw(st.sampled_from(["none", "flip", "cut"]))
    if out and damage == "flip":
        out[draw(st.integers(0, len(out) - 1))] ^= 1 << draw(st.integers(0, 7))
    elif out and damage == "cut":
        del out[draw(st.integers(0, len(out) - 1)) :]
    return bytes(out), draw(st.integers(0, 1500))


@given(
    log=logs(), interval=st.sampled_from([0, 100, 4096]), max_batch=st.sampled_from([500, 1 << 20])
)
@settings(max_examples=120, deadline=None, suppress_health_check=SLOW)
def test_the_recovery_walk_is_the_reference(
    log: tuple[bytes, int], interval: int, max_batch: int
) -> None:
    data, start_offset = log
    for buf in (data, memoryview(data)):
        kwargs: dict[str, Any] = {
            "next_offset": start_offset,
            "max_offset": start_offset + 3000,
            "max_batch_size": max_batch,
            "index_interval": interval,
        }
        for end in (len(data), len(data) // 2):
            assert header.scan_batches(buf, 0, end, **kwargs) == header.pure_scan_batches(
                buf, 0, end, **kwargs
            )


def test_the_recovery_walk_leaves_huge_offsets_to_python() -> None:
    data = build_batch([SimpleRecord(None, b"v", (), 1)] * 3, base_offset=(1 << 63) - 2)
    kwargs: dict[str, Any] = {
        "next_offset": 0,
        "max_offset": 1 << 64,
        "max_batch_size": 1 << 20,
        "index_interval": 0,
    }
    assert header.scan_batches(data, 0, len(data), **kwargs) == header.pure_scan_batches(
        data, 0, len(data), **kwargs
    )


# --- the producer's append --------------------------------------------------------------------


@given(
    appends=st.lists(
        st.tuples(small | sized, small, header_lists, timestamps | st.just(1 << 63)), max_size=12
    ),
    max_bytes=st.sampled_from([0, 100, 300, 1 << 20]),
)
@settings(max_examples=120, deadline=None, suppress_health_check=SLOW)
def test_append_fields_is_the_reference(
    appends: list[tuple[Any, Any, Any, int]], max_bytes: int
) -> None:
    compiled = batch_module.RecordBatchBuilder(max_bytes=max_bytes)
    with pure():  # the reference keeps its records as tuples, encoded at build
        reference = batch_module.RecordBatchBuilder(max_bytes=max_bytes)
    assert compiled._buffer is not None and reference._buffer is None

    def state(b: batch_module.RecordBatchBuilder) -> tuple[Any, ...]:
        return (b.records, b.estimated_size, b.max_timestamp, b.records_count)

    for fields in appends:
        got = outcome(lambda f=fields: batch_module.append_fields(compiled, f))
        assert got == outcome(lambda f=fields: batch_module.pure_append_fields(reference, f))
        assert state(compiled) == state(reference)
    assert outcome(compiled.build) == outcome(reference.build)
    with pytest.raises(RuntimeError):
        batch_module.append_fields(compiled, (None, b"v", (), 1))


# --- the open batch's buffer (RecordBuffer): records written as they are appended -------

# Headers as a producer gives them (a list of pairs, values bytes, bytearray or None) and
# as the batch layer takes them (a tuple); keys and values at the varint boundaries.
producer_headers = (
    st.lists(
        st.tuples(
            header_keys, st.none() | st.binary(max_size=20) | st.binary(max_size=5).map(bytearray)
        ),
        max_size=3,
    )
    | header_lists
)


@pytest.mark.parametrize("compression", list(Compression))
@given(
    appends=st.lists(
        st.tuples(small | sized, small | sized, producer_headers, timestamps), max_size=20
    ),
    max_bytes=st.sampled_from([0, 200, 5000, 1 << 21]),
)
@settings(max_examples=25, deadline=None, suppress_health_check=SLOW)
def test_the_buffered_builder_builds_the_references_batch(
    compression: Compression, appends: list[tuple[Any, Any, Any, int]], max_bytes: int
) -> None:
    """Record by record the same answers (size, does not fit, typed error), the same
    state, the same records read back, and the same batch bytes as the pure builder."""
    compiled = batch_module.RecordBatchBuilder(max_bytes=max_bytes, compression=compression)
    with pure():
        reference = batch_module.RecordBatchBuilder(max_bytes=max_bytes, compression=compression)
    assert compiled._buffer is not None and reference._buffer is None

    def state(b: batch_module.RecordBatchBuilder) -> tuple[Any, ...]:
        return (b.estimated_size, b.base_timestamp, b.max_timestamp, b.records_count)

    for fields in appends:
        got = outcome(lambda f=fields: batch_module.append_fields(compiled, f))
        with pure():
            expected = outcome(lambda f=fields: batch_module.pure_append_fields(reference, f))
        assert got == expected
        assert state(compiled) == state(reference)
    # Read back from the bytes: the fields as given, headers as a tuple of (str, bytes).
    assert compiled.records == [
        (
            None if k is None else bytes(k),
            None if v is None else bytes(v),
            tuple((hk, None if hv is None else bytes(hv)) for hk, hv in h),
            t,
        )
        for k, v, h, t in reference.records
    ]
    with pure():
        built = outcome(reference.build)
    assert outcome(compiled.build) == built
    if built[0] == "ok" and compression in (Compression.NONE, Compression.GZIP):
        decoded_both(built[1])


@pytest.mark.parametrize(
    "fields",
    [
        (b"k", b"v", [("h", 5)], 1),  # a header value that is not bytes
        (b"k", b"v", [(b"h", b"v")], 1),  # a header key that is not str
        (b"k", b"v", [("\ud800", b"v")], 1),  # a key that does not encode
        (b"k", b"v", ["h"], 1),  # a header that is not a pair
        (b"k", 7, (), 1),  # a value that is not bytes
        (memoryview(b"k"), bytearray(b"v"), [["h", memoryview(b"x")]], 1),  # taken
        (None, None, (), 1 << 63),  # a timestamp past int64
        (None, None, (), -(1 << 63) - 1),
    ],
)
@pytest.mark.parametrize("first", [True, False])
def test_the_buffered_builder_takes_or_refuses_what_the_reference_does(
    fields: tuple[Any, ...], first: bool
) -> None:
    """Odd records go through the pure checks into the buffer: the same error (type and
    message) or the same bytes, whether the record opens the batch or follows one."""

    def run() -> tuple[Any, ...]:
        b = batch_module.RecordBatchBuilder(max_bytes=1 << 20)
        if not first:
            batch_module.append_fields(b, (b"k0", b"v0", (), 1_000))
        try:
            added: Any = batch_module.append_fields(b, fields)
        except Exception as e:  # the builder's errors are not all Highwater's (TypeError)
            added = (type(e).__name__, str(e))
        return added, b.records_count, b.estimated_size, b.build()

    compiled = run()
    with pure():
        reference = run()
    assert compiled == reference


def test_the_buffer_writes_from_c_and_refuses_what_it_does_not_take() -> None:
    buffer = _C.RecordBuffer(BATCH_HEADER_SIZE + 30, BATCH_HEADER_SIZE)
    assert (buffer.count, buffer.size, buffer.base_timestamp, buffer.max_timestamp) == (
        0,
        BATCH_HEADER_SIZE,
        None,
        -1,
    )
    assert buffer.append(None, b"v" * 40, (), 100) == 47  # the first always fits
    assert buffer.append(b"k", b"v", (), 90) == 0  # past max_bytes: nothing appended
    assert buffer.append(b"k", 5, (), 90) is None  # not bytes: the pure code's
    assert buffer.append(b"k", b"v", (), 1 << 64) is None  # not an int64
    assert buffer.count == 1 and buffer.size == BATCH_HEADER_SIZE + 47
    assert buffer.records() == [(None, b"v" * 40, (), 100)]
    batch = buffer.batch()
    assert isinstance(batch, bytearray) and batch[:BATCH_HEADER_SIZE] == bytes(BATCH_HEADER_SIZE)
    assert bytes(batch[BATCH_HEADER_SIZE:]) == record.pure_encode_records(
        [(None, b"v" * 40, (), 100)], 100
    )
