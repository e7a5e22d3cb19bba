"""Each broker's CPU per Produce request at RF 3, acks=all: a measuring driver, not a suite.

``python -m bench._produce_request_cost [--requests N] [--rounds R] [--profile PREFIX]``
starts a controller and three brokers on loopback (bench/_highwater_cluster.py), creates
a one-partition topic with three replicas, then sends R rounds of N pre-built batches of
:data:`~bench.broker.RAW_BATCH_RECORDS` records through the Produce RPC to the leader
(:func:`bench.broker.produce_raw`, four in flight), and prints per round each broker's
CPU (user and system, all threads, from ``/proc/<pid>/stat``) divided by N: the leader's
(L) and the followers' (F) milliseconds per request. ``--profile PREFIX`` runs the brokers
under ``bench._profiled_server`` and profiles each round's window into ``PREFIX-<id>.<n>``.
The machine is shared: compare figures measured back to back, with the load beside them.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from bench._highwater_cluster import HighwaterProcess, highwater_cluster
from bench.broker import create_topic, leader_address, produce_raw, wait_full_isr

TOPIC = "request-cost"
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of process ``pid``, all its threads."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) / _CLOCK_TICKS, int(fields[12]) / _CLOCK_TICKS


class _ProfiledBroker(HighwaterProcess):
    """A broker under ``bench._profiled_server`` (SIGUSR1 starts a window, SIGUSR2 ends it)."""

    prefix: str = ""

    def start(self) -> None:
        if not self.name.startswith("broker"):
            super().start()
            return
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in reap()
        node = self.name.split()[-1]
        self.process = subprocess.Popen(
            [
                *(sys.executable, "-m", "bench._profiled_server", f"{self.prefix}-{node}"),
                *("--log-level", "INFO", *self.args),
            ],
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **self.env},
        )


async def measure(requests: int, rounds: int, profile: str | None) -> None:
    root = Path(tempfile.mkdtemp(prefix="produce-request-cost-"))
    with highwater_cluster(root, 3) as cluster:
        await create_topic(cluster.bootstrap, TOPIC, replication_factor=3)
        leader = await leader_address(cluster, TOPIC)
        await wait_full_isr(leader, TOPIC, 1, 3)
        leader_id = next(n for n, a in cluster.broker_addresses.items() if a == leader)
        await produce_raw(leader, TOPIC, -1, 200)  # warm-up
        pids = {node: broker.pid for node, broker in cluster.brokers.items()}
        for number in range(rounds):
            if profile:
                for pid in pids.values():
                    os.kill(pid, signal.SIGUSR1)
            before = {node: _cpu_s(pid) for node, pid in pids.items()}
            counted = await produce_raw(leader, TOPIC, -1, requests)
            after = {node: _cpu_s(pid) for node, pid in pids.items()}
            if profile:
                for pid in pids.values():
                    os.kill(pid, signal.SIGUSR2)
                await asyncio.sleep(2)  # the profiles are written
            shares = []
            for node in pids:
                user, system = (a - b for a, b in zip(after[node], before[node], strict=True))
                role = "L" if node == leader_id else "F"
                shares.append(
                    f"{role}{node} {(user + system) / requests * 1e3:.3f} ms "
                    f"(user {user / requests * 1e3:.3f}, system {system / requests * 1e3:.3f})"
                )
            load = os.getloadavg()[0]
            print(
                f"round {number} (load {load:.1f}): {counted.per_second:,.0f} records/s; "
                f"per request {', '.join(shares)}",
                flush=True,
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1500)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--profile", default=None)
    args = parser.parse_args()
    if args.profile:
        _ProfiledBroker.prefix = args.profile
        import bench._highwater_cluster as cluster_module

        cluster_module.HighwaterProcess = _ProfiledBroker  # type: ignore[misc]
    asyncio.run(measure(args.requests, args.rounds, args.profile))


if __name__ == "__main__":
    main()
