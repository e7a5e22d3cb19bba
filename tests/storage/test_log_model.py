"""Model-based test: any sequence of appends, reads, truncations, rolls, retention and compaction
agrees with a simple in-memory log."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import hypothesis.strategies as st
from highwater.config.topic import LogConfig
from highwater.errors import OffsetOutOfRangeError
from highwater.records import Compression
from highwater.storage.cleaner import LogCleaner
from highwater.storage.log import PartitionLog
from highwater.storage.log_loader import load_partition_log
from highwater.storage.log_manager import LogManager
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from storage_helpers import FakeClock, make_batch, read_all

CONFIG = LogConfig.from_properties(
    {
        "segment.bytes": 1024,
        "index.interval.bytes": 100,
        "segment.index.bytes": 80,
        "retention.bytes": -1,
        "retention.ms": 100_000,
        "file.delete.delay.ms": 0,
        "cleanup.policy": "compact,delete",
        "min.cleanable.dirty.ratio": 0.0,
    }
)
KEYS = [b"k0", b"k1", b"k2", b"k3", b"k4"]


class LogModel(RuleBasedStateMachine):
    """Records by offset and the batch boundaries; what a partition log must agree with."""

    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="hw-model-"))
        self.clock = FakeClock()
        self.log = self._open(clean=True)
        self.records: dict[int, bytes] = {}
        self.keys: dict[int, bytes] = {}
        (self.root / "cleaner").mkdir()
        self.cleaner = LogCleaner(LogManager(self.root / "cleaner", clock=self.clock))
        self.batches: list[tuple[int, int]] = []  # (base offset, last offset)
        self.log_start = 0
        self.leo = 0
        self.counter = 0

    def _open(self, *, clean: bool, recovery_point: int = 0) -> PartitionLog:
        return load_partition_log(
            self.root / "model-0",
            CONFIG,
            clock=self.clock,
            had_clean_shutdown=clean,
            recovery_point=recovery_point,
        )

    def teardown(self) -> None:
        self.log.close()
        shutil.rmtree(self.root, ignore_errors=True)

    @rule(
        count=st.integers(1, 6),
        size=st.integers(0, 120),
        compression=st.sampled_from([Compression.NONE, Compression.LZ4, Compression.GZIP]),
        age=st.integers(0, 5_000),
        data=st.data(),
    )
    def append(
        self, count: int, size: int, compression: Compression, age: int, data: st.DataObject
    ) -> None:
        values = []
        for _ in range(count):
            self.counter += 1
            values.append(f"{self.counter}:".encode() + b"v" * size)
        keys = [data.draw(st.sampled_from(KEYS)) for _ in values]
        info = self.log.append_as_leader(
            make_batch(values, keys=keys, timestamp=self.clock.now - age, compression=compression),
            leader_epoch=1,
        )
        assert info.first_offset == self.leo
        assert info.last_offset == self.leo + count - 1
        for i, (key, value) in enumerate(zip(keys, values, strict=True)):
            self.records[self.leo + i] = value
            self.keys[self.leo + i] = key
        self.batches.append((self.leo, self.leo + count - 1))
        self.leo += count

    @rule(data=st.data())
    def read(self, data: st.DataObject) -> None:
        offset = data.draw(st.integers(self.log_start, self.leo))
        fetched = self.log.read(offset, data.draw(st.integers(1, 2_000)))
        if offset == self.leo:
            assert fetched.records == b""
            return
        assert offset < fetched.next_offset
        # The first batch holds the offset, or starts after it when compaction removed it.
        assert fetched.first_offset <= offset or not any(
            offset <= o < fetched.first_offset for o in self.records
        )
        got = read_all(self.log, offset)
        assert [(r.offset, r.value) for r in got] == [
            (o, self.records[o]) for o in sorted(self.records) if o >= offset
        ]
        assert all(r.key == self.keys[r.offset] for r in got)

    @rule(data=st.data())
    def read_out_of_range(self, data: st.DataObject) -> None:
        offset = data.draw(st.sampled_from([self.leo + 1, self.leo + 100, -1]))
        if offset < self.log_start or offset > self.leo:
            try:
                self.log.read(offset, 100)
            except OffsetOutOfRangeError:
                return
            raise AssertionError(f"read at {offset} should be out of range")

    @precondition(lambda self: self.leo > self.log_start)
    @rule(data=st.data())
    def truncate(self, data: st.DataObject) -> None:
        target = data.draw(st.integers(self.log_start, self.leo))
        self.log.truncate_to(target)
        if target < self.leo:
            # The batch holding the target goes whole: the new end is that batch's base
            # offset. Batches never straddle a batch boundary, so every record before the
            # first batch reaching the target survives; with compaction the end may sit
            # anywhere in the gap before the next surviving record.
            cut = min(
                (b[0] for b in self.batches if b[1] >= target),
                default=target,
            )
            survivors = {o: v for o, v in self.records.items() if o < cut}
            end = self.log.log_end_offset
            assert max(survivors, default=self.log_start - 1) < end <= max(target, self.log_start)
            assert not any(cut <= o < end for o in self.records)
            self.records = survivors
            self.leo = end
            # The start may move up over a gap compaction left, never past a record.
            start = self.log.log_start_offset
            assert self.log_start <= start <= end
            assert not any(self.log_start <= o < start for o in survivors)
            self.log_start = start
        self.batches = [b for b in self.batches if b[1] < self.leo]
        assert self.log.log_end_offset == self.leo
        # What LogManager.truncate_to does after a replica's truncation.
        self.cleaner.manager.lower_cleaner_checkpoint(self.log.topic_partition, self.leo)

    @rule()
    def roll(self) -> None:
        self.log.roll()

    @precondition(lambda self: self.leo > self.log_start)
    @rule(data=st.data())
    def delete_records(self, data: st.DataObject) -> None:
        hw = data.draw(st.integers(self.log_start, self.leo))
        self.log.update_high_watermark(hw)
        new_start = data.draw(st.integers(self.log_start, hw))
        self.log.maybe_increment_log_start_offset(new_start)
        self.log_start = max(self.log_start, new_start)
        self.records = {o: v for o, v in self.records.items() if o >= self.log_start}

    @rule(advance=st.integers(0, 200_000), hw_full=st.booleans())
    def retention(self, advance: int, hw_full: bool) -> None:
        self.clock.advance(advance)
        if hw_full:
            self.log.update_high_watermark(self.leo)
        before = self.log.log_start_offset
        self.log.delete_old_segments()
        self.log.delete_pending_files()
        after = self.log.log_start_offset
        assert after >= before
        assert after <= self.log.high_watermark or after == self.leo
        self.log_start = after
        self.records = {o: v for o, v in self.records.items() if o >= after}
        self.batches = [b for b in self.batches if b[1] >= after]

    @rule()
    def compact(self) -> None:
        """A cleaning pass up to the high watermark: below where it stopped, each key keeps
        only its latest record; everything else is untouched."""
        self.log.update_high_watermark(self.leo)
        stats = self.cleaner.clean_log(self.log)
        end = stats.end_offset
        latest: dict[bytes, int] = {}
        for offset in sorted(self.records):
            if offset < end:
                latest[self.keys[offset]] = offset
        self.records = {
            o: v for o, v in self.records.items() if o >= end or latest[self.keys[o]] == o
        }
        got = read_all(self.log)
        assert [(r.offset, r.value) for r in got] == sorted(self.records.items())
        assert all(r.key == self.keys[r.offset] for r in got)

    @rule(clean=st.booleans())
    def reopen(self, clean: bool) -> None:
        hw, start = self.log.high_watermark, self.log.log_start_offset
        if clean:
            self.log.close()
            self.log = self._open(clean=True)
        else:
            recovery_point = self.log.flush()
            self.log.close()
            self.log = self._open(clean=False, recovery_point=recovery_point)
        self.log.maybe_increment_log_start_offset  # noqa: B018 - the loader restores the start
        self.log.log_start_offset = max(self.log.log_start_offset, start)
        self.log.update_high_watermark(hw)

    @invariant()
    def bounds_agree(self) -> None:
        assert self.log.log_end_offset == self.leo
        assert self.log.log_start_offset == self.log_start
        assert self.log.log_start_offset <= self.log.high_watermark <= self.log.log_end_offset

    @invariant()
    def segments_are_ordered(self) -> None:
        bases = [s.base_offset for s in self.log.segments]
        assert bases == sorted(set(bases))
        assert self.log.segments[-1].next_offset == self.leo


LogModel.TestCase.settings = settings(
    # Examples: the profile's (tests/conftest.py).
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestLogModel = LogModel.TestCase
