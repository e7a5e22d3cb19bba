"""The log directories of a broker and the partition logs in them: placement, loading,
checkpoints, failed directories and background upkeep.

A broker keeps its partitions in one or more log directories (Kafka's ``log.dirs``, JBOD:
one directory per disk). Layout of each::

    meta.properties                      version, cluster.id, node.id, directory.id
    .lock                                held (flock) while a process owns the directory
    .highwater-clean-shutdown            present only between a clean shutdown and the next start
    recovery-point-offset-checkpoint     replication-offset-checkpoint (high watermarks)
    log-start-offset-checkpoint          cleaner-offset-checkpoint
    <topic>-<partition>/                 one PartitionLog each

Every directory has its own lock, its own checkpoints (of the partitions it holds) and
its own ``meta.properties`` whose ``directory.id`` (KIP-858: a random Uuid in Kafka's
base64 form, written the first time the directory is used) names it to the controller.

* **Placement** (Kafka's rule): a new partition goes to the online directory holding the
  fewest partitions, the first listed on a tie. On restart each partition is found in
  whichever directory holds it; one present in two directories is refused at start
  naming both, before anything is loaded.
* **Failure** (Kafka's ``LogDirFailureChannel``): an I/O error in a log's append, read,
  roll, flush or truncation (see :mod:`highwater.storage.log`), a checkpoint that cannot
  be written, or the periodic probe of each directory (a file written, fsynced and removed;
  the directory replaced, or made unwritable, fails it) takes that *directory* offline:
  its logs are closed and refuse every call with ``KAFKA_STORAGE_ERROR``, the others keep
  serving. Listeners (:meth:`LogManager.add_failure_listener`) are told, so that the broker
  reports the directory to the controller. A directory that cannot be opened at start is
  offline from the start; only if every directory failed does startup fail.
* **Offline replicas**: while a directory is offline, a partition that is not found in an
  online directory is *not* created afresh (Kafka's rule for a replica that is not new:
  its records may be on the failed disk): :meth:`LogManager.get_or_create_log` refuses it
  with ``KafkaStorageError`` and the broker reports it offline.

``LogManager`` is synchronous and single-threaded for appends and reads; the periodic work
(flushing by ``flush.ms`` / ``flush.messages`` / roll, retention, removal of ``.deleted``
files, checkpoints, compaction, directory probes) runs in :meth:`run_background`, an
asyncio task that sends every fsync and every compaction pass to a worker thread so the
event loop never waits on the disk.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import errno
import json
import logging
import os
import shutil
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ParamSpec, TypeVar

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
from highwater.storage.log import PartitionLog, is_io_failure, wall_clock_ms
from highwater.storage.log_loader import load_partition_log
from highwater.storage.partition_metadata import (
    InconsistentPartitionMetadataError,
    InconsistentTopicIdError,
    read_topic_id,
    write_topic_id,
)
from highwater.storage.topic_partition import TopicPartition

if TYPE_CHECKING:
    from highwater.storage.cleaner import LogCleaner

log = logging.getLogger(__name__)

_P = ParamSpec("_P")
_R = TypeVar("_R")

META_PROPERTIES = "meta.properties"
CLEAN_SHUTDOWN_FILE = ".highwater-clean-shutdown"
PROBE_FILE = ".highwater-probe" + TMP_SUFFIX
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
_OFFSET_CHECKPOINTS = (
    RECOVERY_POINT_CHECKPOINT,
    REPLICATION_OFFSET_CHECKPOINT,
    LOG_START_OFFSET_CHECKPOINT,
)


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
    log_dir_probe_interval_ms: int = 5_000
    """How often each online log directory is probed (not Kafka's: Kafka notices a failed
    disk only on the next I/O error)."""
    log_close_threads_per_data_dir: int = 4
    """Threads that flush and close a directory's logs at shutdown, as Kafka's
    ``num.recovery.threads.per.data.dir`` do: closing is fsyncs, which overlap on the disk
    and release the GIL (loading, CPU-bound Python, stays serial)."""


def read_meta_properties(data_dir: Path) -> dict[str, str]:
    """The keys of ``data_dir``'s ``meta.properties`` (``key=value`` lines, ``#``
    comments); empty if there is none. KafkaStorageError for a line that is not
    ``key=value``. A broker's log directories and a controller's data directory
    (``raft/meta_properties.py``) both keep one."""
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


def new_directory_id() -> str:
    """A directory id as Kafka writes one (KIP-858): a random Uuid, URL-safe base64 without
    padding (22 characters)."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()


@dataclass(slots=True)
class LogDirectory:
    """One log directory of the broker: its identity, lock, checkpoints and health."""

    path: Path
    directory_id: str = ""
    """From ``meta.properties`` (created at the first start); empty until started."""
    online: bool = True
    error: str | None = None
    """Why the directory went offline."""
    had_clean_shutdown: bool = False
    previous_broker_epoch: int = -1
    lock: DataDirLock = field(init=False)
    checkpoints: dict[str, OffsetCheckpointFile] = field(init=False)
    cleaner_checkpoint: OffsetCheckpointFile = field(init=False)
    inode: tuple[int, int] | None = None
    """(device, inode) of the directory when it was opened: a replaced directory fails."""

    def __post_init__(self) -> None:
        self.lock = DataDirLock(self.path)
        self.checkpoints = {
            name: OffsetCheckpointFile(self.path / name) for name in _OFFSET_CHECKPOINTS
        }
        self.cleaner_checkpoint = OffsetCheckpointFile(self.path / CLEANER_OFFSET_CHECKPOINT)


