"""Opens a partition directory as a ``PartitionLog``, recovering it after a crash.

What loading does, in order:

1. Classify every file. Leftovers of interrupted work are settled: ``*.tmp`` and
   ``*.cleaned`` files are removed (the operation never committed), ``*.deleted`` files are
   removed (their deletion had committed), ``*.swap`` segments finish their swap (the
   segments they replace are removed, then the suffix is dropped). Index files without a
   ``.log`` are removed. Any other file is a :class:`StrayFileError`.
2. After a clean shutdown, trust the segments: only check that each index is consistent
   (rebuilding any that is not) and read the tail of the active segment.
3. After a crash, re-validate every batch of the segments from the recovery point on,
   rebuilding their indexes, and cut the log at the first torn or corrupt batch (later
   segments, all unflushed, go too). Damage *below* the recovery point means flushed data
   was lost: that is reported as :class:`CorruptSegmentError` with the file and byte, never
   truncated away.
4. If the log now ends below the checkpointed log start offset, delete every segment and
   start the log empty at the log start (Kafka's ``deleteSegmentsIfLogStartGreaterThanLogEnd``):
   the log start is never lowered, which would hand out its offsets again.
5. Rebuild producer state from the newest snapshot plus the batches after it, and trim the
   leader-epoch cache to the log's bounds.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from pathlib import Path

from highwater.config.topic import LogConfig
from highwater.errors import CorruptSegmentError, StrayFileError
from highwater.records.header import BatchHeader
from highwater.storage.checkpoint import LeaderEpochCheckpointFile
from highwater.storage.index import CorruptIndexError
from highwater.storage.leader_epoch import LeaderEpochCache
from highwater.storage.log import PartitionLog, wall_clock_ms
from highwater.storage.partition_metadata import PARTITION_METADATA
from highwater.storage.producer_state import AppendOrigin, ProducerStateManager
from highwater.storage.segment import (
    CLEANED_SUFFIX,
    DELETED_SUFFIX,
    INDEX_SUFFIX,
    INT32_MAX,
    LOG_SUFFIX,
    SNAPSHOT_SUFFIX,
    SWAP_SUFFIX,
    TIME_INDEX_SUFFIX,
    LogSegment,
    base_offset_of,
    file_name,
)
from highwater.storage.topic_partition import TopicPartition

log = logging.getLogger(__name__)

LEADER_EPOCH_CHECKPOINT = "leader-epoch-checkpoint"
QUORUM_STATE = "quorum-state"
"""The Raft election state, kept in ``__cluster_metadata-0/`` beside the metadata log."""
QUORUM_VOTERS = "quorum-voters"
"""A dynamic quorum's committed voter set, kept beside ``quorum-state``."""
_RAFT_SNAPSHOT = re.compile(r"^\d{20}-\d{10}\.checkpoint(\.part)?$")
"""Metadata snapshots (``<end offset>-<epoch>.checkpoint``), also kept beside that log."""
_SEGMENT_SUFFIXES = (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX)


