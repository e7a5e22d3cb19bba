"""A leader's append on the compiled path against the reference path, on the same batches.

With the compiled codec, :meth:`PartitionLog.append_as_leader` checks and stamps client
batches in one call (``stamp_batches``) and falls back on its checks in Python, the
reference, for whatever that call refuses. Each example appends the same sequence of
batches (valid, damaged, records damaged under a valid CRC, a max timestamp that is not
the records' largest, out of the timestamp window, too large, control batches and
producer ids without a sequence, duplicates of an idempotent producer, several per call)
to two logs, one on each path, and compares what every append returned or raised (type
and message) and, at the end, every file of the two partition directories byte for byte:
segments, indexes, producer snapshots, epochs.
"""

from __future__ import annotations

import contextlib
import errno
import os
import struct
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from highwater.errors import HighwaterError
from highwater.records import SimpleRecord, build_batch
from highwater.records.header import stamp_batches, write_stamped
from highwater.storage import log as log_module
from highwater.storage import segment as segment_module
from highwater.storage.log import PartitionLog
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from storage_helpers import BASE_TS, FakeClock, open_log

pytestmark = pytest.mark.skipif(
    stamp_batches is None, reason="the pure-Python run: there is no compiled path to compare"
)


@contextlib.contextmanager
def reference_path() -> Iterator[None]:
    """Appends run the checks in Python, as on the pure-Python implementation."""
    saved = log_module.stamp_batches
    log_module.stamp_batches = None
    try:
        yield
    finally:
        log_module.stamp_batches = saved


def resigned(data: bytearray) -> bytes:
    from highwater.records.header import crc32c

    struct.pack_into(">I", data, 17, crc32c(memoryview(data)[21:]))
    return bytes(data)


@st.composite
def client_batch(draw: st.DrawFn, sequence: list[int]) -> bytes:
    count = draw(st.integers(1, 4))
    timestamp = BASE_TS + draw(st.sampled_from([0, -5, 7, -(10**12), 10**12]))
    records = [
        SimpleRecord(
            draw(st.sampled_from([None, b"", b"key"])),
            b"v" * draw(st.integers(0, 400)),
            draw(st.sampled_from([(), (("h", b"x"),), (("é", None), ("", b""))])),
            timestamp + draw(st.sampled_from([i, -i, 0])),
        )
        for i in range(count)
    ]
    producer: dict[str, int] = {}
    if draw(st.booleans()):
        producer = {"producer_id": 7, "producer_epoch": 0, "base_sequence": sequence[0]}
        if draw(st.integers(0, 4)):  # mostly in order; else a duplicate or a gap
            sequence[0] += count
    data = bytearray(build_batch(records, **producer))
    damage = draw(
        st.sampled_from(
            ["none"] * 6
            + ["flip", "cut", "count", "magic", "type", "control", "no sequence"]
            + ["record byte", "records cut", "records grown", "max timestamp"]
        )
    )
    if damage == "flip":
        data[draw(st.integers(0, len(data) - 1))] ^= 1 << draw(st.integers(0, 7))
    elif damage == "cut":
        del data[draw(st.integers(0, len(data) - 1)) :]
    elif damage == "count":
        struct.pack_into(">i", data, 57, count + draw(st.sampled_from([-1, 1])))
        data = bytearray(resigned(data))
    elif damage == "magic":
        data[16] = 1
    elif damage == "type":
        data[22] |= 0x08  # LogAppendTime from a producer
        data = bytearray(resigned(data))
    elif damage == "control":
        data[22] |= 0x20  # a control batch from a client
        data = bytearray(resigned(data))
    elif damage == "record byte":  # the records damaged under a valid CRC
        data[draw(st.integers(61, len(data) - 1))] = draw(st.integers(0, 255))
        data = bytearray(resigned(data))
    elif damage in ("records cut", "records grown"):
        at = draw(st.integers(61, len(data) - 1))
        if damage == "records cut":
            del data[at : at + draw(st.integers(1, 8))]
        else:
            data[at:at] = draw(st.binary(min_size=1, max_size=8))
        struct.pack_into(">i", data, 8, len(data) - 12)
        data = bytearray(resigned(data))
    elif damage == "max timestamp":  # a header that does not say the records' largest
        struct.pack_into(">q", data, 35, timestamp + draw(st.sampled_from([-3, 0, 5, 10**12])))
        data = bytearray(resigned(data))
    elif damage == "no sequence":
        struct.pack_into(">i", data, 53, -1)  # a producer id (if any) without a sequence
        data = bytearray(resigned(data))
    return bytes(data)


