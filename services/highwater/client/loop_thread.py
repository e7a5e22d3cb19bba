"""An asyncio event loop in a daemon thread: what the blocking ``Producer`` and ``Consumer`` run on.

The blocking clients wrap their asyncio ones: each owns a :class:`LoopThread`, builds its
async client on that loop (its events and futures belong to it) and runs every call there
with :meth:`LoopThread.run`, waiting for the result in the caller's thread.

:meth:`LoopThread.stop` ends the loop cleanly. Closing a client cancels its gRPC calls,
and gRPC answers a cancelled call with a task of its own on the loop (the status of a
stream, ``_AioCall._handle_status_once_received``), which may not have run yet; a loop
closed under such a task leaves it pending, and asyncio reports "Task was destroyed but it
is pending!" when it is collected. So ``stop`` cancels and awaits every task still pending,
repeating while tasks create others, then shuts down async generators and the default
executor, as :func:`asyncio.run` does, before it stops and closes the loop.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import Future as ConcurrentFuture
from typing import Any, TypeVar

__all__ = ["LoopThread"]

_T = TypeVar("_T")

#: How many rounds of cancelling :meth:`LoopThread.stop` makes while tasks create others.
_CANCEL_ROUNDS = 10


class LoopThread:
    """An event loop running forever in a daemon thread named ``name``, until :meth:`stop`."""

    def __init__(self, name: str) -> None:
        """Make the loop and start its thread."""
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()
        self._stopped = False

    @property
    def stopped(self) -> bool:
        """Whether :meth:`stop` was called."""
        return self._stopped

    def submit(self, coro: Coroutine[Any, Any, _T]) -> ConcurrentFuture[_T]:
        """Schedule ``coro`` on the loop; its future, to wait for from any thread."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, _T], timeout: float | None = None) -> _T:
        """Run ``coro`` on the loop and wait (up to ``timeout`` seconds) for its result."""
        return self.submit(coro).result(timeout)

    def call_soon(self, callback: Callable[..., object], *args: Any) -> None:
        """Call ``callback(*args)`` on the loop, from any thread."""
        self.loop.call_soon_threadsafe(callback, *args)

    def stop(self) -> None:
        """Cancel and await the tasks still pending, stop the loop, join the thread and close
        the loop; stopping again does nothing. Not to be called from the loop's thread."""
        if self._stopped:
            return
        self._stopped = True
        if self._thread.is_alive():
            self.run(_finish_tasks())
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join()
        self.loop.close()


async def _finish_tasks() -> None:
    """Cancel every other task of the running loop and wait for them to end, then shut down
    its async generators and default executor."""
    loop = asyncio.get_running_loop()
    current = asyncio.current_task()
    for _ in range(_CANCEL_ROUNDS):
        # Let callbacks already scheduled (a call's status handling) create their tasks.
        await asyncio.sleep(0)
        pending = [t for t in asyncio.all_tasks(loop) if t is not current and not t.done()]
        if not pending:
            break
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    await loop.shutdown_asyncgens()
    await loop.shutdown_default_executor()
