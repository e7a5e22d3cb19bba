"""The checker: a history in, the anomalies it shows out (pure: no I/O, no clock).

What it checks, from the clients' point of view (DESIGN.md §4):

- ``lost-write``: a write acknowledged (acks=all) is missing from the final read of its
  partition.
- ``duplicate``: a value is in the final log more than once (idempotent retries must
  not duplicate).
- ``offset-mismatch``: a value was acknowledged or read at one offset (or partition)
  and is at another in the final log: every reader sees a record at the same offset.
- ``reorder``: two values of one producer in one partition are in the log in the
  opposite order of their sequence numbers.
- ``read-then-vanished``: a consumer read a value that is not in the final log (it read
  above the high watermark, or the log was truncated below it).
- ``phantom-read``: a consumer read a value no producer ever wrote.
- ``committed-offset-backwards``: a group's committed offset for a partition, once
  committed (or observed), is later observed or committed lower.
- ``replica-divergence``: two replicas of a partition hold different bytes below the
  final high watermark once the cluster is healed.
- ``replica-behind``: once the cluster is healed, a replica lacks records below the
  high watermark (it did not catch up).
- ``unhandled-bad-input``: a fuzzed gRPC request (random fields, none, or bytes that do
  not decode) was answered ``UNKNOWN``: the server raised instead of giving a clear error;
  or a well-formed Kafka request made a broker's Kafka listener close the connection.
- ``process-exited``: a process of the cluster exited that the nemesis did not kill (it
  was found not running, with its exit status, when a fault was healed). A broker that
  stops after its disk was filled is failing safe, as Kafka's do, and is not reported.
- ``incomplete-final-read``: a partition written to has no final read, so its writes
  cannot be checked.
- ``quorum-not-whole``: once every fault is healed, a dynamic quorum's voter set is still
  not every controller's current incarnation (a controller whose data directory was
  deleted did not rejoin, or its former key stayed).

Each :class:`Anomaly` names the history lines that show it, the shortest excerpt of
the history for it: the write's invocation and acknowledgement, the reads involved and
the final-pass marker of the partition.
"""

from __future__ import annotations

import heapq
import itertools
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from highwater.chaos.history import Op

ANOMALY_KINDS = (
    "lost-write",
    "duplicate",
    "offset-mismatch",
    "reorder",
    "read-then-vanished",
    "phantom-read",
    "committed-offset-backwards",
    "replica-divergence",
    "replica-behind",
    "unhandled-bad-input",
    "process-exited",
    "incomplete-final-read",
    "quorum-not-whole",
)


@dataclass(frozen=True)
class Anomaly:
    kind: str
    detail: str
    lines: tuple[int, ...]
    """0-based indexes of the history operations that show it."""

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "detail": self.detail, "lines": [i + 1 for i in self.lines]}


@dataclass
class CheckResult:
    writes_attempted: int = 0
    writes_acknowledged: int = 0
    writes_failed: int = 0
    writes_lost: int = 0
    duplicates: int = 0
    reads: int = 0
    final_records: int = 0
    commits_acknowledged: int = 0
    fuzz_calls: int = 0
    longest_unavailability_s: float = 0.0
    unavailability_by_fault_s: dict[str, float] = field(default_factory=dict)
    """Per fault kind, the longest gap without an acknowledged write that overlapped a
    window of that kind (from the fault to its heal)."""
    anomalies: list[Anomaly] = field(default_factory=list)

    @property
    def valid(self) -> bool:
        return not self.anomalies


def _sequence(value: str) -> tuple[str, int] | None:
    """``(producer, sequence)`` of a workload value ``<producer>-<sequence>``."""
    producer, _, number = value.rpartition("-")
    if not producer or not number.isdigit():
        return None
    return producer, int(number)


