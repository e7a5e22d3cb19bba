"""CPU per committed write of the controller quorum: ``python -m bench._raft_cpu``.

Wall-clock rates mean little on a shared, loaded machine; the CPU each process spends per
committed write holds much better. This runs ``bench raft``'s write workload (one
``AlterConfigs`` of a ~100-byte ``ConfigRecord`` per write, 3 controller processes on
loopback, fsync on) for each number of writers, and reports per run: committed writes
and their rate, the CPU milliseconds per committed write of the leader, of each follower
(``/proc/PID/stat``: user and system time of all threads) and of the client (this
process), and how many writes each Raft batch held (the leader's log read back after the
run: the data batches appended during the measured window).

``--floor`` measures the same for ``bench._grpc_floor`` (the no-op Controller service of
the floor rows of ``bench raft``) with the same client and requests: the server CPU per
call that gRPC and the servicer's plumbing cost before any controller work.

``--profile`` runs the controllers under ``bench._profiled_server`` and profiles every
controller's event loop (CPU time) over each measured window; for the leader and for one
follower the functions with the most cumulative and own time are printed, per committed
write (the calls column counts messages, wake-ups and thread hand-offs per commit: e.g.
the driver's ``_step`` per message in, ``_dispatch`` per message out, ``to_thread`` per
fsync handed to a thread), and the raw profiles are kept beside the data.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pstats
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench._etcd_peer import free_port, percentile
from bench.raft import (
    TOPIC_PREFIX,
    ControllerProcess,
    _Cluster,
    _wait_serving,
    controller_quorum,
    wait_for_leader,
)
from bench.report import profile_entry_name


def process_cpu_s(pid: int) -> float:
    """User and system CPU seconds process ``pid`` has used (all its threads)."""
    return _stat_cpu_s(Path(f"/proc/{pid}/stat"))


def main_thread_cpu_s(pid: int) -> float:
    """User and system CPU seconds of process ``pid``'s main thread: a server's event
    loop, where all its Python runs; the rest is gRPC's own threads (its event engine,
    which polls the sockets and moves the bytes) and the fsyncs handed to worker threads."""
    return _stat_cpu_s(Path(f"/proc/{pid}/task/{pid}/stat"))


def _stat_cpu_s(stat: Path) -> float:
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class CpuRun:
    """One measured window of the write workload."""

    writers: int
    writes: int
    seconds: float
    p50_ms: float
    leader_id: int
    cpu_s: dict[int, float]
    loop_cpu_s: dict[int, float]
    """Of ``cpu_s``, each process's main thread's (its event loop)."""
    client_cpu_s: float
    batches: int
    records: int
    load: tuple[float, float]
    profile: str = ""
    notes: list[str] = field(default_factory=list)

    def summary(self) -> str:
        if not self.writers:
            per_second = {n: 1000 * s / self.seconds for n, s in self.cpu_s.items()}
            return (
                f"  0 writers (idle) for {self.seconds:.1f} s: CPU ms per second: leader "
                f"{per_second[self.leader_id]:.1f}, followers "
                + " ".join(
                    f"{per_second[n]:.1f}" for n in sorted(per_second) if n != self.leader_id
                )
                + f"; load {self.load[0]:.1f} -> {self.load[1]:.1f}"
            )
        per_write = {n: 1000 * s / max(1, self.writes) for n, s in self.cpu_s.items()}
        followers = " ".join(
            f"{per_write[n]:.2f}" for n in sorted(per_write) if n != self.leader_id
        )
        leader_loop = 1000 * self.loop_cpu_s[self.leader_id] / max(1, self.writes)
        return (
            f"{self.writers:>3} writers: {self.writes:>6} writes in {self.seconds:.1f} s "
            f"({self.writes / self.seconds:,.0f}/s, p50 {self.p50_ms:.2f} ms); CPU ms per "
            f"write: leader {per_write[self.leader_id]:.2f} (event loop {leader_loop:.2f}), "
            f"followers {followers}, client "
            f"{1000 * self.client_cpu_s / max(1, self.writes):.2f}; {self.batches} Raft "
            f"batches, {self.records / max(1, self.batches):.2f} records per batch; "
            f"load {self.load[0]:.1f} -> {self.load[1]:.1f}"
        )


async def _measure(
    processes: list[ControllerProcess],
    writers: int,
    warmup_s: float,
    seconds: float,
    profile: bool,
) -> CpuRun:
    """Warm up, then run ``writers`` writers for ``seconds`` and measure; ``profile``: open
    and close a profile window of every controller around the measurement."""
    leader_id = await wait_for_leader(processes)
    leader = next(p for p in processes if p.node_id == leader_id)
    cluster = _Cluster([p.address for p in processes])
    try:
        await cluster.setup()
        await cluster.create_topics([f"{TOPIC_PREFIX}{i:03d}" for i in range(writers)])
        measuring = False
        latencies: list[float] = []
        stop_at = time.monotonic() + warmup_s + seconds

        async def writer(number: int) -> None:
            topic = f"{TOPIC_PREFIX}{number:03d}"
            value = 86_400_000 + 1_000_000 * writers
            while time.monotonic() < stop_at:
                started = time.perf_counter()
                counted = measuring
                await cluster.alter_config(topic, value)
                if counted and measuring:
                    latencies.append((time.perf_counter() - started) * 1000)
                value += 1

        async def window() -> tuple[
            float, dict[int, float], dict[int, float], float, int, tuple[float, float]
        ]:
            nonlocal measuring
            await asyncio.sleep(warmup_s)
            start_offset = _log_end(leader)
            load_before = os.getloadavg()[0]
            if profile:
                _signal_all(processes, signal.SIGUSR1)
            measuring = True
            cpu = {p.node_id: process_cpu_s(_pid(p)) for p in processes}
            loop_cpu = {p.node_id: main_thread_cpu_s(_pid(p)) for p in processes}
            client = time.process_time()
            started = time.monotonic()
            await asyncio.sleep(seconds)
            measuring = False
            elapsed = time.monotonic() - started
            cpu = {p.node_id: process_cpu_s(_pid(p)) - cpu[p.node_id] for p in processes}
            loop_cpu = {
                p.node_id: main_thread_cpu_s(_pid(p)) - loop_cpu[p.node_id] for p in processes
            }
            client = time.process_time() - client
            if profile:
                _signal_all(processes, signal.SIGUSR2)
            load = (load_before, os.getloadavg()[0])
            return elapsed, cpu, loop_cpu, client, start_offset, load

        measured, *_ = await asyncio.gather(window(), *(writer(i) for i in range(writers)))
    finally:
        await cluster.close()
    elapsed, cpu, loop_cpu, client, start_offset, load = measured
    latencies.sort()
    batches, records = _batches_since(leader, start_offset)
    return CpuRun(
        writers,
        len(latencies),
        elapsed,
        percentile(latencies, 0.5) if latencies else float("nan"),
        leader_id,
        cpu,
        loop_cpu,
        client,
        batches,
        records,
        load,
    )


async def _measure_floor(
    address: str, pid: int, writers: int, warmup_s: float, seconds: float
) -> str:
    """The write workload against the no-op server at ``address`` (process ``pid``): its
    CPU per call."""
    cluster = _Cluster([address])
    try:
        await cluster.setup()
        calls = 0
        latencies: list[float] = []
        measuring = False
        stop_at = time.monotonic() + warmup_s + seconds

        async def writer(number: int) -> None:
            nonlocal calls
            value = 86_400_000
            while time.monotonic() < stop_at:
                started = time.perf_counter()
                counted = measuring
                await cluster.alter_config(f"{TOPIC_PREFIX}{number:03d}", value)
                if counted and measuring:
                    calls += 1
                    latencies.append((time.perf_counter() - started) * 1000)
                value += 1

        async def window() -> tuple[float, float, float, tuple[float, float]]:
            nonlocal measuring
            await asyncio.sleep(warmup_s)
            load_before = os.getloadavg()[0]
            measuring = True
            cpu, loop_cpu, client = process_cpu_s(pid), main_thread_cpu_s(pid), time.process_time()
            started = time.monotonic()
            await asyncio.sleep(seconds)
            measuring = False
            elapsed = time.monotonic() - started
            cpu, loop_cpu = process_cpu_s(pid) - cpu, main_thread_cpu_s(pid) - loop_cpu
            client = time.process_time() - client
            return elapsed, cpu, loop_cpu, (load_before, os.getloadavg()[0])

        measured, *_ = await asyncio.gather(window(), *(writer(i) for i in range(writers)))
    finally:
        await cluster.close()
    elapsed, cpu, loop_cpu, load = measured
    latencies.sort()
    p50 = percentile(latencies, 0.5) if latencies else float("nan")
    return (
        f"{writers:>3} writers, no-op floor server: {calls:>6} calls in {elapsed:.1f} s "
        f"({calls / elapsed:,.0f}/s, p50 {p50:.2f} ms); CPU ms per call: server "
        f"{1000 * cpu / max(1, calls):.2f} (event loop {1000 * loop_cpu / max(1, calls):.2f}); "
        f"load {load[0]:.1f} -> {load[1]:.1f}"
    )


def _run_floor(root: Path, args: argparse.Namespace) -> None:
    port = free_port()
    with open(root / "floor.log", "ab") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "bench._grpc_floor", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    address = f"127.0.0.1:{port}"
    try:
        asyncio.run(_wait_serving(address))
        for _ in range(args.runs):
            for writers in args.writers:
                if writers:
                    summary = asyncio.run(
                        _measure_floor(address, process.pid, writers, args.warmup, args.seconds)
                    )
                    print(summary, flush=True)
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()


def _pid(process: ControllerProcess) -> int:
    assert process.process is not None
    return process.process.pid


def _segments(process: ControllerProcess) -> list[Path]:
    return sorted((process.data_dir / "__cluster_metadata-0").glob("*.log"))


def _log_end(process: ControllerProcess) -> int:
    """The next offset of the last batch in the leader's log files (what is written so far;
    a batch in the page cache counts)."""
    end = 0
    for _base, next_offset, _count, _control in _read_batches(process):
        end = next_offset
    return end


def _batches_since(process: ControllerProcess, offset: int) -> tuple[int, int]:
    """Data batches (not control batches) at or after ``offset``, and their records."""
    batches = records = 0
    for base, _next, count, control in _read_batches(process):
        if base >= offset and not control:
            batches += 1
            records += count
    return batches, records


def _read_batches(process: ControllerProcess) -> list[tuple[int, int, int, bool]]:
    from highwater.records.batch import iter_batches

    found = []
    for path in _segments(process):
        for batch in iter_batches(path.read_bytes()):
            found.append(
                (batch.base_offset, batch.next_offset, batch.records_count, batch.is_control)
            )
    return found


def _profile_window(process: ControllerProcess, windows: dict[int, int]) -> Path:
    """Where ``process`` writes its current profile window (each numbers its own)."""
    assert process.profile_out is not None
    name = f"{process.profile_out.name}.{windows.get(process.node_id, 0)}"
    return process.profile_out.with_name(name)


def _signal_all(processes: list[ControllerProcess], signum: int) -> None:
    for process in processes:
        assert process.process is not None
        process.process.send_signal(signum)


def _wait_profile(out: Path, timeout_s: float = 60) -> pstats.Stats | None:
    done = out.with_name(out.name + ".done")
    deadline = time.monotonic() + timeout_s
    while not done.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return pstats.Stats(str(out)) if done.exists() else None


def _top(stats: pstats.Stats, writes: int, limit: int, role: str) -> str:
    """The functions with the most cumulative and the most own CPU time, per write."""
    raw = stats.stats  # type: ignore[attr-defined]
    total = sum(entry[2] for entry in raw.values())
    lines = [
        f"profiled {total:.2f} s of the {role}'s event loop, "
        f"{1000 * total / max(1, writes):.3f} ms per write",
        f"{'cum ms/w':>9} {'own ms/w':>9} {'calls/w':>8}  function",
    ]

    for title, index in (("by cumulative time", 3), ("by own time", 2)):
        lines.append(f"-- {title}")
        ranked = sorted(raw.items(), key=lambda item: item[1][index], reverse=True)[:limit]
        for key, (_cc, calls, own, cumulative, _callers) in ranked:
            lines.append(
                f"{1000 * cumulative / max(1, writes):9.3f} {1000 * own / max(1, writes):9.3f} "
                f"{calls / max(1, writes):8.2f}  {profile_entry_name(key)}"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench._raft_cpu", description=__doc__)
    parser.add_argument("--writers", type=int, nargs="+", default=[64, 1])
    parser.add_argument("--seconds", type=float, default=8.0, help="measured window per run")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds before measuring")
    parser.add_argument("--runs", type=int, default=1, help="runs per number of writers")
    parser.add_argument("--profile", action="store_true", help="cProfile the leader and a follower")
    parser.add_argument(
        "--floor", action="store_true", help="also measure the no-op gRPC floor server"
    )
    parser.add_argument("--top", type=int, default=30, help="functions listed per profile")
    parser.add_argument("--keep", type=Path, help="keep the data and profiles here")
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="raft-cpu-")) if args.keep is None else args.keep
    root.mkdir(parents=True, exist_ok=True)
    windows: dict[int, int] = {}
    try:
        if args.floor:
            _run_floor(root, args)
        with controller_quorum(root, profiled=args.profile) as processes:
            for _ in range(args.runs):
                for writers in args.writers:
                    run = asyncio.run(
                        _measure(
                            processes,
                            writers,
                            args.warmup,
                            args.seconds,
                            args.profile,
                        )
                    )
                    print(run.summary(), flush=True)
                    if args.profile:
                        follower = next(p for p in processes if p.node_id != run.leader_id)
                        for role, process in (
                            ("leader", next(p for p in processes if p.node_id == run.leader_id)),
                            ("follower", follower),
                        ):
                            stats = _wait_profile(_profile_window(process, windows))
                            if stats is not None:
                                print(_top(stats, run.writes, args.top, role), flush=True)
                        for process in processes:  # every process numbers its own windows
                            windows[process.node_id] = windows.get(process.node_id, 0) + 1
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