def load_partition_log(
    directory: Path,
    config: LogConfig,
    *,
    log_start_offset: int = 0,
    recovery_point: int = 0,
    high_watermark: int = 0,
    had_clean_shutdown: bool = False,
    clock: Callable[[], int] = wall_clock_ms,
    producer_id_expiration_ms: int = 86_400_000,
) -> PartitionLog:
    """Open (creating if needed) the log in ``directory`` and recover it if it needs to."""
    topic_partition = TopicPartition.parse_dir_name(directory.name)
    directory.mkdir(parents=True, exist_ok=True)
    swap_bases = _settle_leftovers(directory)
    for base in sorted(swap_bases):
        _complete_swap(directory, base, config)
    segments = _open_segments(directory, config)
    if not segments:
        segments = [_new_segment(directory, log_start_offset, config, clock)]

    epoch_cache = LeaderEpochCache(
        LeaderEpochCheckpointFile(directory / LEADER_EPOCH_CHECKPOINT), write_through=False
    )
    # Recovery re-reads the unflushed tail anyway: it hands over the idempotent batches it
    # saw there, so producer state is not rebuilt by reading those segments a second time.
    recovered_from: int | None = None
    producer_batches: list[BatchHeader] = []
    try:
        if had_clean_shutdown:
            for segment in segments:
                _ensure_indexes(segment, config)
        else:
            segments, recovered_from, producer_batches = _recover(
                directory, segments, recovery_point, config, epoch_cache
            )
    except BaseException:
        for segment in segments:
            segment.close()
        raise

    emptied = log_start_offset > segments[-1].next_offset
    if emptied:
        segments = _delete_segments_below_log_start(
            directory, segments, log_start_offset, config, clock, epoch_cache
        )
        recovered_from, producer_batches = None, []
    log_end_offset = segments[-1].next_offset
    log_start_offset = max(log_start_offset, segments[0].base_offset)
    recovery_point = (
        min(recovery_point, log_end_offset)
        if had_clean_shutdown
        else min(max(recovery_point, log_start_offset), log_end_offset)
    )
    if had_clean_shutdown:
        recovery_point = log_end_offset

    epoch_cache.truncate_from_end(log_end_offset)
    epoch_cache.truncate_from_start(log_start_offset)

    producer_state = ProducerStateManager(directory, producer_id_expiration_ms)
    if emptied:
        producer_state.truncate_fully_and_start_at(log_start_offset)
    partition_log = PartitionLog(
        directory,
        topic_partition,
        config,
        segments,
        log_start_offset=log_start_offset,
        recovery_point=recovery_point,
        leader_epoch_cache=epoch_cache,
        producer_state=producer_state,
        clock=clock,
    )
    replay_from = max(producer_state.load(log_start_offset, log_end_offset), log_start_offset)
    scan_until = log_end_offset if recovered_from is None else recovered_from
    if replay_from < scan_until:
        for _, _, header in partition_log.iter_batches(replay_from):
            if header.base_offset >= scan_until:
                break
            if header.producer_id >= 0:
                producer_state.update(header, AppendOrigin.REPLICATION)
    for header in producer_batches:
        if header.base_offset >= replay_from:
            producer_state.update(header, AppendOrigin.REPLICATION)
    producer_state.advance_map_end_offset(log_end_offset)
    partition_log.update_high_watermark(high_watermark)
    if high_watermark > partition_log.log_end_offset:
        # Every offset below a checkpointed high watermark was committed: this copy lost
        # some. Its broker reports it, so that it is neither elected nor kept in the ISR
        # until it has them again (docs/chaos.md, the 98 lost writes).
        partition_log.lost_high_watermark = high_watermark
        log.warning(
            "%s: the log ends at %d, below its checkpointed high watermark %d: committed "
            "records were lost; this replica may not lead until it has fetched them again",
            directory,
            partition_log.log_end_offset,
            high_watermark,
        )
    return partition_log


# -- step 1: leftovers ----------------------------------------------------------------------


def _settle_leftovers(directory: Path) -> set[int]:
    """Remove what interrupted operations left behind; return the bases of ``.swap`` segments."""
    swap_bases: set[int] = set()
    names = {p.name for p in directory.iterdir()}
    for path in sorted(directory.iterdir()):
        name = path.name
        if path.is_dir():
            raise StrayFileError(f"{path}: unexpected directory inside a partition directory")
        if name.endswith(".tmp") or name.endswith(CLEANED_SUFFIX) or name.endswith(DELETED_SUFFIX):
            path.unlink()
            continue
        if name in (LEADER_EPOCH_CHECKPOINT, PARTITION_METADATA, QUORUM_STATE, QUORUM_VOTERS):
            continue
        if _RAFT_SNAPSHOT.match(name):
            continue
        base = base_offset_of(name)
        if base is None or name[20:] not in _known_suffixes():
            raise StrayFileError(
                f"{path}: not a file Highwater writes in a partition directory "
                f"(expected <20-digit offset>.log/.index/.timeindex/.snapshot); move it away"
            )
        if name.endswith(SWAP_SUFFIX):
            swap_bases.add(base)
            continue
        if (
            name.endswith((INDEX_SUFFIX, TIME_INDEX_SUFFIX))
            and file_name(base, LOG_SUFFIX) not in names
        ):
            log.warning("%s: removing index file without a log segment", path)
            path.unlink()
    return swap_bases


def _known_suffixes() -> set[str]:
    suffixes = {SNAPSHOT_SUFFIX}
    for suffix in _SEGMENT_SUFFIXES:
        suffixes.add(suffix)
        suffixes.add(suffix + SWAP_SUFFIX)
    return suffixes


def _complete_swap(directory: Path, base: int, config: LogConfig) -> None:
    """Finish a compaction swap: the ``.swap`` segment replaces the segments it covers."""
    if not (directory / file_name(base, LOG_SUFFIX + SWAP_SUFFIX)).exists():
        for suffix in (INDEX_SUFFIX, TIME_INDEX_SUFFIX):
            (directory / file_name(base, suffix + SWAP_SUFFIX)).unlink(missing_ok=True)
        return
    swap = LogSegment.for_config(
        directory,
        base,
        config,
        active=False,
        suffix=SWAP_SUFFIX,
    )
    try:
        # The swap segment was flushed before it was renamed: any invalid batch in it is
        # damage, not a torn write, and the segments it replaces must stay.
        swap.recover(max_batch_size=INT32_MAX, protect_below=2**63 - 1)
    except BaseException:
        swap.close()
        raise
    end = swap.next_offset
    for path in directory.glob(f"*{LOG_SUFFIX}"):
        other = base_offset_of(path.name)
        if other is not None and base <= other < end:
            for suffix in _SEGMENT_SUFFIXES:
                (directory / file_name(other, suffix)).unlink(missing_ok=True)
    swap.change_suffix(SWAP_SUFFIX, "")
    swap.close()
    log.info("%s: completed an interrupted compaction swap at offset %d", directory, base)


