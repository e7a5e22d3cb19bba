"""MetadataImage and MetadataDelta: replaying records, lookups, copy-on-write, replay errors."""

from __future__ import annotations

import dataclasses

import pytest
from highwater.metadata import (
    NO_LEADER,
    BrokerEndpoint,
    BrokerRegistrationChangeRecord,
    ConfigRecord,
    ConfigResource,
    ConfigResourceType,
    CoordinatorAssignmentRecord,
    FenceBrokerRecord,
    IndexKind,
    MetadataDelta,
    MetadataImage,
    MetadataLoader,
    MetadataRecord,
    MetadataReplayError,
    NoOpRecord,
    PartitionChangeRecord,
    PartitionMap,
    PartitionRecord,
    PartitionRegistration,
    ProducerIdsRecord,
    RegisterBrokerRecord,
    RegisterCoordinatorRecord,
    RemoveTopicRecord,
    TopicIdPartition,
    TopicRecord,
    UnfenceBrokerRecord,
    UnregisterBrokerRecord,
    UnregisterCoordinatorRecord,
    build_broker_index,
    replay,
)
from highwater.metadata.persistent import PARTITION_CHUNK

T1 = "topic-one-id-000000000"
T2 = "topic-two-id-000000000"


def broker(broker_id: int, epoch: int, rack: str | None = None) -> RegisterBrokerRecord:
    return RegisterBrokerRecord(
        broker_id,
        f"inc-{broker_id}-{epoch}",
        epoch,
        (BrokerEndpoint("PLAINTEXT", f"b{broker_id}", 9092),),
        rack,
    )


def cluster_records() -> list[MetadataRecord]:
    return [
        broker(1, 0),
        broker(2, 1),
        broker(3, 2),
        UnfenceBrokerRecord(1, 0),
        UnfenceBrokerRecord(2, 1),
        UnfenceBrokerRecord(3, 2),
        TopicRecord("orders", T1),
        PartitionRecord(T1, 0, (1, 2, 3), (1, 2, 3), 1),
        PartitionRecord(T1, 1, (2, 3, 1), (2, 3, 1), 2),
        TopicRecord("payments", T2),
        PartitionRecord(T2, 0, (3, 1), (3,), 3),
    ]


@pytest.fixture
def image() -> MetadataImage:
    return replay(cluster_records(), offset=10, epoch=4)


# --- Replay ----------------------------------------------------------------------------


def test_the_empty_image_is_before_any_record() -> None:
    empty = MetadataImage.empty()
    assert empty.offset == -1
    assert not empty.brokers
    assert empty.partition_count == 0
    assert empty.next_producer_id == 0


def test_records_build_brokers_topics_and_partitions(image: MetadataImage) -> None:
    assert (image.offset, image.epoch) == (10, 4)
    assert sorted(image.brokers) == [1, 2, 3]
    assert all(b.is_active for b in image.brokers.values())
    orders = image.topic("orders")
    assert orders is not None and orders.topic_id == T1
    assert image.topic_by_id(T1) is orders
    assert len(orders.partitions) == 2
    assert image.partition(T1, 1) == PartitionRegistration((2, 3, 1), (2, 3, 1), 2)
    assert image.partition(TopicIdPartition(T1, 0)) == orders.partitions[0]
    assert image.partition(T1, 7) is None
    assert image.partition("nope", 0) is None
    assert image.partition_count == 3
    assert image.topic_name(T2) == "payments"


def test_registrations_start_fenced_and_change_state() -> None:
    records = [broker(1, 5)]
    image = replay(records, 0)
    registration = image.broker(1)
    assert registration is not None and registration.fenced
    assert not image.is_active_broker(1)
    image = replay([UnfenceBrokerRecord(1, 5)], 1, image=image)
    assert image.is_active_broker(1)
    image = replay(
        [BrokerRegistrationChangeRecord(1, 5, in_controlled_shutdown=True)], 2, image=image
    )
    registration = image.broker(1)
    assert registration is not None and registration.in_controlled_shutdown
    assert not registration.fenced and not registration.is_active
    image = replay([FenceBrokerRecord(1, 5)], 3, image=image)
    registration = image.broker(1)
    assert registration is not None and registration.fenced
    assert not registration.in_controlled_shutdown
    image = replay([UnregisterBrokerRecord(1, 5)], 4, image=image)
    assert image.broker(1) is None
    assert [b.broker_id for b in image.active_brokers()] == []


