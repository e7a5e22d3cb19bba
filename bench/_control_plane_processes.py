"""The control-plane experiment on real processes: the etcd mode against KRaft, each a
cluster of real ``highwater`` processes (bench/control_plane.py runs it beside the image's
figures; docs/control-plane.md).

``PROCESS_SIZES``: three brokers, replication factor 3; KRaft with a
quorum of three controller processes, the etcd mode with one etcd member (Debian's
etcd-server) and every broker a controller candidate. Topics of 100 partitions (each
created in one etcd transaction under etcd's default ``--max-txn-ops``), leaders spread.

- *metadata propagation*: a one-partition topic created through a broker, until every
  broker's Metadata shows it with a leader;
- *controller failover*: kill -9 of the active controller (KRaft: its process; etcd: the
  broker holding the ``controller`` key) until a topic creation is accepted again;
- *controlled shutdown*: SIGTERM of a broker that is not the etcd controller, until its
  process exits (it exits once the controller moved its leaderships);
- *cold broker start*: that broker started again, until its Metadata lists every
  partition with a leader and itself as live.

Unlike the image's figures, these include everything a user waits for: failure
detection (the etcd session TTL; the Raft election timeout), the network hops, Raft's
commit, the brokers applying what they are told.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import statistics
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from bench._etcd_peer import etcd_cluster, free_port
from bench._highwater_cluster import HighwaterProcess, describe_partitions
from bench.report import Report, Row, SuiteSection

PROCESS_SIZES = (1_000,)
TOPIC_PARTITIONS = 100
BROKERS = (1, 2, 3)
CLUSTER = "bench"
MODES = ("kraft", "etcd")


@dataclass
class ProcessCluster:
    """The processes of one mode's cluster and how to find its active controller."""

    mode: str
    brokers: dict[int, HighwaterProcess]
    addresses: dict[int, str]
    controllers: dict[int, HighwaterProcess] = field(default_factory=dict)
    controller_addresses: dict[int, str] = field(default_factory=dict)
    store: str = ""

    def live(self) -> list[str]:
        return [self.addresses[n] for n, p in self.brokers.items() if p.alive]

    async def active_controller(self) -> int:
        """KRaft: the quorum leader's node id; etcd: the broker the controller key names."""
        if self.mode == "kraft":
            from bench.raft import _describe

            for address in self.controller_addresses.values():
                described = await _describe(address)
                if described is not None and described[0] > 0:
                    return described[0]
            raise RuntimeError("no KRaft leader")
        from highwater.etcd_metadata.connection import EtcdConnection
        from highwater.etcd_metadata.endpoints import parse_metadata_store

        connection = EtcdConnection(parse_metadata_store(self.store))
        try:
            _, claim = await connection.get(f"/highwater/{CLUSTER}/controller")
        finally:
            await connection.close()
        if claim is None:
            raise RuntimeError("no etcd controller")
        return int(json.loads(claim.value)["broker_id"])


@contextlib.contextmanager
def process_cluster(
    root: Path, mode: str, endpoint: str = "", etcd_session_timeout_ms: int | None = None
) -> Iterator[ProcessCluster]:
    """Three brokers and, in KRaft mode, three controllers; everything stopped at the end.
    ``etcd_session_timeout_ms``: the brokers' etcd lease TTL (None: the broker's default)."""
    addresses = {n: f"127.0.0.1:{free_port()}" for n in BROKERS}
    cluster = ProcessCluster(mode, {}, addresses)
    if mode == "kraft":
        cluster.controller_addresses = {n: f"127.0.0.1:{free_port()}" for n in (11, 12, 13)}
        voters = ",".join(f"{n}@{a}" for n, a in cluster.controller_addresses.items())
        for n, address in cluster.controller_addresses.items():
            cluster.controllers[n] = HighwaterProcess(
                f"controller {n}",
                [
                    "controller",
                    "--node-id",
                    str(n),
                    "--listen",
                    address,
                    "--voters",
                    voters,
                    "--data-dir",
                    str(root / f"controller-{n}"),
                ],
                root / f"controller-{n}.log",
            )
        source = ["--controllers", ",".join(cluster.controller_addresses.values())]
    else:
        cluster.store = f"etcd://{endpoint}/{CLUSTER}"
        source = ["--metadata-store", cluster.store]
        if etcd_session_timeout_ms is not None:
            source += ["--etcd-session-timeout-ms", str(etcd_session_timeout_ms)]
    for n, address in addresses.items():
        cluster.brokers[n] = HighwaterProcess(
            f"broker {n}",
            [
                "broker",
                "--node-id",
                str(n),
                "--listen",
                address,
                *source,
                "--data-dir",
                str(root / f"broker-{n}"),
            ],
            root / f"broker-{n}.log",
        )
    processes = [*cluster.controllers.values(), *cluster.brokers.values()]
    try:
        for process in processes:
            process.start()
        yield cluster
    finally:
        for process in cluster.brokers.values():
            process.terminate()
        for process in processes:
            process.stop()


