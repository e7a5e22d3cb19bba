"""Raft timeouts short enough for tests of real quorums in one process or several: a
leader is elected within about a second, and a lost one noticed within 600 ms."""

from __future__ import annotations

from highwater.raft.node import RaftConfig

FAST = RaftConfig(
    election_timeout_ms=300,
    election_backoff_max_ms=300,
    fetch_timeout_ms=600,
    fetch_max_wait_ms=200,
    request_timeout_ms=500,
)
