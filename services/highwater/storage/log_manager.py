"""A data directory and the partition logs in it: loading, checkpoints and background upkeep.

Layout of a data directory::

    meta.properties                      version, cluster.id, node.id
    .lock                                held (flock) while a process owns the directory
    .highwater-clean-shutdown            present only between a clean shutdown and the next start
    recovery-point-offset-checkpoint     replication-offset-checkpoint (high watermarks)
    log-start-offset-checkpoint          cleaner-offset-checkpoint
    <topic>-<partition>/                 one PartitionLog each

``LogManager`` is synchronous and single-threaded for appends and reads; the periodic work
(flushing by ``flush.ms`` / ``flush.messages`` / roll, retention, removal of ``.deleted``
files, checkpoints, compaction) runs in :meth:`run_background`, an asyncio task that sends
every fsync and every compaction pass to a worker thread so the event loop never waits on
the disk.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from highwater.config.topic import LogConfig
from highwater.errors import KafkaStorageError, StrayFileError
from highwater.storage.checkpoint import (
    CLEANER_OFFSET_CHECKPOINT,
    LOG_START_OFFSET_CHECKPOINT,
    RECOVERY_POINT_CHECKPOINT,
    REPLICATION_OFFSET_CHECKPOINT,
    TMP_SUFFIX,
    OffsetCheckpointFile,
    write_atomically,
)
from highwater.storage.data_dir_lock import LOCK_FILE, DataDirLock
from highwater.storage.log import PartitionLog, wall_clock_ms
from highwater.storage.log_loader import load_partition_log
from highwater.storage.topic_partition import TopicPartition

if TYPE_CHECKING:
    from highwater.storage.cleaner import LogCleaner

log = logging.getLogger(__name__)

META_PROPERTIES = "meta.properties"
CLEAN_SHUTDOWN_FILE = ".highwater-clean-shutdown"
_ROOT_FILES = {
    META_PROPERTIES,
    LOCK_FILE,
    CLEAN_SHUTDOWN_FILE,
    RECOVERY_POINT_CHECKPOINT,
    REPLICATION_OFFSET_CHECKPOINT,
    LOG_START_OFFSET_CHECKPOINT,
    CLEANER_OFFSET_CHECKPOINT,
}
_IGNORED_DIRECTORIES = {"lost+found"}


@dataclass(frozen=True, slots=True)
class LogManagerSettings:
    """Broker-level storage intervals, with Kafka's names and defaults."""

    log_retention_check_interval_ms: int = 300_000  # log.retention.check.interval.ms
    log_flush_scheduler_interval_ms: int = 1_000  # how often flush.ms/flush.messages are checked
    log_flush_offset_checkpoint_interval_ms: int = 60_000  # log.flush.offset.checkpoint.interval.ms
    replica_high_watermark_checkpoint_interval_ms: int = 5_000
    log_cleaner_backoff_ms: int = 15_000  # log.cleaner.backoff.ms
    log_cleaner_enable: bool = True  # log.cleaner.enable
    producer_id_expiration_ms: int = 86_400_000  # producer.id.expiration.ms


def read_meta_properties(data_dir: Path) -> dict[str, str]:
    path = data_dir / META_PROPERTIES
    if not path.exists():
        return {}
    result = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise KafkaStorageError(f"{path}: line {number} is not key=value: {line!r}")
        result[key.strip()] = value.strip()
    return result


