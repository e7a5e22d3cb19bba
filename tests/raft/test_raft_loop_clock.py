"""The driver's clock (``raft/loop_clock.py``): a replica's own stall counts at most half
a second, so a follower blocked applying a large batch does not give up its leader; its
running loop's time counts in full."""

from __future__ import annotations

import pytest
from highwater.raft.loop_clock import MAX_STEP_MS, LoopClock
from highwater.raft.state import Role
from simulation import NodeHarness, begin_epoch, fetch_response


class RawClock:
    def __init__(self) -> None:
        self.now_ms = 1_000_000

    def __call__(self) -> int:
        return self.now_ms


def test_steps_count_up_to_the_bound_and_stalls_beyond_it_do_not() -> None:
    raw = RawClock()
    clock = LoopClock(raw)
    assert clock() == 1_000_000
    raw.now_ms += 10
    assert clock() == 1_000_010
    raw.now_ms += 7_000  # the loop was blocked for 7 s
    assert clock() == 1_000_010 + MAX_STEP_MS
    assert clock.uncounted_ms == 7_000 - MAX_STEP_MS
    raw.now_ms -= 3_000  # the wall clock set back: time stands still
    assert clock() == 1_000_010 + MAX_STEP_MS
    raw.now_ms += 20
    assert clock() == 1_000_030 + MAX_STEP_MS
    with pytest.raises(ValueError, match="positive"):
        LoopClock(raw, 0)


def _follower_after_a_stall(read: LoopClock | RawClock, raw: RawClock) -> NodeHarness:
    """A follower hears from its leader, then its loop is blocked for 5 s."""
    h = NodeHarness(2, (1, 2, 3), now_ms=read())
    h.step(begin_epoch(1, 3, to=2))
    h.step(fetch_response(1, 3, (0, 0), to=2))
    raw.now_ms += 5_000
    h.now_ms = read()
    h.node.tick(h.now_ms)
    return h


def test_a_follower_whose_loop_stalled_past_the_fetch_timeout_keeps_its_leader() -> None:
    raw = RawClock()
    clock = LoopClock(raw)
    h = _follower_after_a_stall(clock, raw)
    assert (h.node.role, h.node.leader_id) == (Role.FOLLOWER, 1)
    # With the wall clock, the same stall is a fetch timeout.
    wall = RawClock()
    assert _follower_after_a_stall(wall, wall).node.role is Role.PROSPECTIVE
    # A running loop (ticks every 10 ms) counts the leader's silence in full: the fetch
    # timeout (2 s) is reached after the half second the stall counted and 1.5 s more.
    ticks = 0
    while h.node.role is Role.FOLLOWER:
        raw.now_ms += 10
        h.now_ms = clock()
        h.node.tick(h.now_ms)
        ticks += 1
    assert h.node.role is Role.PROSPECTIVE
    assert ticks * 10 == h.config.fetch_timeout_ms - MAX_STEP_MS