@dataclass(frozen=True, slots=True)
class ReplicaInfo:
    """One partition replica in a log directory (DescribeLogDirs)."""

    topic_partition: TopicPartition
    size: int
    offset_lag: int
    is_future: bool = False


@dataclass(frozen=True, slots=True)
class LogDirDescription:
    """A log directory as DescribeLogDirs answers it; the sizes are -1 when offline."""

    path: str
    directory_id: str
    error: str | None
    total_bytes: int
    usable_bytes: int
    replicas: tuple[ReplicaInfo, ...]

    @property
    def online(self) -> bool:
        return self.error is None

    @property
    def size_bytes(self) -> int:
        return sum(r.size for r in self.replicas)


class _CleanerCheckpoints:
    """The cleaner checkpoints of every online directory, read and written as one."""

    def __init__(self, manager: LogManager) -> None:
        self._manager = manager

    def read(self) -> dict[TopicPartition, int]:
        result: dict[TopicPartition, int] = {}
        for directory in self._manager.online_dirs:
            result.update(directory.cleaner_checkpoint.read())
        return result

    def write(self, offsets: dict[TopicPartition, int]) -> None:
        manager = self._manager
        by_dir: dict[int, dict[TopicPartition, int]] = {id(d): {} for d in manager.online_dirs}
        first = manager.online_dirs[0] if manager.online_dirs else None
        for tp, offset in offsets.items():
            directory = manager.directory_of(tp) or first
            if directory is not None and id(directory) in by_dir:
                by_dir[id(directory)][tp] = offset
        for directory in manager.online_dirs:
            manager.guard_dir(directory, directory.cleaner_checkpoint.write, by_dir[id(directory)])


@dataclass(eq=False)
class NewLog:
    """A log being created (:meth:`LogManager.plan_new_logs`): where it goes, then what
    loading it gave, the log or the I/O error."""

    topic_partition: TopicPartition
    config: LogConfig
    directory: LogDirectory
    topic_id: str | None = None
    """Recorded in the log's ``partition.metadata`` as its files are made (None: not yet
    known; :meth:`LogManager.assign_topic_id` records it later)."""
    log: PartitionLog | None = None
    error: BaseException | None = None


