"""The consumer protocol's domain types and their encoding: subscriptions and assignments as bytes.

A consumer group's coordinator treats each member's JoinGroup metadata and SyncGroup
assignment as opaque bytes (Kafka's JoinGroup/SyncGroup). Consumers fill them with the
messages of ``consumer_protocol.proto``:

- every member sends a :class:`Subscription` (:func:`encode_subscription`) as the metadata of
  each assignor it offers;
- the group leader decodes all of them (:func:`decode_group_subscription`), runs the chosen
  assignor (:func:`highwater.group.assignors.assign_group`) and sends each member its
  :class:`Assignment` (:func:`encode_assignment`);
- each member decodes its own (:func:`decode_assignment`) and works out what to revoke and what
  it newly got (:func:`assignment_change`).

Malformed bytes raise :class:`MalformedConsumerProtocolError`, never anything else: undecodable
protobuf, invalid UTF-8 in names, an empty topic name, a negative partition or a generation
below -1. The leader does not fail the rebalance for one member's garbage:
:func:`decode_group_subscription` sets such a member aside (it subscribes to nothing and gets an
empty assignment), so the rest of the group keeps consuming.

Partitions are ``(topic, partition)`` tuples (:data:`TopicPartitionKey`, what
:meth:`highwater.client.consumer.TopicPartition.key` returns). Everything here is pure.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from google.protobuf.message import DecodeError

from highwater.errors import HighwaterError
from highwater.v1 import consumer_protocol_pb2 as pb
from highwater.v1.common_pb2 import ErrorCode

__all__ = [
    "DEFAULT_GENERATION",
    "Assignment",
    "AssignmentChange",
    "GroupMember",
    "GroupSubscription",
    "MalformedConsumerProtocolError",
    "RebalanceProtocol",
    "Subscription",
    "TopicPartitionKey",
    "assignment_change",
    "decode_assignment",
    "decode_group_subscription",
    "decode_partitions",
    "decode_subscription",
    "encode_assignment",
    "encode_partitions",
    "encode_subscription",
    "member_sort_key",
    "sorted_members",
]

#: A partition of a topic, without an offset: ``(topic, partition)``.
TopicPartitionKey = tuple[str, int]

#: The generation of a member that owns nothing from any generation (Kafka's DEFAULT_GENERATION).
DEFAULT_GENERATION = -1


class MalformedConsumerProtocolError(HighwaterError, ValueError):
    """Bytes that are not a valid consumer protocol message (subscription or assignment)."""

    code = ErrorCode.INCONSISTENT_GROUP_PROTOCOL


class RebalanceProtocol(enum.Enum):
    """How a member gives partitions up in a rebalance (KIP-429).

    ``EAGER``: every member revokes all its partitions before it rejoins, and gets a whole new
    assignment. ``COOPERATIVE``: members keep their partitions across the rebalance and revoke
    only those the new assignment takes away; a partition moving between members is handed over
    in a second rebalance, once its old owner has revoked it.
    """

    EAGER = "eager"
    COOPERATIVE = "cooperative"


def _partitions(items: Iterable[TopicPartitionKey]) -> tuple[TopicPartitionKey, ...]:
    """``items`` as sorted, distinct ``(topic, partition)`` tuples."""
    return tuple(sorted({(str(topic), int(partition)) for topic, partition in items}))


@dataclass(frozen=True, slots=True)
class Subscription:
    """What one member asks for as it joins (Kafka's ``ConsumerPartitionAssignor.Subscription``).

    ``topics`` are the subscribed topic names; ``owned_partitions`` what the member owns as it
    joins (always empty under the eager protocol) and ``generation_id`` the generation it got
    them in (-1: none); ``user_data`` is the assignor's own data. ``group_instance_id`` is the
    static member id (KIP-345): it is not encoded (the coordinator reports it beside the
    metadata) but orders members. Topics and partitions are normalised to sorted distinct
    tuples, so that two equal subscriptions compare equal.
    """

    topics: tuple[str, ...]
    user_data: bytes = b""
    owned_partitions: tuple[TopicPartitionKey, ...] = ()
    generation_id: int = DEFAULT_GENERATION
    group_instance_id: str | None = None
    rack_id: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "topics", tuple(sorted(set(self.topics))))
        object.__setattr__(self, "owned_partitions", _partitions(self.owned_partitions))
        object.__setattr__(self, "user_data", bytes(self.user_data))


@dataclass(frozen=True, slots=True)
class Assignment:
    """One member's share of the group's partitions (sorted, distinct) and assignor data."""

    partitions: tuple[TopicPartitionKey, ...]
    user_data: bytes = b""

    def __post_init__(self) -> None:
        object.__setattr__(self, "partitions", _partitions(self.partitions))
        object.__setattr__(self, "user_data", bytes(self.user_data))


@dataclass(frozen=True, slots=True)
class GroupMember:
    """A member as JoinGroup reports it to the leader: ids and its protocol metadata bytes."""

    member_id: str
    metadata: bytes
    group_instance_id: str | None = None


@dataclass(frozen=True, slots=True)
class GroupSubscription:
    """The leader's view of the group: each decodable member's subscription, and the rest.

    ``subscriptions`` is the assignor's input. ``malformed`` names the members whose metadata
    could not be decoded, with the reason; they take part in no assignment and get an empty one.
    """

    subscriptions: dict[str, Subscription]
    malformed: dict[str, MalformedConsumerProtocolError] = field(default_factory=dict)


# --- Encoding ----------------------------------------------------------------------------


def encode_partitions(
    partitions: Iterable[TopicPartitionKey],
) -> list[pb.ConsumerProtocolTopicPartitions]:
    """``partitions`` grouped by topic, topics and partitions in ascending order."""
    by_topic: dict[str, list[int]] = {}
    for topic, partition in _partitions(partitions):
        by_topic.setdefault(topic, []).append(partition)
    return [
        pb.ConsumerProtocolTopicPartitions(topic=topic, partitions=indexes)
        for topic, indexes in by_topic.items()
    ]


def decode_partitions(
    groups: Iterable[pb.ConsumerProtocolTopicPartitions],
) -> tuple[TopicPartitionKey, ...]:
    """The partitions of decoded topic groups, sorted and distinct; checked for sanity.

    Raises :class:`MalformedConsumerProtocolError` on an empty topic name or a negative
    partition. A partition listed twice is kept once.
    """
    result: list[TopicPartitionKey] = []
    for group in groups:
        if not group.topic:
            raise MalformedConsumerProtocolError("a topic-partitions entry has no topic name")
        for partition in group.partitions:
            if partition < 0:
                raise MalformedConsumerProtocolError(
                    f"negative partition {partition} of topic {group.topic!r}"
                )
            result.append((group.topic, partition))
    return _partitions(result)


def encode_subscription(subscription: Subscription) -> bytes:
    """The ``ConsumerProtocolSubscription`` bytes of ``subscription`` (JoinGroup metadata)."""
    message = pb.ConsumerProtocolSubscription(
        topics=subscription.topics,
        user_data=subscription.user_data,
        owned_partitions=encode_partitions(subscription.owned_partitions),
        generation_id=subscription.generation_id,
    )
    if subscription.rack_id is not None:
        message.rack_id = subscription.rack_id
    return message.SerializeToString(deterministic=True)


def decode_subscription(data: bytes, group_instance_id: str | None = None) -> Subscription:
    """The :class:`Subscription` in JoinGroup metadata ``data``.

    ``group_instance_id`` is the member's static id as the coordinator reported it. Raises
    :class:`MalformedConsumerProtocolError` when ``data`` is not a valid subscription.
    """
    message = pb.ConsumerProtocolSubscription()
    _parse(message, data, "subscription")
    for topic in message.topics:
        if not topic:
            raise MalformedConsumerProtocolError("a subscription names an empty topic")
    if message.generation_id < DEFAULT_GENERATION:
        raise MalformedConsumerProtocolError(
            f"invalid generation id {message.generation_id} in a subscription"
        )
    return Subscription(
        topics=tuple(message.topics),
        user_data=message.user_data,
        owned_partitions=decode_partitions(message.owned_partitions),
        generation_id=message.generation_id,
        group_instance_id=group_instance_id,
        rack_id=message.rack_id if message.HasField("rack_id") else None,
    )


def encode_assignment(assignment: Assignment) -> bytes:
    """The ``ConsumerProtocolAssignment`` bytes of ``assignment`` (SyncGroup assignment)."""
    message = pb.ConsumerProtocolAssignment(
        assigned_partitions=encode_partitions(assignment.partitions),
        user_data=assignment.user_data,
    )
    return message.SerializeToString(deterministic=True)


def decode_assignment(data: bytes) -> Assignment:
    """The :class:`Assignment` in SyncGroup bytes ``data``.

    Empty bytes are an empty assignment (what the coordinator sends a member the leader left
    out). Raises :class:`MalformedConsumerProtocolError` when ``data`` is not a valid
    assignment; the consumer should then rejoin the group.
    """
    message = pb.ConsumerProtocolAssignment()
    _parse(message, data, "assignment")
    return Assignment(
        partitions=decode_partitions(message.assigned_partitions), user_data=message.user_data
    )


def _parse(
    message: pb.ConsumerProtocolSubscription | pb.ConsumerProtocolAssignment,
    data: bytes,
    what: str,
) -> None:
    """Parse ``data`` into ``message``; any failure becomes a typed error."""
    try:
        message.ParseFromString(bytes(data))
    except (DecodeError, ValueError, TypeError, RuntimeError) as exc:
        raise MalformedConsumerProtocolError(f"malformed consumer protocol {what}: {exc}") from exc


def decode_group_subscription(members: Iterable[GroupMember]) -> GroupSubscription:
    """Decode every member's JoinGroup metadata, for the group leader.

    A member whose metadata is malformed does not fail the rebalance: it is listed in
    :attr:`GroupSubscription.malformed` instead of ``subscriptions``, so it gets no
    partitions (an empty assignment) and the other members are assigned as usual.
    """
    subscriptions: dict[str, Subscription] = {}
    malformed: dict[str, MalformedConsumerProtocolError] = {}
    for member in members:
        try:
            subscriptions[member.member_id] = decode_subscription(
                member.metadata, member.group_instance_id
            )
        except MalformedConsumerProtocolError as exc:
            malformed[member.member_id] = exc
    return GroupSubscription(subscriptions, malformed)


# --- Ordering ----------------------------------------------------------------------------


def _java_order(text: str) -> bytes:
    """A key that orders strings like Java's ``String.compareTo`` (by UTF-16 code units)."""
    return text.encode("utf-16-be", "surrogatepass")


def member_sort_key(member_id: str, group_instance_id: str | None) -> tuple[int, bytes, bytes]:
    """The order assignors go through members in (Kafka's ``MemberInfo.compareTo``).

    Static members (with a ``group.instance.id``) come first, by instance id, so that a static
    member restarting under a new member id keeps its place; then dynamic members by member
    id. Strings compare as Java compares them, so a Java leader would pick the same order.
    """
    if group_instance_id is not None:
        return (0, _java_order(group_instance_id), _java_order(member_id))
    return (1, _java_order(member_id), b"")


# --- What a member does with its new assignment ----------------------------------------------


@dataclass(frozen=True, slots=True)
class AssignmentChange:
    """What a member does with a new assignment: partitions to revoke, and to start on.

    ``revoked`` go to ``on_partitions_revoked`` (commit, then stop fetching them); ``added`` to
    ``on_partitions_assigned``. ``rejoin`` is True when the member must rejoin at once so that
    the partitions it gave up can go to their new owners (cooperative protocol only).
    """

    revoked: tuple[TopicPartitionKey, ...]
    added: tuple[TopicPartitionKey, ...]
    rejoin: bool


def assignment_change(
    owned: Iterable[TopicPartitionKey],
    assigned: Iterable[TopicPartitionKey],
    protocol: RebalanceProtocol,
) -> AssignmentChange:
    """Compare the partitions a member ``owned`` before a rebalance with those it is ``assigned``.

    Eager: everything owned is revoked (the consumer does so before joining, Kafka's
    ``onJoinPrepare``) and everything assigned is added. Cooperative: only ``owned - assigned``
    is revoked and ``assigned - owned`` added; if anything was revoked the member rejoins, so
    that a second rebalance gives those partitions to their new owners (KIP-429).
    """
    owned_set, assigned_set = set(_partitions(owned)), set(_partitions(assigned))
    if protocol is RebalanceProtocol.EAGER:
        return AssignmentChange(_partitions(owned_set), _partitions(assigned_set), rejoin=False)
    revoked = _partitions(owned_set - assigned_set)
    return AssignmentChange(revoked, _partitions(assigned_set - owned_set), rejoin=bool(revoked))


def sorted_members(subscriptions: Mapping[str, Subscription]) -> list[str]:
    """The member ids of ``subscriptions`` in :func:`member_sort_key` order."""
    return sorted(
        subscriptions,
        key=lambda member: member_sort_key(member, subscriptions[member].group_instance_id),
    )