@st.composite
def appends(draw: st.DrawFn) -> list[tuple[bytes | bytearray | memoryview, int]]:
    sequence = [0]
    calls: list[tuple[bytes | bytearray | memoryview, int]] = []
    for _ in range(draw(st.integers(1, 8))):
        batches = [draw(client_batch(sequence)) for _ in range(draw(st.integers(1, 3)))]
        data = b"".join(batches)
        # The compiled path writes the record bytes from the caller's buffer: every kind.
        kind = draw(st.sampled_from(["bytes", "bytes", "bytearray", "memoryview"]))
        if kind == "bytearray":
            data = bytearray(data)
        elif kind == "memoryview":
            data = memoryview(b"xy" + data)[2:]
        calls.append((data, draw(st.sampled_from([0, 0, 3, -1]))))
        if draw(st.integers(0, 5)) == 0:
            calls.append(calls[-1])  # a retry
    return calls


def outcome(log: PartitionLog, data: bytes | bytearray | memoryview, epoch: int) -> object:
    try:
        return log.append_as_leader(data, epoch)
    except HighwaterError as error:
        return type(error), str(error)


def files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


@given(
    calls=appends(),
    timestamp_type=st.sampled_from(["CreateTime", "LogAppendTime"]),
    max_message_bytes=st.sampled_from([600, 1 << 20]),
    segment_bytes=st.sampled_from([1500, 1 << 30]),
)
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_the_compiled_append_is_the_reference(
    calls: list[tuple[bytes | bytearray | memoryview, int]],
    timestamp_type: str,
    max_message_bytes: int,
    segment_bytes: int,
) -> None:
    config = {
        "message.timestamp.type": timestamp_type,
        "max.message.bytes": max_message_bytes,
        "segment.bytes": segment_bytes,
        "index.interval.bytes": 200,
        "message.timestamp.before.max.ms": 10**9,
        "message.timestamp.after.max.ms": 10**9,
    }
    appends_alike(calls, config)


@pytest.mark.parametrize("timestamp_type", ["CreateTime", "LogAppendTime"])
def test_large_requests_are_written_from_the_callers_bytes(timestamp_type: str) -> None:
    """``stamp_batches`` returns stamped headers only and ``write_stamped`` writes them
    beside the caller's record bytes: batches of tens of KiB, one and several a request,
    from each kind of buffer, a refused one among them, and a request of 600 batches (more
    pieces than one ``writev`` takes) give the reference's results and files."""

    def batch(values: int, value_bytes: int, first: int) -> bytes:
        return build_batch(
            [
                SimpleRecord(None, bytes([first + i]) * value_bytes, (), BASE_TS + first + i)
                for i in range(values)
            ]
        )

    big, other = batch(3, 20_000, 0), batch(2, 30_000, 3)
    several = big + batch(1, 100, 5) + other
    damaged = bytearray(several)
    damaged[len(big) + 70] ^= 1  # the second batch's records: its CRC fails
    calls: list[tuple[bytes | bytearray | memoryview, int]] = [
        (big, 0),
        (several, 0),
        (bytearray(other), 1),
        (memoryview(b"xy" + several)[2:], 1),
        (bytes(damaged), 1),
        (big, 2),
        (b"".join(batch(1, 10, i % 200) for i in range(600)), 2),
    ]
    appends_alike(calls, {"message.timestamp.type": timestamp_type, "index.interval.bytes": 200})


def appends_alike(
    calls: list[tuple[bytes | bytearray | memoryview, int]], config: dict[str, object]
) -> None:
    """Make ``calls`` on a log on the compiled path and on one on the reference path:
    the same results or errors, and the same files byte for byte."""
    with tempfile.TemporaryDirectory() as root:
        fast = open_log(Path(root) / "fast" / "t-0", FakeClock(), **config)
        reference = open_log(Path(root) / "reference" / "t-0", FakeClock(), **config)
        for data, epoch in calls:
            got = outcome(fast, data, epoch)
            with reference_path():
                expected = outcome(reference, data, epoch)
            assert got == expected
        fast.close()
        reference.close()
        assert files(fast.directory) == files(reference.directory)


