"""Metadata snapshots: an image as the list of records that recreates it, and back (KIP-630).

A snapshot of ``__cluster_metadata`` at offset N holds no history, only the state: one
:class:`RegisterBrokerRecord` per broker (with its fencing and controlled-shutdown state,
and whether an unclean shutdown's ELR removals are still owed),
one :class:`TopicRecord` and one :class:`PartitionRecord` per partition per topic (with
its epochs), one :class:`ConfigRecord` per override, the producer-id high mark, and the
coordinators with their assignments. Replaying them into an empty image gives an image
equal to the one the snapshot was taken from. The Raft layer stores the encoded records
(:func:`snapshot_values`) and names the snapshot by offset and epoch.

The stored form writes a topic's partitions column by column (:class:`PartitionsRecord`,
up to :data:`PARTITIONS_PER_RECORD` per record) instead of a :class:`PartitionRecord`
each: a Python object and a protobuf message per partition made a snapshot of 2,000,000
partitions take 50 s to encode and 70 s to load, while packed integer columns are
serialized and parsed by protobuf's C code, leaving one loop over plain integers per
side. A partition that is being reassigned or has eligible leader replicas (rare, and
fields the columns leave out) is written as its own :class:`PartitionRecord`, in order.
:func:`snapshot_records` stays the record-per-partition form, for readers that want the
records one by one (the etcd key space, tests).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Final

from highwater.metadata.delta import MetadataDelta
from highwater.metadata.image import MetadataImage, PartitionRegistration, TopicImage
from highwater.metadata.records import (
    AccessControlEntryRecord,
    ClientQuotaRecord,
    ConfigRecord,
    ConfigResourceType,
    CoordinatorAssignmentRecord,
    MetadataRecord,
    MigrationStateRecord,
    PartitionsRecord,
    ProducerIdsRecord,
    TopicRecord,
    UserScramCredentialRecord,
    decode_record,
    encode_record,
)
from highwater.security.scram import MECHANISM_NUMBERS

PARTITIONS_PER_RECORD: Final = 1000
"""Partitions per :class:`PartitionsRecord` of a stored snapshot (about 12 KB each)."""


def snapshot_records(image: MetadataImage) -> Iterator[MetadataRecord]:
    """The records that recreate ``image`` from nothing, in an order that replays.

    Brokers and coordinators first, then each topic (its record, its configs, its
    partitions), then broker configs, the producer-id block, coordinator assignments and ACLs.
    """
    return _records(image, columnar=False)


def _records(image: MetadataImage, *, columnar: bool) -> Iterator[MetadataRecord]:
    """:func:`snapshot_records`, with each topic's partitions in columns if ``columnar``."""
    for _, broker in sorted(image.cluster.brokers.items()):
        yield broker.to_record()
    yield from _coordinator_records(image)
    for name, topic in sorted(image.topics.by_name.items()):
        yield TopicRecord(name=name, topic_id=topic.topic_id)
        for key, value in sorted(image.topic_config(name).items()):
            yield ConfigRecord(ConfigResourceType.TOPIC, name, key, value)
        if columnar:
            yield from partition_columns(topic)
        else:
            for partition_id, registration in enumerate(topic.partitions.registrations()):
                yield registration.to_record(topic.topic_id, partition_id)
    topic_names = image.topics.by_name
    for resource, values in sorted(image.configs.resources.items()):
        if resource.type == ConfigResourceType.TOPIC and resource.name in topic_names:
            continue  # written with its topic
        for key, value in sorted(values.items()):
            yield ConfigRecord(resource.type, resource.name, key, value)
    yield from _tail_records(image)


def other_records(image: MetadataImage) -> Iterator[MetadataRecord]:
    """The records of :func:`snapshot_records` other than brokers, topics, partitions and
    configs (coordinators, the producer-id block, coordinator assignments, SCRAM
    credentials, quotas, ACLs, the migration state), without walking the topics: their
    cost does not grow with the partition count."""
    yield from _coordinator_records(image)
    yield from _tail_records(image)


def _coordinator_records(image: MetadataImage) -> Iterator[MetadataRecord]:
    for _, coordinator in sorted(image.cluster.coordinators.items()):
        yield coordinator.to_record()


