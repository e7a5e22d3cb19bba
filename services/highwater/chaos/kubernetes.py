"""Chaos tests of a Highwater release on a real Kubernetes cluster, driven by kubectl.

Two commands, ``python -m highwater.chaos.kubernetes ...``:

* ``run --release R [--namespace N] [--duration S] [--scenarios ...]``, on an operator's
  machine with kubectl pointed at the cluster: it starts the checker as a pod of the
  release's own image inside the cluster (clients must reach the brokers' pod addresses),
  then, while the checker's producers and group consumers run, carries out each scenario
  in turn with kubectl — ``leader-broker`` (delete the pod of the broker leading partition
  0 of the checker's topic), ``controller`` (the active controller's pod), ``coordinator``
  (a coordinator's pod), ``drain`` (drain the node of a broker pod, then uncordon it),
  ``scale`` (one broker more, until it is ready, then back) — waiting after each until
  every partition is fully replicated again. At the end it prints a JSON report: the
  faults with their times and, from the checker, ``writes_acknowledged``,
  ``writes_lost`` (must be 0), ``duplicates``, ``anomalies`` and
  ``longest_unavailability_s``; exit code 1 when anything was lost or anomalous.
* ``workload --bootstrap HOST:PORT --duration S``, what the checker pod runs: the chaos
  harness's workload (:class:`~highwater.chaos.workload.Workload`: idempotent acks=all
  producers writing unique values, consumers in a group committing offsets, every
  operation in a history) against an existing cluster, then the final read and the
  history checker (:func:`~highwater.chaos.checker.check`); the last line it prints is
  the JSON summary.

The pure parts — reading kubectl's JSON, the release's layout from its ConfigMap and the
leaders from ``highwater`` tools' output, the report — are functions here that tests run
without a cluster. ``tests/chaos/k8s/README.md`` tells how to run it against your own.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click

from highwater.chaos.checker import check
from highwater.chaos.history import HistoryWriter
from highwater.chaos.run import summarize
from highwater.chaos.workload import Workload, WorkloadConfig

__all__ = [
    "SCENARIOS",
    "Kubectl",
    "ReleaseLayout",
    "active_controller",
    "main",
    "partition_leader",
    "release_layout",
]

SCENARIOS = ("leader-broker", "controller", "coordinator", "drain", "scale")
CHECKER_TOPIC = "chaos-k8s"
INSTANCE_LABEL = "app.kubernetes.io/instance"
COMPONENT_LABEL = "app.kubernetes.io/component"


class KubectlError(RuntimeError):
    """A kubectl call failed; the message carries its command line and stderr."""


# --- the release, as the cluster shows it (pure) -----------------------------------------


@dataclass(frozen=True)
class ReleaseLayout:
    """Where a release's processes are: StatefulSets, id offsets, ports, the bootstrap."""

    release: str
    config_map: dict[str, str]
    statefulsets: dict[str, str]
    """Component (controller, broker, coordinator) -> StatefulSet name."""
    bootstrap: str
    """The client Service's HOST:PORT, as pods reach it."""

    def broker_pod(self, node_id: int) -> str:
        offset = int(self.config_map["BROKER_NODE_ID_OFFSET"])
        return f"{self.statefulsets['broker']}-{node_id - offset}"

    def controller_pod(self, node_id: int) -> str:
        offset = int(self.config_map["CONTROLLER_NODE_ID_OFFSET"])
        return f"{self.statefulsets['controller']}-{node_id - offset}"

    @property
    def controllers(self) -> str:
        """HOST:PORT of the controllers' headless Service (any voter answers)."""
        return f"{self.config_map['CONTROLLER_HEADLESS']}:{self.config_map['CONTROLLER_PORT']}"


def release_layout(
    release: str, config_maps: dict[str, Any], objects: dict[str, Any]
) -> ReleaseLayout:
    """The layout from ``kubectl get configmaps -l instance=R -o json`` and
    ``kubectl get statefulsets,services -l instance=R -o json``."""
    config = next(
        (
            c["data"]
            for c in config_maps.get("items", [])
            if "BROKER_NODE_ID_OFFSET" in c.get("data", {})
        ),
        None,
    )
    if config is None:
        raise KubectlError(f"release {release!r}: no Highwater ConfigMap (is it installed here?)")
    statefulsets: dict[str, str] = {}
    bootstrap = ""
    for item in objects.get("items", []):
        labels = item["metadata"].get("labels", {})
        component = labels.get(COMPONENT_LABEL, "")
        if item["kind"] == "StatefulSet" and component:
            statefulsets[component] = item["metadata"]["name"]
        elif (
            item["kind"] == "Service"
            and component == "broker"
            and item["spec"].get("clusterIP") != "None"
        ):
            port = item["spec"]["ports"][0]["port"]
            bootstrap = f"{item['metadata']['name']}:{port}"
    missing = {"controller", "broker", "coordinator"} - set(statefulsets)
    if missing or not bootstrap:
        raise KubectlError(
            f"release {release!r}: missing {sorted(missing) or 'the client Service'}"
        )
    return ReleaseLayout(release, dict(config), statefulsets, bootstrap)


