"""The nemesis: injects the schedule's faults into the cluster and heals them.

- ``kill``: SIGKILL the process (by the PID the harness started), restart it when the
  window ends.
- ``pause``: SIGSTOP, SIGCONT when the window ends (longer than the session timeouts).
- ``partition``: cut the process off from every other process of the cluster
  (:meth:`Network.cut`); needs network namespaces.
- ``disk``: fill the broker's data directory, a small tmpfs mounted for it
  (:class:`SmallDisks`), and free it when the window ends.
- ``wipe``: SIGKILL a controller of a dynamic quorum, or a broker, and delete its data
  directory, as a lost volume would; it restarts empty when the window ends.
  - A controller must rejoin the quorum by itself (auto-join), replacing its former key.
    Only while the voter set is whole (every controller's current incarnation, nothing
    else): with a former key still in the set, a second lost volume would leave two dead
    voters of three, a quorum that can never elect again, which no controller can
    prevent (KIP-853's own hazard); and a volume lost while a controller is still joining
    could let its late request add a dead key.
  - A broker fetches its replicas again. Only while every partition with a replica on it
    has its whole replica set in its ISR (:meth:`Cluster.replica_set_gap`): a partition
    whose last ISR member lost its volume has lost committed records whatever the
    cluster does, which is not what the run tests.
  - Otherwise the window kills the process only, and says why.

Whatever the fault, the end of its window heals it and restarts any process of the
cluster that is no longer running (a broker that died of a full disk, say); every fault,
heal and restart is recorded in the history.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import subprocess
from collections.abc import Iterable
from pathlib import Path

from highwater.chaos.cluster import ChaosProcess, Cluster
from highwater.chaos.history import HistoryWriter
from highwater.chaos.schedule import FaultWindow

DISK_SIZE_MB = 128


class SmallDisks:
    """tmpfs mounts of ``DISK_SIZE_MB`` for brokers' data directories, and their filling."""

    def __init__(self) -> None:
        self.mounted: list[Path] = []

    def mount(self, directory: Path) -> str | None:
        """Mount a small tmpfs at ``directory``; None on success, else why it failed."""
        directory.mkdir(parents=True, exist_ok=True)
        try:
            subprocess.run(
                ["mount", "-t", "tmpfs", "-o", f"size={DISK_SIZE_MB}m", "tmpfs", str(directory)],
                check=True,
                capture_output=True,
                timeout=10,
            )
        except (OSError, subprocess.SubprocessError) as e:
            stderr = getattr(e, "stderr", None)
            return stderr.decode(errors="replace").strip() if stderr else str(e)
        self.mounted.append(directory)
        return None

    @staticmethod
    def fill(directory: Path) -> int:
        """Write a file into ``directory`` until the disk is full; the bytes written."""
        written = 0
        chunk = b"\0" * (1 << 20)
        with open(directory / "chaos-filler", "wb", buffering=0) as f:
            try:
                while True:
                    written += f.write(chunk)
            except OSError as e:
                if e.errno != errno.ENOSPC:
                    raise
        # The last partial megabyte too.
        with (
            open(directory / "chaos-filler-tail", "wb", buffering=0) as f,
            contextlib.suppress(OSError),
        ):
            while True:
                written += f.write(b"\0" * 4096)
        return written

    @staticmethod
    def free(directory: Path) -> None:
        for name in ("chaos-filler", "chaos-filler-tail"):
            with contextlib.suppress(FileNotFoundError):
                os.remove(directory / name)

    def close(self) -> None:
        for directory in reversed(self.mounted):
            subprocess.run(["umount", "-l", str(directory)], capture_output=True, timeout=10)
        self.mounted.clear()


class Nemesis:
    """Runs fault windows against ``cluster`` and records them in ``history``."""

    def __init__(self, cluster: Cluster, history: HistoryWriter, disks: SmallDisks) -> None:
        self.cluster = cluster
        self.history = history
        self.disks = disks
        self.injected = 0
        self.timeline: list[tuple[float, float, str, str]] = []
        """(start, end, kind, targets) of each fault, seconds since the history started."""

    async def run(self, schedule: Iterable[FaultWindow], origin: float) -> None:
        """Inject each window at ``origin + start_s`` (loop time), heal it at its end."""
        loop = asyncio.get_running_loop()
        for window in schedule:
            delay = origin + window.start_s - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            started = self.history.now()
            await asyncio.to_thread(self.inject, window)
            try:
                await asyncio.sleep(window.duration_s)
            finally:
                await asyncio.to_thread(self.heal, window)
                self.timeline.append(
                    (started, self.history.now(), window.kind, ",".join(window.targets))
                )

    def inject(self, window: FaultWindow) -> None:
        targets = [self.cluster.processes[name] for name in window.targets]
        detail = ""
        if window.kind == "kill":
            detail = ", ".join(f"pid {p.pid}" for p in targets)
            for process in targets:
                process.kill()
        elif window.kind == "pause":
            detail = ", ".join(f"pid {p.pid}" for p in targets)
            for process in targets:
                process.pause()
        elif window.kind == "wipe":
            details = []
            for process in targets:
                pid = process.pid
                gap = (
                    self.cluster.voter_set_gap()
                    if process.role == "controller"
                    else self.cluster.replica_set_gap(process.node_id)
                )
                if gap is None:
                    directory_id = process.wipe()
                    details.append(
                        f"pid {pid} killed, data directory deleted"
                        + (f" (directory id {directory_id})" if directory_id else "")
                    )
                else:
                    process.kill()
                    details.append(f"pid {pid} killed only, data kept: {gap}")
            detail = ", ".join(details)
        elif window.kind == "partition":
            others = [n for n in self.cluster.processes if n not in window.targets]
            self.cluster.network.cut(window.targets, others)
            detail = f"cut off from {', '.join(others)}"
        elif window.kind == "disk":
            written = sum(self.disks.fill(p.data_dir) for p in targets)
            detail = f"filled with {written} bytes"
        self.injected += 1
        self.history.record(
            "fault", "nemesis", fault=window.kind, target=list(window.targets), detail=detail
        )

    def heal(self, window: FaultWindow) -> None:
        targets = [self.cluster.processes[name] for name in window.targets]
        if window.kind == "pause":
            for process in targets:
                process.resume()
        elif window.kind == "partition":
            self.cluster.network.heal()
        elif window.kind == "disk":
            for process in targets:
                self.disks.free(process.data_dir)
        self.history.record("heal", "nemesis", fault=window.kind, target=list(window.targets))
        self.restart_dead()

    def restart_dead(self) -> list[ChaosProcess]:
        """Start every process of the cluster that is not running; the ones restarted."""
        restarted = []
        for process in self.cluster.processes.values():
            if not process.alive:
                code = process.process.returncode if process.process is not None else None
                process.start()
                restarted.append(process)
                self.history.record(
                    "restart", "nemesis", target=[process.name], pid=process.pid, exit_code=code
                )
        return restarted

    def heal_all(self) -> None:
        """Resume every paused process, remove every cut, free every disk, restart the dead."""
        for process in self.cluster.processes.values():
            if process.paused:
                process.resume()
        self.cluster.network.heal()
        for directory in self.disks.mounted:
            self.disks.free(directory)
        self.restart_dead()
