"""Checkpoint files in Kafka's text formats, written atomically (tmp, fsync, rename, dir fsync).

Two formats, both ``<version>\\n<count>\\n`` then one entry per line, version 0:

* offset checkpoints (``recovery-point-offset-checkpoint``, ``replication-offset-checkpoint``,
  ``log-start-offset-checkpoint``, ``cleaner-offset-checkpoint``): ``<topic> <partition> <offset>``;
* the per-partition ``leader-epoch-checkpoint``: ``<epoch> <start_offset>``.

Writes go through :func:`write_atomically`, so after a crash the file holds either the old
or the new contents, never a mix; a leftover ``<name>.tmp`` is ignored and overwritten by
the next write. A missing file reads as empty. A file that does not parse raises
:class:`~highwater.errors.CorruptCheckpointError` naming the file and the line; an I/O
failure raises :class:`~highwater.errors.KafkaStorageError`.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Final, NamedTuple

from highwater.errors import CorruptCheckpointError, InvalidTopicError, KafkaStorageError
from highwater.storage.topic_partition import TopicPartition, validate_topic_name

CHECKPOINT_VERSION: Final = 0
TMP_SUFFIX: Final = ".tmp"

RECOVERY_POINT_CHECKPOINT: Final = "recovery-point-offset-checkpoint"
REPLICATION_OFFSET_CHECKPOINT: Final = "replication-offset-checkpoint"
LOG_START_OFFSET_CHECKPOINT: Final = "log-start-offset-checkpoint"
CLEANER_OFFSET_CHECKPOINT: Final = "cleaner-offset-checkpoint"
LEADER_EPOCH_CHECKPOINT: Final = "leader-epoch-checkpoint"

_INT_RE = re.compile(r"-?[0-9]+", re.ASCII)
_LONG_MIN: Final = -(2**63)
_LONG_MAX: Final = 2**63 - 1
_INT_MAX: Final = 2**31 - 1


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """fsync a directory, making renames and creations in it durable (a no-op on Windows)."""
    if os.name == "nt":  # pragma: no cover - directories cannot be opened there
        return
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(path: str | os.PathLike[str], data: bytes) -> None:
    """Replace the file at ``path`` with ``data`` so that a crash leaves old or new, never a mix.

    Writes ``<path>.tmp``, flushes and fsyncs it, renames it onto ``path`` with
    :func:`os.replace` and fsyncs the directory. Raises :class:`OSError` on failure, after
    removing the temporary file if it can.
    """
    target = Path(path)
    tmp = target.with_name(target.name + TMP_SUFFIX)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise
    fsync_dir(target.parent)


class _Reader:
    """Splits a checkpoint file into numbered lines and reports errors with file and line."""

    def __init__(self, path: Path, data: bytes) -> None:
        self.path = path
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise self.corrupt(data.count(b"\n", 0, e.start) + 1, "not UTF-8 text") from None
        lines = text.split("\n")
        if lines and lines[-1] == "":
            lines.pop()  # the newline that ends the last line
        self.lines = [line.removesuffix("\r") for line in lines]

    def corrupt(self, line_number: int, reason: str) -> CorruptCheckpointError:
        return CorruptCheckpointError(f"checkpoint file {self.path}: line {line_number}: {reason}")

    def integer(self, line_number: int, text: str, what: str, low: int, high: int) -> int:
        if not _INT_RE.fullmatch(text):
            raise self.corrupt(line_number, f"{what} {text!r} is not an integer")
        value = int(text)
        if not low <= value <= high:
            raise self.corrupt(line_number, f"{what} {value} is out of range [{low}, {high}]")
        return value

    def entries(self, fields: int) -> list[tuple[int, list[str]]]:
        """Check the header and the count; return ``(line number, fields)`` of each entry."""
        if not self.lines:
            return []  # an empty file reads as empty, as in Kafka
        version = self.integer(1, self.lines[0].strip(), "version", _LONG_MIN, _LONG_MAX)
        if version != CHECKPOINT_VERSION:
            raise self.corrupt(1, f"unsupported version {version}, expected {CHECKPOINT_VERSION}")
        if len(self.lines) < 2:
            raise self.corrupt(2, "missing the entry count")
        count = self.integer(2, self.lines[1].strip(), "entry count", 0, _LONG_MAX)
        body = self.lines[2:]
        if len(body) < count:
            raise self.corrupt(
                3 + len(body), f"the file ends after {len(body)} of the {count} entries it declares"
            )
        if len(body) > count:
            raise self.corrupt(3 + count, f"more entries than the {count} the header declares")
        result = []
        for index, line_text in enumerate(body):
            number = index + 3
            parts = line_text.split()
            if len(parts) != fields:
                raise self.corrupt(
                    number, f"expected {fields} space-separated fields, got {line_text!r}"
                )
            result.append((number, parts))
        return result


def _read_bytes(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise KafkaStorageError(f"cannot read checkpoint file {path}: {e}") from e


def _write(path: Path, lines: list[str]) -> None:
    data = "".join(line + "\n" for line in lines).encode("utf-8")
    try:
        write_atomically(path, data)
    except OSError as e:
        raise KafkaStorageError(f"cannot write checkpoint file {path}: {e}") from e


class OffsetCheckpointFile:
    """A ``<topic> <partition> <offset>`` checkpoint: recovery points, high watermarks..."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._path = Path(path)
        self._lock = threading.Lock()

    @property
    def path(self) -> Path:
        return self._path

    def read(self) -> dict[TopicPartition, int]:
        """The offsets in the file; an empty dict if the file does not exist."""
        with self._lock:
            data = _read_bytes(self._path)
        if data is None:
            return {}
        reader = _Reader(self._path, data)
        offsets: dict[TopicPartition, int] = {}
        for number, (topic, partition_text, offset_text) in reader.entries(3):
            try:
                validate_topic_name(topic)
            except InvalidTopicError as e:
                raise reader.corrupt(number, str(e)) from None
            partition = reader.integer(number, partition_text, "partition", 0, _INT_MAX)
            offset = reader.integer(number, offset_text, "offset", _LONG_MIN, _LONG_MAX)
            tp = TopicPartition(topic, partition)
            if tp in offsets:
                raise reader.corrupt(number, f"{tp} appears twice")
            offsets[tp] = offset
        return offsets

    def write(self, offsets: Mapping[TopicPartition, int]) -> None:
        """Replace the file's contents with ``offsets`` (sorted by topic and partition)."""
        lines = [str(CHECKPOINT_VERSION), str(len(offsets))]
        for tp in sorted(offsets):
            topic, partition = tp
            validate_topic_name(topic)
            offset = offsets[tp]
            if not 0 <= partition <= _INT_MAX:
                raise ValueError(f"partition {partition} of {topic} is out of range")
            if not _LONG_MIN <= offset <= _LONG_MAX:
                raise ValueError(f"offset {offset} of {tp} is not a 64-bit integer")
            lines.append(f"{topic} {partition} {offset}")
        with self._lock:
            _write(self._path, lines)

    def __repr__(self) -> str:
        return f"OffsetCheckpointFile({str(self._path)!r})"


