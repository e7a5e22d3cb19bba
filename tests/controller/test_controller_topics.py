"""Topics: creation and its validation, placement, deletion, growing partitions."""

from __future__ import annotations

import pytest
from controller_helpers import NONE, Harness, check_invariants
from highwater.controller import ControllerConfig, ControllerResult
from highwater.controller_api.messages import (
    CreatableTopic,
    CreatePartitionsRequest,
    CreatePartitionsTopic,
    CreateTopicsRequest,
    CreateTopicsResponse,
    DeleteTopicsRequest,
)
from highwater.metadata import (
    ConfigRecord,
    ConfigResourceType,
    PartitionRecord,
    RemoveTopicRecord,
    TopicRecord,
)
from highwater.v1.common_pb2 import ErrorCode
from replica_balance import replica_balance


@pytest.fixture
def h() -> Harness:
    harness = Harness()
    harness.start_brokers(range(6), racks={b: f"rack-{b % 3}" for b in range(6)})
    return harness


def create(
    h: Harness, *topics: CreatableTopic, validate_only: bool = False
) -> ControllerResult[CreateTopicsResponse]:
    return h.controller.create_topics(CreateTopicsRequest(topics, validate_only))


def test_a_topic_is_its_records(h: Harness) -> None:
    result = create(h, CreatableTopic("orders", 3, 2, configs={"retention.ms": "1000"}))
    topic_result = result.response.topics[0]
    assert topic_result.error == NONE
    assert (topic_result.num_partitions, topic_result.replication_factor) == (3, 2)
    records = result.records
    assert records[0] == TopicRecord("orders", topic_result.topic_id)
    assert records[1] == ConfigRecord(ConfigResourceType.TOPIC, "orders", "retention.ms", "1000")
    partitions = [r for r in records if isinstance(r, PartitionRecord)]
    assert [p.partition_id for p in partitions] == [0, 1, 2]
    for p in partitions:
        assert len(p.replicas) == 2 and p.isr == p.replicas and p.leader == p.replicas[0]
        assert (p.leader_epoch, p.partition_epoch) == (0, 0)
        assert len({h.broker(b).rack for b in p.replicas}) == 2
    h.commit(result)
    assert h.image.topic_config("orders") == {"retention.ms": "1000"}
    assert len(topic_result.topic_id) == 22 and not topic_result.topic_id.startswith("-")
    check_invariants(h.image)


def test_placement_balances_replicas_and_leaders_within_one(h: Harness) -> None:
    for partitions, factor in [(1, 1), (4, 3), (6, 3), (7, 2), (13, 3), (20, 6)]:
        name = f"t-{partitions}-{factor}"
        h.create_topic(name, partitions, factor)
        topic = h.image.topic(name)
        assert topic is not None
        assignment = [p.replicas for p in topic.partitions.registrations()]
        assert replica_balance(assignment, range(6)) <= (1, 1), (name, assignment)
        for replicas in assignment:
            racks = {h.broker(b).rack for b in replicas}
            assert len(racks) == min(factor, 3), replicas


def test_placement_is_deterministic_given_the_seed() -> None:
    def assignment(seed: int) -> list[tuple[int, ...]]:
        harness = Harness(seed=seed)
        harness.start_brokers(range(5))
        harness.create_topic("t", 10, 3)
        return [harness.partition("t", p).replicas for p in range(10)]

    assert assignment(7) == assignment(7)
    assert any(assignment(7) != assignment(seed) for seed in range(8, 12))


@pytest.mark.parametrize(
    ("topic", "code", "message"),
    [
        (CreatableTopic("bad name!", 1, 1), ErrorCode.INVALID_TOPIC_EXCEPTION, "illegal"),
        (CreatableTopic("", 1, 1), ErrorCode.INVALID_TOPIC_EXCEPTION, "empty"),
        (CreatableTopic("x" * 250, 1, 1), ErrorCode.INVALID_TOPIC_EXCEPTION, "longer"),
        (CreatableTopic("__cluster_metadata", 1, 1), ErrorCode.INVALID_REQUEST, "prohibited"),
        (CreatableTopic("t", 0, 1), ErrorCode.INVALID_PARTITIONS, "non-positive"),
        (CreatableTopic("t", -5, 1), ErrorCode.INVALID_PARTITIONS, "non-positive"),
        (CreatableTopic("t", 1, 0), ErrorCode.INVALID_REPLICATION_FACTOR, "larger than 0"),
        (CreatableTopic("t", 1, 7), ErrorCode.INVALID_REPLICATION_FACTOR, "only 6 broker"),
        (
            CreatableTopic("t", 1, 1, configs={"retention.ms": "soon"}),
            ErrorCode.INVALID_CONFIG,
            "retention.ms",
        ),
        (
            CreatableTopic("t", 1, 1, configs={"retention.msec": "1"}),
            ErrorCode.INVALID_CONFIG,
            "retention.msec",
        ),
        (
            CreatableTopic("t", 1, 1, configs={"min.insync.replicas": "0"}),
            ErrorCode.INVALID_CONFIG,
            "min.insync.replicas",
        ),
        (CreatableTopic("t", 2, 1, ((1,),)), ErrorCode.INVALID_REQUEST, "Both"),
        (CreatableTopic("t", assignments=((1, 1),)), ErrorCode.INVALID_REPLICA_ASSIGNMENT, "twice"),
        (
            CreatableTopic("t", assignments=((1,), ())),
            ErrorCode.INVALID_REPLICA_ASSIGNMENT,
            "empty",
        ),
        (
            CreatableTopic("t", assignments=((1, 2), (3,))),
            ErrorCode.INVALID_REPLICA_ASSIGNMENT,
            "same number",
        ),
        (
            CreatableTopic("t", assignments=((1, 42),)),
            ErrorCode.INVALID_REPLICA_ASSIGNMENT,
            "broker 42",
        ),
    ],
)
def test_bad_topics_are_refused_with_no_records(
    h: Harness, topic: CreatableTopic, code: int, message: str
) -> None:
    result = create(h, topic)
    assert result.records == []
    assert result.response.topics[0].error == code
    assert message in result.response.topics[0].error_message