def check(ops: list[Op]) -> CheckResult:
    """Every anomaly ``ops`` shows (see the module docstring), and the run's counts."""
    result = CheckResult()
    invokes: dict[str, int] = {}  # value -> index of its write invocation
    acks: dict[str, int] = {}  # value -> index of its acknowledgement
    written_partitions: set[int] = set()
    final_by_partition: dict[int, dict[int, tuple[str, int]]] = defaultdict(dict)
    final_markers: dict[int, int] = {}
    final_places: dict[str, list[tuple[int, int, int]]] = defaultdict(list)
    reads: list[int] = []
    offset_facts: list[tuple[float, float, str, int, int, int]] = []
    replicas: dict[int, list[int]] = defaultdict(list)
    ack_times: list[float] = []
    unhandled: dict[str, list[int]] = {}
    disk_full: set[str] = set()  # processes whose disk was filled since they last started
    invoke_times: list[float] = []
    down_windows = _down_windows(ops)

    for index, op in enumerate(ops):
        kind = op.get("kind")
        if kind == "write":
            status = op.get("status")
            value = str(op.get("value"))
            if status == "invoke":
                result.writes_attempted += 1
                invokes.setdefault(value, index)
                written_partitions.add(int(op["partition"]))
                invoke_times.append(float(op["t"]))
            elif status == "ok":
                result.writes_acknowledged += 1
                acks[value] = index
                ack_times.append(float(op["t"]))
            elif status == "fail":
                result.writes_failed += 1
        elif kind == "read":
            if op.get("process") == "final":
                partition, offset, value = int(op["partition"]), int(op["offset"]), op["value"]
                final_by_partition[partition][offset] = (str(value), index)
                final_places[str(value)].append((partition, offset, index))
                result.final_records += 1
            else:
                reads.append(index)
                result.reads += 1
        elif kind == "final":
            final_markers[int(op["partition"])] = index
        elif kind == "commit" and op.get("status") == "ok":
            result.commits_acknowledged += 1
            offset_facts.append(
                (
                    float(op["t_invoke"] if "t_invoke" in op else op["t"]),
                    float(op["t"]),
                    str(op["group"]),
                    int(op["partition"]),
                    int(op["offset"]),
                    index,
                )
            )
        elif kind == "committed":
            offset_facts.append(
                (
                    float(op["t_invoke"] if "t_invoke" in op else op["t"]),
                    float(op["t"]),
                    str(op["group"]),
                    int(op["partition"]),
                    int(op["offset"]),
                    index,
                )
            )
        elif kind == "replica":
            replicas[int(op["partition"])].append(index)
        elif kind == "fuzz":
            result.fuzz_calls += 1
            if _unhandled(op) and not _target_was_down(op, down_windows):
                unhandled.setdefault(str(op["method"]), []).append(index)
        elif kind == "fault" and op.get("fault") == "disk":
            disk_full.update(op.get("target", []))
        elif kind == "quorum" and not op.get("whole"):
            result.anomalies.append(
                Anomaly("quorum-not-whole", str(op.get("detail", "")), (index,))
            )
        elif kind == "restart":
            code = op.get("exit_code")
            failed_safe = any(name in disk_full for name in op["target"])
            disk_full.difference_update(op["target"])
            if code is not None and code != -9 and not failed_safe:
                result.anomalies.append(
                    Anomaly(
                        "process-exited",
                        f"{', '.join(op['target'])} exited with status {code} on its own",
                        (index,),
                    )
                )

    anomalies = result.anomalies

    def write_lines(value: str) -> list[int]:
        return [i for i in (invokes.get(value), acks.get(value)) if i is not None]

    # Partitions that were written to but never read back at the end.
    unchecked = {p for p in written_partitions if p not in final_markers}
    for partition in sorted(unchecked):
        anomalies.append(
            Anomaly(
                "incomplete-final-read",
                f"partition {partition} was written to but has no final read",
                (),
            )
        )

    # Duplicates in the final log.
    for value, places in final_places.items():
        if len(places) > 1:
            result.duplicates += len(places) - 1
            where = ", ".join(f"{p}@{o}" for p, o, _ in places)
            anomalies.append(
                Anomaly(
                    "duplicate",
                    f"value {value} is in the final log {len(places)} times ({where})",
                    tuple(sorted([*write_lines(value), *(i for _, _, i in places)])),
                )
            )

    # Acknowledged writes: present, once, at the acknowledged offset.
    for value, ack_index in acks.items():
        ack = ops[ack_index]
        partition, offset = int(ack["partition"]), int(ack["offset"])
        if partition in unchecked:
            continue
        places = final_places.get(value, [])
        if not places:
            result.writes_lost += 1
            at = final_by_partition[partition].get(offset)
            evidence = [at[1]] if at is not None else []
            anomalies.append(
                Anomaly(
                    "lost-write",
                    f"value {value} acknowledged at {partition}@{offset} is not in the final "
                    + (f"log ({at[0]} is at that offset)" if at is not None else "log"),
                    tuple(sorted({*write_lines(value), *evidence, final_markers[partition]})),
                )
            )
        elif (places[0][0], places[0][1]) != (partition, offset):
            anomalies.append(
                Anomaly(
                    "offset-mismatch",
                    f"value {value} acknowledged at {partition}@{offset} is at "
                    f"{places[0][0]}@{places[0][1]} in the final log",
                    tuple(sorted({*write_lines(value), places[0][2]})),
                )
            )

    # Reads by consumers agree with the final log.
    for index in reads:
        op = ops[index]
        value, partition, offset = str(op["value"]), int(op["partition"]), int(op["offset"])
        if value not in invokes:
            anomalies.append(
                Anomaly(
                    "phantom-read",
                    f"value {value} read at {partition}@{offset} was never written",
                    (index,),
                )
            )
            continue
        if partition not in final_markers:
            continue
        places = final_places.get(value, [])
        if not places:
            at = final_by_partition[partition].get(offset)
            evidence = [at[1]] if at is not None else [final_markers[partition]]
            anomalies.append(
                Anomaly(
                    "read-then-vanished",
                    f"{op['process']} read {value} at {partition}@{offset}; the final log "
                    + (f"has {at[0]} there" if at is not None else "does not hold it"),
                    tuple(sorted({*write_lines(value), index, *evidence})),
                )
            )
        elif (places[0][0], places[0][1]) != (partition, offset):
            anomalies.append(
                Anomaly(
                    "offset-mismatch",
                    f"{op['process']} read {value} at {partition}@{offset}; the final log "
                    f"has it at {places[0][0]}@{places[0][1]}",
                    tuple(sorted({index, places[0][2]})),
                )
            )

    # Per producer and partition, the log keeps the producer's order.
    by_producer: dict[tuple[str, int], list[tuple[int, int, int]]] = defaultdict(list)
    for value, places in final_places.items():
        parsed = _sequence(value)
        if parsed is None:
            continue
        partition, offset, index = places[0]
        by_producer[(parsed[0], partition)].append((parsed[1], offset, index))
    for (producer, partition), entries in sorted(by_producer.items()):
        entries.sort()
        for (seq_a, off_a, idx_a), (seq_b, off_b, idx_b) in itertools.pairwise(entries):
            if off_b < off_a:
                value_a, value_b = f"{producer}-{seq_a}", f"{producer}-{seq_b}"
                anomalies.append(
                    Anomaly(
                        "reorder",
                        f"{value_a} is at {partition}@{off_a} but the later {value_b} "
                        f"is at {partition}@{off_b}",
                        tuple(sorted({*write_lines(value_a), *write_lines(value_b), idx_a, idx_b})),
                    )
                )

    for method, indexes in sorted(unhandled.items()):
        anomalies.append(
            Anomaly(
                "unhandled-bad-input",
                f"{method} answered UNKNOWN (an unhandled exception), or closed the "
                f"connection, to {len(indexes)} fuzzed request(s)",
                (indexes[0],),
            )
        )
    anomalies.extend(_offsets_backwards(offset_facts))
    anomalies.extend(_replica_divergence(ops, replicas))
    result.longest_unavailability_s = _longest_gap(invoke_times, ack_times)
    result.unavailability_by_fault_s = _gaps_by_fault(invoke_times, ack_times, fault_windows(ops))
    return result


