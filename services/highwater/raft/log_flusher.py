"""``LogFlusher``: one thread that fsyncs the metadata log when the driver asks, so that a
slow fsync does not stall the event loop.

``asyncio.to_thread`` per fsync costs, beside the fsync, a thread-pool submit, a
``concurrent.futures.Future`` chained to an asyncio one and a context copy: about 115 µs
of CPU per hand-off on the 2-CPU machine of docs/benchmarks.md, against about 60 µs for
a thread of its own blocked on a queue that answers with ``call_soon_threadsafe``. The
driver asks for one flush at a time (``RaftServer._flushing``) and entries appended while
it runs go in the next one (group commit), so the queue holds one request at most; the
durability rules are the driver's and unchanged: nothing counts as flushed before
``flush()`` returned in the thread.

A hand-off can wait (at most ``start_wait_s``) until the thread has started the flush.
The thread, woken by the queue, needs the GIL to reach the fsync, which releases it; a
busy loop keeps the GIL until it blocks or for the interpreter's switch interval (5 ms),
so a follower's fsync of a batch started only after the rest of its loop's turn (the
apply of the batch before): about a millisecond later on a loaded machine, on the path
of every commit. Waiting on a ``threading.Event`` releases the GIL to the thread at
once; the loop is blocked meanwhile (the thread's wake-up: 0.15 to 0.65 ms p50 at a load
of 20 on 2 CPUs, and the GIL back after the bound can take longer), so the driver waits
only where the fsync is on the commit's path and the loop has nothing of the commit's
to do before it ends: on a voter that follows.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import time
from collections.abc import Callable
from typing import Final

__all__ = ["LogFlusher"]

_START_WAIT_S: Final = 0.001
"""How long a hand-off waits for the thread to start the flush: a bound for a machine so
loaded that the thread is not scheduled soon; the flush runs whenever it starts."""

_Request = tuple[
    Callable[[], object],
    asyncio.AbstractEventLoop,
    asyncio.Future[float],
    threading.Event | None,
]


class LogFlusher:
    """A daemon thread running the flushes handed to :meth:`flush`, in order."""

    def __init__(self, name: str, *, start_wait_s: float = _START_WAIT_S) -> None:
        self._requests: queue.SimpleQueue[_Request | None] = queue.SimpleQueue()
        self._start_wait_s = start_wait_s
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()
        self._closed = False

    def flush(
        self, flush: Callable[[], object], *, wait_started: bool = False
    ) -> asyncio.Future[float]:
        """Run ``flush`` in the thread; a future of the seconds it took there (the
        hand-off's own delay excluded), or of the exception it raised. ``wait_started``:
        return only once the thread has started it, or after ``start_wait_s`` (see the
        module docstring)."""
        if self._closed:
            raise RuntimeError("the log flusher is closed")
        loop = asyncio.get_running_loop()
        done: asyncio.Future[float] = loop.create_future()
        started = threading.Event() if wait_started and self._start_wait_s > 0 else None
        self._requests.put((flush, loop, done, started))
        if started is not None:
            started.wait(self._start_wait_s)
        return done

    def close(self) -> None:
        """Stop the thread once the flushes handed to it have run (it is not joined: one
        under way finishes on its own, a daemon thread)."""
        if not self._closed:
            self._closed = True
            self._requests.put(None)

    def _run(self) -> None:
        while (request := self._requests.get()) is not None:
            flush, loop, done, started = request
            if started is not None:
                started.set()
            began = time.perf_counter()
            try:
                flush()
            except BaseException as e:  # handed to the waiting driver, which stops
                _answer(loop, done, None, e)
            else:
                _answer(loop, done, time.perf_counter() - began, None)


def _answer(
    loop: asyncio.AbstractEventLoop,
    done: asyncio.Future[float],
    seconds: float | None,
    error: BaseException | None,
) -> None:
    def settle() -> None:
        if done.done():  # the waiting driver was cancelled
            return
        if error is not None:
            done.set_exception(error)
        else:
            assert seconds is not None
            done.set_result(seconds)

    # The loop closed meanwhile (RuntimeError): nobody waits any more.
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(settle)
