"""A consumer session's acknowledgements and byte credit (broker/session_state.py): stale
acknowledgements, and a next record that does not fit the bytes left."""

from __future__ import annotations

from highwater.broker.session_state import SessionState

A = ("t", 0)


def reading(max_records: int = 100, max_bytes: int = 1000) -> SessionState:
    state = SessionState(max_records, max_bytes)
    state.assign([A])
    state.start_at(A, 0, committed=False)
    return state


def test_an_acknowledgement_below_the_acknowledged_position_changes_nothing() -> None:
    """Every record below 5 is processed once every record below 10 is: an ack of 5 after
    one of 10 (out of order) is stale, and a commit never goes back to it."""
    state = reading()
    state.delivered(A, [(o, 10, 1 if o < 8 else 2) for o in range(12)])
    assert state.acknowledge(A, 10) is None
    assert state.acknowledge(A, 5) is None
    assert state.to_commit() == {A: (10, 2)}
    assert (state.outstanding_records, state.outstanding_bytes) == (2, 20)
    state.committed(A, 10)
    assert state.acknowledge(A, 3) is None and state.to_commit() == {}


def test_a_seek_back_lets_the_client_acknowledge_again_from_there() -> None:
    """A client that rewinds processes those records again, and its acks count (a later
    stale one still does not)."""
    state = reading()
    state.delivered(A, [(o, 10, 1) for o in range(10)])
    assert state.acknowledge(A, 10) is None
    assert state.seek(A, 3) is None
    state.delivered(A, [(3, 10, 1), (4, 10, 1), (5, 10, 1)])
    assert state.acknowledge(A, 5) is None
    assert state.acknowledge(A, 4) is None
    assert state.to_commit() == {A: (5, 1)}
    assert state.outstanding_records == 1


def test_a_start_at_the_committed_offset_is_the_floor_of_acknowledgements() -> None:
    state = SessionState(10, 1000)
    state.assign([A])
    state.start_at(A, 7, committed=True, leader_epoch=3)
    state.delivered(A, [(7, 10, 3)])
    assert state.acknowledge(A, 6) is None
    assert state.to_commit() == {} and state.outstanding_records == 1


def test_a_session_whose_next_record_does_not_fit_waits_for_bytes_to_be_released() -> None:
    state = reading(max_bytes=100)
    state.delivered(A, [(0, 60, 1)])
    assert state.has_credit() and state.deliverable([60]) == 0
    state.short_of_bytes()
    assert not state.has_credit() and state.fetchable() == []
    assert state.acknowledge(A, 0) is None  # frees nothing
    assert state.fetchable() == []
    assert state.acknowledge(A, 1) is None
    assert state.fetchable() == [(A, 1)]
    assert state.deliverable([500]) == 1  # nothing outstanding: a record larger still comes


def test_a_seek_or_a_revocation_ends_the_wait_for_bytes() -> None:
    state = reading(max_bytes=100)
    state.delivered(A, [(0, 60, 1)])
    state.short_of_bytes()
    assert state.seek(A, 0) is None and state.fetchable() == [(A, 0)]
    state.delivered(A, [(0, 60, 1)])
    state.short_of_bytes()
    state.assign([("t", 1)])
    state.start_at(("t", 1), 0, committed=False)
    state.delivered(("t", 1), [(0, 10, 1)])
    assert state.fetchable() == []
    state.remove([("t", 1)])
    assert state.fetchable() == [(A, 1)]


def test_with_nothing_outstanding_a_session_is_never_short_of_bytes() -> None:
    state = reading(max_bytes=100)
    state.short_of_bytes()
    assert state.fetchable() == [(A, 0)]
