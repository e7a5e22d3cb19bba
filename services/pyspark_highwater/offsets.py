"""Offset planning for the Spark source: offset JSON, read limits, range splitting, data loss.

Everything here is pure: positions are ``{(topic, partition): offset}`` maps
(:data:`PartitionOffsets`), and the cluster's answers (earliest and latest offsets) come in as
arguments. The Spark glue (:mod:`pyspark_highwater.source`) asks the cluster and calls these.

Offsets are written as spark-sql-kafka writes them: ``{"orders": {"0": 23, "1": 40}}``, the
partition as a string key; in ``startingOffsets`` / ``endingOffsets`` -2 means earliest and
-1 latest. A streaming query's checkpoint holds the same JSON, one exclusive end offset per
partition: the offset of the next record to read.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

__all__ = [
    "EARLIEST",
    "LATEST",
    "DataLoss",
    "OffsetJsonError",
    "OffsetRange",
    "OffsetsWentBack",
    "PartitionOffsets",
    "TopicPartitionKey",
    "from_json_dict",
    "limit_total",
    "missing_partitions",
    "next_end",
    "offsets_went_back",
    "parse_offsets_json",
    "parse_timestamps_json",
    "plan_ranges",
    "reconcile_start",
    "records_waiting",
    "to_json_dict",
]

#: In offset JSON: the partition's earliest (log start) offset, and its latest (high
#: watermark), as in spark-sql-kafka.
EARLIEST: Final = -2
LATEST: Final = -1

TopicPartitionKey = tuple[str, int]
PartitionOffsets = dict[TopicPartitionKey, int]


class OffsetJsonError(ValueError):
    """Offset JSON that is not ``{"topic": {"partition": offset, ...}, ...}``."""


def parse_offsets_json(text: str, option: str, *, allow_logical: bool = True) -> PartitionOffsets:
    """Parse the offset JSON given as option ``option``; errors name the option and the fault.

    Offsets are >= 0, or with ``allow_logical`` -2 (earliest) and -1 (latest).
    """
    try:
        document = json.loads(text, object_pairs_hook=_Pairs)
    except json.JSONDecodeError as e:
        raise OffsetJsonError(
            f"{option}: not valid JSON ({e.msg} at character {e.pos}); expected "
            '{"topic": {"0": 23, "1": -2}, ...} or earliest / latest'
        ) from None
    return _offsets_from(document, option, allow_logical=allow_logical)


def parse_timestamps_json(text: str, option: str) -> PartitionOffsets:
    """Parse the per-partition times given as option ``option``
    (``{"topic": {"0": 1700000000000}}``, milliseconds since the epoch, as
    spark-sql-kafka's ``startingOffsetsByTimestamp``); errors name the option and the fault."""
    try:
        document = json.loads(text, object_pairs_hook=_Pairs)
    except json.JSONDecodeError as e:
        raise OffsetJsonError(
            f"{option}: not valid JSON ({e.msg} at character {e.pos}); expected "
            '{"topic": {"0": 1700000000000, "1": 1700000000000}, ...}'
        ) from None
    return _offsets_from(document, option, allow_logical=False, value="timestamp")


class _Pairs(list[tuple[str, Any]]):
    """A JSON object as its key/value pairs in order, keeping keys given twice (which
    ``json.loads`` would reduce to the last one without a word)."""

    def items(self) -> list[tuple[str, Any]]:
        return list(self)


def from_json_dict(document: Mapping[str, Any], what: str = "offset") -> PartitionOffsets:
    """The positions in a checkpointed offset dict (see :func:`to_json_dict`)."""
    return _offsets_from(document, what, allow_logical=False)


def _is_object(value: Any) -> bool:
    return isinstance(value, dict | _Pairs)


def _offsets_from(
    document: Any, option: str, *, allow_logical: bool, value: str = "offset"
) -> PartitionOffsets:
    if not _is_object(document):
        raise OffsetJsonError(
            f"{option}: expected a JSON object of topics, not {type(document).__name__}"
        )
    lowest = EARLIEST if allow_logical else 0
    offsets: PartitionOffsets = {}
    topics: set[str] = set()
    for topic, partitions in document.items():
        if not topic:
            raise OffsetJsonError(f"{option}: a topic name is empty")
        if topic in topics:
            raise OffsetJsonError(f"{option}: topic {topic!r} is given twice")
        topics.add(topic)
        if not _is_object(partitions):
            raise OffsetJsonError(
                f"{option}: topic {topic!r} must map partitions to {value}s, "
                f"not {type(partitions).__name__}"
            )
        for key, offset in partitions.items():
            try:
                partition = int(key)
            except ValueError:
                raise OffsetJsonError(
                    f"{option}: partition {key!r} of topic {topic!r} is not a number"
                ) from None
            if partition < 0:
                raise OffsetJsonError(f"{option}: partition {partition} of {topic!r} is < 0")
            if (topic, partition) in offsets:
                raise OffsetJsonError(
                    f"{option}: partition {partition} of topic {topic!r} is given twice"
                )
            if isinstance(offset, bool) or not isinstance(offset, int):
                raise OffsetJsonError(
                    f"{option}: the {value} of {topic}-{partition} must be an integer, "
                    f"not {offset!r}"
                )
            if offset < lowest:
                if value == "timestamp":
                    expected = "milliseconds since the epoch (>= 0)"
                elif allow_logical:
                    expected = "an offset >= 0, -2 (earliest) or -1 (latest)"
                else:
                    expected = "an offset >= 0"
                raise OffsetJsonError(
                    f"{option}: {topic}-{partition} has {value} {offset}; expected {expected}"
                )
            offsets[(topic, partition)] = offset
    return offsets


def to_json_dict(offsets: Mapping[TopicPartitionKey, int]) -> dict[str, dict[str, int]]:
    """``{"topic": {"partition": offset}}``, topics and partitions in order."""
    document: dict[str, dict[str, int]] = {}
    for (topic, partition), offset in sorted(offsets.items()):
        document.setdefault(topic, {})[str(partition)] = offset
    return document


@dataclass(frozen=True, slots=True)
class OffsetRange:
    """Records ``[start, end)`` of one partition: what one Spark task reads."""

    topic: str
    partition: int
    start: int
    end: int

    @property
    def size(self) -> int:
        """How many offsets the range covers."""
        return self.end - self.start


def plan_ranges(
    start: Mapping[TopicPartitionKey, int],
    end: Mapping[TopicPartitionKey, int],
    *,
    min_partitions: int | None = None,
    max_records_per_partition: int | None = None,
) -> list[OffsetRange]:
    """The ranges from ``start`` to ``end`` of each partition in ``end``, split for Spark.

    A partition missing from ``start`` is not read (the caller resolves new partitions first);
    empty ranges are dropped. As spark-sql-kafka does, when there are fewer ranges than
    ``min_partitions`` each is cut into pieces in proportion to its share of all the offsets,
    so that there are about ``min_partitions`` pieces; no piece covers more than
    ``max_records_per_partition`` offsets.
    """
    ranges = [
        OffsetRange(topic, partition, start[(topic, partition)], until)
        for (topic, partition), until in sorted(end.items())
        if (topic, partition) in start and until > start[(topic, partition)]
    ]
    total = sum(r.size for r in ranges)
    split: list[OffsetRange] = []
    for r in ranges:
        pieces = 1
        if min_partitions is not None and len(ranges) < min_partitions and total > 0:
            pieces = max(1, round(r.size * min_partitions / total))
        if max_records_per_partition is not None:
            pieces = max(pieces, math.ceil(r.size / max_records_per_partition))
        split.extend(_cut(r, min(pieces, r.size)))
    return split


def _cut(r: OffsetRange, pieces: int) -> list[OffsetRange]:
    """``r`` cut into ``pieces`` consecutive ranges whose sizes differ by at most one."""
    if pieces <= 1:
        return [r]
    base, extra = divmod(r.size, pieces)
    out = []
    at = r.start
    for i in range(pieces):
        until = at + base + (1 if i < extra else 0)
        out.append(OffsetRange(r.topic, r.partition, at, until))
        at = until
    return out


def limit_total(
    start: Mapping[TopicPartitionKey, int],
    latest: Mapping[TopicPartitionKey, int],
    max_records: int,
) -> PartitionOffsets:
    """End offsets that read at most ``max_records`` from ``start`` towards ``latest``.

    Each partition gets a share in proportion to what it has waiting (largest remainders
    get the leftover records), so all partitions advance together and the total is exactly
    ``min(max_records, waiting)``. Partitions missing from ``start`` start at their latest.
    """
    if max_records < 0:
        raise ValueError("max_records must be >= 0")
    waiting = {tp: max(0, until - start.get(tp, until)) for tp, until in latest.items()}
    total = sum(waiting.values())
    ends = {tp: start.get(tp, until) for tp, until in latest.items()}
    if total <= max_records:
        return {tp: ends[tp] + waiting[tp] for tp in latest}
    shares: dict[TopicPartitionKey, int] = {}
    remainders: list[tuple[float, TopicPartitionKey]] = []
    for tp, count in sorted(waiting.items()):
        exact = count * max_records / total
        shares[tp] = int(exact)
        remainders.append((exact - int(exact), tp))
    leftover = max_records - sum(shares.values())
    for _, tp in sorted(remainders, key=lambda item: (-item[0], item[1])):
        if leftover == 0:
            break
        if shares[tp] < waiting[tp]:
            shares[tp] += 1
            leftover -= 1
    return {tp: ends[tp] + shares[tp] for tp in latest}


def records_waiting(
    start: Mapping[TopicPartitionKey, int], latest: Mapping[TopicPartitionKey, int]
) -> int:
    """How many offsets lie between ``start`` and ``latest`` (partitions missing from
    ``start``, or whose latest is below it, count none)."""
    return sum(max(0, o - start.get(tp, o)) for tp, o in latest.items())


def next_end(
    start: Mapping[TopicPartitionKey, int],
    latest: Mapping[TopicPartitionKey, int],
    *,
    max_records: int | None = None,
    min_records: int | None = None,
    target: Mapping[TopicPartitionKey, int] | None = None,
) -> PartitionOffsets:
    """The end offsets of the next micro-batch, from ``start`` (every partition to read,
    new ones at their earliest offset) towards ``latest``.

    ``target`` (Trigger.AvailableNow) caps each partition and drops those it does not know;
    ``max_records`` shares that many records out (:func:`limit_total`); with
    ``min_records`` nothing is read until that many wait (except under a target, which must
    be reached). Every partition of ``start`` that is in ``latest`` stays in the result; one
    that is not (its topic was deleted) is left out, as spark-sql-kafka does: planning the
    micro-batch reports it (it is in the start, not in the end), and a topic created again
    under the name is a new one, read from its beginning. A partition whose latest
    offset is below its start (the topic was recreated, or its log truncated below what was
    read) ends there, below its start, whatever the limits: planning the batch reports it
    (:func:`offsets_went_back`) and the query goes on from the new offsets, as
    spark-sql-kafka does; keeping the old position would skip the new records below it
    without a word.
    """
    available = dict(latest)
    if target is not None:
        available = {tp: min(o, target[tp]) for tp, o in available.items() if tp in target}
    back = {tp: o for tp, o in available.items() if o < start.get(tp, o)}
    forward = {tp: o for tp, o in available.items() if tp not in back}
    if min_records is not None and records_waiting(start, forward) < min_records and target is None:
        forward = {}
    elif max_records is not None:
        forward = limit_total(start, forward, max_records)
    existing = {tp: o for tp, o in start.items() if tp in latest}
    return {**existing, **forward, **back}


@dataclass(frozen=True, slots=True)
class OffsetsWentBack:
    """A partition whose end offset is below the start of a micro-batch: the topic was
    deleted and created again under its name, or its log was truncated below what the query
    had read. Records may have been missed."""

    topic: str
    partition: int
    start: int
    end: int

    def describe(self) -> str:
        """A sentence for the error or the warning."""
        return (
            f"{self.topic}-{self.partition}: its offsets went back from {self.start} to "
            f"{self.end} (was the topic deleted and created again, or its log truncated?); "
            "records may have been missed"
        )


def offsets_went_back(
    begin: Mapping[TopicPartitionKey, int], until: Mapping[TopicPartitionKey, int]
) -> list[OffsetsWentBack]:
    """The partitions whose end in ``until`` is below their start in ``begin``."""
    return [
        OffsetsWentBack(tp[0], tp[1], begin[tp], end)
        for tp, end in sorted(until.items())
        if tp in begin and end < begin[tp]
    ]


@dataclass(frozen=True, slots=True)
class DataLoss:
    """Records of a partition that retention (or a deletion) removed before they were read."""

    topic: str
    partition: int
    wanted: int
    earliest: int

    def describe(self) -> str:
        """A sentence for the error or the warning."""
        return (
            f"{self.topic}-{self.partition}: offsets {self.wanted} to {self.earliest - 1} were "
            f"removed (retention or deleted records) before they were read; the log now "
            f"starts at {self.earliest}"
        )


def reconcile_start(
    start: Mapping[TopicPartitionKey, int], earliest: Mapping[TopicPartitionKey, int]
) -> tuple[PartitionOffsets, list[DataLoss]]:
    """Move each start offset below its partition's earliest offset up to it.

    Returns the adjusted start offsets and the losses found; the caller fails the query or
    goes on as ``failOnDataLoss`` says. Partitions without an earliest offset are kept.
    """
    adjusted: PartitionOffsets = {}
    losses: list[DataLoss] = []
    for tp, offset in start.items():
        low = earliest.get(tp)
        if low is not None and offset < low:
            losses.append(DataLoss(tp[0], tp[1], offset, low))
            adjusted[tp] = low
        else:
            adjusted[tp] = offset
    return adjusted, losses


def missing_partitions(
    known: Iterable[TopicPartitionKey], current: Iterable[TopicPartitionKey]
) -> list[TopicPartitionKey]:
    """Partitions in ``known`` that are gone from ``current`` (a deleted topic)."""
    now = set(current)
    return sorted(tp for tp in known if tp not in now)