class LogManager:
    """Owns the log directories and every partition log in them (see the module docstring).

    ``data_dirs`` is one directory or several (``log.dirs``), in the operator's order.
    """

    def __init__(
        self,
        data_dirs: Path | str | Sequence[Path | str],
        *,
        default_config: LogConfig | None = None,
        settings: LogManagerSettings | None = None,
        clock: Callable[[], int] = wall_clock_ms,
    ) -> None:
        paths = (
            [Path(data_dirs)] if isinstance(data_dirs, Path | str) else [Path(d) for d in data_dirs]
        )
        if not paths:
            raise ValueError("a broker needs at least one log directory")
        seen: dict[Path, Path] = {}
        for path in paths:
            key = path.absolute()
            if key in seen:
                raise KafkaStorageError(f"log directory {path} is listed twice in log.dirs")
            seen[key] = path
        self.log_dirs = [LogDirectory(path) for path in paths]
        self.data_dir = paths[0]
        """The first log directory (the only one, for a broker with one)."""
        self.default_config = default_config or LogConfig()
        self.settings = settings or LogManagerSettings()
        self.clock = clock
        self._logs: dict[TopicPartition, PartitionLog] = {}
        self._dir_of: dict[TopicPartition, LogDirectory] = {}
        self._offline_logs: dict[TopicPartition, PartitionLog] = {}
        self._topic_ids: dict[TopicPartition, str] = {}
        """The topic id each log's ``partition.metadata`` records (none for a log made
        before the file existed, until it is assigned one)."""
        self._unwritten_topic_ids: dict[TopicPartition, str] = {}
        """Topic ids recorded by :meth:`record_topic_id` whose file
        :meth:`write_topic_ids` has not written yet."""
        self.cleaner_checkpoint = _CleanerCheckpoints(self)
        self.had_clean_shutdown = False
        self.previous_broker_epoch = -1
        """The broker epoch the clean-shutdown markers kept (-1: none, or not clean)."""
        self._cleaner: LogCleaner | None = None
        self._failure_listeners: list[Callable[[LogDirectory], None]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        """The event loop that owns the logs, once :meth:`run_background` runs."""

    # -- directories --------------------------------------------------------------------

    @property
    def online_dirs(self) -> list[LogDirectory]:
        return [d for d in self.log_dirs if d.online]

    @property
    def offline_dirs(self) -> list[LogDirectory]:
        return [d for d in self.log_dirs if not d.online]

    def directory_of(self, tp: TopicPartition) -> LogDirectory | None:
        """The directory that holds ``tp``'s log (online or not); None if none does."""
        return self._dir_of.get(tp)

    def is_offline(self, tp: TopicPartition) -> bool:
        """Whether ``tp``'s log is in a failed directory."""
        return tp in self._offline_logs

    @property
    def offline_partitions(self) -> frozenset[TopicPartition]:
        return frozenset(self._offline_logs)

    def add_failure_listener(self, listener: Callable[[LogDirectory], None]) -> None:
        """Call ``listener`` (on the thread that met the error) when a directory fails."""
        self._failure_listeners.append(listener)

    def fail_dir(self, directory: LogDirectory, error: BaseException | str) -> None:
        """Take ``directory`` offline: close its logs (they refuse every later call) and
        tell the listeners. Nothing is written to it any more.

        Called off the event loop that owns the logs (a flush or a checkpoint in a worker
        thread failed), it is handed over to that loop."""
        loop = self._loop
        if loop is not None and not loop.is_closed() and _running_loop() is not loop:
            loop.call_soon_threadsafe(self.fail_dir, directory, error)
            return
        if not directory.online:
            return
        directory.online = False
        directory.error = str(error)
        log.error("log directory %s failed and is offline: %s", directory.path, error)
        for tp in [tp for tp, d in self._dir_of.items() if d is directory]:
            partition_log = self._logs.pop(tp, None)
            if partition_log is None:
                continue
            partition_log.offline = True
            with contextlib.suppress(Exception):
                partition_log.close()
            self._offline_logs[tp] = partition_log
        directory.lock.release()
        for listener in self._failure_listeners:
            try:
                listener(directory)
            except Exception:
                log.exception("a log directory failure listener failed")

    def guard_dir(
        self,
        directory: LogDirectory,
        action: Callable[_P, _R],
        *args: _P.args,
        **kwargs: _P.kwargs,
    ) -> _R | None:
        """Run ``action`` on ``directory``; an I/O failure takes the directory offline
        (and returns None) instead of propagating."""
        try:
            return action(*args, **kwargs)
        except (OSError, KafkaStorageError) as e:
            if not is_io_failure(e):
                raise
            self.fail_dir(directory, e)
            return None

    def _on_log_io_error(self, partition_log: PartitionLog, error: BaseException) -> None:
        directory = self._dir_of.get(partition_log.topic_partition)
        if directory is not None:
            self.fail_dir(directory, error)

    def probe_dirs(self) -> list[LogDirectory]:
        """Check that each online directory is still the one opened and takes a write; the
        ones that fail go offline (and are returned). Blocking: run it off the event loop."""
        failed = []
        for directory in self.online_dirs:
            try:
                _probe(directory)
            except OSError as e:
                if is_io_failure(e):
                    self.fail_dir(directory, e)
                    failed.append(directory)
        return failed

    def describe(self, topics: Iterable[str] | None = None) -> list[LogDirDescription]:
        """Every log directory with its disk usage and its replicas (of ``topics``, or all),
        as DescribeLogDirs answers it."""
        wanted = None if topics is None else set(topics)
        result = []
        for directory in self.log_dirs:
            replicas: list[ReplicaInfo] = []
            total = usable = -1
            if directory.online:
                try:
                    usage = shutil.disk_usage(directory.path)
                    total, usable = usage.total, usage.free
                except OSError as e:
                    self.fail_dir(directory, e)
            if directory.online:
                for tp, partition_log in sorted(self._logs.items()):
                    if self._dir_of.get(tp) is not directory:
                        continue
                    if wanted is not None and tp.topic not in wanted:
                        continue
                    lag = max(partition_log.high_watermark - partition_log.log_end_offset, 0)
                    replicas.append(ReplicaInfo(tp, partition_log.size, lag))
            result.append(
                LogDirDescription(
                    path=str(directory.path.absolute()),
                    directory_id=directory.directory_id,
                    error=directory.error if not directory.online else None,
                    total_bytes=total,
                    usable_bytes=usable,
                    replicas=tuple(replicas),
                )
            )
        return result

    def disk_usage(self) -> list[tuple[LogDirectory, int, int, int]]:
        """(directory, total bytes, usable bytes, bytes of its logs) of each directory; -1
        where unknown (offline). Read-only and cheap (one ``statvfs`` a directory), for
        metrics, which read it from another thread: a failure here takes nothing offline."""
        sizes: dict[int, int] = {}
        for tp, partition_log in list(self._logs.items()):
            directory = self._dir_of.get(tp)
            if directory is not None:
                sizes[id(directory)] = sizes.get(id(directory), 0) + partition_log.size
        result = []
        for directory in self.log_dirs:
            total = usable = size = -1
            if directory.online:
                size = sizes.get(id(directory), 0)
                try:
                    usage = shutil.disk_usage(directory.path)
                    total, usable = usage.total, usage.free
                except OSError:
                    pass
            result.append((directory, total, usable, size))
        return result

    # -- start and stop -----------------------------------------------------------------

    def startup(self, *, cluster_id: str | None = None, node_id: int | None = None) -> None:
        """Lock each directory, check its identity and load every partition log in them.

        A directory that cannot be opened (an I/O error) is offline from the start; if
        none can, or a partition is found in two directories, or a directory belongs to
        another cluster or node or is locked by another process, startup fails and
        nothing is loaded.
        """
        found: dict[TopicPartition, tuple[LogDirectory, Path]] = {}
        opened: list[LogDirectory] = []
        try:
            for directory in self.log_dirs:
                try:
                    partition_dirs = self._open_dir(directory, cluster_id, node_id)
                except OSError as e:
                    directory.online = False
                    directory.error = str(e)
                    directory.lock.release()
                    log.error("log directory %s is offline: %s", directory.path, e)
                    continue
                opened.append(directory)
                for tp, path in partition_dirs.items():
                    if tp in found:
                        raise KafkaStorageError(
                            f"partition {tp} is in two log directories: {found[tp][1]} "
                            f"and {path}; remove one of them"
                        )
                    found[tp] = (directory, path)
            if not opened:
                raise KafkaStorageError(
                    "no log directory can be used: "
                    + "; ".join(f"{d.path}: {d.error}" for d in self.log_dirs)
                )
            offsets = {
                id(d): {name: cp.read() for name, cp in d.checkpoints.items()} for d in opened
            }
            for tp, (directory, path) in sorted(found.items()):
                if not directory.online:
                    continue
                own = offsets[id(directory)]
                try:
                    topic_id = read_topic_id(path)
                except InconsistentPartitionMetadataError as e:
                    # As Kafka: the read fails its directory, the broker serves the others.
                    self._dir_of[tp] = directory
                    self.fail_dir(directory, e)
                    continue
                except OSError as e:
                    if not is_io_failure(e):
                        raise
                    self._dir_of[tp] = directory
                    self.fail_dir(directory, e)
                    continue
                if topic_id is not None:
                    self._topic_ids[tp] = topic_id
                try:
                    partition_log = load_partition_log(
                        path,
                        self.default_config,
                        log_start_offset=own[LOG_START_OFFSET_CHECKPOINT].get(tp, 0),
                        recovery_point=own[RECOVERY_POINT_CHECKPOINT].get(tp, 0),
                        high_watermark=own[REPLICATION_OFFSET_CHECKPOINT].get(tp, 0),
                        had_clean_shutdown=directory.had_clean_shutdown,
                        clock=self.clock,
                        producer_id_expiration_ms=self.settings.producer_id_expiration_ms,
                    )
                except (OSError, KafkaStorageError) as e:
                    if not is_io_failure(e):
                        raise
                    self._dir_of[tp] = directory
                    self.fail_dir(directory, e)
                    continue
                self._adopt(tp, partition_log, directory)
            if not self.online_dirs:
                raise KafkaStorageError("every log directory failed while loading")
            for directory in self.online_dirs:
                # From here on a crash is not a clean shutdown any more.
                self.guard_dir(
                    directory, (directory.path / CLEAN_SHUTDOWN_FILE).unlink, missing_ok=True
                )
            online = self.online_dirs
            self.had_clean_shutdown = all(d.had_clean_shutdown for d in online)
            # As Kafka's readBrokerEpochFromCleanShutdownFiles: the epoch the markers kept.
            # A directory without one was offline at the last shutdown, or is new; the
            # broker itself stopped cleanly all the same (each directory's recovery
            # follows its own marker).
            self.previous_broker_epoch = max(
                (d.previous_broker_epoch for d in online if d.had_clean_shutdown), default=-1
            )
            log.info(
                "loaded %d partition log(s) from %d log directories (%d offline, %s shutdown)",
                len(self._logs),
                len(self.log_dirs),
                len(self.offline_dirs),
                "clean" if self.had_clean_shutdown else "unclean",
            )
        except BaseException:
            for partition_log in [*self._logs.values(), *self._offline_logs.values()]:
                with contextlib.suppress(Exception):
                    partition_log.close()
            self._logs.clear()
            self._offline_logs.clear()
            self._dir_of.clear()
            for directory in self.log_dirs:
                directory.lock.release()
            raise

    def _open_dir(
        self, directory: LogDirectory, cluster_id: str | None, node_id: int | None
    ) -> dict[TopicPartition, Path]:
        path = directory.path
        path.mkdir(parents=True, exist_ok=True)
        directory.lock.acquire()
        stat = os.stat(path)
        directory.inode = (stat.st_dev, stat.st_ino)
        self._check_meta_properties(directory, cluster_id, node_id)
        marker = path / CLEAN_SHUTDOWN_FILE
        directory.had_clean_shutdown = marker.exists()
        directory.previous_broker_epoch = (
            _read_broker_epoch(marker) if directory.had_clean_shutdown else -1
        )
        return _partition_directories(path)

    def _adopt(
        self, tp: TopicPartition, partition_log: PartitionLog, directory: LogDirectory
    ) -> None:
        partition_log.on_io_error = self._on_log_io_error
        self._logs[tp] = partition_log
        self._dir_of[tp] = directory

    def shutdown(self, *, broker_epoch: int = -1) -> None:
        """Flush and close every log, write the checkpoints and, in each online directory,
        the clean-shutdown marker, which keeps the broker's epoch (Kafka's
        ``.kafka_cleanshutdown``, KIP-966): the restarted broker's registration names it,
        and the controller lets the new incarnation in without waiting for the old session
        to expire."""

        def close(partition_log: PartitionLog) -> None:
            with contextlib.suppress(KafkaStorageError):
                partition_log.close()  # an I/O error here takes its directory offline

        self._write_topic_ids(self._pending_topic_ids())
        threads = max(1, self.settings.log_close_threads_per_data_dir) * len(self.online_dirs)
        with ThreadPoolExecutor(max(1, threads), thread_name_prefix="log-close") as pool:
            for _ in pool.map(close, list(self._logs.values())):
                pass
        self.checkpoint_all()
        marker = json.dumps({"version": 0, "brokerEpoch": broker_epoch}).encode()
        for directory in self.online_dirs:
            self.guard_dir(
                directory, write_atomically, directory.path / CLEAN_SHUTDOWN_FILE, marker
            )
        self._logs.clear()
        self._offline_logs.clear()
        self._dir_of.clear()
        for directory in self.log_dirs:
            directory.lock.release()

    def _check_meta_properties(
        self, directory: LogDirectory, cluster_id: str | None, node_id: int | None
    ) -> None:
        data_dir = directory.path
        meta = read_meta_properties(data_dir)
        if meta:
            if cluster_id is not None and meta.get("cluster.id") not in (None, cluster_id):
                raise KafkaStorageError(
                    f"{data_dir}: belongs to cluster {meta.get('cluster.id')}, not {cluster_id}"
                )
            if node_id is not None and meta.get("node.id") not in (None, str(node_id)):
                raise KafkaStorageError(
                    f"{data_dir}: belongs to node {meta.get('node.id')}, not {node_id}"
                )
        directory_id = meta.get("directory.id") or new_directory_id()
        for other in self.log_dirs:
            if other is not directory and other.directory_id == directory_id:
                raise KafkaStorageError(
                    f"{data_dir} and {other.path} have the same directory.id {directory_id} "
                    "(a copied directory?); give one of them a new id"
                )
        directory.directory_id = directory_id
        lines = ["version=1"]
        if cluster_id is not None or meta.get("cluster.id"):
            lines.append(
                f"cluster.id={cluster_id if cluster_id is not None else meta['cluster.id']}"
            )
        if node_id is not None or meta.get("node.id"):
            lines.append(f"node.id={node_id if node_id is not None else meta['node.id']}")
        lines.append(f"directory.id={directory_id}")
        contents = ("\n".join(lines) + "\n").encode()
        path = data_dir / META_PROPERTIES
        if not path.exists() or path.read_bytes() != contents:
            write_atomically(path, contents)

    # -- logs ---------------------------------------------------------------------------

    @property
    def logs(self) -> dict[TopicPartition, PartitionLog]:
        """The logs in online directories."""
        return dict(self._logs)

    def get_log(self, tp: TopicPartition) -> PartitionLog | None:
        return self._logs.get(tp)

    def topic_id(self, tp: TopicPartition) -> str | None:
        """The topic id ``tp``'s log records in its ``partition.metadata``; None when it
        has no log here or its log records none (made before the file existed)."""
        return self._topic_ids.get(tp)

    def assign_topic_id(self, tp: TopicPartition, topic_id: str) -> None:
        """Record ``topic_id`` as the topic of ``tp``'s log (Kafka's ``assignTopicId``),
        durably, once: a log already recording another id is another topic's, and the
        caller removes it instead (``InconsistentTopicIdError``)."""
        recorded = self._topic_ids.get(tp)
        if recorded == topic_id:
            return
        if recorded is not None:
            raise InconsistentTopicIdError(
                f"{tp}: its log belongs to topic id {recorded}, not {topic_id}"
            )
        partition_log = self._logs.get(tp)
        if partition_log is None:
            raise KafkaStorageError(f"{tp} has no online log to assign topic id {topic_id} to")
        directory = self._dir_of[tp]
        try:
            write_topic_id(partition_log.directory, topic_id)
        except OSError as e:
            self.fail_dir(directory, e)
            raise KafkaStorageError(
                f"cannot record the topic id of {tp} in {partition_log.directory}: {e}"
            ) from e
        self._topic_ids[tp] = topic_id

    def record_topic_id(self, tp: TopicPartition, topic_id: str) -> None:
        """:meth:`assign_topic_id`, its file left for :meth:`write_topic_ids` to write off
        the event loop (Kafka's ``UnifiedLog.assignTopicId`` leaves it to its scheduler):
        the first image after an upgrade names every log made before ``partition.metadata``
        existed, two fsyncs each. The id holds at once; a crash before the file is written
        leaves the log recording none, and the next start records it again."""
        recorded = self._topic_ids.get(tp)
        if recorded == topic_id:
            return
        if recorded is not None:
            raise InconsistentTopicIdError(
                f"{tp}: its log belongs to topic id {recorded}, not {topic_id}"
            )
        if tp not in self._logs:
            raise KafkaStorageError(f"{tp} has no online log to assign topic id {topic_id} to")
        self._topic_ids[tp] = topic_id
        self._unwritten_topic_ids[tp] = topic_id

    @property
    def has_unwritten_topic_ids(self) -> bool:
        return bool(self._unwritten_topic_ids)

    async def write_topic_ids(self) -> None:
        """Write the ``partition.metadata`` of the ids :meth:`record_topic_id` recorded, in a
        worker thread. A log deleted meanwhile is passed over (its directory is going); a
        write that fails takes its directory offline."""
        pending = self._pending_topic_ids()
        if pending:
            await asyncio.to_thread(self._write_topic_ids, pending)

    def _pending_topic_ids(self) -> list[tuple[PartitionLog, LogDirectory, str]]:
        """The ids :meth:`record_topic_id` left unwritten, with their logs (taken: the
        caller writes them)."""
        pending = [
            (partition_log, self._dir_of[tp], topic_id)
            for tp, topic_id in self._unwritten_topic_ids.items()
            if (partition_log := self._logs.get(tp)) is not None
        ]
        self._unwritten_topic_ids.clear()
        return pending

    def _write_topic_ids(self, pending: Sequence[tuple[PartitionLog, LogDirectory, str]]) -> None:
        """Blocking, any thread: :meth:`write_topic_ids`'s writes."""
        for partition_log, directory, topic_id in pending:
            if directory.online:

                def write(log_dir: Path, topic_id: str = topic_id) -> None:
                    write_topic_id(log_dir, topic_id)

                self.guard_dir(directory, partition_log.write_in_directory, write)

    def next_dir(self) -> LogDirectory:
        """Where a new partition goes: the online directory with the fewest partitions,
        the first listed on a tie (Kafka's ``nextLogDirs``)."""
        return self._place_new_logs(1)[0]

    def _place_new_logs(self, count: int) -> list[LogDirectory]:
        """The directories of ``count`` new logs, each placed as :meth:`next_dir` would
        place it after the ones before it were created."""
        online = self.online_dirs
        if not online:
            raise KafkaStorageError("every log directory is offline")
        if len(online) == 1:
            return online * count  # no count needed: creating N logs stays O(N)
        counts = Counter(map(id, self._dir_of.values()))
        placed = []
        for _ in range(count):
            directory = min(online, key=lambda d: counts[id(d)])
            counts[id(directory)] += 1
            placed.append(directory)
        return placed

    def check_creatable(self, tp: TopicPartition) -> None:
        """Refuse (``KafkaStorageError``) to create ``tp``'s log when it is in a failed
        directory, or while any directory is offline: that directory may hold it."""
        if tp in self._offline_logs:
            directory = self._dir_of[tp]
            raise KafkaStorageError(f"{tp}: its log directory {directory.path} is offline")
        offline = self.offline_dirs
        if offline:
            raise KafkaStorageError(
                f"cannot create the log of {tp}: log directories "
                f"{', '.join(str(d.path) for d in offline)} are offline and may hold it"
            )

    def get_or_create_log(
        self, tp: TopicPartition, config: LogConfig | None = None
    ) -> PartitionLog:
        """The log for ``tp``, created empty (with ``config``) in :meth:`next_dir` when there
        is none. Refused (``KafkaStorageError``) when ``tp`` is in a failed directory, or
        when it is missing while a directory is offline: it may be there."""
        existing = self._logs.get(tp)
        if existing is not None:
            if config is not None:
                existing.config = config
            return existing
        (new_log,) = self.plan_new_logs([(tp, config)])
        self.load_new_logs([new_log])
        refused = self.adopt_new_logs([new_log])
        if refused:
            raise KafkaStorageError(refused[0][1])
        assert new_log.log is not None
        return new_log.log

    # Creating many logs (a new topic of a thousand partitions) is a directory, files and
    # fsyncs per log: milliseconds each. A broker does it off its event loop in three
    # steps: plan (on the loop: refusals and placement), load (in a worker thread: files
    # only, the manager's state untouched), adopt (on the loop again).

    def plan_new_logs(
        self,
        requests: Sequence[tuple[TopicPartition, LogConfig | None]],
        topic_ids: Mapping[str, str] | None = None,
    ) -> list[NewLog]:
        """Place the new logs of ``requests`` (each ``tp`` without a log here yet), or
        raise ``KafkaStorageError`` as :meth:`check_creatable` does for the first refused.
        ``topic_ids`` (topic name → id) are recorded with the files, off the event loop."""
        for tp, _ in requests:
            if tp in self._logs:
                raise ValueError(f"{tp} already has a log")
            self.check_creatable(tp)
        directories = self._place_new_logs(len(requests))
        ids = topic_ids or {}
        return [
            NewLog(tp, config or self.default_config, directory, ids.get(tp.topic))
            for (tp, config), directory in zip(requests, directories, strict=True)
        ]

    def load_new_logs(self, new_logs: Sequence[NewLog]) -> None:
        """Create the planned logs' files: safe in a worker thread, since it only touches
        the files and the :class:`NewLog` objects. An I/O failure is kept in the failing
        log's ``error`` (and those after it in the same directory are not tried)."""
        failed: dict[int, BaseException] = {}
        for new_log in new_logs:
            error = failed.get(id(new_log.directory))
            if error is not None:
                new_log.error = error
                continue
            log_dir = new_log.directory.path / new_log.topic_partition.dir_name
            try:
                new_log.log = load_partition_log(
                    log_dir,
                    new_log.config,
                    had_clean_shutdown=True,
                    clock=self.clock,
                    producer_id_expiration_ms=self.settings.producer_id_expiration_ms,
                )
                if new_log.topic_id is not None:
                    write_topic_id(log_dir, new_log.topic_id)
            except (OSError, KafkaStorageError) as e:
                if not is_io_failure(e):
                    raise
                new_log.error = failed[id(new_log.directory)] = e

    def adopt_new_logs(self, new_logs: Sequence[NewLog]) -> list[tuple[TopicPartition, str]]:
        """Take the loaded logs into the manager; returns those refused, with why (the
        directory failed while their files were made: it is taken offline now)."""
        refused = []
        for new_log in new_logs:
            tp, directory = new_log.topic_partition, new_log.directory
            if (
                new_log.log is not None
                and new_log.error is None
                and directory.online
                and (tp not in self._logs)
            ):
                self._adopt(tp, new_log.log, directory)
                if new_log.topic_id is not None:
                    self._topic_ids[tp] = new_log.topic_id
                continue
            if new_log.log is not None:
                with contextlib.suppress(KafkaStorageError, OSError):
                    new_log.log.close()
            if new_log.error is not None and directory.online:
                self.fail_dir(directory, new_log.error)
            why = new_log.error or directory.error or "its directory is offline"
            refused.append((tp, f"cannot create the log of {tp} in {directory.path}: {why}"))
        return refused

    async def truncate_to(self, tp: TopicPartition, offset: int) -> bool:
        """Truncate a replica's log, then make its lowered recovery point durable.

        No checkpoint on disk may stay above the truncation. Records appended after the
        recovery point would be trusted, unchecked, after a crash; records appended below
        the cleaner checkpoint would never be compacted (Kafka's ``maybeTruncateCheckpoint``);
        a high watermark above the log end would, after a crash, say that this replica lost
        committed records (``PartitionLog.lost_high_watermark``). They are written off the
        event loop, and the caller appends again only once this returns.
        """
        partition_log = self._logs.get(tp) or self._offline_logs.get(tp)
        if partition_log is None:
            raise KeyError(tp)
        truncated = partition_log.truncate_to(offset)
        if truncated:
            end = partition_log.log_end_offset
            await asyncio.to_thread(self._checkpoint_after_truncation, tp, end)
        return truncated

    def _checkpoint_after_truncation(self, tp: TopicPartition, log_end_offset: int) -> None:
        self.checkpoint_recovery_points()
        self.checkpoint_high_watermarks()
        self.lower_cleaner_checkpoint(tp, log_end_offset)

    def lower_cleaner_checkpoint(self, tp: TopicPartition, offset: int) -> None:
        """Bring ``tp``'s cleaner checkpoint down to ``offset`` if it is above it: the log was
        truncated there, and what is appended from there on is dirty."""
        directory = self._dir_of.get(tp)
        if directory is None or not directory.online:
            return
        offsets = directory.cleaner_checkpoint.read()
        if offsets.get(tp, offset) > offset:
            offsets[tp] = offset
            self.guard_dir(directory, directory.cleaner_checkpoint.write, offsets)

    def delete_log(self, tp: TopicPartition) -> bool:
        """Remove ``tp``'s log (its replica left this broker); a log in a failed directory
        is only forgotten. False if there was none."""
        return self.delete_logs([tp]) == 1

    def delete_logs(self, tps: Iterable[TopicPartition]) -> int:
        """Remove the logs of ``tps`` (a deleted topic's, say), then write the checkpoints
        once without them, so that a topic created again under the same name cannot
        inherit their recovery points or high watermarks. Once per call, not per log: a
        thousand-partition topic is one checkpoint write, not a thousand of a thousand
        entries each. Returns how many logs there were."""
        removed = 0
        online = 0
        for tp in tps:
            self._topic_ids.pop(tp, None)
            self._unwritten_topic_ids.pop(tp, None)
            if self._offline_logs.pop(tp, None) is not None:
                self._dir_of.pop(tp, None)
                removed += 1
                continue
            partition_log = self._logs.pop(tp, None)
            if partition_log is None:
                continue
            directory = self._dir_of.pop(tp)
            self.guard_dir(directory, partition_log.delete)
            removed += 1
            online += 1
        if online:
            self.checkpoint_all()
        return removed

    # -- checkpoints ----------------------------------------------------------------------

    def _write_checkpoint(self, name: str, value: Callable[[PartitionLog], int]) -> None:
        self._write_offsets(name, self._offsets_by_dir(value))

    def _offsets_by_dir(
        self, value: Callable[[PartitionLog], int]
    ) -> list[tuple[LogDirectory, dict[TopicPartition, int]]]:
        """Each online directory's logs' ``value``: read where the logs live (the event
        loop), since the loop adds and removes logs while a checkpoint is written."""
        return [
            (
                directory,
                {
                    tp: value(lg)
                    for tp, lg in self._logs.items()
                    if self._dir_of.get(tp) is directory
                },
            )
            for directory in self.online_dirs
        ]

    def _write_offsets(
        self, name: str, offsets: list[tuple[LogDirectory, dict[TopicPartition, int]]]
    ) -> None:
        """Write the offsets :meth:`_offsets_by_dir` read; blocking, any thread."""
        for directory, by_partition in offsets:
            self.guard_dir(directory, directory.checkpoints[name].write, by_partition)

    async def _checkpoint_off_loop(self, name: str, value: Callable[[PartitionLog], int]) -> None:
        await asyncio.to_thread(self._write_offsets, name, self._offsets_by_dir(value))

    def checkpoint_recovery_points(self) -> None:
        self._write_checkpoint(RECOVERY_POINT_CHECKPOINT, _recovery_point)

    def checkpoint_high_watermarks(self) -> None:
        self._write_checkpoint(REPLICATION_OFFSET_CHECKPOINT, _high_watermark)

    def checkpoint_log_start_offsets(self) -> None:
        self._write_checkpoint(LOG_START_OFFSET_CHECKPOINT, _log_start_offset)

    def checkpoint_all(self) -> None:
        self.checkpoint_recovery_points()
        self.checkpoint_high_watermarks()
        self.checkpoint_log_start_offsets()

    # -- upkeep (synchronous pieces, also used by tests) ----------------------------------

    def apply_retention(self) -> int:
        deleted = 0
        for partition_log in list(self._logs.values()):
            with contextlib.suppress(KafkaStorageError):  # a failed disk went offline
                deleted += partition_log.delete_old_segments()
        if deleted:
            self.checkpoint_log_start_offsets()
        return deleted

    def delete_pending_files(self) -> int:
        """Remove the ``.deleted`` segments that are due. Runs every second: the logs with
        nothing pending (nearly all of a broker's thousands) cost one attribute test."""
        deleted = 0
        for partition_log in [p for p in self._logs.values() if p.has_pending_deletions]:
            with contextlib.suppress(KafkaStorageError):
                deleted += partition_log.delete_pending_files()
        return deleted

    def logs_to_flush(self) -> list[tuple[PartitionLog, int]]:
        result = []
        for partition_log in self._logs.values():
            target = partition_log.flush_target()
            if target is not None:
                result.append((partition_log, target))
        return result

    # -- background tasks ---------------------------------------------------------------

    async def run_background(self) -> None:
        """Run flushing, retention, file deletion, checkpoints, compaction and the
        directory probes until cancelled."""
        self._loop = asyncio.get_running_loop()
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
            self._every(settings.log_dir_probe_interval_ms, self._probe),
            self._every(1_000, self.write_topic_ids),
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
            with contextlib.suppress(KafkaStorageError):  # its directory went offline
                await asyncio.to_thread(partition_log.flush, target)

    async def flush_all(self) -> None:
        """fsync every log up to its end, off the event loop."""
        for partition_log in list(self._logs.values()):
            with contextlib.suppress(KafkaStorageError):
                await asyncio.to_thread(partition_log.flush)

    async def _retention(self) -> None:
        self.apply_retention()

    async def _delete_files(self) -> None:
        self.delete_pending_files()

    async def _checkpoint_recovery(self) -> None:
        await self._checkpoint_off_loop(RECOVERY_POINT_CHECKPOINT, _recovery_point)
        await self._checkpoint_off_loop(LOG_START_OFFSET_CHECKPOINT, _log_start_offset)

    async def _checkpoint_hw(self) -> None:
        await self._checkpoint_off_loop(REPLICATION_OFFSET_CHECKPOINT, _high_watermark)

    async def _probe(self) -> None:
        # The probe's I/O runs in a thread; taking a directory offline touches the logs,
        # which belong to the event loop, so the failures are handled here.
        failures = await asyncio.to_thread(_probe_all, self.online_dirs)
        for directory, error in failures:
            self.fail_dir(directory, error)

    async def _clean(self) -> None:
        from highwater.storage.cleaner import LogCleaner

        if self._cleaner is None:
            self._cleaner = LogCleaner(self)
        await self._cleaner.clean_once_async()


def _recovery_point(partition_log: PartitionLog) -> int:
    return partition_log.recovery_point


def _high_watermark(partition_log: PartitionLog) -> int:
    return partition_log.high_watermark_to_checkpoint


def _log_start_offset(partition_log: PartitionLog) -> int:
    return partition_log.log_start_offset


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _partition_directories(data_dir: Path) -> dict[TopicPartition, Path]:
    result = {}
    for path in data_dir.iterdir():
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


def _probe(directory: LogDirectory) -> None:
    """Raise ``OSError`` unless ``directory`` is still the directory opened at start and a
    file can be written, fsynced and removed in it."""
    stat = os.stat(directory.path)
    if directory.inode is not None and (stat.st_dev, stat.st_ino) != directory.inode:
        raise OSError(errno.ESTALE, f"{directory.path} was replaced after it was opened")
    probe = directory.path / PROBE_FILE
    fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, b"probe")
        os.fsync(fd)
    finally:
        os.close(fd)
    os.unlink(probe)


def _probe_all(directories: list[LogDirectory]) -> list[tuple[LogDirectory, OSError]]:
    failures = []
    for directory in directories:
        try:
            _probe(directory)
        except OSError as e:
            if is_io_failure(e):  # a full disk is not a failed one
                failures.append((directory, e))
    return failures


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
