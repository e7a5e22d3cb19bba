"""Child process of the crash-recovery benchmark: appends to a partition log until killed.

``python -m bench._writer DIR BATCH_BYTES REPORT_EVERY_BYTES MAX_BYTES`` opens (creating)
the partition log in ``DIR`` with the default topic configuration, appends pre-built
batches of ``BATCH_BYTES`` with no flush beyond the default policy (``flush.messages`` and
``flush.ms`` are unlimited, so nothing is fsynced), and prints ``bytes N`` to stdout every
``REPORT_EVERY_BYTES``. The parent SIGKILLs it once enough is written; if it reaches
``MAX_BYTES`` first it prints ``done`` and waits to be killed.
"""

from __future__ import annotations

import random
import signal
import sys
from pathlib import Path

from highwater.config.topic import LogConfig
from highwater.records import build_batch
from highwater.records.header import BATCH_HEADER_SIZE
from highwater.records.record import SimpleRecord
from highwater.storage.log_loader import load_partition_log

POOL_SIZE = 64
RECORD_VALUE_BYTES = 100


def sized_batch(target: int, rng: random.Random, *, value_bytes: int = RECORD_VALUE_BYTES) -> bytes:
    """One ``build_batch`` batch of exactly ``target`` bytes where it can be made so (at most
    ``target`` otherwise): keyless records of ``value_bytes`` random bytes, the last record's
    value grown to fill the rest.

    Exact sizes keep a log of such batches aligned as dd's blocks are: each append of a 16 KiB
    batch then covers whole pages, where a batch a hundred bytes short of it makes the kernel
    zero and fill a partly written page on every write (1.4-1.7x the CPU of dd's writes).
    """

    def record(size: int = value_bytes) -> SimpleRecord:
        return SimpleRecord(value=rng.randbytes(size))

    per_record = len(build_batch([record()])) - BATCH_HEADER_SIZE
    records = [record() for _ in range(max(1, (target - BATCH_HEADER_SIZE) // per_record))]
    batch = build_batch(records)
    while len(batch) > target and len(records) > 1:
        excess = len(batch) - target
        del records[-max(1, -(-excess // per_record)) :]
        batch = build_batch(records)
    # Grow the last value by what is missing; its varint lengths may grow a byte or two with
    # it, so the size is corrected until the batch is exact (or the closest one under it).
    size = len(records[-1].value or b"") + target - len(batch)
    for _ in range(4):
        if len(batch) == target or size < 0:
            break
        grown = build_batch([*records[:-1], record(size)])
        if len(grown) <= target:
            batch = grown
        size -= len(grown) - target
    return batch


def main(argv: list[str]) -> int:
    directory, batch_bytes, report_every, max_bytes = (
        Path(argv[0]),
        int(argv[1]),
        int(argv[2]),
        int(argv[3]),
    )
    rng = random.Random(7)
    pool = [sized_batch(batch_bytes, rng) for _ in range(POOL_SIZE)]
    log = load_partition_log(directory, LogConfig(), had_clean_shutdown=True)
    append = log.append_as_leader
    written, next_report, i = 0, report_every, 0
    print("ready", flush=True)
    while written < max_bytes:
        batch = pool[i % POOL_SIZE]
        append(batch, leader_epoch=0)
        written += len(batch)
        i += 1
        if written >= next_report:
            print(f"bytes {written}", flush=True)
            next_report += report_every
    print("done", flush=True)
    while True:  # wait for SIGKILL, never close the log
        signal.pause()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