def _tail_records(image: MetadataImage) -> Iterator[MetadataRecord]:
    producer_ids = image.producer_ids
    if producer_ids.next_producer_id > 0:
        yield ProducerIdsRecord(
            broker_id=producer_ids.last_broker_id,
            broker_epoch=producer_ids.last_broker_epoch,
            next_producer_id=producer_ids.next_producer_id,
        )
    for partition_id, assignment in sorted(image.coordinators.assignments.items()):
        yield CoordinatorAssignmentRecord(
            partition_id,
            assignment.coordinator_id,
            assignment.coordinator_epoch,
            assignment.revoked_from,
        )
    for (user, mechanism), credential in sorted(image.scram.credentials.items()):
        yield UserScramCredentialRecord(
            user,
            MECHANISM_NUMBERS[mechanism],
            credential.salt,
            credential.stored_key,
            credential.server_key,
            credential.iterations,
        )
    for entity, quota_key, quota_value in image.client_quotas.items():
        yield ClientQuotaRecord(entity.user, entity.client_id, quota_key, quota_value)
    for acl_id, acl in sorted(image.acls.by_id.items()):
        yield AccessControlEntryRecord.of(acl_id, acl)
    if image.migration.state:
        migration = image.migration
        yield MigrationStateRecord(
            migration.state, migration.etcd_metadata_offset, migration.copied_offset
        )


def partition_columns(
    topic: TopicImage, per_record: int = PARTITIONS_PER_RECORD
) -> Iterator[PartitionsRecord | MetadataRecord]:
    """The partitions of ``topic`` as :class:`PartitionsRecord` s of up to ``per_record``
    consecutive partitions, with a :class:`PartitionRecord` for each partition the columns
    cannot say (removing or adding replicas, eligible leader replicas) in its place."""
    run: list[PartitionRegistration] = []
    first = 0
    for partition_id, registration in enumerate(topic.partitions.registrations()):
        if (
            registration.removing_replicas
            or registration.adding_replicas
            or registration.elr
            or registration.last_known_elr
        ):
            if run:
                yield _columns(topic.topic_id, first, run)
                run = []
            yield registration.to_record(topic.topic_id, partition_id)
            first = partition_id + 1
            continue
        run.append(registration)
        if len(run) == per_record:
            yield _columns(topic.topic_id, first, run)
            run = []
            first = partition_id + 1
    if run:
        yield _columns(topic.topic_id, first, run)


def _columns(topic_id: str, first: int, run: list[PartitionRegistration]) -> PartitionsRecord:
    replicas: list[int] = []
    isr: list[int] = []
    isr_counts: list[int] = []
    for registration in run:
        replicas += registration.replicas
        if registration.isr is registration.replicas or registration.isr == registration.replicas:
            isr_counts.append(-1)
        else:
            isr_counts.append(len(registration.isr))
            isr += registration.isr
    return PartitionsRecord(
        topic_id=topic_id,
        first_partition_id=first,
        leaders=tuple([r.leader for r in run]),
        leader_epochs=tuple([r.leader_epoch for r in run]),
        partition_epochs=tuple([r.partition_epoch for r in run]),
        replica_counts=tuple([len(r.replicas) for r in run]),
        replicas=tuple(replicas),
        isr_counts=tuple(isr_counts),
        isr=tuple(isr),
    )


def load_snapshot(records: Iterable[MetadataRecord], offset: int, epoch: int) -> MetadataImage:
    """The image a snapshot's records describe, as of ``offset`` and ``epoch``."""
    return MetadataDelta(MetadataImage.empty()).replay_all(records).apply(offset, epoch)


def snapshot_values(image: MetadataImage) -> list[bytes]:
    """The snapshot of ``image`` as the encoded record values the Raft layer stores, each
    topic's partitions in columns (:func:`partition_columns`)."""
    return [encode_record(record) for record in _records(image, columnar=True)]


def load_snapshot_values(values: Iterable[bytes], offset: int, epoch: int) -> MetadataImage:
    """The image of a snapshot stored as encoded record values."""
    return load_snapshot((decode_record(value) for value in values), offset, epoch)
