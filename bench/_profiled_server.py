"""``python -m highwater`` with cProfile switched on and off by signals, for the benchmarks.

``python -m bench._profiled_server OUT highwater-arguments...``: SIGUSR1 starts profiling
the main thread (the event loop's) in CPU time, SIGUSR2 stops it and writes what it saw to
``OUT.N`` (N counts the windows from 0) and then ``OUT.N.done``, so that a benchmark profiles
just the work it drives, without the process's start (imports, compiling) or its stop.
"""

from __future__ import annotations

import cProfile
import signal
import sys
import time
from pathlib import Path
from types import FrameType

from highwater.cli.main import main


def serve_profiled(out: Path, arguments: list[str]) -> None:
    profile: list[cProfile.Profile] = []
    windows = 0

    def start(_signal: int, _frame: FrameType | None) -> None:
        # The thread's CPU time, not the wall clock: on a shared machine a function the
        # scheduler paused in is not charged for the pause.
        profile[:] = [cProfile.Profile(time.thread_time)]
        profile[0].enable()

    def stop(_signal: int, _frame: FrameType | None) -> None:
        nonlocal windows
        if not profile:
            return
        profile[0].disable()
        path = out.with_name(f"{out.name}.{windows}")
        profile[0].dump_stats(str(path))
        path.with_name(path.name + ".done").touch()
        windows += 1
        profile.clear()

    signal.signal(signal.SIGUSR1, start)
    signal.signal(signal.SIGUSR2, stop)
    main(args=arguments, prog_name="highwater")


if __name__ == "__main__":
    serve_profiled(Path(sys.argv[1]), sys.argv[2:])
