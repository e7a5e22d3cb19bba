"""The group coordinator's pure core: membership, rebalances and offsets of the groups it owns.

Kafka's classic group protocol (chapter 5 of the storage/replication/producer/consumer
seed), with no I/O inside: every call takes the current time in milliseconds and
returns effects for the service edge to carry out.

- :class:`Reply` answers a request that waited (JoinGroup until the join phase ends,
  SyncGroup until the leader's assignment is stored, OffsetCommit until its records are
  appended). Requests are named by opaque tokens the edge chooses.
- :class:`Write` appends records to a partition of ``__consumer_offsets``; the edge calls
  :meth:`GroupCoordinatorCore.write_completed` with its outcome, and only then does the
  core change its state or answer.

A rebalance: a member joins (or one leaves, or a session expires) → ``PreparingRebalance``;
every member known rejoins, or the rebalance timeout passes and those that did not are
removed → a new generation, a protocol every member supports, a leader, and every JoinGroup
answered (the leader's with all members' subscriptions) → ``CompletingRebalance``; the
leader's SyncGroup brings the assignment, which is written to ``__consumer_offsets`` →
every SyncGroup answered with the member's share → ``Stable``. A first join without a
member id gets MEMBER_ID_REQUIRED and an id to join with (KIP-394); a static member
(``group.instance.id``, KIP-345) that restarts takes its old place and assignment back
without a rebalance.

A group belongs to the coordinator that owns its partition of ``__consumer_offsets``;
requests for groups of other partitions get NOT_COORDINATOR, for partitions being
loaded COORDINATOR_LOAD_IN_PROGRESS (a Heartbeat NONE, as Kafka answers it).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from google.protobuf.message import DecodeError

from highwater.coordinator.group import (
    CommittedOffset,
    Group,
    GroupState,
    Member,
    Protocol,
    Token,
)
from highwater.coordinator.records import (
    KeyValue,
    OffsetsRecord,
    encode_group_metadata,
    encode_group_tombstone,
    encode_offset_commit,
    encode_offset_tombstone,
    restore_groups,
)
from highwater.coordinator.subscriptions import subscribed_topics
from highwater.storage.topic_partition import TopicPartition
from highwater.v1.common_pb2 import ErrorCode
from highwater.v1.consumer_protocol_pb2 import ConsumerProtocolAssignment

NONE: Final = ErrorCode.NONE
CONSUMER_PROTOCOL_TYPE: Final = "consumer"
"""Groups of this protocol type carry subscriptions the coordinator reads for OffsetDelete and
offset expiry (:mod:`.subscriptions`: Highwater's or Kafka's encoding), and, from Highwater's
consumers, consumer_protocol.proto assignments it reads to refuse commits for partitions a
member was not assigned."""
NO_GENERATION: Final = -1
EMPTY, PREPARING, COMPLETING, STABLE, DEAD = (
    GroupState.EMPTY,
    GroupState.PREPARING_REBALANCE,
    GroupState.COMPLETING_REBALANCE,
    GroupState.STABLE,
    GroupState.DEAD,
)


@dataclass(frozen=True, slots=True)
class GroupCoordinatorSettings:
    """The coordinator's settings, with Kafka's names and defaults."""

    group_min_session_timeout_ms: int = 6_000
    """``group.min.session.timeout.ms``."""
    group_max_session_timeout_ms: int = 1_800_000
    """``group.max.session.timeout.ms``."""
    group_initial_rebalance_delay_ms: int = 3_000
    """``group.initial.rebalance.delay.ms``: how long the first rebalance of an empty
    group waits for more members (0 in Kafka's development config, as here in
    ``highwater server`` and ``dev-cluster``)."""
    group_max_size: int = 2**31 - 1
    """``group.max.size``."""
    offsets_retention_ms: int = 7 * 24 * 3_600_000
    """``offsets.retention.minutes`` (in ms): offsets of a group empty this long expire."""
    offsets_retention_check_interval_ms: int = 600_000
    """``offsets.retention.check.interval.ms``."""
    offset_metadata_max_bytes: int = 4096
    """``offset.metadata.max.bytes``."""
    max_protocol_metadata_bytes: int = 1024 * 1024
    """The largest subscription or assignment a member may send (oversized: INVALID_REQUEST)."""


# --- Effects and results -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Reply:
    """Answer the request named by ``token``."""

    token: Token
    result: object


@dataclass(frozen=True, slots=True)
class Write:
    """Append ``records`` to partition ``partition`` of ``__consumer_offsets``; report the
    outcome with :meth:`GroupCoordinatorCore.write_completed` (``write_id``)."""

    write_id: int
    partition: int
    records: tuple[KeyValue, ...]


@dataclass(frozen=True, slots=True)
class RebalanceCompleted:
    """A rebalance of ``group_id`` ended in a stable ``generation`` after ``duration_ms``
    (from the join phase's start to the assignment's delivery): for the operator's metrics."""

    group_id: str
    generation: int
    duration_ms: int


Effect = Reply | Write | RebalanceCompleted


@dataclass(frozen=True, slots=True)
class JoinedMember:
    member_id: str
    group_instance_id: str | None
    metadata: bytes


@dataclass(frozen=True, slots=True)
class JoinResult:
    error: int = NONE
    error_message: str = ""
    generation_id: int = NO_GENERATION
    protocol_type: str = ""
    protocol_name: str = ""
    leader: str = ""
    member_id: str = ""
    members: tuple[JoinedMember, ...] = ()
    skip_assignment: bool = False


@dataclass(frozen=True, slots=True)
class SyncResult:
    error: int = NONE
    error_message: str = ""
    protocol_type: str = ""
    protocol_name: str = ""
    assignment: bytes = b""


@dataclass(frozen=True, slots=True)
class Outcome:
    """The answer to a request that did not wait (Heartbeat, one member of a LeaveGroup)."""

    error: int = NONE
    error_message: str = ""


@dataclass(frozen=True, slots=True)
class OffsetToCommit:
    topic_partition: TopicPartition
    offset: int
    leader_epoch: int = -1
    metadata: str = ""


@dataclass(frozen=True, slots=True)
class CommitResult:
    """Per-partition errors of an OffsetCommit (NONE where it was stored)."""

    errors: Mapping[TopicPartition, Outcome]


@dataclass(frozen=True, slots=True)
class FetchedOffset:
    offset: int = -1
    leader_epoch: int = -1
    metadata: str = ""
    error: int = NONE


@dataclass(frozen=True, slots=True)
class GroupListing:
    group_id: str
    protocol_type: str
    state: GroupState


@dataclass(frozen=True, slots=True)
class MemberDescription:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    metadata: bytes
    assignment: bytes


@dataclass(frozen=True, slots=True)
class GroupDescription:
    group_id: str
    error: int = NONE
    error_message: str = ""
    state: GroupState = DEAD
    protocol_type: str = ""
    protocol_name: str = ""
    generation_id: int = NO_GENERATION
    leader: str = ""
    members: tuple[MemberDescription, ...] = ()


@dataclass(frozen=True, slots=True)
class DeleteResult:
    errors: Mapping[str, Outcome]