_LEADER = re.compile(r"\tPartition: (\d+)\tLeader: (\d+|none)\t")


def partition_leader(describe_output: str, partition: int = 0) -> int | None:
    """The leader of ``partition`` in ``highwater topics describe`` output (None: none)."""
    for match in _LEADER.finditer(describe_output):
        if int(match.group(1)) == partition:
            return None if match.group(2) == "none" else int(match.group(2))
    return None


_QUORUM_LEADER = re.compile(r"^LeaderId:\s+(\d+)\s*$", re.MULTILINE)


def active_controller(quorum_status: str) -> int | None:
    """``LeaderId`` in ``highwater quorum describe --status`` output."""
    match = _QUORUM_LEADER.search(quorum_status)
    return int(match.group(1)) if match else None


def under_replicated(describe_output: str) -> int:
    """Partitions in ``highwater topics describe`` output whose ISR is not all replicas."""
    count = 0
    for line in describe_output.splitlines():
        fields = dict(part.split(": ", 1) for part in line.strip().split("\t") if ": " in part)
        if "Replicas" in fields and "Isr" in fields:
            replicas = set(fields["Replicas"].split(","))
            isr = set(fields["Isr"].split(",")) if fields["Isr"] else set()
            count += replicas != isr
    return count


@dataclass
class FaultRecord:
    scenario: str
    target: str
    started_s: float
    recovered_s: float | None = None
    error: str = ""


@dataclass
class Report:
    faults: list[FaultRecord] = field(default_factory=list)
    checker: dict[str, Any] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return (
            bool(self.checker)
            and self.checker.get("writes_lost", 1) == 0
            and not self.checker.get("anomalies")
            and not any(f.error for f in self.faults)
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "faults": [vars(f) for f in self.faults],
            **{k: self.checker.get(k) for k in (
                "writes_acknowledged", "writes_lost", "duplicates", "anomalies",
                "longest_unavailability_s",
            )},
            "passed": self.passed,
        }  # fmt: skip


# --- kubectl (the edge) ------------------------------------------------------------------


Runner = Callable[[Sequence[str], float], "subprocess.CompletedProcess[str]"]


