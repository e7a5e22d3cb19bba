"""A controller that falls behind on its own loop does not fence the brokers it could not
hear: a heartbeat counts from its arrival, and time between two ticks beyond the
heartbeat interval (the controller's loop blocked or starved) does not count against
sessions (``controller/heartbeats.py``). A broker that is really silent is still fenced."""

from __future__ import annotations

from controller_helpers import Harness
from highwater.controller import ControllerConfig

CONFIG = ControllerConfig()
SESSION = CONFIG.broker_session_timeout_ms
INTERVAL = CONFIG.broker_heartbeat_interval_ms
TICK = 100


def _cluster(*, credit_stalls: bool = True) -> Harness:
    h = Harness(credit_stalls=credit_stalls)
    h.start_brokers([0, 1, 2])
    h.tick()
    return h


def _tick_for(h: Harness, ms: int, heartbeating: tuple[int, ...] = ()) -> list[int]:
    """Tick every 100 ms for ``ms``, the ``heartbeating`` brokers heartbeating every
    interval; the brokers fenced meanwhile."""
    fenced: list[int] = []
    for step in range(ms // TICK):
        h.clock.advance(TICK)
        if (step + 1) * TICK % INTERVAL == 0:
            for broker_id in heartbeating:
                h.heartbeat(broker_id)
        result = h.controller.tick(h.clock.now_ms)
        h.commit(result)
        fenced.extend(result.response.fenced_brokers)
    return fenced


def test_a_controller_stalled_past_the_session_timeout_fences_nobody() -> None:
    # The loop was blocked for three session timeouts (applying a large batch, starved
    # of CPU): the brokers' heartbeats are still unread on its sockets.
    h = _cluster()
    h.clock.advance(3 * SESSION)
    assert h.controller.tick(h.clock.now_ms).response.fenced_brokers == ()
    # Counting every millisecond, the same tick fences all three.
    counting = _cluster(credit_stalls=False)
    counting.clock.advance(3 * SESSION)
    assert counting.controller.tick(counting.clock.now_ms).response.fenced_brokers == (0, 1, 2)


def test_a_silent_broker_is_fenced_after_a_session_of_ticking() -> None:
    h = _cluster()
    assert _tick_for(h, SESSION - 2 * TICK, heartbeating=(0, 1)) == []
    assert _tick_for(h, 3 * TICK, heartbeating=(0, 1)) == [2]
    assert h.broker(2).fenced and not h.broker(0).fenced and not h.broker(1).fenced


def test_a_stall_costs_a_silent_broker_at_most_one_heartbeat_interval() -> None:
    h = _cluster()
    h.clock.advance(5 * SESSION)  # a stall: only one heartbeat interval of it counts
    h.heartbeat(0)
    h.heartbeat(1)
    assert _tick_for(h, SESSION - INTERVAL - 2 * TICK, heartbeating=(0, 1)) == []
    assert _tick_for(h, 3 * TICK, heartbeating=(0, 1)) == [2]
    # The first tick after the stall came 5 sessions and one tick after the last one.
    assert h.controller.heartbeats.unheard_ms == 5 * SESSION + TICK - INTERVAL


def test_a_heartbeat_counts_from_its_arrival_not_its_processing() -> None:
    h = _cluster()
    assert _tick_for(h, SESSION - 1_000, heartbeating=(0, 1)) == []
    # Broker 2's heartbeat arrives now, then waits in the controller's queue behind a
    # tick queued earlier (and a long batch of work before both).
    h.controller.heartbeats.note_contact(2, h.epochs[2], h.clock.now_ms)
    h.clock.advance(1_500)
    assert h.controller.tick(h.clock.now_ms).response.fenced_brokers == ()
    # A heartbeat of another incarnation says nothing about this one's session.
    h.controller.heartbeats.note_contact(1, h.epochs[1] + 1, h.clock.now_ms)
    assert _tick_for(h, SESSION, heartbeating=(0,)) == [1, 2]