# -- step 2/3: segments ---------------------------------------------------------------------


def _delete_segments_below_log_start(
    directory: Path,
    segments: list[LogSegment],
    log_start_offset: int,
    config: LogConfig,
    clock: Callable[[], int],
    epoch_cache: LeaderEpochCache,
) -> list[LogSegment]:
    """The log ends below its checkpointed log start offset: start it empty there.

    Kafka's ``deleteSegmentsIfLogStartGreaterThanLogEnd``. Every offset below the log start
    was handed out before (DeleteRecords or retention moved the start up to the high
    watermark, and the tail above what survived here was lost in a crash): lowering the
    log start to the log end would give those offsets to new records. So every segment is
    deleted, the leader-epoch cache cleared, and an empty active segment started at the
    log start; the caller drops the producer state and its snapshots.
    """
    log.warning(
        "%s: the log ends at %d, below its checkpointed log start offset %d: deleting its "
        "%d segment(s) and starting it empty at the log start",
        directory,
        segments[-1].next_offset,
        log_start_offset,
        len(segments),
    )
    for segment in segments:
        segment.delete_files()
    epoch_cache.clear()
    epoch_cache.flush()
    return [_new_segment(directory, log_start_offset, config, clock)]


def _new_segment(
    directory: Path, base: int, config: LogConfig, clock: Callable[[], int]
) -> LogSegment:
    return LogSegment.for_config(
        directory,
        base,
        config,
        active=True,
        created_ms=clock(),
    )


def _open_segments(directory: Path, config: LogConfig) -> list[LogSegment]:
    bases = sorted(
        base
        for path in directory.glob(f"*{LOG_SUFFIX}")
        if (base := base_offset_of(path.name)) is not None
    )
    segments = []
    for i, base in enumerate(bases):
        segments.append(
            LogSegment.for_config(
                directory,
                base,
                config,
                active=i == len(bases) - 1,
            )
        )
    return segments


def _ensure_indexes(segment: LogSegment, config: LogConfig) -> None:
    """Check a trusted segment's indexes; rebuild them from the log when they are bad."""
    if segment.needs_index_rebuild:
        segment.rebuild_indexes()
        return
    try:
        segment.sanity_check()
    except (CorruptIndexError, CorruptSegmentError) as problem:
        log.warning("%s: rebuilding indexes: %s", segment.log_path, problem)
        segment.rebuild_indexes()


def _recover(
    directory: Path,
    segments: list[LogSegment],
    recovery_point: int,
    config: LogConfig,
    epoch_cache: LeaderEpochCache,
) -> tuple[list[LogSegment], int, list[BatchHeader]]:
    """Crash recovery: re-validate from the recovery point, cut the torn tail.

    The leader epochs of the re-validated batches are put back in the epoch cache: its
    checkpoint is written with the log's flushes, so it may lag the unflushed tail.
    Returns the segments kept, the base offset re-validation started at, and the headers
    of the idempotent producers' batches it found from there on.
    """
    producer_batches: list[BatchHeader] = []

    latest = -1

    def on_recovered_batch(header: BatchHeader) -> None:
        nonlocal latest
        epoch = header[2]  # partition leader epoch
        if epoch > latest:
            cached = epoch_cache.latest_epoch
            if cached is None or epoch > cached:
                epoch_cache.assign(epoch, header.base_offset)
            latest = epoch
        if header[9] >= 0:  # producer id
            producer_batches.append(header)

    first_unflushed = 0
    for i, segment in enumerate(segments):
        if segment.base_offset <= recovery_point:
            first_unflushed = i
    for segment in segments[:first_unflushed]:
        _ensure_indexes(segment, config)
    for i in range(first_unflushed, len(segments)):
        segment = segments[i]
        if i == first_unflushed:
            # Entries past what survives are re-derived from the batches below.
            epoch_cache.truncate_from_end(segment.base_offset)
        truncated = segment.recover(
            max_batch_size=max(config.max_message_bytes, config.segment_bytes),
            protect_below=recovery_point,
            on_batch=on_recovered_batch,
        )
        if not truncated:
            continue
        later = segments[i + 1 :]
        log.warning(
            "%s: truncated a torn tail of %d bytes at offset %d; removing %d later segment(s)",
            segment.log_path,
            truncated,
            segment.next_offset,
            len(later),
        )
        for doomed in later:
            doomed.delete_files()
        segments = segments[: i + 1]
        if not segment.active:
            segment.make_active()
        break
    return segments, segments[first_unflushed].base_offset, producer_batches