def test_an_unclean_shutdown_is_owed_until_the_registration_is_first_unfenced() -> None:
    image = replay([dataclasses.replace(broker(1, 5), unclean_shutdown=True)], 0)
    assert image.brokers[1].unclean_shutdown
    # Fenced again before it was ever unfenced (a session that expired): still owed.
    image = replay([FenceBrokerRecord(1, 5)], 1, image=image)
    assert image.brokers[1].unclean_shutdown
    unfenced = replay([UnfenceBrokerRecord(1, 5)], 2, image=image)
    assert not unfenced.brokers[1].unclean_shutdown
    changed = replay([BrokerRegistrationChangeRecord(1, 5, fenced=False)], 2, image=image)
    assert not changed.brokers[1].unclean_shutdown
    # A change that leaves it fenced leaves the debt.
    shut = replay([BrokerRegistrationChangeRecord(1, 5, fenced=True)], 2, image=image)
    assert shut.brokers[1].unclean_shutdown
    # The next registration says for itself.
    again = replay([broker(1, 9)], 3, image=unfenced)
    assert not again.brokers[1].unclean_shutdown


def test_a_partition_change_bumps_epochs(image: MetadataImage) -> None:
    shrunk = replay([PartitionChangeRecord(T1, 0, isr=(1, 2))], 11, image=image)
    partition = shrunk.partition(T1, 0)
    assert partition == PartitionRegistration((1, 2, 3), (1, 2), 1, 0, 1)
    moved = replay([PartitionChangeRecord(T1, 0, isr=(2,), leader=2)], 12, image=shrunk)
    assert moved.partition(T1, 0) == PartitionRegistration((1, 2, 3), (2,), 2, 1, 2)
    offline = replay([PartitionChangeRecord(T1, 0, leader=NO_LEADER)], 13, image=moved)
    assert offline.partition(T1, 0) == PartitionRegistration((1, 2, 3), (2,), NO_LEADER, 2, 3)
    # A leader named again (even the same one) bumps the leader epoch, as in Kafka.
    same = replay([PartitionChangeRecord(T1, 1, leader=2)], 14, image=offline)
    assert same.partition(T1, 1) == PartitionRegistration((2, 3, 1), (2, 3, 1), 2, 1, 1)
    reassigned = replay(
        [PartitionChangeRecord(T1, 1, replicas=(2, 3), removing_replicas=(1,))], 15, image=same
    )
    partition = reassigned.partition(T1, 1)
    assert partition is not None and partition.replicas == (2, 3)
    assert partition.removing_replicas == (1,) and partition.adding_replicas == ()


def test_removing_a_topic_drops_its_partitions_name_and_configs(image: MetadataImage) -> None:
    image = replay(
        [ConfigRecord(ConfigResourceType.TOPIC, "orders", "retention.ms", "1000")], 11, image=image
    )
    assert image.topic_config("orders") == {"retention.ms": "1000"}
    image = replay([RemoveTopicRecord(T1)], 12, image=image)
    assert image.topic("orders") is None
    assert image.topic_by_id(T1) is None
    assert image.topic_config("orders") == {}
    assert image.partition_count == 1
    assert all(key.topic_id != T1 for key in image.replicas_of(1))


def test_a_topic_removed_and_recreated_in_one_batch(image: MetadataImage) -> None:
    records: list[MetadataRecord] = [
        ConfigRecord(ConfigResourceType.TOPIC, "orders", "retention.ms", "1000"),
        RemoveTopicRecord(T1),
        TopicRecord("orders", "new-orders-id"),
        ConfigRecord(ConfigResourceType.TOPIC, "orders", "cleanup.policy", "compact"),
        PartitionRecord("new-orders-id", 0, (3,), (3,), 3),
    ]
    after = replay(records, 15, image=image)
    orders = after.topic("orders")
    assert orders is not None and orders.topic_id == "new-orders-id"
    assert len(orders.partitions) == 1
    assert after.topic_by_id(T1) is None
    assert after.topic_config("orders") == {"cleanup.policy": "compact"}


