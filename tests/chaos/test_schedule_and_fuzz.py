"""The seeded schedule reproduces from its seed and keeps its promises; the fuzzer's
requests cover every endpoint and random ones are well-formed messages."""

from __future__ import annotations

import random
import re
import struct
from pathlib import Path

import pytest
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass
from highwater.chaos.checker import check
from highwater.chaos.fuzz import MODES, endpoints, random_message, request_bytes
from highwater.chaos.history import Op
from highwater.chaos.kafka_fuzz import KAFKA_MODES, kafka_request
from highwater.chaos.schedule import FAULT_KINDS, build_schedule, parse_faults

PROCESSES = ["controller-1", "broker-100", "broker-101", "broker-102", "coordinator-200"]
BROKERS = PROCESSES[1:4]


def test_the_same_seed_gives_the_same_schedule_and_another_seed_another() -> None:
    def schedule(seed: int) -> list[dict[str, object]]:
        windows = build_schedule(
            seed, 300, FAULT_KINDS, PROCESSES, brokers=BROKERS, disk_brokers=["broker-101"]
        )
        return [w.to_json() for w in windows]

    assert schedule(7) == schedule(7)
    assert schedule(7) != schedule(8)


@pytest.mark.parametrize("seed", range(20))
def test_windows_do_not_overlap_fit_the_run_and_pauses_outlast_the_session(seed: int) -> None:
    windows = build_schedule(
        seed, 200, FAULT_KINDS, PROCESSES, brokers=BROKERS, disk_brokers=["broker-101"]
    )
    assert windows
    end = 0.0
    for window in windows:
        assert window.start_s >= end
        end = window.start_s + window.duration_s
        assert end <= 200
        assert set(window.targets) <= set(PROCESSES)
        assert len(window.targets) == (len(set(window.targets)))
        assert len(window.targets) == 1 or (window.kind == "partition" and len(window.targets) == 2)
        if window.kind == "pause":
            assert window.duration_s > 9.0  # the session timeouts
        if window.kind == "disk":
            assert window.targets == ("broker-101",)


def test_disk_faults_need_a_broker_with_a_small_disk() -> None:
    windows = build_schedule(3, 200, ["disk"], PROCESSES, brokers=BROKERS)
    assert windows == []


def test_wipes_hit_only_the_processes_given_and_change_no_other_schedule() -> None:
    controllers = ["controller-1", "controller-2", "controller-3"]
    processes = [*controllers, *PROCESSES[1:]]
    kinds = ["kill", "pause", "wipe"]
    windows = build_schedule(11, 600, kinds, processes, brokers=BROKERS, wipe_targets=controllers)
    wipes = [w for w in windows if w.kind == "wipe"]
    assert wipes and all(len(w.targets) == 1 and w.targets[0] in controllers for w in wipes)
    assert all(1.0 <= w.duration_s <= 6.0 for w in wipes)  # down as long as a kill
    # Nothing to wipe: the kind is left out, and the other kinds' schedule is the one a
    # run without it had.
    without = build_schedule(11, 600, ["kill", "pause"], processes, brokers=BROKERS)
    assert build_schedule(11, 600, kinds, processes, brokers=BROKERS) == without


def test_the_checker_reports_a_dynamic_quorum_that_did_not_become_whole_again() -> None:
    def quorum(whole: bool) -> Op:
        detail = (
            "every controller's current incarnation is a voter"
            if whole
            else "the voters are 1:aaaa, 2:bbbb, 3:cccc; the controllers are 1:dddd, 2:bbbb"
        )
        return {
            "t": 90.0,
            "kind": "quorum",
            "process": "teardown",
            "whole": whole,
            "detail": detail,
        }

    assert check([quorum(True)]).anomalies == []
    (anomaly,) = check([quorum(False)]).anomalies
    assert anomaly.kind == "quorum-not-whole" and "1:aaaa" in anomaly.detail
    assert anomaly.lines == (0,)


def test_a_request_to_a_wiped_controller_while_it_is_down_is_not_bad_input() -> None:
    wipe = {"fault": "wipe", "target": ["controller-2"]}

    def at(t: float, kind: str, **fields: object) -> Op:
        return {"t": t, "kind": kind, "process": "nemesis", **fields}

    closed = {"target": "controller-2", "method": "/highwater.internal.v1.Raft/DescribeQuorum",
              "mode": "random", "code": "UNKNOWN"}  # fmt: skip
    history = [
        at(10.0, "fault", **wipe),
        at(10.5, "fuzz", **closed),
        at(13.0, "heal", **wipe),
        at(13.0, "restart", target=["controller-2"], exit_code=-9),
    ]
    assert check(history).anomalies == []
    assert [a.kind for a in check([*history, at(20.0, "fuzz", **closed)]).anomalies] == [
        "unhandled-bad-input"
    ]


