"""The etcd key layout: an image to keys and back, impossible keys refused naming the key, the
``etcd://`` address, and a pushed image fenced by the controller epoch (all pure)."""

from __future__ import annotations

import json

import pytest
from highwater.errors import InvalidConfigError
from highwater.etcd_metadata.endpoints import parse_metadata_store
from highwater.etcd_metadata.keys import (
    InconsistentMetadataError,
    KeyChanges,
    KeySpace,
    changed_keys,
    image_from_keys,
    image_keys,
    partition_state_value,
)
from highwater.etcd_metadata.pushed import PushedMetadata
from highwater.metadata.delta import MetadataDelta
from highwater.metadata.image import MetadataImage
from highwater.metadata.records import (
    AccessControlEntryRecord,
    BrokerEndpoint,
    BrokerRegistrationChangeRecord,
    ConfigRecord,
    ConfigResourceType,
    CoordinatorAssignmentRecord,
    FenceBrokerRecord,
    MetadataRecord,
    NoOpRecord,
    PartitionChangeRecord,
    PartitionRecord,
    ProducerIdsRecord,
    RegisterBrokerRecord,
    RegisterCoordinatorRecord,
    RemoveTopicRecord,
    TopicRecord,
    encode_record,
)
from highwater.metadata.snapshot import load_snapshot, snapshot_records, snapshot_values
from highwater.v1.common_pb2 import ErrorCode

SPACE = KeySpace("/highwater/test/")


def image_of(records: list[MetadataRecord], offset: int = 20) -> MetadataImage:
    return load_snapshot(records, offset, 1)


def cluster_records() -> list[MetadataRecord]:
    brokers: list[MetadataRecord] = [
        RegisterBrokerRecord(
            b,
            f"inc-{b}",
            b + 10,
            (BrokerEndpoint("PLAINTEXT", "127.0.0.1", 9090 + b),),
            fenced=b == 3,
        )
        for b in (1, 2, 3)
    ]
    return [
        *brokers,
        TopicRecord("orders", "AAAAAAAAAAAAAAAAAAAAAA"),
        ConfigRecord(ConfigResourceType.TOPIC, "orders", "retention.ms", "1000"),
        PartitionRecord("AAAAAAAAAAAAAAAAAAAAAA", 0, (1, 2, 3), (1, 2), 1, 4, 7),
        PartitionRecord("AAAAAAAAAAAAAAAAAAAAAA", 1, (2, 3, 1), (2, 3, 1), 2, 0, 0),
        ConfigRecord(ConfigResourceType.BROKER, "", "log.retention.ms", "5000"),
        ProducerIdsRecord(1, 11, 2000),
    ]


def test_an_image_survives_the_trip_through_the_keys() -> None:
    image = image_of(cluster_records())
    keys = image_keys(image, SPACE)
    assert json.loads(keys["/highwater/test/brokers/topics/orders"]) == {
        "topic_id": "AAAAAAAAAAAAAAAAAAAAAA",
        "partitions": {"0": [1, 2, 3], "1": [2, 3, 1]},
    }
    state = json.loads(keys["/highwater/test/brokers/topics/orders/partitions/0/state"])
    assert (state["leader"], state["isr"], state["leader_epoch"], state["partition_epoch"]) == (
        1,
        [1, 2],
        4,
        7,
    )
    assert json.loads(keys["/highwater/test/config/brokers/<default>"]) == {
        "log.retention.ms": "5000"
    }
    # As written (stamped with the writer's controller epoch) and read back.
    written = {
        k: partition_state_value(v, 3) if k.endswith("/state") else v for k, v in keys.items()
    }
    again = image_from_keys(written, SPACE, 20)
    assert list(snapshot_records(again)) == list(snapshot_records(image))
    assert again.offset == 20
    assert image_keys(again, SPACE) == keys


def test_a_partitions_eligible_leader_replicas_survive_the_trip_through_the_keys() -> None:
    """The ELR (KIP-966), which the controller's decisions keep, is in the state key: a
    controller that reads etcd again (a failover) may still elect a replica that left the
    ISR below min.insync.replicas holding every committed record, as the one before it."""
    records = cluster_records()
    records[5] = PartitionRecord(ORDERS, 0, (1, 2, 3), (1,), 1, 4, 7, (), (), (2,), (3,))
    image = image_of(records)
    keys = image_keys(image, SPACE)
    written = {
        k: partition_state_value(v, 3) if k.endswith("/state") else v for k, v in keys.items()
    }
    again = image_from_keys(written, SPACE, 20)
    partition = again.topics.by_name["orders"].partitions[0]
    assert (partition.elr, partition.last_known_elr) == ((2,), (3,))
    assert list(snapshot_records(again)) == list(snapshot_records(image))
    # An ELR change alone (the partition epoch with it) is a change of the state key.
    change = [PartitionChangeRecord(ORDERS, 0, eligible_leader_replicas=(2, 3))]
    after = MetadataDelta(image).replay_all(change).apply(image.offset + 1, 1)
    updated = changed_keys(image, after, change, SPACE).updated
    assert json.loads(updated[SPACE.partition_state("orders", 0)])["elr"] == [2, 3]