def test_replication_factor_counts_only_active_brokers(h: Harness) -> None:
    h.heartbeat(5, want_fence=True)
    h.heartbeat(4, want_shutdown=True)
    result = create(h, CreatableTopic("t", 1, 5))
    assert result.response.topics[0].error == ErrorCode.INVALID_REPLICATION_FACTOR
    ok = create(h, CreatableTopic("t", 2, 4))
    assert ok.response.topics[0].error == NONE
    assert all(
        set(r.replicas) <= {0, 1, 2, 3} for r in ok.records if isinstance(r, PartitionRecord)
    )


def test_a_topic_that_exists_or_collides_is_refused(h: Harness) -> None:
    h.create_topic("orders.eu", 1, 1)
    again = create(h, CreatableTopic("orders.eu", 1, 1))
    assert again.response.topics[0].error == ErrorCode.TOPIC_ALREADY_EXISTS
    collide = create(h, CreatableTopic("orders_eu", 1, 1))
    assert collide.response.topics[0].error == ErrorCode.INVALID_TOPIC_EXCEPTION
    assert "collides" in collide.response.topics[0].error_message


def test_each_topic_of_a_request_succeeds_or_fails_alone(h: Harness) -> None:
    result = create(
        h,
        CreatableTopic("good", 2, 2),
        CreatableTopic("bad", 1, 9),
        CreatableTopic("twice", 1, 1),
        CreatableTopic("twice", 1, 1),
        CreatableTopic("good2", 1, 1),
    )
    errors = [(t.name, t.error) for t in result.response.topics]
    assert errors == [
        ("good", NONE),
        ("bad", ErrorCode.INVALID_REPLICATION_FACTOR),
        ("twice", ErrorCode.INVALID_REQUEST),  # once for the name (Kafka's)
        ("good2", NONE),
    ]
    names = [r.name for r in result.records if isinstance(r, TopicRecord)]
    assert names == ["good", "good2"]
    h.commit(result)
    assert h.image.topic("bad") is None and h.image.topic("twice") is None


def test_validate_only_writes_nothing(h: Harness) -> None:
    result = create(h, CreatableTopic("t", 3, 3), validate_only=True)
    assert result.records == []
    assert result.response.topics[0].error == NONE
    assert result.response.topics[0].num_partitions == 3


def test_defaults_apply_when_counts_are_minus_one() -> None:
    harness = Harness(ControllerConfig(num_partitions=4, default_replication_factor=2))
    harness.start_brokers([1, 2])
    result = harness.create_topic("t", -1, -1).topics[0]
    assert (result.num_partitions, result.replication_factor) == (4, 2)


def test_manual_assignments_skip_inactive_brokers_in_the_isr(h: Harness) -> None:
    h.heartbeat(2, want_fence=True)
    result = create(h, CreatableTopic("t", assignments=((2, 3), (4, 5))))
    assert result.response.topics[0].error == NONE
    partitions = [r for r in result.records if isinstance(r, PartitionRecord)]
    assert partitions[0].replicas == (2, 3) and partitions[0].isr == (3,)
    assert partitions[0].leader == 3
    assert partitions[1].leader == 4
    h.heartbeat(3, want_fence=True)
    dead = create(h, CreatableTopic("u", assignments=((2, 3),)))
    assert dead.response.topics[0].error == ErrorCode.INVALID_REPLICA_ASSIGNMENT
    assert "fenced" in dead.response.topics[0].error_message


