"""The Kafka listener answers as Apache Kafka's broker does where a request breaks one of
Kafka's rules: DeleteRecords on internal and compacted topics, CreateTopics and
CreatePartitions topic by topic, Alter/IncrementalAlterConfigs and DescribeConfigs
resource by resource, ListOffsets partition by partition, Metadata's set of topics, and
DescribeCluster's endpoint type. Raw frames (kafka-python's protocol classes), so each
field of the answer is seen as a client reads it."""

from __future__ import annotations

import itertools
import uuid
from typing import Any

import kafka.protocol.admin as admin
import kafka.protocol.consumer as consumer
import kafka.protocol.metadata as metadata
import pytest
from confluent_kafka import Producer
from kafka_servers import KafkaServer, connect, read_frame, request_frame, wait_for

pytestmark = pytest.mark.timeout(90)

NONE = 0
INVALID_TOPIC_EXCEPTION = 17
UNSUPPORTED_VERSION = 35
INVALID_PARTITIONS = 37
INVALID_REPLICATION_FACTOR = 38
INVALID_REPLICA_ASSIGNMENT = 39
INVALID_CONFIG = 40
INVALID_REQUEST = 42
POLICY_VIOLATION = 44
UNKNOWN_TOPIC_OR_PARTITION = 3
MISMATCHED_ENDPOINT_TYPE = 114
UNSUPPORTED_ENDPOINT_TYPE = 115

_correlation = itertools.count(1)

CT = admin.CreateTopicsRequest
Topic = CT.CreatableTopic


def call(server: KafkaServer, request: Any, version: int, response_type: Any) -> Any:
    """``request`` at ``version`` on a connection of its own; the decoded answer."""
    frame = request_frame(request, version, next(_correlation))
    with connect(server) as sock:
        sock.sendall(frame)
        body = read_frame(sock)
    # Response header: correlation id, then (flexible versions but ApiVersions) tags.
    flexible = response_type.flexible_version_q(version) and response_type.API_KEY != 18
    return response_type.decode(body[5:] if flexible else body[4:], version=version)


def create_topics(
    server: KafkaServer, *topics: Any, version: int = 7, validate_only: bool = False
) -> list[Any]:
    request = CT(topics=list(topics), timeout_ms=10000, validate_only=validate_only)
    return list(call(server, request, version, admin.CreateTopicsResponse).topics)


def topic(name: str, partitions: int = 1, factor: int = 1, **fields: Any) -> Any:
    return Topic(
        name=name,
        num_partitions=partitions,
        replication_factor=factor,
        assignments=fields.get("assignments", []),
        configs=[
            Topic.CreatableTopicConfig(name=k, value=v)
            for k, v in fields.get("configs", {}).items()
        ],
    )


def assigned(*partitions: tuple[int, list[int]]) -> list[Any]:
    return [
        Topic.CreatableReplicaAssignment(partition_index=p, broker_ids=brokers)
        for p, brokers in partitions
    ]


def metadata_of(server: KafkaServer, *names: str) -> Any:
    M = metadata.MetadataRequest
    request = M(
        topics=[M.MetadataRequestTopic(name=n, topic_id=uuid.UUID(int=0)) for n in names],
        allow_auto_topic_creation=False,
    )
    return call(server, request, 12, metadata.MetadataResponse)


def led(server: KafkaServer, name: str, partitions: int = 1) -> bool:
    found = metadata_of(server, name).topics[0]
    return (
        found.error_code == NONE
        and len(found.partitions) == partitions
        and all(p.leader_id >= 0 for p in found.partitions)
    )


def new_topic(server: KafkaServer, name: str, partitions: int = 1, **configs: str) -> None:
    configs = {k.replace("_", "."): v for k, v in configs.items()}
    [result] = create_topics(server, topic(name, partitions, configs=configs))
    assert result.error_code == NONE, result
    wait_for(lambda: led(server, name, partitions))


# --- DeleteRecords -----------------------------------------------------------------------


def delete_records(server: KafkaServer, name: str, partition: int, offset: int) -> Any:
    R = admin.DeleteRecordsRequest
    T = R.DeleteRecordsTopic
    request = R(
        topics=[
            T(
                name=name,
                partitions=[T.DeleteRecordsPartition(partition_index=partition, offset=offset)],
            )
        ],
        timeout_ms=10000,
    )
    answer = call(server, request, 2, admin.DeleteRecordsResponse)
    return answer.topics[0].partitions[0]


