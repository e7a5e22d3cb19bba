"""Short real chaos runs: ``python -m highwater.chaos run`` against a real cluster of one
controller, three brokers and a coordinator, with kills, pauses and fuzzed requests to
every endpoint, then with network partitions; the JSON summary on the last line shows no
lost write and no anomaly, and every process and namespace the run made is gone
afterwards."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from highwater.chaos.history import read_history
from highwater.chaos.network import namespaces_available

# Minutes of real processes each: `make chaos` runs them (pytest -m chaos), `make test` not.
pytestmark = [pytest.mark.timeout(300), pytest.mark.chaos]

SUMMARY_KEYS = {
    "seed",
    "duration_s",
    "faults_injected",
    "writes_acknowledged",
    "writes_lost",
    "duplicates",
    "anomalies",
    "longest_unavailability_s",
}


def netns_list() -> set[str]:
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False)
    return {line.split()[0] for line in listed.stdout.splitlines() if line.strip()}


def chaos_run(out: Path, seed: int, duration: int, faults: str, *extra: str) -> dict[str, Any]:
    command = [
        sys.executable,
        "-m",
        "highwater.chaos",
        "run",
        "--seed",
        str(seed),
        "--duration",
        str(duration),
        "--faults",
        faults,
        "--out",
        str(out),
        *extra,
    ]
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as harness:
        try:
            stdout, stderr = harness.communicate(timeout=240)
        except subprocess.TimeoutExpired:
            # SIGTERM: the harness stops its cluster and removes its namespaces first.
            harness.send_signal(signal.SIGTERM)
            stdout, stderr = harness.communicate(timeout=60)
            raise AssertionError(f"the run did not finish in time: {stderr[-3000:]}") from None
    lines = stdout.strip().splitlines()
    assert lines, stderr[-3000:]
    summary: dict[str, Any] = json.loads(lines[-1])
    assert set(summary) >= SUMMARY_KEYS
    assert summary["anomalies"] == [], stderr[-5000:]
    assert harness.returncode == 0
    return summary


def started_pids(out: Path) -> list[int]:
    return [
        int(pid)
        for op in read_history(out / "history.jsonl")
        if op["kind"] in ("note", "restart")
        for pid in [*re.findall(r"pid (\d+)", op.get("text", "")), str(op.get("pid", ""))]
        if pid
    ]


def assert_all_stopped(pids: list[int]) -> None:
    assert pids
    for pid in pids:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        # Still there: only as a zombie of another process would be acceptable; it is not.
        raise AssertionError(f"process {pid} started by the run is still running")


def test_kills_pauses_and_fuzzing_lose_no_acknowledged_write(tmp_path: Path) -> None:
    out = tmp_path / "run"
    summary = chaos_run(out, 1, 30, "kill,pause", "--fuzz", "10")
    assert summary["seed"] == 1
    assert summary["faults_injected"] >= 2
    assert summary["writes_acknowledged"] > 100
    assert summary["writes_lost"] == 0 and summary["duplicates"] == 0
    ops = read_history(out / "history.jsonl")
    injected = {op["fault"] for op in ops if op["kind"] == "fault"}
    assert injected == {"kill", "pause"}
    # Acknowledged writes were consumed by the group, and its offsets were committed.
    assert any(op["kind"] == "read" and op["process"].startswith("consumer") for op in ops)
    assert any(op["kind"] == "commit" and op["status"] == "ok" for op in ops)
    assert {op["broker"] for op in ops if op["kind"] == "replica"} == {100, 101, 102}
    assert (out / "timeline.svg").read_text().startswith("<svg")
    # Every service was fuzzed while the clients ran, and no well-formed request got an
    # unhandled error (the checker would have reported it).
    fuzzed = [op for op in ops if op["kind"] == "fuzz"]
    assert summary["fuzz_calls"] == len(fuzzed) > 50
    grpc_fuzzed = [op for op in fuzzed if op["method"].startswith("/")]
    services = {op["method"].split("/")[1] for op in grpc_fuzzed}
    assert services == {
        "highwater.v1.Broker",
        "highwater.internal.v1.Controller",
        "highwater.v1.GroupCoordinator",
        "highwater.internal.v1.Raft",
        "highwater.internal.v1.ReplicaFetchService",
    }
    # The brokers' Kafka listeners too: well-formed requests were answered.
    kafka_fuzzed = [op for op in fuzzed if op["method"].startswith("kafka:")]
    assert len(grpc_fuzzed) + len(kafka_fuzzed) == len(fuzzed)
    assert any(op["mode"] == "well-formed" and op["code"] == "ANSWERED" for op in kafka_fuzzed)
    assert_all_stopped(started_pids(out))


def test_partitions_lose_no_acknowledged_write(tmp_path: Path) -> None:
    before = netns_list()
    out = tmp_path / "run"
    summary = chaos_run(out, 9, 25, "partition")
    ops = read_history(out / "history.jsonl")
    injected = [op["fault"] for op in ops if op["kind"] == "fault"]
    if namespaces_available() is None:
        # One broker cut off, then the controller and a broker together.
        assert [op["target"] for op in ops if op["kind"] == "fault"] == [
            ["broker-101"],
            ["broker-100", "controller-1"],
        ]
    else:  # the harness says so and falls back to process faults
        assert any("namespaces unavailable" in op.get("text", "") for op in ops)
        assert set(injected) <= {"kill"}
    assert summary["writes_lost"] == 0 and summary["duplicates"] == 0
    assert summary["writes_acknowledged"] > 100
    assert_all_stopped(started_pids(out))
    assert netns_list() <= before, "the run left network namespaces behind"


def test_a_dynamic_quorum_whose_controllers_lose_their_volumes_rejoins_and_loses_nothing(
    tmp_path: Path,
) -> None:
    """Three controllers in a dynamic quorum set up as the Helm chart does; the ``wipe``
    fault kills a controller or a broker and deletes its data directory. A controller's
    new incarnation replaces its former key by itself (auto-join), a broker fetches its
    replicas again, while the clients write. At the end every controller's current
    incarnation is a voter (the checker's ``quorum`` entry), and nothing acknowledged is
    lost."""
    out = tmp_path / "run"
    summary = chaos_run(out, 5, 45, "wipe,kill", "--controllers", "3", "--quorum", "dynamic")
    assert summary["writes_lost"] == 0 and summary["duplicates"] == 0
    assert summary["writes_acknowledged"] > 100
    ops = read_history(out / "history.jsonl")
    wiped = [
        op for op in ops if op["kind"] == "fault" and op["fault"] == "wipe"
        and "data directory deleted" in op["detail"]
    ]  # fmt: skip
    assert wiped, [op for op in ops if op["kind"] == "fault"]
    (quorum,) = [op for op in ops if op["kind"] == "quorum"]
    assert quorum["whole"] and sorted(v["id"] for v in quorum["voters"]) == [1, 2, 3]
    assert {op["target"][0].partition("-")[0] for op in wiped} <= {"controller", "broker"}
    # Each wiped controller came back as a new incarnation, now the voter of its id.
    wiped = [op for op in wiped if op["target"][0].startswith("controller-")]
    assert wiped
    former = {
        op["target"][0]: op["detail"].rsplit("directory id ", 1)[1].rstrip(")") for op in wiped
    }
    current = {f"controller-{v['id']}": v["directory_id"] for v in quorum["voters"]}
    assert all(current[name] != directory for name, directory in former.items())
    assert_all_stopped(started_pids(out))
