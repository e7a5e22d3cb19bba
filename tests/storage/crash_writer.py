"""A writer process for the crash-recovery tests: appends a deterministic record sequence forever.

Run as ``python crash_writer.py DATA_DIR FLUSHED_FILE --start-offset N --seed S --epoch E``.
It opens a :class:`LogManager` on ``DATA_DIR``, checks that the log ends at ``N`` and prints
``ready``, then appends batches (of varying sizes and compression codecs, as one idempotent
producer) whose records are :func:`record_for` their offset, so that any record read back
can be checked. Every few batches it flushes the log, checkpoints the recovery points and
then appends the flushed offset to ``FLUSHED_FILE`` and fsyncs it: every offset below the
last line of that file is durable. It never stops by itself; the test kills it with
SIGKILL. With ``--kill-during-roll MODE`` it instead kills itself at a chosen point of its
first segment roll (see :data:`ROLL_KILL_MODES`).

The test imports this module for :func:`record_for` and the constants, so importing it has
no side effects.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from highwater.config.topic import LogConfig
from highwater.records import Compression, SimpleRecord, build_batch
from highwater.storage.log import PartitionLog
from highwater.storage.log_manager import LogManager
from highwater.storage.producer_state import ProducerStateManager, snapshot_file_name
from highwater.storage.segment import LogSegment
from highwater.storage.topic_partition import TopicPartition

TOPIC_PARTITION = TopicPartition("crash", 0)
SEGMENT_BYTES = 256 * 1024
INDEX_INTERVAL_BYTES = 1024
TIMESTAMP_BASE = 1_600_000_000_000
PRODUCER_ID = 4242
PRODUCER_EPOCH = 0

# Where a kill lands inside PartitionLog.roll():
ROLL_KILL_MODES = (
    "old-segment-closed",  # the full segment is closed to appends, no new segment yet
    "new-segment-created",  # the new, empty segment exists; no producer snapshot yet
    "snapshot-half-written",  # the roll's producer snapshot half written by the next flush
    "roll-finished",  # roll done, nothing appended to the new segment yet
)

_RECORDS_PER_BATCH = (1, 1, 2, 5, 10, 25, 60)


def log_config() -> LogConfig:
    return LogConfig.from_properties(
        {"segment.bytes": SEGMENT_BYTES, "index.interval.bytes": INDEX_INTERVAL_BYTES}
    )


def record_for(offset: int) -> SimpleRecord:
    """The record every test expects at ``offset``: key, value, headers and timestamp.

    Values vary from empty to ~20 KiB (a few percent are large) and repeat a short pattern,
    so the compression codecs have something to do; some keys and values are null.
    """
    digest = hashlib.blake2b(offset.to_bytes(8, "big"), digest_size=16).digest()
    key = None if offset % 11 == 3 else b"key-%d" % offset
    value: bytes | None
    if offset % 97 == 5:
        value = None
    else:
        length = int.from_bytes(digest[:2], "big") % 700
        if digest[2] < 5:
            length += 20_000
        pattern = b"%d:" % offset + digest
        value = (pattern * (length // len(pattern) + 1))[:length]
    headers = (("offset", offset.to_bytes(8, "big")),) if offset % 5 == 0 else ()
    return SimpleRecord(key=key, value=value, headers=headers, timestamp=TIMESTAMP_BASE + offset)


def batch_for(base_offset: int, count: int, compression: Compression) -> bytes:
    """The producer batch holding the records at ``base_offset .. base_offset + count - 1``."""
    return build_batch(
        [record_for(base_offset + i) for i in range(count)],
        compression=compression,
        producer_id=PRODUCER_ID,
        producer_epoch=PRODUCER_EPOCH,
        base_sequence=base_offset % (1 << 31),
    )


def _kill_self() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _install_roll_kill(mode: str) -> None:
    """Patch the storage classes so that the first roll kills this process at ``mode``."""
    if mode == "old-segment-closed":
        become_inactive = LogSegment.on_become_inactive

        def on_become_inactive(self: LogSegment) -> None:
            become_inactive(self)
            _kill_self()

        LogSegment.on_become_inactive = on_become_inactive  # type: ignore[method-assign]
        return
    if mode == "new-segment-created":
        prepare_snapshot = ProducerStateManager.prepare_snapshot

        def prepare_then_die(self: ProducerStateManager) -> tuple[int, bytes]:
            _kill_self()
            return prepare_snapshot(self)

        ProducerStateManager.prepare_snapshot = prepare_then_die  # type: ignore[method-assign]
        return
    if mode == "snapshot-half-written":
        # The roll's producer snapshot is written by the next flush, in a worker thread.
        def write_half(self: ProducerStateManager, offset: int, data: bytes) -> Any:
            assert self.directory is not None
            tmp = self.directory / (snapshot_file_name(offset) + ".tmp")
            with open(tmp, "wb") as f:
                f.write(data[: len(data) // 2])
            _kill_self()

        ProducerStateManager.write_snapshot = write_half  # type: ignore[method-assign]
        return
    roll = PartitionLog.roll

    def roll_then_die(self: PartitionLog, expected_next_offset: int | None = None) -> Any:
        roll(self, expected_next_offset)
        _kill_self()

    PartitionLog.roll = roll_then_die  # type: ignore[method-assign]


def _flushed_file_writer(path: Path) -> Callable[[int], None]:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def report(offset: int) -> None:
        os.write(fd, b"%d\n" % offset)
        os.fsync(fd)

    return report


def run(
    data_dir: Path,
    flushed_file: Path,
    *,
    start_offset: int,
    seed: int,
    epoch: int,
    kill_during_roll: str | None,
) -> None:
    if kill_during_roll is not None:
        _install_roll_kill(kill_during_roll)
    manager = LogManager(data_dir, default_config=log_config())
    manager.startup()
    log = manager.get_or_create_log(TOPIC_PARTITION)
    if log.log_end_offset != start_offset:
        sys.exit(f"the log ends at {log.log_end_offset}, expected {start_offset}")
    report_flushed = _flushed_file_writer(flushed_file)
    rng = random.Random(seed)
    codecs = list(Compression)
    print("ready", flush=True)
    until_flush = rng.randint(1, 10)
    while True:
        offset = log.log_end_offset
        count = rng.choice(_RECORDS_PER_BATCH)
        info = log.append_as_leader(batch_for(offset, count, rng.choice(codecs)), epoch)
        if info.first_offset != offset or info.last_offset != offset + count - 1:
            sys.exit(f"append at {offset} got offsets {info.first_offset}..{info.last_offset}")
        until_flush -= 1
        if until_flush == 0:
            flushed = log.flush()
            manager.checkpoint_recovery_points()
            report_flushed(flushed)
            until_flush = rng.randint(1, 10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data_dir", type=Path)
    parser.add_argument("flushed_file", type=Path)
    parser.add_argument("--start-offset", type=int, required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--epoch", type=int, required=True)
    parser.add_argument("--kill-during-roll", choices=ROLL_KILL_MODES)
    args = parser.parse_args()
    run(
        args.data_dir,
        args.flushed_file,
        start_offset=args.start_offset,
        seed=args.seed,
        epoch=args.epoch,
        kill_during_roll=args.kill_during_roll,
    )


if __name__ == "__main__":
    main()
