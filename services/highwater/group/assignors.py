"""Kafka's partition assignors (range, roundrobin, sticky, cooperative-sticky) for the group leader.

An assignor maps the group's subscriptions onto the partitions of the subscribed topics
(:meth:`ConsumerPartitionAssignor.assign`), like Kafka's ``ConsumerPartitionAssignor``. It is
pure: it gets the partition count of each topic (from the cluster metadata the client already
has) and each member's :class:`~highwater.group.protocol.Subscription`, and returns
every member's :class:`~highwater.group.protocol.Assignment`. The same input always
gives the same output: members are taken in Kafka's order (static members by
``group.instance.id`` first, then the others by member id,
:func:`~highwater.group.protocol.member_sort_key`) and topics and partitions in
ascending order; nothing depends on dict or set iteration order.

Rules every built-in assignor keeps: a partition goes to exactly one member, and only to a
member subscribed to its topic; a topic missing from ``partitions_per_topic`` (or with no
partitions) is skipped, as Kafka skips topics without metadata; every member gets an entry,
empty if there is nothing for it.

- :class:`RangeAssignor` (``"range"``): per topic, the subscribed members in order get
  consecutive ranges; the first ``partitions % members`` get one partition more.
- :class:`RoundRobinAssignor` (``"roundrobin"``): every partition of every subscribed topic,
  sorted by topic then partition, dealt out in turn to the members in order, skipping members
  not subscribed to the partition's topic.
- :class:`StickyAssignor` (``"sticky"``, KIP-54 and KIP-341): balanced, and moving as few
  partitions as it can; see :func:`sticky_assignment`. Eager: the previous assignment travels in
  the subscription's user data, since the member revoked everything before joining.
- :class:`CooperativeStickyAssignor` (``"cooperative-sticky"``, KIP-429 and KIP-792): the same
  target from the members' ``owned_partitions`` and ``generation_id``, but a partition moving
  from one member to another is left out this round; see the class.

:func:`assign_group` is the leader's whole step: run the assignor, check its result, and give
members with malformed metadata an empty assignment.
"""

from __future__ import annotations

import abc
import logging
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

from highwater.errors import HighwaterError
from highwater.group.protocol import (
    DEFAULT_GENERATION,
    Assignment,
    GroupSubscription,
    MalformedConsumerProtocolError,
    RebalanceProtocol,
    Subscription,
    TopicPartitionKey,
    decode_partitions,
    encode_partitions,
    sorted_members,
)
from highwater.v1 import consumer_protocol_pb2 as pb

__all__ = [
    "ASSIGNORS",
    "AssignmentError",
    "ConsumerPartitionAssignor",
    "CooperativeStickyAssignor",
    "RangeAssignor",
    "RoundRobinAssignor",
    "StickyAssignor",
    "assign_group",
    "assignor_for",
    "decode_sticky_user_data",
    "encode_sticky_user_data",
    "select_rebalance_protocol",
    "sticky_assignment",
]

log = logging.getLogger(__name__)


class AssignmentError(HighwaterError):
    """An assignor's result breaks the rules (a partition twice, one that does not exist...)."""


class ConsumerPartitionAssignor(abc.ABC):
    """A partition assignment strategy (Kafka's ``ConsumerPartitionAssignor``).

    ``name`` is the protocol name members offer in JoinGroup (``partition.assignment.strategy``);
    ``supported_protocols`` the rebalance protocols it can run under.
    """

    name: ClassVar[str]
    supported_protocols: ClassVar[tuple[RebalanceProtocol, ...]] = (RebalanceProtocol.EAGER,)

    def subscription_user_data(
        self,
        topics: Collection[str],
        previous_assignment: Iterable[TopicPartitionKey],
        generation_id: int,
    ) -> bytes:
        """The ``user_data`` this member puts in its subscription (empty by default).

        ``previous_assignment`` and ``generation_id`` are the member's last assignment and the
        generation it came with (-1: none), even when the eager protocol has revoked it.
        """
        return b""

    @abc.abstractmethod
    def assign(
        self, partitions_per_topic: Mapping[str, int], subscriptions: Mapping[str, Subscription]
    ) -> dict[str, Assignment]:
        """Every member's assignment, given each topic's partition count and the subscriptions."""


