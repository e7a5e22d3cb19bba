"""The consumer's position validation by leader epoch (KIP-320), its pure part: when a
position awaits validation, and what the leader's ``OffsetsForLeaderEpoch`` answer makes
of it (Kafka's ``SubscriptionState.maybeValidatePositionForCurrentLeader`` and
``maybeCompleteValidation``)."""

from __future__ import annotations

from highwater.client.consumer.fetcher import PartitionState, Truncation
from highwater.records import SimpleRecord, build_batch


def positioned(offset: int, epoch: int, leader_epoch: int = -1) -> PartitionState:
    state = PartitionState("t", 0, position=offset, position_epoch=epoch)
    state.position_leader_epoch = leader_epoch
    return state


def test_a_position_with_an_epoch_awaits_validation_against_each_new_leader() -> None:
    state = positioned(10, epoch=3)  # a committed offset with its epoch
    assert state.leader_known(4)
    assert state.awaiting_validation and not state.fetchable(0.0)
    assert state.complete_validation(3, 12, "earliest") is None
    assert (state.position, state.position_epoch, state.awaiting_validation) == (10, 3, False)
    assert state.fetchable(0.0)
    assert not state.leader_known(4), "checked against this leader already"
    assert state.leader_known(5)


def test_a_position_without_an_epoch_is_fetched_from_as_it_is() -> None:
    state = positioned(10, epoch=-1)  # given by hand, or just looked up
    assert not state.leader_known(4)
    assert state.position_leader_epoch == 4 and state.fetchable(0.0)
    unpositioned = PartitionState("t", 0)
    assert not unpositioned.leader_known(4)
    assert unpositioned.position_leader_epoch == -1, "checked once it has a position"
    assert not positioned(10, epoch=3).leader_known(-1), "no leader known yet"


def test_a_new_leader_drops_what_was_fetched_and_the_fetches_in_flight() -> None:
    state = positioned(0, epoch=3, leader_epoch=3)
    batch = build_batch(
        [SimpleRecord(value=b"a"), SimpleRecord(value=b"b")], partition_leader_epoch=3
    )
    assert state.buffer(0, batch, check_crcs=True) == (True, None)
    generation = state.generation
    assert state.leader_known(4)
    assert not state.buffered() and state.generation == generation + 1
    assert state.fetch_ahead_offset() is None


def test_an_epoch_ending_below_the_position_moves_it_to_the_divergence() -> None:
    state = positioned(10, epoch=3, leader_epoch=3)
    state.leader_known(5)
    assert state.complete_validation(2, 7, "latest") is None
    assert (state.position, state.position_epoch) == (7, 2)
    assert state.fetchable(0.0)


def test_without_a_reset_policy_the_truncation_is_returned_and_the_position_kept() -> None:
    state = positioned(10, epoch=3, leader_epoch=3)
    state.leader_known(5)
    assert state.complete_validation(2, 7, "none") == Truncation(10, 3, 7, 2)
    assert state.position == 10 and not state.awaiting_validation


def test_no_epoch_up_to_the_position_is_looked_up_afresh_or_returned() -> None:
    state = positioned(10, epoch=3, leader_epoch=3)
    state.reset = "earliest"
    state.leader_known(5)
    assert state.complete_validation(-1, -1, "latest") is None
    assert (state.position, state.position_epoch, state.reset) == (None, -1, "latest")
    strict = positioned(10, epoch=3, leader_epoch=3)
    strict.leader_known(5)
    assert strict.complete_validation(-1, -1, "none") == Truncation(10, 3, -1, -1)


def test_an_epoch_ending_at_or_past_the_position_validates_it() -> None:
    for end in (10, 11):
        state = positioned(10, epoch=3, leader_epoch=3)
        state.leader_known(4)
        assert state.complete_validation(3, end, "none") is None
        assert (state.position, state.position_epoch) == (10, 3)