def test_configs_are_set_and_deleted(image: MetadataImage) -> None:
    topic = ConfigResource(ConfigResourceType.TOPIC, "orders")
    image = replay(
        [
            ConfigRecord(ConfigResourceType.TOPIC, "orders", "retention.ms", "1000"),
            ConfigRecord(ConfigResourceType.TOPIC, "orders", "min.insync.replicas", "2"),
            ConfigRecord(ConfigResourceType.BROKER, "", "log.retention.ms", "5"),
        ],
        11,
        image=image,
    )
    assert image.configs.get(topic) == {"retention.ms": "1000", "min.insync.replicas": "2"}
    assert image.broker_config("") == {"log.retention.ms": "5"}
    config = image.log_config("orders")
    assert config.retention_ms == 1000 and config.min_insync_replicas == 2
    # The cluster default (the default broker resource's log.retention.ms) applies to a
    # topic without an override of its own.
    assert image.log_config("payments").retention_ms == 5
    image = replay(
        [
            ConfigRecord(ConfigResourceType.TOPIC, "orders", "retention.ms", None),
            ConfigRecord(ConfigResourceType.TOPIC, "orders", "min.insync.replicas", None),
        ],
        12,
        image=image,
    )
    assert topic not in image.configs.resources


def test_a_config_change_leaves_the_image_it_was_applied_on_as_it_was(
    image: MetadataImage,
) -> None:
    orders = ConfigResource(ConfigResourceType.TOPIC, "orders")
    payments = ConfigResource(ConfigResourceType.TOPIC, "payments")
    before = replay(
        [
            ConfigRecord(ConfigResourceType.TOPIC, "orders", "retention.ms", "1000"),
            ConfigRecord(ConfigResourceType.TOPIC, "payments", "retention.ms", "2000"),
        ],
        11,
        image=image,
    )
    after = replay(
        [ConfigRecord(ConfigResourceType.TOPIC, "orders", "retention.ms", "3000")],
        12,
        image=before,
    )
    assert before.configs.get(orders) == {"retention.ms": "1000"}
    assert after.configs.get(orders) == {"retention.ms": "3000"}
    assert after.configs.get(payments) is before.configs.get(payments)
    assert dict(after.configs.resources) == {
        orders: {"retention.ms": "3000"},
        payments: {"retention.ms": "2000"},
    }


def test_producer_ids_only_grow() -> None:
    image = replay([ProducerIdsRecord(1, 0, 1000), ProducerIdsRecord(2, 1, 2000)], 1)
    assert image.next_producer_id == 2000
    assert (image.producer_ids.last_broker_id, image.producer_ids.last_broker_epoch) == (2, 1)
    with pytest.raises(MetadataReplayError, match="below"):
        replay([ProducerIdsRecord(1, 0, 1000)], 2, image=image)


def test_coordinators_and_their_assignments() -> None:
    image = replay(
        [
            RegisterCoordinatorRecord(7, "inc", 0, (BrokerEndpoint("PLAINTEXT", "c7", 1),)),
            CoordinatorAssignmentRecord(0, 7, 0),
            CoordinatorAssignmentRecord(1, 7, 0),
            CoordinatorAssignmentRecord(1, 8, 1),
            NoOpRecord(),
        ],
        4,
    )
    coordinator = image.coordinator(7)
    assert coordinator is not None and coordinator.listeners[0].host == "c7"
    assignment = image.coordinator_assignment(1)
    assert assignment is not None and (assignment.coordinator_id, assignment.coordinator_epoch) == (
        8,
        1,
    )
    assert image.coordinator_assignment(2) is None
    with pytest.raises(MetadataReplayError, match="coordinator epoch"):
        replay([CoordinatorAssignmentRecord(1, 7, 1)], 5, image=image)
    image = replay([UnregisterCoordinatorRecord(7, 0)], 5, image=image)
    assert image.coordinator(7) is None


