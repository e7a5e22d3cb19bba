"""Shared helpers for the storage tests: batch factories, a fake clock, log reading."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from highwater.config.topic import LogConfig
from highwater.records import Compression, Record, RecordBatch, SimpleRecord, build_batch
from highwater.records.batch import iter_batches
from highwater.storage.log import PartitionLog
from highwater.storage.log_loader import load_partition_log

BASE_TS = 1_700_000_000_000


class FakeClock:
    """A settable millisecond clock."""

    def __init__(self, now: int = BASE_TS) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now

    def advance(self, ms: int) -> None:
        self.now += ms


def make_batch(
    values: Iterable[bytes | None],
    *,
    keys: Iterable[bytes | None] | None = None,
    timestamp: int = BASE_TS,
    compression: Compression = Compression.NONE,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
) -> bytes:
    values = list(values)
    key_list = list(keys) if keys is not None else [None] * len(values)
    records = [
        SimpleRecord(key=k, value=v, timestamp=timestamp + i)
        for i, (k, v) in enumerate(zip(key_list, values, strict=True))
    ]
    return build_batch(
        records,
        compression=compression,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
    )


def open_log(directory: Path, clock: FakeClock | None = None, **config: object) -> PartitionLog:
    return load_partition_log(
        directory,
        LogConfig.from_properties(config),  # type: ignore[arg-type]
        clock=clock or FakeClock(),
        had_clean_shutdown=True,
    )


def read_all(
    log: PartitionLog, start: int | None = None, max_offset: int | None = None
) -> list[Record]:
    """Every record from ``start`` (default: the log start offset) to the end, in order."""
    offset = log.log_start_offset if start is None else start
    result: list[Record] = []
    while offset < log.log_end_offset:
        data = log.read(offset, 64 * 1024, max_offset=max_offset)
        if not data.records:
            break
        for batch in iter_batches(data.records):
            result.extend(r for r in batch.records() if r.offset >= offset)
        offset = data.next_offset
    return result


def batches_of(data: bytes) -> list[RecordBatch]:
    return list(iter_batches(data))
