"""``python -m highwater`` with a commit-path timeline recorded between signals, for the benchmarks.

``python -m bench._raft_timeline OUT highwater-arguments...`` runs a controller whose
commit path notes each step with ``time.monotonic_ns()`` (one clock for every process of
the machine) while a window is open: SIGUSR1 opens one, SIGUSR2 writes what it saw to
``OUT.N`` (one ``TIME KIND VALUE`` line per event, N counting the windows from 0) and then
``OUT.N.done``. The steps (wrapped methods of the driver, the log and the servicer):

* ``request`` / ``answer``: a Controller call enters the servicer (VALUE: for an
  ``AlterConfigs`` of the benchmark's topics, the number its first topic's name ends with:
  the writer's, so that a write is followed from the client's send to its answer) / is
  answered (VALUE: the same);
* ``append``: the leader appends a Raft batch (VALUE: its records);
* ``fsync`` / ``fsynced``: a flush of the metadata log starts (VALUE: 1 in the flusher
  thread, 0 on the event loop) / returns;
* ``fetch_out`` / ``fetch_in``: a Raft fetch request sent / stepped in (VALUE: its
  offset); ``records_out`` / ``records_in``: a fetch answer carrying records (VALUE: their
  bytes); ``empty_out`` / ``empty_in``: one carrying none (news of the high watermark, or a
  long poll's end);
* ``high_watermark``: a step moved this replica's high watermark (VALUE: the new one);
* ``apply``: the driver hands a committed batch to the state machine;
* ``handoff``: a flush handed to the flusher thread (VALUE: the microseconds the loop
  spent in the hand-off, waiting for the thread to start it);
* ``records_yield`` / ``records_read``: a fetch answer carrying records reaches the
  leader's ``FetchStream`` handler, which yields it to gRPC / the fetching replica's
  stream reader gets it from gRPC (VALUE: its bytes); ``fetch_write`` / ``fetch_read``: a
  fetch is written to the fetcher's stream / the leader's handler reads it from gRPC
  (VALUE: its offset). Between them is the message's time in gRPC and the kernel alone.

``bench._raft_cpu --timeline`` reads the windows back (:func:`read_window`). Wrapping
costs a few microseconds per step: CPU figures come from runs without it.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

Event = tuple[int, str, int]
"""(``time.monotonic_ns()``, kind, value)."""


class _Recorder:
    def __init__(self, out: Path) -> None:
        self.out = out
        self.events: list[Event] | None = None
        self.windows = 0

    def note(self, kind: str, value: int = 0) -> None:
        events = self.events
        if events is not None:
            events.append((time.monotonic_ns(), kind, value))

    def start(self, _signal: int, _frame: FrameType | None) -> None:
        self.events = []

    def stop(self, _signal: int, _frame: FrameType | None) -> None:
        events, self.events = self.events, None
        if events is None:
            return
        path = self.out.with_name(f"{self.out.name}.{self.windows}")
        path.write_text("".join(f"{t} {kind} {value}\n" for t, kind, value in events))
        path.with_name(path.name + ".done").touch()
        self.windows += 1


def _writer_of(message: Any) -> int:
    """The writer number an ``AlterConfigs`` of the benchmark's topics carries; else -1."""
    resources = getattr(message, "resources", None)
    if not resources:
        return -1
    digits = str(getattr(resources[0], "resource_name", "")).rpartition("-")[2]
    return int(digits) if digits.isdigit() else -1