@pytest.mark.parametrize(
    ("record", "message"),
    [
        (UnfenceBrokerRecord(9, 0), "not registered"),
        (FenceBrokerRecord(1, 99), "epoch"),
        (TopicRecord("orders", "other-id"), "already exists"),
        (TopicRecord("other", T1), "already exists"),
        (PartitionRecord("missing", 0, (1,), (1,), 1), "no topic"),
        (PartitionRecord(T1, 5, (1,), (1,), 1), "does not follow"),
        (PartitionChangeRecord(T1, 2, leader=1), "no partition"),
        (RemoveTopicRecord("missing"), "no topic"),
        (UnregisterCoordinatorRecord(4, 0), "not registered"),
    ],
)
def test_records_that_do_not_apply_are_refused(
    image: MetadataImage, record: MetadataRecord, message: str
) -> None:
    with pytest.raises(MetadataReplayError, match=message):
        MetadataDelta(image).replay(record)


def test_a_delta_reads_its_own_records(image: MetadataImage) -> None:
    delta = MetadataDelta(image)
    delta.replay(TopicRecord("new", "new-id"))
    delta.replay(PartitionRecord("new-id", 0, (1,), (1,), 1))
    delta.replay(PartitionChangeRecord(T1, 0, isr=(1,)))
    delta.replay(RemoveTopicRecord(T2))
    assert delta.topic_id("new") == "new-id" and delta.partition_count("new-id") == 1
    partition = delta.partition(T1, 0)
    assert partition is not None and partition.isr == (1,)
    assert delta.topic_id("payments") is None and delta.partition(T2, 0) is None
    assert delta.topic_names() == ["new", "orders"]
    assert sorted(key for key, _ in delta.changed_partitions()) == [
        TopicIdPartition("new-id", 0),
        TopicIdPartition(T1, 0),
    ]
    # The base image is untouched.
    assert image.topic("payments") is not None
    assert image.partition(T1, 0) == PartitionRegistration((1, 2, 3), (1, 2, 3), 1)


# --- Lookups ---------------------------------------------------------------------------


def test_broker_lookups(image: MetadataImage) -> None:
    assert image.partitions_led_by(1) == {TopicIdPartition(T1, 0)}
    assert image.partitions_led_by(3) == {TopicIdPartition(T2, 0)}
    assert image.replicas_of(1) == {
        TopicIdPartition(T1, 0),
        TopicIdPartition(T1, 1),
        TopicIdPartition(T2, 0),
    }
    assert image.partitions_with_isr_member(1) == {TopicIdPartition(T1, 0), TopicIdPartition(T1, 1)}
    assert image.partitions_without_leader() == frozenset()
    offline = replay([PartitionChangeRecord(T2, 0, leader=NO_LEADER)], 11, image=image)
    assert offline.partitions_without_leader() == {TopicIdPartition(T2, 0)}
    assert offline.partitions_led_by(3) == frozenset()


def test_derived_index_equals_a_rebuilt_one(image: MetadataImage) -> None:
    image.partitions_led_by(1)  # build the index, so the next images derive theirs
    records: list[MetadataRecord] = [
        PartitionChangeRecord(T1, 0, isr=(2, 3), leader=2),
        RemoveTopicRecord(T2),
        TopicRecord("new", "new-id"),
        PartitionRecord("new-id", 0, (3, 1), (3, 1), 3),
        PartitionChangeRecord("new-id", 0, isr=(3,), eligible_leader_replicas=(1,)),
        PartitionChangeRecord(T1, 1, isr=(1,), eligible_leader_replicas=(2, 3)),
    ]
    after = replay(records, 20, image=image)
    assert set(after.topics.built_indexes()) == {IndexKind.LEADERS}
    assert after.topics.broker_index(IndexKind.LEADERS) == build_broker_index(
        after.topics.by_id.values(), IndexKind.LEADERS
    )
    image.replicas_of(1)
    image.partitions_with_isr_member(1)
    image.partitions_with_elr_member(1)
    after = replay(records, 20, image=image)
    assert after.partitions_with_elr_member(1) == {TopicIdPartition("new-id", 0)}
    assert after.partitions_with_elr_member(3) == {TopicIdPartition(T1, 1)}
    for kind in IndexKind:
        assert after.topics.built_indexes()[kind] == build_broker_index(
            after.topics.by_id.values(), kind
        )
    fresh = replay(cluster_records() + records, 20, 4)
    assert not fresh.topics.built_indexes()
    assert fresh == after


