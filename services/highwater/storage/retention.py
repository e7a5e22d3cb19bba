"""Which leading segments retention may delete: by time, by total size, by log start offset.

Pure functions over a summary of the segments, so the rules are easy to test and to read:
they follow Kafka's ``UnifiedLog.deleteOldSegments``.

* Only a prefix of the log is ever deleted, and only segments that lie wholly below the
  high watermark (a segment's upper bound is the next segment's base offset, or the log end
  offset for the active segment).
* log start offset: a segment whose upper bound is at or below the log start offset
  (``DeleteRecords`` moves it), whatever the cleanup policy.
* ``retention.bytes``: the oldest segments, while the log stays at or above the limit
  without them.
* ``retention.ms``: a segment whose largest timestamp is older than ``now - retention.ms``.
* One pass applies all three, in that order (:func:`deletable_segments`).
* An empty active segment is never deleted; when every segment including the active one is
  to go, the log rolls a new active segment first.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass


class RetentionReason(enum.Enum):
    TIME = "retention.ms"
    SIZE = "retention.bytes"
    LOG_START_OFFSET = "log start offset"


@dataclass(frozen=True, slots=True)
class SegmentSummary:
    base_offset: int
    size: int
    largest_timestamp: int


def _deletable_prefix(
    segments: Sequence[SegmentSummary],
    log_end_offset: int,
    high_watermark: int,
    predicate: object,
) -> int:
    count = 0
    for i, segment in enumerate(segments):
        is_last = i == len(segments) - 1
        upper_bound = log_end_offset if is_last else segments[i + 1].base_offset
        if upper_bound > high_watermark:
            break
        if is_last and segment.size == 0:
            break
        if not predicate(segment, upper_bound):  # type: ignore[operator]
            break
        count += 1
    return count


def deletable_segments(
    segments: Sequence[SegmentSummary],
    *,
    now_ms: int,
    retention_ms: int,
    retention_bytes: int,
    delete_policy: bool,
    log_start_offset: int,
    log_end_offset: int,
    high_watermark: int,
) -> tuple[int, tuple[RetentionReason, ...]]:
    """How many leading segments to delete, and the rules that chose them, in order.

    Every rule applies in one pass, each to the segments the earlier ones left, in the
    order of Kafka's ``deleteOldSegments``: the log start offset, then (with ``delete``)
    ``retention.bytes`` over the size of what is left, then ``retention.ms``. A pass that
    only applied the first rule to delete anything would leave a log over its size limit
    until the next pass, ``log.retention.check.interval.ms`` later.
    """
    count = 0
    reasons: list[RetentionReason] = []

    def apply(reason: RetentionReason, predicate: object) -> None:
        nonlocal count
        deleted = _deletable_prefix(segments[count:], log_end_offset, high_watermark, predicate)
        if deleted:
            count += deleted
            reasons.append(reason)

    apply(RetentionReason.LOG_START_OFFSET, lambda _s, upper: upper <= log_start_offset)
    if delete_policy and retention_bytes >= 0:
        remaining = [sum(s.size for s in segments[count:]) - retention_bytes]

        def over_size(segment: SegmentSummary, _upper: int) -> bool:
            if remaining[0] - segment.size >= 0:
                remaining[0] -= segment.size
                return True
            return False

        if remaining[0] > 0:
            apply(RetentionReason.SIZE, over_size)
    if delete_policy and retention_ms >= 0:
        apply(
            RetentionReason.TIME,
            lambda s, _upper: now_ms - s.largest_timestamp > retention_ms,
        )
    return count, tuple(reasons)
