"""``highwater dump-log``: print a data directory's files as plain text, like ``kafka-dump-log.sh``.

It reads, never writes: segment logs, offset and time indexes, producer-state snapshots,
the leader-epoch checkpoint and the offset checkpoints are opened read-only and parsed
here, so that a damaged file can be inspected as it is (the storage classes would repair
or preallocate it). The output is Kafka's, one line per batch, record or entry, to be read
with ``grep`` and ``awk``; every problem found is printed too, in the dump where it was
found, and makes the command exit with status 1 once every file has been dumped.
"""

from __future__ import annotations

import os
import struct
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import click

from highwater.errors import HighwaterError
from highwater.records.batch import RecordBatch
from highwater.records.header import (
    BATCH_HEADER_SIZE,
    HEADER_STRUCT,
    LOG_OVERHEAD,
    MAGIC,
    NO_SEQUENCE,
    TIMESTAMP_TYPE_MASK,
    BatchHeader,
    Compression,
    check_batch,
)
from highwater.records.record import Record
from highwater.storage.checkpoint import (
    CLEANER_OFFSET_CHECKPOINT,
    LEADER_EPOCH_CHECKPOINT,
    LOG_START_OFFSET_CHECKPOINT,
    RECOVERY_POINT_CHECKPOINT,
    REPLICATION_OFFSET_CHECKPOINT,
    LeaderEpochCheckpointFile,
    OffsetCheckpointFile,
)
from highwater.storage.index import OffsetIndex, TimeIndex
from highwater.storage.producer_state import read_snapshot
from highwater.storage.segment import (
    CLEANED_SUFFIX,
    DELETED_SUFFIX,
    INDEX_SUFFIX,
    LOG_SUFFIX,
    SNAPSHOT_SUFFIX,
    SWAP_SUFFIX,
    TIME_INDEX_SUFFIX,
)

OFFSET_CHECKPOINTS = frozenset(
    {
        RECOVERY_POINT_CHECKPOINT,
        REPLICATION_OFFSET_CHECKPOINT,
        LOG_START_OFFSET_CHECKPOINT,
        CLEANER_OFFSET_CHECKPOINT,
    }
)
# Suffixes a segment's files carry while they are being deleted, cleaned or swapped in.
TRANSIENT_SUFFIXES = (DELETED_SUFFIX, CLEANED_SUFFIX, SWAP_SUFFIX)
SEGMENT_SUFFIXES = (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX, SNAPSHOT_SUFFIX)
KNOWN_FILES = (
    "*.log, *.index, *.timeindex, *.snapshot (also with .deleted, .cleaned or .swap), "
    f"{LEADER_EPOCH_CHECKPOINT}, " + ", ".join(sorted(OFFSET_CHECKPOINTS))
)

SEQUENCE_MODULUS = 1 << 31

# Control characters would break the one-line-per-record layout; they are shown escaped.
_ESCAPES = {c: f"\\x{c:02x}" for c in (*range(0x20), 0x7F)} | {
    ord("\n"): "\\n",
    ord("\r"): "\\r",
    ord("\t"): "\\t",
}


def display(data: bytes | str) -> str:
    """Bytes as UTF-8 text (invalid sequences replaced), control characters escaped."""
    text = data if isinstance(data, str) else data.decode("utf-8", errors="replace")
    return text if text.isprintable() else text.translate(_ESCAPES)


def _bool(value: bool) -> str:
    return "true" if value else "false"


# --- file types ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FileKind:
    """What a file is, judged by its name: ``kind`` and, for segment files, its name parts."""

    kind: str  # "log", "index", "timeindex", "snapshot", "leader-epoch", "offset-checkpoint"
    stem: str = ""  # the name before the type suffix: the base offset of a segment
    transient: str = ""  # a trailing .deleted, .cleaned or .swap

    def sibling(self, path: Path, suffix: str) -> Path:
        """The file of the same segment with type ``suffix`` (``.log`` beside an index)."""
        return path.with_name(self.stem + suffix + self.transient)

    @property
    def base_offset(self) -> int | None:
        return int(self.stem) if self.stem.isdigit() else None


def classify(path: Path) -> FileKind | None:
    """The kind of file ``path`` names, or None when dump-log cannot read it."""
    name = path.name
    if name == LEADER_EPOCH_CHECKPOINT:
        return FileKind("leader-epoch")
    if name in OFFSET_CHECKPOINTS:
        return FileKind("offset-checkpoint")
    transient = next((s for s in TRANSIENT_SUFFIXES if name.endswith(s)), "")
    name = name.removesuffix(transient) if transient else name
    for suffix in SEGMENT_SUFFIXES:
        if name.endswith(suffix) and len(name) > len(suffix):
            return FileKind(suffix.lstrip("."), name[: -len(suffix)], transient)
    return None