@dataclass(frozen=True, slots=True)
class OffsetDeleteResult:
    """OffsetDelete's answer: the group's outcome, then each partition's."""

    error: Outcome
    partitions: Mapping[TopicPartition, Outcome]


@dataclass(frozen=True, slots=True)
class JoinRequest:
    group_id: str
    member_id: str
    group_instance_id: str | None
    protocol_type: str
    protocols: tuple[Protocol, ...]
    session_timeout_ms: int
    rebalance_timeout_ms: int
    client_id: str = ""
    client_host: str = ""


@dataclass(frozen=True, slots=True)
class SyncRequest:
    group_id: str
    generation_id: int
    member_id: str
    group_instance_id: str | None = None
    protocol_type: str = ""
    protocol_name: str = ""
    assignments: Mapping[str, bytes] = field(default_factory=dict)


class _Refused(Exception):
    """A request that cannot be served; carries the error to answer with."""

    def __init__(self, error: int, message: str = "") -> None:
        super().__init__(message)
        self.error = error
        self.message = message


# --- The core ------------------------------------------------------------------------------


@dataclass(slots=True)
class _PendingWrite:
    partition: int
    on_done: Callable[[int, int], list[Effect]]
    """(error, now) → effects, called once the write succeeded (NONE) or failed."""


