"""Which leading segments retention may delete: by time, by total size, by log start offset.

Pure functions over a summary of the segments, so the rules are easy to test and to read:
they follow Kafka's ``UnifiedLog.deleteOldSegments``.

* Only a prefix of the log is ever deleted, and only segments that lie wholly below the
  high watermark (a segment's upper bound is the next segment's base offset, or the log end
  offset for the active segment).
* ``retention.ms``: a segment whose largest timestamp is older than ``now - retention.ms``.
* ``retention.bytes``: the oldest segments, while the log stays above the limit without them.
* log start offset: a segment whose upper bound is at or below the log start offset
  (``DeleteRecords`` moves it), whatever the cleanup policy.
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
) -> tuple[int, RetentionReason | None]:
    """How many leading segments to delete, and the rule that chose them."""
    if not segments:
        return 0, None
    if delete_policy and retention_ms >= 0:
        count = _deletable_prefix(
            segments,
            log_end_offset,
            high_watermark,
            lambda s, _upper: now_ms - s.largest_timestamp > retention_ms,
        )
        if count:
            return count, RetentionReason.TIME
    if delete_policy and retention_bytes >= 0:
        excess = sum(s.size for s in segments) - retention_bytes
        if excess > 0:
            remaining = [excess]

            def over_size(segment: SegmentSummary, _upper: int) -> bool:
                if remaining[0] - segment.size >= 0:
                    remaining[0] -= segment.size
                    return True
                return False

            count = _deletable_prefix(segments, log_end_offset, high_watermark, over_size)
            if count:
                return count, RetentionReason.SIZE
    count = _deletable_prefix(
        segments,
        log_end_offset,
        high_watermark,
        lambda _s, upper: upper <= log_start_offset,
    )
    if count:
        return count, RetentionReason.LOG_START_OFFSET
    return 0, None
