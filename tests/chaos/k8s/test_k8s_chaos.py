"""The Kubernetes chaos tests (``python -m highwater.chaos.kubernetes``), checked without a
cluster: there is none here (tests/chaos/k8s/README.md runs them against yours).

* the release's layout is read from the manifests the Helm chart really renders;
* the leaders are parsed from the real ``highwater topics describe`` and ``quorum
  describe`` formats;
* the driver's kubectl calls are run against a stand-in cluster (a function that answers
  as kubectl would and records what was asked), for each scenario and for failures;
* the checker's ``workload`` command runs for real against an embedded server.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from embedded_servers import ServerThread
from highwater.chaos.kubernetes import (
    Driver,
    Kubectl,
    KubectlError,
    active_controller,
    partition_leader,
    release_layout,
    under_replicated,
)

REPO = Path(__file__).resolve().parents[3]

DESCRIBE = (
    "Topic: chaos-k8s\tTopicId: abc\tPartitionCount: 3\tReplicationFactor: 3\tConfigs: \n"
    "\tTopic: chaos-k8s\tPartition: 0\tLeader: 101\tReplicas: 101,102,100\tIsr: 101,102,100\n"
    "\tTopic: chaos-k8s\tPartition: 1\tLeader: none\tReplicas: 102,100,101\tIsr: 102\t"
    "Offline: 100,101\n"
    "\tTopic: chaos-k8s\tPartition: 2\tLeader: 100\tReplicas: 100,101,102\tIsr: 100,101\n"
)
STATUS = (
    "ClusterId:              hw\nLeaderId:               2\nLeaderEpoch:            7\n"
    "HighWatermark:          99\n"
)


def chart_objects() -> list[dict[str, Any]]:
    """What ``helm install hw`` creates in namespace ``streams``, rendered by the chart."""
    spec = importlib.util.spec_from_file_location("deploy_render_k8s", REPO / "deploy/render.py")
    assert spec is not None and spec.loader is not None
    render = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(render)
    documents: list[dict[str, Any]] = render.documents(
        render.render({}, name="hw", namespace="streams")
    )
    return documents


def test_the_release_layout_is_read_from_what_the_chart_deploys() -> None:
    objects = chart_objects()
    config_maps = {"items": [d for d in objects if d["kind"] == "ConfigMap"]}
    others = {"items": [d for d in objects if d["kind"] in ("StatefulSet", "Service")]}
    layout = release_layout("hw", config_maps, others)
    assert layout.statefulsets == {
        "controller": "hw-highwater-controller",
        "broker": "hw-highwater-broker",
        "coordinator": "hw-highwater-coordinator",
    }
    assert layout.bootstrap == "hw-highwater:9092"
    assert layout.broker_pod(102) == "hw-highwater-broker-2"
    assert layout.controller_pod(1) == "hw-highwater-controller-1"
    assert layout.controllers == "hw-highwater-controller-headless:9093"
    with pytest.raises(KubectlError, match="no Highwater ConfigMap"):
        release_layout("other", {"items": []}, others)


def test_leaders_and_replication_are_parsed_from_the_tools_output() -> None:
    assert partition_leader(DESCRIBE, 0) == 101
    assert partition_leader(DESCRIBE, 1) is None
    assert partition_leader(DESCRIBE, 2) == 100
    assert under_replicated(DESCRIBE) == 2
    assert active_controller(STATUS) == 2
    assert active_controller("LeaderId:               -1\n") is None


class StandInCluster:
    """Answers kubectl calls as a healthy release ``hw`` would, and records them."""

    def __init__(self, *, lost: int = 0, fail_drain: bool = False) -> None:
        self.calls: list[list[str]] = []
        self.lost = lost
        self.fail_drain = fail_drain
        self.describes = 0

    def __call__(self, args: Sequence[str], _timeout_s: float) -> subprocess.CompletedProcess[str]:
        command = list(args)
        self.calls.append(command)
        rest = command[5:]  # after kubectl --namespace streams --context lab
        verb = rest[0]
        out, code, err = "", 0, ""
        if rest[:2] == ["get", "statefulset"]:
            out = json.dumps(
                {"spec": {"replicas": 3, "template": {"spec": {"containers": [{"image": "hw:1"}]}}}}
            )
        elif rest[:2] == ["get", "pods"]:
            component = command[-3].rsplit("=", 1)[1]
            out = json.dumps(
                {"items": [
                    {"metadata": {"name": f"hw-highwater-{component}-{i}"},
                     "spec": {"nodeName": f"node-{i}"}}
                    for i in range(2)
                ]}
            )  # fmt: skip
        elif verb == "exec" and "topics" in command:
            self.describes += 1
            # Under-replicated right after each fault, settled at the next look.
            out = (
                DESCRIBE
                if self.describes % 2
                else DESCRIBE.replace("Isr: 102\t", "Isr: 102,100,101\t").replace(
                    "Isr: 100,101\n", "Isr: 100,101,102\n"
                )
            )
        elif verb == "exec" and "quorum" in command:
            out = STATUS
        elif verb == "drain" and self.fail_drain:
            code, err = 1, "error: cannot evict pod as it would violate the pod's disruption budget"
        elif verb == "logs":
            summary = {"writes_acknowledged": 1000, "writes_lost": self.lost, "duplicates": 0,
                       "anomalies": [], "longest_unavailability_s": 4.5}  # fmt: skip
            out = "checker started\n" + json.dumps(summary) + "\n"
        return subprocess.CompletedProcess(command, code, out, err)

    def verbs(self) -> list[str]:
        return [" ".join(c[5:8]) for c in self.calls if c[5] not in ("get", "exec")]


def driver(cluster: StandInCluster) -> Driver:
    objects = chart_objects()
    layout = release_layout(
        "hw",
        {"items": [d for d in objects if d["kind"] == "ConfigMap"]},
        {"items": [d for d in objects if d["kind"] in ("StatefulSet", "Service")]},
    )
    kubectl = Kubectl("streams", context="lab", runner=cluster)
    return Driver(kubectl, layout, duration_s=60, echo=lambda _s: None, sleep=lambda _s: None)


def test_every_scenario_hits_its_target_and_waits_for_the_partitions_to_settle() -> None:
    cluster = StandInCluster()
    report = driver(cluster).run(["leader-broker", "controller", "coordinator", "drain", "scale"])
    assert all(
        c[:5] == ["kubectl", "--namespace", "streams", "--context", "lab"] for c in cluster.calls
    )
    run = next(c for c in cluster.calls if c[5] == "run")
    assert "--image=hw:1" in run and run[run.index("--bootstrap") + 1] == "hw-highwater:9092"
    assert run[run.index("--replication-factor") + 1] == "3"
    assert [f.target for f in report.faults] == [
        "hw-highwater-broker-1",  # broker 101 leads partition 0
        "hw-highwater-controller-2",  # controller 2 is the active one
        "hw-highwater-coordinator-0",
        "node/node-1",
        "statefulset/hw-highwater-broker 3 -> 4 -> 3",
    ]
    verbs = cluster.verbs()
    assert "delete pod hw-highwater-broker-1" in verbs
    assert "delete pod hw-highwater-controller-2" in verbs
    assert verbs.index("drain node-1 --ignore-daemonsets") < verbs.index("uncordon node-1")
    assert "scale statefulset/hw-highwater-broker --replicas=4" in verbs
    assert all(f.recovered_s is not None and not f.error for f in report.faults)
    assert report.passed
    summary = report.to_json()
    assert summary["writes_lost"] == 0 and summary["longest_unavailability_s"] == 4.5


def test_a_lost_write_or_a_failed_scenario_fails_the_report() -> None:
    lost = driver(StandInCluster(lost=2)).run(["coordinator"])
    assert not lost.passed and lost.to_json()["writes_lost"] == 2
    blocked = StandInCluster(fail_drain=True)
    report = driver(blocked).run(["drain"])
    assert "disruption budget" in report.faults[0].error and not report.passed
    assert "uncordon node-1" in blocked.verbs()  # the node is given back all the same


def test_the_checker_workload_runs_against_a_real_cluster(tmp_path: Path) -> None:
    server = ServerThread(tmp_path / "server")
    server.start()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "highwater.chaos.kubernetes", "workload",
             "--bootstrap", server.address, "--duration", "4", "--replication-factor", "1",
             "--history", str(tmp_path / "history.jsonl")],
            capture_output=True, text=True, timeout=180, check=False,
        )  # fmt: skip
    finally:
        server.stop()
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["writes_acknowledged"] > 0
    assert summary["writes_lost"] == 0 and summary["duplicates"] == 0
    assert summary["anomalies"] == []
    assert (tmp_path / "history.jsonl").stat().st_size > 0
