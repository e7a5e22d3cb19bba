"""What long polls and acks=all produces wait for: records appended, or a high watermark moved.

Kafka parks such requests in its delayed-operation purgatories, keyed by partition; here
two broker-wide events stand for them. A follower's parked fetch waits for records
*appended* to a log; a consumer's fetch and an acks=all produce wait for a high watermark
that moved (*committed*); any other change (a metadata image, a follower's append) sets
both. Each wait then checks its own condition again, so a wake-up that concerns another
partition costs one more look, never a missed answer.
"""

from __future__ import annotations

import asyncio
import contextlib

__all__ = ["Purgatory"]


class Purgatory:
    """The two events a broker's waits park on (see the module docstring)."""

    def __init__(self) -> None:
        self._appended = asyncio.Event()
        self._committed = asyncio.Event()

    def notify(self, *, appended: bool = True, committed: bool = True) -> None:
        """Wake the waits for records ``appended`` to a log, for a high watermark that
        moved (``committed``), or both (any other change)."""
        if appended:
            self._appended.set()
            self._appended = asyncio.Event()
        if committed:
            self._committed.set()
            self._committed = asyncio.Event()

    async def wait(self, timeout_s: float, *, appended: bool = False) -> None:
        """Wait up to ``timeout_s`` for the next :meth:`notify` of records ``appended`` (a
        follower's fetch), else of a high watermark that moved."""
        if timeout_s <= 0:
            return
        event = self._appended if appended else self._committed
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await event.wait()
