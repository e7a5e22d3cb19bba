"""Real ``highwater coordinator`` processes on loopback for the consumer group integration
tests: start, SIGKILL, SIGSTOP/SIGCONT (a pause longer than its session)."""

from __future__ import annotations

import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO


@dataclass
class CoordinatorProcess:
    node_id: int
    port: int
    controllers: str
    log_path: Path
    process: subprocess.Popen[bytes] | None = None
    _log: IO[bytes] | None = field(default=None, repr=False)

    @property
    def data_dir(self) -> Path:
        """Beside the log, so that a killed process leaves nothing outside the test's path."""
        return self.log_path.parent / f"coordinator-{self.node_id}"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in kill()
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "highwater",
                "coordinator",
                "--node-id",
                str(self.node_id),
                "--listen",
                self.address,
                "--controllers",
                self.controllers,
                "--data-dir",
                str(self.data_dir),
                "--group-initial-rebalance-delay-ms",
                "0",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=self._log,
        )

    def pause(self) -> None:
        """SIGSTOP: the process stays, frozen, until :meth:`resume`."""
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)
        if self._log is not None:
            self._log.close()
            self._log = None