# --- Copy-on-write ---------------------------------------------------------------------


def test_apply_shares_what_did_not_change(image: MetadataImage) -> None:
    after = replay([PartitionChangeRecord(T1, 1, isr=(2, 3))], 11, image=image)
    assert after.cluster is image.cluster
    assert after.configs is image.configs
    assert after.producer_ids is image.producer_ids
    assert after.coordinators is image.coordinators
    assert after.topic("payments") is image.topic("payments")
    assert after.topic("orders") is not image.topic("orders")
    assert after.partition(T1, 0) is image.partition(T1, 0)
    fenced = replay([FenceBrokerRecord(2, 1)], 12, image=after)
    assert fenced.topics is after.topics
    assert fenced.broker(1) is after.broker(1)
    unchanged = replay([NoOpRecord()], 13, image=fenced)
    assert unchanged.topics is fenced.topics and unchanged.cluster is fenced.cluster
    assert unchanged.offset == 13


def test_a_big_topic_copies_one_chunk_per_change() -> None:
    partitions = PartitionMap(
        PartitionRegistration((1,), (1,), 1) for _ in range(5 * PARTITION_CHUNK)
    )
    changed = partitions.updated({PARTITION_CHUNK + 3: PartitionRegistration((1,), (1,), 1, 1, 1)})
    shared = [a is b for a, b in zip(partitions._chunks, changed._chunks, strict=True)]
    assert shared == [True, False, True, True, True]
    assert changed[PARTITION_CHUNK + 3].leader_epoch == 1
    assert partitions[PARTITION_CHUNK + 3].leader_epoch == 0
    grown = changed.updated({len(changed): PartitionRegistration((2,), (2,), 2)})
    assert len(grown) == 5 * PARTITION_CHUNK + 1 and grown[len(grown) - 1].leader == 2
    assert list(grown)[:3] == [0, 1, 2] and 7 in grown and -1 not in grown
    with pytest.raises(ValueError, match="densely"):
        changed.updated({len(changed) + 1: PartitionRegistration((2,), (2,), 2)})
    with pytest.raises(KeyError):
        changed[len(changed)]


def test_isr_equal_to_replicas_shares_the_tuple() -> None:
    record = PartitionRecord(T1, 0, (1, 2, 3), (1, 2, 3), 1)
    registration = PartitionRegistration.from_record(record)
    assert registration.isr is registration.replicas
    assert registration.to_record(T1, 0) == record


# --- Loader ----------------------------------------------------------------------------


def test_the_loader_applies_batches_in_order() -> None:
    loader = MetadataLoader()
    records = cluster_records()
    loader.load_batch(0, 1, records[:6])
    assert loader.image.offset == 5 and loader.image.epoch == 1
    loader.load_batch(6, 2, records[6:])
    assert loader.image == replay(records, len(records) - 1, 2)
    end = loader.image.offset
    for overlapping in (end, end - 3):
        with pytest.raises(MetadataReplayError, match="does not follow"):
            loader.load_batch(overlapping, 2, [NoOpRecord()])
    assert loader.load_batch(end + 1, 2, []) is loader.image
    with pytest.raises(MetadataReplayError, match="older"):
        loader.load_snapshot(MetadataImage.empty())


def test_the_loader_skips_the_offsets_of_control_batches() -> None:
    # The Raft log interleaves control batches (a new leader's epoch-start marker) that
    # take offsets but are not handed to the loader: data batches may leave gaps.
    loader = MetadataLoader()
    records = cluster_records()
    loader.load_batch(1, 1, records[:6])  # offset 0: the first leader's marker
    assert loader.image.offset == 6
    loader.load_batch(9, 3, records[6:])  # offsets 7, 8: two more leaders' markers
    assert loader.image.offset == 9 + len(records) - 6 - 1 and loader.image.epoch == 3
    assert loader.image == replay(records, loader.image.offset, 3)