def _instrument(recorder: _Recorder) -> None:
    from highwater.controller.service import ControllerServer
    from highwater.internal.v1 import raft_pb2
    from highwater.raft import transport
    from highwater.raft.driver import RaftServer
    from highwater.raft.log_flusher import LogFlusher
    from highwater.raft.messages import FetchRequest, FetchResponse
    from highwater.raft.partition_raft_log import PartitionRaftLog

    note = recorder.note

    def wrap(cls: type, name: str, around: Callable[[Callable[..., Any]], Any]) -> None:
        setattr(cls, name, around(getattr(cls, name)))

    def serve(original: Callable[..., Any]) -> Any:
        async def serve(self: Any, *args: Any, **kwargs: Any) -> Any:
            writer = _writer_of(args[1]) if len(args) > 1 else -1
            note("request", writer)
            try:
                return await original(self, *args, **kwargs)
            finally:
                note("answer", writer)

        return serve

    def append(original: Callable[..., Any]) -> Any:
        def append(self: Any, values: Any, **kwargs: Any) -> Any:
            note("append", len(values))
            return original(self, values, **kwargs)

        return append

    def flush(original: Callable[..., Any]) -> Any:
        def flush(self: Any) -> Any:
            note("fsync", int(threading.current_thread() is not threading.main_thread()))
            try:
                return original(self)
            finally:
                note("fsynced", self.flushed_offset)

        return flush

    def message(direction: str, value: Any) -> None:
        if isinstance(value, FetchRequest):
            note(f"fetch_{direction}", value.fetch_offset)
        elif isinstance(value, FetchResponse):
            size = len(value.records)
            note(f"records_{direction}" if size else f"empty_{direction}", size)

    def dispatch(original: Callable[..., Any]) -> Any:
        def dispatch(self: Any, value: Any) -> Any:
            message("out", value)
            return original(self, value)

        return dispatch

    def step(original: Callable[..., Any]) -> Any:
        def step(self: Any, node: Any, value: Any, **kwargs: Any) -> Any:
            message("in", value)
            before = node.high_watermark
            try:
                return original(self, node, value, **kwargs)
            finally:
                after = node.high_watermark
                if after is not None and after != before:
                    note("high_watermark", after)

        return step

    def resolve(original: Callable[..., Any]) -> Any:
        def resolve(self: Any, batch: Any) -> Any:
            note("apply", batch.next_offset)
            return original(self, batch)

        return resolve

    def handoff(original: Callable[..., Any]) -> Any:
        def handoff(self: Any, flush: Any, **kwargs: Any) -> Any:
            started = time.monotonic_ns()
            try:
                return original(self, flush, **kwargs)
            finally:
                note("handoff", (time.monotonic_ns() - started) // 1000)

        return handoff

    def served(original: Callable[..., Any]) -> Any:
        async def serve(self: Any, wire: Any, *args: Any, **kwargs: Any) -> Any:
            fetch = isinstance(wire, raft_pb2.RaftFetchRequest)
            if fetch:
                note("fetch_read", wire.fetch_offset)
            response = await original(self, wire, *args, **kwargs)
            if fetch and response.records:
                note("records_yield", len(response.records))
            return response

        return serve

    def read(original: Callable[..., Any]) -> Any:
        def response_from_proto(wire: Any, request: Any) -> Any:
            if isinstance(wire, raft_pb2.RaftFetchResponse) and wire.records:
                note("records_read", len(wire.records))
            return original(wire, request)

        return response_from_proto

    def write(original: Callable[..., Any]) -> Any:
        def request_to_proto(request: Any) -> Any:
            if isinstance(request, FetchRequest):
                note("fetch_write", request.fetch_offset)
            return original(request)

        return request_to_proto

    transport.response_from_proto = read(transport.response_from_proto)
    transport.request_to_proto = write(transport.request_to_proto)
    wrap(RaftServer, "serve", served)
    wrap(LogFlusher, "flush", handoff)
    wrap(ControllerServer, "serve", serve)
    wrap(RaftServer, "append", append)
    wrap(PartitionRaftLog, "flush", flush)
    wrap(RaftServer, "_dispatch", dispatch)
    wrap(RaftServer, "_step", step)
    wrap(RaftServer, "_resolve_proposals", resolve)


def read_window(path: Path) -> list[Event]:
    """The events of one written window, in time order."""
    events = []
    for line in path.read_text().splitlines():
        t, kind, value = line.split()
        events.append((int(t), kind, int(value)))
    events.sort()
    return events


def serve_with_timeline(out: Path, arguments: list[str]) -> None:
    from highwater.cli.main import main

    recorder = _Recorder(out)
    _instrument(recorder)
    signal.signal(signal.SIGUSR1, recorder.start)
    signal.signal(signal.SIGUSR2, recorder.stop)
    main(args=arguments, prog_name="highwater")


if __name__ == "__main__":
    serve_with_timeline(Path(sys.argv[1]), sys.argv[2:])
