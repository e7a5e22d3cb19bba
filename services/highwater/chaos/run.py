"""One chaos run from start to summary: cluster up, workload and nemesis for the duration,
heal, final read, cluster down, replica digests, check.

Every process the run starts is stopped, every mount and namespace it made is removed,
whatever happens (an exception, SIGTERM, SIGINT).
"""

from __future__ import annotations

import asyncio
import json
import random
import signal
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from highwater.chaos.checker import CheckResult, check
from highwater.chaos.cluster import Cluster
from highwater.chaos.faults import Nemesis, SmallDisks
from highwater.chaos.fuzz import Fuzzer
from highwater.chaos.history import HistoryWriter, format_ops
from highwater.chaos.kafka_fuzz import KafkaFuzzer
from highwater.chaos.network import NamespaceNetwork, Network, namespaces_available
from highwater.chaos.report import timeline_svg
from highwater.chaos.schedule import build_schedule
from highwater.chaos.workload import Workload, WorkloadConfig

HEAL_TIMEOUT_S = 90.0


@dataclass
class RunOptions:
    seed: int
    duration_s: float
    faults: tuple[str, ...]
    out_dir: Path
    controllers: int = 1
    brokers: int = 3
    coordinators: int = 1
    fuzz_rate: float = 0.0
    """Fuzzed requests per second to the cluster's endpoints during the run (0: none)."""
    secure: bool = False
    """Mutual TLS, ACLs and SASL on (the harness is the super user ``User:admin``)."""
    quorum: str = "static"
    """The controllers' quorum: ``static`` (``--voters``) or ``dynamic`` (KIP-853, as the
    Helm chart runs it; :mod:`highwater.chaos.cluster`)."""
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)


class Terminated(Exception):
    """SIGTERM arrived."""


def raise_terminated(_signum: int, _frame: FrameType | None) -> None:
    raise Terminated()


def summarize(
    seed: int, duration_s: float, faults_injected: int, result: CheckResult
) -> dict[str, Any]:
    return {
        "seed": seed,
        "duration_s": duration_s,
        "faults_injected": faults_injected,
        "writes_acknowledged": result.writes_acknowledged,
        "writes_lost": result.writes_lost,
        "duplicates": result.duplicates,
        "anomalies": [a.to_json() for a in result.anomalies],
        "longest_unavailability_s": result.longest_unavailability_s,
        "unavailability_by_fault_s": result.unavailability_by_fault_s,
        "fuzz_calls": result.fuzz_calls,
    }


def excerpt(ops: list[dict[str, Any]], result: CheckResult, limit: int = 10) -> list[str]:
    """For each anomaly (the first ``limit``), its kind, detail and the lines that show it."""
    text = []
    for anomaly in result.anomalies[:limit]:
        text.append(f"ANOMALY {anomaly.kind}: {anomaly.detail}")
        text += ["  " + line for line in format_ops((i, ops[i]) for i in anomaly.lines)]
    if len(result.anomalies) > limit:
        text.append(f"... and {len(result.anomalies) - limit} more anomalies")
    return text


def run(options: RunOptions, echo: Any = print) -> dict[str, Any]:
    """Run once; the JSON summary (also in ``out_dir/summary.json``)."""
    out = options.out_dir
    out.mkdir(parents=True, exist_ok=True)
    history = HistoryWriter(out / "history.jsonl")
    kinds = list(options.faults)
    network: Network = Network()
    disks = SmallDisks()
    cluster: Cluster | None = None
    previous = signal.signal(signal.SIGTERM, raise_terminated)
    faults_injected = 0
    try:
        if "partition" in kinds:
            why = namespaces_available()
            if why is None:
                network = NamespaceNetwork()
            else:
                kinds.remove("partition")
                if "kill" not in kinds:
                    kinds.append("kill")
                history.record(
                    "note",
                    "setup",
                    text=f"network namespaces unavailable ({why}): no partitions; "
                    "process faults (kill) instead",
                )
                echo(f"network namespaces unavailable ({why}); partitions replaced by kills")
        history.record(
            "note",
            "setup",
            text=f"seed {options.seed}, {options.duration_s}s, faults {','.join(kinds)}, "
            f"network mode {network.mode}, {options.quorum} quorum"
            + (f", cuts by {network.cut_with}" if isinstance(network, NamespaceNetwork) else ""),
            seed=options.seed,
            duration_s=options.duration_s,
        )
        wipe_controllers = options.quorum == "dynamic" and options.controllers >= 3
        if "wipe" in kinds and not wipe_controllers:
            why = (
                "a static quorum's voters cannot change"
                if options.quorum != "dynamic"
                else "fewer than three controllers: a majority would not outlive a lost volume"
            )
            history.record("note", "setup", text=f"wipes of brokers only: {why}")
            echo(f"wipes of brokers only: {why}")
        cluster = Cluster(
            out / "cluster",
            network,
            controllers=options.controllers,
            brokers=options.brokers,
            coordinators=options.coordinators,
            secure=options.secure,
            quorum=options.quorum,
        )
        disk_brokers: list[str] = []
        if "disk" in kinds:
            broker = random.Random(options.seed).choice(cluster.brokers)
            why_not = disks.mount(broker.data_dir)
            if why_not is None:
                disk_brokers.append(broker.name)
                history.record("note", "setup", text=f"{broker.name} data on a small tmpfs")
            else:
                kinds.remove("disk")
                history.record("note", "setup", text=f"no disk faults: mount failed: {why_not}")
                echo(f"no disk faults: a small tmpfs could not be mounted ({why_not})")
        if isinstance(network, NamespaceNetwork):
            network.enter_client_namespace()
        schedule = build_schedule(
            options.seed,
            options.duration_s,
            kinds,
            list(cluster.processes),
            brokers=[b.name for b in cluster.brokers],
            disk_brokers=disk_brokers,
            wipe_targets=[
                p.name
                for p in cluster.processes.values()
                if p.role == "broker" or (p.role == "controller" and wipe_controllers)
            ],
        )
        (out / "schedule.json").write_text(
            json.dumps([w.to_json() for w in schedule], indent=1) + "\n"
        )
        echo(f"cluster starting under {out} ({network.mode}); {len(schedule)} faults scheduled")
        cluster.start()
        history.record(
            "note",
            "setup",
            text="cluster up: "
            + ", ".join(f"{p.name}={p.address} pid {p.pid}" for p in cluster.processes.values()),
        )
        nemesis = Nemesis(cluster, history, disks)
        workload = Workload(cluster.bootstrap, history, options.workload)
        high_watermarks = asyncio.run(
            _drive(options, cluster, workload, nemesis, schedule, history, echo)
        )
        faults_injected = nemesis.injected
        cluster.stop()
        for broker_id, partition, digest, size, end in cluster.replica_digests(
            options.workload.topic, high_watermarks
        ):
            history.record(
                "replica",
                "replicas",
                broker=broker_id,
                partition=partition,
                digest=digest,
                bytes=size,
                end_offset=end,
                high_watermark=high_watermarks[partition],
            )
    finally:
        signal.signal(signal.SIGTERM, previous)
        if cluster is not None:
            cluster.stop()
        disks.close()
        network.close()
        history.close()
    result = check(history.ops)
    summary = summarize(options.seed, options.duration_s, faults_injected, result)
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    (out / "timeline.svg").write_text(
        timeline_svg(history.ops, f"seed {options.seed}: acknowledged writes and faults")
    )
    for line in excerpt(history.ops, result):
        echo(line)
    return summary


