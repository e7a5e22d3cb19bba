"""Crash recovery of a data directory: a writer process killed with SIGKILL, again and again.

The writer (``crash_writer.py``) appends records that are a function of their offset and
reports, after each flush, the offset below which everything is durable. After every kill
the directory is opened as after a crash and must hold a clean prefix of the writer's
sequence that reaches at least the last reported flush, with indexes that agree with the
log. Some rounds also throw away part of the unflushed tail before reopening, as a power
cut would, and some kill the writer in the middle of a segment roll.

A clean shutdown, by contrast, must be trusted on restart: no segment is re-validated.
"""

from __future__ import annotations

import os
import random
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from crash_writer import (
    PRODUCER_ID,
    ROLL_KILL_MODES,
    TIMESTAMP_BASE,
    TOPIC_PARTITION,
    batch_for,
    log_config,
    record_for,
)
from highwater.records import (
    BATCH_HEADER_SIZE,
    Compression,
    Record,
    RecordBatch,
    check_batch,
    iter_batches,
    read_header,
)
from highwater.storage.checkpoint import RECOVERY_POINT_CHECKPOINT, OffsetCheckpointFile
from highwater.storage.log import PartitionLog
from highwater.storage.log_manager import CLEAN_SHUTDOWN_FILE, LogManager
from highwater.storage.segment import LogSegment

WRITER = Path(__file__).with_name("crash_writer.py")
READY_TIMEOUT_S = 30.0
EXIT_TIMEOUT_S = 60.0
PARTITION_DIR = TOPIC_PARTITION.dir_name


# -- the writer process -----------------------------------------------------------------------


@dataclass
class WriterProcess:
    """A running ``crash_writer.py`` and the files it reports through."""

    process: subprocess.Popen[bytes]
    flushed_file: Path
    stderr_file: Path

    def stderr(self) -> str:
        return self.stderr_file.read_text(errors="replace")[-4000:]

    def wait_ready(self) -> None:
        """Block until the writer printed ``ready`` (its log is open and appends begin)."""
        assert self.process.stdout is not None
        deadline = time.monotonic() + READY_TIMEOUT_S
        line = b""
        while not line.endswith(b"\n"):
            remaining = deadline - time.monotonic()
            readable, _, _ = select.select([self.process.stdout], [], [], max(remaining, 0))
            if not readable:
                pytest.fail(f"the writer did not start within {READY_TIMEOUT_S}s\n{self.stderr()}")
            chunk = os.read(self.process.stdout.fileno(), 1)
            if not chunk:
                pytest.fail(f"the writer exited before it was ready\n{self.stderr()}")
            line += chunk
        assert line == b"ready\n", line

    def wait_killed(self) -> None:
        """Wait for the writer to die and check that SIGKILL killed it, not an error."""
        returncode = self.process.wait(timeout=EXIT_TIMEOUT_S)
        assert returncode == -signal.SIGKILL, (
            f"the writer exited with {returncode}, not by SIGKILL\n{self.stderr()}"
        )

    def last_flushed(self) -> int:
        """The last offset the writer reported flushed (0 if none); a torn last line is ignored."""
        if not self.flushed_file.exists():
            return 0
        complete = self.flushed_file.read_bytes().split(b"\n")[:-1]
        return int(complete[-1]) if complete else 0

    def reap(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=EXIT_TIMEOUT_S)
        if self.process.stdout is not None:
            self.process.stdout.close()


def start_writer(
    data_dir: Path,
    work_dir: Path,
    name: str,
    *,
    start_offset: int,
    seed: int,
    epoch: int,
    kill_during_roll: str | None = None,
) -> WriterProcess:
    flushed_file = work_dir / f"{name}.flushed"
    stderr_file = work_dir / f"{name}.stderr"
    command = [
        sys.executable,
        str(WRITER),
        str(data_dir),
        str(flushed_file),
        f"--start-offset={start_offset}",
        f"--seed={seed}",
        f"--epoch={epoch}",
    ]
    if kill_during_roll is not None:
        command.append(f"--kill-during-roll={kill_during_roll}")
    with open(stderr_file, "wb") as stderr:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr)
    return WriterProcess(process, flushed_file, stderr_file)