# --- reading a .log file -------------------------------------------------------------------


def frame_problem(raw: bytes, position: int, file_size: int) -> str | None:
    """Why the bytes at ``position`` cannot be the header of a batch, or None if they can.

    Only the framing is checked (enough bytes, magic, a length that fits the file): a
    batch that passes can be stepped over, whatever its CRC says.
    """
    if len(raw) < BATCH_HEADER_SIZE:
        return f"a batch header needs {BATCH_HEADER_SIZE} bytes, only {len(raw)} remain"
    header = BatchHeader._make(HEADER_STRUCT.unpack_from(raw))
    if header.magic != MAGIC:
        return f"magic byte {header.magic}, expected {MAGIC}"
    if header.batch_length < BATCH_HEADER_SIZE - LOG_OVERHEAD:
        return f"batch length {header.batch_length} is shorter than a batch header"
    if position + header.size > file_size:
        return (
            f"truncated batch at offset {header.base_offset}: {header.size} bytes long, "
            f"only {file_size - position} remain"
        )
    return None


class LogFile:
    """A ``.log`` file opened read-only, walked batch header by batch header."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd = os.open(path, os.O_RDONLY)
        self.size = os.fstat(self._fd).st_size
        self.invalid_at: int | None = None  # where the walk met bytes that are not a batch
        self.invalid_reason = ""

    def __enter__(self) -> LogFile:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def batches(self) -> Iterator[tuple[int, BatchHeader]]:
        """(position, header) of each batch; stops at the first bytes that are not one.

        When it stops early, :attr:`invalid_at` and :attr:`invalid_reason` say where and why.
        """
        position = 0
        while position < self.size:
            raw = os.pread(self._fd, BATCH_HEADER_SIZE, position)
            problem = frame_problem(raw, position, self.size)
            if problem is not None:
                self.invalid_at, self.invalid_reason = position, problem
                return
            header = BatchHeader._make(HEADER_STRUCT.unpack_from(raw))
            yield position, header
            position += header.size

    def read(self, position: int, size: int) -> bytes:
        return os.pread(self._fd, size, position)

    @property
    def valid_end(self) -> int:
        """Where the batches end: the file size, or the start of the invalid tail."""
        return self.size if self.invalid_at is None else self.invalid_at


def batch_is_valid(data: bytes) -> bool:
    """Kafka's ``isvalid``: the CRC matches (and the header's fields are in range)."""
    try:
        check_batch(data, 0, verify_crc=True)
    except HighwaterError:
        return False
    return True


def timestamp_type_name(header: BatchHeader) -> str:
    return "LogAppendTime" if header.attributes & TIMESTAMP_TYPE_MASK else "CreateTime"


def codec_name(header: BatchHeader) -> str:
    code = header.attributes & 0x07
    try:
        return Compression(code).name.lower()
    except ValueError:
        return f"unknown({code})"


def format_batch(position: int, header: BatchHeader, valid: bool) -> str:
    """One batch the way ``kafka-dump-log.sh`` prints it."""
    horizon = (
        f"OptionalLong[{header.base_timestamp}]"
        if header.has_delete_horizon
        else "OptionalLong.empty"
    )
    return (
        f"baseOffset: {header.base_offset} lastOffset: {header.last_offset} "
        f"count: {header.records_count} baseSequence: {header.base_sequence} "
        f"lastSequence: {header.last_sequence} producerId: {header.producer_id} "
        f"producerEpoch: {header.producer_epoch} "
        f"partitionLeaderEpoch: {header.partition_leader_epoch} "
        f"isTransactional: {_bool(header.is_transactional)} "
        f"isControl: {_bool(header.is_control)} deleteHorizonMs: {horizon} "
        f"position: {position} {timestamp_type_name(header)}: {header.max_timestamp} "
        f"size: {header.size} magic: {header.magic} compresscodec: {codec_name(header)} "
        f"crc: {header.crc} isvalid: {_bool(valid)}"
    )


def record_sequence(header: BatchHeader, record: Record) -> int:
    if header.base_sequence == NO_SEQUENCE:
        return NO_SEQUENCE
    return (header.base_sequence + record.offset - header.base_offset) % SEQUENCE_MODULUS


def format_record(header: BatchHeader, record: Record, print_data: bool) -> str:
    """One record the way ``kafka-dump-log.sh --deep-iteration`` prints it.

    With ``print_data`` the key and the payload follow, each left out when null (as Kafka
    does: a tombstone has no ``payload:``).
    """
    key, value = record.key, record.value
    header_keys = ",".join(display(name) for name, _ in record.headers)
    line = (
        f"| offset: {record.offset} {timestamp_type_name(header)}: {record.timestamp} "
        f"keySize: {-1 if key is None else len(key)} "
        f"valueSize: {-1 if value is None else len(value)} "
        f"sequence: {record_sequence(header, record)} headerKeys: [{header_keys}]"
    )
    if print_data:
        if key is not None:
            line += f" key: {display(key)}"
        if value is not None:
            line += f" payload: {display(value)}"
    return line


# --- reading index files -------------------------------------------------------------------


def read_index_entries(path: Path, entry: struct.Struct) -> tuple[list[tuple[int, int]], int]:
    """The entries of an index file and the count of bytes after the last whole entry.

    Trailing all-zero entries are the unused, preallocated part of an active segment's
    index (or of one a crash left untrimmed); they are not entries and are left out.
    """
    data = path.read_bytes()
    partial = len(data) % entry.size
    used = len(data[: len(data) - partial].rstrip(b"\x00"))
    whole = -(-used // entry.size) * entry.size  # up to the end of the last non-zero entry
    entries = [(int(a), int(b)) for a, b in entry.iter_unpack(data[:whole])]
    return entries, partial


def check_offset_index_order(base: int, entries: list[tuple[int, int]]) -> list[str]:
    """Problems with the order of ``.index`` entries: both fields must strictly increase."""
    problems = []
    previous: tuple[int, int] | None = None
    for n, (relative, position) in enumerate(entries):
        if relative < 0 or position < 0:
            problems.append(
                f"  Entry {n} (offset: {base + relative} position: {position}) lies before "
                f"the segment's base offset {base} or the start of the log"
            )
        elif previous is not None and (relative <= previous[0] or position <= previous[1]):
            problems.append(
                f"  Entry {n} (offset: {base + relative} position: {position}) does not "
                f"follow (offset: {base + previous[0]} position: {previous[1]})"
            )
        previous = (relative, position)
    return problems


def check_time_index_order(base: int, entries: list[tuple[int, int]]) -> list[str]:
    """Problems with the order of ``.timeindex`` entries: timestamps strictly increase,
    offsets never decrease."""
    problems = []
    previous: tuple[int, int] | None = None
    for n, (timestamp, relative) in enumerate(entries):
        if relative < 0:
            problems.append(
                f"  Entry {n} (timestamp: {timestamp} offset: {base + relative}) lies before "
                f"the segment's base offset {base}"
            )
        elif previous is not None and (timestamp <= previous[0] or relative < previous[1]):
            problems.append(
                f"  Entry {n} (timestamp: {timestamp} offset: {base + relative}) does not "
                f"follow (timestamp: {previous[0]} offset: {base + previous[1]})"
            )
        previous = (timestamp, relative)
    return problems


def check_offset_index_against_log(
    base: int, entries: list[tuple[int, int]], log: LogFile
) -> list[str]:
    """Each entry must point at the start of a batch whose last offset is the entry's offset."""
    targets = sorted((position, base + relative) for relative, position in entries)
    problems = []
    k = 0
    for position, header in log.batches():
        while k < len(targets) and targets[k][0] <= position:
            target_position, offset = targets[k]
            if target_position < position:
                problems.append(
                    f"  Index offset: {offset}, position: {target_position} is not the start "
                    f"of a batch"
                )
            elif header.last_offset != offset:
                problems.append(f"  Index offset: {offset}, log offset: {header.last_offset}")
            k += 1
        if k == len(targets):
            break
    for target_position, offset in targets[k:]:
        problems.append(
            f"  Index offset: {offset}, position: {target_position} is not the start of a "
            f"whole batch (the log's whole batches end at byte {log.valid_end})"
        )
    return problems