class GroupCoordinatorCore:
    """The groups of the ``__consumer_offsets`` partitions this coordinator owns."""

    def __init__(
        self,
        settings: GroupCoordinatorSettings,
        partition_for: Callable[[str], int],
        *,
        new_member_id: Callable[[str], str] | None = None,
        partition_exists: Callable[[TopicPartition], bool] | None = None,
    ) -> None:
        """``partition_for``: the partition of ``__consumer_offsets`` a group id belongs to;
        ``partition_exists``: whether the metadata image has a topic partition (OffsetCommit
        answers UNKNOWN_TOPIC_OR_PARTITION for one it has not, as Kafka's
        ``handleOffsetCommitRequest``); without an image, every partition of a named topic
        with an index of 0 or more exists."""
        self.settings = settings
        self.partition_for = partition_for
        self.partition_exists = partition_exists or _named_partition
        self._new_member_id = new_member_id or _random_member_id
        self.groups: dict[str, Group] = {}
        self.owned: dict[int, int] = {}
        """Partitions served → the coordinator epoch they were loaded with."""
        self.loading: set[int] = set()
        self._writes: dict[int, _PendingWrite] = {}
        self._next_write_id = 0
        self._next_expiry_check: int | None = None

    # -- partitions -------------------------------------------------------------------------

    def begin_loading(self, partition: int) -> None:
        """The partition was assigned to this coordinator; requests wait until it loads."""
        self.loading.add(partition)

    def load(
        self, partition: int, coordinator_epoch: int, records: Iterable[OffsetsRecord], now: int
    ) -> None:
        """Serve ``partition`` from the state its records (in log order) describe."""
        self.loading.discard(partition)
        self.owned[partition] = coordinator_epoch
        for group_id, group in restore_groups(records, now).items():
            if self.partition_for(group_id) == partition:
                self.groups[group_id] = group
        if self._next_expiry_check is None:
            self._next_expiry_check = now + self.settings.offsets_retention_check_interval_ms

    def unload(self, partition: int) -> list[Effect]:
        """Stop serving ``partition`` (it moved away, or this coordinator was fenced).

        Waiting requests of its groups are answered NOT_COORDINATOR, those waiting on a
        write too (whether it was appended or not, the new owner replays what was).
        """
        self.loading.discard(partition)
        self.owned.pop(partition, None)
        effects: list[Effect] = []
        for group_id in [g for g in self.groups if self.partition_for(g) == partition]:
            group = self.groups.pop(group_id)
            group.transition(DEAD, group.state_timestamp)
            for member in group.members.values():
                if member.join_token is not None:
                    effects.append(Reply(member.join_token, JoinResult(ErrorCode.NOT_COORDINATOR)))
                if member.sync_token is not None:
                    effects.append(Reply(member.sync_token, SyncResult(ErrorCode.NOT_COORDINATOR)))
        for write_id in [w for w, p in self._writes.items() if p.partition == partition]:
            effects += self._writes.pop(write_id).on_done(ErrorCode.NOT_COORDINATOR, 0)
        return effects

    @staticmethod
    def _check_group_id(group_id: str) -> None:
        """JoinGroup, SyncGroup, Heartbeat, LeaveGroup and OffsetDelete refuse the empty group
        id (Kafka's ``isGroupIdNotEmpty``); OffsetCommit, OffsetFetch, DescribeGroups and
        DeleteGroups serve it like any other, as Kafka does "for backwards compatibility"."""
        if not group_id:
            raise _Refused(ErrorCode.INVALID_GROUP_ID, "the group id is empty")

    def _check_owner(self, group_id: str) -> int:
        partition = self.partition_for(group_id)
        if partition in self.loading:
            raise _Refused(
                ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
                f"partition {partition} of __consumer_offsets is being loaded",
            )
        if partition not in self.owned:
            raise _Refused(
                ErrorCode.NOT_COORDINATOR,
                f"group {group_id!r} (partition {partition}) is not served here",
            )
        return partition

    # -- JoinGroup --------------------------------------------------------------------------

    def join_group(self, token: Token, request: JoinRequest, now: int) -> list[Effect]:
        try:
            return self._join(token, request, now)
        except _Refused as e:
            return [Reply(token, JoinResult(e.error, e.message, member_id=request.member_id))]

    def _join(self, token: Token, request: JoinRequest, now: int) -> list[Effect]:
        self._check_group_id(request.group_id)
        self._check_owner(request.group_id)
        settings = self.settings
        if not (
            settings.group_min_session_timeout_ms
            <= request.session_timeout_ms
            <= settings.group_max_session_timeout_ms
        ):
            raise _Refused(
                ErrorCode.INVALID_SESSION_TIMEOUT,
                f"session.timeout.ms {request.session_timeout_ms} is outside "
                f"[{settings.group_min_session_timeout_ms}, "
                f"{settings.group_max_session_timeout_ms}]",
            )
        if request.rebalance_timeout_ms <= 0:
            raise _Refused(ErrorCode.INVALID_REQUEST, "rebalance_timeout_ms must be positive")
        if any(len(p.metadata) > settings.max_protocol_metadata_bytes for p in request.protocols):
            raise _Refused(
                ErrorCode.INVALID_REQUEST,
                f"protocol metadata larger than {settings.max_protocol_metadata_bytes} bytes",
            )
        if len({p.name for p in request.protocols}) != len(request.protocols):
            raise _Refused(ErrorCode.INCONSISTENT_GROUP_PROTOCOL, "a protocol is named twice")
        group = self.groups.get(request.group_id)
        if group is None:
            if request.member_id:
                raise _Refused(ErrorCode.UNKNOWN_MEMBER_ID, "the group does not exist")
            group = Group(request.group_id, state_timestamp=now)
            self.groups[request.group_id] = group
        if group.is_in(DEAD):
            raise _Refused(ErrorCode.COORDINATOR_NOT_AVAILABLE, "the group is being removed")
        if not self._accepts_joining_member(group, request.member_id):
            # Kafka drops the refused member id: a pending id, or a member that had not
            # rejoined yet (PreparingRebalance), which the rebalance then goes on without.
            group.pending_members.pop(request.member_id, None)
            effects: list[Effect] = []
            if request.member_id in group.members:
                effects += self._remove_member_and_rebalance(group, request.member_id, now)
            full = JoinResult(
                ErrorCode.GROUP_MAX_SIZE_REACHED,
                f"the group has group.max.size ({self.settings.group_max_size}) members",
            )
            return [*effects, Reply(token, full)]
        if not group.supports(request.protocol_type, request.protocols):
            raise _Refused(
                ErrorCode.INCONSISTENT_GROUP_PROTOCOL,
                "the member's protocol type or protocols do not match the group's",
            )
        if not request.member_id:
            return self._join_unknown_member(token, group, request, now)
        return self._join_known_member(token, group, request, now)

    def _accepts_joining_member(self, group: Group, member_id: str) -> bool:
        """Whether ``group.max.size`` lets a JoinGroup in (Kafka's ``acceptJoiningMember``).

        Member ids handed out with MEMBER_ID_REQUIRED are not members and do not count, so a
        first join sent again (its answer lost) is not refused. An Empty group takes every
        join. In PreparingRebalance a member already waiting to rejoin is in, and others
        while fewer than the maximum are waiting (not the number of members: that may be
        over a lowered maximum, and this way the last to rejoin are the ones left out). In
        CompletingRebalance and Stable a member is in, and others (a restarting static
        member too: it joins without a member id) while the group has fewer members than the
        maximum.
        """
        limit = self.settings.group_max_size
        if group.is_in(EMPTY, DEAD):
            return True
        member = group.members.get(member_id)
        if group.is_in(PREPARING):
            return (member is not None and member.awaiting_join) or (
                group.awaiting_join_count() < limit
            )
        return member is not None or len(group.members) < limit

    def _join_unknown_member(
        self, token: Token, group: Group, request: JoinRequest, now: int
    ) -> list[Effect]:
        member_id = self._new_member_id(request.group_instance_id or request.client_id)
        instance_id = request.group_instance_id
        if instance_id is not None and instance_id in group.static_members:
            return self._rejoin_static_member(token, group, request, member_id, now)
        if instance_id is not None:
            return self._add_member_and_rebalance(token, group, request, member_id, now)
        group.pending_members[member_id] = now + request.session_timeout_ms
        result = JoinResult(
            ErrorCode.MEMBER_ID_REQUIRED,
            "join again with the member id given",
            member_id=member_id,
        )
        return [Reply(token, result)]

    def _rejoin_static_member(
        self, token: Token, group: Group, request: JoinRequest, member_id: str, now: int
    ) -> list[Effect]:
        """A static member restarted: it takes its place back under a new member id."""
        assert request.group_instance_id is not None
        old_id = group.static_members[request.group_instance_id]
        old = group.members[old_id]
        effects: list[Effect] = []
        for pending in (old.join_token, old.sync_token):
            if pending is not None:
                fenced = ErrorCode.FENCED_INSTANCE_ID
                reply = JoinResult(fenced) if pending is old.join_token else SyncResult(fenced)
                effects.append(Reply(pending, reply))
        old.join_token = old.sync_token = None
        old_protocols = old.protocols
        old_timeouts = old.session_timeout_ms, old.rebalance_timeout_ms
        member = group.replace_static_member(request.group_instance_id, member_id)
        member.client_id, member.client_host = request.client_id, request.client_host
        member.session_timeout_ms = request.session_timeout_ms
        member.rebalance_timeout_ms = request.rebalance_timeout_ms
        member.heartbeat_deadline = now + request.session_timeout_ms
        member.protocols = request.protocols
        if group.is_in(STABLE) and group.select_protocol() == group.protocol_name:
            # The group's protocol stays: the assignment stands (KIP-345), even if the
            # member's metadata changed (Kafka's updateStaticMemberThenRebalanceOrCompleteJoin:
            # a consumer whose assignment no longer matches its subscription rejoins itself);
            # the leader must not assign again (KIP-814). The new member id and metadata are
            # persisted as the old ones were.
            result = self._join_result(group, member, skip_assignment=True)

            def done(error: int, done_at: int) -> list[Effect]:
                if error != NONE:
                    # As Kafka does: the log never recorded the new member id, so the old one
                    # keeps the instance's place (and is not fenced) while the group is stable,
                    # and the reply gives no member id (a rejoin with it would be fenced).
                    instance_id = member.group_instance_id
                    if (
                        instance_id is not None
                        and group.is_in(STABLE)
                        and group.static_members.get(instance_id) == member_id
                    ):
                        reverted = group.replace_static_member(instance_id, old_id)
                        reverted.protocols = old_protocols
                        reverted.session_timeout_ms, reverted.rebalance_timeout_ms = old_timeouts
                        reverted.heartbeat_deadline = done_at + reverted.session_timeout_ms
                        return [Reply(token, JoinResult(_write_error(error)))]
                    return [Reply(token, JoinResult(_write_error(error), member_id=member_id))]
                return [Reply(token, result)]

            effects.append(self._write(group, (encode_group_metadata(group),), done))
            return effects
        # The group's protocol would change (Stable), or an assignment may already name the
        # old member id (CompletingRebalance): rebalance; in PreparingRebalance, join it.
        member.join_token = token
        effects += self._prepare_rebalance(group, now)
        effects += self._maybe_complete_join(group, now)
        return effects

    def _join_known_member(
        self, token: Token, group: Group, request: JoinRequest, now: int
    ) -> list[Effect]:
        member_id = request.member_id
        if member_id in group.pending_members:
            if request.group_instance_id is not None:
                # Ids are handed out pending to dynamic members only; Kafka refuses the
                # request as an illegal state (answered UNKNOWN_SERVER_ERROR).
                raise _Refused(
                    ErrorCode.UNKNOWN_SERVER_ERROR,
                    f"pending member {member_id!r} cannot join as a static member",
                )
            del group.pending_members[member_id]
            return self._add_member_and_rebalance(token, group, request, member_id, now)
        member = _validate_member(group, member_id, request.group_instance_id)
        member.heartbeat_deadline = now + request.session_timeout_ms
        changed = member.protocols != request.protocols
        effects: list[Effect] = []
        if group.is_in(PREPARING):
            if member.join_token is not None:
                superseded = JoinResult(ErrorCode.REBALANCE_IN_PROGRESS, "superseded by a rejoin")
                effects.append(Reply(member.join_token, superseded))
            self._update_member(member, request, token)
            return effects + self._maybe_complete_join(group, now)
        if group.is_in(COMPLETING) and not changed:
            # The member missed the answer to its join: give it again.
            return [Reply(token, self._join_result(group, member))]
        if group.is_in(STABLE) and not changed and member_id != group.leader_id:
            return [Reply(token, self._join_result(group, member))]
        # A changed subscription, or the leader asking for a new assignment: rebalance.
        self._update_member(member, request, token)
        effects += self._prepare_rebalance(group, now)
        return effects + self._maybe_complete_join(group, now)

    def _update_member(self, member: Member, request: JoinRequest, token: Token) -> None:
        member.protocols = request.protocols
        member.session_timeout_ms = request.session_timeout_ms
        member.rebalance_timeout_ms = request.rebalance_timeout_ms
        member.client_id = request.client_id or member.client_id
        member.client_host = request.client_host or member.client_host
        member.join_token = token

    def _add_member_and_rebalance(
        self, token: Token, group: Group, request: JoinRequest, member_id: str, now: int
    ) -> list[Effect]:
        member = Member(
            member_id=member_id,
            group_instance_id=request.group_instance_id,
            client_id=request.client_id,
            client_host=request.client_host,
            session_timeout_ms=request.session_timeout_ms,
            rebalance_timeout_ms=request.rebalance_timeout_ms,
            protocol_type=request.protocol_type,
            protocols=request.protocols,
            join_token=token,
            heartbeat_deadline=now + request.session_timeout_ms,
        )
        group.add_member(member)
        group.new_member_added = True
        effects = self._prepare_rebalance(group, now)
        return effects + self._maybe_complete_join(group, now)

    def _join_result(
        self, group: Group, member: Member, *, skip_assignment: bool = False
    ) -> JoinResult:
        assert group.protocol_name is not None and group.protocol_type is not None
        members: tuple[JoinedMember, ...] = ()
        if member.member_id == group.leader_id:
            members = tuple(
                JoinedMember(m.member_id, m.group_instance_id, m.metadata_for(group.protocol_name))
                for m in group.members.values()
            )
        return JoinResult(
            generation_id=group.generation_id,
            protocol_type=group.protocol_type,
            protocol_name=group.protocol_name,
            leader=group.leader_id or "",
            member_id=member.member_id,
            members=members,
            skip_assignment=skip_assignment and member.member_id == group.leader_id,
        )

    # -- the rebalance ----------------------------------------------------------------------

    def _prepare_rebalance(self, group: Group, now: int) -> list[Effect]:
        """Begin (or keep) the join phase of a rebalance."""
        if group.is_in(PREPARING):
            return []
        effects: list[Effect] = []
        if group.is_in(COMPLETING):
            # The assignment of the generation being completed will never come into force:
            # what a member owned before it stays what it may still commit.
            for member in group.members.values():
                member.assignment = member.previous_assignment
                if member.sync_token is not None:
                    result = SyncResult(ErrorCode.REBALANCE_IN_PROGRESS, "a new rebalance began")
                    effects.append(Reply(member.sync_token, result))
                    member.sync_token = None
                    member.heartbeat_deadline = now + member.session_timeout_ms
            group.assignment_write = None
            group.sync_deadline = None
        was_empty = group.is_in(EMPTY)
        if not group.is_in(COMPLETING):
            group.rebalance_started = now
        group.transition(PREPARING, now)
        rebalance_timeout = group.max_rebalance_timeout_ms()
        delay = self.settings.group_initial_rebalance_delay_ms
        if was_empty and delay > 0:
            group.in_initial_delay = True
            group.new_member_added = False
            first = min(delay, rebalance_timeout)
            group.initial_delay_remaining_ms = rebalance_timeout - first
            group.join_deadline = now + first
        else:
            group.in_initial_delay = False
            group.join_deadline = now + rebalance_timeout
        return effects

    def _maybe_complete_join(self, group: Group, now: int) -> list[Effect]:
        if group.is_in(PREPARING) and not group.in_initial_delay and group.has_all_members_joined():
            return self._complete_join(group, now)
        return []

    def _complete_join(self, group: Group, now: int) -> list[Effect]:
        """End the join phase: drop the dynamic members that did not rejoin, open the next
        generation.

        A static member that did not rejoin keeps its place, as in Kafka's
        ``onCompleteJoin``: it is in the leader's member list (and gets a share of the
        assignment), and it goes when its session, counted from its last heartbeat, ends
        or it never syncs. Its
        JoinGroup comes later, as a known member's, and gets this generation. When no
        member at all rejoined (only such static members are left), no generation can
        form: the join phase waits another rebalance timeout for them or their sessions.

        Member ids handed out with MEMBER_ID_REQUIRED stay pending: one joins with its id
        later (and starts another rebalance) or lapses after its session timeout, as Kafka
        keeps ``pendingJoinMembers`` across generations.
        """
        effects: list[Effect] = []
        for member in [m for m in group.members.values() if not m.awaiting_join]:
            if not member.is_static:
                group.remove_member(member.member_id)
        joined = [m.member_id for m in group.members.values() if m.awaiting_join]
        if group.members and not joined:
            group.in_initial_delay = False
            group.join_deadline = now + group.max_rebalance_timeout_ms()
            return effects
        group.join_deadline = None
        group.in_initial_delay = False
        group.generation_id += 1
        if not group.members:
            group.protocol_name = None
            group.transition(EMPTY, now)
            return effects + self._persist_empty_group(group)
        group.protocol_name = group.select_protocol()
        if group.leader_id not in joined:
            group.leader_id = joined[0]
        group.transition(COMPLETING, now)
        group.sync_deadline = now + group.max_rebalance_timeout_ms()
        for member in group.members.values():
            if member.join_token is not None:
                effects.append(Reply(member.join_token, self._join_result(group, member)))
                # Its session counts again from the answer. A static member that did not
                # rejoin keeps the session it had: where Kafka starts every member's again
                # here, a silent static member would stay a session past its last word.
                member.heartbeat_deadline = now + member.session_timeout_ms
            member.join_token = None
            member.synced = False
            member.previous_assignment = member.assignment
            member.assignment = b""
        return effects

    def _persist_empty_group(self, group: Group) -> list[Effect]:
        def done(_error: int, _now: int) -> list[Effect]:
            return []

        return [self._write(group, (encode_group_metadata(group),), done)]

    # -- SyncGroup --------------------------------------------------------------------------

    def sync_group(self, token: Token, request: SyncRequest, now: int) -> list[Effect]:
        try:
            return self._sync(token, request, now)
        except _Refused as e:
            return [Reply(token, SyncResult(e.error, e.message))]

    def _sync(self, token: Token, request: SyncRequest, now: int) -> list[Effect]:
        self._check_group_id(request.group_id)
        self._check_owner(request.group_id)
        group, member = self._member(request.group_id, request.member_id, request.group_instance_id)
        if request.generation_id != group.generation_id:
            raise _Refused(
                ErrorCode.ILLEGAL_GENERATION,
                f"generation {request.generation_id}, the group is at {group.generation_id}",
            )
        if (request.protocol_type and request.protocol_type != group.protocol_type) or (
            request.protocol_name and request.protocol_name != group.protocol_name
        ):
            raise _Refused(ErrorCode.INCONSISTENT_GROUP_PROTOCOL, "not the group's protocol")
        if any(
            len(a) > self.settings.max_protocol_metadata_bytes for a in request.assignments.values()
        ):
            raise _Refused(
                ErrorCode.INVALID_REQUEST,
                f"an assignment larger than {self.settings.max_protocol_metadata_bytes} bytes",
            )
        member.heartbeat_deadline = now + member.session_timeout_ms
        if group.is_in(PREPARING):
            raise _Refused(ErrorCode.REBALANCE_IN_PROGRESS, "the group is rebalancing")
        if group.is_in(STABLE):
            member.synced = True
            if all(m.synced for m in group.members.values()):
                group.sync_deadline = None
            return [Reply(token, self._sync_result(group, member))]
        # CompletingRebalance
        if member.sync_token is not None:
            superseded = SyncResult(ErrorCode.REBALANCE_IN_PROGRESS, "superseded by a resend")
            effects: list[Effect] = [Reply(member.sync_token, superseded)]
        else:
            effects = []
        member.sync_token = token
        member.synced = True
        if member.member_id != group.leader_id or group.assignment_write is not None:
            return effects
        assignments = {mid: request.assignments.get(mid, b"") for mid in group.members}
        generation = group.generation_id

        def done(error: int, when: int) -> list[Effect]:
            if group.generation_id != generation or not group.is_in(COMPLETING):
                return []
            group.assignment_write = None
            if error != NONE:
                out: list[Effect] = []
                for m in group.members.values():
                    if m.sync_token is not None:
                        out.append(Reply(m.sync_token, SyncResult(_write_error(error))))
                        m.sync_token = None
                        m.heartbeat_deadline = when + m.session_timeout_ms
                return out + self._prepare_rebalance(group, when)
            return self._complete_sync(group, when)

        for member_id, assignment in assignments.items():
            group.members[member_id].assignment = assignment
        write = self._write(group, (encode_group_metadata(group),), done)
        group.assignment_write = write.write_id
        return [*effects, write]

    def _complete_sync(self, group: Group, now: int) -> list[Effect]:
        """The leader's assignment is stored: Stable, and every waiting SyncGroup answered.
        Members that have not sent SyncGroup yet keep their sync deadline (Kafka's pending
        sync members): they are removed if it passes first, as in CompletingRebalance."""
        group.transition(STABLE, now)
        if all(m.synced for m in group.members.values()):
            group.sync_deadline = None
        effects: list[Effect] = [
            RebalanceCompleted(group.group_id, group.generation_id, now - group.rebalance_started)
        ]
        for member in group.members.values():
            if member.sync_token is not None:
                effects.append(Reply(member.sync_token, self._sync_result(group, member)))
                member.sync_token = None
                member.heartbeat_deadline = now + member.session_timeout_ms
        return effects

    def _sync_result(self, group: Group, member: Member) -> SyncResult:
        return SyncResult(
            protocol_type=group.protocol_type or "",
            protocol_name=group.protocol_name or "",
            assignment=member.assignment,
        )

    def _member(
        self, group_id: str, member_id: str, instance_id: str | None
    ) -> tuple[Group, Member]:
        group = self.groups.get(group_id)
        if group is None or group.is_in(DEAD):
            raise _Refused(ErrorCode.UNKNOWN_MEMBER_ID, f"group {group_id!r} does not exist")
        return group, _validate_member(group, member_id, instance_id)

    # -- Heartbeat and LeaveGroup -----------------------------------------------------------

    def heartbeat(
        self,
        group_id: str,
        member_id: str,
        generation_id: int,
        group_instance_id: str | None,
        now: int,
    ) -> Outcome:
        """A member is alive. While the group's partition loads the answer is NONE, as
        Kafka's ``GroupCoordinatorService.heartbeat`` answers ("the group is still loading,
        so blindly respond"): its consumer fails on COORDINATOR_LOAD_IN_PROGRESS in a
        heartbeat, and the session starts afresh at the load anyway."""
        try:
            self._check_group_id(group_id)
            self._check_owner(group_id)
        except _Refused as e:
            if e.error == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS:
                return Outcome()
            return Outcome(e.error, e.message)
        try:
            group, member = self._member(group_id, member_id, group_instance_id)
        except _Refused as e:
            return Outcome(e.error, e.message)
        if generation_id != group.generation_id:
            return Outcome(
                ErrorCode.ILLEGAL_GENERATION,
                f"generation {generation_id}, the group is at {group.generation_id}",
            )
        member.heartbeat_deadline = now + member.session_timeout_ms
        if group.is_in(PREPARING):
            return Outcome(ErrorCode.REBALANCE_IN_PROGRESS, "rejoin the group")
        return Outcome()

    def leave_group(
        self, group_id: str, members: Sequence[tuple[str, str | None]], now: int
    ) -> tuple[list[Outcome], list[Effect]]:
        """Remove ``(member id, group instance id)`` pairs; a static member may be named by its
        instance id alone. One outcome per pair, and the effects of the rebalance."""
        try:
            self._check_group_id(group_id)
            self._check_owner(group_id)
        except _Refused as e:
            return [Outcome(e.error, e.message) for _ in members], []
        group = self.groups.get(group_id)
        outcomes: list[Outcome] = []
        effects: list[Effect] = []
        for member_id, instance_id in members:
            if group is None or group.is_in(DEAD):
                outcomes.append(Outcome(ErrorCode.UNKNOWN_MEMBER_ID, "the group does not exist"))
                continue
            if instance_id is not None and not member_id:
                member_id = group.static_members.get(instance_id, "")
            if group.pending_members.pop(member_id, None) is not None:
                outcomes.append(Outcome())
                effects += self._maybe_complete_join(group, now)
                continue
            try:
                _validate_member(group, member_id, instance_id)
            except _Refused as e:
                outcomes.append(Outcome(e.error, e.message))
                continue
            outcomes.append(Outcome())
            effects += self._remove_member_and_rebalance(group, member_id, now)
        return outcomes, effects

    def _remove_member_and_rebalance(self, group: Group, member_id: str, now: int) -> list[Effect]:
        member = group.remove_member(member_id)
        assert member is not None
        effects: list[Effect] = []
        if member.join_token is not None:
            effects.append(Reply(member.join_token, JoinResult(ErrorCode.UNKNOWN_MEMBER_ID)))
        if member.sync_token is not None:
            effects.append(Reply(member.sync_token, SyncResult(ErrorCode.UNKNOWN_MEMBER_ID)))
        if group.is_in(STABLE, COMPLETING):
            effects += self._prepare_rebalance(group, now)
        if group.is_in(PREPARING):
            if not group.members and not group.pending_members:
                effects += self._complete_join(group, now)
            else:
                effects += self._maybe_complete_join(group, now)
        return effects

    # -- OffsetCommit and OffsetFetch -------------------------------------------------------

    def commit_offsets(
        self,
        token: Token,
        group_id: str,
        member_id: str,
        generation_id: int,
        group_instance_id: str | None,
        offsets: Sequence[OffsetToCommit],
        now: int,
    ) -> list[Effect]:
        """Kafka's OffsetCommit, answered once the offsets are appended.

        A partition the metadata image does not have gets UNKNOWN_TOPIC_OR_PARTITION before
        anything else is looked at (Kafka's ``handleOffsetCommitRequest``); the others are
        checked against the group (:meth:`_group_for_commit`), then one by one: metadata
        longer than ``offset.metadata.max.bytes`` gets OFFSET_METADATA_TOO_LARGE. The offset
        itself is stored whatever its value, -1 included, as in Kafka."""
        errors: dict[TopicPartition, Outcome] = {}
        known: list[OffsetToCommit] = []
        for item in offsets:
            tp = item.topic_partition
            if self.partition_exists(tp):
                known.append(item)
            else:
                errors[tp] = Outcome(
                    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                    f"{tp.topic}-{tp.partition} does not exist",
                )
        if not known:
            return [Reply(token, CommitResult(errors))]
        try:
            self._check_owner(group_id)
            group = self._group_for_commit(
                group_id, member_id, generation_id, group_instance_id, now
            )
        except _Refused as e:
            refused = Outcome(e.error, e.message)
            errors.update((item.topic_partition, refused) for item in known)
            return [Reply(token, CommitResult(errors))]
        accepted: dict[TopicPartition, CommittedOffset] = {}
        owned = _consumer_assignment(group, member_id)
        max_metadata = self.settings.offset_metadata_max_bytes
        for item in known:
            tp = item.topic_partition
            if owned is not None and tp not in owned:
                # No Kafka code says exactly this; UNKNOWN_TOPIC_OR_PARTITION is a per-partition
                # OffsetCommit error that does not make a client drop its membership.
                errors[tp] = Outcome(
                    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                    f"{tp.topic}-{tp.partition} is not assigned to member {member_id} in "
                    f"generation {generation_id} or the one before",
                )
            elif _metadata_length(item.metadata) > max_metadata:
                errors[tp] = Outcome(
                    ErrorCode.OFFSET_METADATA_TOO_LARGE,
                    f"metadata longer than {max_metadata} characters",
                )
            else:
                accepted[tp] = CommittedOffset(item.offset, item.leader_epoch, item.metadata, now)
        if not accepted:
            return [Reply(token, CommitResult(errors))]
        records = tuple(encode_offset_commit(group_id, tp, o) for tp, o in accepted.items())
        target = group
        for tp in accepted:
            target.pending_commits[tp] = target.pending_commits.get(tp, 0) + 1

        def done(error: int, _now: int) -> list[Effect]:
            for tp in accepted:
                left = target.pending_commits.pop(tp, 1) - 1
                if left:
                    target.pending_commits[tp] = left
            if error == NONE:
                target.offsets.update(accepted)
                errors.update(dict.fromkeys(accepted, Outcome()))
            else:
                failed = Outcome(_write_error(error), "the offsets could not be stored")
                errors.update(dict.fromkeys(accepted, failed))
            return [Reply(token, CommitResult(errors))]

        return [self._write(group, records, done)]

    def _group_for_commit(
        self,
        group_id: str,
        member_id: str,
        generation_id: int,
        instance_id: str | None,
        now: int,
    ) -> Group:
        """The group an OffsetCommit goes to, if the commit may (Kafka's
        ``OffsetMetadataManager.validateOffsetCommit`` and ``ClassicGroup.validateOffsetCommit``).

        A commit with a negative generation comes from outside group management (a consumer
        using ``assign()``, an admin tool): it creates the group, offsets only, if there is
        none, and is accepted whatever member id it names while the group is Empty. Any other
        commit must come from a member (:func:`_validate_member`) in the group's generation,
        and not while the group is CompletingRebalance (REBALANCE_IN_PROGRESS: the member has
        not its assignment yet); a commit naming neither member nor generation to a group not
        Empty gets UNKNOWN_MEMBER_ID.
        """
        group = self.groups.get(group_id)
        if group is None:
            if generation_id >= 0:
                raise _Refused(ErrorCode.ILLEGAL_GENERATION, "the group does not exist")
            group = Group(group_id, state_timestamp=now)
            self.groups[group_id] = group
        if group.is_in(DEAD):
            raise _Refused(ErrorCode.COORDINATOR_NOT_AVAILABLE, "the group is being removed")
        if generation_id < 0 and group.is_in(EMPTY):
            return group
        if generation_id >= 0 or member_id or instance_id is not None:
            member = _validate_member(group, member_id, instance_id)
            if generation_id != group.generation_id:
                raise _Refused(
                    ErrorCode.ILLEGAL_GENERATION,
                    f"generation {generation_id}, the group is at {group.generation_id}",
                )
            member.heartbeat_deadline = now + member.session_timeout_ms
        else:
            raise _Refused(
                ErrorCode.UNKNOWN_MEMBER_ID, "the group has members; commit as one of them"
            )
        if group.is_in(COMPLETING):
            raise _Refused(ErrorCode.REBALANCE_IN_PROGRESS, "the group is rebalancing")
        return group

    def fetch_offsets(
        self, group_id: str, partitions: Iterable[TopicPartition] | None
    ) -> tuple[Outcome, dict[TopicPartition, FetchedOffset]]:
        """Committed offsets of ``partitions`` (all the group has when None)."""
        try:
            self._check_owner(group_id)
        except _Refused as e:
            return Outcome(e.error, e.message), {}
        group = self.groups.get(group_id)
        committed = group.offsets if group is not None else {}
        wanted = sorted(committed) if partitions is None else list(partitions)
        out: dict[TopicPartition, FetchedOffset] = {}
        for tp in wanted:
            offset = committed.get(tp)
            out[tp] = (
                FetchedOffset()
                if offset is None
                else FetchedOffset(offset.offset, offset.leader_epoch, offset.metadata)
            )
        return Outcome(), out

    # -- ListGroups, DescribeGroups, DeleteGroups -------------------------------------------

    def list_groups(self, states: Iterable[str] = ()) -> tuple[Outcome, list[GroupListing]]:
        """The groups served (only those in ``states`` if given), and, as Kafka answers,
        COORDINATOR_LOAD_IN_PROGRESS while a partition loads: its groups are not listed yet,
        and the caller asks again."""
        wanted = {s.lower() for s in states}
        listing = [
            GroupListing(g.group_id, g.protocol_type or "", g.state)
            for g in sorted(self.groups.values(), key=lambda g: g.group_id)
            if not g.is_in(DEAD) and (not wanted or g.state.value.lower() in wanted)
        ]
        if self.loading:
            loading = ", ".join(str(p) for p in sorted(self.loading))
            outcome = Outcome(
                ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
                f"partitions {loading} of __consumer_offsets are being loaded",
            )
            return outcome, listing
        return Outcome(), listing

    def describe_group(self, group_id: str) -> GroupDescription:
        try:
            self._check_owner(group_id)
        except _Refused as e:
            return GroupDescription(group_id, e.error, e.message)
        group = self.groups.get(group_id)
        if group is None:
            return GroupDescription(group_id)
        stable = group.is_in(STABLE)
        members = tuple(
            MemberDescription(
                m.member_id,
                m.group_instance_id,
                m.client_id,
                m.client_host,
                m.metadata_for(group.protocol_name) if stable and group.protocol_name else b"",
                m.assignment if stable else b"",
            )
            for m in group.members.values()
        )
        return GroupDescription(
            group_id,
            state=group.state,
            protocol_type=group.protocol_type or "",
            protocol_name=(group.protocol_name or "") if stable else "",
            generation_id=group.generation_id,
            leader=group.leader_id or "",
            members=members,
        )

    def delete_groups(self, token: Token, group_ids: Sequence[str], now: int) -> list[Effect]:
        """Remove empty groups and their offsets: tombstones for every key they hold."""
        errors: dict[str, Outcome] = {}
        deletable: list[Group] = []
        for group_id in group_ids:
            try:
                self._check_owner(group_id)
            except _Refused as e:
                errors[group_id] = Outcome(e.error, e.message)
                continue
            group = self.groups.get(group_id)
            if group is None or group.is_in(DEAD):
                errors[group_id] = Outcome(ErrorCode.GROUP_ID_NOT_FOUND, "no such group")
            elif group.members or not group.is_in(EMPTY):
                errors[group_id] = Outcome(ErrorCode.NON_EMPTY_GROUP, "the group has members")
            else:
                deletable.append(group)
        if not deletable:
            return [Reply(token, DeleteResult(errors))]
        remaining = {g.group_id for g in deletable}
        effects: list[Effect] = []
        for group in deletable:
            empty_since = group.state_timestamp
            group.transition(DEAD, now)
            # Offsets with a commit still being appended get a tombstone too: it lands after
            # the commit, where the group's tombstone alone would hide the commit from a load
            # only until the cleaner removes that tombstone.
            records = (
                *(
                    encode_offset_tombstone(group.group_id, tp)
                    for tp in dict.fromkeys((*group.offsets, *group.pending_commits))
                ),
                encode_group_tombstone(group.group_id),
            )

            def done(
                error: int, _now: int, group: Group = group, empty_since: int = empty_since
            ) -> list[Effect]:
                if error == NONE:
                    self.groups.pop(group.group_id, None)
                    errors[group.group_id] = Outcome()
                else:
                    group.transition(EMPTY, empty_since)
                    errors[group.group_id] = Outcome(_write_error(error), "could not be deleted")
                remaining.discard(group.group_id)
                return [] if remaining else [Reply(token, DeleteResult(errors))]

            effects.append(self._write(group, records, done))
        return effects

    def delete_offsets(
        self, token: Token, group_id: str, partitions: Sequence[TopicPartition], now: int
    ) -> list[Effect]:
        """Kafka's OffsetDelete (KIP-496): remove the group's committed offsets of
        ``partitions``, with a tombstone each. A group with members keeps the offsets of
        the topics they subscribe to (``GROUP_SUBSCRIBED_TO_TOPIC``: they would be
        committed again, or the members would restart from the reset policy); a group of
        another protocol than the consumer's with members refuses (``NON_EMPTY_GROUP``).
        A partition without an offset counts as deleted."""

        def answer(error: Outcome, outcomes: Mapping[TopicPartition, Outcome]) -> list[Effect]:
            return [Reply(token, OffsetDeleteResult(error, dict(outcomes)))]

        try:
            self._check_group_id(group_id)
            self._check_owner(group_id)
        except _Refused as e:
            return answer(Outcome(e.error, e.message), {})
        group = self.groups.get(group_id)
        if group is None or group.is_in(DEAD):
            return answer(Outcome(ErrorCode.GROUP_ID_NOT_FOUND, "no such group"), {})
        subscribed: set[str] | None = set()
        if group.members:
            if group.protocol_type != CONSUMER_PROTOCOL_TYPE:
                return answer(Outcome(ErrorCode.NON_EMPTY_GROUP, "the group has members"), {})
            subscribed = _subscribed_topics(group)
        outcomes: dict[TopicPartition, Outcome] = {}
        deletable: list[TopicPartition] = []
        for tp in dict.fromkeys(partitions):
            if subscribed is None or tp.topic in subscribed:
                outcomes[tp] = Outcome(
                    ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC,
                    f"the group's members subscribe to {tp.topic}",
                )
                continue
            outcomes[tp] = Outcome()
            if tp in group.offsets:
                deletable.append(tp)
        if not deletable:
            return answer(Outcome(), outcomes)
        records = tuple(encode_offset_tombstone(group_id, tp) for tp in deletable)

        def done(error: int, _now: int) -> list[Effect]:
            for tp in deletable:
                if error == NONE:
                    group.offsets.pop(tp, None)
                else:
                    outcomes[tp] = Outcome(_write_error(error), "could not be deleted")
            return answer(Outcome(), outcomes)

        return [self._write(group, records, done)]

    # -- time -------------------------------------------------------------------------------

    def next_deadline(self) -> int | None:
        """The earliest time :meth:`tick` has something to do (ms), or None."""
        deadlines: list[int] = []
        if self._next_expiry_check is not None:
            deadlines.append(self._next_expiry_check)
        for group in self.groups.values():
            if group.join_deadline is not None:
                deadlines.append(group.join_deadline)
            if group.sync_deadline is not None:
                deadlines.append(group.sync_deadline)
            deadlines.extend(group.pending_members.values())
            deadlines.extend(
                m.heartbeat_deadline for m in group.members.values() if m.session_may_expire
            )
        return min(deadlines, default=None)

    def tick(self, now: int) -> list[Effect]:
        """Expire sessions, end join and sync phases, and expire offsets, as of ``now``."""
        effects: list[Effect] = []
        for group in list(self.groups.values()):
            if group.is_in(DEAD):
                continue
            for member_id, deadline in list(group.pending_members.items()):
                if deadline <= now:
                    del group.pending_members[member_id]
                    effects += self._maybe_complete_join(group, now)
            expired = [
                m.member_id
                for m in group.members.values()
                if m.session_may_expire and m.heartbeat_deadline <= now
            ]
            for member_id in expired:
                if member_id in group.members:
                    effects += self._remove_member_and_rebalance(group, member_id, now)
            if group.is_in(PREPARING) and _passed(group.join_deadline, now):
                effects += self._join_deadline_passed(group, now)
            if group.is_in(COMPLETING, STABLE) and _passed(group.sync_deadline, now):
                group.sync_deadline = None
                for member in [m for m in group.members.values() if not m.synced]:
                    effects += self._remove_member_and_rebalance(group, member.member_id, now)
        if self._next_expiry_check is not None and self._next_expiry_check <= now:
            self._next_expiry_check = now + self.settings.offsets_retention_check_interval_ms
            effects += self._expire_offsets(now)
        return effects

    def _join_deadline_passed(self, group: Group, now: int) -> list[Effect]:
        if group.in_initial_delay and group.new_member_added and group.initial_delay_remaining_ms:
            # Kafka's InitialDelayedJoin: members are still arriving; wait another delay.
            step = min(
                self.settings.group_initial_rebalance_delay_ms, group.initial_delay_remaining_ms
            )
            group.initial_delay_remaining_ms -= step
            group.new_member_added = False
            group.join_deadline = now + step
            return []
        group.in_initial_delay = False
        return self._complete_join(group, now)

    def _expire_offsets(self, now: int) -> list[Effect]:
        """KIP-211: offsets of an empty consumer group expire ``offsets.retention.minutes``
        after it became empty; a group without a protocol (assign() commits) expires each
        offset that long after its commit; a Stable consumer group, each offset of a topic
        none of its members subscribes to that long after its commit (KIP-496). An empty
        group with nothing left goes. As in Kafka, an offset with a commit being appended
        does not expire, and its group stays."""
        retention = self.settings.offsets_retention_ms
        effects: list[Effect] = []
        for group in list(self.groups.values()):
            settled = {tp: o for tp, o in group.offsets.items() if tp not in group.pending_commits}
            if group.is_in(EMPTY) and not group.members:
                if group.protocol_type is None:
                    expired = [
                        tp for tp, o in settled.items() if o.commit_timestamp + retention <= now
                    ]
                else:
                    expired = list(settled) if group.state_timestamp + retention <= now else []
                if not expired and (group.offsets or group.pending_commits):
                    continue
                remove_group = len(expired) == len(group.offsets) and not group.pending_commits
            elif group.is_in(STABLE) and group.protocol_type == CONSUMER_PROTOCOL_TYPE:
                subscribed = _subscribed_topics(group)
                expired = [
                    tp
                    for tp, o in settled.items()
                    if subscribed is not None
                    and tp.topic not in subscribed
                    and o.commit_timestamp + retention <= now
                ]
                if not expired:
                    continue
                remove_group = False
            else:
                continue
            records: list[KeyValue] = [
                encode_offset_tombstone(group.group_id, tp) for tp in expired
            ]
            empty_since = group.state_timestamp
            if remove_group:
                records.append(encode_group_tombstone(group.group_id))
                group.transition(DEAD, now)

            def done(
                error: int,
                _when: int,
                group: Group = group,
                expired: list[TopicPartition] = expired,
                remove_group: bool = remove_group,
                empty_since: int = empty_since,
            ) -> list[Effect]:
                if error != NONE:
                    if remove_group:  # still empty since then: the next check tries again
                        group.transition(EMPTY, empty_since)
                    return []
                for tp in expired:
                    group.offsets.pop(tp, None)
                if remove_group and self.groups.get(group.group_id) is group:
                    del self.groups[group.group_id]
                return []

            effects.append(self._write(group, tuple(records), done))
        return effects

    # -- writes -----------------------------------------------------------------------------

    def _write(
        self,
        group: Group,
        records: tuple[KeyValue, ...],
        on_done: Callable[[int, int], list[Effect]],
    ) -> Write:
        self._next_write_id += 1
        partition = self.partition_for(group.group_id)
        self._writes[self._next_write_id] = _PendingWrite(partition, on_done)
        return Write(self._next_write_id, partition, records)

    def write_completed(self, write_id: int, error: int, now: int) -> list[Effect]:
        """The edge appended (``error`` NONE) or failed to append a :class:`Write`."""
        pending = self._writes.pop(write_id, None)
        if pending is None:
            return []  # its partition was unloaded meanwhile
        return pending.on_done(error, now)


