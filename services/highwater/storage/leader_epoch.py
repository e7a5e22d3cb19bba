"""The leader epoch cache of one partition: epoch -> start offset, as Kafka's LeaderEpochFileCache.

Each entry says "leader epoch E wrote its first record at offset S". A follower that
(re)starts asks the leader for the end offset of its own latest epoch
(``OffsetsForLeaderEpoch``, answered by :meth:`LeaderEpochCache.end_offset_for`) and
truncates its log there, instead of to its high watermark: this is what keeps replicas
from losing acknowledged records or diverging after fast leader changes (KIP-101, KIP-279).

Both columns are kept strictly increasing. Every change is written to the partition's
``leader-epoch-checkpoint`` before the call returns (when the cache has a file).
"""

from __future__ import annotations

import bisect
import logging
import threading
from typing import Final

from highwater.storage.checkpoint import EpochEntry, LeaderEpochCheckpointFile

__all__ = [
    "UNDEFINED_EPOCH",
    "UNDEFINED_EPOCH_OFFSET",
    "EpochEntry",
    "LeaderEpochCache",
]

UNDEFINED_EPOCH: Final = -1
"""Kafka's ``OffsetsForLeaderEpochResponse.UNDEFINED_EPOCH``: no such epoch."""
UNDEFINED_EPOCH_OFFSET: Final = -1
"""Kafka's ``OffsetsForLeaderEpochResponse.UNDEFINED_EPOCH_OFFSET``: no end offset known."""

_log = logging.getLogger(__name__)


def _epoch_of(entry: EpochEntry) -> int:
    return entry.epoch


def _start_offset_of(entry: EpochEntry) -> int:
    return entry.start_offset