@dataclass(frozen=True, slots=True)
class _Group:
    """An assignor's input, prepared: members in order and what each can be given."""

    members: tuple[str, ...]
    """Every member, in :func:`~highwater.group.protocol.member_sort_key` order."""
    topics_of: dict[str, frozenset[str]]
    """Each member's subscribed topics that exist (have partitions)."""
    counts: dict[str, int]
    """The partition count of every topic some member can be given, by name."""
    subscribers: dict[str, tuple[str, ...]]
    """Each topic's subscribed members, in member order."""

    @classmethod
    def of(
        cls, partitions_per_topic: Mapping[str, int], subscriptions: Mapping[str, Subscription]
    ) -> _Group:
        for topic, count in partitions_per_topic.items():
            if count < 0:
                raise ValueError(f"topic {topic!r} has a negative partition count {count}")
        members = tuple(sorted_members(subscriptions))
        topics_of = {
            member: frozenset(
                t for t in subscriptions[member].topics if partitions_per_topic.get(t, 0) > 0
            )
            for member in members
        }
        counts = {
            topic: partitions_per_topic[topic] for topic in sorted(set().union(*topics_of.values()))
        }
        subscribers = {
            topic: tuple(m for m in members if topic in topics_of[m]) for topic in counts
        }
        return cls(members, topics_of, counts, subscribers)

    def all_partitions(self) -> list[TopicPartitionKey]:
        """Every assignable partition, sorted by topic then partition."""
        return [(topic, p) for topic, count in self.counts.items() for p in range(count)]

    def result(self, assigned: Mapping[str, Iterable[TopicPartitionKey]]) -> dict[str, Assignment]:
        """An :class:`Assignment` for every member, in member order."""
        return {m: Assignment(tuple(assigned.get(m, ()))) for m in self.members}


# --- Range and round robin ----------------------------------------------------------------


class RangeAssignor(ConsumerPartitionAssignor):
    """Kafka's ``RangeAssignor``: consecutive ranges of each topic, topic by topic.

    For each topic, its ``n`` partitions are split over its ``k`` subscribed members in member
    order: each gets ``n // k`` consecutive partitions and the first ``n % k`` one more. With
    two topics of three partitions and members C0, C1: C0 gets t0p0, t0p1, t1p0, t1p1 and C1
    gets t0p2, t1p2. The first members get the extra partition of every topic, so members may
    differ by more than one partition overall; that is range's nature (co-partitioned topics
    land on the same member). Rack awareness (KIP-881) is not implemented.
    """

    name = "range"

    def assign(
        self, partitions_per_topic: Mapping[str, int], subscriptions: Mapping[str, Subscription]
    ) -> dict[str, Assignment]:
        group = _Group.of(partitions_per_topic, subscriptions)
        assigned: dict[str, list[TopicPartitionKey]] = {m: [] for m in group.members}
        for topic, count in group.counts.items():
            members = group.subscribers[topic]
            per_member, extra = divmod(count, len(members))
            start = 0
            for i, member in enumerate(members):
                length = per_member + (1 if i < extra else 0)
                assigned[member].extend((topic, p) for p in range(start, start + length))
                start += length
        return group.result(assigned)


class RoundRobinAssignor(ConsumerPartitionAssignor):
    """Kafka's ``RoundRobinAssignor``: all partitions dealt out in turn.

    The partitions of every subscribed topic, sorted by topic then partition, go one by one to
    the members taken in a circle in member order; a member not subscribed to a partition's
    topic is passed over for that partition. With identical subscriptions, members' counts
    differ by at most one.
    """

    name = "roundrobin"

    def assign(
        self, partitions_per_topic: Mapping[str, int], subscriptions: Mapping[str, Subscription]
    ) -> dict[str, Assignment]:
        group = _Group.of(partitions_per_topic, subscriptions)
        assigned: dict[str, list[TopicPartitionKey]] = {m: [] for m in group.members}
        members, turn = group.members, 0
        for topic, partition in group.all_partitions():
            # Every topic in counts has a subscriber, so this finds one within a full circle.
            while topic not in group.topics_of[members[turn]]:
                turn = (turn + 1) % len(members)
            assigned[members[turn]].append((topic, partition))
            turn = (turn + 1) % len(members)
        return group.result(assigned)


# --- Sticky ---------------------------------------------------------------------------------