ORDERS = "AAAAAAAAAAAAAAAAAAAAAA"
CHANGES: list[list[MetadataRecord]] = [
    [PartitionChangeRecord(ORDERS, 1, leader=3, isr=(3, 1))],
    [PartitionChangeRecord(ORDERS, 0, replicas=(1, 2, 3, 4), adding_replicas=(4,))],
    [FenceBrokerRecord(2, 12), BrokerRegistrationChangeRecord(1, 11, in_controlled_shutdown=True)],
    [
        TopicRecord("events", "BBBBBBBBBBBBBBBBBBBBBB"),
        PartitionRecord("BBBBBBBBBBBBBBBBBBBBBB", 0, (2, 1), (2, 1), 2),
        ConfigRecord(ConfigResourceType.TOPIC, "events", "cleanup.policy", "compact"),
    ],
    [PartitionRecord(ORDERS, 2, (3, 1, 2), (3, 1, 2), 3)],
    [RemoveTopicRecord(ORDERS)],
    [
        ConfigRecord(ConfigResourceType.BROKER, "", "log.retention.ms", None),
        ConfigRecord(ConfigResourceType.BROKER, "2", "log.retention.ms", "10"),
    ],
    [
        ProducerIdsRecord(1, 11, 3000),
        RegisterCoordinatorRecord(7, "inc-7", 21),
        CoordinatorAssignmentRecord(0, 7, 21),
        AccessControlEntryRecord("acl-1", 2, "orders", 3, "User:alice", "*", 3, 3),
    ],
    [NoOpRecord()],
]


@pytest.mark.parametrize("records", CHANGES, ids=lambda r: type(r[0]).__name__)
def test_the_keys_a_change_touches_are_the_keys_that_differ(
    records: list[MetadataRecord],
) -> None:
    parent = image_of(cluster_records())
    image = MetadataDelta(parent).replay_all(records).apply(parent.offset + len(records), 1)
    before, after = image_keys(parent, SPACE), image_keys(image, SPACE)
    expected = KeyChanges(
        {k: v for k, v in after.items() if k in before and before[k] != v},
        {k: v for k, v in after.items() if k not in before},
        frozenset(before.keys() - after.keys()),
    )
    assert changed_keys(parent, image, records, SPACE) == expected
    assert len(expected) > 0 or records == [NoOpRecord()]


def test_one_partition_change_encodes_one_key_however_large_the_cluster() -> None:
    topics = [TopicRecord(f"t{t}", f"{t:022d}") for t in range(20)]
    partitions = [
        PartitionRecord(f"{t:022d}", p, (1, 2, 3), (1, 2, 3), 1)
        for t in range(20)
        for p in range(50)
    ]
    parent = image_of([*cluster_records()[:3], *topics, *partitions])
    move = [PartitionChangeRecord(f"{7:022d}", 9, leader=2)]
    image = MetadataDelta(parent).replay_all(move).apply(parent.offset + 1, 1)
    changes = changed_keys(parent, image, move, SPACE)
    assert list(changes.updated) == [SPACE.partition_state("t7", 9)]
    assert json.loads(changes.updated[SPACE.partition_state("t7", 9)])["leader"] == 2
    assert not changes.created and not changes.deleted


def test_partitions_read_in_columns_around_a_reassignment_make_the_same_image() -> None:
    topic = "CCCCCCCCCCCCCCCCCCCCCC"
    records = [
        *cluster_records()[:3],
        TopicRecord("wide", topic),
        *(PartitionRecord(topic, p, (1, 2, 3), (1, 2), 1, p, p) for p in range(3)),
        PartitionRecord(topic, 3, (1, 2, 3), (1, 2, 3), 2, adding_replicas=(3,)),
        *(PartitionRecord(topic, p, (3, 1), (3, 1), 3) for p in range(4, 7)),
    ]
    image = image_of(records)
    again = image_from_keys(image_keys(image, SPACE), SPACE, 20)
    assert list(snapshot_records(again)) == list(snapshot_records(image))


def keys_with(change: tuple[str, object]) -> dict[str, bytes]:
    keys = image_keys(image_of(cluster_records()), SPACE)
    key, value = change
    keys[key] = value if isinstance(value, bytes) else json.dumps(value).encode()
    return keys


STATE = "/highwater/test/brokers/topics/orders/partitions/0/state"
TOPIC = "/highwater/test/brokers/topics/orders"


