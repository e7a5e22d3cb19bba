"""Metadata snapshots: an image as the list of records that recreates it, and back (KIP-630).

A snapshot of ``__cluster_metadata`` at offset N holds no history, only the state: one
:class:`RegisterBrokerRecord` per broker (with its fencing and controlled-shutdown state),
one :class:`TopicRecord` and one :class:`PartitionRecord` per partition per topic (with
its epochs), one :class:`ConfigRecord` per override, the producer-id high mark, and the
coordinators with their assignments. Replaying them into an empty image gives an image
equal to the one the snapshot was taken from. The Raft layer stores the encoded records
(:func:`snapshot_values`) and names the snapshot by offset and epoch.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from highwater.metadata.delta import MetadataDelta
from highwater.metadata.image import MetadataImage
from highwater.metadata.records import (
    AccessControlEntryRecord,
    ClientQuotaRecord,
    ConfigRecord,
    ConfigResourceType,
    CoordinatorAssignmentRecord,
    MetadataRecord,
    ProducerIdsRecord,
    TopicRecord,
    UserScramCredentialRecord,
    decode_record,
    encode_record,
)
from highwater.security.scram import MECHANISM_NUMBERS


def snapshot_records(image: MetadataImage) -> Iterator[MetadataRecord]:
    """The records that recreate ``image`` from nothing, in an order that replays.

    Brokers and coordinators first, then each topic (its record, its configs, its
    partitions), then broker configs, the producer-id block, coordinator assignments and ACLs.
    """
    for _, broker in sorted(image.cluster.brokers.items()):
        yield broker.to_record()
    for _, coordinator in sorted(image.cluster.coordinators.items()):
        yield coordinator.to_record()
    for name, topic in sorted(image.topics.by_name.items()):
        yield TopicRecord(name=name, topic_id=topic.topic_id)
        for key, value in sorted(image.topic_config(name).items()):
            yield ConfigRecord(ConfigResourceType.TOPIC, name, key, value)
        for partition_id, registration in enumerate(topic.partitions.registrations()):
            yield registration.to_record(topic.topic_id, partition_id)
    topic_names = image.topics.by_name
    for resource, values in sorted(image.configs.resources.items()):
        if resource.type == ConfigResourceType.TOPIC and resource.name in topic_names:
            continue  # written with its topic
        for key, value in sorted(values.items()):
            yield ConfigRecord(resource.type, resource.name, key, value)
    producer_ids = image.producer_ids
    if producer_ids.next_producer_id > 0:
        yield ProducerIdsRecord(
            broker_id=producer_ids.last_broker_id,
            broker_epoch=producer_ids.last_broker_epoch,
            next_producer_id=producer_ids.next_producer_id,
        )
    for partition_id, assignment in sorted(image.coordinators.assignments.items()):
        yield CoordinatorAssignmentRecord(
            partition_id, assignment.coordinator_id, assignment.coordinator_epoch
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


def load_snapshot(records: Iterable[MetadataRecord], offset: int, epoch: int) -> MetadataImage:
    """The image a snapshot's records describe, as of ``offset`` and ``epoch``."""
    return MetadataDelta(MetadataImage.empty()).replay_all(records).apply(offset, epoch)


def snapshot_values(image: MetadataImage) -> list[bytes]:
    """The snapshot of ``image`` as the encoded record values the Raft layer stores."""
    return [encode_record(record) for record in snapshot_records(image)]


def load_snapshot_values(values: Iterable[bytes], offset: int, epoch: int) -> MetadataImage:
    """The image of a snapshot stored as encoded record values."""
    return load_snapshot((decode_record(value) for value in values), offset, epoch)