# -- checks ---------------------------------------------------------------------------------


def assert_record_matches(record: Record, offset: int) -> None:
    expected = record_for(offset)
    assert record.offset == offset
    actual = (record.key, record.value, tuple(record.headers), record.timestamp)
    assert actual == (expected.key, expected.value, tuple(expected.headers), expected.timestamp), (
        f"record at offset {offset} is not the one written there"
    )


def check_log_is_clean_prefix(log: PartitionLog, max_epoch: int) -> list[tuple[int, int]]:
    """Read the whole log in order: offsets 0..LEO-1, each record the writer's, no gaps.

    Also checks that leader epochs never go down. Returns the (epoch, start offset) of each
    epoch found in the log, as the leader-epoch cache should hold them.
    """
    assert log.log_start_offset == 0
    end = log.log_end_offset
    expected = 0
    epochs: list[tuple[int, int]] = []
    previous_segment_end = 0
    for segment in log.segments:
        assert segment.base_offset == previous_segment_end, (
            f"segment {segment.log_path.name} does not continue the previous one at "
            f"{previous_segment_end}"
        )
        previous_segment_end = segment.next_offset
    assert previous_segment_end == end
    while expected < end:
        fetch = log.read(expected, 1 << 20)
        assert fetch.records, f"read at {expected} (log end {end}) returned nothing"
        assert fetch.first_offset == expected
        for batch in iter_batches(fetch.records):
            assert batch.base_offset == expected, f"gap or overlap at offset {expected}"
            epoch = batch.partition_leader_epoch
            if not epochs or epochs[-1][0] != epoch:
                assert not epochs or epoch > epochs[-1][0], f"leader epoch went down at {expected}"
                epochs.append((epoch, expected))
            assert 0 <= epoch <= max_epoch
            assert batch.producer_id == PRODUCER_ID
            assert batch.base_sequence == expected
            count = 0
            for record in batch.records():
                assert_record_matches(record, expected)
                expected += 1
                count += 1
            assert count == batch.records_count
            assert batch.next_offset == expected
        assert fetch.next_offset == expected
    assert expected == end
    return epochs


def check_indexes_agree_with_log(log: PartitionLog, rng: random.Random) -> None:
    """Every index entry points where it should, and lookups by offset and time land right."""
    for segment in log.segments:
        index = segment.offset_index
        for n in range(index.entries):
            offset, position = index.entry(n)
            header = read_header(segment.read_bytes(position, BATCH_HEADER_SIZE))
            assert header.last_offset == offset, (
                f"{index.path.name} entry {n}: ({offset}, {position}) but the batch there ends "
                f"at {header.last_offset}"
            )
        time_index = segment.time_index
        for n in range(time_index.entries):
            timestamp, offset = time_index.entry(n)
            assert segment.base_offset <= offset < segment.next_offset
            # The writer's timestamps grow with the offset, so every entry is exact.
            assert timestamp == TIMESTAMP_BASE + offset, f"{time_index.path.name} entry {n}"
        if segment.size:
            assert segment.max_timestamp == TIMESTAMP_BASE + segment.next_offset - 1
    end = log.log_end_offset
    for offset in sorted(rng.sample(range(end), min(end, 40))):
        fetch = log.read(offset, 1)
        batch = RecordBatch(fetch.records)
        assert batch.base_offset <= offset <= batch.last_offset, (
            f"read({offset}) returned the batch {batch.base_offset}..{batch.last_offset}"
        )
        assert fetch.first_offset == batch.base_offset
        found = log.offset_for_timestamp(TIMESTAMP_BASE + offset)
        assert found == (TIMESTAMP_BASE + offset, offset)
    assert log.offset_for_timestamp(TIMESTAMP_BASE + end) is None