def _consumer_assignment(group: Group, member_id: str) -> set[TopicPartition] | None:
    """What a member of a consumer group may commit: the partitions of its assignment in
    this generation and in the one before (a member gives partitions up, and commits
    them, after the generation that moves them has begun: KIP-429), if the coordinator can
    tell (the consumer protocol's assignments decode); None otherwise.

    Only Highwater's ``consumer_protocol.proto`` assignments are read. Kafka checks no
    commit against an assignment, so a Kafka client's (Kafka's ``ConsumerProtocol``
    encoding, which starts with a zero byte and never decodes as protobuf) commits
    whatever it names, as it would to Kafka."""
    member = group.members.get(member_id)
    if member is None or group.protocol_type != CONSUMER_PROTOCOL_TYPE:
        return None
    owned: set[TopicPartition] = set()
    for data in (member.assignment, member.previous_assignment):
        try:
            assignment = ConsumerProtocolAssignment.FromString(data)
        except DecodeError:
            return None
        owned.update(
            TopicPartition(entry.topic, partition)
            for entry in assignment.assigned_partitions
            for partition in entry.partitions
        )
    return owned


def _subscribed_topics(group: Group) -> set[str] | None:
    """The topics the members of a consumer group subscribe to, from their metadata for
    the group's protocol (Highwater's or Kafka's encoding, :mod:`.subscriptions`); None when
    it cannot be told (a subscription in neither, no protocol chosen yet)."""
    if group.protocol_name is None:
        return None
    topics: set[str] = set()
    for member in group.members.values():
        try:
            member_topics = subscribed_topics(member.metadata_for(group.protocol_name))
        except KeyError:
            return None
        if member_topics is None:
            return None
        topics |= member_topics
    return topics