def test_write_stamped_refuses_headers_that_do_not_match_and_reports_os_errors(
    tmp_path: Path,
) -> None:
    """Stamped headers that are not one per batch of the data are refused before a byte
    is written; a failed write raises ``OSError`` with its errno."""
    assert write_stamped is not None
    data = build_batch([SimpleRecord(None, b"v" * 50, (), BASE_TS)]) * 2
    stamped = stamp_batches(data, 0, 0, 1 << 20, 1 << 30, BASE_TS, 10**9, 10**9, -1, 0)
    assert stamped is not None
    path = tmp_path / "out"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        for heads, body in [
            (stamped[0][:61], data),  # one header for two batches
            (stamped[0] + stamped[0][:61], data),  # three for two
            (stamped[0][:100], data),  # not whole headers
            (stamped[0], data[:-1]),  # the last batch cut short
            (b"", b""),
        ]:
            with pytest.raises(ValueError, match="do not match"):
                write_stamped(fd, heads, body)
        assert path.stat().st_size == 0
        write_stamped(fd, stamped[0], data)
    finally:
        os.close(fd)
    assert (
        path.read_bytes()
        == stamped[0][:61]
        + data[61 : len(data) // 2]
        + stamped[0][61:]
        + data[len(data) // 2 + 61 :]
    )
    with pytest.raises(OSError) as failed:
        write_stamped(fd, stamped[0], data)  # closed
    assert failed.value.errno == errno.EBADF


def test_a_replaced_write_seam_receives_the_leaders_appends(tmp_path: Path) -> None:
    """While ``segment._write_fully`` is replaced (the simulation's disk faults), a leader's
    append hands it its pieces instead of writing them itself: the seam sees every byte
    the file gets, and a write it fails leaves nothing appended."""
    log = open_log(tmp_path / "t-0", FakeClock())
    one = build_batch([SimpleRecord(None, b"v" * 300, (), BASE_TS)])
    data = one * 3
    seen: list[bytes] = []
    real = segment_module._write_fully

    def recording(fd: int, pieces: list[bytes | bytearray | memoryview], total: int) -> None:
        seen.append(b"".join(bytes(p) for p in pieces))
        real(fd, pieces, total)

    def disk_full(fd: int, pieces: list[bytes | bytearray | memoryview], total: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with pytest.MonkeyPatch.context() as patched:
        patched.setattr(segment_module, "_write_fully", recording)
        log.append_as_leader(data, 0)  # several batches
        log.append_as_leader(one, 0)  # one batch: its own path
        patched.setattr(segment_module, "_write_fully", disk_full)
        for request in (data, one):
            with pytest.raises(HighwaterError):
                log.append_as_leader(request, 0)
    assert log.log_end_offset == 4
    assert b"".join(seen) == log.active_segment.log_path.read_bytes()
    assert [len(written) for written in seen] == [len(data), len(one)]
    log.close()


def test_header_tuples_are_made_only_where_the_log_reads_them() -> None:
    """One batch without a producer id comes back without a header tuple (the append's
    ``AppendInfo`` says all its segment needs); several batches, or a producer id, with
    one per batch. The ``AppendInfo`` is the one the reference path returns."""
    assert stamp_batches is not None
    plain = build_batch([SimpleRecord(None, b"v" * 50, (), BASE_TS + i) for i in range(3)])
    tracked = build_batch(
        [SimpleRecord(None, b"v", (), BASE_TS)], producer_id=7, producer_epoch=0, base_sequence=0
    )
    window = (BASE_TS, 10**9, 10**9, -1)
    for data, headers in [(plain, 0), (tracked, 1), (plain + plain, 2), (plain + tracked, 2)]:
        stamped = stamp_batches(data, 40, 3, 1 << 20, 1 << 30, *window, 11)
        assert stamped is not None
        assert len(stamped[1]) == headers
        assert [header.base_offset for header in stamped[1]] == [40, 43][:headers]
        assert stamped[3] is (data is not plain and tracked in data)
    info = stamp_batches(plain + tracked, 40, 3, 1 << 20, 1 << 30, *window, 11)[2]  # type: ignore[index]
    assert info == (40, 43, BASE_TS + 2, 42, -1, 11, 4, len(plain + tracked), False)
    assert (info.first_offset, info.last_offset, info.log_start_offset) == (40, 43, 11)


def test_a_segment_rolls_by_the_appends_largest_timestamp() -> None:
    """Kafka's ``maybeRoll`` takes the append's largest timestamp: an append of two
    batches whose first is past ``segment.ms`` from the segment's first batch rolls, on
    both paths, though its last batch is not."""
    day = 86_400_000
    first = build_batch([SimpleRecord(None, b"a", (), BASE_TS)])
    late = build_batch([SimpleRecord(None, b"b", (), BASE_TS + day + 1)])
    early = build_batch([SimpleRecord(None, b"c", (), BASE_TS + 1)])
    config = {
        "segment.ms": day,
        "message.timestamp.before.max.ms": 10**12,
        "message.timestamp.after.max.ms": 10**12,
    }
    appends_alike([(first, 0), (late + early, 0)], config)
    with tempfile.TemporaryDirectory() as root:
        log = open_log(Path(root) / "t-0", FakeClock(), **config)
        log.append_as_leader(first, 0)
        log.append_as_leader(late + early, 0)
        assert [segment.base_offset for segment in log.segments] == [0, 1]
        log.close()
