"""``highwater dev-cluster`` in a process of its own, for the tests that run it in either mode.

:func:`dev_cluster` starts the command, reads what it prints until the line that says the
cluster is up (``bootstrap: ...`` unless told another), and collects on the way the pid of
every process it started (its ``(pid N)`` lines) and its ``name: value`` lines. The test
then uses the cluster and calls :meth:`DevCluster.stop`: Ctrl-C (SIGINT), a clean exit, and
no process it started left running. Whatever happens, the command and every process it
started are killed when the ``with`` block ends.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["DevCluster", "dev_cluster", "pid_alive"]

_PID = re.compile(r"\(pid (\d+)\)")
_FIELD = re.compile(r"([a-z][a-z ]*): (.*)")


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` runs; a zombie waiting for its parent counts as gone."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().split()[2] != "Z"


@dataclass
class DevCluster:
    """A running ``highwater dev-cluster``: what it printed until it was up."""

    process: subprocess.Popen[str]
    children: list[int] = field(default_factory=list)
    """The pids of the processes it started (controllers, brokers, coordinators)."""
    printed: list[str] = field(default_factory=list)
    """Its lines until the one that says it is up, that one included."""
    fields: dict[str, str] = field(default_factory=dict)
    """Its ``name: value`` lines (``bootstrap``, ``metadata store``, ...), by name."""

    @property
    def bootstrap(self) -> str:
        """The brokers' addresses it printed, ``HOST:PORT,...``."""
        return self.fields.get("bootstrap", "")

    def stop(self) -> None:
        """Ctrl-C: the command exits with 0 and leaves none of its processes running."""
        self.process.send_signal(signal.SIGINT)
        assert self.process.wait(60) == 0
        assert not [pid for pid in self.children if pid_alive(pid)], "a process was left running"


@contextmanager
def dev_cluster(data_dir: Path, *args: str, up: str = "bootstrap") -> Iterator[DevCluster]:
    """``highwater dev-cluster --data-dir DATA_DIR ARGS``, read until its ``UP: ...`` line.

    Asserts that the line came (the command's output is in the message otherwise).
    """
    process = subprocess.Popen(
        [sys.executable, "-m", "highwater", "dev-cluster", "--data-dir", str(data_dir), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    cluster = DevCluster(process)
    try:
        assert process.stdout is not None
        for line in process.stdout:
            cluster.printed.append(line)
            if match := _PID.search(line):
                cluster.children.append(int(match[1]))
            if match := _FIELD.fullmatch(line.rstrip("\n")):
                cluster.fields[match[1]] = match[2].strip()
                if match[1] == up:
                    break
        assert up in cluster.fields, "the cluster did not come up:\n" + "".join(cluster.printed)
        yield cluster
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        if process.stdout is not None:
            process.stdout.close()
        for pid in cluster.children:
            if pid_alive(pid):
                os.kill(pid, signal.SIGKILL)
