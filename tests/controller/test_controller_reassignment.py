"""Partition reassignment in the quorum controller (Kafka's KIP-455): the new replicas are
added, the ISR grows as they catch up, and the move completes — old replicas dropped,
leadership handed to a target replica — once every target replica is in the ISR; a move
can be replaced or cancelled; bad targets are refused per partition; a broker that still
holds replicas cannot be unregistered."""

from __future__ import annotations

import pytest
from controller_helpers import Harness, check_invariants
from highwater.controller_api.messages import (
    AlterPartitionItem,
    AlterPartitionReassignmentsRequest,
    AlterPartitionRequest,
    CreatableTopic,
    CreateTopicsRequest,
    ListPartitionReassignmentsRequest,
    PartitionReassignment,
    TopicPartitions,
    UnregisterBrokerRequest,
)
from highwater.metadata import PartitionRegistration
from highwater.v1.common_pb2 import ErrorCode


@pytest.fixture
def h() -> Harness:
    harness = Harness()
    harness.start_brokers([1, 2, 3, 4])
    topic = CreatableTopic("t", assignments=((1, 2, 3), (2, 3, 1)))
    harness.commit(harness.controller.create_topics(CreateTopicsRequest((topic,))))
    return harness


def reassign(h: Harness, *items: PartitionReassignment) -> list[tuple[int, str]]:
    response = h.commit(
        h.controller.alter_partition_reassignments(AlterPartitionReassignmentsRequest(items))
    )
    check_invariants(h.image)
    return [(r.error, r.error_message) for r in response.partitions]


def expand_isr(h: Harness, partition_id: int, new_isr: tuple[int, ...]) -> None:
    """The partition's leader reports its followers caught up (AlterPartition)."""
    partition = h.partition("t", partition_id)
    item = AlterPartitionItem(
        h.topic_id("t"),
        partition_id,
        partition.leader_epoch,
        partition.partition_epoch,
        new_isr,
    )
    response = h.commit(
        h.controller.alter_partition(
            AlterPartitionRequest(partition.leader, h.epochs[partition.leader], (item,))
        )
    )
    assert response.partitions[0].error == ErrorCode.NONE, response
    check_invariants(h.image)


def lists(p: PartitionRegistration) -> tuple[tuple[int, ...], ...]:
    return p.replicas, p.isr, p.adding_replicas, p.removing_replicas


def test_a_move_adds_the_new_replica_then_drops_the_old_once_it_is_in_sync(h: Harness) -> None:
    before = h.partition("t", 0)
    assert reassign(h, PartitionReassignment("t", 0, (1, 2, 4))) == [(ErrorCode.NONE, "")]
    moving = h.partition("t", 0)
    # 4 is added behind the target, 3 stays until 4 is in sync; leader and ISR unchanged.
    assert lists(moving) == ((1, 2, 4, 3), (1, 2, 3), (4,), (3,))
    assert (moving.leader, moving.leader_epoch) == (1, before.leader_epoch)
    listed = h.controller.list_partition_reassignments(ListPartitionReassignmentsRequest())
    [ongoing] = listed.response.reassignments
    assert (ongoing.topic, ongoing.partition_id, ongoing.adding_replicas) == ("t", 0, (4,))
    assert ongoing.removing_replicas == (3,)

    expand_isr(h, 0, (1, 2, 3, 4))
    done = h.partition("t", 0)
    assert lists(done) == ((1, 2, 4), (1, 2, 4), (), ())
    assert done.leader == 1 and done.leader_epoch == before.leader_epoch  # no new leader
    assert not h.controller.list_partition_reassignments(
        ListPartitionReassignmentsRequest()
    ).response.reassignments
    assert h.replayed() == h.image


def test_moving_the_leader_away_hands_leadership_to_a_target_replica(h: Harness) -> None:
    before = h.partition("t", 0)
    reassign(h, PartitionReassignment("t", 0, (4, 2, 3)))
    assert h.partition("t", 0).leader == 1  # the old leader keeps serving during the copy
    expand_isr(h, 0, (1, 2, 3, 4))
    done = h.partition("t", 0)
    assert lists(done) == ((4, 2, 3), (2, 3, 4), (), ())
    # The first target replica in the ISR (the new preferred leader) leads, in a new epoch.
    assert done.leader == 4 and done.leader_epoch == before.leader_epoch + 1