def check_time_index_against_log(
    base: int, entries: list[tuple[int, int]], log: LogFile
) -> list[str]:
    """Each entry must name the last offset of a batch whose largest timestamp it holds."""
    targets = sorted((base + relative, timestamp) for timestamp, relative in entries)
    problems = []
    k = 0
    last_offset = -1
    for _, header in log.batches():
        last_offset = header.last_offset
        while k < len(targets) and targets[k][0] <= header.last_offset:
            offset, timestamp = targets[k]
            if offset != header.last_offset:
                problems.append(f"  Index offset: {offset}, log offset: {header.last_offset}")
            elif timestamp != header.max_timestamp:
                problems.append(
                    f"  Index timestamp: {timestamp}, log timestamp: {header.max_timestamp} "
                    f"(offset: {offset})"
                )
            k += 1
        if k == len(targets):
            break
    for offset, _ in targets[k:]:
        problems.append(
            f"  Index offset: {offset} is past the last offset in the log ({last_offset})"
        )
    return problems


# --- the dumper ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DumpOptions:
    deep_iteration: bool = False
    print_data_log: bool = False
    max_bytes: int | None = None
    index_sanity_check: bool = False


class Dumper:
    """Dumps files one after another and remembers whether any of them had a problem."""

    def __init__(self, options: DumpOptions) -> None:
        self.options = options
        self.failed = False
        self._stdout = sys.stdout  # written directly: click.echo per line halves the speed

    # -- output

    def out(self, line: str) -> None:
        self._stdout.write(line + "\n")

    def problem(self, line: str) -> None:
        """A problem found in a file's contents: part of the dump, printed to stdout."""
        self.out(line)
        self.failed = True

    def error(self, path: Path, message: str) -> None:
        """A file that could not be dumped at all: printed to stderr."""
        self._stdout.flush()
        click.echo(f"Error: {path}: {message}", err=True)
        self.failed = True

    # -- dispatch

    def dump(self, path: Path) -> None:
        kind = classify(path)
        if kind is None:
            self.error(path, f"unknown file type; dump-log reads {KNOWN_FILES}")
            return
        if not path.exists():
            self.error(path, "no such file")
            return
        if path.is_dir():
            self.error(path, "is a directory")
            return
        self.out(f"Dumping {path}")
        try:
            if kind.kind == "log":
                self.dump_log(path, kind)
            elif kind.kind in ("index", "timeindex"):
                self.dump_index(path, kind)
            elif kind.kind == "snapshot":
                self.dump_snapshot(path)
            elif kind.kind == "leader-epoch":
                self.dump_leader_epoch_checkpoint(path)
            else:
                self.dump_offset_checkpoint(path)
        except HighwaterError as e:
            self.error(path, str(e))
        except BrokenPipeError:
            raise  # the reader went away (``| head``): click ends the command quietly
        except OSError as e:
            self.error(path, f"cannot read: {e.strerror or e}")

    # -- .log

    def dump_log(self, path: Path, kind: FileKind) -> None:
        options = self.options
        deep = options.deep_iteration or options.print_data_log
        with LogFile(path) as log:
            batches = log.batches()
            first = next(batches, None)
            start = kind.base_offset
            if start is None:
                start = first[1].base_offset if first is not None else 0
            self.out(f"Log starting offset: {start}")
            next_offset = start  # no batch may hold offsets below this one
            current = first
            while current is not None:
                position, header = current
                if options.max_bytes is not None and position + header.size > options.max_bytes:
                    return  # as Kafka: the dump stops quietly at the limit
                if header.base_offset < next_offset:
                    self.problem(
                        f"Offsets go back in {path} at position {position}: base offset "
                        f"{header.base_offset}, expected {next_offset} or more"
                    )
                data = log.read(position, header.size)
                valid = batch_is_valid(data)
                if not valid:
                    self.failed = True
                self.out(format_batch(position, header, valid))
                if deep:
                    self.dump_records(position, data)
                next_offset = header.next_offset
                current = next(batches, None)
            if log.invalid_at is not None:
                self.problem(
                    f"Found {log.size - log.invalid_at} invalid bytes at the end of {path} "
                    f"(position {log.invalid_at}): {log.invalid_reason}"
                )

    def dump_records(self, position: int, data: bytes) -> None:
        print_data = self.options.print_data_log
        try:
            batch = RecordBatch(data, 0, verify_crc=False)
            for record in batch.records():
                self.out(format_record(batch.header, record, print_data))
        except HighwaterError as e:
            self.problem(f"| cannot read the records of the batch at position {position}: {e}")

    # -- .index and .timeindex

    def dump_index(self, path: Path, kind: FileKind) -> None:
        base = kind.base_offset
        if base is None:
            self.error(path, "the file name does not start with the segment's base offset")
            return
        is_time = kind.kind == "timeindex"
        entry = TimeIndex.ENTRY if is_time else OffsetIndex.ENTRY
        entries, partial = read_index_entries(path, entry)
        sanity_only = self.options.index_sanity_check
        if not sanity_only:
            for a, b in entries:
                if is_time:
                    self.out(f"timestamp: {a} offset: {base + b}")
                else:
                    self.out(f"offset: {base + a} position: {b}")
        problems = (
            check_time_index_order(base, entries)
            if is_time
            else check_offset_index_order(base, entries)
        )
        if partial:
            problems.append(
                f"  {partial} bytes at the end do not make a whole entry "
                f"(entries are {entry.size} bytes)"
            )
        log_path = kind.sibling(path, LOG_SUFFIX)
        log_present = log_path.is_file()
        if log_present:
            with LogFile(log_path) as log:
                if is_time:
                    problems += check_time_index_against_log(base, entries, log)
                else:
                    problems += check_offset_index_against_log(base, entries, log)
        if problems:
            self.problem(f"Mismatches in {path}")
            for line in problems:
                self.out(line)
            if sanity_only:
                self.out(f"{path} failed sanity check: {len(problems)} problems")
        elif sanity_only:
            note = "" if log_present else f" (no {log_path.name} beside it to check entries)"
            self.out(f"{path} passed sanity check.{note}")

    # -- .snapshot

    def dump_snapshot(self, path: Path) -> None:
        offset, entries = read_snapshot(path)
        self.out(f"Snapshot offset: {offset} producers: {len(entries)}")
        deep = self.options.deep_iteration or self.options.print_data_log
        for entry in entries:
            self.out(
                f"producerId: {entry.producer_id} producerEpoch: {entry.producer_epoch} "
                f"lastSequence: {entry.last_seq} lastOffset: {entry.last_data_offset} "
                f"lastTimestamp: {entry.last_timestamp} firstSequence: {entry.first_seq} "
                f"firstOffset: {entry.first_data_offset} batches: {len(entry.batches)}"
            )
            if deep:
                for batch in entry.batches:
                    self.out(
                        f"| firstSequence: {batch.first_seq} lastSequence: {batch.last_seq} "
                        f"firstOffset: {batch.first_offset} lastOffset: {batch.last_offset} "
                        f"timestamp: {batch.timestamp}"
                    )

    # -- checkpoints

    def dump_leader_epoch_checkpoint(self, path: Path) -> None:
        for entry in LeaderEpochCheckpointFile(path).read():
            self.out(f"epoch: {entry.epoch} startOffset: {entry.start_offset}")

    def dump_offset_checkpoint(self, path: Path) -> None:
        for (topic, partition), offset in OffsetCheckpointFile(path).read().items():
            self.out(f"topic: {topic} partition: {partition} offset: {offset}")


