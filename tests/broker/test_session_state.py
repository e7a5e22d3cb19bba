"""A consumer session's credit and positions (broker/session_state.py), without a loop."""

from __future__ import annotations

import pytest
from highwater.broker.session_state import SessionState

A = ("t", 0)
B = ("t", 1)


def started(max_records: int = 3, max_bytes: int = 100) -> SessionState:
    state = SessionState(max_records, max_bytes)
    state.assign([A, B])
    state.start_at(A, 0, committed=False)
    state.start_at(B, 7, committed=True)
    return state


def test_credit_counts_records_and_bytes_outstanding() -> None:
    state = started()
    assert state.fetchable() == [(A, 0), (B, 7)]
    assert state.deliverable([10, 10, 10, 10]) == 3  # records
    assert state.deliverable([60, 60]) == 1  # bytes
    assert state.deliverable([500]) == 1  # one record past the bytes when nothing is out
    state.delivered(A, [(0, 500, 0)])
    assert not state.has_credit() and state.fetchable() == []
    assert state.deliverable([1]) == 0


def test_acknowledgements_free_credit_and_are_what_commits_commit() -> None:
    state = started()
    state.delivered(A, [(0, 10, 0), (1, 10, 0), (2, 10, 0)])
    assert not state.has_credit()
    assert state.to_commit() == {}  # B's committed offset is already committed
    assert state.acknowledge(A, 2) is None
    assert (state.outstanding_records, state.outstanding_bytes) == (1, 10)
    assert state.fetchable() == [(A, 3), (B, 7)]
    assert state.to_commit() == {A: (2, 0)}
    state.committed(A, 2)
    assert state.to_commit() == {}


def test_commits_carry_the_leader_epoch_of_the_last_acknowledged_record() -> None:
    """As Kafka's consumer commits ``offsetEpoch``: the epoch of the batch the record before
    the acknowledged offset came in; a committed start keeps the committed offset's."""
    state = SessionState(10, 1000)
    state.assign([A, B])
    state.start_at(A, 0, committed=False)
    state.start_at(B, 7, committed=True, leader_epoch=2)
    state.delivered(A, [(0, 10, 1), (1, 10, 1), (3, 10, 2)])  # offset 2 compacted away
    state.delivered(B, [(7, 10, 3)])
    assert state.acknowledge(A, 2) is None
    assert state.to_commit() == {A: (2, 1)}
    assert state.acknowledge(A, 4) is None
    assert state.acknowledge(B, 7) is None  # nothing new: the committed offset's epoch
    assert state.partitions[B].acknowledged_epoch == 2
    assert state.to_commit() == {A: (4, 2)}
    assert state.acknowledge(B, 8) is None
    assert state.to_commit() == {A: (4, 2), B: (8, 3)}


@pytest.mark.parametrize(
    ("tp", "offset", "words"), [(A, 4, "never delivered"), (("u", 0), 0, "not held")]
)
def test_an_acknowledgement_of_what_was_not_delivered_is_refused(
    tp: tuple[str, int], offset: int, words: str
) -> None:
    state = started()
    state.delivered(A, [(0, 10, 0)])
    refusal = state.acknowledge(tp, offset)
    assert refusal is not None and words in refusal
    assert state.outstanding_records == 1 and state.to_commit() == {}


def test_seeks_and_revocations_release_what_was_outstanding() -> None:
    state = started()
    state.delivered(A, [(0, 10, 0), (1, 10, 0)])
    state.delivered(B, [(7, 10, 0)])
    assert state.seek(A, 0) is None
    assert state.outstanding_records == 1 and state.fetchable()[0] == (A, 0)
    state.remove([B])
    assert state.outstanding_records == 0 and state.held() == (A,)
    assert state.seek(B, 0) is not None
