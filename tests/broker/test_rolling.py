"""The rolling-restart gates: when a broker may stop, and when a restarted one is ready."""

from __future__ import annotations

from highwater.broker.rolling import (
    NAMED_PARTITIONS,
    ClusterView,
    PartitionState,
    broker_readiness,
    leaderships,
    may_stop,
    readiness,
    under_replicated,
)
from highwater.cli.rolling import cluster_view
from highwater.client.admin import PartitionInfo, TopicDescription
from highwater.metadata.delta import replay
from highwater.metadata.records import (
    PartitionRecord,
    RegisterBrokerRecord,
    TopicRecord,
    UnfenceBrokerRecord,
)


def part(
    topic: str, partition: int, leader: int | None, replicas: tuple[int, ...], isr: tuple[int, ...]
) -> PartitionState:
    return PartitionState(topic, partition, leader, replicas, isr)


HEALTHY = ClusterView(
    frozenset({1, 2, 3}),
    (
        part("orders", 0, 1, (1, 2, 3), (1, 2, 3)),
        part("orders", 1, 2, (2, 3, 1), (2, 3, 1)),
        part("__consumer_offsets", 0, 3, (3, 1, 2), (3, 1, 2)),
    ),
)


def test_a_healthy_cluster_lets_any_broker_stop_and_each_is_ready() -> None:
    for node in (1, 2, 3):
        assert may_stop(HEALTHY, node).allowed
        assert readiness(HEALTHY, node).allowed
    assert under_replicated(HEALTHY) == []


def test_an_under_replicated_partition_elsewhere_holds_every_other_broker() -> None:
    # broker 3 restarted and is still catching up on orders-1
    view = ClusterView(
        frozenset({1, 2, 3}),
        (
            part("orders", 0, 1, (1, 2, 3), (1, 2, 3)),
            part("orders", 1, 2, (2, 3, 1), (2, 1)),
        ),
    )
    for node in (1, 2):
        decision = may_stop(view, node)
        assert not decision.allowed
        assert "orders-1" in str(decision)
        assert "1 under-replicated" in str(decision)
    # a partition not replicated on the broker counts too: the roll must not go on
    other = ClusterView(frozenset({1, 2, 3, 4}), (part("t", 0, 1, (1, 2), (1,)),))
    assert not may_stop(other, 4).allowed


def test_the_lagging_broker_itself_may_stop() -> None:
    # stopping broker 3 cannot shrink an ISR it is not in: it may be restarted to recover
    view = ClusterView(frozenset({1, 2, 3}), (part("orders", 1, 2, (2, 3, 1), (2, 1)),))
    assert may_stop(view, 3).allowed
    # but not when another replica of the partition is behind as well
    worse = ClusterView(frozenset({1, 2, 3}), (part("orders", 1, 2, (2, 3, 1), (2,)),))
    assert not may_stop(worse, 3).allowed


def test_a_broker_that_is_not_live_may_stop() -> None:
    view = ClusterView(frozenset({1, 2}), (part("orders", 0, 1, (1, 2, 3), (1, 2)),))
    assert may_stop(view, 3).allowed


def test_a_restarted_broker_is_not_ready_until_back_in_every_isr() -> None:
    view = ClusterView(
        frozenset({1, 2, 3}),
        (
            part("orders", 0, 1, (1, 2, 3), (1, 2)),
            part("orders", 1, 2, (2, 3, 1), (2, 3, 1)),
        ),
    )
    decision = readiness(view, 3)
    assert not decision.allowed
    assert decision.reasons == ("not yet in the ISR of 1: orders-0",)
    caught_up = ClusterView(view.live_brokers, (part("orders", 0, 1, (1, 2, 3), (1, 2, 3)),))
    assert readiness(caught_up, 3).allowed


def test_a_broker_that_is_fenced_or_unregistered_is_not_ready() -> None:
    view = ClusterView(frozenset({1, 2}), ())
    decision = readiness(view, 3)
    assert not decision.allowed
    assert decision.reasons == ("broker 3 is not registered and unfenced",)


def test_a_partition_without_a_leader_does_not_hold_readiness_back() -> None:
    view = ClusterView(frozenset({3}), (part("t", 0, None, (1, 3), (1,)),))
    assert readiness(view, 3).allowed


def test_leaderships_and_long_lists_are_named_then_counted() -> None:
    assert [p.name for p in leaderships(HEALTHY, 3)] == ["__consumer_offsets-0"]
    assert leaderships(HEALTHY, 4) == []
    many = tuple(part("t", i, 1, (1, 2), (1,)) for i in range(NAMED_PARTITIONS + 2))
    decision = may_stop(ClusterView(frozenset({1, 2, 3}), many), 3)
    assert str(decision) == "7 under-replicated: t-0, t-1, t-2, t-3, t-4 and 2 more"


def test_highwater_rolling_builds_a_view_from_the_admin_clients_descriptions() -> None:
    topics = {
        "orders": TopicDescription(
            "orders",
            "id-1",
            False,
            (
                PartitionInfo(0, 1, 4, (1, 2), (1, 2)),
                PartitionInfo(1, None, 2, (2, 1), (2,)),
            ),
        ),
    }
    view = cluster_view([2, 1], topics)
    assert view.live_brokers == frozenset({1, 2})
    assert view.partitions == (
        part("orders", 0, 1, (1, 2), (1, 2)),
        part("orders", 1, None, (2, 1), (2,)),
    )
    assert [p.name for p in under_replicated(view)] == ["orders-1"]


def test_a_broker_decides_its_readiness_from_its_metadata_image() -> None:
    brokers = [RegisterBrokerRecord(b, f"i{b}", b) for b in (1, 2)]
    topic = [
        TopicRecord("orders", "t1"),
        PartitionRecord("t1", 0, (1, 2), (1, 2), 1),
        PartitionRecord("t1", 1, (2, 1), (2,), 2),  # 1 is not in this ISR yet
        PartitionRecord("t1", 2, (2,), (2,), 2),  # no replica on 1
    ]
    fenced = replay([*brokers, *topic], 10)
    assert "not registered and unfenced" in str(broker_readiness(fenced, 1))
    live = replay([UnfenceBrokerRecord(1, 1), UnfenceBrokerRecord(2, 2)], 11, image=fenced)
    decision = broker_readiness(live, 1)
    assert not decision.allowed and str(decision) == "not yet in the ISR of 1: orders-1"
    assert broker_readiness(live, 2).allowed
    caught_up = replay([PartitionRecord("t1", 1, (2, 1), (2, 1), 2, 1, 1)], 12, image=live)
    assert broker_readiness(caught_up, 1).allowed
