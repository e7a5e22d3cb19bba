"""``FileSnapshotStore``: the metadata log's snapshots as files, a ``SnapshotStore`` on disk.

Files, in the metadata log directory, named as Kafka names them (KIP-630)::

    <20-digit end offset>-<10-digit epoch>.checkpoint        a finished snapshot
    <20-digit end offset>-<10-digit epoch>.checkpoint.part   being written or received

A snapshot file is the state machine's bytes followed by a 16-byte trailer::

    payload      the state machine's snapshot, opaque here
    magic        4 bytes, b"HWSN"
    crc          uint32 big-endian, CRC-32C (Castagnoli) of the payload
    length       uint64 big-endian, the payload's length

``FetchSnapshot`` ships the whole file, trailer included, so a follower checks the CRC of
what it received before it makes the snapshot visible. A snapshot is written to its
``.part`` file, fsynced, renamed to its final name and the directory fsynced: a crash
leaves either no snapshot or a whole one. Leftover ``.part`` files (and Kafka's
``.deleted`` ones) are removed when the store opens. A file whose trailer or CRC does not check is
:class:`CorruptSnapshotError`: the store leaves it where it is for inspection and ignores
it, so an older snapshot (or the log) is used instead.

Blocking I/O: the Raft core calls the store from the driver's event loop (receiving a
chunk appends it, unsynced; finishing one fsyncs), as Kafka's raft thread does.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import struct
from pathlib import Path
from typing import Final

import crc32c

from highwater.errors import KafkaStorageError
from highwater.raft.messages import OffsetAndEpoch
from highwater.raft.snapshot import PositionOutOfRangeError, SnapshotNotFoundError
from highwater.storage.checkpoint import fsync_dir

__all__ = [
    "CorruptSnapshotError",
    "FileSnapshotStore",
    "snapshot_file_name",
]

log = logging.getLogger(__name__)

SNAPSHOT_SUFFIX: Final = ".checkpoint"
PARTIAL_SUFFIX: Final = ".part"
DELETED_SUFFIX: Final = ".deleted"
TRAILER: Final = struct.Struct(">4sIQ")
TRAILER_MAGIC: Final = b"HWSN"

_NAME = re.compile(r"([0-9]{20})-([0-9]{10})\.checkpoint", re.ASCII)
_READ_CHUNK = 1 << 20


class CorruptSnapshotError(KafkaStorageError):
    """A snapshot file whose trailer or CRC-32C does not check."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"snapshot file {path}: {reason}")
        self.path = path
        self.reason = reason


def snapshot_file_name(snapshot_id: OffsetAndEpoch) -> str:
    """``00000000000000000100-0000000003.checkpoint`` for end offset 100 and epoch 3."""
    return f"{snapshot_id.offset:020d}-{snapshot_id.epoch:010d}{SNAPSHOT_SUFFIX}"


def parse_snapshot_file_name(name: str) -> OffsetAndEpoch | None:
    """The id a finished snapshot's file name encodes, or None when it is not one."""
    match = _NAME.fullmatch(name)
    if match is None:
        return None
    return OffsetAndEpoch(int(match[1]), int(match[2]))


def _order(snapshot_id: OffsetAndEpoch) -> tuple[int, int]:
    return snapshot_id.offset, snapshot_id.epoch


def _trailer(payload_crc: int, length: int) -> bytes:
    return TRAILER.pack(TRAILER_MAGIC, payload_crc, length)


