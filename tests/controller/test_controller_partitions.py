"""Partition leadership: AlterPartition, leader elections, automatic preferred-leader balance."""

from __future__ import annotations

import pytest
from controller_helpers import NONE, Harness, check_invariants
from highwater.controller import (
    ControllerConfig,
    ControllerResult,
    Election,
    PartitionChangeBuilder,
)
from highwater.controller_api.messages import (
    INVALID_UPDATE_VERSION,
    AlterPartitionItem,
    AlterPartitionRequest,
    AlterPartitionResponse,
    CreatableTopic,
    CreateTopicsRequest,
    ElectionType,
    ElectLeadersRequest,
    TopicPartitions,
)
from highwater.metadata import NO_LEADER, PartitionChangeRecord, PartitionRegistration
from highwater.v1.common_pb2 import ErrorCode

SESSION = 9000


@pytest.fixture
def h() -> Harness:
    harness = Harness()
    harness.start_brokers([1, 2, 3])
    topic = CreatableTopic("t", assignments=((1, 2, 3), (2, 3, 1)))
    harness.commit(harness.controller.create_topics(CreateTopicsRequest((topic,))))
    return harness


def alter(
    h: Harness, broker_id: int, *items: AlterPartitionItem
) -> ControllerResult[AlterPartitionResponse]:
    return h.controller.alter_partition(
        AlterPartitionRequest(broker_id, h.epochs[broker_id], items)
    )


def item(
    h: Harness, new_isr: tuple[int, ...], partition_id: int = 0, **epochs: int
) -> AlterPartitionItem:
    partition = h.partition("t", partition_id)
    return AlterPartitionItem(
        h.topic_id("t"),
        partition_id,
        epochs.get("leader_epoch", partition.leader_epoch),
        epochs.get("partition_epoch", partition.partition_epoch),
        new_isr,
    )


# --- AlterPartition --------------------------------------------------------------------


def test_the_leader_shrinks_and_expands_the_isr(h: Harness) -> None:
    result = alter(h, 1, item(h, (1, 3)))
    assert result.records == [PartitionChangeRecord(h.topic_id("t"), 0, isr=(1, 3))]
    answer = result.response.partitions[0]
    assert answer.error == NONE
    assert (answer.leader, answer.leader_epoch, answer.isr, answer.partition_epoch) == (
        1,
        0,
        (1, 3),
        1,
    )
    h.commit(result)
    assert h.partition("t") == PartitionRegistration((1, 2, 3), (1, 3), 1, 0, 1)
    h.commit(alter(h, 1, item(h, (1, 3, 2))))
    assert h.partition("t") == PartitionRegistration((1, 2, 3), (1, 3, 2), 1, 0, 2)


def test_an_unchanged_isr_writes_nothing(h: Harness) -> None:
    result = alter(h, 1, item(h, (1, 2, 3)))
    assert result.records == []
    assert result.response.partitions[0].partition_epoch == 0


@pytest.mark.parametrize(
    ("broker", "new_isr", "epochs", "code"),
    [
        (1, (1,), {"leader_epoch": -1}, ErrorCode.FENCED_LEADER_EPOCH),
        (1, (1,), {"leader_epoch": 5}, ErrorCode.NOT_CONTROLLER),
        (1, (1,), {"partition_epoch": 5}, ErrorCode.NOT_CONTROLLER),
        (2, (2,), {}, ErrorCode.INVALID_REQUEST),  # not the leader
        (1, (2, 3), {}, ErrorCode.INVALID_REQUEST),  # the leader left out
        (1, (1, 1), {}, ErrorCode.INVALID_REQUEST),
        (1, (1, 7), {}, ErrorCode.INVALID_REQUEST),  # not a replica
    ],
)
def test_bad_isr_changes_are_refused(
    h: Harness, broker: int, new_isr: tuple[int, ...], epochs: dict[str, int], code: int
) -> None:
    result = alter(h, broker, item(h, new_isr, **epochs))
    assert result.records == []
    assert result.response.partitions[0].error == code


def test_an_old_partition_epoch_is_an_invalid_update_version(h: Harness) -> None:
    h.commit(alter(h, 1, item(h, (1, 2))))
    result = alter(h, 1, item(h, (1,), partition_epoch=0))
    assert result.response.partitions[0].error == INVALID_UPDATE_VERSION
    assert result.records == []


