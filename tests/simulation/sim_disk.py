"""A broker's simulated disk: the real storage engine's files, with fsync semantics on crash.

The storage engine (:mod:`highwater.storage`) writes real files; the simulation keeps each
broker's data directory under one temporary directory (on tmpfs where there is one) and
models what a power loss leaves of them. The model:

* **Segment files** (``*.log``) are durable up to the size they had at the last flush the
  simulation ran (:meth:`SimDisk.flushed`, after ``PartitionLog.flush``). A crash cuts each
  one back to that size plus, for a torn tail, a random part of the bytes written since
  (possibly in the middle of a batch). A segment file created since the last flush of its
  log is gone, with its indexes (its directory entry was never made durable).
* **Checkpoints and the leader-epoch file** are written atomically (temporary file, fsync,
  rename) by the storage engine: they survive as they are.
* **Indexes** are left as they are: recovery rebuilds those of the segments past the
  recovery point.
* **A full disk** (ENOSPC): while :attr:`SimDisk.full`, a segment write under this disk
  writes a random prefix of its bytes, then fails with ``ENOSPC`` (as a write that runs out
  of blocks half-way does). The storage engine must cut the torn bytes back.
* **A failed directory** (EIO): a broker has two log directories (:attr:`SimDisk.log_dirs`,
  Kafka's JBOD); while one is in :attr:`SimDisk.failed`, its reads (``pread``), its writes
  (segment writes, ``fsync`` of anything in it: segments, checkpoints, the leader-epoch
  file) or both fail with ``EIO``, as a dying disk or controller does. Nothing is torn:
  what was written stays (the disk is repaired, not replaced).

The interception is :func:`intercept_segment_writes`, a context manager that wraps the
segment module's one write function for the duration of a run, and ``os.pread`` and
``os.fsync`` once a directory has failed (:meth:`DiskFaults.arm_failed_dirs`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import random
import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import highwater.storage.segment as segment_module

_INDEX_SUFFIXES = (".index", ".timeindex", ".txnindex")
LOG_DIRS = ("d0", "d1")
"""The log directories of each broker, under its data directory."""


class SimDisk:
    """The data directory of one broker and what of it is durable."""

    def __init__(self, path: Path, rng: random.Random) -> None:
        self.path = path
        self.rng = rng
        self.full = False
        self.torn_writes = 0
        self.log_dirs = [path / name for name in LOG_DIRS]
        self.failed: dict[str, str] = {}
        """Log directory (its path, with a trailing separator) -> what fails there: ``read``,
        ``write`` or ``read+write``."""
        self.io_errors = 0
        self._durable: dict[Path, int] = {}
        """Segment file -> its size at the last flush (the bytes fsync made durable)."""
        path.mkdir(parents=True, exist_ok=True)

    def flushed(self, segments: Iterable[tuple[Path, int]]) -> None:
        """A log was flushed: its segment files (path, size) are durable as they are."""
        for file, size in segments:
            self._durable[file] = size

    def truncated(self, partition_dir: Path) -> None:
        """A log in ``partition_dir`` was truncated: what it cut is no longer durable either
        (a later append must be flushed again to become durable)."""
        for file in list(self._durable):
            if file.parent == partition_dir:
                if file.exists():
                    self._durable[file] = min(self._durable[file], file.stat().st_size)
                else:
                    del self._durable[file]

    def crash(self, mode: str) -> list[str]:
        """The process died (``kill``: the page cache keeps everything it wrote), or the
        machine lost power (``power``: what was not flushed is lost; ``torn``: a random part
        of it is kept, maybe half a batch); returns what was cut, as notes."""
        notes: list[str] = []
        if mode == "kill":
            return notes
        torn = mode == "torn"
        for file in sorted(self.path.glob("*/*/*.log")):
            size = file.stat().st_size
            durable = self._durable.get(file)
            if durable is None:
                stem = file.with_suffix("")
                file.unlink()
                for suffix in _INDEX_SUFFIXES:
                    Path(str(stem) + suffix).unlink(missing_ok=True)
                notes.append(f"{file.parent.name}/{file.name} lost (never flushed)")
                continue
            if size <= durable:
                continue
            keep = durable + (self.rng.randint(0, size - durable) if torn else 0)
            os.truncate(file, keep)
            notes.append(f"{file.parent.name}/{file.name} cut {size} -> {keep} (flushed {durable})")
        # What is left is what a restart finds: durable from now on.
        self._durable = {f: f.stat().st_size for f in self.path.glob("*/*/*.log")}
        return notes

    def owns(self, path: str) -> bool:
        return path.startswith(str(self.path) + os.sep)

    def fail_dir(self, log_dir: Path, what: str) -> None:
        """From now on, ``what`` (``read``, ``write``, ``read+write``) fails in ``log_dir``."""
        self.failed[str(log_dir) + os.sep] = what

    def repair_dir(self, log_dir: Path) -> bool:
        """``log_dir`` works again (its contents as they were); whether it had failed."""
        return self.failed.pop(str(log_dir) + os.sep, None) is not None

    def fails(self, path: str, operation: str) -> bool:
        """Whether ``operation`` (``read`` or ``write``) on the file ``path`` fails now."""
        for prefix, what in self.failed.items():
            if operation in what and path.startswith(prefix):
                self.io_errors += 1
                return True
        return False

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


class DiskFaults:
    """The failures of the brokers' disks a run injects, through the storage engine's
    system calls: a full disk tears segment writes (always wrapped); a failed directory
    fails ``pread`` and ``fsync`` too, wrapped once one has failed (so that the runs
    without one pay nothing for them). ``suspended``: the simulation's own checks read
    the logs as the test's eyes, not the broker's, and meet no failure."""

    def __init__(self, disks: list[SimDisk]) -> None:
        self.disks = disks
        self.suspended = False
        self._restore: list[tuple[str, object]] = []

    def _failing(self, fd: int, operation: str) -> str | None:
        if self.suspended:
            return None
        disks = [d for d in self.disks if d.failed]
        if not disks:
            return None
        path = os.readlink(f"/proc/self/fd/{fd}")
        for disk in disks:
            if disk.fails(path, operation):
                return path
        return None

    def write(self, fd: int, pieces: list[bytes | bytearray | memoryview], total: int) -> None:
        failed = self._failing(fd, "write")
        if failed is not None:
            raise OSError(errno.EIO, os.strerror(errno.EIO), failed)
        full = [d for d in self.disks if d.full]
        if full:
            path = os.readlink(f"/proc/self/fd/{fd}")
            for disk in full:
                if disk.owns(path):
                    data = b"".join(bytes(p) for p in pieces)
                    part = disk.rng.randint(0, max(0, total - 1))
                    if part:
                        os.write(fd, data[:part])
                    disk.torn_writes += 1
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
        _REAL_WRITE(fd, pieces, total)

    def arm_failed_dirs(self) -> None:
        """Wrap ``os.pread`` and ``os.fsync`` (once): a failed directory's files fail them."""
        if self._restore:
            return
        real_pread, real_fsync = os.pread, os.fsync

        def pread(fd: int, length: int, offset: int, /) -> bytes:
            failed = self._failing(fd, "read")
            if failed is not None:
                raise OSError(errno.EIO, os.strerror(errno.EIO), failed)
            return real_pread(fd, length, offset)

        def fsync(fd: Any, /) -> None:
            number = fd if isinstance(fd, int) else fd.fileno()
            failed = self._failing(number, "write")
            if failed is not None:
                raise OSError(errno.EIO, os.strerror(errno.EIO), failed)
            real_fsync(fd)

        self._restore = [("pread", real_pread), ("fsync", real_fsync)]
        os.pread = pread
        os.fsync = fsync

    def disarm(self) -> None:
        for name, real in self._restore:
            setattr(os, name, real)
        self._restore = []


_REAL_WRITE = segment_module._write_fully


@contextlib.contextmanager
def intercept_segment_writes(disks: list[SimDisk]) -> Iterator[DiskFaults]:
    """While active, a segment write to a full :class:`SimDisk` tears and fails (ENOSPC),
    and the I/O of a failed directory fails (EIO)."""
    faults = DiskFaults(disks)
    segment_module._write_fully = faults.write  # type: ignore[assignment]
    try:
        yield faults
    finally:
        segment_module._write_fully = _REAL_WRITE  # type: ignore[assignment]
        faults.disarm()
