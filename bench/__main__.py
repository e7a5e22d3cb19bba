"""Command line of the benchmark harness: ``python -m bench [SUITE...]`` (``make bench``)."""

from __future__ import annotations

import argparse
import sys
import traceback
from pathlib import Path

from highwater.rpc.allocator import keep_large_buffers

from bench import available_suites, load_suite
from bench.report import DEFAULT_DATA_ROOT, DEFAULT_OUTPUT, Report


def main(argv: list[str] | None = None) -> int:
    suites = available_suites()
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="Run Highwater's benchmarks and write docs/benchmarks.md.",
    )
    parser.add_argument(
        "suites",
        nargs="*",
        metavar="SUITE",
        help=f"suites to run (default: all): {', '.join(suites)}",
    )
    parser.add_argument(
        "--output", type=Path, default=DEFAULT_OUTPUT, help="markdown file to update"
    )
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=DEFAULT_DATA_ROOT,
        help="where benchmark data is written (deleted after each suite)",
    )
    parser.add_argument(
        "--scale",
        type=float,
        default=1.0,
        help="shrink data sizes by this factor for a quick smoke run (results are marked)",
    )
    args = parser.parse_args(argv)
    unknown = [s for s in args.suites if s not in suites]
    if unknown:
        parser.error(f"unknown suite(s) {', '.join(unknown)}; known: {', '.join(suites)}")
    if not 0 < args.scale <= 1:
        parser.error("--scale must be in (0, 1]")

    # The clients run in this process: its malloc keeps MiB-sized message buffers mapped,
    # as a broker's does (highwater.rpc.allocator; docs/client.md).
    keep_large_buffers()
    report = Report(args.output, args.data_dir.resolve(), scale=args.scale)
    print(f"machine: {report.machine.summary}", flush=True)
    failed: list[str] = []
    for name in args.suites or suites:
        report.progress(f"suite {name}")
        try:
            load_suite(name)(report)
        except KeyboardInterrupt:
            report.write()
            print("interrupted", file=sys.stderr)
            return 130
        except Exception:
            traceback.print_exc()
            failed.append(name)
    report.write()
    print(f"wrote {report.output}", flush=True)
    if failed:
        print(f"suite(s) failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