@pytest.mark.parametrize(
    ("key", "value", "problem"),
    [
        (
            STATE,
            {"leader": 3, "leader_epoch": 1, "isr": [1, 2], "partition_epoch": 1},
            "leader 3 is not in the ISR [1, 2]",
        ),
        (
            STATE,
            {"leader": 1, "leader_epoch": 1, "isr": [1, 9], "partition_epoch": 1},
            "ISR member 9 is not a replica",
        ),
        (
            STATE,
            {"leader": "one", "leader_epoch": 1, "isr": [1], "partition_epoch": 1},
            "leader must be an integer",
        ),
        (STATE, b"{not json", "not JSON"),
        (
            # Equal to partition 1's replicas, already checked, but for a JSON true.
            "/highwater/test/brokers/topics/orders/partitions/1/state",
            {"leader": 2, "leader_epoch": 0, "isr": [2, 3, True], "partition_epoch": 0},
            "isr must be a list of broker ids, not [2, 3, True]",
        ),
        (
            TOPIC,
            {"topic_id": "AAAAAAAAAAAAAAAAAAAAAA", "partitions": {"0": [1, 2, 42], "1": [2, 3, 1]}},
            "partition 0 is assigned to broker 42, which never registered (no "
            "/highwater/test/brokers/registrations/42)",
        ),
        (
            TOPIC,
            {"topic_id": "AAAAAAAAAAAAAAAAAAAAAA", "partitions": {"0": [1, 1, 2], "1": [2, 3, 1]}},
            "partition 0 names a broker twice",
        ),
        (
            TOPIC,
            {"topic_id": "AAAAAAAAAAAAAAAAAAAAAA", "partitions": {"0": [1, 2, 3], "2": [2, 3, 1]}},
            "partitions must be numbered 0..1",
        ),
        (
            "/highwater/test/brokers/topics/orders/partitions/5/state",
            {"leader": 1, "leader_epoch": 0, "isr": [1], "partition_epoch": 0},
            "topic orders has no partition 5",
        ),
        (
            "/highwater/test/brokers/topics/ghost/partitions/0/state",
            {"leader": 1, "leader_epoch": 0, "isr": [1], "partition_epoch": 0},
            "a partition state of topic ghost, which has no key",
        ),
    ],
)
def test_an_impossible_key_is_refused_naming_it(key: str, value: object, problem: str) -> None:
    with pytest.raises(InconsistentMetadataError) as caught:
        image_from_keys(keys_with((key, value)), SPACE, 20)
    assert caught.value.key == key
    assert problem in str(caught.value)
    assert str(caught.value).startswith(f"etcd key {key}: ")


def test_a_partition_without_its_state_key_is_refused_naming_the_missing_key() -> None:
    keys = image_keys(image_of(cluster_records()), SPACE)
    del keys[STATE]
    with pytest.raises(InconsistentMetadataError, match="missing") as caught:
        image_from_keys(keys, SPACE, 20)
    assert caught.value.key == STATE


def test_keys_of_another_cluster_and_leases_are_not_state() -> None:
    keys = image_keys(image_of(cluster_records()), SPACE)
    keys["/highwater/other/brokers/topics/x"] = b"garbage"
    keys["/highwater/test/brokers/ids/1"] = b"{}"
    keys["/highwater/test/controller"] = b"{}"
    assert list(snapshot_records(image_from_keys(keys, SPACE, 20))) == list(
        snapshot_records(image_of(cluster_records()))
    )
    assert not SPACE.is_state("/highwater/test/brokers/ids/1")
    assert SPACE.is_state(STATE)
    assert SPACE.broker_id_of("/highwater/test/brokers/ids/12") == 12


def test_the_metadata_store_address() -> None:
    address = parse_metadata_store("etcd://h1:2379,h2:2380/prod")
    assert address.endpoints == (("h1", 2379), ("h2", 2380))
    assert address.prefix == "/highwater/prod/"
    assert parse_metadata_store("etcd://h1:2379").prefix == "/highwater/default/"


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("zk://h:2181", "expected etcd://"),
        ("etcd://h", "'h' is not HOST:PORT"),
        ("etcd://h:99999", "is not HOST:PORT"),
        ("etcd://h:2379/a/b", "cluster name 'a/b'"),
    ],
)
def test_a_bad_metadata_store_address_is_refused(value: str, problem: str) -> None:
    with pytest.raises(InvalidConfigError, match=problem):
        parse_metadata_store(value)


def test_a_push_from_an_older_controller_epoch_is_refused() -> None:
    pushed = PushedMetadata()
    seen: list[int] = []
    pushed.add_listener(lambda image: seen.append(image.offset))
    values = snapshot_values(image_of(cluster_records()))
    assert pushed.accept(controller_id=1, controller_epoch=2, offset=5, values=values) == (
        ErrorCode.NONE,
        "",
    )
    error, message = pushed.accept(
        controller_id=3,
        controller_epoch=1,
        offset=9,
        values=[encode_record(TopicRecord("x", "B" * 22))],
    )
    assert error == ErrorCode.STALE_CONTROLLER_EPOCH
    assert "controller 3 of epoch 1 was deposed" in message
    # Older than the image: ignored; the same again: nothing changes; a newer one of a
    # newer epoch: taken.
    assert (
        pushed.accept(controller_id=1, controller_epoch=2, offset=4, values=[])[0] == ErrorCode.NONE
    )
    assert pushed.accept(controller_id=1, controller_epoch=2, offset=5, values=values)[0] == 0
    assert (
        pushed.accept(controller_id=2, controller_epoch=3, offset=6, values=values)[0]
        == ErrorCode.NONE
    )
    assert seen == [5, 6]
    assert (pushed.controller_id, pushed.controller_epoch) == (2, 3)
    assert "orders" in pushed.image.topics.by_name
