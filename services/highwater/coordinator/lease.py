"""The coordinator's session lease: until when its ``__consumer_offsets`` partitions are its own.

The controller gives a coordinator's partitions away once its session expires (no heartbeat
for ``session_timeout_ms``). The coordinator cannot see that happen while it is paused or
cut off, so it keeps its own conservative clock: a heartbeat sent at ``sent`` and
acknowledged proves the session was alive at ``sent``, so the partitions are certainly
still its own until ``sent + session_timeout_ms``. Past that it must serve nothing (not
even OffsetFetch from its cache: a successor may have taken commits since) until a
heartbeat is acknowledged again, and then it reloads its partitions from the log.

Pure: times are integers of milliseconds the edge passes in (monotonic in the service, the
simulated clock in tests/simulation/sim_groups.py).
"""

from __future__ import annotations


class SessionLease:
    """``lapse`` and ``renew`` report the transitions the edge acts on (drop / reload)."""

    def __init__(self, session_timeout_ms: int) -> None:
        self.session_timeout_ms = session_timeout_ms
        self.until_ms = 0
        self.lapsed = False

    def lapse(self, now_ms: int) -> bool:
        """True when the lease has just run out at ``now_ms``: stop serving every partition."""
        if self.lapsed or now_ms < self.until_ms:
            return False
        self.lapsed = True
        return True

    def renew(self, sent_ms: int) -> bool:
        """A heartbeat (or registration) sent at ``sent_ms`` was acknowledged. True when the
        lease had lapsed: load the partitions still assigned here again."""
        self.until_ms = max(self.until_ms, sent_ms + self.session_timeout_ms)
        was_lapsed = self.lapsed
        self.lapsed = False
        return was_lapsed