def check_recovered_state(log: PartitionLog, epochs: list[tuple[int, int]]) -> None:
    """Producer state and leader epochs rebuilt from the log agree with it."""
    assert [(e.epoch, e.start_offset) for e in log.leader_epoch_cache.entries] == epochs
    end = log.log_end_offset
    entry = log.producer_state.last_entry(PRODUCER_ID)
    if end == 0:
        assert entry is None
    else:
        assert entry is not None
        assert entry.last_seq == end - 1
    assert log.recovery_point <= end
    leftovers = [p.name for p in log.directory.iterdir() if p.name.endswith((".tmp", ".deleted"))]
    assert leftovers == []


def recovery_point_on_disk(data_dir: Path) -> int:
    return OffsetCheckpointFile(data_dir / RECOVERY_POINT_CHECKPOINT).read().get(TOPIC_PARTITION, 0)


def lose_unflushed_tail(partition_dir: Path, recovery_point: int, rng: random.Random) -> str:
    """Do what a power cut may do to unflushed data: cut the last segment file at a random
    byte above the recovery point, sometimes leaving zeros (allocated, never written) after.
    """
    segment_path = max(partition_dir.glob("*.log"))
    data = segment_path.read_bytes()
    protected = 0
    position = 0
    while position < len(data):
        try:
            header = check_batch(data, position)
        except Exception:
            break
        position += header.size
        if header.next_offset <= recovery_point:
            protected = position
    cut = rng.randint(protected, len(data))
    zeros = rng.choice([0, 0, 1, 61, 4096])
    with open(segment_path, "r+b") as f:
        f.truncate(cut)
        f.seek(cut)
        f.write(bytes(zeros))
    return (
        f"{segment_path.name}: cut at {cut} of {len(data)} (protected {protected}), +{zeros} zeros"
    )


def describe_directory(partition_dir: Path) -> str:
    return ", ".join(f"{p.name}:{p.stat().st_size}" for p in sorted(partition_dir.iterdir()))


# -- tests ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Round:
    """What one round of the kill loop does, decided up front from the test's seed."""

    writer_seed: int
    kill_after_s: float  # after the writer is ready; unused when roll_kill is set
    roll_kill: str | None  # kill inside the first segment roll instead (ROLL_KILL_MODES)
    lose_tail: bool  # cut the unflushed tail before reopening, as a power cut may


def plan_rounds(seed: int, count: int = 25) -> list[Round]:
    """``count`` rounds killed at random moments, except every 6th, killed inside a roll."""
    rng = random.Random(seed)
    roll_modes = iter(ROLL_KILL_MODES)
    rounds = []
    for n in range(count):
        roll_kill = next(roll_modes, None) if n % 6 == 5 else None
        rounds.append(
            Round(
                writer_seed=rng.randrange(1 << 32),
                kill_after_s=rng.uniform(0.0, 0.3),
                roll_kill=roll_kill,
                lose_tail=roll_kill is None and rng.random() < 0.35,
            )
        )
    return rounds