def test_delete_records_leaves_internal_and_compacted_topics_alone(server: KafkaServer) -> None:
    """Kafka's ``ReplicaManager.deleteRecordsOnLocalLog`` refuses an internal topic
    (the groups' committed offsets live in ``__consumer_offsets``), and
    ``Partition.deleteRecordsOnLeader`` a topic whose cleanup.policy has no 'delete'."""
    new_topic(server, "compacted-records", cleanup_policy="compact")
    producer = Producer({"bootstrap.servers": server.bootstrap})
    for i in range(5):
        producer.produce("compacted-records", key=b"k%d" % i, value=b"v")
    assert producer.flush(30) == 0

    compacted = delete_records(server, "compacted-records", 0, 3)
    assert (compacted.error_code, compacted.low_watermark) == (POLICY_VIOLATION, -1)

    F = metadata.FindCoordinatorRequest
    call(server, F(key="records-group", key_type=0), 1, metadata.FindCoordinatorResponse)
    wait_for(lambda: led(server, "__consumer_offsets", 50))
    internal = delete_records(server, "__consumer_offsets", 0, -1)
    assert (internal.error_code, internal.low_watermark) == (INVALID_TOPIC_EXCEPTION, -1)

    # A delete-policy topic still moves its log start.
    new_topic(server, "deletable-records")
    producer.produce("deletable-records", value=b"v")
    producer.produce("deletable-records", value=b"v")
    assert producer.flush(30) == 0
    moved = delete_records(server, "deletable-records", 0, 1)
    assert (moved.error_code, moved.low_watermark) == (NONE, 1)


# --- CreateTopics ------------------------------------------------------------------------


def test_create_topics_answers_the_new_topics_configs_never_null(server: KafkaServer) -> None:
    """Kafka's Java AdminClient reads a created topic's configs (v5+) without a null
    check; Kafka answers the topic's effective configs."""
    [created] = create_topics(server, topic("configs-answered", configs={"retention.ms": "5000"}))
    assert created.error_code == NONE and created.topic_config_error_code == NONE
    configs = {c.name: c for c in created.configs}
    assert configs["retention.ms"].value == "5000"
    assert configs["retention.ms"].config_source == 1  # DYNAMIC_TOPIC_CONFIG
    assert configs["cleanup.policy"].value == "delete"
    [checked] = create_topics(server, topic("configs-validated"), validate_only=True)
    assert checked.error_code == NONE and checked.configs is not None


def test_create_topics_refuses_bad_counts_and_null_config_values(server: KafkaServer) -> None:
    answers = create_topics(
        server,
        topic("negative-partitions", partitions=-5),
        topic("negative-factor", factor=-2),
        topic("null-config", configs={"retention.ms": None}),
    )
    by_name = {t.name: t for t in answers}  # (clients match answers by name)
    assert {name: t.error_code for name, t in by_name.items()} == {
        "negative-partitions": INVALID_PARTITIONS,
        "negative-factor": INVALID_REPLICATION_FACTOR,
        "null-config": INVALID_CONFIG,
    }
    assert (
        by_name["null-config"].error_message
        == "Null value not supported for topic configs: retention.ms"
    )
    assert not any(led(server, t.name) for t in answers)


def test_a_misnumbered_assignment_refuses_its_topic_alone(server: KafkaServer) -> None:
    """Kafka's ``ReplicationControlManager.createTopic``: INVALID_REPLICA_ASSIGNMENT for
    that topic, with its message; the request's other topics are created."""
    answers = {
        t.name: t
        for t in create_topics(
            server,
            topic("from-one", -1, -1, assignments=assigned((1, [1]))),
            topic("twice", -1, -1, assignments=assigned((0, [1]), (0, [1]))),
            topic("alongside"),
        )
    }
    assert answers["from-one"].error_code == INVALID_REPLICA_ASSIGNMENT
    assert "consecutive 0-based" in answers["from-one"].error_message
    assert answers["twice"].error_code == INVALID_REPLICA_ASSIGNMENT
    assert "multiple manual partition assignments" in answers["twice"].error_message
    assert answers["alongside"].error_code == NONE
    wait_for(lambda: led(server, "alongside"))


def test_a_name_given_three_times_is_answered_once(server: KafkaServer) -> None:
    answers = create_topics(server, *[topic("thrice")] * 3)
    assert [(t.name, t.error_code, t.error_message) for t in answers] == [
        ("thrice", INVALID_REQUEST, "Duplicate topic name.")
    ]


# --- CreatePartitions --------------------------------------------------------------------


def create_partitions(
    server: KafkaServer, *topics: Any, validate_only: bool = False
) -> dict[str, Any]:
    R = admin.CreatePartitionsRequest
    request = R(topics=list(topics), timeout_ms=10000, validate_only=validate_only)
    answer = call(server, request, 3, admin.CreatePartitionsResponse)
    return {t.name: t for t in answer.results}


