"""Event-loop stalls of a ``highwater`` server process, for bench/_latency_probe.py.

Imported at the start of every process whose ``PYTHONPATH`` begins with this directory
(Python imports ``sitecustomize`` by itself), and active only where ``LOOP_WATCH_OUT`` is
set: it wraps ``uvloop.run`` (the servers' loop) so that a ticker task runs beside the
server, asleep 1 ms at a time. A tick later than 2 ms past its due time is a stall; each
is recorded with the thread's CPU time during it and the garbage collector's pauses in it
(``gc.callbacks``). A stall the thread spent on the CPU was our code holding the loop; one
it did not was the machine (the process waiting for a CPU, or the disk). SIGUSR1 starts a
window (and, with ``LOOP_WATCH_PROFILE`` set, a cProfile of the loop's thread in CPU
time), SIGUSR2 writes it to ``$LOOP_WATCH_OUT.<pid>.json`` (and ``.prof``).
``LOOP_WATCH_TRACE=1`` also records, with their ``perf_counter`` times (one clock for every
process on the machine), each garbage collection and what the broker does with a
partition's offsets: a leader's appends, its followers' fetches (the offset each names),
high-watermark moves and consumers' reads; a follower's appends. The probe's ``--trace``
matches them with each record to say which hop a slow record waited on.
``LOOP_WATCH_TICK=0`` leaves the ticker out (no stalls are recorded): it costs each
process about 50 ms of CPU per second on this machine (a wake-up every millisecond), a
third of a follower's CPU in the latency phase, which such a window then leaves out.
"""

from __future__ import annotations

import os

if os.environ.get("LOOP_WATCH_OUT"):
    import asyncio
    import cProfile
    import gc
    import json
    import signal
    import sys
    import time
    from collections.abc import Coroutine
    from types import FrameType
    from typing import Any

    import uvloop

    _OUT = os.environ["LOOP_WATCH_OUT"]
    _TICK_S = 0.001
    _STALL_S = 0.002
    _window: dict[str, Any] = {}
    _gc_started = [0.0]
    _gc_in_tick = [0.0]
    _profile: list[cProfile.Profile] = []
    _TRACE = os.environ.get("LOOP_WATCH_TRACE") == "1"

    def _on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            _gc_started[0] = time.perf_counter()
            return
        pause = time.perf_counter() - _gc_started[0]
        _gc_in_tick[0] += pause
        if _window:
            _window["gc_count"][info["generation"]] += 1
            _window["gc_s"] += pause
            _window["gc_max_s"] = max(_window["gc_max_s"], pause)
            if _TRACE:
                _window["gcs"].append((_gc_started[0], pause, info["generation"]))

    async def _ticker() -> None:
        last, last_cpu = time.perf_counter(), time.thread_time()
        while True:
            _gc_in_tick[0] = 0.0
            await asyncio.sleep(_TICK_S)
            now, cpu = time.perf_counter(), time.thread_time()
            late = now - last - _TICK_S
            if late > _STALL_S and _window:
                # (late ms, the thread's CPU ms in it, GC ms in it, when it ended)
                _window["stalls"].append(
                    (
                        round(late * 1e3, 2),
                        round((cpu - last_cpu) * 1e3, 2),
                        _gc_in_tick[0] * 1e3,
                        now,
                    )
                )
            last, last_cpu = now, cpu

    def _trace(event: tuple[Any, ...]) -> None:
        if _window:
            _window["trace"].append(event)

    def _trace_broker() -> None:
        """Wrap the broker's partition methods that move a record along its path; each
        event is (kind, perf_counter time, offsets...)."""
        from highwater.broker.partitions import Partition
        from highwater.broker.replication import LeaderReplicationState

        append = Partition.append
        read_for_follower = Partition.read_for_follower
        append_as_follower = Partition.append_as_follower
        read = Partition.read
        increment = LeaderReplicationState._maybe_increment_high_watermark

        def traced_append(self: Partition, *args: Any, **kwargs: Any) -> Any:
            info = append(self, *args, **kwargs)
            _trace(("append", time.perf_counter(), self.log_end_offset))
            return info

        def traced_follower_fetch(
            self: Partition, replica_id: int, fetch_offset: int, *args: Any, **kwargs: Any
        ) -> Any:
            _trace(("follower_fetch", time.perf_counter(), replica_id, fetch_offset))
            return read_for_follower(self, replica_id, fetch_offset, *args, **kwargs)

        def traced_follower_append(self: Partition, *args: Any, **kwargs: Any) -> Any:
            moved = append_as_follower(self, *args, **kwargs)
            _trace(("follower_append", time.perf_counter(), self.log_end_offset))
            return moved

        def traced_read(self: Partition, fetch_offset: int, *args: Any, **kwargs: Any) -> Any:
            data = read(self, fetch_offset, *args, **kwargs)
            _trace(("read", time.perf_counter(), fetch_offset, self.high_watermark))
            return data

        def traced_increment(self: LeaderReplicationState, now_ms: int) -> bool:
            moved = increment(self, now_ms)
            if moved:
                _trace(("high_watermark", time.perf_counter(), self.high_watermark))
            return moved

        Partition.append = traced_append  # type: ignore[method-assign]
        Partition.read_for_follower = traced_follower_fetch  # type: ignore[method-assign]
        Partition.append_as_follower = traced_follower_append  # type: ignore[method-assign]
        Partition.read = traced_read  # type: ignore[method-assign]
        LeaderReplicationState._maybe_increment_high_watermark = traced_increment  # type: ignore[method-assign]

    _uvloop_run = uvloop.run

    def _run(main: Coroutine[Any, Any, Any], **kwargs: Any) -> Any:
        if _TRACE and "broker" in sys.argv:
            _trace_broker()

        async def watched() -> Any:
            if os.environ.get("LOOP_WATCH_TICK") == "0":  # CPU and GC only, no ticker
                return await main
            ticker = asyncio.get_running_loop().create_task(_ticker())
            try:
                return await main
            finally:
                ticker.cancel()

        return _uvloop_run(watched(), **kwargs)

    def _start(_signal: int, _frame: FrameType | None) -> None:
        _window.clear()
        _window.update(
            stalls=[],
            gc_count=[0, 0, 0],
            gc_s=0.0,
            gc_max_s=0.0,
            gcs=[],
            trace=[],
            started=time.perf_counter(),
            cpu_started=time.process_time(),
        )
        if os.environ.get("LOOP_WATCH_PROFILE"):
            _profile[:] = [cProfile.Profile(time.thread_time)]
            _profile[0].enable()

    def _dump(_signal: int, _frame: FrameType | None) -> None:
        if not _window:
            return
        if _profile:
            _profile[0].disable()
            _profile[0].dump_stats(f"{_OUT}.{os.getpid()}.prof")
            _profile.clear()
        window = dict(_window)
        window["window_s"] = time.perf_counter() - window.pop("started")
        window["cpu_s"] = time.process_time() - window.pop("cpu_started")
        window["argv"] = sys.argv
        with open(f"{_OUT}.{os.getpid()}.json", "w") as out:
            json.dump(window, out)
        _window.clear()

    gc.callbacks.append(_on_gc)
    uvloop.run = _run  # type: ignore[assignment]
    signal.signal(signal.SIGUSR1, _start)
    signal.signal(signal.SIGUSR2, _dump)
