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

The write interception is :func:`intercept_segment_writes`, a context manager that wraps the
segment module's one write function for the duration of a run.
"""

from __future__ import annotations

import contextlib
import errno
import os
import random
import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path

import highwater.storage.segment as segment_module

_INDEX_SUFFIXES = (".index", ".timeindex", ".txnindex")


class SimDisk:
    """The data directory of one broker and what of it is durable."""

    def __init__(self, path: Path, rng: random.Random) -> None:
        self.path = path
        self.rng = rng
        self.full = False
        self.torn_writes = 0
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
        for file in sorted(self.path.glob("*/*.log")):
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
        self._durable = {f: f.stat().st_size for f in self.path.glob("*/*.log")}
        return notes

    def owns(self, path: str) -> bool:
        return path.startswith(str(self.path) + os.sep)

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


@contextlib.contextmanager
def intercept_segment_writes(disks: list[SimDisk]) -> Iterator[None]:
    """While active, a segment write to a full :class:`SimDisk` tears and fails (ENOSPC)."""
    real_write = segment_module._write_fully

    def write(fd: int, pieces: list[bytes | bytearray | memoryview], total: int) -> None:
        full = [d for d in disks if d.full]
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
        real_write(fd, pieces, total)

    segment_module._write_fully = write  # type: ignore[assignment]
    try:
        yield
    finally:
        segment_module._write_fully = real_write  # type: ignore[assignment]