async def _drive(
    options: RunOptions,
    cluster: Cluster,
    workload: Workload,
    nemesis: Nemesis,
    schedule: list[Any],
    history: HistoryWriter,
    echo: Any,
) -> dict[int, int]:
    await workload.create_topic()
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    origin = loop.time()
    history.record("note", "setup", text="workload started")
    clients = asyncio.create_task(workload.run(stop))
    faults = asyncio.create_task(nemesis.run(schedule, origin))
    fuzzing: asyncio.Task[None] | None = None
    if options.fuzz_rate > 0:
        fuzzer = Fuzzer(
            {p.name: p.address for p in cluster.processes.values()},
            history,
            options.seed,
            rate=options.fuzz_rate,
            avoid=(options.workload.topic, options.workload.group),
            avoid_ids=frozenset(p.node_id for p in cluster.processes.values()),
            secure=options.secure,
        )
        kafka_fuzzer = KafkaFuzzer(
            cluster.kafka_listeners, history, options.seed, rate=options.fuzz_rate
        )
        fuzzing = asyncio.create_task(_together(fuzzer.run(stop), kafka_fuzzer.run(stop)))
    try:
        await asyncio.sleep(options.duration_s)
        await faults
    finally:
        faults.cancel()
        await asyncio.gather(faults, return_exceptions=True)
        await asyncio.to_thread(nemesis.heal_all)
        stop.set()
    history.record("note", "teardown", text="workload stopping; every fault healed")
    await clients
    if fuzzing is not None:
        await fuzzing
    began = time.monotonic()
    healthy = await workload.wait_healthy(HEAL_TIMEOUT_S)
    history.record(
        "note",
        "teardown",
        text=f"cluster {'healthy' if healthy else 'NOT healthy'} after "
        f"{time.monotonic() - began:.1f}s",
    )
    if cluster.quorum == "dynamic":
        await _record_voter_set(cluster, history, HEAL_TIMEOUT_S - (time.monotonic() - began))
    echo("final read")
    high_watermarks = await workload.final_read()
    # Let followers fetch the last batches before the brokers stop.
    await asyncio.sleep(3)
    return high_watermarks


async def _record_voter_set(cluster: Cluster, history: HistoryWriter, timeout_s: float) -> None:
    """Wait (up to ``timeout_s``, at least 10 s) until the dynamic quorum's voter set is
    the controllers' current incarnations, and record whether it became so (a ``quorum``
    entry, which the checker reads)."""
    deadline = time.monotonic() + max(10.0, timeout_s)
    while True:
        gap = await asyncio.to_thread(cluster.voter_set_gap)
        if gap is None or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.5)
    answer = await asyncio.to_thread(cluster.describe_quorum)
    voters = (
        []
        if answer is None
        else [
            {"id": v.replica_id, "directory_id": v.replica_directory_id}
            for v in answer.current_voters
        ]
    )
    history.record(
        "quorum",
        "teardown",
        whole=gap is None,
        voters=voters,
        detail="every controller's current incarnation is a voter" if gap is None else gap,
    )


async def _together(*runs: Coroutine[Any, Any, None]) -> None:
    await asyncio.gather(*runs)