def test_dropping_or_reordering_replicas_completes_at_once(h: Harness) -> None:
    reassign(h, PartitionReassignment("t", 1, (3, 2)))
    assert lists(h.partition("t", 1)) == ((3, 2), (2, 3), (), ())
    assert h.partition("t", 1).leader == 2
    assert reassign(h, PartitionReassignment("t", 1, (3, 2))) == [(ErrorCode.NONE, "")]


def test_a_new_target_replaces_the_move_in_progress_from_the_original_replicas(
    h: Harness,
) -> None:
    reassign(h, PartitionReassignment("t", 0, (1, 2, 4)))
    reassign(h, PartitionReassignment("t", 0, (4, 3, 2)))
    moving = h.partition("t", 0)
    assert lists(moving) == ((4, 3, 2, 1), (1, 2, 3), (4,), (1,))


def test_a_cancelled_move_goes_back_to_the_original_replicas(h: Harness) -> None:
    reassign(h, PartitionReassignment("t", 0, (4, 2, 3)))
    expand_isr(h, 0, (1, 2, 3))  # nothing new: 4 has not caught up
    assert reassign(h, PartitionReassignment("t", 0, cancel=True)) == [(ErrorCode.NONE, "")]
    # Back to the original brokers, in the order the move left them (as Kafka's revert);
    # the leader, still in sync, keeps leading.
    reverted = h.partition("t", 0)
    assert lists(reverted) == ((2, 3, 1), (1, 2, 3), (), ())
    assert reverted.leader == 1
    [(code, message)] = reassign(h, PartitionReassignment("t", 0, cancel=True))
    assert code == ErrorCode.NO_REASSIGNMENT_IN_PROGRESS and "not being reassigned" in message


def test_bad_targets_are_refused_per_partition(h: Harness) -> None:
    results = reassign(
        h,
        PartitionReassignment("t", 0, (1, 1, 2)),
        PartitionReassignment("t", 1, (2, 9)),
        PartitionReassignment("t", 7, (1, 2)),
        PartitionReassignment("nope", 0, (1,)),
        PartitionReassignment("t", 0, ()),
    )
    codes = [code for code, _ in results]
    assert codes == [
        ErrorCode.INVALID_REPLICA_ASSIGNMENT,
        ErrorCode.INVALID_REPLICA_ASSIGNMENT,
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ErrorCode.INVALID_REQUEST,  # named twice
    ]
    assert "twice" in results[0][1] and "[9]" in results[1][1]
    assert lists(h.partition("t", 0)) == ((1, 2, 3), (1, 2, 3), (), ())
    listed = h.controller.list_partition_reassignments(
        ListPartitionReassignmentsRequest((TopicPartitions("t", (0, 1)),))
    )
    assert listed.response.reassignments == ()


def test_a_broker_that_holds_replicas_cannot_be_unregistered_until_they_move(
    h: Harness,
) -> None:
    refused = h.controller.unregister_broker(UnregisterBrokerRequest(3))
    assert refused.records == []
    assert refused.response.error == ErrorCode.INVALID_REQUEST
    assert "still holds replicas of 2 partitions" in refused.response.error_message
    reassign(h, PartitionReassignment("t", 0, (1, 2, 4)), PartitionReassignment("t", 1, (2, 4, 1)))
    assert h.controller.unregister_broker(UnregisterBrokerRequest(3)).response.error == (
        ErrorCode.INVALID_REQUEST  # still a replica until the moves complete
    )
    expand_isr(h, 0, (1, 2, 3, 4))
    expand_isr(h, 1, (1, 2, 3, 4))
    assert not h.image.replicas_of(3)
    h.commit(h.controller.unregister_broker(UnregisterBrokerRequest(3)))
    assert h.image.broker(3) is None