@pytest.mark.slow
def test_sigkill_loop_always_recovers_a_clean_prefix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rounds = plan_rounds(seed=0x5EED_C0DE)
    assert {r.roll_kill for r in rounds} >= set(ROLL_KILL_MODES)
    assert sum(r.lose_tail for r in rounds) >= 3
    rng = random.Random(0xC0FFEE)  # for cut positions and sampled reads
    data_dir = tmp_path / "data"
    partition_dir = data_dir / PARTITION_DIR
    durable_end = 0  # below this everything was flushed (reported, or a clean shutdown)
    for round_number, plan in enumerate(rounds):
        writer = start_writer(
            data_dir,
            tmp_path,
            f"round-{round_number}",
            start_offset=durable_end,
            seed=plan.writer_seed,
            epoch=round_number,
            kill_during_roll=plan.roll_kill,
        )
        try:
            writer.wait_ready()
            if plan.roll_kill is None:
                time.sleep(plan.kill_after_s)
                writer.process.send_signal(signal.SIGKILL)
            writer.wait_killed()
        finally:
            writer.reap()
        required_end = max(durable_end, writer.last_flushed())
        context = f"round {round_number} {plan}: {describe_directory(partition_dir)}"
        if plan.roll_kill == "new-segment-created":
            newest = max(partition_dir.glob("*.log"))
            assert newest.stat().st_size == 0, f"the kill did not land inside the roll: {context}"
        if plan.lose_tail:
            context += "; " + lose_unflushed_tail(
                partition_dir, recovery_point_on_disk(data_dir), rng
            )

        manager = LogManager(data_dir, default_config=log_config())
        manager.startup()
        try:
            assert not manager.had_clean_shutdown
            log = manager.get_log(TOPIC_PARTITION)
            assert log is not None, context
            assert log.log_end_offset >= required_end, (
                f"flushed records lost: log ends at {log.log_end_offset}, "
                f"{required_end} were durable; {context}"
            )
            epochs = check_log_is_clean_prefix(log, max_epoch=round_number)
            check_indexes_agree_with_log(log, rng)
            check_recovered_state(log, epochs)
            durable_end = log.log_end_offset
        finally:
            manager.shutdown()
    assert len(list(partition_dir.glob("*.log"))) >= 5, "segments should have accumulated"

    # The last shutdown was clean: the next start trusts every segment.
    def no_recovery(self: LogSegment, **kwargs: object) -> int:
        raise AssertionError(f"{self.log_path.name} re-validated after a clean shutdown")

    monkeypatch.setattr(LogSegment, "recover", no_recovery)
    manager = LogManager(data_dir, default_config=log_config())
    manager.startup()
    try:
        assert manager.had_clean_shutdown
        log = manager.get_log(TOPIC_PARTITION)
        assert log is not None
        assert log.log_end_offset == durable_end
        check_log_is_clean_prefix(log, max_epoch=len(rounds))
    finally:
        manager.shutdown()


def _append_until_segments(log: PartitionLog, segments: int, rng: random.Random) -> None:
    codecs = list(Compression)
    while len(log.segments) < segments:
        offset = log.log_end_offset
        count = rng.choice([1, 3, 10, 40])
        log.append_as_leader(batch_for(offset, count, rng.choice(codecs)), 0)


def _every_batch(log: PartitionLog) -> list[tuple[int, int, bytes]]:
    """(requested offset, first offset, bytes) of a one-batch read at every offset."""
    reads = []
    for offset in range(log.log_end_offset):
        fetch = log.read(offset, 1)
        reads.append((offset, fetch.first_offset, fetch.records))
    return reads


def _log_files(partition_dir: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(partition_dir.glob("*.log"))}


