"""The Raft driver's clock: time a replica's own loop could not run does not count.

The core's timers (a follower's or observer's fetch timeout, the election timeout, a
leader's check that a majority still fetches) measure silence from the others. A replica
whose event loop was blocked (applying a batch of thousands of metadata records, loading
an image) or starved of CPU (a loaded machine) has not been listening meanwhile: the
answers it waited for may be sitting unread on its sockets. Counting that time made
the standbys of a controller quorum at 10,000 partitions start elections while they
applied a large batch, and a broker's metadata observer give up its leader every two
seconds while it applied the log (docs/control-plane.md).

:class:`LoopClock` wraps the wall clock and counts at most ``max_step_ms`` between two
readings. The driver reads it at least every ``tick_interval_ms`` (10 ms) while its loop
runs, so a running loop's time counts in full and a stall counts as ``max_step_ms`` at
most. A peer that is really gone is still detected: its silence is measured while this
replica's loop runs. The price: the fetch timestamps DescribeQuorum reports lag the wall
clock by the stalls not counted (:attr:`LoopClock.uncounted_ms`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

MAX_STEP_MS: Final = 500
"""The most one gap between two readings counts: a quarter of the fetch timeout (2 s) and
half the election timeout (1 s), fifty driver ticks."""


class LoopClock:
    """Milliseconds that advance with ``clock`` (never backwards), at most ``max_step_ms``
    from one reading to the next."""

    def __init__(self, clock: Callable[[], int], max_step_ms: int = MAX_STEP_MS) -> None:
        if max_step_ms <= 0:
            raise ValueError(f"max_step_ms must be positive, not {max_step_ms}")
        self._clock = clock
        self.max_step_ms = max_step_ms
        self._last_raw: int | None = None
        self._now_ms = 0
        self.uncounted_ms = 0
        """The time not counted so far: gaps beyond ``max_step_ms``, and any step back
        of the underlying clock."""

    def __call__(self) -> int:
        raw = self._clock()
        last = self._last_raw
        self._last_raw = raw
        if last is None:
            self._now_ms = raw
            return raw
        step = raw - last
        if step < 0:
            self.uncounted_ms -= step  # a wall clock set back: no time passes
            step = 0
        elif step > self.max_step_ms:
            self.uncounted_ms += step - self.max_step_ms
            step = self.max_step_ms
        self._now_ms += step
        return self._now_ms