def grow(name: str, count: int, assignments: list[list[int]] | None = None) -> Any:
    P = admin.CreatePartitionsRequest.CreatePartitionsTopic
    return P(
        name=name,
        count=count,
        assignments=None
        if assignments is None
        else [P.CreatePartitionsAssignment(broker_ids=b) for b in assignments],
    )


def test_create_partitions_answers_each_topic_on_its_own(server: KafkaServer) -> None:
    """Kafka's ``ReplicationControlManager.createPartitions``: each topic's own error."""
    new_topic(server, "grow-a", 2)
    new_topic(server, "grow-b", 2)
    answers = create_partitions(
        server,
        grow("grow-a", 4, [[1]]),  # one assignment for two new partitions
        grow("grow-missing", 2, [[1]]),
        grow("grow-b", 3),
    )
    assert answers["grow-a"].error_code == INVALID_REPLICA_ASSIGNMENT
    assert "only 1 assignment" in answers["grow-a"].error_message
    assert answers["grow-missing"].error_code == UNKNOWN_TOPIC_OR_PARTITION
    assert answers["grow-b"].error_code == NONE
    wait_for(lambda: led(server, "grow-b", 3))

    shrink = create_partitions(server, grow("grow-a", 1, [[1]]))["grow-a"]
    assert shrink.error_code == INVALID_PARTITIONS
    # An empty list is zero assignments, not none (a null list is the broker's choice).
    empty = create_partitions(server, grow("grow-a", 3, []), validate_only=True)["grow-a"]
    assert empty.error_code == INVALID_REPLICA_ASSIGNMENT
    assert "only 0 assignment" in empty.error_message
    placed = create_partitions(server, grow("grow-a", 3, [[1]]))["grow-a"]
    assert placed.error_code == NONE
    wait_for(lambda: led(server, "grow-a", 3))


# --- configs -----------------------------------------------------------------------------


def incremental_alter(
    server: KafkaServer, *resources: tuple[int, str, list[tuple[str, int, str | None]]]
) -> list[Any]:
    R = admin.IncrementalAlterConfigsRequest
    Res = R.AlterConfigsResource
    request = R(
        resources=[
            Res(
                resource_type=kind,
                resource_name=name,
                configs=[
                    Res.AlterableConfig(name=k, config_operation=op, value=v)
                    for k, op, v in changes
                ],
            )
            for kind, name, changes in resources
        ],
        validate_only=False,
    )
    answer = call(server, request, 1, admin.IncrementalAlterConfigsResponse)
    return [
        (r.resource_type, r.resource_name, r.error_code, r.error_message) for r in answer.responses
    ]


def describe_configs(
    server: KafkaServer, *resources: tuple[int, str, list[str] | None]
) -> list[Any]:
    R = admin.DescribeConfigsRequest
    request = R(
        resources=[
            R.DescribeConfigsResource(resource_type=k, resource_name=n, configuration_keys=keys)
            for k, n, keys in resources
        ],
        include_synonyms=False,
        include_documentation=False,
    )
    return list(call(server, request, 4, admin.DescribeConfigsResponse).results)


def topic_config(server: KafkaServer, name: str, key: str) -> str | None:
    [result] = describe_configs(server, (2, name, [key]))
    return {c.name: c.value for c in result.configs}.get(key)


TOPIC, BROKER, BROKER_LOGGER = 2, 4, 8
SET, DELETE = 0, 1


def test_alter_configs_answers_each_resource_on_its_own(server: KafkaServer) -> None:
    """Kafka's ``ConfigAdminManager.preprocess``: a resource named twice is refused at
    both entries; a resource type it does not know is refused alone, the rest applied."""
    new_topic(server, "configured")
    twice = incremental_alter(
        server,
        (TOPIC, "configured", [("retention.ms", SET, "1000")]),
        (TOPIC, "configured", [("retention.bytes", SET, "1000")]),
    )
    message = "Each resource must appear at most once."
    assert twice == [(TOPIC, "configured", INVALID_REQUEST, message)] * 2
    assert topic_config(server, "configured", "retention.ms") == "604800000"

    mixed = incremental_alter(
        server,
        (99, "x", [("a", SET, "b")]),
        (BROKER_LOGGER, "1", [("root", SET, "INFO")]),
        (TOPIC, "configured", [("retention.ms", SET, "2000")]),
    )
    assert mixed == [
        (99, "x", INVALID_REQUEST, "Unknown resource type 99"),
        (BROKER_LOGGER, "1", INVALID_REQUEST, "Unknown resource type 8"),
        (TOPIC, "configured", NONE, None),
    ]
    assert topic_config(server, "configured", "retention.ms") == "2000"

    # Removing an override no config has is nothing to do, not an error.
    gone = incremental_alter(server, (TOPIC, "configured", [("no.such.key", DELETE, None)]))
    assert gone == [(TOPIC, "configured", NONE, None)]