def test_only_active_brokers_may_join_the_isr(h: Harness) -> None:
    h.commit(alter(h, 1, item(h, (1, 2))))
    h.heartbeat(3, want_fence=True)
    refused = alter(h, 1, item(h, (1, 2, 3)))
    assert refused.response.partitions[0].error == ErrorCode.INELIGIBLE_REPLICA
    assert refused.records == []
    # Shrinking past a fenced member is fine.
    assert alter(h, 1, item(h, (1,))).response.partitions[0].error == NONE


def test_a_stale_broker_epoch_refuses_the_whole_request(h: Harness) -> None:
    result = h.controller.alter_partition(
        AlterPartitionRequest(1, h.epochs[1] + 100, (item(h, (1,)),))
    )
    assert result.response.error == ErrorCode.STALE_BROKER_EPOCH
    assert result.records == [] and result.response.partitions == ()


def test_each_partition_of_an_alter_stands_alone(h: Harness) -> None:
    result = alter(
        h,
        2,
        item(h, (2, 3), partition_id=1),
        item(h, (2,), partition_id=0),  # 2 does not lead partition 0
        AlterPartitionItem("no-such-topic", 0, 0, 0, (2,)),
        item(h, (2,), partition_id=1),  # named twice
    )
    errors = [p.error for p in result.response.partitions]
    assert errors == [
        NONE,
        ErrorCode.INVALID_REQUEST,
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ErrorCode.INVALID_REQUEST,
    ]
    assert len(result.records) == 1


# --- Elections -------------------------------------------------------------------------


def move_leadership_off(h: Harness, broker_id: int) -> None:
    """Fence the broker by session timeout, then bring it back (not leading, not in ISRs)."""
    h.clock.advance(SESSION)
    for other in h.epochs:
        if other != broker_id:
            h.heartbeat(other)
    h.tick()
    h.register(broker_id, incarnation=f"again-{h.clock.now_ms}")
    h.heartbeat(broker_id)


def test_preferred_election(h: Harness) -> None:
    request = ElectLeadersRequest(ElectionType.PREFERRED, (TopicPartitions("t", (0, 1, 9)),))
    result = h.controller.elect_leaders(request)
    assert [p.error for p in result.response.partitions] == [
        ErrorCode.ELECTION_NOT_NEEDED,
        ErrorCode.ELECTION_NOT_NEEDED,
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
    ]
    move_leadership_off(h, 1)
    assert h.partition("t").leader == 2 and 1 not in h.partition("t").isr
    not_in_isr = h.controller.elect_leaders(request)
    assert not_in_isr.response.partitions[0].error == ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE
    h.commit(alter(h, 2, item(h, (2, 3, 1))))
    elected = h.controller.elect_leaders(request)
    assert elected.response.partitions[0].error == NONE
    h.commit(elected)
    partition = h.partition("t")
    assert partition.leader == 1 and partition.leader_epoch == 2
    check_invariants(h.image)


def test_unclean_election_on_request(h: Harness) -> None:
    h.commit(alter(h, 1, item(h, (1,))))
    h.clock.advance(SESSION)
    h.heartbeat(2)
    h.heartbeat(3)
    h.tick()
    assert h.partition("t").leader == NO_LEADER
    request = ElectLeadersRequest(ElectionType.UNCLEAN, (TopicPartitions("t", (0, 1)),))
    result = h.controller.elect_leaders(request)
    assert [p.error for p in result.response.partitions] == [NONE, ErrorCode.ELECTION_NOT_NEEDED]
    h.commit(result)
    partition = h.partition("t")
    assert partition.leader == 2 and partition.isr == (2,)
    check_invariants(h.image)


def test_unclean_election_needs_a_live_replica() -> None:
    h = Harness()
    h.start_brokers([1])
    h.create_topic("t", 1, 1)
    h.clock.advance(SESSION)
    h.tick()
    result = h.controller.elect_leaders(
        ElectLeadersRequest(ElectionType.UNCLEAN, (TopicPartitions("t", (0,)),))
    )
    assert result.response.partitions[0].error == ErrorCode.ELIGIBLE_LEADERS_NOT_AVAILABLE
    assert result.records == []


def test_election_for_all_partitions_reports_only_what_it_tried(h: Harness) -> None:
    move_leadership_off(h, 1)
    h.commit(alter(h, 2, item(h, (2, 3, 1))))
    result = h.controller.elect_leaders(
        ElectLeadersRequest(ElectionType.PREFERRED, all_partitions=True)
    )
    assert [(p.partition_id, p.error) for p in result.response.partitions] == [(0, NONE)]


