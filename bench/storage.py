"""Storage-engine benchmarks: append, random read, crash and clean recovery, compaction.

Every figure is measured next to a peer or physical floor in the same run, on the same
filesystem: ``dd`` for appends, ``os.pread`` of the same sizes for reads, one plain read of
the same files for crash recovery, a sequential CRC-checked read for compaction. Logs are
1 GiB each (times ``--scale``) under ``bench-data/storage/``, deleted as soon as a
benchmark is done with them. When a target is missed, the workload is re-run (smaller)
under cProfile and the functions the time goes to are written into the report.
"""

from __future__ import annotations

import functools
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from highwater.config.topic import LogConfig
from highwater.records import build_batch
from highwater.records.header import ATTRIBUTES_OFFSET, BATCH_HEADER_SIZE, HEADER_STRUCT
from highwater.records.header import crc32c as crc32c_of
from highwater.records.record import SimpleRecord
from highwater.storage.log import PartitionLog
from highwater.storage.log_loader import load_partition_log
from highwater.storage.log_manager import LogManager
from highwater.storage.topic_partition import TopicPartition

from bench._pure_python import run_pure
from bench._writer import sized_batch
from bench.report import (
    REPO_ROOT,
    Report,
    Row,
    SuiteSection,
    Target,
    at_least,
    at_most,
    format_value,
    percentile,
    profile_hotspots,
    ratio_at_least,
)

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
MB = 1_000_000  # throughput is in MB/s (10^6 bytes), as dd reports it
TP = TopicPartition("bench", 0)
SEED = 20240601

APPEND_REPEATS = 3  # best of N, for ours and for dd alike
APPEND_TARGET = 0.70  # of dd
READ_COUNT = 20_000
READ_MAX_BYTES = 64 * KiB
READ_P99_TARGET_US = 200.0
RECOVERY_UNCLEAN_TARGET_S = 5.0
RECOVERY_SMALL_BATCHES_TARGET_S = 2.0  # 1 GiB of ~1 KiB batches
COMPACTION_TARGET_MBPS = 300.0
PURE_COMPACTION_BYTES = 256 * MiB  # the pure-Python compaction pass: its rate is per byte
RECOVERY_CLEAN_TARGET_S = 0.5
PROFILE_APPEND_BYTES = 128 * MiB
PROFILE_READS = 2_000
PROFILE_COMPACTION_BYTES = 128 * MiB
PROFILE_RECOVERY_BYTES = 128 * MiB


@dataclass(slots=True)
class SmallBatchLog:
    """The random-read benchmark's log, kept for the small-batch recovery benchmark."""

    directory: Path
    files: list[Path]
    batches: int


@dataclass(slots=True)
class Context:
    report: Report
    section: SuiteSection
    root: Path
    total: int  # bytes per log: 1 GiB at scale 1
    small_batch_log: SmallBatchLog | None = None

    def progress(self, message: str) -> None:
        self.report.progress(f"storage: {message}")


def run(report: Report) -> None:
    """Run the storage benchmarks and add their section to ``report``."""
    total = max(16 * MiB, int(GiB * report.scale))
    with (
        report.suite("storage", "Storage engine (`highwater.storage`)") as section,
        report.data_dir("storage", need_bytes=total * 3) as root,
    ):
        context = Context(report, section, root, total)
        section.note(
            f"Data: `{root}`; each log is {total / GiB:.2f} GiB, written by this run and "
            f"deleted after its benchmark. MB/s are 10^6 bytes per second."
        )
        for benchmark in (bench_append, bench_read, bench_recovery, bench_compaction):
            _guarded(context, benchmark)


def _guarded(context: Context, benchmark: Callable[[Context], None]) -> None:
    """Run one benchmark; a crash becomes a NOT RUN row instead of ending the suite."""
    try:
        benchmark(context)
    except Exception as error:
        traceback.print_exc()
        context.section.add(
            Row(
                benchmark.__name__.removeprefix("bench_"),
                None,
                "",
                error=f"{type(error).__name__}: {error}",
            )
        )


# -- helpers ----------------------------------------------------------------------------------


def _mbps(nbytes: int, ns: int) -> float:
    return nbytes / MB / (ns / 1e9)


def _settle() -> None:
    """Write back whatever is dirty so the next measurement starts from a quiet disk."""
    os.sync()
    time.sleep(0.5)


def _segment_files(directory: Path, suffix: str = ".log") -> list[Path]:
    return sorted(p for p in directory.iterdir() if p.name.endswith(suffix))


def _read_files(paths: Iterable[Path], chunk: int = MiB) -> int:
    """Read files start to end into one reused buffer (what reading costs at least)."""
    buffer = bytearray(chunk)
    total = 0
    for path in paths:
        with open(path, "rb", buffering=0) as f:
            while n := f.readinto(buffer):
                total += n
    return total


def _evict(paths: Iterable[Path]) -> None:
    """Drop these files' pages from the page cache (fsync first: only clean pages go)."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _open_log(directory: Path, config: LogConfig | None = None) -> PartitionLog:
    return load_partition_log(directory, config or LogConfig(), had_clean_shutdown=True)


def _close_files_only(partition_log: PartitionLog) -> None:
    """Close a log's files without the clean-shutdown work (no flush, no snapshot)."""
    for segment in partition_log.segments:
        segment.close()