def sticky_assignment(
    partitions_per_topic: Mapping[str, int],
    subscriptions: Mapping[str, Subscription],
    claims: Mapping[str, tuple[Iterable[TopicPartitionKey], int]],
) -> dict[str, Assignment]:
    """The sticky assignment: balanced, keeping as many owned partitions as balance allows.

    ``claims`` maps members to the partitions they say they own and the generation they got
    them in. The steps:

    1. **Claims.** A claim counts if the partition exists and its claimant subscribes to its
       topic. When several members claim one partition, the claim of the highest generation
       wins (a member that missed a rebalance still lists what it had before); if two claims
       tie at the highest generation neither is kept (Kafka logs this as a bug and
       invalidates both). Every winning claim is kept for now.
    2. **Unowned partitions** go, the most constrained first (fewest subscribed members, then
       by topic and partition), each to the subscribed member with the fewest partitions
       (ties: member order).
    3. **Balance.** While some member has at least two partitions more than a member that
       could take one of them, one moves from the fuller to the emptier (the emptiest member
       first, from the fullest, preferring a partition that was not owned before, then the
       highest). Each move strictly lowers the sum of squared counts, so this ends, and it
       ends with members of identical subscriptions within one partition of each other. Moves
       go from the fullest to the emptiest member, so no member both gives and takes: only
       excess partitions move.

    With identical subscriptions this is exactly as sticky as balance permits: adding a member
    moves only partitions to it, removing one moves only that member's partitions.
    """
    group = _Group.of(partitions_per_topic, subscriptions)
    order = {m: i for i, m in enumerate(group.members)}

    # 1. Claims: the highest generation wins; a tie at the highest keeps none.
    by_partition: dict[TopicPartitionKey, list[tuple[int, str]]] = {}
    for member in group.members:
        owned, generation = claims.get(member, ((), DEFAULT_GENERATION))
        for topic, partition in owned:
            if topic in group.topics_of[member] and 0 <= partition < group.counts[topic]:
                by_partition.setdefault((topic, partition), []).append((generation, member))
    current: dict[str, set[TopicPartitionKey]] = {m: set() for m in group.members}
    for tp, claimants in by_partition.items():
        best = max(generation for generation, _ in claimants)
        winners = {member for generation, member in claimants if generation == best}
        if len(winners) == 1:
            current[winners.pop()].add(tp)
    kept = {m: frozenset(current[m]) for m in group.members}

    # 2. Unowned partitions, the most constrained first, to the least loaded subscriber.
    owner = {tp: m for m, tps in current.items() for tp in tps}
    unowned = [tp for tp in group.all_partitions() if tp not in owner]
    unowned.sort(key=lambda tp: (len(group.subscribers[tp[0]]), tp))
    for tp in unowned:
        member = min(group.subscribers[tp[0]], key=lambda m: (len(current[m]), order[m]))
        current[member].add(tp)

    # 3. Balance: move from the fullest to the emptiest while they differ by two or more.
    while (move := _next_move(group, order, current, kept)) is not None:
        giver, taker, tp = move
        current[giver].remove(tp)
        current[taker].add(tp)
    return group.result({m: sorted(tps) for m, tps in current.items()})


def _next_move(
    group: _Group,
    order: Mapping[str, int],
    current: Mapping[str, set[TopicPartitionKey]],
    kept: Mapping[str, frozenset[TopicPartitionKey]],
) -> tuple[str, str, TopicPartitionKey] | None:
    """The next balancing move ``(giver, taker, partition)``, or None when balanced."""
    if not group.members:
        return None
    ascending = sorted(group.members, key=lambda m: (len(current[m]), order[m]))
    descending = sorted(group.members, key=lambda m: (-len(current[m]), order[m]))
    fullest = len(current[descending[0]])
    for taker in ascending:
        taker_count = len(current[taker])
        if fullest < taker_count + 2:
            return None
        wanted = group.topics_of[taker]
        for giver in descending:
            if len(current[giver]) < taker_count + 2:
                break
            candidates = [tp for tp in current[giver] if tp[0] in wanted]
            if candidates:
                # A partition given out this round first; else the highest, as Kafka
                # keeps the first of a member's owned partitions and revokes the rest.
                tp = max(candidates, key=lambda tp: (tp not in kept[giver], tp))
                return giver, taker, tp
    return None