def test_automatic_rebalance_after_the_check_interval() -> None:
    config = ControllerConfig(leader_imbalance_check_interval_seconds=300)
    h = Harness(config)
    h.start_brokers([1, 2])
    h.create_topic("t", 10, 2)
    preferred_of_1 = [p for p in range(10) if h.partition("t", p).preferred_leader == 1]
    move_leadership_off(h, 1)
    for p in preferred_of_1:
        add_to_isr(h, p, 1)
    assert all(h.partition("t", p).leader == 2 for p in range(10))
    # Within the interval, nothing; then one tick moves leadership back.
    h.clock.advance(1000)
    h.heartbeat_all()
    assert h.controller.tick(h.clock.now_ms).response.preferred_elections == 0
    h.clock.advance(300_000)
    h.heartbeat_all()
    result = h.controller.tick(h.clock.now_ms)
    assert result.response.preferred_elections == len(preferred_of_1)
    h.commit(result)
    assert all(h.partition("t", p).leader == 1 for p in preferred_of_1)
    check_invariants(h.image)


def add_to_isr(h: Harness, partition_id: int, broker_id: int) -> None:
    partition = h.partition("t", partition_id)
    new_isr = (*partition.isr, broker_id)
    leader = partition.leader
    request = AlterPartitionRequest(
        leader,
        h.epochs[leader],
        (
            AlterPartitionItem(
                h.topic_id("t"),
                partition_id,
                partition.leader_epoch,
                partition.partition_epoch,
                new_isr,
            ),
        ),
    )
    assert h.commit(h.controller.alter_partition(request)).partitions[0].error == NONE


@pytest.mark.parametrize(("percentage", "elections"), [(50, 0), (49, 1)])
def test_imbalance_up_to_the_percentage_is_tolerated(percentage: int, elections: int) -> None:
    h = Harness(ControllerConfig(leader_imbalance_per_broker_percentage=percentage))
    h.start_brokers([1, 2])
    h.create_topic("t", 4, 2)
    preferred_of_1 = [p for p in range(4) if h.partition("t", p).preferred_leader == 1]
    assert len(preferred_of_1) == 2
    move_leadership_off(h, 1)
    for p in preferred_of_1:
        add_to_isr(h, p, 1)
    h.commit(
        h.controller.elect_leaders(
            ElectLeadersRequest(
                ElectionType.PREFERRED, (TopicPartitions("t", tuple(preferred_of_1[:1])),)
            )
        )
    )
    # Broker 1 leads one of its two preferred partitions: an imbalance of 50%.
    h.clock.advance(300_000)
    h.heartbeat_all()
    assert h.controller.tick(h.clock.now_ms).response.preferred_elections == elections


# --- The change builder ----------------------------------------------------------------


def builder(
    partition: PartitionRegistration, active: set[int], unclean: bool = False
) -> PartitionChangeBuilder:
    return PartitionChangeBuilder(partition, "t", 0, active.__contains__, unclean_allowed=unclean)


def test_builder_rules() -> None:
    p = PartitionRegistration((1, 2, 3), (1, 2, 3), 1)
    assert builder(p, {1, 2, 3}).build() is None
    # Leader inactive: the first active ISR member in replica order.
    assert builder(p, {2, 3}).remove_from_isr(1).build() == PartitionChangeRecord(
        "t", 0, isr=(2, 3), leader=2
    )
    # The last member stays; no active member means no leader.
    last = PartitionRegistration((1, 2), (1,), 1)
    assert builder(last, {2}).remove_from_isr(1).build() == PartitionChangeRecord(
        "t", 0, leader=NO_LEADER
    )
    # Unclean: the first active replica becomes the whole ISR.
    unclean = builder(last, {2}, unclean=True).remove_from_isr(1)
    assert unclean.build() == PartitionChangeRecord("t", 0, isr=(2,), leader=2)
    assert unclean.unclean
    # Preferred election.
    follower_led = PartitionRegistration((1, 2, 3), (2, 1), 2)
    preferred = builder(follower_led, {1, 2, 3}).set_election(Election.PREFERRED)
    assert preferred.build() == PartitionChangeRecord("t", 0, leader=1)
    # A target ISR without the leader moves leadership.
    target = builder(p, {1, 2, 3}).set_target_isr((3, 2)).build()
    assert target == PartitionChangeRecord("t", 0, isr=(3, 2), leader=2)