class LogManager:
    """Owns one data directory and every partition log in it."""

    def __init__(
        self,
        data_dir: Path,
        *,
        default_config: LogConfig | None = None,
        settings: LogManagerSettings | None = None,
        clock: Callable[[], int] = wall_clock_ms,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.default_config = default_config or LogConfig()
        self.settings = settings or LogManagerSettings()
        self.clock = clock
        self._logs: dict[TopicPartition, PartitionLog] = {}
        self._lock = DataDirLock(self.data_dir)
        self._checkpoints = {
            name: OffsetCheckpointFile(self.data_dir / name)
            for name in (
                RECOVERY_POINT_CHECKPOINT,
                REPLICATION_OFFSET_CHECKPOINT,
                LOG_START_OFFSET_CHECKPOINT,
            )
        }
        self.cleaner_checkpoint = OffsetCheckpointFile(self.data_dir / CLEANER_OFFSET_CHECKPOINT)
        self.had_clean_shutdown = False
        self.previous_broker_epoch = -1
        """The broker epoch the clean-shutdown marker kept (-1: none, or not clean)."""
        self._cleaner: LogCleaner | None = None

    # -- start and stop -----------------------------------------------------------------

    def startup(self, *, cluster_id: str | None = None, node_id: int | None = None) -> None:
        """Lock the directory, check its identity and load every partition log in it."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._lock.acquire()
        try:
            self._check_meta_properties(cluster_id, node_id)
            marker = self.data_dir / CLEAN_SHUTDOWN_FILE
            self.had_clean_shutdown = marker.exists()
            self.previous_broker_epoch = (
                _read_broker_epoch(marker) if self.had_clean_shutdown else -1
            )
            offsets = {name: cp.read() for name, cp in self._checkpoints.items()}
            partition_dirs = self._partition_directories()
            for tp, directory in sorted(partition_dirs.items()):
                self._logs[tp] = load_partition_log(
                    directory,
                    self.default_config,
                    log_start_offset=offsets[LOG_START_OFFSET_CHECKPOINT].get(tp, 0),
                    recovery_point=offsets[RECOVERY_POINT_CHECKPOINT].get(tp, 0),
                    high_watermark=offsets[REPLICATION_OFFSET_CHECKPOINT].get(tp, 0),
                    had_clean_shutdown=self.had_clean_shutdown,
                    clock=self.clock,
                    producer_id_expiration_ms=self.settings.producer_id_expiration_ms,
                )
            # From here on a crash is not a clean shutdown any more.
            marker.unlink(missing_ok=True)
            log.info(
                "loaded %d partition log(s) from %s (%s shutdown)",
                len(self._logs),
                self.data_dir,
                "clean" if self.had_clean_shutdown else "unclean",
            )
        except BaseException:
            for partition_log in self._logs.values():
                with contextlib.suppress(Exception):
                    partition_log.close()
            self._logs.clear()
            self._lock.release()
            raise

    def shutdown(self, *, broker_epoch: int = -1) -> None:
        """Flush and close every log, write the checkpoints and the clean-shutdown marker,
        which keeps the broker's epoch (Kafka's ``.kafka_cleanshutdown``, KIP-966): the
        restarted broker's registration names it, and the controller lets the new
        incarnation in without waiting for the old session to expire."""
        for partition_log in self._logs.values():
            partition_log.close()
        self.checkpoint_all()
        marker = json.dumps({"version": 0, "brokerEpoch": broker_epoch}).encode()
        write_atomically(self.data_dir / CLEAN_SHUTDOWN_FILE, marker)
        self._logs.clear()
        self._lock.release()

    def _check_meta_properties(self, cluster_id: str | None, node_id: int | None) -> None:
        meta = read_meta_properties(self.data_dir)
        if meta:
            if cluster_id is not None and meta.get("cluster.id") not in (None, cluster_id):
                raise KafkaStorageError(
                    f"{self.data_dir}: belongs to cluster {meta.get('cluster.id')}, "
                    f"not {cluster_id}"
                )
            if node_id is not None and meta.get("node.id") not in (None, str(node_id)):
                raise KafkaStorageError(
                    f"{self.data_dir}: belongs to node {meta.get('node.id')}, not {node_id}"
                )
        if cluster_id is None and node_id is None:
            return
        lines = ["version=1"]
        if cluster_id is not None:
            lines.append(f"cluster.id={cluster_id}")
        if node_id is not None:
            lines.append(f"node.id={node_id}")
        contents = ("\n".join(lines) + "\n").encode()
        path = self.data_dir / META_PROPERTIES
        if not path.exists() or path.read_bytes() != contents:
            write_atomically(path, contents)

    def _partition_directories(self) -> dict[TopicPartition, Path]:
        result = {}
        for path in self.data_dir.iterdir():
            name = path.name
            if path.is_dir():
                if name in _IGNORED_DIRECTORIES or name.startswith("."):
                    continue
                result[TopicPartition.parse_dir_name(name)] = path
            elif name in _ROOT_FILES or name.endswith(TMP_SUFFIX):
                continue
            else:
                raise StrayFileError(
                    f"{path}: not a file Highwater writes in a data directory; move it away"
                )
        return result

    # -- logs ---------------------------------------------------------------------------

    @property
    def logs(self) -> dict[TopicPartition, PartitionLog]:
        return dict(self._logs)

    def get_log(self, tp: TopicPartition) -> PartitionLog | None:
        return self._logs.get(tp)

    def get_or_create_log(
        self, tp: TopicPartition, config: LogConfig | None = None
    ) -> PartitionLog:
        """The log for ``tp``, created empty (with ``config``) when there is none."""
        existing = self._logs.get(tp)
        if existing is not None:
            if config is not None:
                existing.config = config
            return existing
        directory = self.data_dir / tp.dir_name
        partition_log = load_partition_log(
            directory,
            config or self.default_config,
            had_clean_shutdown=True,
            clock=self.clock,
            producer_id_expiration_ms=self.settings.producer_id_expiration_ms,
        )
        self._logs[tp] = partition_log
        return partition_log

    async def truncate_to(self, tp: TopicPartition, offset: int) -> bool:
        """Truncate a replica's log, then make its lowered recovery point durable.

        Neither checkpoint on disk may stay above the truncation. Records appended after the
        recovery point would be trusted, unchecked, after a crash; records appended below
        the cleaner checkpoint would never be compacted (Kafka's ``maybeTruncateCheckpoint``).
        Both are written off the event loop, and the caller appends again only once this
        returns.
        """
        partition_log = self._logs[tp]
        truncated = partition_log.truncate_to(offset)
        if truncated:
            end = partition_log.log_end_offset
            await asyncio.to_thread(self._checkpoint_after_truncation, tp, end)
        return truncated

    def _checkpoint_after_truncation(self, tp: TopicPartition, log_end_offset: int) -> None:
        self.checkpoint_recovery_points()
        self.lower_cleaner_checkpoint(tp, log_end_offset)

    def lower_cleaner_checkpoint(self, tp: TopicPartition, offset: int) -> None:
        """Bring ``tp``'s cleaner checkpoint down to ``offset`` if it is above it: the log was
        truncated there, and what is appended from there on is dirty."""
        offsets = self.cleaner_checkpoint.read()
        if offsets.get(tp, offset) > offset:
            offsets[tp] = offset
            self.cleaner_checkpoint.write(offsets)

    def delete_log(self, tp: TopicPartition) -> bool:
        partition_log = self._logs.pop(tp, None)
        if partition_log is None:
            return False
        partition_log.delete()
        self.checkpoint_all()
        return True

    # -- checkpoints ----------------------------------------------------------------------

    def checkpoint_recovery_points(self) -> None:
        self._checkpoints[RECOVERY_POINT_CHECKPOINT].write(
            {tp: lg.recovery_point for tp, lg in self._logs.items()}
        )

    def checkpoint_high_watermarks(self) -> None:
        self._checkpoints[REPLICATION_OFFSET_CHECKPOINT].write(
            {tp: lg.high_watermark for tp, lg in self._logs.items()}
        )

    def checkpoint_log_start_offsets(self) -> None:
        self._checkpoints[LOG_START_OFFSET_CHECKPOINT].write(
            {tp: lg.log_start_offset for tp, lg in self._logs.items()}
        )

    def checkpoint_all(self) -> None:
        self.checkpoint_recovery_points()
        self.checkpoint_high_watermarks()
        self.checkpoint_log_start_offsets()

    # -- upkeep (synchronous pieces, also used by tests) ----------------------------------

    def apply_retention(self) -> int:
        deleted = sum(lg.delete_old_segments() for lg in list(self._logs.values()))
        if deleted:
            self.checkpoint_log_start_offsets()
        return deleted

    def delete_pending_files(self) -> int:
        return sum(lg.delete_pending_files() for lg in list(self._logs.values()))

    def logs_to_flush(self) -> list[tuple[PartitionLog, int]]:
        result = []
        for partition_log in self._logs.values():
            target = partition_log.flush_target()
            if target is not None:
                result.append((partition_log, target))
        return result

    # -- background tasks ---------------------------------------------------------------

    async def run_background(self) -> None:
        """Run flushing, retention, file deletion, checkpoints and compaction until cancelled."""
        settings = self.settings
        tasks = [
            self._every(settings.log_flush_scheduler_interval_ms, self._flush_due),
            self._every(settings.log_retention_check_interval_ms, self._retention),
            self._every(1_000, self._delete_files),
            self._every(
                settings.log_flush_offset_checkpoint_interval_ms, self._checkpoint_recovery
            ),
            self._every(
                settings.replica_high_watermark_checkpoint_interval_ms, self._checkpoint_hw
            ),
        ]
        if settings.log_cleaner_enable:
            tasks.append(self._every(settings.log_cleaner_backoff_ms, self._clean))
        async with asyncio.TaskGroup() as group:
            for task in tasks:
                group.create_task(task)

    async def _every(self, interval_ms: int, action: Callable[[], object]) -> None:
        while True:
            await asyncio.sleep(interval_ms / 1000)
            try:
                result = action()
                if asyncio.iscoroutine(result):
                    await result
            except Exception:
                log.exception(
                    "storage background task %s failed", getattr(action, "__name__", action)
                )

    async def _flush_due(self) -> None:
        for partition_log, target in self.logs_to_flush():
            await asyncio.to_thread(partition_log.flush, target)

    async def flush_all(self) -> None:
        """fsync every log up to its end, off the event loop."""
        for partition_log in list(self._logs.values()):
            await asyncio.to_thread(partition_log.flush)

    async def _retention(self) -> None:
        self.apply_retention()

    async def _delete_files(self) -> None:
        self.delete_pending_files()

    async def _checkpoint_recovery(self) -> None:
        await asyncio.to_thread(self.checkpoint_recovery_points)
        await asyncio.to_thread(self.checkpoint_log_start_offsets)

    async def _checkpoint_hw(self) -> None:
        await asyncio.to_thread(self.checkpoint_high_watermarks)

    async def _clean(self) -> None:
        from highwater.storage.cleaner import LogCleaner

        if self._cleaner is None:
            self._cleaner = LogCleaner(self)
        await self._cleaner.clean_once_async()


def _read_broker_epoch(marker: Path) -> int:
    """The broker epoch in a clean-shutdown marker; -1 when it names none (an empty
    marker, or one that does not parse: it only spares a wait, so it is not an error)."""
    try:
        content = json.loads(marker.read_bytes() or b"{}")
        epoch = content.get("brokerEpoch", -1) if isinstance(content, dict) else -1
    except (OSError, ValueError):
        log.warning("%s: unreadable clean-shutdown marker; no previous broker epoch", marker)
        return -1
    return epoch if isinstance(epoch, int) and epoch >= 0 else -1