def test_clean_restart_trusts_segments_and_serves_the_same_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = random.Random(7)
    data_dir = tmp_path / "data"
    manager = LogManager(data_dir, default_config=log_config())
    manager.startup()
    log = manager.get_or_create_log(TOPIC_PARTITION)
    _append_until_segments(log, 4, rng)
    end = log.log_end_offset
    reads = _every_batch(log)
    manager.shutdown()
    assert (data_dir / CLEAN_SHUTDOWN_FILE).exists()
    files = _log_files(data_dir / PARTITION_DIR)

    calls: list[str] = []

    def no_recovery(self: LogSegment, **kwargs: object) -> int:
        calls.append(self.log_path.name)
        raise AssertionError(f"{self.log_path.name} re-validated after a clean shutdown")

    monkeypatch.setattr(LogSegment, "recover", no_recovery)
    manager = LogManager(data_dir, default_config=log_config())
    manager.startup()
    try:
        assert manager.had_clean_shutdown
        assert not (data_dir / CLEAN_SHUTDOWN_FILE).exists(), "a crash now must not look clean"
        reopened = manager.get_log(TOPIC_PARTITION)
        assert reopened is not None
        log = reopened
        assert log.log_end_offset == end
        assert log.recovery_point == end
        assert _every_batch(log) == reads
        check_log_is_clean_prefix(log, max_epoch=0)
        check_indexes_agree_with_log(log, rng)
        # The producer state came back too: the producer's next batch is in sequence, and a
        # retry of its last batch is recognised as a duplicate.
        last_batch = RecordBatch(reads[-1][2])
        retry = batch_for(last_batch.base_offset, last_batch.records_count, Compression.NONE)
        assert log.append_as_leader(retry, 0).duplicate
        info = log.append_as_leader(batch_for(end, 2, Compression.ZSTD), 0)
        assert (info.first_offset, info.last_offset) == (end, end + 1)
    finally:
        manager.shutdown()
    assert calls == []
    for name, data in files.items():  # the trusted segments were only read, never rewritten
        assert (data_dir / PARTITION_DIR / name).read_bytes()[: len(data)] == data


def test_unclean_restart_revalidates_from_the_recovery_point(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The counterpart of the clean restart: without the marker, the segments from the one
    holding the recovery point on are re-validated, and only those."""
    rng = random.Random(8)
    data_dir = tmp_path / "data"
    manager = LogManager(data_dir, default_config=log_config())
    manager.startup()
    log = manager.get_or_create_log(TOPIC_PARTITION)
    _append_until_segments(log, 5, rng)
    bases = [s.base_offset for s in log.segments]
    recovery_point = bases[2] + 1
    reads = _every_batch(log)
    manager.shutdown()
    (data_dir / CLEAN_SHUTDOWN_FILE).unlink()
    OffsetCheckpointFile(data_dir / RECOVERY_POINT_CHECKPOINT).write(
        {TOPIC_PARTITION: recovery_point}
    )

    recovered: list[int] = []
    original = LogSegment.recover

    def counting_recover(self: LogSegment, **kwargs: object) -> int:
        recovered.append(self.base_offset)
        return original(self, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(LogSegment, "recover", counting_recover)
    manager = LogManager(data_dir, default_config=log_config())
    manager.startup()
    try:
        assert not manager.had_clean_shutdown
        reopened = manager.get_log(TOPIC_PARTITION)
        assert reopened is not None
        assert recovered == bases[2:]
        assert _every_batch(reopened) == reads
    finally:
        manager.shutdown()


@pytest.mark.parametrize(
    ("marker", "expected"),
    [
        (None, -1),  # no marker: an unclean shutdown
        (b"", -1),  # an empty marker
        (b'{"version": 0, "brokerEpoch": 42}', 42),
        (b"not json", -1),  # unreadable: no epoch, not an error
        (b'{"brokerEpoch": "x"}', -1),
    ],
)
def test_the_clean_shutdown_marker_keeps_the_broker_epoch(
    tmp_path: Path, marker: bytes | None, expected: int
) -> None:
    manager = LogManager(tmp_path)
    manager.startup()
    manager.shutdown(broker_epoch=7)
    path = tmp_path / CLEAN_SHUTDOWN_FILE
    if marker is None:
        path.unlink()
    else:
        path.write_bytes(marker)
    manager = LogManager(tmp_path)
    manager.startup()
    assert manager.previous_broker_epoch == expected
    manager.shutdown()


def test_a_clean_shutdown_round_trips_the_broker_epoch(tmp_path: Path) -> None:
    manager = LogManager(tmp_path)
    manager.startup()
    manager.shutdown(broker_epoch=1234)
    reopened = LogManager(tmp_path)
    reopened.startup()
    assert reopened.previous_broker_epoch == 1234
    reopened.shutdown()