# -- append -----------------------------------------------------------------------------------


def _append_loop(
    partition_log: PartitionLog,
    pool: list[bytes],
    count: int,
    *,
    flush: bool,
    progress: Callable[[str], None] | None = None,
) -> tuple[int, int]:
    """Append ``count`` batches cycling through ``pool`` (then flush); the wall time and the
    process's CPU time in ns."""
    append = partition_log.append_as_leader
    # The batches in the order they are appended, listed beforehand and appended a quarter
    # at a time (with a progress line between quarters): the loop around the appends costs
    # a list iteration each, not an index computation and a progress check.
    order = [pool[i % len(pool)] for i in range(count)]
    quarters = [order[count * q // 4 : count * (q + 1) // 4] for q in range(4)]
    cpu_start = time.process_time_ns()
    start = time.perf_counter_ns()
    for q, quarter in enumerate(quarters):
        for batch in quarter:
            append(batch, 0)  # positional, as the broker calls it
        if progress is not None:
            progress(f"{(q + 1) / 4:4.0%}")
    if flush:
        partition_log.flush()
    return time.perf_counter_ns() - start, time.process_time_ns() - cpu_start


def _append_run(
    directory: Path,
    pool: list[bytes],
    count: int,
    *,
    flush: bool,
    progress: Callable[[str], None] | None = None,
    profile: bool = False,
) -> tuple[int, int, str]:
    """:func:`_append_loop` on a fresh log, deleted afterwards: (wall ns, CPU ns, cProfile
    text if asked)."""
    shutil.rmtree(directory, ignore_errors=True)
    partition_log = _open_log(directory)
    try:
        if profile:
            return (
                0,
                0,
                profile_hotspots(lambda: _append_loop(partition_log, pool, count, flush=flush)),
            )
        elapsed, cpu = _append_loop(partition_log, pool, count, flush=flush, progress=progress)
        if partition_log.log_end_offset <= 0:
            raise AssertionError("nothing was appended")
        return elapsed, cpu, ""
    finally:
        _close_files_only(partition_log)
        shutil.rmtree(directory)


def _write_loop(path: Path, pool: list[bytes], count: int, *, fsync: bool) -> int:
    """The bare minimum in Python: ``os.write`` the same batches, then fdatasync; ns."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_TRUNC, 0o644)
    try:
        write = os.write
        order = [pool[i % len(pool)] for i in range(count)]  # as _append_loop lists them
        start = time.perf_counter_ns()
        for batch in order:
            write(fd, batch)
        if fsync:
            os.fdatasync(fd)
        return time.perf_counter_ns() - start
    finally:
        os.close(fd)
        path.unlink()


def _dd_run(path: Path, block_size: int, count: int, *, fsync: bool) -> tuple[int, int]:
    """``dd if=/dev/zero of=path bs=block_size count=count [conv=fdatasync]``: the wall time
    and dd's own CPU time (user and system, from the children's resource usage) in ns."""
    command = ["dd", "if=/dev/zero", f"of={path}", f"bs={block_size}", f"count={count}"]
    command += ["status=none"] + (["conv=fdatasync"] if fsync else [])
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter_ns()
    subprocess.run(command, check=True)
    elapsed = time.perf_counter_ns() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    path.unlink()
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return elapsed, int(cpu * 1e9)


def bench_append(context: Context) -> None:
    """Append throughput with 16 KiB and 1 MiB batches, against dd, with and without fsync."""
    rng = random.Random(SEED)
    directory = context.root / "append" / TP.dir_name
    dd_path = context.root / "append" / "dd.out"
    dd_path.parent.mkdir(parents=True, exist_ok=True)
    headline: list[Row] = []
    page_cache: list[Row] = []
    bare: dict[tuple[str, bool], tuple[float, float, float]] = {}
    aligned: dict[str, float] = {}  # ns per os.write of dd's blocks
    cpu: dict[str, tuple[float, float]] = {}  # page cache: CPU ns per append, per dd block
    for label, batch_size, pool_size in (("16 KiB", 16 * KiB, 64), ("1 MiB", MiB, 8)):
        context.progress(f"append: building {pool_size} batches of {label}")
        pool = [sized_batch(batch_size, rng) for _ in range(pool_size)]
        records_per_batch = sum(_records_in(b) for b in pool) / pool_size
        count = context.total // max(len(b) for b in pool)
        nbytes = sum(len(pool[i % pool_size]) for i in range(count))
        records = int(records_per_batch * count)
        dd_count = round(nbytes / batch_size)
        dd_bytes = dd_count * batch_size
        for fsync in (True, False):
            mode = "fsync at end" if fsync else "page cache, no fsync"
            best_ours = best_dd = None
            cpu_ours = cpu_dd = None
            for attempt in range(1, APPEND_REPEATS + 1):
                tag = f"append {label} ({mode}) {attempt}/{APPEND_REPEATS}"
                _settle()
                dd_ns, dd_cpu = _dd_run(dd_path, batch_size, dd_count, fsync=fsync)
                context.progress(f"{tag}: dd {_mbps(dd_bytes, dd_ns):,.0f} MB/s")
                _settle()
                ours_ns, ours_cpu, _ = _append_run(
                    directory,
                    pool,
                    count,
                    flush=fsync,
                    progress=functools.partial(_tagged, context, tag),
                )
                context.progress(f"{tag}: ours {_mbps(nbytes, ours_ns):,.0f} MB/s")
                best_dd = dd_ns if best_dd is None else min(best_dd, dd_ns)
                best_ours = ours_ns if best_ours is None else min(best_ours, ours_ns)
                cpu_dd = dd_cpu if cpu_dd is None else min(cpu_dd, dd_cpu)
                cpu_ours = ours_cpu if cpu_ours is None else min(cpu_ours, ours_cpu)
            assert best_ours is not None and best_dd is not None
            assert cpu_ours is not None and cpu_dd is not None
            if not fsync:
                cpu[label] = (cpu_ours / count, cpu_dd / dd_count)
            _settle()
            bare_ns = _write_loop(dd_path, pool, count, fsync=fsync)
            bare[label, fsync] = (_mbps(nbytes, bare_ns), bare_ns / count, best_ours / count)
            if not fsync:
                _settle()
                blocks_ns = _write_loop(dd_path, [bytes(batch_size)], dd_count, fsync=False)
                aligned[label] = blocks_ns / dd_count
            _settle()
            row = Row(
                f"append, {label} batches, {mode}" + (" (headline)" if fsync else ""),
                _mbps(nbytes, best_ours),
                "MB/s",
                peer_name=f"dd bs={label}" + (" conv=fdatasync" if fsync else ""),
                peer_value=_mbps(dd_bytes, best_dd),
                target=ratio_at_least(APPEND_TARGET, "dd"),
                extra=(
                    f"{records / (best_ours / 1e9) / 1e6:.2f} M records/s, "
                    f"{count / (best_ours / 1e9):,.0f} appends/s"
                ),
            )
            (headline if fsync else page_cache).append(row)
            if row.passed is False:
                _profile_append(context, directory, pool, label, fsync)
    for row in headline + page_cache:
        context.section.add(row)
    context.section.note(
        f"Append: `PartitionLog.append_as_leader(batch, 0)` on a fresh log with "
        f"the default topic config (segment.bytes 1 GiB), one batch per call, batches built "
        f"beforehand with `build_batch` (records of 100 random bytes, no key; a pool of "
        f"distinct batches is cycled). 'fsync at end' times the appends plus `flush()`; dd "
        f"writes the same number of bytes to the same filesystem (`conv=fdatasync`: one "
        f"fdatasync at the end), timed around the subprocess. Best of {APPEND_REPEATS} for both."
    )
    context.section.note(
        "Append reference, what CPython itself reaches: a bare loop of `os.write` of the same "
        "batches to a file on the same filesystem (one run each) wrote "
        + "; ".join(
            f"{label} {'with' if fsync else 'without'} fdatasync {mbps:,.0f} MB/s"
            + (
                ""
                if fsync
                else f" ({format_value(bare_ns / 1000, 'µs')} per `os.write`, against "
                f"{format_value(ours_ns / 1000, 'µs')} per `append_as_leader`)"
            )
            for (label, fsync), (mbps, bare_ns, ours_ns) in bare.items()
        )
        + ". The gap between the two is the storage code's own cost per call."
    )
    context.section.note(
        "Append reference, what the kernel charges dd less for: the same loop writing dd's "
        "blocks (all zeros, exactly the block size, so every write starts on a page "
        "boundary and fills whole pages) took "
        + "; ".join(
            f"{format_value(ns / 1000, 'µs')} per {label} `os.write` against "
            f"{format_value(bare[label, False][1] / 1000, 'µs')} for the batches"
            for label, ns in aligned.items()
        )
        + ". A log's batches are not page-sized: each write begins inside the page the last "
        "one ended in, so the page cache takes it in more, smaller pieces (partial pages "
        "zeroed and looked up again, smaller folios), whatever the code above it does."
    )
    context.section.note(
        "Append by CPU time, which a loaded machine distorts less than the wall clock (page "
        "cache rows, the least over the attempts of the process's CPU time for ours and of "
        "dd's own user and system time): "
        + "; ".join(
            f"{label} {format_value(ours / 1000, 'µs')} per `append_as_leader` against "
            f"{format_value(dd / 1000, 'µs')} per dd block ({dd / ours:.2f}x dd's rate)"
            for label, (ours, dd) in cpu.items()
            if ours > 0
        )
        + "."
    )


def _tagged(context: Context, tag: str, message: str) -> None:
    context.progress(f"{tag}: {message}")


def _records_in(batch: bytes) -> int:
    return int(HEADER_STRUCT.unpack_from(batch)[-1])


def _profile_append(
    context: Context, directory: Path, pool: list[bytes], label: str, fsync: bool
) -> None:
    count = max(1, PROFILE_APPEND_BYTES // len(pool[0]))
    context.progress(f"append {label}: missed the target, profiling {count} appends")
    _, _, text = _append_run(directory, pool, count, flush=fsync, profile=True)
    mode = "with flush" if fsync else "no flush"
    context.section.add_profile(
        f"Where append time goes: {label} batches, {mode} (cProfile, {count:,} appends)", text
    )


# -- random reads -------------------------------------------------------------------------------


def bench_read(context: Context) -> None:
    """p50/p99/p99.9 of ``PartitionLog.read`` at random offsets, warm cache, against os.pread."""
    rng = random.Random(SEED + 1)
    directory = context.root / "read" / TP.dir_name
    context.progress("read: building a log of ~1 KiB batches (8 records of 100 bytes)")
    small = [
        build_batch([SimpleRecord(value=rng.randbytes(100)) for _ in range(8)]) for _ in range(256)
    ]
    group_batches = 64  # appended per call while building (untimed; same log as one per call)
    groups = [
        b"".join(small[(g * 7 + j) % len(small)] for j in range(group_batches)) for g in range(32)
    ]
    partition_log = _open_log(directory)
    try:
        i = 0
        next_report = context.total // 4
        while partition_log.size + len(groups[i % len(groups)]) <= context.total:
            partition_log.append_as_leader(groups[i % len(groups)], leader_epoch=0)
            i += 1
            if partition_log.size >= next_report:
                context.progress(f"read: built {partition_log.size / GiB:.2f} GiB")
                next_report += context.total // 4
        partition_log.flush()
        files = _segment_files(directory)
        context.progress("read: warming the page cache (one sequential read)")
        _read_files(files)
        end = partition_log.log_end_offset
        offsets = [rng.randrange(partition_log.log_start_offset, end) for _ in range(READ_COUNT)]
        context.progress(f"read: {READ_COUNT:,} reads of up to {READ_MAX_BYTES // KiB} KiB")
        ours, sizes = _timed_reads(partition_log, offsets)
        context.progress("read: the same number of os.pread calls of the same sizes")
        floor = _timed_preads(files[0], sizes, rng)
        preempted = sum(1 for w, c in zip(ours.wall, ours.cpu, strict=True) if w - c > 1_000_000)
        ours.sort()
        floor.sort()
        batch_size = len(small[0])
        rows = [("", p, ours.wall, floor.wall) for p in (50.0, 99.0, 99.9)]
        rows += [(" on-CPU time", p, ours.cpu, floor.cpu) for p in (99.0, 99.9)]
        for kind, p, mine, theirs in rows:
            target: Target | None = None
            if p == 99.0 and not kind:
                target = at_most(READ_P99_TARGET_US, "µs")
            row = context.section.add(
                Row(
                    f"random read, 64 KiB max, warm cache: p{p:g}{kind}",
                    percentile(mine, p) / 1000,
                    "µs",
                    peer_name="os.pread, same sizes" + (", on-CPU time" if kind else ""),
                    peer_value=percentile(theirs, p) / 1000,
                    target=target,
                    extra=(
                        f"{sum(sizes) / MB / (sum(ours.wall) / 1e9):,.0f} MB/s over all reads"
                        if p == 50.0
                        else ""
                    ),
                )
            )
            if row.passed is False:
                context.progress("read: missed the target, profiling")
                text = profile_hotspots(
                    lambda: _timed_reads(partition_log, offsets[:PROFILE_READS])
                )
                context.section.add_profile(
                    f"Where read time goes (cProfile, {PROFILE_READS:,} reads)", text
                )
        context.section.note(
            f"Random read, wall time vs on-CPU time: {preempted:,} of {READ_COUNT:,} reads "
            f"({preempted / READ_COUNT:.1%}) spent over 1 ms off the CPU (the thread was "
            f"runnable but another process had the CPU, or it waited on I/O); the on-CPU "
            f"rows (`time.thread_time_ns`) show the code's own cost without that."
        )
        context.section.note(
            f"Random read: a log of {partition_log.size / GiB:.2f} GiB in "
            f"{len(partition_log.segments)} segment(s), {end:,} records in batches of "
            f"{batch_size} bytes (8 records of 100 bytes), fsynced and read once before "
            f"timing. {READ_COUNT:,} "
            f"`PartitionLog.read(offset, max_bytes={READ_MAX_BYTES})` at uniformly random "
            f"offsets, each timed alone (mean {sum(sizes) / len(sizes) / KiB:.1f} KiB returned); "
            f"the floor is as many `os.pread` calls of the same sizes at random positions of the "
            f"same segment file."
        )
        _close_files_only(partition_log)
        # Kept (as a crash would leave it) for the recovery benchmark, which deletes it.
        context.small_batch_log = SmallBatchLog(directory, files, i * group_batches)
    finally:
        if not partition_log.active_segment.closed:
            _close_files_only(partition_log)
        if context.small_batch_log is None:
            shutil.rmtree(directory.parent, ignore_errors=True)


PURE_ROW = "the same, pure-Python codec (`HIGHWATER_PURE_PYTHON=1`)"
COMPILED_PEER = "compiled codec, the row above"


def timed_unclean_load(directory: str) -> int:
    """Nanoseconds of one crash-recovery load of ``directory`` (files closed after)."""
    start = time.perf_counter_ns()
    partition_log = load_partition_log(
        Path(directory), LogConfig(), recovery_point=0, had_clean_shutdown=False
    )
    elapsed = time.perf_counter_ns() - start
    _close_files_only(partition_log)
    return elapsed


def timed_compaction(root: str, total: int) -> list[float]:
    """``[dirty bytes, seconds]`` of one cleaning pass over a fresh log of ~``total`` bytes
    under ``root`` (deleted after), written as :func:`bench_compaction` writes its own."""
    from highwater.storage.cleaner import (  # type: ignore[import-not-found, unused-ignore]
        LogCleaner,
    )

    config = LogConfig.from_properties({"cleanup.policy": "compact"})
    manager = LogManager(Path(root), default_config=config)
    manager.startup()
    try:
        partition_log = manager.get_or_create_log(TP, config)
        written = _write_compaction_log(
            lambda _: None, partition_log, total, random.Random(SEED + 3)
        )
        dirty_bytes = written.dirty_bytes  # before the pass rewrites the segments
        start = time.perf_counter_ns()
        LogCleaner(manager).clean_log(partition_log)
        return [dirty_bytes, (time.perf_counter_ns() - start) / 1e9]
    finally:
        try:
            manager.shutdown()
        finally:
            shutil.rmtree(root, ignore_errors=True)


def _recovery_of_small_batches(context: Context, kept: SmallBatchLog) -> None:
    """Crash recovery of the read benchmark's log of ~1 KiB batches (per-batch costs dominate)."""
    directory, files, batches = kept.directory, kept.files, kept.batches
    config = LogConfig()
    nbytes = sum(p.stat().st_size for p in files)

    def load_unclean(path: Path) -> PartitionLog:
        return load_partition_log(path, config, recovery_point=0, had_clean_shutdown=False)

    context.progress(f"recovery: loading {nbytes / GiB:.2f} GiB of ~1 KiB batches after a crash")
    start = time.perf_counter_ns()
    partition_log = load_unclean(directory)
    elapsed = time.perf_counter_ns() - start
    _close_files_only(partition_log)
    start = time.perf_counter_ns()
    _read_files(files)
    floor_ns = time.perf_counter_ns() - start
    row = context.section.add(
        Row(
            "recovery after a crash, ~1 KiB batches, warm cache (all re-validated)",
            elapsed / 1e9,
            "s",
            peer_name="one read of the same .log files",
            peer_value=floor_ns / 1e9,
            target=at_most(RECOVERY_SMALL_BATCHES_TARGET_S, "s"),
            extra=(
                f"{nbytes / GiB:.2f} GiB, {batches:,} batches, {_mbps(nbytes, elapsed):,.0f} MB/s, "
                f"{elapsed / batches / 1000:.1f} µs per batch"
            ),
        )
    )
    context.progress("recovery: the same load on the pure-Python codec (a child process)")
    try:
        pure_ns = run_pure("bench.storage:timed_unclean_load", str(directory))
    except Exception as error:
        context.section.add(Row(PURE_ROW, None, "s", error=f"{type(error).__name__}: {error}"))
    else:
        context.section.add(
            Row(
                PURE_ROW,
                pure_ns / 1e9,
                "s",
                peer_name=COMPILED_PEER,
                peer_value=elapsed / 1e9,
                extra=(
                    f"{_mbps(nbytes, pure_ns):,.0f} MB/s, "
                    f"{pure_ns / batches / 1000:.1f} µs per batch"
                ),
            )
        )
    context.section.note(
        "Recovery with ~1 KiB batches: the random-read log above, its files closed without a "
        "clean shutdown (no producer-state snapshot, indexes as they were), loaded with "
        "`recovery_point=0, had_clean_shutdown=False`. The same target applies to a 1 GiB "
        "partition whatever its batches."
    )
    if row.passed is False:
        # Profile a smaller copy: cProfile over a whole GiB of small batches takes a minute.
        copy = directory.parent.parent / "recovery-profile" / TP.dir_name
        copy.mkdir(parents=True)
        try:
            with open(files[0], "rb") as source, open(copy / files[0].name, "wb") as target:
                remaining = PROFILE_RECOVERY_BYTES
                while remaining > 0:
                    chunk = source.read(min(remaining, 8 * MiB))
                    if not chunk:
                        break
                    target.write(chunk)
                    remaining -= len(chunk)
            context.progress("recovery: missed the target, profiling a load of a smaller copy")
            text = profile_hotspots(lambda: _close_files_only(load_unclean(copy)))
            context.section.add_profile(
                f"Where crash-recovery time goes with ~1 KiB batches (cProfile, one load of the "
                f"first {PROFILE_RECOVERY_BYTES // MiB} MiB; the cut tail batch is truncated)",
                text,
            )
        finally:
            shutil.rmtree(copy.parent, ignore_errors=True)


@dataclass(slots=True)
class Timings:
    """Per-operation wall-clock and on-CPU (thread) times in ns, sorted once measured."""

    wall: list[int]
    cpu: list[int]

    def sort(self) -> Timings:
        self.wall.sort()
        self.cpu.sort()
        return self


def _timed_reads(partition_log: PartitionLog, offsets: list[int]) -> tuple[Timings, list[int]]:
    """Each ``read`` timed alone: the timings and the sizes returned, in call order."""
    read = partition_log.read
    clock, cpu_clock = time.perf_counter_ns, time.thread_time_ns
    wall: list[int] = []
    cpu: list[int] = []
    sizes: list[int] = []
    for offset in offsets:
        cpu_start = cpu_clock()
        start = clock()
        data = read(offset, READ_MAX_BYTES)
        wall.append(clock() - start)
        cpu.append(cpu_clock() - cpu_start)
        sizes.append(len(data.records))
    if not all(sizes):
        raise AssertionError("a read inside the log returned nothing")
    return Timings(wall, cpu), sizes


def _timed_preads(path: Path, sizes: list[int], rng: random.Random) -> Timings:
    """``os.pread`` of each size at a random position of ``path``, timed like the reads."""
    fd = os.open(path, os.O_RDONLY)
    try:
        file_size = os.fstat(fd).st_size
        positions = [rng.randrange(0, file_size - size + 1) for size in sizes]
        clock, cpu_clock = time.perf_counter_ns, time.thread_time_ns
        pread = os.pread
        wall: list[int] = []
        cpu: list[int] = []
        for size, position in zip(sizes, positions, strict=True):
            cpu_start = cpu_clock()
            start = clock()
            pread(fd, size, position)
            wall.append(clock() - start)
            cpu.append(cpu_clock() - cpu_start)
        return Timings(wall, cpu)
    finally:
        os.close(fd)


# -- recovery -----------------------------------------------------------------------------------


def _write_until_killed(context: Context, directory: Path, batch_size: int) -> None:
    """Run ``bench._writer`` and SIGKILL it, mid-append, once it has written enough."""
    command = [
        sys.executable,
        "-m",
        "bench._writer",
        str(directory),
        str(batch_size),
        str(64 * MiB),
        str(context.total + context.total // 4),
    ]
    child = subprocess.Popen(command, cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True)
    killed = False
    try:
        assert child.stdout is not None
        next_report = context.total // 4
        for line in child.stdout:
            word, _, value = line.strip().partition(" ")
            if word == "bytes":
                written = int(value)
                if written >= next_report:
                    context.progress(f"recovery: writer child at {written / GiB:.2f} GiB")
                    next_report += context.total // 4
                if written >= context.total:
                    os.kill(child.pid, signal.SIGKILL)
                    killed = True
                    break
            elif word == "done":
                os.kill(child.pid, signal.SIGKILL)
                killed = True
                break
    finally:
        if not killed:
            child.kill()
        child.wait()
        if child.stdout is not None:
            child.stdout.close()
    if not killed:
        raise RuntimeError(f"the writer child exited by itself (status {child.returncode})")


def bench_recovery(context: Context) -> None:
    """Load a 1 GiB partition after kill -9 (everything re-validated) and after a clean close."""
    directory = context.root / "recovery" / TP.dir_name
    config = LogConfig()
    section = context.section
    context.progress("recovery: a child process appends 16 KiB batches until SIGKILLed")
    _write_until_killed(context, directory, 16 * KiB)
    log_files = _segment_files(directory)
    nbytes = sum(p.stat().st_size for p in log_files)

    def load_unclean() -> PartitionLog:
        return load_partition_log(directory, config, recovery_point=0, had_clean_shutdown=False)

    try:
        # (a) kill -9, page cache warm: what a restarted process sees.
        context.progress(f"recovery: loading {nbytes / GiB:.2f} GiB after kill -9 (warm cache)")
        start = time.perf_counter_ns()
        partition_log = load_unclean()
        unclean_ns = time.perf_counter_ns() - start
        recovered_end = partition_log.log_end_offset
        recovered_size = partition_log.size
        _close_files_only(partition_log)
        start = time.perf_counter_ns()
        _read_files(log_files)
        floor_ns = time.perf_counter_ns() - start
        row = section.add(
            Row(
                "recovery after kill -9, warm cache (all re-validated)",
                unclean_ns / 1e9,
                "s",
                peer_name="one read of the same .log files",
                peer_value=floor_ns / 1e9,
                target=at_most(RECOVERY_UNCLEAN_TARGET_S, "s"),
                extra=f"{nbytes / GiB:.2f} GiB re-validated, {_mbps(nbytes, unclean_ns):,.0f} MB/s",
            )
        )
        if row.passed is False:
            text = profile_hotspots(lambda: _close_files_only(load_unclean()))
            section.add_profile("Where crash-recovery time goes (cProfile, one load)", text)

        # The same, cold: the pages evicted as after a machine restart.
        context.progress("recovery: the same load with the files evicted from the page cache")
        _evict(p for p in directory.iterdir())
        start = time.perf_counter_ns()
        partition_log = load_unclean()
        cold_ns = time.perf_counter_ns() - start
        _close_files_only(partition_log)
        _evict(log_files)
        start = time.perf_counter_ns()
        _read_files(log_files)
        cold_floor_ns = time.perf_counter_ns() - start
        section.add(
            Row(
                "recovery after a crash, cold cache (all re-validated)",
                cold_ns / 1e9,
                "s",
                peer_name="one cold read of the same .log files",
                peer_value=cold_floor_ns / 1e9,
                extra=f"{_mbps(nbytes, cold_ns):,.0f} MB/s",
            )
        )

        # (b) clean shutdown: close() then load trusting the segments.
        partition_log = load_unclean()
        partition_log.close()
        context.progress("recovery: loading after a clean shutdown")
        start = time.perf_counter_ns()
        partition_log = load_partition_log(directory, config, had_clean_shutdown=True)
        clean_ns = time.perf_counter_ns() - start
        if partition_log.log_end_offset != recovered_end:
            raise AssertionError(
                f"clean load ends at {partition_log.log_end_offset}, recovery at {recovered_end}"
            )
        partition_log.close()
        start = time.perf_counter_ns()
        _open_all(directory)
        open_ns = time.perf_counter_ns() - start
        row = section.add(
            Row(
                "load after a clean shutdown",
                clean_ns / 1e9,
                "s",
                peer_name="open + fstat every file, read the small ones",
                peer_value=open_ns / 1e9,
                target=at_most(RECOVERY_CLEAN_TARGET_S, "s"),
            )
        )
        if row.passed is False:
            text = profile_hotspots(
                lambda: load_partition_log(directory, config, had_clean_shutdown=True).close()
            )
            section.add_profile("Where clean-load time goes (cProfile, one load)", text)
        section.note(
            f"Recovery: a child process (`bench/_writer.py`) appended 16 KiB batches with the "
            f"default flush policy (nothing fsynced) and was SIGKILLed mid-stream at "
            f"{nbytes:,} bytes in {len(log_files)} segment(s); "
            f"`load_partition_log(dir, config, recovery_point=0, had_clean_shutdown=False)` "
            f"re-validated every batch (CRC included) and kept {recovered_size:,} bytes, "
            f"{recovered_end:,} records. The cold run fsyncs the files and evicts them with "
            f"`posix_fadvise(DONTNEED)` first. The clean load follows `close()`."
        )
    finally:
        shutil.rmtree(directory.parent, ignore_errors=True)
    kept, context.small_batch_log = context.small_batch_log, None
    if kept is not None:
        try:
            _recovery_of_small_batches(context, kept)
        finally:
            shutil.rmtree(kept.directory.parent, ignore_errors=True)


def _open_all(directory: Path) -> None:
    for path in directory.iterdir():
        with open(path, "rb", buffering=0) as f:
            size = os.fstat(f.fileno()).st_size
            if not path.name.endswith(".log"):
                f.read(size)


# -- compaction ---------------------------------------------------------------------------------


@dataclass(slots=True)
class CompactionInput:
    """What was written for a compaction run."""

    records: int
    key_pool: int
    distinct_keys: int
    dirty: list[Path]

    @property
    def dirty_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.dirty)


def _write_compaction_log(
    progress: Callable[[str], None], partition_log: PartitionLog, total: int, rng: random.Random
) -> CompactionInput:
    """Fill ``partition_log`` with ~``total`` bytes of 1 KiB values whose keys come from a pool
    of 10 % of the record count; roll and move the high watermark to the end (cleanable)."""
    values = [rng.randbytes(1024) for _ in range(64)]
    per_batch, per_call = 16, 4
    probe = build_batch([SimpleRecord(b"key-000000000", values[0])] * per_batch)
    key_pool = max(1, total // ((len(probe) - BATCH_HEADER_SIZE) // per_batch) // 10)
    call_bytes = len(probe) * per_call
    drawn: set[int] = set()
    records = 0
    next_report = total // 4
    while partition_log.size + call_bytes <= total:
        batches = []
        for _ in range(per_call):
            keys = [rng.randrange(key_pool) for _ in range(per_batch)]
            drawn.update(keys)
            batches.append(
                build_batch([SimpleRecord(b"key-%09d" % k, values[k % len(values)]) for k in keys])
            )
            records += per_batch
        partition_log.append_as_leader(b"".join(batches), leader_epoch=0)
        if partition_log.size >= next_report:
            progress(f"compaction: wrote {partition_log.size / GiB:.2f} GiB")
            next_report += total // 4
    partition_log.roll()
    partition_log.update_high_watermark(partition_log.log_end_offset)
    partition_log.flush()
    dirty = [segment.log_path for segment in partition_log.segments[:-1]]
    return CompactionInput(records, key_pool, len(drawn), dirty)


def bench_compaction(context: Context) -> None:
    """``LogCleaner.clean_log`` on 1 GiB with 10 % distinct keys, against a CRC-checked read."""
    name = "compaction, 1 KiB values, 10 % distinct keys"
    try:
        from highwater.storage.cleaner import (  # type: ignore[import-not-found, unused-ignore]
            LogCleaner,
        )
    except ImportError as error:
        context.section.add(
            Row(
                name, None, "MB/s", error=f"`highwater.storage.cleaner` is not importable ({error})"
            )
        )
        return
    rng = random.Random(SEED + 2)
    config = LogConfig.from_properties({"cleanup.policy": "compact"})
    for total, profile in ((context.total, False), (PROFILE_COMPACTION_BYTES, True)):
        root = context.root / ("compaction-profile" if profile else "compaction")
        manager = LogManager(root, default_config=config)
        manager.startup()
        try:
            partition_log = manager.get_or_create_log(TP, config)
            what = "a smaller log to profile" if profile else f"{total / GiB:.2f} GiB"
            context.progress(f"compaction: writing {what}")
            written = _write_compaction_log(context.progress, partition_log, total, rng)
            dirty_bytes = written.dirty_bytes
            cleaner = LogCleaner(manager)
            if profile:
                context.progress(f"compaction: profiling a pass over {dirty_bytes / MiB:.0f} MiB")
                text = profile_hotspots(functools.partial(cleaner.clean_log, partition_log))
                context.section.add_profile(
                    f"Where compaction time goes (cProfile, one pass over "
                    f"{dirty_bytes / MiB:.0f} MiB; no target is set, shown for the cleaner's "
                    f"authors)",
                    text,
                )
                continue

            context.progress("compaction: floor, a sequential CRC-checked read of the same bytes")
            start = time.perf_counter_ns()
            checked = _crc_scan(written.dirty)
            floor_ns = time.perf_counter_ns() - start
            if checked != dirty_bytes:
                raise AssertionError(f"the CRC scan covered {checked} of {dirty_bytes} bytes")

            context.progress(f"compaction: cleaning {dirty_bytes / GiB:.2f} GiB")
            start = time.perf_counter_ns()
            stats = cleaner.clean_log(partition_log)
            clean_ns = time.perf_counter_ns() - start
            seconds = clean_ns / 1e9
            context.section.add(
                Row(
                    name,
                    _mbps(dirty_bytes, clean_ns),
                    "MB/s",
                    peer_name="sequential read + CRC-32C per batch",
                    peer_value=_mbps(dirty_bytes, floor_ns),
                    target=at_least(COMPACTION_TARGET_MBPS, "MB/s"),
                    extra=(
                        f"{seconds:.1f} s; {stats.records_read / seconds / 1e3:,.0f} k records/s; "
                        f"{stats.records_retained:,} of {stats.records_read:,} records kept"
                    ),
                )
            )
            context.progress("compaction: a pass on the pure-Python codec (a child process)")
            pure_total = min(total, PURE_COMPACTION_BYTES)
            try:
                pure_bytes, pure_s = run_pure(
                    "bench.storage:timed_compaction",
                    str(context.root / "compaction-pure"),
                    pure_total,
                )
            except Exception as error:
                context.section.add(
                    Row(PURE_ROW, None, "MB/s", error=f"{type(error).__name__}: {error}")
                )
            else:
                context.section.add(
                    Row(
                        PURE_ROW,
                        pure_bytes / pure_s / MB,
                        "MB/s",
                        peer_name=COMPILED_PEER,
                        peer_value=_mbps(dirty_bytes, clean_ns),
                        extra=f"a pass over {pure_bytes / MiB:,.0f} MiB written alike",
                    )
                )
            note = (
                f"Compaction: {written.records:,} records of 1 KiB values, keys drawn uniformly "
                f"from {written.key_pool:,} ({written.distinct_keys:,} distinct drawn), "
                f"{dirty_bytes:,} bytes in {len(written.dirty)} segment(s) below the active one, "
                f"high watermark at the log end. One `LogCleaner(manager).clean_log(log)` pass "
                f"(default dedupe buffer): {stats.map_bytes_read:,} bytes read to build the "
                f"offset map ({stats.map_keys:,} keys), {stats.bytes_read:,} read and "
                f"{stats.bytes_written:,} written to rewrite, segments {stats.segments_before} -> "
                f"{stats.segments_after}, {stats.duration_s:.2f} s by its own clock. MB/s is the "
                f"dirty log size over the pass's time. Target: 300 MB/s. The "
                f"pure-Python row cleans a log of {min(total, PURE_COMPACTION_BYTES) / MiB:,.0f} "
                f"MiB written the same way in a child process (`bench/_pure_python.py`)."
            )
            if stats.records_retained != written.distinct_keys or stats.aborted:
                note += (
                    f" **Unexpected:** {stats.records_retained:,} records kept for "
                    f"{written.distinct_keys:,} distinct keys (aborted: {stats.aborted})."
                )
            context.section.note(note)
        finally:
            try:
                manager.shutdown()
            finally:
                shutil.rmtree(root, ignore_errors=True)


def _crc_scan(paths: Iterable[Path], chunk: int = 8 * MiB) -> int:
    """Read files sequentially and check every batch's CRC-32C; return the bytes checked."""
    checked = 0
    for path in paths:
        carry = b""
        with open(path, "rb", buffering=0) as f:
            while True:
                block = f.read(chunk)
                if not block:
                    break
                data = carry + block if carry else block
                view = memoryview(data)
                position, end = 0, len(data)
                while position + BATCH_HEADER_SIZE <= end:
                    header = HEADER_STRUCT.unpack_from(data, position)
                    size = header[1] + 12
                    if position + size > end:
                        break
                    if crc32c_of(view[position + ATTRIBUTES_OFFSET : position + size]) != header[4]:
                        raise AssertionError(f"{path}: CRC mismatch at byte {checked + position}")
                    position += size
                view.release()
                checked += position
                carry = data[position:]
        if carry:
            raise AssertionError(f"{path}: {len(carry)} bytes after the last whole batch")
    return checked