def _run_process(args: Sequence[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(args), capture_output=True, text=True, timeout=timeout_s, check=False
    )


class Kubectl:
    """kubectl in one namespace (and context); every call's failure is a KubectlError."""

    def __init__(
        self,
        namespace: str,
        *,
        context: str | None = None,
        kubectl: str = "kubectl",
        runner: Runner = _run_process,
    ) -> None:
        self.prefix = [kubectl, "--namespace", namespace]
        if context:
            self.prefix += ["--context", context]
        self._runner = runner

    def __call__(self, *args: str, timeout_s: float = 120) -> str:
        command = [*self.prefix, *args]
        done = self._runner(command, timeout_s)
        if done.returncode != 0:
            raise KubectlError(f"{shlex.join(command)}: {done.stderr.strip()[-500:]}")
        return done.stdout

    def json(self, *args: str) -> dict[str, Any]:
        result: dict[str, Any] = json.loads(self(*args, "-o", "json"))
        return result


# --- the driver ------------------------------------------------------------------------


class Driver:
    """One chaos run against release ``layout`` (see the module docstring)."""

    def __init__(
        self,
        kubectl: Kubectl,
        layout: ReleaseLayout,
        *,
        duration_s: float,
        settle_timeout_s: float = 300,
        echo: Callable[[str], None] = print,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.kubectl = kubectl
        self.layout = layout
        self.duration_s = duration_s
        self.settle_timeout_s = settle_timeout_s
        self.echo = echo
        self.clock = clock
        self.sleep = sleep
        self.checker_pod = f"{layout.release}-chaos-checker"
        self.report = Report()
        self._origin = clock()

    # -- the checker pod --

    def start_checker(self) -> None:
        broker_set = self.kubectl.json("get", "statefulset", self.layout.statefulsets["broker"])
        image = broker_set["spec"]["template"]["spec"]["containers"][0]["image"]
        with contextlib.suppress(KubectlError):
            self.kubectl("delete", "pod", self.checker_pod, "--ignore-not-found", "--wait=true")
        self.kubectl(
            "run", self.checker_pod, f"--image={image}", "--restart=Never",
            f"--labels={INSTANCE_LABEL}={self.layout.release},{COMPONENT_LABEL}=chaos-checker",
            "--command", "--", "python", "-m", "highwater.chaos.kubernetes", "workload",
            "--bootstrap", self.layout.bootstrap, "--duration", str(int(self.duration_s)),
            "--replication-factor", str(min(3, int(broker_set["spec"]["replicas"]))),
        )  # fmt: skip
        self.kubectl("wait", "--for=condition=Ready", f"pod/{self.checker_pod}", "--timeout=300s")
        self._origin = self.clock()

    def checker_summary(self) -> dict[str, Any]:
        """Wait for the checker to finish; its summary (the last line of its log)."""
        self.kubectl(
            "wait", "--for=jsonpath={.status.phase}=Succeeded", f"pod/{self.checker_pod}",
            f"--timeout={int(self.duration_s + 600)}s",
        )  # fmt: skip
        log = self.kubectl("logs", self.checker_pod)
        lines = [line for line in log.strip().splitlines() if line.startswith("{")]
        if not lines:
            raise KubectlError(f"the checker printed no summary:\n{log[-2000:]}")
        summary: dict[str, Any] = json.loads(lines[-1])
        return summary

    def _tool(self, *args: str) -> str:
        """A ``highwater`` command run in the checker pod (which reaches the pods)."""
        return self.kubectl("exec", self.checker_pod, "--", "highwater", *args)

    def _describe(self) -> str:
        return self._tool(
            "topics", "describe", "--bootstrap-server", self.layout.bootstrap,
            "--topic", CHECKER_TOPIC,
        )  # fmt: skip

    def _elapsed(self) -> float:
        return round(self.clock() - self._origin, 1)

    # -- scenarios --

    def wait_settled(self) -> None:
        """Until every partition of the checker's topic is fully replicated again."""
        deadline = self.clock() + self.settle_timeout_s
        while True:
            with contextlib.suppress(KubectlError):
                if under_replicated(self._describe()) == 0:
                    return
            if self.clock() > deadline:
                raise KubectlError("partitions still under-replicated after the settle timeout")
            self.sleep(2)

    def leader_broker(self) -> str:
        leader = partition_leader(self._describe())
        if leader is None:
            raise KubectlError("partition 0 has no leader to delete")
        pod = self.layout.broker_pod(leader)
        self.kubectl("delete", "pod", pod, "--wait=false")
        return pod

    def controller(self) -> str:
        status = self._tool(
            "quorum", "describe", "--controllers", self.layout.controllers, "--status"
        )
        leader = active_controller(status)
        if leader is None:
            raise KubectlError("no active controller found")
        pod = self.layout.controller_pod(leader)
        self.kubectl("delete", "pod", pod, "--wait=false")
        return pod

    def coordinator(self) -> str:
        pods = self._pods("coordinator")
        pod = pods[0]["metadata"]["name"]
        self.kubectl("delete", "pod", pod, "--wait=false")
        return pod

    def drain(self) -> str:
        pods = self._pods("broker")
        node = pods[-1]["spec"]["nodeName"]
        try:
            self.kubectl(
                "drain", node, "--ignore-daemonsets", "--delete-emptydir-data",
                f"--timeout={int(self.settle_timeout_s)}s", timeout_s=self.settle_timeout_s + 30,
            )  # fmt: skip
        finally:
            self.kubectl("uncordon", node)
        return f"node/{node}"

    def scale(self) -> str:
        name = self.layout.statefulsets["broker"]
        count = int(self.kubectl.json("get", "statefulset", name)["spec"]["replicas"])
        self.kubectl("scale", f"statefulset/{name}", f"--replicas={count + 1}")
        self.kubectl(
            "rollout", "status", f"statefulset/{name}", f"--timeout={int(self.settle_timeout_s)}s",
            timeout_s=self.settle_timeout_s + 30,
        )  # fmt: skip
        # The new broker holds no replicas: scaling back down loses nothing.
        self.kubectl("scale", f"statefulset/{name}", f"--replicas={count}")
        return f"statefulset/{name} {count} -> {count + 1} -> {count}"

    def _pods(self, component: str) -> list[dict[str, Any]]:
        selector = f"{INSTANCE_LABEL}={self.layout.release},{COMPONENT_LABEL}={component}"
        items: list[dict[str, Any]] = self.kubectl.json("get", "pods", "-l", selector)["items"]
        if not items:
            raise KubectlError(f"no {component} pods")
        return sorted(items, key=lambda p: p["metadata"]["name"])

    def run(self, scenarios: Sequence[str]) -> Report:
        self.start_checker()
        self.sleep(min(30.0, self.duration_s / (len(scenarios) + 2)))  # traffic first
        actions = {
            "leader-broker": self.leader_broker,
            "controller": self.controller,
            "coordinator": self.coordinator,
            "drain": self.drain,
            "scale": self.scale,
        }
        for scenario in scenarios:
            record = FaultRecord(scenario, "", self._elapsed())
            self.report.faults.append(record)
            try:
                record.target = actions[scenario]()
                self.echo(f"[{record.started_s:7.1f}s] {scenario}: {record.target}")
                self.wait_settled()
                record.recovered_s = self._elapsed()
            except KubectlError as e:
                record.error = str(e)
                self.echo(f"[{record.started_s:7.1f}s] {scenario} failed: {e}")
        self.report.checker = self.checker_summary()
        with contextlib.suppress(KubectlError):
            self.kubectl("delete", "pod", self.checker_pod, "--wait=false")
        return self.report


# --- the in-cluster workload -----------------------------------------------------------


async def run_workload(
    bootstrap: str, duration_s: float, history_path: Path, *, replication_factor: int = 3
) -> dict[str, Any]:
    """The workload against ``bootstrap`` for ``duration_s`` (its topic with
    ``replication_factor`` replicas, min.insync.replicas one less, at least 1), then the
    final read and the check; the summary (as the local harness's, no faults of its own)."""
    history = HistoryWriter(history_path)
    config = WorkloadConfig(
        topic=CHECKER_TOPIC,
        group=f"{CHECKER_TOPIC}-group",
        replication_factor=replication_factor,
        min_insync_replicas=max(1, replication_factor - 1),
    )
    workload = Workload(bootstrap, history, config)
    try:
        await workload.create_topic()
        stop = asyncio.Event()
        clients = asyncio.create_task(workload.run(stop))
        await asyncio.sleep(duration_s)
        stop.set()
        await clients
        await workload.wait_healthy(120)
        await workload.final_read()
    finally:
        history.close()
    return summarize(0, duration_s, 0, check(history.ops))


# --- command line -----------------------------------------------------------------------


def _scenarios(_ctx: click.Context, _param: click.Parameter, value: str) -> tuple[str, ...]:
    names = tuple(v.strip() for v in value.split(",") if v.strip())
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown or not names:
        raise click.BadParameter(f"{unknown or value!r}: choose from {', '.join(SCENARIOS)}")
    return names


@click.group()
def main() -> None:
    """Chaos tests of a Highwater release on Kubernetes (tests/chaos/k8s/README.md)."""


@main.command("run")
@click.option("--release", required=True, help="The Helm release (its app.kubernetes.io/instance).")
@click.option("--namespace", default="default", show_default=True)
@click.option("--context", default=None, help="The kubeconfig context (default: current).")
@click.option("--kubectl", "kubectl_path", default="kubectl", show_default=True)
@click.option("--duration", type=click.FloatRange(min=30), default=600, show_default=True)
@click.option(
    "--scenarios",
    default=",".join(SCENARIOS),
    show_default=True,
    callback=_scenarios,
    help="In order, comma-separated.",
)
def run_command(
    release: str,
    namespace: str,
    context: str | None,
    kubectl_path: str,
    duration: float,
    scenarios: tuple[str, ...],
) -> None:
    """Run the checker in the cluster while the scenarios hit the release; a JSON report."""
    kubectl = Kubectl(namespace, context=context, kubectl=kubectl_path)
    selector = f"{INSTANCE_LABEL}={release}"
    try:
        layout = release_layout(
            release,
            kubectl.json("get", "configmaps", "-l", selector),
            kubectl.json("get", "statefulsets,services", "-l", selector),
        )
        report = Driver(
            kubectl, layout, duration_s=duration, echo=lambda s: click.echo(s, err=True)
        ).run(scenarios)
    except KubectlError as e:
        raise click.ClickException(str(e)) from None
    click.echo(json.dumps(report.to_json()))
    if not report.passed:
        sys.exit(1)


@main.command("workload")
@click.option("--bootstrap", required=True, metavar="HOST:PORT")
@click.option("--duration", type=click.FloatRange(min=1), default=600, show_default=True)
@click.option(
    "--history",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Where the history goes (default: a temporary file).",
)
@click.option("--replication-factor", type=click.IntRange(min=1), default=3, show_default=True)
def workload_command(
    bootstrap: str, duration: float, history: Path | None, replication_factor: int
) -> None:
    """Producers and group consumers against a running cluster; the JSON summary last."""
    path = history or Path(tempfile.mkdtemp(prefix="highwater-chaos-")) / "history.jsonl"
    summary = asyncio.run(
        run_workload(bootstrap, duration, path, replication_factor=replication_factor)
    )
    click.echo(f"history: {path}", err=True)
    click.echo(json.dumps(summary))


if __name__ == "__main__":
    main()