def verify_snapshot_file(path: Path) -> int:
    """Check a snapshot file's trailer and CRC; return the payload's length."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < TRAILER.size:
                raise CorruptSnapshotError(
                    path, f"{size} bytes, shorter than the {TRAILER.size}-byte trailer"
                )
            f.seek(size - TRAILER.size)
            magic, expected_crc, length = TRAILER.unpack(f.read(TRAILER.size))
            if magic != TRAILER_MAGIC:
                raise CorruptSnapshotError(path, f"bad trailer magic {magic!r}")
            if length != size - TRAILER.size:
                raise CorruptSnapshotError(
                    path,
                    f"trailer says {length} payload bytes, the file holds {size - TRAILER.size}",
                )
            f.seek(0)
            crc, remaining = 0, length
            while remaining:
                chunk = f.read(min(_READ_CHUNK, remaining))
                if not chunk:
                    raise CorruptSnapshotError(path, "the file ended while reading it")
                crc = crc32c.crc32c(chunk, crc)
                remaining -= len(chunk)
    except OSError as e:
        raise KafkaStorageError(f"cannot read snapshot file {path}: {e}") from e
    if crc != expected_crc:
        raise CorruptSnapshotError(
            path, f"CRC-32C of the payload is {crc:#010x}, the trailer says {expected_crc:#010x}"
        )
    return length


class FileSnapshotStore:
    """A :class:`~highwater.raft.snapshot.SnapshotStore` of files in one directory."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self._snapshots: dict[OffsetAndEpoch, Path] = {}
        self._corrupt: dict[Path, CorruptSnapshotError] = {}
        self._receiving: tuple[OffsetAndEpoch, Path, int] | None = None
        self._receiving_fd = -1
        self._scan()

    # --- opening ---------------------------------------------------------------------

    def _scan(self) -> None:
        for path in sorted(self.directory.iterdir()):
            name = path.name
            if name.endswith(SNAPSHOT_SUFFIX + PARTIAL_SUFFIX) or name.endswith(
                SNAPSHOT_SUFFIX + DELETED_SUFFIX
            ):
                log.info("%s: removing a leftover of an interrupted snapshot write", path)
                path.unlink(missing_ok=True)
                continue
            snapshot_id = parse_snapshot_file_name(name)
            if snapshot_id is None:
                continue
            try:
                verify_snapshot_file(path)
            except CorruptSnapshotError as e:
                log.error("%s; ignoring it, an older snapshot or the log is used instead", e)
                self._corrupt[path] = e
                continue
            self._snapshots[snapshot_id] = path

    @property
    def corrupt(self) -> dict[Path, CorruptSnapshotError]:
        """The snapshot files found corrupt (and ignored), with what is wrong with them."""
        return dict(self._corrupt)

    # --- SnapshotStore ---------------------------------------------------------------

    def latest(self) -> OffsetAndEpoch | None:
        if not self._snapshots:
            return None
        return max(self._snapshots, key=_order)

    def snapshots(self) -> list[OffsetAndEpoch]:
        return sorted(self._snapshots, key=_order)

    def path_of(self, snapshot_id: OffsetAndEpoch) -> Path:
        path = self._snapshots.get(snapshot_id)
        if path is None:
            raise SnapshotNotFoundError(f"no snapshot {snapshot_id} in {self.directory}")
        return path

    def read_chunk(
        self, snapshot_id: OffsetAndEpoch, position: int, max_bytes: int
    ) -> tuple[bytes, int]:
        path = self.path_of(snapshot_id)
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if not 0 <= position <= size:
                    raise PositionOutOfRangeError(
                        f"position {position} is outside snapshot {snapshot_id} of {size} bytes"
                    )
                return os.pread(f.fileno(), max(0, max_bytes), position), size
        except FileNotFoundError:
            self._snapshots.pop(snapshot_id, None)
            raise SnapshotNotFoundError(f"snapshot file {path} is gone") from None
        except OSError as e:
            raise KafkaStorageError(f"cannot read snapshot file {path}: {e}") from e

    def read(self, snapshot_id: OffsetAndEpoch) -> bytes:
        """The state machine's bytes of a snapshot, after checking the file's CRC."""
        path = self.path_of(snapshot_id)
        length = verify_snapshot_file(path)
        try:
            with open(path, "rb") as f:
                return f.read(length)
        except OSError as e:
            raise KafkaStorageError(f"cannot read snapshot file {path}: {e}") from e

    def write(self, snapshot_id: OffsetAndEpoch, data: bytes) -> None:
        self.add(snapshot_id, self.write_file(snapshot_id, data))

    def write_file(self, snapshot_id: OffsetAndEpoch, data: bytes) -> Path:
        """Write a snapshot's file durably, without making it visible (see :meth:`add`).

        Touches no state of the store: a worker thread may run it while the owner serves.
        """
        final = self.directory / snapshot_file_name(snapshot_id)
        partial = final.with_name(final.name + PARTIAL_SUFFIX)
        try:
            with open(partial, "wb") as f:
                f.write(data)
                f.write(_trailer(crc32c.crc32c(data), len(data)))
                f.flush()
                os.fsync(f.fileno())
            os.replace(partial, final)
            fsync_dir(self.directory)
        except OSError as e:
            with contextlib.suppress(OSError):
                partial.unlink(missing_ok=True)
            raise KafkaStorageError(f"cannot write snapshot file {final}: {e}") from e
        return final

    def add(self, snapshot_id: OffsetAndEpoch, path: Path) -> None:
        """Make a snapshot written by :meth:`write_file` visible."""
        self._corrupt.pop(path, None)
        self._snapshots[snapshot_id] = path

    def begin_receive(self, snapshot_id: OffsetAndEpoch) -> None:
        self._abort_receive()
        partial = self.directory / (snapshot_file_name(snapshot_id) + PARTIAL_SUFFIX)
        try:
            fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        except OSError as e:
            raise KafkaStorageError(f"cannot create snapshot file {partial}: {e}") from e
        self._receiving = (snapshot_id, partial, 0)
        self._receiving_fd = fd

    def receive_chunk(self, position: int, data: bytes) -> None:
        if self._receiving is None:
            raise RuntimeError("no snapshot is being received")
        snapshot_id, partial, received = self._receiving
        if position != received:
            raise PositionOutOfRangeError(
                f"chunk at {position} of snapshot {snapshot_id}, {received} bytes received"
            )
        view = memoryview(data)
        try:
            while view:
                written = os.write(self._receiving_fd, view)
                view = view[written:]
        except OSError as e:
            self._abort_receive()
            raise KafkaStorageError(f"cannot write snapshot file {partial}: {e}") from e
        self._receiving = (snapshot_id, partial, received + len(data))

    def finish_receive(self) -> OffsetAndEpoch:
        if self._receiving is None:
            raise RuntimeError("no snapshot is being received")
        snapshot_id, partial, _ = self._receiving
        final = self.directory / snapshot_file_name(snapshot_id)
        try:
            os.fsync(self._receiving_fd)
            os.close(self._receiving_fd)
            self._receiving_fd = -1
            self._receiving = None
            verify_snapshot_file(partial)
            os.replace(partial, final)
            fsync_dir(self.directory)
        except (OSError, CorruptSnapshotError) as e:
            self._abort_receive()
            with contextlib.suppress(OSError):
                partial.unlink(missing_ok=True)
            if isinstance(e, CorruptSnapshotError):
                raise
            raise KafkaStorageError(f"cannot finish snapshot file {final}: {e}") from e
        self._corrupt.pop(final, None)
        self._snapshots[snapshot_id] = final
        return snapshot_id

    def delete_before(self, snapshot_id: OffsetAndEpoch) -> None:
        doomed = [s for s in self._snapshots if _order(s) < _order(snapshot_id)]
        if not doomed:
            return
        for old in doomed:
            path = self._snapshots.pop(old)
            try:
                path.unlink(missing_ok=True)
            except OSError as e:
                raise KafkaStorageError(f"cannot delete snapshot file {path}: {e}") from e
        fsync_dir(self.directory)

    # --- lifecycle -------------------------------------------------------------------

    def _abort_receive(self) -> None:
        if self._receiving_fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._receiving_fd)
            self._receiving_fd = -1
        if self._receiving is not None:
            with contextlib.suppress(OSError):
                self._receiving[1].unlink(missing_ok=True)
            self._receiving = None

    def close(self) -> None:
        """Drop a snapshot being received (it would be discarded at the next open anyway)."""
        self._abort_receive()

    def __repr__(self) -> str:
        return f"FileSnapshotStore({str(self.directory)!r}, {self.snapshots()})"