async def _retry(action: Callable[[], Awaitable[bool]], timeout_s: float, poll_s: float) -> float:
    """Seconds until ``action`` returns True."""
    started = time.monotonic()
    while True:
        if await action():
            return time.monotonic() - started
        if time.monotonic() - started > timeout_s:
            raise RuntimeError(f"not done within {timeout_s:.0f} s")
        await asyncio.sleep(poll_s)


async def _create(bootstrap: str, topic: str, partitions: int, replicas: int = 3) -> bool:
    """One attempt at creating ``topic``; True if it exists now."""
    from highwater.client.admin import AdminClient, AdminError, NewTopic, TopicExistsError

    try:
        async with AdminClient(bootstrap, request_timeout_s=10) as admin:
            results = await admin.create_topics([NewTopic(topic, partitions, replicas)])
    except AdminError:
        return False
    error = results[topic].error
    return error is None or isinstance(error, TopicExistsError)


async def _all_led(address: str, topics: list[str], partitions: int) -> bool:
    for topic in topics:
        described = await describe_partitions(address, topic)
        if described is None or len(described) != partitions:
            return False
        if any(p.leader_id < 0 for p in described.values()):
            return False
    return True


async def _serving(cluster: ProcessCluster, node_id: int, topics: list[str]) -> bool:
    """The broker lists every partition of ``topics`` with a leader, and itself as live."""
    from bench._highwater_cluster import live_broker_ids

    address = cluster.addresses[node_id]
    if node_id not in await asyncio.to_thread(live_broker_ids, address):
        return False
    return await _all_led(address, topics, TOPIC_PARTITIONS)


@dataclass
class ProcessResult:
    propagation_s: list[float] = field(default_factory=list)
    failover_s: float | None = None
    shutdown_s: float | None = None
    cold_start_s: float | None = None
    setup_s: float = 0.0
    error: str = ""