class EpochEntry(NamedTuple):
    """A leader epoch and the offset of the first record written in it."""

    epoch: int
    start_offset: int

    def __str__(self) -> str:
        return f"EpochEntry(epoch={self.epoch}, start_offset={self.start_offset})"


class LeaderEpochCheckpointFile:
    """A partition's ``leader-epoch-checkpoint``: ``<epoch> <start_offset>`` lines."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._path = Path(path)
        self._lock = threading.Lock()

    @property
    def path(self) -> Path:
        return self._path

    def read(self) -> list[EpochEntry]:
        """The entries in file order; an empty list if the file does not exist.

        Epochs and start offsets must be non-negative; their order is not checked here
        (the cache drops entries that break monotonicity when it loads them, as Kafka does).
        """
        with self._lock:
            data = _read_bytes(self._path)
        if data is None:
            return []
        reader = _Reader(self._path, data)
        entries = []
        for number, (epoch_text, offset_text) in reader.entries(2):
            epoch = reader.integer(number, epoch_text, "epoch", 0, _INT_MAX)
            start_offset = reader.integer(number, offset_text, "start offset", 0, _LONG_MAX)
            entries.append(EpochEntry(epoch, start_offset))
        return entries

    def write(self, entries: Iterable[EpochEntry]) -> None:
        """Replace the file's contents with ``entries``, in the order given."""
        listed = list(entries)
        lines = [str(CHECKPOINT_VERSION), str(len(listed))]
        for epoch, start_offset in listed:
            if not 0 <= epoch <= _INT_MAX or not 0 <= start_offset <= _LONG_MAX:
                raise ValueError(f"invalid leader epoch entry ({epoch}, {start_offset})")
            lines.append(f"{epoch} {start_offset}")
        with self._lock:
            _write(self._path, lines)

    def __repr__(self) -> str:
        return f"LeaderEpochCheckpointFile({str(self._path)!r})"
