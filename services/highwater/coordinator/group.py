"""One consumer group's state: its members, generation, chosen protocol and committed offsets.

These are the values the pure :class:`~highwater.coordinator.core.GroupCoordinatorCore`
reads and changes; they hold no I/O and make no decisions about timing beyond the
deadlines stored in them. A group moves through Kafka's states:

``Empty``
    No members (a group that only holds committed offsets, or whose members all left).
``PreparingRebalance``
    A rebalance has begun: the coordinator waits for every member to (re)join, at most
    the largest ``rebalance.timeout.ms`` of its members.
``CompletingRebalance``
    Every member has joined the new generation; the coordinator waits for the leader's
    assignment in SyncGroup.
``Stable``
    The assignment is in force; members heartbeat.
``Dead``
    The group is being removed (deleted, or its partition moved to another coordinator).
"""

from __future__ import annotations

import enum
from collections.abc import Hashable, Iterator
from dataclasses import dataclass, field

from highwater.storage.topic_partition import TopicPartition

Token = Hashable
"""An opaque handle of a request awaiting its answer; the service edge maps it to a call."""


class GroupState(enum.Enum):
    """Kafka's classic group states, named as ``kafka-consumer-groups --describe`` prints them."""

    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


@dataclass(frozen=True, slots=True)
class Protocol:
    """One assignor a member supports, and its subscription in that assignor's format."""

    name: str
    metadata: bytes


@dataclass(frozen=True, slots=True)
class CommittedOffset:
    """Kafka's ``OffsetAndMetadata`` as stored: the next offset to consume."""

    offset: int
    leader_epoch: int
    metadata: str
    commit_timestamp: int


@dataclass(slots=True)
class Member:
    """A member of a group as the coordinator knows it."""

    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: tuple[Protocol, ...]
    assignment: bytes = b""
    previous_assignment: bytes = b""
    """The assignment of the generation before: a member may still commit those partitions
    while it gives them up."""
    join_token: Token | None = None
    """The member's JoinGroup awaiting the end of the join phase."""
    sync_token: Token | None = None
    """The member's SyncGroup awaiting the leader's assignment."""
    synced: bool = False
    """Whether the member sent SyncGroup in the current generation."""
    heartbeat_deadline: int = 0
    """When the member's session expires unless it is heard from (ms)."""

    @property
    def is_static(self) -> bool:
        return self.group_instance_id is not None

    @property
    def awaiting_join(self) -> bool:
        return self.join_token is not None

    @property
    def awaiting_sync(self) -> bool:
        return self.sync_token is not None

    @property
    def session_may_expire(self) -> bool:
        """A member waiting in JoinGroup or SyncGroup cannot heartbeat, and is kept alive
        (Kafka's ``hasSatisfiedHeartbeat``); its session counts again from the answer."""
        return not (self.awaiting_join or self.awaiting_sync)

    def metadata_for(self, protocol_name: str) -> bytes:
        for protocol in self.protocols:
            if protocol.name == protocol_name:
                return protocol.metadata
        raise KeyError(f"member {self.member_id} does not support protocol {protocol_name!r}")

    def vote(self, candidates: set[str]) -> str:
        """The member's most preferred protocol among ``candidates``."""
        return next(p.name for p in self.protocols if p.name in candidates)


