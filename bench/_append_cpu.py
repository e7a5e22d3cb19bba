"""CPU per leader append against its floors: ``python -m bench._append_cpu``.

The storage suite's append rows time the wall clock, which the page cache's state moves
by 2x from one attempt to the next on this machine; the CPU an append costs holds much
better. This appends the suite's exactly-sized batches (``bench._writer.sized_batch``,
16 KiB by default) with ``PartitionLog.append_as_leader`` to a fresh log, several loops,
and reports the least CPU time per append (``time.process_time_ns``) beside, in the same
process and filesystem:

- ``stamp + write``: the two compiled calls of an append alone (``stamp_batches`` then
  ``write_stamped`` to a plain file), the floor of any Python around them;
- ``os.write``: a bare loop writing the same batches;
- ``dd``: dd's own CPU per block of the same size (its user and system time).

``--null`` points the log's segment at ``/dev/null`` (the kernel's page-cache copy left out:
the storage code's own cost). ``--codec PATH`` loads that build of
``highwater.records._codec`` instead of the installed one, to compare two builds of the
codec in alternated runs (build the other one with ``gcc -O2 -shared -fPIC
-I<python include> _codec.c -o PATH``); with ``HIGHWATER_PURE_PYTHON=1`` the pure-Python
path runs and the floors that need the codec are left out.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path


def _load_codec(path: str) -> None:
    """Make ``path`` the ``highwater.records._codec`` every later import finds."""
    spec = importlib.util.spec_from_file_location("highwater.records._codec", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"{path}: not a loadable extension module")
    module = importlib.util.module_from_spec(spec)
    sys.modules["highwater.records._codec"] = module
    spec.loader.exec_module(module)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench._append_cpu", description=__doc__)
    parser.add_argument("--batch-bytes", type=int, default=16_384)
    parser.add_argument("--appends", type=int, default=40_000, help="per loop")
    parser.add_argument("--loops", type=int, default=5, help="the least is reported")
    parser.add_argument("--null", action="store_true", help="segment writes go to /dev/null")
    parser.add_argument("--codec", help="a build of highwater.records._codec to load")
    parser.add_argument("--dir", type=Path, help="where to write (default: bench-data/)")
    args = parser.parse_args(argv)
    if args.codec:
        _load_codec(args.codec)

    from highwater.config.topic import LogConfig
    from highwater.records.header import stamp_batches, write_stamped
    from highwater.storage.log_loader import load_partition_log

    from bench._writer import sized_batch
    from bench.report import REPO_ROOT
    from bench.storage import _dd_run

    base = args.dir or REPO_ROOT / "bench-data"
    base.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="append-cpu-", dir=base))
    rng = random.Random(1)
    pool = [sized_batch(args.batch_bytes, rng) for _ in range(64)]
    count = args.appends

    def appends() -> float:
        directory = work / "bench-0"
        partition_log = load_partition_log(directory, LogConfig(), had_clean_shutdown=True)
        if args.null:
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, partition_log.segments[-1]._fd)
            os.close(null)
        append = partition_log.append_as_leader
        order = [pool[i & 63] for i in range(count)]
        start = time.process_time_ns()
        for batch in order:
            append(batch, 0)  # positional, as the broker calls it
        cpu = time.process_time_ns() - start
        for segment in partition_log.segments:
            segment.close()
        shutil.rmtree(directory)
        return cpu / count / 1000

    def floor(stamp: bool) -> float:
        path = Path(os.devnull) if args.null else work / "floor"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        now = int(time.time() * 1000)
        far = 1 << 62
        order = [pool[i & 63] for i in range(count)]
        start = time.process_time_ns()
        if stamp:
            assert stamp_batches is not None and write_stamped is not None
            for i, batch in enumerate(order):
                stamped = stamp_batches(batch, i, 0, 1 << 20, 1 << 30, now, far, far, -1, 0)
                assert stamped is not None
                write_stamped(fd, stamped[0], batch)
        else:
            write = os.write
            for batch in order:
                write(fd, batch)
        cpu = time.process_time_ns() - start
        os.close(fd)
        if not args.null:
            path.unlink()
        return cpu / count / 1000

    def dd() -> float:
        _, cpu = _dd_run(work / "dd", args.batch_bytes, count, fsync=False)
        return cpu / count / 1000

    rows: dict[str, list[float]] = {"append_as_leader": []}
    if stamp_batches is not None:
        rows["stamp + write"] = []
    rows["os.write"] = []
    if not args.null:
        rows["dd"] = []
    try:
        for _ in range(args.loops):
            rows["append_as_leader"].append(appends())
            if "stamp + write" in rows:
                rows["stamp + write"].append(floor(stamp=True))
            rows["os.write"].append(floor(stamp=False))
            if "dd" in rows:
                rows["dd"].append(dd())
    finally:
        shutil.rmtree(work, ignore_errors=True)
    where = "/dev/null" if args.null else "page cache"
    print(f"CPU per {args.batch_bytes}-byte append ({where}), least of {args.loops} loops:")
    for name, values in rows.items():
        print(f"  {name:18s} {min(values):7.2f} µs   ({' '.join(f'{v:.2f}' for v in values)})")
    if "dd" in rows:
        ratio = min(rows["dd"]) / min(rows["append_as_leader"])
        print(f"  append_as_leader at {ratio:.2f}x dd's rate by CPU")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