async def _measure(cluster: ProcessCluster, partitions: int, result: ProcessResult) -> None:
    """Fill ``result`` step by step: a step that fails leaves the earlier figures in it."""
    bootstrap = ",".join(cluster.addresses.values())
    topics = [f"cp-{i}" for i in range(partitions // TOPIC_PARTITIONS)]
    started = time.monotonic()
    await _retry(lambda: _create(bootstrap, "cp-warm", 1), 180, 0.2)
    for topic in topics:
        await _retry(lambda t=topic: _create(bootstrap, t, TOPIC_PARTITIONS), 300, 0.2)  # type: ignore[misc]
    for address in cluster.live():
        await _retry(lambda a=address: _all_led(a, topics, TOPIC_PARTITIONS), 900, 0.5)  # type: ignore[misc]
    result.setup_s = time.monotonic() - started

    for run in range(3):
        topic = f"cp-propagation-{run}"
        began = time.monotonic()
        await _retry(lambda t=topic: _create(bootstrap, t, 1), 60, 0.01)  # type: ignore[misc]
        for address in cluster.live():
            await _retry(lambda a=address, t=topic: _all_led(a, [t], 1), 60, 0.005)  # type: ignore[misc]
        result.propagation_s.append(time.monotonic() - began)

    # controller failover
    active = await cluster.active_controller()
    victim = cluster.controllers[active] if cluster.mode == "kraft" else cluster.brokers[active]
    victim.kill()
    survivors = ",".join(a for n, a in cluster.addresses.items() if cluster.brokers[n].alive)
    # (replication factor 1: in the etcd mode one of the three brokers is the one killed)
    result.failover_s = await _retry(
        lambda: _create(survivors, "cp-after-failover", 1, replicas=1), 300, 0.01
    )
    victim.start()
    if cluster.mode == "etcd":
        await _retry(lambda: _serving(cluster, active, topics), 600, 0.5)

    # controlled shutdown of a broker that is not the (etcd) controller, then its cold start
    from bench.broker import wait_full_isr

    controller_now = await cluster.active_controller() if cluster.mode == "etcd" else -1
    node = next(n for n in BROKERS if n != controller_now)
    watcher = cluster.addresses[next(n for n in BROKERS if n != node)]
    for topic in topics:  # every replica back in sync before the shutdown
        await wait_full_isr(watcher, topic, TOPIC_PARTITIONS, 3, timeout_s=900)
    broker = cluster.brokers[node]
    began = time.monotonic()
    broker.terminate()
    assert broker.process is not None
    await asyncio.to_thread(broker.process.wait, 600)
    result.shutdown_s = time.monotonic() - began
    broker.reap()
    broker.start()
    result.cold_start_s = await _retry(lambda: _serving(cluster, node, topics), 600, 0.05)


def _process_rows(section: SuiteSection, results: dict[tuple[str, int], ProcessResult]) -> None:
    for (mode, partitions), r in sorted(results.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        label = (
            f"{'KRaft' if mode == 'kraft' else 'etcd mode'}, {partitions:,} partitions, processes"
        )
        if r.error:
            section.add(Row(f"control plane, {label}", None, "s", error=r.error))
            continue
        section.add(
            Row(
                f"metadata propagation of one topic creation, {label}",
                statistics.median(r.propagation_s) * 1e3,
                "ms",
                extra="runs: " + " · ".join(f"{t * 1e3:.0f}" for t in r.propagation_s) + " ms",
            )
        )
        section.add(
            Row(
                f"controller failover (kill -9 until a change is accepted), {label}",
                r.failover_s,
                "s",
            )
        )
        section.add(
            Row(
                f"controlled shutdown of a broker (SIGTERM until it exited), {label}",
                r.shutdown_s,
                "s",
            )
        )
        section.add(
            Row(
                f"cold broker start (until it serves every partition), {label}",
                r.cold_start_s,
                "s",
                extra=f"set-up (topics created, led everywhere) {r.setup_s:.1f} s",
            )
        )


def process_rows(report: Report, section: SuiteSection) -> dict[tuple[str, int], ProcessResult]:
    """Run both modes at each of ``PROCESS_SIZES`` (scaled) and add their rows."""
    sizes = sorted(
        {
            max(TOPIC_PARTITIONS, int(s * report.scale) // TOPIC_PARTITIONS * TOPIC_PARTITIONS)
            for s in PROCESS_SIZES
        }
    )
    results: dict[tuple[str, int], ProcessResult] = {}
    for partitions in sizes:
        for mode in MODES:
            report.progress(f"control-plane: {mode}, {partitions:,} partitions on processes")
            with report.data_dir(f"control-plane-{mode}-{partitions}") as root:
                results[(mode, partitions)] = _measure_mode(root, mode, partitions)
    _process_rows(section, results)
    return results


def run_sizes(
    sizes: tuple[int, ...],
    modes: tuple[str, ...],
    data_dir: Path,
    etcd_session_timeout_ms: int | None = None,
) -> dict[tuple[str, int], ProcessResult]:
    """Each mode at each size (partitions, rounded to whole topics), on processes under
    ``data_dir``; failures recorded in the result, not raised."""
    results: dict[tuple[str, int], ProcessResult] = {}
    for partitions in sizes:
        partitions = max(TOPIC_PARTITIONS, partitions // TOPIC_PARTITIONS * TOPIC_PARTITIONS)
        for mode in modes:
            print(f"control-plane: {mode}, {partitions:,} partitions on processes", flush=True)
            root = data_dir / f"control-plane-{mode}-{partitions}"
            root.mkdir(parents=True, exist_ok=True)
            results[(mode, partitions)] = _measure_mode(
                root, mode, partitions, etcd_session_timeout_ms
            )
    return results


def _measure_mode(
    root: Path, mode: str, partitions: int, etcd_session_timeout_ms: int | None = None
) -> ProcessResult:
    """One mode's cluster (and its etcd) started under ``root`` and measured at
    ``partitions``; a failure to start or measure is the result's ``error``, beside the
    figures of the steps done before it."""
    result = ProcessResult()
    try:
        with contextlib.ExitStack() as stack:
            endpoint = ""
            if mode == "etcd":
                etcd = etcd_cluster(root / "etcd", members=1)
                endpoint = stack.enter_context(etcd)[0]
            cluster = stack.enter_context(
                process_cluster(root, mode, endpoint, etcd_session_timeout_ms)
            )
            asyncio.run(_measure(cluster, partitions, result))
    except (RuntimeError, TimeoutError, OSError) as error:
        result.error = f"{type(error).__name__}: {error}"
    return result


def main(argv: list[str] | None = None) -> int:
    """``python -m bench._control_plane_processes --partitions 10000 --modes etcd``: the
    processes part alone at chosen sizes (beyond ``PROCESS_SIZES``), as JSON with the
    machine's load average before and after each run."""
    import argparse
    import dataclasses
    import os

    parser = argparse.ArgumentParser(prog="python -m bench._control_plane_processes")
    parser.add_argument("--partitions", default=",".join(str(s) for s in PROCESS_SIZES))
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--data-dir", type=Path, default=Path("bench-data/control-plane"))
    parser.add_argument(
        "--etcd-session-timeout-ms",
        type=int,
        default=None,
        help="the etcd mode's broker lease TTL (default: the broker's, 6,000 ms)",
    )
    args = parser.parse_args(argv)
    modes = tuple(m for m in args.modes.split(",") if m)
    unknown = set(modes) - set(MODES)
    if unknown:
        parser.error(f"unknown mode(s) {', '.join(sorted(unknown))}; known: kraft, etcd")
    sizes = tuple(int(s) for s in args.partitions.split(","))
    load_before = os.getloadavg()
    results = run_sizes(sizes, modes, args.data_dir, args.etcd_session_timeout_ms)
    print(
        json.dumps(
            {
                "load_before": load_before,
                "load_after": os.getloadavg(),
                "etcd_session_timeout_ms": args.etcd_session_timeout_ms,
                "results": {
                    f"{mode} {partitions}": dataclasses.asdict(r)
                    for (mode, partitions), r in results.items()
                },
            },
            indent=1,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
