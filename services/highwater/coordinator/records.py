"""The keyed records group coordinators keep in ``__consumer_offsets``, and their codec.

A committed offset is keyed by (group, topic, partition), a group's membership by its
id; the latest value of a key is the state and a tombstone (no value) removes it, so the
compacted topic holds exactly the live state. A coordinator that takes a partition over
first appends a :class:`CoordinatorEpochMarker`. The encodings are the protobuf messages
at the end of ``coordinator.proto``, so that any language can read the topic.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from google.protobuf.message import DecodeError

from highwater.coordinator.group import CommittedOffset, Group, GroupState, Member, Protocol
from highwater.errors import HighwaterError
from highwater.storage.topic_partition import TopicPartition
from highwater.v1 import coordinator_pb2 as pb


class CorruptOffsetsRecordError(HighwaterError):
    """A record of ``__consumer_offsets`` that does not decode."""


@dataclass(frozen=True, slots=True)
class OffsetCommitRecord:
    group_id: str
    topic_partition: TopicPartition
    offset: CommittedOffset | None  # None: a tombstone


@dataclass(frozen=True, slots=True)
class GroupMetadataRecord:
    group_id: str
    value: pb.GroupMetadataValue | None  # None: a tombstone


@dataclass(frozen=True, slots=True)
class CoordinatorEpochMarker:
    coordinator_id: int
    coordinator_epoch: int


OffsetsRecord = OffsetCommitRecord | GroupMetadataRecord | CoordinatorEpochMarker
KeyValue = tuple[bytes, bytes | None]


def offset_commit_key(group_id: str, tp: TopicPartition) -> bytes:
    key = pb.OffsetsRecordKey(
        offset_commit=pb.OffsetCommitKey(group=group_id, topic=tp.topic, partition=tp.partition)
    )
    return key.SerializeToString(deterministic=True)


def group_metadata_key(group_id: str) -> bytes:
    key = pb.OffsetsRecordKey(group_metadata=pb.GroupMetadataKey(group=group_id))
    return key.SerializeToString(deterministic=True)


def encode_offset_commit(group_id: str, tp: TopicPartition, offset: CommittedOffset) -> KeyValue:
    value = pb.OffsetCommitValue(
        offset=offset.offset,
        leader_epoch=offset.leader_epoch,
        metadata=offset.metadata,
        commit_timestamp=offset.commit_timestamp,
    )
    return offset_commit_key(group_id, tp), value.SerializeToString(deterministic=True)


def encode_offset_tombstone(group_id: str, tp: TopicPartition) -> KeyValue:
    return offset_commit_key(group_id, tp), None


def encode_group_metadata(group: Group) -> KeyValue:
    """The group's membership as of now (Kafka's ``GroupMetadataValue``)."""
    value = pb.GroupMetadataValue(
        protocol_type=group.protocol_type or "",
        generation=group.generation_id,
        protocol=group.protocol_name or "",
        leader=group.leader_id or "",
        current_state_timestamp=group.state_timestamp,
    )
    for member in group.members.values():
        entry = value.members.add(
            member_id=member.member_id,
            client_id=member.client_id,
            client_host=member.client_host,
            rebalance_timeout_ms=member.rebalance_timeout_ms,
            session_timeout_ms=member.session_timeout_ms,
            subscription=member.metadata_for(group.protocol_name) if group.protocol_name else b"",
            assignment=member.assignment,
        )
        if member.group_instance_id is not None:
            entry.group_instance_id = member.group_instance_id
    return group_metadata_key(group.group_id), value.SerializeToString(deterministic=True)


def encode_group_tombstone(group_id: str) -> KeyValue:
    return group_metadata_key(group_id), None


def encode_epoch_marker(coordinator_id: int, coordinator_epoch: int) -> KeyValue:
    key = pb.OffsetsRecordKey(coordinator_epoch=pb.CoordinatorEpochKey())
    value = pb.CoordinatorEpochValue(
        coordinator_id=coordinator_id, coordinator_epoch=coordinator_epoch
    )
    return key.SerializeToString(deterministic=True), value.SerializeToString(deterministic=True)


def decode_record(key: bytes | None, value: bytes | None) -> OffsetsRecord:
    """One record of the topic; :class:`CorruptOffsetsRecordError` if it does not decode."""
    if key is None:
        raise CorruptOffsetsRecordError("a __consumer_offsets record without a key")
    try:
        parsed = pb.OffsetsRecordKey.FromString(key)
        kind = parsed.WhichOneof("key")
        if kind == "offset_commit":
            k = parsed.offset_commit
            tp = TopicPartition(k.topic, k.partition)
            if value is None:
                return OffsetCommitRecord(k.group, tp, None)
            v = pb.OffsetCommitValue.FromString(value)
            committed = CommittedOffset(v.offset, v.leader_epoch, v.metadata, v.commit_timestamp)
            return OffsetCommitRecord(k.group, tp, committed)
        if kind == "group_metadata":
            group_value = None if value is None else pb.GroupMetadataValue.FromString(value)
            return GroupMetadataRecord(parsed.group_metadata.group, group_value)
        if kind == "coordinator_epoch" and value is not None:
            marker = pb.CoordinatorEpochValue.FromString(value)
            return CoordinatorEpochMarker(marker.coordinator_id, marker.coordinator_epoch)
    except (DecodeError, ValueError) as e:
        raise CorruptOffsetsRecordError(f"a __consumer_offsets record does not decode: {e}") from e
    raise CorruptOffsetsRecordError(f"an unknown __consumer_offsets record key {key!r}")


def restore_groups(records: Iterable[OffsetsRecord], now: int) -> dict[str, Group]:
    """Rebuild the groups of one partition from its records in log order.

    A group whose last metadata names members comes back ``Stable`` in its generation,
    every member's session starting now: members that are alive keep heartbeating to the
    new coordinator without a rebalance, the others expire as usual.
    """
    offsets: dict[str, dict[TopicPartition, CommittedOffset]] = {}
    metadata: dict[str, pb.GroupMetadataValue] = {}
    for record in records:
        if isinstance(record, OffsetCommitRecord):
            group_offsets = offsets.setdefault(record.group_id, {})
            if record.offset is None:
                group_offsets.pop(record.topic_partition, None)
            else:
                group_offsets[record.topic_partition] = record.offset
        elif isinstance(record, GroupMetadataRecord):
            if record.value is None:
                metadata.pop(record.group_id, None)
                offsets.pop(record.group_id, None)
            else:
                metadata[record.group_id] = record.value
    groups: dict[str, Group] = {}
    for group_id in sorted(set(offsets) | set(metadata)):
        group = Group(group_id)
        value = metadata.get(group_id)
        if value is not None:
            group.protocol_type = value.protocol_type or None
            group.generation_id = value.generation
            group.state_timestamp = value.current_state_timestamp
            if value.members:
                group.protocol_name = value.protocol
                for entry in value.members:
                    group.add_member(_restored_member(entry, value, now))
                group.leader_id = value.leader if value.leader in group.members else None
                group.transition(GroupState.STABLE, now)
        group.offsets = offsets.get(group_id, {})
        if group.members or group.offsets or group.protocol_type is not None:
            groups[group_id] = group
    return groups


def _restored_member(entry: pb.GroupMemberValue, value: pb.GroupMetadataValue, now: int) -> Member:
    return Member(
        member_id=entry.member_id,
        group_instance_id=entry.group_instance_id if entry.HasField("group_instance_id") else None,
        client_id=entry.client_id,
        client_host=entry.client_host,
        session_timeout_ms=entry.session_timeout_ms,
        rebalance_timeout_ms=entry.rebalance_timeout_ms,
        protocol_type=value.protocol_type,
        protocols=(Protocol(value.protocol, entry.subscription),),
        assignment=entry.assignment,
        synced=True,
        heartbeat_deadline=now + entry.session_timeout_ms,
    )