def _offsets_backwards(
    facts: list[tuple[float, float, str, int, int, int]],
) -> list[Anomaly]:
    """A committed offset known (committed or observed) by time T must not be seen or
    committed lower by an operation that started after T."""
    found: list[Anomaly] = []
    by_partition: dict[tuple[str, int], list[tuple[float, float, int, int]]] = defaultdict(list)
    for t_invoke, t_done, group, partition, offset, index in facts:
        by_partition[(group, partition)].append((t_invoke, t_done, offset, index))
    for (group, partition), entries in sorted(by_partition.items()):
        by_start = sorted(entries)
        done: list[tuple[float, int, int]] = [
            (t_done, offset, index) for _, t_done, offset, index in entries
        ]
        heapq.heapify(done)
        best: tuple[int, int] | None = None  # (offset, index) of the highest completed one
        for t_invoke, _, offset, index in by_start:
            while done and done[0][0] < t_invoke:
                _, known, known_index = heapq.heappop(done)
                if best is None or known > best[0]:
                    best = (known, known_index)
            if best is not None and offset < best[0]:
                found.append(
                    Anomaly(
                        "committed-offset-backwards",
                        f"group {group} partition {partition}: offset {best[0]} was committed, "
                        f"then {offset}",
                        (best[1], index),
                    )
                )
    return found


