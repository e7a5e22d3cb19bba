"""The lock a process holds on a data directory, so that no second process opens it.

Kafka keeps a ``.lock`` file in each log directory and holds an exclusive lock on it while
the broker runs; a second broker pointed at the same directory fails at startup instead of
writing the same segments. The lock is ``flock`` on ``<data dir>/.lock``: the kernel drops
it when the process dies, so a crash never leaves the directory locked. The broker's log
manager and a controller's (or observer's) metadata log each hold the one of their
directory.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import Final

from highwater.errors import KafkaStorageError

__all__ = ["LOCK_FILE", "DataDirLock"]

LOCK_FILE: Final = ".lock"


class DataDirLock:
    """The exclusive lock on ``data_dir``: :meth:`acquire` once, :meth:`release` at the end."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = Path(data_dir)
        self._fd = -1

    @property
    def path(self) -> Path:
        return self.data_dir / LOCK_FILE

    @property
    def held(self) -> bool:
        return self._fd >= 0

    def acquire(self) -> None:
        """Take the lock, creating the lock file if needed; raises
        :class:`~highwater.errors.KafkaStorageError` if another process holds it."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise KafkaStorageError(
                f"{self.data_dir}: the data directory is in use by another process"
            ) from None
        self._fd = fd

    def release(self) -> None:
        """Let the lock go (nothing if it is not held)."""
        if self._fd >= 0:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = -1
