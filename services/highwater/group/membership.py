"""A consumer's membership of its group: Kafka's ``ConsumerCoordinator`` on the client side.

Shared by the Python consumer and the broker's consumer sessions (which run a thin
client's membership on its behalf); what it needs of the cluster is a
:class:`GroupCluster`: where the group's coordinator is, and how many partitions topics
have (the client's metadata layer, or a broker's metadata image).

:class:`GroupMembership` finds the group's coordinator (``FindCoordinator`` to any broker),
joins the group and syncs (the leader runs the assignor over every member's subscription),
keeps the membership alive with heartbeats in a background task, and commits and fetches
offsets. The consumer drives it: it calls :meth:`GroupMembership.join` whenever
:attr:`GroupMembership.rejoin_needed` is set, and acts on the :class:`Rebalance` it gets
back (revoke, then assign), as Kafka's ``ConsumerCoordinator.poll`` does.

Which partitions a rebalance takes away depends on the rebalance protocol the configured
assignors share (KIP-429): under the eager protocol a member gives up everything before it
joins; under the cooperative protocol it keeps its partitions and gives up only those the
new assignment moves elsewhere, then joins again at once so that they reach their new
owners.

The leader watches every topic the group subscribes to, its own and the other members'
(Kafka's ``groupSubscribe``): it remembers the partition counts it assigned from (its
*assignment snapshot*, :meth:`GroupMembership.watched_topics`), and when the counts seen
later differ (:meth:`GroupMembership.metadata_seen`: a topic created, grown or deleted) it
rejoins, so that the group is assigned from the new ones (Kafka's
``ConsumerCoordinator.rejoinNeededOrPending``). The consumer reports the counts at each
metadata check (``metadata.max.age.ms``); a member that no longer leads watches nothing.
Without the leader's watch, partitions of a topic only other members subscribe to would
never be assigned when that topic appears or grows: nobody who watches it would rejoin.

A leader that cannot read the partition counts of the group's topics assigns none of their
partitions and says so: it assigned from no partitions at all, and its heartbeats read the
counts again until they can, then compare them with that snapshot like any others.

An assignment naming topics the member does not subscribe to (its subscription changed
since the assignment was made, as when a static member restarts with another one) is not
taken: the member joins again, as Kafka's ``onJoinComplete`` does.

Errors of the group protocol are retried where Kafka retries them (a moving coordinator,
a rebalance that began meanwhile, a member id the coordinator forgot: the member joins
afresh); configuration mistakes (an unknown assignor, a session timeout the coordinator
refuses, a fenced static member) raise :class:`GroupError` with the coordinator's code.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Protocol, TypeVar

import grpc
import grpc.aio

from highwater.errors import HighwaterError
from highwater.group.assignors import (
    ConsumerPartitionAssignor,
    assign_group,
    select_rebalance_protocol,
)
from highwater.group.protocol import (
    DEFAULT_GENERATION,
    Assignment,
    AssignmentChange,
    GroupMember,
    MalformedConsumerProtocolError,
    RebalanceProtocol,
    Subscription,
    TopicPartitionKey,
    assignment_change,
    decode_assignment,
    decode_group_subscription,
    encode_assignment,
    encode_subscription,
)
from highwater.rpc.channels import open_channel
from highwater.rpc.client_auth import ClientSecurity
from highwater.v1 import coordinator_pb2 as pb
from highwater.v1 import coordinator_pb2_grpc
from highwater.v1.common_pb2 import ErrorCode

log = logging.getLogger(__name__)


def changed_topics(assigned_from: Mapping[str, int], counts: Mapping[str, int]) -> tuple[str, ...]:
    """The topics of an assignment snapshot (``assigned_from``: topic -> the partition count
    assigned from, 0 for a topic that did not exist) whose partition count differs in
    ``counts`` (the topics that exist now): created, grown or deleted since. Kafka's
    ``MetadataSnapshot.matches``, over partition counts."""
    return tuple(sorted(t for t, n in assigned_from.items() if counts.get(t, 0) != n))


class GroupCluster(Protocol):
    """What a membership needs of the cluster. Both raise a
    :class:`~highwater.errors.HighwaterError` when they cannot answer now (no coordinator
    yet, no broker reachable): the membership backs off and tries again. ``security``: the
    TLS and SASL of the channel to the coordinator (None: the process's own)."""

    security: ClientSecurity | None

    async def find_coordinator(self, group_id: str) -> str:
        """``HOST:PORT`` of the coordinator of ``group_id``."""
        ...

    async def partition_counts(self, topics: Sequence[str]) -> Mapping[str, int]:
        """The partition count of each of ``topics`` that exists (fresh: the leader's
        assignment covers partitions added since)."""
        ...


PROTOCOL_TYPE: Final = "consumer"

_COORDINATOR_ERRORS: Final = frozenset(
    {
        ErrorCode.NOT_COORDINATOR,
        ErrorCode.COORDINATOR_NOT_AVAILABLE,
        ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
        ErrorCode.NETWORK_EXCEPTION,
        ErrorCode.REQUEST_TIMED_OUT,
    }
)
"""Find the coordinator again and retry."""

_MEMBERSHIP_LOST: Final = frozenset(
    {ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.ILLEGAL_GENERATION, ErrorCode.FENCED_INSTANCE_ID}
)


class _HasError(Protocol):
    @property
    def error(self) -> int: ...


_Reply = TypeVar("_Reply", bound=_HasError)


class GroupError(HighwaterError):
    """The group refused this consumer for a reason retrying cannot fix."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True)
class GroupSettings:
    """The consumer settings a group member needs, with Kafka's names in the docs."""

    group_id: str
    """``group.id``."""
    client_id: str = ""
    group_instance_id: str | None = None
    """``group.instance.id``: static membership (KIP-345)."""
    session_timeout_ms: int = 45_000
    """``session.timeout.ms``."""
    heartbeat_interval_ms: int = 3_000
    """``heartbeat.interval.ms``."""
    max_poll_interval_ms: int = 300_000
    """``max.poll.interval.ms``: also the rebalance timeout the member joins with."""
    retry_backoff_ms: int = 100
    request_timeout_ms: int = 30_000


@dataclass(frozen=True, slots=True)
class Rebalance:
    """The outcome of one join: the new assignment and what changed for this member."""

    generation_id: int
    assignment: Assignment
    change: AssignmentChange


class GroupMembership:
    """One consumer's membership of ``settings.group_id`` (see the module docstring)."""

    def __init__(
        self,
        cluster: GroupCluster,
        settings: GroupSettings,
        assignors: Sequence[ConsumerPartitionAssignor],
        *,
        on_rejoin_needed: Callable[[], None] = lambda: None,
        polling: Callable[[], bool] = lambda: False,
    ) -> None:
        """``polling``: whether the application is inside ``poll()`` now, waiting for
        records (a broker's consumer session holding none): its ``max.poll.interval.ms``
        does not run out while it waits, however long (a Kafka consumer in ``poll()`` keeps
        polling, even with nothing assigned). The default: only :meth:`polled` counts."""
        self.cluster = cluster
        self.settings = settings
        self.assignors = list(assignors)
        self.protocol = select_rebalance_protocol(self.assignors)
        self.on_rejoin_needed = on_rejoin_needed
        self.polling = polling
        self.member_id = ""
        self.generation_id = DEFAULT_GENERATION
        self.protocol_name: str | None = None
        self.owned: tuple[TopicPartitionKey, ...] = ()
        """The partitions this member consumes now."""
        self.previous_assignment: tuple[TopicPartitionKey, ...] = ()
        """The last assignment received (the sticky assignor's user data)."""
        self.rejoin_needed = True
        self.lost = False
        """Set when the coordinator no longer counts this member in its generation: its
        partitions are lost (they may already be another member's), not revoked."""
        self._assigned_from: dict[str, int] | None = None
        """The assignment snapshot: when this member leads the generation, the partition
        count it assigned from of every topic the group subscribes to (0: the topic did
        not exist, or its count could not be read); None when it does not lead."""
        self._assigned_blind = False
        """The counts of the assignment snapshot could not be read: the heartbeats read
        them again until they can (:meth:`_read_assigned_counts`)."""
        self._fatal: GroupError | None = None
        """An error the next :meth:`join` raises instead of joining (a fenced static member)."""
        self._coordinator: str | None = None
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._heartbeats: asyncio.Task[None] | None = None
        self._joining = False
        self._last_poll = time.monotonic()
        self._closed = False

    # -- the coordinator --------------------------------------------------------------------

    async def _stub(self) -> coordinator_pb2_grpc.GroupCoordinatorStub:
        if self._coordinator is None:
            self._coordinator = await self.cluster.find_coordinator(self.settings.group_id)
        channel = self._channels.get(self._coordinator)
        if channel is None:
            channel = open_channel(self._coordinator, traced=True, security=self.cluster.security)
            self._channels[self._coordinator] = channel
        return coordinator_pb2_grpc.GroupCoordinatorStub(channel)

    def _coordinator_unknown(self) -> None:
        self._coordinator = None

    async def _backoff(self) -> None:
        await asyncio.sleep(self.settings.retry_backoff_ms / 1000)

    # -- joining ----------------------------------------------------------------------------

    def polled(self) -> None:
        """The application polled: it is alive (``max.poll.interval.ms``)."""
        self._last_poll = time.monotonic()

    def is_member(self) -> bool:
        return bool(self.member_id) and self.generation_id >= 0

    def reset_membership(self, *, keep_member_id: bool = False) -> None:
        """Forget the generation, and the member id unless ``keep_member_id``: the next
        join starts afresh (with the member id kept, the coordinator need not wait for
        the old one to rejoin or expire)."""
        if not keep_member_id:
            self.member_id = ""
        self.generation_id = DEFAULT_GENERATION

    async def join(self, topics: Sequence[str]) -> Rebalance | None:
        """Join (or rejoin) the group subscribed to ``topics`` until a generation is formed
        and this member has its assignment. The caller revoked what it had to first
        (everything under the eager protocol, see :meth:`partitions_to_revoke_before_join`).

        None when the coordinator answered that this member is not in the generation
        (UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION) while it still owns partitions: they are
        :attr:`lost`, and the caller gives them up (``on_lost``) before it joins again,
        as Kafka's ``onJoinPrepare`` does after such an answer. A fenced static member's
        error (:class:`GroupError`, FENCED_INSTANCE_ID, seen by a heartbeat) is raised
        instead of joining: joining again would take the place back from the consumer
        that now has it."""
        if self._fatal is not None:
            error, self._fatal = self._fatal, None
            raise error
        self._joining = True
        try:
            while True:
                rebalance = await self._join_once(topics)
                if rebalance is not None:
                    return rebalance
                if self.lost and self.owned:
                    return None
        finally:
            self._joining = False

    def partitions_to_revoke_before_join(
        self, topics: Sequence[str]
    ) -> tuple[TopicPartitionKey, ...]:
        """What a member subscribed to ``topics`` gives up before it joins (Kafka's
        ``onJoinPrepare``): everything under the eager protocol; under the cooperative one
        only the partitions of topics it no longer subscribes to (it keeps consuming the
        others through the rebalance, and claims them as owned in its subscription)."""
        if self.protocol is RebalanceProtocol.EAGER:
            return self.owned
        subscribed = set(topics)
        return tuple(tp for tp in self.owned if tp[0] not in subscribed)

    def revoked(self, partitions: Sequence[TopicPartitionKey]) -> None:
        """The consumer stopped consuming ``partitions``."""
        gone = set(partitions)
        self.owned = tuple(tp for tp in self.owned if tp not in gone)

    async def _join_once(self, topics: Sequence[str]) -> Rebalance | None:
        try:
            stub = await self._stub()
        except HighwaterError as e:
            log.debug("group %s: no coordinator yet: %s", self.settings.group_id, e)
            await self._backoff()
            return None
        request = pb.JoinGroupRequest(
            group_id=self.settings.group_id,
            session_timeout_ms=self.settings.session_timeout_ms,
            rebalance_timeout_ms=self.settings.max_poll_interval_ms,
            member_id=self.member_id,
            protocol_type=PROTOCOL_TYPE,
            protocols=[
                pb.JoinGroupProtocol(name=a.name, metadata=self._subscription(a, topics))
                for a in self.assignors
            ],
            client_id=self.settings.client_id,
        )
        if self.settings.group_instance_id is not None:
            request.group_instance_id = self.settings.group_instance_id
        timeout = (self.settings.max_poll_interval_ms + self.settings.request_timeout_ms) / 1000
        joined = await self._call(stub.JoinGroup, request, timeout)
        if joined is None:
            return None
        error = joined.error
        if error == ErrorCode.MEMBER_ID_REQUIRED:
            self.member_id = joined.member_id
            return None
        if error != ErrorCode.NONE:
            await self._handle_error("JoinGroup", error, joined.error_message)
            return None
        self.member_id = joined.member_id
        self._assigned_from, self._assigned_blind = None, False
        assignments: list[pb.SyncGroupAssignment] = []
        if joined.leader == joined.member_id:
            assignments = await self._assign(joined)
        sync = pb.SyncGroupRequest(
            group_id=self.settings.group_id,
            generation_id=joined.generation_id,
            member_id=self.member_id,
            protocol_type=PROTOCOL_TYPE,
            protocol_name=joined.protocol_name,
            assignments=assignments,
        )
        if self.settings.group_instance_id is not None:
            sync.group_instance_id = self.settings.group_instance_id
        synced = await self._call(stub.SyncGroup, sync, timeout)
        if synced is None:
            return None
        if synced.error != ErrorCode.NONE:
            await self._handle_error("SyncGroup", synced.error, synced.error_message)
            return None
        try:
            assignment = decode_assignment(synced.assignment)
        except MalformedConsumerProtocolError as e:
            log.warning(
                "group %s: an assignment that does not decode (%s); rejoining",
                self.settings.group_id,
                e,
            )
            await self._backoff()
            return None
        self.generation_id = joined.generation_id
        self.protocol_name = joined.protocol_name
        subscribed = set(topics)
        unsubscribed = sorted({tp[0] for tp in assignment.partitions} - subscribed)
        if unsubscribed:
            # As Kafka's onJoinComplete: the subscription changed since the assignment was
            # made (a static member restarted with another one keeps its former assignment).
            # The member takes none of it and joins again in this generation; its metadata,
            # which names the generation, differs from what the coordinator has, and that
            # starts a rebalance.
            log.info(
                "group %s: generation %d assigned topics %s outside the subscription %s; rejoining",
                self.settings.group_id,
                joined.generation_id,
                unsubscribed,
                sorted(subscribed),
            )
            await self._backoff()
            return None
        change = assignment_change(self.owned, assignment.partitions, self.protocol)
        self.previous_assignment = assignment.partitions
        self.rejoin_needed = change.rejoin
        self.lost = False
        self._ensure_heartbeats()
        return Rebalance(joined.generation_id, assignment, change)

    def assigned(self, partitions: Sequence[TopicPartitionKey]) -> None:
        """The consumer started on ``partitions`` (after a rebalance's revocations)."""
        self.owned = tuple(sorted({*self.owned, *partitions}))

    def _subscription(self, assignor: ConsumerPartitionAssignor, topics: Sequence[str]) -> bytes:
        cooperative = self.protocol is RebalanceProtocol.COOPERATIVE
        subscription = Subscription(
            topics=tuple(topics),
            user_data=assignor.subscription_user_data(
                tuple(topics), self.previous_assignment, self.generation_id
            ),
            owned_partitions=self.owned if cooperative else (),
            generation_id=self.generation_id,
        )
        return encode_subscription(subscription)

    async def _assign(self, joined: pb.JoinGroupResponse) -> list[pb.SyncGroupAssignment]:
        """The leader's step: take the assignment snapshot of the group's topics and run the
        chosen assignor over every member's subscription. A returning static leader told to
        skip the assignment (KIP-814) only takes the snapshot: it watches all the same."""
        group = decode_group_subscription(
            GroupMember(
                m.member_id,
                m.metadata,
                m.group_instance_id if m.HasField("group_instance_id") else None,
            )
            for m in joined.members
        )
        for member, problem in group.malformed.items():
            log.warning("group %s: member %s sent %s", self.settings.group_id, member, problem)
        topics = sorted({t for s in group.subscriptions.values() for t in s.topics})
        partitions_per_topic: dict[str, int] = {}
        try:
            partitions_per_topic = dict(await self.cluster.partition_counts(topics))
        except HighwaterError as e:
            # Assign from what there is (nothing), as Kafka's leader assigns from the
            # metadata it has; the heartbeats read the counts again and rejoin.
            log.warning(
                "group %s: generation %d: the partition counts of %s cannot be read (%s); "
                "assigning none of their partitions until they can",
                self.settings.group_id,
                joined.generation_id,
                topics,
                e,
            )
            self._assigned_blind = True
        partitions_per_topic = {t: partitions_per_topic.get(t, 0) for t in topics}
        self._assigned_from = partitions_per_topic
        if joined.skip_assignment:
            return []
        assignor = next(a for a in self.assignors if a.name == joined.protocol_name)
        result = assign_group(assignor, partitions_per_topic, group, self.protocol)
        return [
            pb.SyncGroupAssignment(member_id=member, assignment=encode_assignment(a))
            for member, a in result.items()
        ]

    async def _call(
        self, method: Callable[..., Awaitable[_Reply]], request: object, timeout: float
    ) -> _Reply | None:
        """One call to the coordinator; None (after backing off) if it did not answer."""
        try:
            return await method(request, timeout=timeout)
        except grpc.aio.AioRpcError as e:
            log.debug("group %s: coordinator call failed: %s", self.settings.group_id, e.code())
            self._coordinator_unknown()
            await self._backoff()
            return None

    async def _handle_error(self, what: str, error: int, message: str) -> None:
        name = ErrorCode.Name(error)  # type: ignore[arg-type]
        if error in _COORDINATOR_ERRORS:
            self._coordinator_unknown()
            await self._backoff()
        elif error == ErrorCode.REBALANCE_IN_PROGRESS:
            pass  # join again at once: the new generation is forming
        elif error in (ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.ILLEGAL_GENERATION):
            self._membership_lost(error)
        elif error == ErrorCode.FENCED_INSTANCE_ID:
            raise GroupError(
                error,
                f"group {self.settings.group_id}: another consumer with group.instance.id "
                f"{self.settings.group_instance_id!r} took this one's place",
            )
        else:
            raise GroupError(error, f"group {self.settings.group_id}: {what}: {name} {message}")

    # -- heartbeats -------------------------------------------------------------------------

    def _ensure_heartbeats(self) -> None:
        if self._heartbeats is None or self._heartbeats.done():
            self._heartbeats = asyncio.create_task(self._heartbeat_forever())

    async def _heartbeat_forever(self) -> None:
        interval = self.settings.heartbeat_interval_ms / 1000
        while not self._closed:
            await asyncio.sleep(interval)
            if self._joining or not self.is_member():
                continue
            if self._assigned_blind:
                await self._read_assigned_counts()
            if self.polling():
                self.polled()
            idle = time.monotonic() - self._last_poll
            if idle * 1000 > self.settings.max_poll_interval_ms:
                log.warning(
                    "group %s: no poll for %.0f s (max.poll.interval.ms %d): leaving the group",
                    self.settings.group_id,
                    idle,
                    self.settings.max_poll_interval_ms,
                )
                await self.leave()
                self._membership_lost(ErrorCode.UNKNOWN_MEMBER_ID)
                continue
            sent = (self.member_id, self.generation_id)
            try:
                stub = await self._stub()
                request = pb.HeartbeatRequest(
                    group_id=self.settings.group_id,
                    generation_id=self.generation_id,
                    member_id=self.member_id,
                )
                if self.settings.group_instance_id is not None:
                    request.group_instance_id = self.settings.group_instance_id
                reply = await stub.Heartbeat(
                    request, timeout=self.settings.request_timeout_ms / 1000
                )
            except (grpc.aio.AioRpcError, HighwaterError):
                self._coordinator_unknown()
                continue
            if self._joining or (self.member_id, self.generation_id) != sent:
                # The answer is about a generation the member has left meanwhile (Kafka's
                # generationUnchanged): acting on it would lose the new one.
                continue
            if reply.error == ErrorCode.REBALANCE_IN_PROGRESS:
                self._request_rejoin()
            elif reply.error in _MEMBERSHIP_LOST:
                log.info(
                    "group %s: heartbeat answered %s; the member's partitions are lost",
                    self.settings.group_id,
                    ErrorCode.Name(reply.error),
                )
                if reply.error == ErrorCode.FENCED_INSTANCE_ID:
                    self._fatal = GroupError(
                        reply.error,
                        f"group {self.settings.group_id}: another consumer with "
                        f"group.instance.id {self.settings.group_instance_id!r} took this "
                        "one's place",
                    )
                self._membership_lost(reply.error)
            elif reply.error in _COORDINATOR_ERRORS:
                self._coordinator_unknown()

    async def _read_assigned_counts(self) -> None:
        """Read the partition counts the last assignment went without, and compare them
        with the snapshot (:meth:`metadata_seen`) once they can be read."""
        sent = (self.member_id, self.generation_id)
        try:
            counts = await self.cluster.partition_counts(self.watched_topics())
        except HighwaterError as e:
            log.debug("group %s: partition counts still unreadable: %s", self.settings.group_id, e)
            return
        if self._joining or (self.member_id, self.generation_id) != sent:
            return  # a join since assigned from counts of its own
        self._assigned_blind = False
        self.metadata_seen(counts)

    def watched_topics(self) -> tuple[str, ...]:
        """The topics whose partition counts this member watches for the group: while it
        leads the generation, every topic the group subscribes to (Kafka's
        ``groupSubscribe``); none otherwise."""
        return tuple(self._assigned_from or ())

    def metadata_seen(self, counts: Mapping[str, int]) -> None:
        """``counts``: the partition count of each of :meth:`watched_topics` that exists,
        as read now. A leader whose assignment snapshot differs rejoins, so that the group
        is assigned from these counts (Kafka's ``rejoinNeededOrPending``)."""
        if self._assigned_from is None or self._joining or not self.is_member():
            return
        changed = changed_topics(self._assigned_from, counts)
        if changed:
            log.info(
                "group %s: the partition counts of %s differ from those generation %d was "
                "assigned from; rejoining to assign them",
                self.settings.group_id,
                list(changed),
                self.generation_id,
            )
            self._request_rejoin()

    def _request_rejoin(self) -> None:
        if not self.rejoin_needed:
            self.rejoin_needed = True
            self.on_rejoin_needed()

    def _membership_lost(self, error: int) -> None:
        """The coordinator answered ``error``: this member is not in the generation. As
        Kafka's ``resetStateOnResponseError``, ILLEGAL_GENERATION keeps the member id (the
        coordinator may still know it), UNKNOWN_MEMBER_ID and FENCED_INSTANCE_ID do not."""
        self.reset_membership(keep_member_id=error == ErrorCode.ILLEGAL_GENERATION)
        self.lost = True
        self.rejoin_needed = True
        self.on_rejoin_needed()

    # -- offsets ----------------------------------------------------------------------------

    async def commit(
        self, offsets: Mapping[TopicPartitionKey, tuple[int, int, str]]
    ) -> dict[TopicPartitionKey, tuple[int, str]]:
        """Commit ``{(topic, partition): (offset, leader epoch, metadata)}`` as this member
        (or, before it ever joined, as a consumer outside group management); the error code
        and message of each partition. Coordinator moves are retried within
        ``request.timeout.ms``, and so is UNKNOWN_TOPIC_OR_PARTITION where it can only mean
        that the coordinator's metadata does not have the partition yet (a topic created a
        moment before; Kafka's consumer retries it as a retriable error): for a partition
        this member owns, or any partition of a commit from outside group management. The
        coordinator answers the same code for a partition a member commits without owning
        it, which is not retried."""
        deadline = time.monotonic() + self.settings.request_timeout_ms / 1000
        request = pb.OffsetCommitRequest(
            group_id=self.settings.group_id,
            generation_id=self.generation_id,
            member_id=self.member_id,
        )
        if self.settings.group_instance_id is not None and self.member_id:
            request.group_instance_id = self.settings.group_instance_id
        sent = (self.member_id, self.generation_id)
        by_topic: dict[str, pb.OffsetCommitTopic] = {}
        for (topic, partition), (offset, epoch, metadata) in sorted(offsets.items()):
            entry = by_topic.get(topic)
            if entry is None:
                entry = request.topics.add(name=topic)
                by_topic[topic] = entry
            entry.partitions.add(
                partition_index=partition,
                committed_offset=offset,
                committed_leader_epoch=epoch,
                metadata=metadata,
            )
        while True:
            reply = await self._offsets_call(
                lambda stub, timeout: stub.OffsetCommit(request, timeout=timeout), deadline
            )
            if isinstance(reply, int):
                return dict.fromkeys(offsets, (reply, "the group coordinator did not answer"))
            answers = {
                (t.name, p.partition_index): (int(p.error), p.error_message)
                for t in reply.topics
                for p in t.partitions
            }
            errors = {key: code for key, (code, _) in answers.items()}
            moved = any(e in _COORDINATOR_ERRORS for e in errors.values())
            owned = None if not sent[0] else set(self.owned)
            behind = any(
                code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION and (owned is None or key in owned)
                for key, code in errors.items()
            )
            if (moved or behind) and time.monotonic() < deadline:
                if moved:
                    self._coordinator_unknown()
                await self._backoff()
                continue
            if (self.member_id, self.generation_id) != sent:
                # About a generation the member has left meanwhile: the commit failed, the
                # membership stands (Kafka's generationUnchanged).
                return answers
            lost = [e for e in errors.values() if e in _MEMBERSHIP_LOST]
            if lost and ErrorCode.FENCED_INSTANCE_ID not in lost:
                # A fenced static member's commit fails (as in Kafka, the caller sees the
                # error); its membership is left to its heartbeats.
                self._membership_lost(lost[0])
            elif ErrorCode.REBALANCE_IN_PROGRESS in errors.values():
                self._request_rejoin()
            return answers

    async def committed(
        self, partitions: Sequence[TopicPartitionKey]
    ) -> dict[TopicPartitionKey, tuple[int, int, str] | None]:
        """The committed ``(offset, leader epoch, metadata)`` of each partition (None: none)."""
        deadline = time.monotonic() + self.settings.request_timeout_ms / 1000
        request = pb.OffsetFetchRequest(group_id=self.settings.group_id)
        by_topic: dict[str, pb.OffsetFetchTopic] = {}
        for topic, partition in partitions:
            entry = by_topic.get(topic)
            if entry is None:
                entry = request.topics.add(name=topic)
                by_topic[topic] = entry
            entry.partition_indexes.append(partition)
        reply = await self._offsets_call(
            lambda stub, timeout: stub.OffsetFetch(request, timeout=timeout), deadline
        )
        if isinstance(reply, int):
            raise GroupError(reply, f"group {self.settings.group_id}: could not fetch offsets")
        result: dict[TopicPartitionKey, tuple[int, int, str] | None] = dict.fromkeys(partitions)
        for topic in reply.topics:
            for p in topic.partitions:
                if p.committed_offset >= 0:
                    result[(topic.name, p.partition_index)] = (
                        p.committed_offset,
                        p.committed_leader_epoch,
                        p.metadata,
                    )
        return result

    async def _offsets_call(
        self,
        send: Callable[[coordinator_pb2_grpc.GroupCoordinatorStub, float], Awaitable[_Reply]],
        deadline: float,
    ) -> _Reply | int:
        """Send a request to the coordinator until it answers without a coordinator error
        or the deadline passes (then the last error code)."""
        last: int = ErrorCode.COORDINATOR_NOT_AVAILABLE
        while True:
            try:
                stub = await self._stub()
                reply = await send(stub, max(deadline - time.monotonic(), 0.1))
            except (grpc.aio.AioRpcError, HighwaterError) as e:
                log.debug("group %s: an offsets call failed: %s", self.settings.group_id, e)
                self._coordinator_unknown()
                last = ErrorCode.COORDINATOR_NOT_AVAILABLE
            else:
                if reply.error not in _COORDINATOR_ERRORS:
                    return reply
                last = reply.error
                self._coordinator_unknown()
            if time.monotonic() >= deadline:
                return last
            await self._backoff()

    # -- leaving ----------------------------------------------------------------------------

    async def leave(self) -> None:
        """Leave the group at once (a dynamic member; a static member's place is kept until
        its session expires, so that it can come back without a rebalance, as in Kafka)."""
        if not self.member_id or self.settings.group_instance_id is not None:
            return
        request = pb.LeaveGroupRequest(
            group_id=self.settings.group_id,
            members=[pb.LeavingMember(member_id=self.member_id, reason="the consumer is closing")],
        )
        with contextlib.suppress(grpc.aio.AioRpcError, HighwaterError):
            stub = await self._stub()
            await stub.LeaveGroup(request, timeout=self.settings.request_timeout_ms / 1000)
        self.reset_membership()

    async def close(self) -> None:
        self._closed = True
        if self._heartbeats is not None:
            self._heartbeats.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._heartbeats
        channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            await channel.close()
