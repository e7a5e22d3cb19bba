"""What long polls and acks=all produces wait for: records appended, or a high watermark moved.

Kafka parks such requests in its delayed-operation purgatories, keyed by partition. Here a
follower's parked fetch waits for records *appended* to a log and a consumer's fetch for a
high watermark that moved (*committed*): two broker-wide events, after which each wait
checks its own condition again, so a wake-up that concerns another partition costs one
more look, never a missed answer.

An acks=all produce waits for one partition's high watermark to reach the end of its
append. Those waits are kept by partition, in order of that end offset: a high watermark
that moved (:meth:`Purgatory.high_watermark_moved`) wakes only the produces it completes,
not every parked one, so with several produces in flight each is woken once. Any other
change (a metadata image, a follower's append, a failed log directory:
:meth:`Purgatory.notify` with ``committed``) wakes every wait, produces included, as it
may end one with an error.

The waits' timeouts share one timer: the deadlines are kept in a heap and only the
earliest is armed on the event loop, so a wait adds a heap entry instead of arming and
cancelling a timer handle of its own (produce timeouts are alike, so a new deadline is
rarely the earliest). An entry whose wait ended sooner stays until its deadline passes.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools

__all__ = ["Purgatory"]

TopicPartitionKey = tuple[str, int]

_Wait = tuple[int, int, "asyncio.Future[bool]"]
"""A parked produce: the offset its partition's high watermark must reach, its arrival
order (ties), and the future its wake-up completes."""


_NOTIFIED = True
_TIMED_OUT = False


def _wake(future: asyncio.Future[bool], how: bool = _NOTIFIED) -> None:
    if not future.done():
        future.set_result(how)


class Purgatory:
    """The waits a broker's long polls and acks=all produces park in (see the module
    docstring)."""

    def __init__(self) -> None:
        self._appended: list[asyncio.Future[bool]] = []
        self._committed: list[asyncio.Future[bool]] = []
        self._produces: dict[TopicPartitionKey, list[_Wait]] = {}
        self._order = itertools.count()
        self._deadlines: list[tuple[float, int, asyncio.Future[bool]]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0

    def notify(self, *, appended: bool = True, committed: bool = True) -> None:
        """Wake the waits for records ``appended`` to a log, for a high watermark that
        moved (``committed``: every parked produce too), or both (any other change)."""
        if appended and self._appended:
            waits, self._appended = self._appended, []
            for future in waits:
                _wake(future)
        if committed:
            self._wake_committed()
            produces, self._produces = self._produces, {}
            for parked in produces.values():
                for _, _, future in parked:
                    _wake(future)

    def high_watermark_moved(self, key: TopicPartitionKey, high_watermark: int) -> None:
        """Partition ``key``'s high watermark moved to ``high_watermark``: wake the
        consumers' long polls and the produces of ``key`` whose appends it now covers."""
        self._wake_committed()
        parked = self._produces.get(key)
        if parked is None:
            return
        while parked and parked[0][0] <= high_watermark:
            _wake(heapq.heappop(parked)[2])
        if not parked:
            del self._produces[key]

    async def wait(self, timeout_s: float, *, appended: bool = False) -> None:
        """Wait up to ``timeout_s`` for the next :meth:`notify` of records ``appended`` (a
        follower's fetch), else of a high watermark that moved."""
        if timeout_s <= 0:
            return
        waits = self._appended if appended else self._committed
        loop = asyncio.get_running_loop()
        future: asyncio.Future[bool] = loop.create_future()
        waits.append(future)
        self._deadline(loop, timeout_s, future)
        try:
            await future
        finally:
            if future.cancelled() or future.result() is _TIMED_OUT:
                # Not woken by a notify, so still in the list it joined (unless a notify
                # swapped that list out meanwhile).
                with contextlib.suppress(ValueError):
                    waits.remove(future)

    async def wait_replicated(self, key: TopicPartitionKey, end: int, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` until partition ``key``'s high watermark reaches
        ``end`` (:meth:`high_watermark_moved`) or any other change (:meth:`notify`); the
        caller checks the produce's completion again either way. A wait the timer ends
        stays in its partition's heap until a high watermark or a notify pops it."""
        if timeout_s <= 0:
            return
        loop = asyncio.get_running_loop()
        future: asyncio.Future[bool] = loop.create_future()
        heapq.heappush(self._produces.setdefault(key, []), (end, next(self._order), future))
        self._deadline(loop, timeout_s, future)
        await future

    def _wake_committed(self) -> None:
        if self._committed:
            waits, self._committed = self._committed, []
            for future in waits:
                _wake(future)

    def _deadline(
        self, loop: asyncio.AbstractEventLoop, timeout_s: float, future: asyncio.Future[bool]
    ) -> None:
        """Wake ``future`` in ``timeout_s`` unless something else does first."""
        at = loop.time() + timeout_s
        heapq.heappush(self._deadlines, (at, next(self._order), future))
        if self._timer is None or at < self._timer_at:
            if self._timer is not None:
                self._timer.cancel()
            self._timer = loop.call_at(at, self._expire)
            self._timer_at = at

    def _expire(self) -> None:
        """The earliest deadline came: wake the waits whose deadlines passed, arm the next."""
        self._timer = None
        deadlines = self._deadlines
        loop = asyncio.get_running_loop()
        # (The loop runs a timer up to its clock's resolution early: the one armed is due.)
        now = max(loop.time(), self._timer_at)
        while deadlines and deadlines[0][0] <= now:
            _wake(heapq.heappop(deadlines)[2], _TIMED_OUT)
        # The entries of waits that ended sooner are done futures: dropped as they come up.
        while deadlines and deadlines[0][2].done():
            heapq.heappop(deadlines)
        if deadlines:
            self._timer_at = deadlines[0][0]
            self._timer = loop.call_at(self._timer_at, self._expire)