def test_fault_kinds_are_parsed_and_checked() -> None:
    assert parse_faults("kill, pause,kill") == ("kill", "pause")
    assert parse_faults("none") == ()
    with pytest.raises(ValueError, match="unknown fault kind 'flood'"):
        parse_faults("kill,flood")


def test_the_fuzzer_covers_every_method_of_every_service() -> None:
    """Every ``rpc`` the .proto files declare, read from their text."""
    protos = Path(__file__).resolve().parents[2] / "protos" / "highwater"
    declared = set()
    for package, name in (
        ("v1", "broker"),
        ("internal/v1", "controller"),
        ("v1", "coordinator"),
        ("internal/v1", "raft"),
        ("internal/v1", "replication"),
    ):
        text = (protos / package / f"{name}.proto").read_text()
        service = re.search(r"^service (\w+)", text, re.MULTILINE)
        assert service is not None
        full = "highwater." + package.replace("/", ".")
        declared |= {
            f"/{full}.{service.group(1)}/{rpc}"
            for rpc in re.findall(r"^\s*rpc (\w+)\(", text, re.MULTILINE)
        }
    assert {e.path for e in endpoints()} == declared
    assert "/highwater.internal.v1.Raft/FetchStream" in declared
    assert "/highwater.internal.v1.ReplicaFetchService/ReplicaFetch" in declared


def test_random_requests_are_well_formed_and_the_others_are_not_always() -> None:
    rng = random.Random(1)
    for endpoint in endpoints():
        cls = GetMessageClass(endpoint.request)
        for _ in range(10):
            message = random_message(endpoint.request, rng)
            assert cls.FromString(message.SerializeToString()) == message
        for mode in MODES:
            data = request_bytes(endpoint, mode, rng)
            assert isinstance(data, bytes)
            if mode == "empty":
                assert data == b""


def test_the_checker_reports_unhandled_errors_to_fuzzed_requests() -> None:
    def fuzz(mode: str, code: str) -> Op:
        return {
            "t": 1.0,
            "kind": "fuzz",
            "process": "fuzzer",
            "target": "broker-100",
            "method": "/highwater.v1.Broker/Fetch",
            "mode": mode,
            "size": 3,
            "code": code,
        }

    # Bytes that do not decode are an INVALID_ARGUMENT (rpc/undecodable.py); UNKNOWN to
    # any fuzzed request, decodable or not, is an exception nothing caught.
    assert [
        a.kind for a in check([fuzz("garbage", "INVALID_ARGUMENT"), fuzz("random", "OK")]).anomalies
    ] == []
    result = check([fuzz("random", "UNKNOWN"), fuzz("empty", "UNKNOWN")])
    assert [a.kind for a in result.anomalies] == ["unhandled-bad-input"]
    assert result.fuzz_calls == 2
    garbled = check([fuzz("garbage", "UNKNOWN"), fuzz("truncated", "UNKNOWN")])
    assert [a.kind for a in garbled.anomalies] == ["unhandled-bad-input"]


def test_the_checker_reports_a_well_formed_kafka_request_whose_connection_was_closed() -> None:
    def fuzz(mode: str, code: str) -> Op:
        return {
            "t": 1.0,
            "kind": "fuzz",
            "process": "fuzzer",
            "target": "broker-100",
            "method": "kafka:18v0",
            "mode": mode,
            "size": 20,
            "code": code,
        }

    fine = [fuzz("garbage", "CLOSED"), fuzz("oversize", "CLOSED"), fuzz("well-formed", "ANSWERED")]
    assert check(fine).anomalies == []
    faults = [fuzz("well-formed", "TIMEOUT"), fuzz("well-formed", "UNREACHABLE")]
    assert check(faults).anomalies == []  # a paused or killed broker
    result = check([fuzz("well-formed", "CLOSED")])
    assert [a.kind for a in result.anomalies] == ["unhandled-bad-input"]