def test_deleting_topics(h: Harness) -> None:
    h.create_topic("a", 2, 2, {"retention.ms": "5"})
    h.create_topic("b", 1, 1)
    topic_id = h.topic_id("b")
    result = h.controller.delete_topics(DeleteTopicsRequest(("a", "missing"), (topic_id, "nope")))
    assert [(t.name, t.error) for t in result.response.topics] == [
        ("a", NONE),
        ("missing", ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
        ("b", NONE),
        ("", ErrorCode.UNKNOWN_TOPIC_ID),  # asked by id, as Kafka's controller answers
    ]
    assert result.records == [RemoveTopicRecord(h.topic_id("a")), RemoveTopicRecord(topic_id)]
    h.commit(result)
    assert not h.image.topics.by_name
    assert h.image.topic_config("a") == {}
    assert h.image.partition_count == 0
    # The name is free again, with a new id.
    h.create_topic("b", 1, 1)
    assert h.topic_id("b") != topic_id


def test_growing_a_topic(h: Harness) -> None:
    h.create_topic("t", 3, 2)
    before = [h.partition("t", p) for p in range(3)]
    result = h.controller.create_partitions(
        CreatePartitionsRequest((CreatePartitionsTopic("t", 9),))
    )
    assert result.response.topics[0].error == NONE
    assert [r.partition_id for r in result.records if isinstance(r, PartitionRecord)] == list(
        range(3, 9)
    )
    h.commit(result)
    assert [h.partition("t", p) for p in range(3)] == before  # untouched
    assignment = [h.partition("t", p).replicas for p in range(9)]
    assert all(len(r) == 2 for r in assignment)
    assert replica_balance(assignment, range(6)) <= (1, 1)
    check_invariants(h.image)


@pytest.mark.parametrize(
    ("topic", "code", "message"),
    [
        (CreatePartitionsTopic("t", 2), ErrorCode.INVALID_PARTITIONS, "not be an increase"),
        (CreatePartitionsTopic("t", 3), ErrorCode.INVALID_PARTITIONS, "already has 3"),
        (CreatePartitionsTopic("nope", 5), ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "No topic"),
        (CreatePartitionsTopic("t", 5, ((1, 2),)), ErrorCode.INVALID_REPLICA_ASSIGNMENT, "only 1"),
        (
            CreatePartitionsTopic("t", 4, ((1, 2, 3),)),
            ErrorCode.INVALID_REPLICA_ASSIGNMENT,
            "replica(s) per partition",
        ),
    ],
)
def test_bad_partition_growth_is_refused(
    h: Harness, topic: CreatePartitionsTopic, code: int, message: str
) -> None:
    h.create_topic("t", 3, 2)
    result = h.controller.create_partitions(CreatePartitionsRequest((topic,)))
    assert result.records == []
    assert result.response.topics[0].error == code
    assert message in result.response.topics[0].error_message


def test_growing_with_manual_assignments_and_validate_only(h: Harness) -> None:
    h.create_topic("t", 1, 2)
    check = h.controller.create_partitions(
        CreatePartitionsRequest((CreatePartitionsTopic("t", 2, ((4, 5),)),), validate_only=True)
    )
    assert check.records == [] and check.response.topics[0].error == NONE
    h.commit(
        h.controller.create_partitions(
            CreatePartitionsRequest((CreatePartitionsTopic("t", 2, ((4, 5),)),))
        )
    )
    assert h.partition("t", 1).replicas == (4, 5)


def test_a_name_given_more_than_once_is_answered_once(h: Harness) -> None:
    """Kafka's ``ControllerApis``: one INVALID_REQUEST "Duplicate topic name." per name,
    for CreateTopics and CreatePartitions alike, and nothing of it done."""
    result = create(h, *[CreatableTopic("thrice", 1, 1)] * 3, CreatableTopic("once", 1, 1))
    assert [(t.name, t.error, t.error_message) for t in result.response.topics] == [
        ("thrice", ErrorCode.INVALID_REQUEST, "Duplicate topic name."),
        ("once", NONE, ""),
    ]
    h.commit(result)
    grow = h.controller.create_partitions(
        CreatePartitionsRequest((CreatePartitionsTopic("once", 2),) * 2)
    )
    assert [(t.name, t.error, t.error_message) for t in grow.response.topics] == [
        ("once", ErrorCode.INVALID_REQUEST, "Duplicate topic name.")
    ]
    assert grow.records == []


def test_a_config_without_a_value_is_refused(h: Harness) -> None:
    """Kafka's ``ReplicationControlManager``: INVALID_CONFIG, not the default."""
    result = create(h, CreatableTopic("t", 1, 1, configs={"retention.ms": None}))
    assert result.records == []
    assert result.response.topics[0].error == ErrorCode.INVALID_CONFIG
    assert result.response.topics[0].error_message == (
        "Null value not supported for topic configs: retention.ms"
    )