def _validate_member(group: Group, member_id: str, instance_id: str | None) -> Member:
    """The member a request comes from (Kafka's ``ClassicGroup.validateMember``). A request
    naming a ``group.instance.id`` must come from the member holding it: UNKNOWN_MEMBER_ID
    when none does, FENCED_INSTANCE_ID when another does; one naming none must come from a
    member (UNKNOWN_MEMBER_ID)."""
    if instance_id is not None:
        holder = group.static_members.get(instance_id)
        if holder is None:
            raise _Refused(ErrorCode.UNKNOWN_MEMBER_ID, f"no member holds instance {instance_id!r}")
        if holder != member_id:
            raise _Refused(ErrorCode.FENCED_INSTANCE_ID, "another member holds this instance id")
    member = group.members.get(member_id)
    if member is None:
        raise _Refused(ErrorCode.UNKNOWN_MEMBER_ID, f"unknown member {member_id!r}")
    return member


def _named_partition(tp: TopicPartition) -> bool:
    return bool(tp.topic) and tp.partition >= 0


def _metadata_length(metadata: str) -> int:
    """Offset metadata's length as Kafka measures it against ``offset.metadata.max.bytes``:
    Java's ``String.length()``, UTF-16 code units (not bytes, despite the setting's name)."""
    return len(metadata.encode("utf-16-le")) // 2


def _passed(deadline: int | None, now: int) -> bool:
    return deadline is not None and deadline <= now


def _random_member_id(prefix: str) -> str:
    return f"{prefix or 'member'}-{uuid.uuid4()}"


def _write_error(error: int) -> int:
    """What a client is told when the records could not be appended (Kafka's mapping)."""
    if error in (
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ErrorCode.NOT_ENOUGH_REPLICAS,
        ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
        ErrorCode.REQUEST_TIMED_OUT,
        ErrorCode.LEADER_NOT_AVAILABLE,
    ):
        return ErrorCode.COORDINATOR_NOT_AVAILABLE
    if error in (
        ErrorCode.NOT_LEADER_OR_FOLLOWER,
        ErrorCode.INVALID_PRODUCER_EPOCH,
        ErrorCode.PRODUCER_FENCED,
        ErrorCode.NOT_COORDINATOR,
    ):
        return ErrorCode.NOT_COORDINATOR
    if error in (ErrorCode.MESSAGE_TOO_LARGE, ErrorCode.RECORD_LIST_TOO_LARGE):
        return ErrorCode.INVALID_COMMIT_OFFSET_SIZE
    return ErrorCode.UNKNOWN_SERVER_ERROR