class LeaderEpochCache:
    """Ordered ``EpochEntry`` list with Kafka's assign, lookup and truncation rules.

    ``checkpoint`` is the partition's ``leader-epoch-checkpoint``, read once here and
    rewritten on every change; ``None`` keeps the cache in memory only (pure tests,
    simulations). Entries read from the file go through :meth:`assign`, so a file whose
    entries are out of order loads as Kafka would load it.

    With ``write_through=False`` a change only marks the cache dirty and :meth:`flush`
    writes the file: the partition log does that in its flush, off the event loop, and
    recovery re-derives the epochs of unflushed batches from their headers.
    """

    def __init__(
        self, checkpoint: LeaderEpochCheckpointFile | None, *, write_through: bool = True
    ) -> None:
        self._checkpoint = checkpoint
        self._write_through = write_through
        self._dirty = False
        self._entries: list[EpochEntry] = []
        self._lock = threading.RLock()
        if checkpoint is not None:
            for entry in checkpoint.read():
                self._assign(entry)

    # --- Reads -------------------------------------------------------------------------

    @property
    def entries(self) -> tuple[EpochEntry, ...]:
        with self._lock:
            return tuple(self._entries)

    @property
    def latest_entry(self) -> EpochEntry | None:
        with self._lock:
            return self._entries[-1] if self._entries else None

    @property
    def latest_epoch(self) -> int | None:
        """The epoch of the last entry: the epoch that is being (or was last) written."""
        entry = self.latest_entry
        return entry.epoch if entry is not None else None

    @property
    def earliest_entry(self) -> EpochEntry | None:
        with self._lock:
            return self._entries[0] if self._entries else None

    def __len__(self) -> int:
        return len(self._entries)

    def epoch_for_offset(self, offset: int) -> int | None:
        """The epoch that wrote ``offset``: that of the last entry starting at or before it.

        None if ``offset`` lies before the first entry (or the cache is empty). Offsets past
        the log end are attributed to the latest epoch; the caller bounds them.
        """
        with self._lock:
            epoch = None
            for entry in self._entries:
                if entry.start_offset > offset:
                    break
                epoch = entry.epoch
            return epoch

    def end_offset_for(self, requested_epoch: int, log_end_offset: int) -> tuple[int, int]:
        """Answer ``OffsetsForLeaderEpoch``: ``(epoch, end offset)`` for ``requested_epoch``.

        As Kafka's ``endOffsetFor``:

        * the requested epoch is the latest: ``(requested_epoch, log_end_offset)``;
        * ``UNDEFINED_EPOCH`` requested, an empty cache, or a requested epoch above every
          epoch in the cache: ``(UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET)``;
        * otherwise the end offset is the start offset of the first epoch greater than the
          requested one, and the epoch is the largest one ``<=`` the requested one, or the
          requested epoch itself when it is older than every cached epoch (the log start
          moved past its data; the follower truncates to where the leader's log begins).
        """
        with self._lock:
            if requested_epoch == UNDEFINED_EPOCH:
                return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
            if self._entries and self._entries[-1].epoch == requested_epoch:
                return requested_epoch, log_end_offset
            above = bisect.bisect_right(self._entries, requested_epoch, key=_epoch_of)
            if above == len(self._entries):
                return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
            end_offset = self._entries[above].start_offset
            if above == 0:
                return requested_epoch, end_offset
            return self._entries[above - 1].epoch, end_offset

    # --- Changes -----------------------------------------------------------------------

    def assign(self, epoch: int, start_offset: int) -> bool:
        """Record that ``epoch`` starts at ``start_offset``; True if the cache changed.

        A new epoch is appended. The latest epoch again is ignored, unless with a smaller
        start offset, which replaces it. Entries that would break the order (an epoch
        ``>=`` ``epoch`` or a start offset ``>=`` ``start_offset``) are removed first.
        """
        with self._lock:
            changed = self._assign(EpochEntry(epoch, start_offset))
            if changed:
                self._flush()
            return changed

    def truncate_from_end(self, end_offset: int) -> None:
        """Remove the entries starting at or after ``end_offset`` (the log was truncated there)."""
        with self._lock:
            if end_offset < 0 or not self._entries:
                return
            if self._entries[-1].start_offset < end_offset:
                return
            removed = []
            while self._entries and self._entries[-1].start_offset >= end_offset:
                removed.append(self._entries.pop())
            _log.debug("truncated %s from the end at offset %d", removed, end_offset)
            self._flush()

    def truncate_from_start(self, start_offset: int) -> None:
        """Forget what lies before a new log start offset ``start_offset``.

        Entries wholly before it are removed; the entry covering it now starts at it
        (``truncate_from_start(6)`` keeps an entry that starts at 6 as it is).
        """
        with self._lock:
            covering = bisect.bisect_right(self._entries, start_offset, key=_start_offset_of)
            if covering == 0:
                return
            updated = EpochEntry(self._entries[covering - 1].epoch, start_offset)
            if covering == 1 and self._entries[0] == updated:
                return
            removed = self._entries[:covering]
            self._entries[:covering] = [updated]
            _log.debug(
                "truncated %s from the start at offset %d, first entry now %s",
                removed,
                start_offset,
                updated,
            )
            self._flush()

    def clear(self) -> None:
        """Remove every entry (and empty the checkpoint file)."""
        with self._lock:
            self._entries.clear()
            self._flush()

    def __repr__(self) -> str:
        return f"LeaderEpochCache({list(self._entries)})"

    def _assign(self, entry: EpochEntry) -> bool:
        if entry.epoch < 0 or entry.start_offset < 0:
            raise ValueError(f"invalid leader epoch entry {entry}")
        latest = self._entries[-1] if self._entries else None
        if (
            latest is not None
            and latest.epoch == entry.epoch
            and latest.start_offset <= entry.start_offset
        ):
            return False
        removed = []
        while self._entries and (
            self._entries[-1].epoch >= entry.epoch
            or self._entries[-1].start_offset >= entry.start_offset
        ):
            removed.append(self._entries.pop())
        self._entries.append(entry)
        if len(removed) > 1 or (removed and removed[0].start_offset != entry.start_offset):
            # Only a removal of records' epochs is news: an epoch that wrote nothing (same
            # start offset as its successor) being replaced is the normal case.
            _log.warning("new epoch entry %s removed conflicting entries %s", entry, removed[::-1])
        return True

    def _flush(self) -> None:
        if self._checkpoint is None:
            return
        if self._write_through:
            self._checkpoint.write(self._entries)
        else:
            self._dirty = True

    def flush(self) -> None:
        """Write the checkpoint file if the cache changed since it was last written."""
        with self._lock:
            if self._dirty and self._checkpoint is not None:
                self._checkpoint.write(list(self._entries))
                self._dirty = False