@dataclass(slots=True)
class Group:
    """A consumer group (see the module docstring for its states)."""

    group_id: str
    state: GroupState = GroupState.EMPTY
    generation_id: int = 0
    protocol_type: str | None = None
    """None for a group that only commits offsets (Kafka's "simple" consumers)."""
    protocol_name: str | None = None
    leader_id: str | None = None
    members: dict[str, Member] = field(default_factory=dict)
    static_members: dict[str, str] = field(default_factory=dict)
    """group.instance.id → the member id that currently holds it."""
    pending_members: dict[str, int] = field(default_factory=dict)
    """Member ids handed out with MEMBER_ID_REQUIRED → when they lapse unless used (ms): a
    session timeout after they were handed out, whatever rebalances happen meanwhile. They
    are not members (``group.max.size`` does not count them), but a join phase waits for
    them as for members."""
    offsets: dict[TopicPartition, CommittedOffset] = field(default_factory=dict)
    pending_commits: dict[TopicPartition, int] = field(default_factory=dict)
    """Partitions with commits being appended → how many: their offsets do not expire,
    nor does the group go, until they are answered (a tombstone appended after such a
    commit would erase an acknowledged offset)."""
    state_timestamp: int = 0
    """When the group entered its current state (ms); offsets of an Empty group expire
    ``offsets.retention.minutes`` after it."""
    join_deadline: int | None = None
    """PreparingRebalance: when the join phase ends, whoever has rejoined by then."""
    initial_delay_remaining_ms: int = 0
    """During the first rebalance of an empty group: how much longer the join phase may be
    extended by members still arriving (``group.initial.rebalance.delay.ms``)."""
    in_initial_delay: bool = False
    new_member_added: bool = False
    """Whether a member joined since the last initial delay began."""
    rebalance_started: int = 0
    """When the current (or last) rebalance's join phase began."""
    sync_deadline: int | None = None
    """CompletingRebalance: members that have not sent SyncGroup by then are removed."""
    assignment_write: int | None = None
    """The id of the write persisting the leader's assignment, while it is in flight."""

    # -- membership ------------------------------------------------------------------------

    def is_in(self, *states: GroupState) -> bool:
        return self.state in states

    def transition(self, state: GroupState, now: int) -> None:
        self.state = state
        self.state_timestamp = now

    def add_member(self, member: Member) -> None:
        """Add ``member``; the first member of a group without members sets its protocol
        type (an Empty group forgets the one its former members had)."""
        if not self.members:
            self.protocol_type = member.protocol_type
        self.members[member.member_id] = member
        if member.group_instance_id is not None:
            self.static_members[member.group_instance_id] = member.member_id
        if self.leader_id is None:
            self.leader_id = member.member_id

    def remove_member(self, member_id: str) -> Member | None:
        member = self.members.pop(member_id, None)
        if member is None:
            return None
        instance_id = member.group_instance_id
        if instance_id is not None and self.static_members.get(instance_id) == member_id:
            del self.static_members[instance_id]
        if self.leader_id == member_id:
            self.leader_id = next(iter(self.members), None)
        return member

    def replace_static_member(self, instance_id: str, new_member_id: str) -> Member:
        """Give a static member's place (and assignment) to its new member id."""
        old_id = self.static_members[instance_id]
        member = self.members.pop(old_id)
        member.member_id = new_member_id
        self.members[new_member_id] = member
        self.static_members[instance_id] = new_member_id
        if self.leader_id == old_id:
            self.leader_id = new_member_id
        return member

    def awaiting_join_count(self) -> int:
        return sum(1 for m in self.members.values() if m.awaiting_join)

    def has_all_members_joined(self) -> bool:
        return not self.pending_members and all(m.awaiting_join for m in self.members.values())

    def candidate_protocols(self) -> set[str]:
        """The protocols every member supports."""
        members = iter(self.members.values())
        first = next(members, None)
        if first is None:
            return set()
        candidates = {p.name for p in first.protocols}
        for member in members:
            candidates &= {p.name for p in member.protocols}
        return candidates

    def supports(self, protocol_type: str, protocols: tuple[Protocol, ...]) -> bool:
        """Whether a member with these protocols may join (Kafka's ``supportsProtocols``):
        any member may join an Empty group, whatever protocol type its former members had;
        otherwise the member must have the group's protocol type and a protocol every
        member supports."""
        if not protocols or not protocol_type:
            return False
        if self.is_in(GroupState.EMPTY):
            return True
        if self.protocol_type != protocol_type:
            return False
        return not self.members or bool(self.candidate_protocols() & {p.name for p in protocols})

    def select_protocol(self) -> str:
        """The candidate protocol most members prefer (ties: the leader's preference)."""
        candidates = self.candidate_protocols()
        votes: dict[str, int] = dict.fromkeys(candidates, 0)
        for member in self.members.values():
            votes[member.vote(candidates)] += 1
        leader = self.members.get(self.leader_id or "")
        order = [p.name for p in leader.protocols] if leader else sorted(candidates)
        rank = {name: i for i, name in enumerate(order)}
        return max(candidates, key=lambda name: (votes[name], -rank.get(name, len(rank))))

    def max_rebalance_timeout_ms(self) -> int:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    def all_member_ids(self) -> Iterator[str]:
        return iter(self.members)
