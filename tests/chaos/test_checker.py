"""The chaos checker on hand-made histories: a clean history passes, and each kind of
anomaly is found, with the history lines that show it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from highwater.chaos.checker import check
from highwater.chaos.history import HistoryWriter, Op, parse_lines, read_history

Clock = list[float]


class Builder:
    """A history built step by step, each operation one time unit after the last."""

    def __init__(self) -> None:
        self.ops: list[Op] = []
        self.t = 0.0

    def op(self, kind: str, process: str, **fields: Any) -> int:
        self.t += 1.0
        self.ops.append({"t": self.t, "kind": kind, "process": process, **fields})
        return len(self.ops) - 1

    def write(self, value: str, partition: int, offset: int | None) -> tuple[int, int]:
        """Invoke a write and acknowledge it at ``offset`` (None: it fails)."""
        process = "producer-" + value.split("-")[0][1:]
        invoke = self.op("write", process, status="invoke", value=value, partition=partition)
        if offset is None:
            done = self.op("write", process, status="fail", value=value, error="timed out")
        else:
            done = self.op(
                "write", process, status="ok", value=value, partition=partition, offset=offset
            )
        return invoke, done

    def read(self, process: str, partition: int, offset: int, value: str) -> int:
        return self.op("read", process, partition=partition, offset=offset, value=value)

    def final(self, partition: int, values: list[str]) -> int:
        for offset, value in enumerate(values):
            self.read("final", partition, offset, value)
        return self.op(
            "final", "final", partition=partition, high_watermark=len(values), records=len(values)
        )


def kinds(ops: list[Op]) -> list[str]:
    return [a.kind for a in check(ops).anomalies]


def test_a_clean_history_has_no_anomaly_and_counts_its_writes() -> None:
    h = Builder()
    h.write("p0-0", 0, 0)
    h.write("p0-1", 0, 1)
    h.write("p1-0", 0, 2)
    h.write("p1-1", 0, None)  # failed, and not written: allowed
    h.read("consumer-0", 0, 0, "p0-0")
    h.read("consumer-1", 0, 0, "p0-0")  # a re-read after a rebalance: same offset
    h.final(0, ["p0-0", "p0-1", "p1-0"])
    result = check(h.ops)
    assert result.anomalies == []
    assert (result.writes_acknowledged, result.writes_failed, result.writes_lost) == (3, 1, 0)
    assert result.duplicates == 0


def test_a_failed_write_that_did_land_is_no_anomaly() -> None:
    h = Builder()
    h.write("p0-0", 0, None)
    h.final(0, ["p0-0"])
    assert kinds(h.ops) == []


def test_a_lost_write_is_found_with_its_acknowledgement_and_the_final_read() -> None:
    h = Builder()
    h.write("p0-0", 0, 0)
    invoke, ack = h.write("p0-1", 0, 1)
    h.write("p0-2", 0, 2)
    h.write("p1-0", 0, None)  # failed, but landed where p0-1 was
    marker = h.final(0, ["p0-0", "p1-0", "p0-2"])
    result = check(h.ops)
    assert [a.kind for a in result.anomalies] == ["lost-write"]
    assert result.writes_lost == 1
    lost = result.anomalies[0]
    assert "p0-1" in lost.detail
    assert invoke in lost.lines and ack in lost.lines and marker in lost.lines
    # The shortest excerpt: the write, what is at its offset now, the final marker.
    assert len(lost.lines) == 4


def test_a_duplicate_is_found() -> None:
    h = Builder()
    h.write("p0-0", 0, 0)
    h.write("p0-1", 0, 1)
    h.final(0, ["p0-0", "p0-1", "p0-1"])
    result = check(h.ops)
    assert [a.kind for a in result.anomalies] == ["duplicate"]
    assert result.duplicates == 1


def test_a_reorder_of_one_producers_writes_is_found() -> None:
    h = Builder()
    h.write("p0-0", 0, None)
    h.write("p0-1", 0, None)
    h.final(0, ["p0-1", "p0-0"])
    assert kinds(h.ops) == ["reorder"]


def test_an_acknowledged_offset_that_moved_is_found() -> None:
    h = Builder()
    h.write("p0-0", 0, 0)
    h.write("p1-0", 0, 0)  # two acknowledgements of one offset: one of them moved
    h.final(0, ["p1-0", "p0-0"])
    assert kinds(h.ops) == ["offset-mismatch"]


def test_readers_that_disagree_on_an_offset_are_found() -> None:
    h = Builder()
    h.write("p0-0", 0, None)
    h.write("p0-1", 0, None)
    h.read("consumer-0", 0, 0, "p0-1")
    h.final(0, ["p0-0", "p0-1"])
    assert kinds(h.ops) == ["offset-mismatch"]


def test_a_read_that_later_vanished_is_found() -> None:
    h = Builder()
    h.write("p0-0", 0, 0)
    h.write("p0-1", 0, None)  # never acknowledged, but a consumer saw it...
    read = h.read("consumer-0", 0, 1, "p0-1")
    h.write("p0-2", 0, 1)
    h.final(0, ["p0-0", "p0-2"])  # ...and it is gone: truncated away
    result = check(h.ops)
    assert [a.kind for a in result.anomalies] == ["read-then-vanished"]
    assert read in result.anomalies[0].lines


def test_a_read_of_a_value_nobody_wrote_is_found() -> None:
    h = Builder()
    h.write("p0-0", 0, 0)
    h.read("consumer-0", 0, 1, "p9-9")
    h.final(0, ["p0-0"])
    assert kinds(h.ops) == ["phantom-read"]


def test_committed_offsets_going_backwards_are_found() -> None:
    h = Builder()
    h.write("p0-0", 0, 0)
    h.final(0, ["p0-0"])
    first = h.op("commit", "consumer-0", group="g", partition=0, offset=5, status="ok")
    h.op("committed", "observer", group="g", partition=0, offset=5)
    h.op("commit", "consumer-1", group="g", partition=1, offset=2, status="ok")  # other key
    later = h.op("committed", "observer", group="g", partition=0, offset=3)
    result = check(h.ops)
    assert [a.kind for a in result.anomalies] == ["committed-offset-backwards"]
    assert result.anomalies[0].lines == (first, later)


def test_an_observation_concurrent_with_a_commit_may_see_the_older_offset() -> None:
    def offset(kind: str, t_invoke: float, t: float, value: int) -> Op:
        fields = {"status": "ok"} if kind == "commit" else {}
        process = "consumer-0" if kind == "commit" else "observer"
        return {
            "t": t,
            "t_invoke": t_invoke,
            "kind": kind,
            "process": process,
            "group": "g",
            "partition": 0,
            "offset": value,
            **fields,
        }

    ops = [
        offset("commit", 0.0, 1.0, 3),
        offset("commit", 1.5, 4.0, 7),
        offset("committed", 2.0, 3.0, 3),  # ran while the commit of 7 was in flight
        offset("committed", 5.0, 5.5, 7),
    ]
    assert kinds(ops) == []
    ops.append(offset("committed", 6.0, 6.5, 3))  # after both: backwards
    assert kinds(ops) == ["committed-offset-backwards"]


def test_replicas_that_differ_are_found() -> None:
    h = Builder()
    h.write("p0-0", 0, 0)
    h.final(0, ["p0-0"])
    for broker, digest in ((100, "aa"), (101, "aa"), (102, "bb")):
        h.op("replica", "replicas", broker=broker, partition=0, digest=digest, bytes=70)
    result = check(h.ops)
    assert [a.kind for a in result.anomalies] == ["replica-divergence"]
    assert len(result.anomalies[0].lines) == 3


def test_a_replica_that_did_not_catch_up_is_behind_not_divergent() -> None:
    h = Builder()
    h.write("p0-0", 0, 0)
    h.write("p0-1", 0, 1)
    h.final(0, ["p0-0", "p0-1"])
    for broker, digest, end in ((100, "aa", 2), (101, "aa", 2), (102, "cc", 1)):
        h.op(
            "replica",
            "replicas",
            broker=broker,
            partition=0,
            digest=digest,
            bytes=70,
            end_offset=end,
            high_watermark=2,
        )
    assert kinds(h.ops) == ["replica-behind"]


def test_a_partition_written_to_but_never_read_back_cannot_pass() -> None:
    h = Builder()
    h.write("p0-0", 0, 0)
    h.write("p0-1", 1, 0)
    h.final(0, ["p0-0"])
    result = check(h.ops)
    assert [a.kind for a in result.anomalies] == ["incomplete-final-read"]
    assert result.writes_lost == 0  # unknown, not lost


def test_the_longest_unavailability_is_the_longest_gap_without_an_acknowledgement() -> None:
    ops: list[Op] = [
        {
            "t": 0.0,
            "kind": "write",
            "process": "producer-0",
            "status": "invoke",
            "value": "p0-0",
            "partition": 0,
        },
        {
            "t": 0.5,
            "kind": "write",
            "process": "producer-0",
            "status": "ok",
            "value": "p0-0",
            "partition": 0,
            "offset": 0,
        },
        {
            "t": 1.0,
            "kind": "write",
            "process": "producer-0",
            "status": "invoke",
            "value": "p0-1",
            "partition": 0,
        },
        {
            "t": 9.0,
            "kind": "write",
            "process": "producer-0",
            "status": "ok",
            "value": "p0-1",
            "partition": 0,
            "offset": 1,
        },
        {
            "t": 9.5,
            "kind": "write",
            "process": "producer-0",
            "status": "invoke",
            "value": "p0-2",
            "partition": 0,
        },
    ]
    assert check(ops).longest_unavailability_s == 8.5


def test_a_history_file_round_trips(tmp_path: Path) -> None:
    writer = HistoryWriter(tmp_path / "history.jsonl")
    writer.record("write", "producer-0", status="invoke", value="p0-0", partition=0)
    writer.record("note", "setup", text="x")
    writer.close()
    ops = read_history(tmp_path / "history.jsonl")
    assert [op["kind"] for op in ops] == ["write", "note"]
    assert ops == writer.ops
    assert parse_lines([json.dumps(ops[0]), ""]) == ops[:1]


def test_the_unavailability_of_each_fault_kind_is_the_longest_gap_overlapping_its_windows() -> None:
    b = Builder()
    b.write("p0-0", 0, 0)  # t 1-2
    fault = {"fault": "kill", "target": ["broker-100"]}
    b.op("fault", "nemesis", **fault)  # t 3
    b.op("heal", "nemesis", **fault)  # t 4
    b.write("p0-1", 0, 1)  # t 5-6: acknowledged 4 s after the last: overlaps the kill
    b.op("fault", "nemesis", fault="pause", target=["broker-101"])  # t 7, never healed
    b.write("p0-2", 0, 2)  # t 8-9
    b.t += 10
    b.write("p0-3", 0, 3)  # invoked at t 20, the last attempt: 11 s during the pause
    b.op("fault", "nemesis", fault="disk", target=["broker-102"])  # t 22: no write after it
    b.op("heal", "nemesis", fault="disk", target=["broker-102"])
    b.final(0, ["p0-0", "p0-1", "p0-2", "p0-3"])
    result = check(b.ops)
    assert result.longest_unavailability_s == 11.0
    assert result.unavailability_by_fault_s == {"disk": 0.0, "kill": 4.0, "pause": 11.0}