def test_a_kafka_connection_closed_by_a_kill_of_its_broker_is_not_bad_input() -> None:
    """Seed 5 of the campaign: a well-formed request in flight when the nemesis killed its
    broker was recorded 14 ms after the kill, with its connection closed."""

    def at(t: float, kind: str, **fields: object) -> Op:
        return {"t": t, "kind": kind, "process": "nemesis", **fields}

    def closed(t: float) -> Op:
        return at(
            t, "fuzz", target="broker-101", method="kafka:3v1", mode="well-formed", code="CLOSED"
        )

    kill = {"fault": "kill", "target": ["broker-101"]}
    history = [
        closed(48.5),  # recorded just before the kill was
        at(48.86, "fault", **kill),
        closed(48.87),
        at(54.1, "heal", **kill),
        at(54.1, "restart", target=["broker-101"], exit_code=-9),
    ]
    assert check(history).anomalies == []
    after = check([*history, closed(60.0)])  # the broker runs again: it closed on its own
    assert [a.kind for a in after.anomalies] == ["unhandled-bad-input"]
    assert after.anomalies[0].lines == (5,)


@pytest.mark.parametrize("mode", KAFKA_MODES)
def test_every_kafka_fuzz_mode_makes_a_framed_request(mode: str) -> None:
    rng = random.Random(3)
    for correlation_id in range(20):
        what, frame = kafka_request(mode, rng, correlation_id)
        (size,) = struct.unpack(">i", frame[:4])
        if mode == "oversize":
            assert size < 0 or size > 104_857_600
        else:
            assert size == len(frame) - 4
        if mode == "well-formed":
            assert what in ("18v0", "3v1")


def test_the_checker_reports_a_process_that_exited_on_its_own() -> None:
    killed: Op = {
        "t": 1.0,
        "kind": "restart",
        "process": "nemesis",
        "target": ["broker-100"],
        "pid": 10,
        "exit_code": -9,
    }
    crashed: Op = {
        "t": 2.0,
        "kind": "restart",
        "process": "nemesis",
        "target": ["broker-101"],
        "pid": 11,
        "exit_code": 1,
    }
    assert [a.kind for a in check([killed, crashed]).anomalies] == ["process-exited"]


def test_a_broker_that_stops_after_its_disk_filled_is_not_reported() -> None:
    disk: Op = {
        "t": 1.0,
        "kind": "fault",
        "process": "nemesis",
        "fault": "disk",
        "target": ["broker-100"],
        "detail": "",
    }
    stopped: Op = {
        "t": 2.0,
        "kind": "restart",
        "process": "nemesis",
        "target": ["broker-100"],
        "pid": 12,
        "exit_code": 1,
    }
    later: Op = {**stopped, "t": 9.0, "pid": 13}
    assert check([disk, stopped]).anomalies == []
    # Once restarted, exiting again without a new disk fault is reported.
    assert [a.kind for a in check([disk, stopped, later]).anomalies] == ["process-exited"]


def _id_values(message: Message) -> list[int]:
    """Every integer held by a field named as an id, at any depth of ``message``."""
    found: list[int] = []
    for field, value in message.ListFields():
        named_as_id = field.name == "id" or field.name.endswith(("_id", "_ids"))
        values = list(value) if _repeated_value(value) else [value]
        for item in values:
            if isinstance(item, Message):
                found.extend(_id_values(item))
            elif named_as_id and isinstance(item, int) and not isinstance(item, bool):
                found.append(item)
    return found


def _repeated_value(value: object) -> bool:
    return not isinstance(value, (str, bytes, Message)) and hasattr(value, "__len__")


def test_random_requests_never_name_a_node_of_the_cluster() -> None:
    """A well-formed RemoveRaftVoter, RegisterBroker or UnregisterBroker naming one of the
    cluster's nodes is an operator's call, not bad input: the fuzzer never makes one."""
    nodes = frozenset({1, 2, 3, 100, 101, 102, 200, 201})
    rng = random.Random(7)
    drawn: list[int] = []
    for endpoint in endpoints():
        for _ in range(30):
            drawn.extend(_id_values(random_message(endpoint.request, rng, avoid_ids=nodes)))
    assert drawn and not nodes & set(drawn)
    # The ids still take boundary values other than the nodes' (0, -1, the int32 limits).
    assert {0, -1, 2**31 - 1} <= set(drawn)
    remove = next(e for e in endpoints() if e.path.endswith("/RemoveRaftVoter"))
    voter_ids = set()
    for _ in range(300):
        request = GetMessageClass(remove.request).FromString(
            request_bytes(remove, "random", rng, avoid_ids=nodes)
        )
        voter_ids.add(request.voter_id)
    assert not nodes & voter_ids
    # Without the nodes to avoid, the same draws do name them (the test can fail).
    unguarded = {random_message(remove.request, random.Random(i)).voter_id for i in range(300)}
    assert nodes & unguarded