def encode_sticky_user_data(
    previous_assignment: Iterable[TopicPartitionKey], generation: int
) -> bytes:
    """The ``StickyAssignorUserData`` bytes: a member's previous assignment and its generation."""
    message = pb.StickyAssignorUserData(
        previous_assignment=encode_partitions(previous_assignment), generation=generation
    )
    return message.SerializeToString(deterministic=True)


def decode_sticky_user_data(data: bytes) -> tuple[tuple[TopicPartitionKey, ...], int]:
    """``(previous_assignment, generation)`` from ``StickyAssignorUserData`` bytes.

    Raises :class:`~highwater.group.protocol.MalformedConsumerProtocolError` when the
    bytes are not valid user data.
    """
    message = pb.StickyAssignorUserData()
    try:
        message.ParseFromString(bytes(data))
    except Exception as exc:  # protobuf raises DecodeError, and RuntimeError on some input
        raise MalformedConsumerProtocolError(f"malformed sticky assignor user data: {exc}") from exc
    if message.generation < DEFAULT_GENERATION:
        raise MalformedConsumerProtocolError(
            f"invalid generation {message.generation} in sticky assignor user data"
        )
    return decode_partitions(message.previous_assignment), message.generation


class StickyAssignor(ConsumerPartitionAssignor):
    """Kafka's ``StickyAssignor`` (KIP-54, KIP-341), for the eager protocol.

    Computes :func:`sticky_assignment`. An eager member revokes everything before it joins, so
    its subscription carries what it had in ``user_data`` (:meth:`subscription_user_data`:
    the previous assignment and its generation). A subscription without user data falls back
    to its ``owned_partitions`` and ``generation_id``. User data that does not decode counts
    as "owns nothing": that member loses its stickiness, the group still gets an assignment.
    """

    name = "sticky"

    def subscription_user_data(
        self,
        topics: Collection[str],
        previous_assignment: Iterable[TopicPartitionKey],
        generation_id: int,
    ) -> bytes:
        previous = tuple(previous_assignment)
        if not previous and generation_id == DEFAULT_GENERATION:
            return b""
        return encode_sticky_user_data(previous, generation_id)

    def assign(
        self, partitions_per_topic: Mapping[str, int], subscriptions: Mapping[str, Subscription]
    ) -> dict[str, Assignment]:
        claims: dict[str, tuple[Iterable[TopicPartitionKey], int]] = {}
        for member, subscription in subscriptions.items():
            if not subscription.user_data:
                claims[member] = (subscription.owned_partitions, subscription.generation_id)
                continue
            try:
                claims[member] = decode_sticky_user_data(subscription.user_data)
            except MalformedConsumerProtocolError as exc:
                log.warning("member %s: ignoring its sticky user data: %s", member, exc)
        return sticky_assignment(partitions_per_topic, subscriptions, claims)


class CooperativeStickyAssignor(ConsumerPartitionAssignor):
    """Kafka's ``CooperativeStickyAssignor`` (KIP-429, KIP-792), for the cooperative protocol.

    The target is :func:`sticky_assignment` of the members' ``owned_partitions`` and
    ``generation_id`` (the subscription carries both, so there is no user data). Then every
    partition the target gives a member that does not own it, while *another* member still
    lists it as owned (whatever that member's generation), is left out of this round: its old
    owner's assignment no longer has it, so the old owner revokes it and rejoins, and the next
    rebalance, where nobody owns it any more, gives it to its new member. So no partition is
    ever assigned to a member while another member may still be consuming it, and a rebalance
    that moves partitions settles in two rounds. A partition two members claim in the same
    (highest) generation is withheld from everyone, its claimants too, as Kafka does.
    """

    name = "cooperative-sticky"
    supported_protocols = (RebalanceProtocol.COOPERATIVE, RebalanceProtocol.EAGER)

    def assign(
        self, partitions_per_topic: Mapping[str, int], subscriptions: Mapping[str, Subscription]
    ) -> dict[str, Assignment]:
        claims = {
            member: (subscription.owned_partitions, subscription.generation_id)
            for member, subscription in subscriptions.items()
        }
        target = sticky_assignment(partitions_per_topic, subscriptions, claims)
        owners: dict[TopicPartitionKey, set[str]] = {}
        claimed_in: dict[TopicPartitionKey, list[int]] = {}
        for member, subscription in subscriptions.items():
            for tp in subscription.owned_partitions:
                owners.setdefault(tp, set()).add(member)
                claimed_in.setdefault(tp, []).append(subscription.generation_id)
        # Claimed by several members of the highest generation claiming it: any of them
        # may be consuming it, so it goes to none this round (Kafka's
        # partitionsWithMultiplePreviousOwners).
        contested = {tp for tp, gens in claimed_in.items() if gens.count(max(gens)) > 1}
        # A partition is withheld when the member did not own it and someone else does.
        return {
            member: Assignment(
                tuple(
                    tp
                    for tp in assignment.partitions
                    if member in owners.get(tp, {member}) and tp not in contested
                )
            )
            for member, assignment in target.items()
        }