def test_describe_configs_answers_each_resource_on_its_own(server: KafkaServer) -> None:
    """Kafka's ``ConfigHelper.describeConfigs``: a broker describes itself (or the
    cluster default), a topic resource must be a legal name; an unknown type is
    refused alone."""
    new_topic(server, "described")
    results = describe_configs(
        server,
        (BROKER, "7", None),
        (TOPIC, "bad name!", None),
        (BROKER_LOGGER, "1", None),
        (TOPIC, "described", ["retention.ms"]),
        (BROKER, "1", ["log.retention.ms"]),
    )
    assert [(r.resource_type, r.resource_name, r.error_code) for r in results] == [
        (BROKER, "7", INVALID_REQUEST),
        (TOPIC, "bad name!", INVALID_TOPIC_EXCEPTION),
        (BROKER_LOGGER, "1", INVALID_REQUEST),
        (TOPIC, "described", NONE),
        (BROKER, "1", NONE),
    ]
    assert results[0].error_message.startswith("Unexpected broker id, expected 1")
    assert [c.name for c in results[3].configs] == ["retention.ms"]


# --- ListOffsets, Metadata, DescribeCluster ---------------------------------------------


def list_offsets(
    server: KafkaServer, name: str, timestamps: list[int], version: int = 7
) -> list[tuple[int, int]]:
    R = consumer.ListOffsetsRequest
    T = R.ListOffsetsTopic
    request = R(
        replica_id=-1,
        isolation_level=0,
        topics=[
            T(
                name=name,
                partitions=[
                    T.ListOffsetsPartition(partition_index=0, current_leader_epoch=-1, timestamp=t)
                    for t in timestamps
                ],
            )
        ],
    )
    answer = call(server, request, version, consumer.ListOffsetsResponse)
    return [(p.error_code, p.offset) for t in answer.topics for p in t.partitions]


def test_list_offsets_refuses_repeated_partitions_and_timestamps_of_later_versions(
    server: KafkaServer,
) -> None:
    """Kafka's ``handleListOffsetRequestV1AndAbove``: a partition asked twice is
    INVALID_REQUEST; a special timestamp its version does not have, or no special one,
    UNSUPPORTED_VERSION (MAX_TIMESTAMP -3 came with v7)."""
    new_topic(server, "listed")
    producer = Producer({"bootstrap.servers": server.bootstrap})
    producer.produce("listed", value=b"v", partition=0)
    assert producer.flush(30) == 0
    assert list_offsets(server, "listed", [-1, -2]) == [(INVALID_REQUEST, -1)] * 2
    assert list_offsets(server, "listed", [-3], version=5) == [(UNSUPPORTED_VERSION, -1)]
    assert list_offsets(server, "listed", [-7]) == [(UNSUPPORTED_VERSION, -1)]
    assert list_offsets(server, "listed", [-3]) == [(NONE, 0)]
    assert list_offsets(server, "listed", [-1]) == [(NONE, 1)]


def test_metadata_answers_each_topic_once(server: KafkaServer) -> None:
    """Kafka reads Metadata's topics as a set."""
    new_topic(server, "named-twice")
    answer = metadata_of(server, "named-twice", "named-twice", "never-made", "never-made")
    assert [(t.name, t.error_code) for t in answer.topics] == [
        ("named-twice", NONE),
        ("never-made", UNKNOWN_TOPIC_OR_PARTITION),
    ]
    topic_id = answer.topics[0].topic_id
    M = metadata.MetadataRequest
    by_id = M(
        topics=[M.MetadataRequestTopic(name=None, topic_id=topic_id)] * 2,
        allow_auto_topic_creation=False,
    )
    assert [t.name for t in call(server, by_id, 12, metadata.MetadataResponse).topics] == [
        "named-twice"
    ]


@pytest.mark.parametrize(
    ("endpoint_type", "error"),
    [(1, NONE), (2, MISMATCHED_ENDPOINT_TYPE), (9, UNSUPPORTED_ENDPOINT_TYPE)],
)
def test_describe_cluster_answers_only_for_brokers(
    server: KafkaServer, endpoint_type: int, error: int
) -> None:
    """KIP-919: a broker's listener answers for the brokers (endpoint type 1); the
    controllers' type is a mismatch, another an unsupported type (Kafka's
    ``AuthHelper.computeDescribeClusterResponse``)."""
    R = admin.DescribeClusterRequest
    request = R(include_cluster_authorized_operations=False, endpoint_type=endpoint_type)
    answer = call(server, request, 1, admin.DescribeClusterResponse)
    assert answer.error_code == error
    assert bool(answer.brokers) == (error == NONE)