# --- the command ---------------------------------------------------------------------------


@click.command("dump-log")
@click.argument("files", nargs=-1, type=click.Path(path_type=Path))
@click.option(
    "--files",
    "file_lists",
    multiple=True,
    metavar="FILE[,FILE...]",
    help="Files to dump, comma-separated, as kafka-dump-log.sh takes them.",
)
@click.option(
    "--print-data-log",
    is_flag=True,
    help="Print each record's key and payload (as UTF-8); implies --deep-iteration.",
)
@click.option(
    "--deep-iteration",
    is_flag=True,
    help="Print every record of every batch, not only the batches.",
)
@click.option(
    "--max-bytes",
    type=click.IntRange(min=0),
    default=None,
    help="Stop a .log dump before the first batch that ends past this many bytes.",
)
@click.option(
    "--index-sanity-check",
    is_flag=True,
    help="For index files, only report whether they are consistent (with the .log beside "
    "them, when there is one) instead of printing their entries.",
)
def dump_log(
    files: tuple[Path, ...],
    file_lists: tuple[str, ...],
    print_data_log: bool,
    deep_iteration: bool,
    max_bytes: int | None,
    index_sanity_check: bool,
) -> None:
    """Print segment, index, snapshot and checkpoint files as text.

    Reads each FILE without changing it and prints it in kafka-dump-log.sh's format:
    .log files one line per batch (and per record with --deep-iteration), .index and
    .timeindex files one line per entry, .snapshot files one line per producer,
    leader-epoch-checkpoint and offset checkpoint files one line per entry.

    Damage is reported where it is found (a batch whose CRC fails prints
    "isvalid: false"; a torn tail prints "Found N invalid bytes at the end of ...";
    index entries that do not match the log print "Mismatches in ..."), and the
    command exits with status 1 after dumping every file it can.
    """
    paths = list(files) + [Path(p) for group in file_lists for p in group.split(",") if p]
    if not paths:
        raise click.UsageError("give at least one file to dump")
    dumper = Dumper(
        DumpOptions(
            deep_iteration=deep_iteration,
            print_data_log=print_data_log,
            max_bytes=max_bytes,
            index_sanity_check=index_sanity_check,
        )
    )
    for path in paths:
        dumper.dump(path)
    if dumper.failed:
        raise click.exceptions.Exit(1)