#: The built-in assignors by name, as ``partition.assignment.strategy`` names them.
ASSIGNORS: Mapping[str, type[ConsumerPartitionAssignor]] = {
    cls.name: cls
    for cls in (RangeAssignor, RoundRobinAssignor, StickyAssignor, CooperativeStickyAssignor)
}


def assignor_for(name: str) -> ConsumerPartitionAssignor:
    """A new built-in assignor by protocol name; ``ValueError`` for an unknown name."""
    try:
        return ASSIGNORS[name]()
    except KeyError:
        raise ValueError(
            f"unknown partition assignor {name!r}; known: {', '.join(sorted(ASSIGNORS))}"
        ) from None


def select_rebalance_protocol(
    assignors: Sequence[ConsumerPartitionAssignor],
) -> RebalanceProtocol:
    """The rebalance protocol a consumer configured with ``assignors`` runs (Kafka's rule).

    The most advanced protocol (cooperative over eager) that every configured assignor
    supports; ``ValueError`` when they share none or none is configured.
    """
    if not assignors:
        raise ValueError("no partition assignor configured")
    common = set(assignors[0].supported_protocols)
    for assignor in assignors[1:]:
        common &= set(assignor.supported_protocols)
    for protocol in (RebalanceProtocol.COOPERATIVE, RebalanceProtocol.EAGER):
        if protocol in common:
            return protocol
    names = ", ".join(a.name for a in assignors)
    raise ValueError(f"the assignors {names} support no rebalance protocol in common")


def assign_group(
    assignor: ConsumerPartitionAssignor,
    partitions_per_topic: Mapping[str, int],
    group: GroupSubscription,
    protocol: RebalanceProtocol,
) -> dict[str, Assignment]:
    """The group leader's assignment step: every member's assignment, checked.

    Runs ``assignor`` over the decodable subscriptions and checks its result: no unknown
    member, no partition that does not exist or is assigned twice, and under the cooperative
    protocol no partition handed to one member while another still owns it (Kafka's
    ``validateCooperativeAssignment``); a violation raises :class:`AssignmentError`, a bug in
    the assignor. Members missing from the result, and members whose metadata was malformed,
    get an empty assignment. (Under the cooperative protocol a malformed member's owned
    partitions are unknown; it revokes them all when it gets its empty assignment.)
    """
    result = assignor.assign(partitions_per_topic, group.subscriptions)
    unknown = sorted(set(result) - set(group.subscriptions))
    if unknown:
        raise AssignmentError(f"assignor {assignor.name} assigned to unknown members {unknown}")
    holder: dict[TopicPartitionKey, str] = {}
    for member, assignment in result.items():
        for tp in assignment.partitions:
            topic, partition = tp
            if not 0 <= partition < partitions_per_topic.get(topic, 0):
                raise AssignmentError(
                    f"assignor {assignor.name} assigned {topic}-{partition}, which does not exist"
                )
            if tp in holder:
                raise AssignmentError(
                    f"assignor {assignor.name} assigned {topic}-{partition} to both "
                    f"{holder[tp]} and {member}"
                )
            holder[tp] = member
    if protocol is RebalanceProtocol.COOPERATIVE:
        for member, subscription in group.subscriptions.items():
            for tp in subscription.owned_partitions:
                new_member = holder.get(tp)
                if (
                    new_member is not None
                    and new_member != member
                    and tp not in group.subscriptions[new_member].owned_partitions
                ):
                    raise AssignmentError(
                        f"assignor {assignor.name} gave {tp[0]}-{tp[1]} to {new_member} while "
                        f"{member} still owns it, which the cooperative protocol forbids"
                    )
    members = [*group.subscriptions, *group.malformed]
    return {m: result.get(m, Assignment(())) for m in members}