def _replica_divergence(ops: list[Op], replicas: dict[int, list[int]]) -> list[Anomaly]:
    """Replicas that reach the high watermark must hold the same bytes below it; one that
    does not reach it is behind."""
    found: list[Anomaly] = []
    for partition, indexes in sorted(replicas.items()):
        complete = []
        for i in indexes:
            op = ops[i]
            if "end_offset" in op and int(op["end_offset"]) < int(op["high_watermark"]):
                found.append(
                    Anomaly(
                        "replica-behind",
                        f"partition {partition}: broker {op['broker']} holds records up to "
                        f"{op['end_offset']} of {op['high_watermark']} after healing",
                        (i,),
                    )
                )
            else:
                complete.append(i)
        if len({str(ops[i]["digest"]) for i in complete}) > 1:
            described = ", ".join(
                f"broker {ops[i]['broker']}: {ops[i]['bytes']} bytes {str(ops[i]['digest'])[:12]}"
                for i in complete
            )
            found.append(
                Anomaly(
                    "replica-divergence",
                    f"partition {partition}: the replicas differ below the high watermark "
                    f"({described})",
                    tuple(complete),
                )
            )
    return found


def _unhandled(op: Op) -> bool:
    """Whether a fuzzed request was not handled: a gRPC one answered ``UNKNOWN`` (an
    exception nothing caught: a request that does not decode is INVALID_ARGUMENT,
    ``rpc/undecodable.py``), a well-formed Kafka one whose connection the broker closed."""
    code, mode = op.get("code"), op.get("mode")
    return code == "UNKNOWN" or (code == "CLOSED" and mode == "well-formed")


KILL_RECORD_SLACK_S = 1.0
"""A fault is recorded once it is done: an answer the kill cut off may be recorded just
before the kill is."""


def _down_windows(ops: Sequence[Op]) -> dict[str, list[tuple[float, float]]]:
    """Per process, when it was not running: from a kill or a wipe (or the fill of its
    disk, when it stopped then) to its heal, ``KILL_RECORD_SLACK_S`` earlier."""
    restarted_at_heal = {
        (name, round(float(op["t"]), 1))
        for op in ops
        if op.get("kind") == "restart"
        for name in op.get("target", [])
    }
    down: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for start, end, fault, targets in fault_windows(ops):
        for name in targets.split(","):
            stopped = fault in ("kill", "wipe") or (
                fault == "disk" and (name, round(end, 1)) in restarted_at_heal
            )
            if stopped:
                down[name].append((start - KILL_RECORD_SLACK_S, end))
    return down


def _target_was_down(op: Op, down: dict[str, list[tuple[float, float]]]) -> bool:
    """A fuzzed request whose target was killed (or stopped) while it was answered: the
    closed connection is the fault's, not the request's."""
    t = float(op["t"])
    return any(start <= t <= end for start, end in down.get(str(op.get("target")), ()))


def fault_windows(ops: Sequence[Op]) -> list[tuple[float, float, str, str]]:
    """(start, end, kind, targets) of each fault, from its ``fault`` and ``heal`` entries."""
    open_faults: dict[tuple[str, str], float] = {}
    windows = []
    end = max((float(op["t"]) for op in ops), default=0.0)
    for op in ops:
        if op.get("kind") in ("fault", "heal"):
            key = (str(op["fault"]), ",".join(op["target"]))
            if op["kind"] == "fault":
                open_faults[key] = float(op["t"])
            elif key in open_faults:
                windows.append((open_faults.pop(key), float(op["t"]), *key))
    windows += [(start, end, *key) for key, start in open_faults.items()]
    return sorted(windows)


def _gaps(invoke_times: list[float], ack_times: list[float]) -> list[tuple[float, float]]:
    """The times, while writes were being attempted, between one acknowledged write and
    the next (from the first attempt, to the last)."""
    if not invoke_times:
        return []
    start, end = min(invoke_times), max(invoke_times)
    points = sorted([start, *(t for t in ack_times if start <= t <= end), end])
    return list(itertools.pairwise(points))


def _longest_gap(invoke_times: list[float], ack_times: list[float]) -> float:
    """The longest time, while writes were being attempted, with no write acknowledged."""
    gaps = _gaps(invoke_times, ack_times)
    return round(max((b - a for a, b in gaps), default=0.0), 3)


def _gaps_by_fault(
    invoke_times: list[float],
    ack_times: list[float],
    windows: list[tuple[float, float, str, str]],
) -> dict[str, float]:
    """Per fault kind, the longest gap without an acknowledged write that overlaps one of
    its windows (:func:`fault_windows`): the unavailability that fault kind caused or took
    part in (a gap that spans two windows counts for both). A kind injected while no write
    was attempted is 0."""
    gaps = _gaps(invoke_times, ack_times)
    longest: dict[str, float] = {}
    for start, end, fault, _ in windows:
        overlapping = (b - a for a, b in gaps if a <= end and b >= start)
        longest[fault] = round(max(longest.get(fault, 0.0), max(overlapping, default=0.0)), 3)
    return dict(sorted(longest.items()))
