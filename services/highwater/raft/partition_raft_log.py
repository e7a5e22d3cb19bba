"""``PartitionRaftLog``: the Raft core's ``RaftLog`` on the segmented ``__cluster_metadata-0`` log.

The metadata log is an ordinary :class:`~highwater.storage.log.PartitionLog` (segments,
indexes, leader-epoch checkpoint, crash recovery) in ``<data-dir>/__cluster_metadata-0/``,
as Kafka's ``KafkaMetadataLog`` wraps a ``UnifiedLog``:

* each Raft entry batch is a RecordBatch v2 whose ``partition_leader_epoch`` is the Raft
  epoch; the leader builds it and appends it with ``append_as_leader``, followers copy the
  leader's bytes with ``append_as_follower``;
* ``end_offset_for_epoch`` answers from the log's leader-epoch cache;
* after a snapshot the log start moves to the snapshot's end offset
  (``maybe_increment_log_start_offset``, then whole segments below it are deleted);
  a follower that loads the leader's snapshot starts afresh
  (``truncate_fully_and_start_at``);
* :meth:`flush` (run by the driver in a worker thread) fsyncs every append made since the
  last flush in one go: group commit.

The epoch of the entry just before the log start (the snapshot's epoch) is not in the
segments: on open it is taken from the snapshot the log starts at, and the start is moved
up to the earliest snapshot at or past the first segment when there is one (whole
segments are deleted, so the first segment may begin before the snapshot that allowed
the deletion). Like Kafka's metadata log, the whole log is re-validated on every open
(recovery point 0), then fsynced, so every entry that survived the restart counts as
flushed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Final

from highwater.config.topic import LogConfig
from highwater.errors import (
    InvalidRecordError,
    KafkaStorageError,
    OffsetOutOfRangeError,
    UnexpectedAppendOffsetError,
)
from highwater.raft.messages import OffsetAndEpoch
from highwater.records import SimpleRecord, build_batch
from highwater.records.batch import RecordBatchBuilder, append_fields
from highwater.records.header import iter_headers
from highwater.storage.checkpoint import fsync_dir
from highwater.storage.log import PartitionLog, wall_clock_ms
from highwater.storage.log_loader import load_partition_log
from highwater.storage.producer_state import AppendOrigin
from highwater.storage.topic_partition import TopicPartition

__all__ = [
    "METADATA_TOPIC_PARTITION",
    "PartitionRaftLog",
    "metadata_log_config",
    "metadata_log_dir",
]

log = logging.getLogger(__name__)

METADATA_TOPIC_PARTITION: Final = TopicPartition("__cluster_metadata", 0)
MAX_BATCH_SIZE_BYTES: Final = 8 * 1024 * 1024  # Kafka's KafkaRaftClient.MAX_BATCH_SIZE_BYTES


def metadata_log_dir(data_dir: Path) -> Path:
    """``<data-dir>/__cluster_metadata-0``: the metadata log, its snapshots, ``quorum-state``."""
    return data_dir / METADATA_TOPIC_PARTITION.dir_name


def metadata_log_config(**overrides: int) -> LogConfig:
    """The metadata log's settings: Kafka's ``metadata.log.*`` defaults.

    Nothing is deleted by time or size: only snapshots move the log start. Keyword
    arguments override fields by attribute name (``segment_bytes=...``) for tests.
    """
    settings: dict[str, int | str] = {
        "segment.bytes": 1024 * 1024 * 1024,  # metadata.log.segment.bytes
        "segment.ms": 7 * 24 * 3600 * 1000,  # metadata.log.segment.ms
        "retention.ms": -1,
        "retention.bytes": -1,
        "max.message.bytes": MAX_BATCH_SIZE_BYTES,
        "file.delete.delay.ms": 0,
        # An index entry per batch: a follower's fetch and the apply of what committed
        # read the batches just appended, at the log's tail; with Kafka's 4 KiB interval
        # each such read scanned up to ~40 batch headers from the last entry (a tenth of
        # the leader's Python time per write with one writer). A batch is ~150 bytes or
        # more, so the 10 MiB index holds an entry per batch of at least 190 MiB of log.
        "index.interval.bytes": 0,
    }
    for name, value in overrides.items():
        settings[name.replace("_", ".")] = value
    return LogConfig.from_properties(settings)


_UNBOUNDED_BATCH_BYTES: Final = (1 << 31) - 1
"""The builder's size limit for a leader's batch: none (a batch past what its length
field holds is refused when built)."""


class PartitionRaftLog:
    """A :class:`~highwater.raft.log.RaftLog` on a :class:`PartitionLog`. One owner thread,
    except :meth:`flush`, which a worker thread may run while the owner appends."""

    def __init__(self, partition_log: PartitionLog, *, start_epoch: int = 0) -> None:
        self._log = partition_log
        self._start_epoch = start_epoch
        self._generation = 0
        """Counts the changes to the entries (see :meth:`_changed`)."""
        self._last_read: tuple[tuple[int, int, int], bytes] | None = None
        """The last :meth:`read`: ((generation, start offset, max bytes), records)."""

    @classmethod
    def open(
        cls,
        directory: Path,
        *,
        snapshots: Sequence[OffsetAndEpoch] = (),
        config: LogConfig | None = None,
        clock: Callable[[], int] = wall_clock_ms,
    ) -> PartitionRaftLog:
        """Open (creating if needed) the log in ``directory`` and settle its start.

        ``snapshots`` are the ids of the valid snapshots beside it. Blocking: it recovers
        and fsyncs the whole log.
        """
        partition_log = load_partition_log(
            directory,
            config or metadata_log_config(),
            log_start_offset=0,
            recovery_point=0,
            had_clean_shutdown=False,
            clock=clock,
        )
        raft_log = cls(partition_log)
        try:
            raft_log._settle_start(sorted(snapshots, key=lambda s: (s.offset, s.epoch)))
            partition_log.flush()
        except BaseException:
            partition_log.close()
            raise
        return raft_log

    def _settle_start(self, snapshots: list[OffsetAndEpoch]) -> None:
        partition_log = self._log
        first = partition_log.log_start_offset
        end = partition_log.log_end_offset
        latest = snapshots[-1] if snapshots else None
        if latest is not None and (
            latest.offset > end or (end > first and latest.epoch > self.last_epoch)
        ):
            # A follower crashed after receiving the leader's snapshot but before its log
            # started afresh at it (Kafka's truncateToLatestSnapshot): the snapshot wins.
            log.info(
                "%s: the log [%d, %d) is behind snapshot %s; starting at the snapshot",
                partition_log.directory,
                first,
                end,
                latest,
            )
            self.truncate_to_snapshot(latest)
            return
        if first == 0:
            self._start_epoch = 0
            return
        covering = [s for s in snapshots if first <= s.offset <= end]
        if not covering:
            raise KafkaStorageError(
                f"{partition_log.directory}: the metadata log starts at offset {first} but no "
                f"snapshot covers the entries before it (snapshots: {snapshots}); restore the "
                "missing snapshot file or remove the directory so the node fetches everything "
                "from the leader"
            )
        start = covering[0]
        if start.offset > first:
            partition_log.update_high_watermark(start.offset)
            partition_log.maybe_increment_log_start_offset(start.offset)
        self._start_epoch = start.epoch

    # --- RaftLog ---------------------------------------------------------------------

    @property
    def partition_log(self) -> PartitionLog:
        return self._log

    @property
    def directory(self) -> Path:
        return self._log.directory

    @property
    def start_offset(self) -> int:
        return self._log.log_start_offset

    @property
    def end_offset(self) -> int:
        return self._log.log_end_offset

    @property
    def last_epoch(self) -> int:
        if self._log.log_end_offset > self._log.log_start_offset:
            latest = self._log.leader_epoch_cache.latest_epoch
            if latest is not None:
                return latest
        return self._start_epoch

    @property
    def flushed_offset(self) -> int:
        return min(self._log.recovery_point, self._log.log_end_offset)

    def end_offset_for_epoch(self, epoch: int) -> OffsetAndEpoch:
        last_epoch = self.last_epoch
        if epoch >= last_epoch:
            return OffsetAndEpoch(self.end_offset, last_epoch)
        entries = [
            e for e in self._log.leader_epoch_cache.entries if e.start_offset < self.end_offset
        ]
        above = 0
        while above < len(entries) and entries[above].epoch <= epoch:
            above += 1
        if above == 0:
            return OffsetAndEpoch(self.start_offset, self._start_epoch)
        if above == len(entries):
            return OffsetAndEpoch(self.end_offset, last_epoch)
        return OffsetAndEpoch(entries[above].start_offset, entries[above - 1].epoch)

    def append_as_leader(
        self, values: Sequence[bytes], epoch: int, *, control: bool = False
    ) -> OffsetAndEpoch:
        if not values:
            raise ValueError("nothing to append")
        if epoch < self.last_epoch:
            raise InvalidRecordError(
                f"epoch {epoch} is below the log's last epoch {self.last_epoch}"
            )
        base_offset = self._log.log_end_offset
        timestamp = self._log.clock()
        if control:
            batch = build_batch(
                [SimpleRecord(value=value, timestamp=timestamp) for value in values],
                base_offset=base_offset,
                partition_leader_epoch=epoch,
                is_control=True,
            )
        else:
            # The producer's builder (each record written by the compiled codec): the
            # same bytes as build_batch, several times cheaper per record.
            builder = RecordBatchBuilder(
                max_bytes=_UNBOUNDED_BATCH_BYTES,
                base_offset=base_offset,
                partition_leader_epoch=epoch,
            )
            for value in values:
                append_fields(builder, (None, value, (), timestamp))
            batch = builder.build()
        self._changed()
        info = self._log.append_as_leader(
            batch, leader_epoch=epoch, origin=AppendOrigin.COORDINATOR
        )
        return OffsetAndEpoch(info.last_offset, epoch)

    def append_as_follower(self, batches: bytes) -> None:
        if not batches:
            return
        next_offset = self.end_offset
        last_epoch = self.last_epoch
        for _, header in iter_headers(batches, verify_crc=False):  # the log checks CRCs
            if header.base_offset != next_offset:
                raise UnexpectedAppendOffsetError(
                    f"batch at offset {header.base_offset} does not continue the log at "
                    f"{next_offset}"
                )
            if header.partition_leader_epoch < last_epoch:
                raise InvalidRecordError(
                    f"batch at offset {header.base_offset} has epoch "
                    f"{header.partition_leader_epoch} below the log's last epoch {last_epoch}"
                )
            next_offset = header.next_offset
            last_epoch = header.partition_leader_epoch
        self._changed()
        self._log.append_as_follower(batches)

    def read(self, start_offset: int, max_bytes: int) -> bytes:
        """Whole batches from ``start_offset``, up to ``max_bytes`` (at least one).

        The last read is kept until the log changes: on the leader a batch just appended
        is read once per parked follower fetch it answers and once more to apply it, with
        the same offset and size, so one segment lookup and ``pread`` serve all three.
        """
        if not self.start_offset <= start_offset <= self.end_offset:
            raise OffsetOutOfRangeError(
                f"offset {start_offset} is outside the log [{self.start_offset}, {self.end_offset}]"
            )
        key = (self._generation, start_offset, max_bytes)
        last = self._last_read
        if last is not None and last[0] == key:
            return last[1]
        records = self._log.read(start_offset, max_bytes, min_one_batch=True).records
        self._last_read = (key, records)
        return records

    def truncate_to(self, offset: int) -> None:
        if offset >= self.end_offset:
            return
        if offset < self.start_offset:
            raise OffsetOutOfRangeError(
                f"cannot truncate to {offset}, below the log start {self.start_offset}"
            )
        self._check_boundary(offset)
        self._changed()
        self._log.truncate_to(offset)
        self._make_truncation_durable()

    def truncate_to_snapshot(self, snapshot_id: OffsetAndEpoch) -> None:
        self._changed()
        self._log.truncate_fully_and_start_at(snapshot_id.offset)
        self._start_epoch = snapshot_id.epoch
        self._log.delete_pending_files(force=True)
        self._make_truncation_durable()

    def delete_before(self, offset: int) -> None:
        if offset <= self.start_offset:
            return
        if offset > self.end_offset:
            raise OffsetOutOfRangeError(
                f"cannot start the log at {offset}, past its end {self.end_offset}"
            )
        self._check_boundary(offset)
        start_epoch = self._epoch_of_offset(offset - 1)
        self._changed()
        partition_log = self._log
        partition_log.update_high_watermark(max(partition_log.high_watermark, offset))
        partition_log.maybe_increment_log_start_offset(offset)
        self._start_epoch = self._start_epoch if start_epoch is None else start_epoch
        if partition_log.delete_old_segments():
            partition_log.delete_pending_files(force=True)
            fsync_dir(partition_log.directory)

    # --- driver ----------------------------------------------------------------------

    def flush(self) -> int:
        """fsync every entry appended since the last flush; the new flushed offset.

        Runs in a worker thread while the owner keeps appending: appends made during it
        are covered by the next flush.

        The segments' indexes are not synced: :meth:`open` loads the log as after a crash
        from offset 0, re-validating every segment and rebuilding its indexes from the
        log, so they are never read from the disk. Syncing them made every flush three
        fsyncs (the log, ``.index``, ``.timeindex``, each a journal commit, since the
        metadata log indexes every batch), and a voter flushes each batch before it
        acknowledges it: they were on the commit path of every write (docs/raft.md).
        """
        return self._log.flush(indexes=False)

    def close(self) -> None:
        self._log.close()

    def __repr__(self) -> str:
        return (
            f"PartitionRaftLog({self.directory}, start={self.start_offset}, "
            f"end={self.end_offset}, last_epoch={self.last_epoch}, "
            f"flushed={self.flushed_offset})"
        )

    # --- internals -------------------------------------------------------------------

    def _changed(self) -> None:
        """The entries change (an append, a truncation, a new log start): the kept read
        may no longer be what the log holds."""
        self._generation += 1
        self._last_read = None

    def _epoch_of_offset(self, offset: int) -> int | None:
        if not self._log.log_start_offset <= offset < self._log.log_end_offset:
            return None
        return self._log.leader_epoch_cache.epoch_for_offset(offset)

    def _check_boundary(self, offset: int) -> None:
        if offset == self.end_offset:
            return
        fetched = self._log.read(offset, 1, min_one_batch=True)
        if fetched.first_offset != offset:
            raise ValueError(f"offset {offset} is not a batch boundary")

    def _make_truncation_durable(self) -> None:
        """fsync what a truncation changed: the active segment, the epoch cache, the renames."""
        partition_log = self._log
        partition_log.active_segment.flush()
        partition_log.leader_epoch_cache.flush()
        fsync_dir(partition_log.directory)
