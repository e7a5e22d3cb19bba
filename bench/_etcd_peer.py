"""A 3-member etcd cluster on loopback and a put workload: the peer for the quorum benchmarks."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from highwater.rpc.endpoints import free_loopback_ports


def free_port() -> int:
    return free_loopback_ports(1)[0]


@dataclass(frozen=True)
class WorkloadResult:
    """Committed writes per second and their latency percentiles (milliseconds)."""

    writes: int
    seconds: float
    p50_ms: float
    p99_ms: float

    @property
    def per_second(self) -> float:
        return self.writes / self.seconds if self.seconds else 0.0


def percentile(sorted_values: list[float], fraction: float) -> float:
    if not sorted_values:
        return float("nan")
    index = min(len(sorted_values) - 1, int(len(sorted_values) * fraction))
    return sorted_values[index]


def etcd_available() -> bool:
    return shutil.which("etcd") is not None


@contextlib.contextmanager
def etcd_cluster(
    data_dir: Path, members: int = 3, extra_args: Sequence[str] = ()
) -> Iterator[list[str]]:
    """Start ``members`` etcd servers on loopback (fsync on, the default), each with
    ``extra_args`` besides; yield client URLs."""
    names = [f"etcd{i}" for i in range(members)]
    peer_ports = [free_port() for _ in names]
    client_ports = [free_port() for _ in names]
    initial = ",".join(
        f"{name}=http://127.0.0.1:{port}" for name, port in zip(names, peer_ports, strict=True)
    )
    processes: list[subprocess.Popen[bytes]] = []
    try:
        for name, peer, client in zip(names, peer_ports, client_ports, strict=True):
            member_dir = data_dir / name
            member_dir.mkdir(parents=True, exist_ok=True)
            log = open(member_dir / "etcd.log", "wb")  # noqa: SIM115 - closed with the process
            processes.append(
                subprocess.Popen(
                    [
                        "etcd",
                        "--name",
                        name,
                        "--data-dir",
                        str(member_dir / "data"),
                        "--listen-peer-urls",
                        f"http://127.0.0.1:{peer}",
                        "--initial-advertise-peer-urls",
                        f"http://127.0.0.1:{peer}",
                        "--listen-client-urls",
                        f"http://127.0.0.1:{client}",
                        "--advertise-client-urls",
                        f"http://127.0.0.1:{client}",
                        "--initial-cluster",
                        initial,
                        "--initial-cluster-state",
                        "new",
                        "--initial-cluster-token",
                        "highwater-bench",
                        *extra_args,
                    ],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=dict(os.environ),
                )
            )
        endpoints = [f"127.0.0.1:{port}" for port in client_ports]
        _wait_healthy(endpoints)
        yield endpoints
    finally:
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _wait_healthy(endpoints: list[str], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        result = subprocess.run(
            ["etcdctl", "--endpoints", ",".join(endpoints), "endpoint", "health"],
            capture_output=True,
            env=dict(os.environ, ETCDCTL_API="3"),
            check=False,
        )
        if result.returncode == 0:
            return
        time.sleep(0.2)
    raise RuntimeError(f"etcd cluster at {endpoints} did not become healthy")


async def etcd_put_workload(
    endpoint: str, *, writers: int, value_size: int, duration_s: float
) -> WorkloadResult:
    """``writers`` concurrent clients putting ``value_size``-byte values for ``duration_s``."""
    import aetcd

    host, port = endpoint.rsplit(":", 1)
    value = b"v" * value_size
    latencies: list[float] = []
    stop_at = time.monotonic() + duration_s

    async with aetcd.Client(host=host, port=int(port)) as client:
        await client.put(b"warmup", value)

        async def writer(number: int) -> None:
            key = f"bench-{number}".encode()
            sequence = 0
            while time.monotonic() < stop_at:
                started = time.perf_counter()
                await client.put(key + str(sequence).encode(), value)
                latencies.append((time.perf_counter() - started) * 1000)
                sequence += 1

        started = time.monotonic()
        await asyncio.gather(*(writer(i) for i in range(writers)))
        elapsed = time.monotonic() - started
    latencies.sort()
    return WorkloadResult(
        len(latencies), elapsed, percentile(latencies, 0.5), percentile(latencies, 0.99)
    )
