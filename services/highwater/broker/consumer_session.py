"""Consumer sessions: a thin client's group membership, run by the broker on its behalf.

A client in any language opens ``Broker.ConsumerSession`` (a bidirectional stream), names
a group and topics (or partitions) in its first message, and from then on receives
assignment changes and plain records, and sends acknowledgements, commits and seeks. The
broker does what a Kafka consumer does for itself:

- the membership is the shared :class:`~highwater.group.membership.GroupMembership`, the
  Python consumer's own (FindCoordinator from this broker's metadata image, then JoinGroup,
  SyncGroup and heartbeats with the group's coordinator over gRPC; the session's assignors
  when it leads; eager or cooperative rebalances);
- a partition starts at the group's committed offset, else where ``auto_offset_reset``
  says (ListOffsets at the partition's leader);
- records are fetched in ``RECORD_FORMAT_PLAIN``, with this broker's own request handler
  for partitions it leads and the leader's ``Fetch`` over gRPC for the others
  (:class:`~highwater.broker.leader_channels.LeaderChannels`), as long polls;
- flow control is the client's credit (:mod:`~highwater.broker.session_state`): records
  and bytes delivered and not acknowledged; a session out of credit is not fetched for;
  the other way, the client's requests are not read while
  :data:`MAX_UNWRITTEN_EVENTS` events wait to be written to it (a client that writes and
  does not read is held back by the stream's flow control, as Kafka mutes a connection
  whose responses are not sent yet, rather than queuing answers without end);
- ``max.poll.interval.ms`` is about the client: a session holding records unacknowledged
  that long without a word is taken out of the group, as a consumer that stopped calling
  ``poll()``; one holding none is waiting for records, as a consumer in ``poll()`` is, so
  it is polling however long it waits (a Kafka consumer with nothing assigned still
  polls); it rejoins as soon as the client speaks again;
- at-least-once: a commit commits acknowledged positions only; before partitions are
  revoked their acknowledged positions are committed (as Kafka's consumer commits before
  a revocation), lost partitions are dropped without a commit;
- the metadata is watched as a Kafka consumer watches it, against this broker's own image
  (every :data:`METADATA_CHECK_INTERVAL_S`): a subscribed topic that appears or gains
  partitions makes the session rejoin, and while it leads, so does a change in any topic
  of the group's subscription (the counts its assignment was made from);
- the stream's end, clean or cut, ends the membership (LeaveGroup: the group rebalances
  at once, as for a member that crashed and was found out); a clean end (the client
  half-closes) first commits the acknowledged positions, as Kafka's ``close()`` does with
  auto-commit on, while a cut stream leaves them to what was committed (the client is
  gone without a word, as a consumer that crashed).

Each session is four tasks (the stream, its reader, the driver of membership and
fetches, the metadata watch) plus the membership's heartbeats; all end with the stream,
and the LeaveGroup that follows runs in a task :class:`ConsumerSessions` keeps until it
is done, so that sessions opened and dropped by the thousand leave nothing behind.

Authorization: :attr:`ConsumerSessions.authorizer` is asked before a session starts
whether the caller may read the group and the topics (Kafka's READ on Group and on
Topic), and again before each round of fetches for the group and the topics of the
partitions fetched (Kafka checks every Fetch, so a READ removed while a consumer reads
fails its next poll): a refusal ends the session ``PERMISSION_DENIED``. The fetches
themselves are the broker's own (its request handler, or the leader's ``Fetch`` as the
broker), so this check is the only one the caller's principal meets. The broker sets it
to the ACL check of :mod:`highwater.broker.authorization`, and the default allows
everything (a broker without an authorizer).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

import grpc
import grpc.aio

from highwater.broker.leader_channels import LeaderChannels
from highwater.broker.plain_records import add_plain_records
from highwater.broker.record_placement import record_size
from highwater.broker.request_handler import RequestHandler
from highwater.broker.session_state import SessionState
from highwater.errors import HighwaterError, InvalidRequestError
from highwater.group.assignors import assignor_for
from highwater.group.membership import GroupError, GroupMembership, GroupSettings
from highwater.group.protocol import TopicPartitionKey
from highwater.rpc.client_auth import ClientSecurity
from highwater.v1 import broker_pb2 as pb
from highwater.v1.common_pb2 import ErrorCode

__all__ = [
    "DEFAULT_ASSIGNORS",
    "DEFAULT_MAX_BYTES",
    "DEFAULT_MAX_RECORDS",
    "BrokerGroupCluster",
    "ConsumerSessions",
    "SessionAuthorizer",
    "allow_every_session",
]

log = logging.getLogger(__name__)

DEFAULT_MAX_RECORDS: Final = 500
"""Kafka's ``max.poll.records``."""
DEFAULT_MAX_BYTES: Final = 1024 * 1024
DEFAULT_ASSIGNORS: Final = ("range", "cooperative-sticky")
"""Kafka's default ``partition.assignment.strategy``."""
FETCH_WAIT_MS: Final = 500
RECORD_OVERHEAD: Final = 16
"""Bytes a record takes in a batch beside its key, value and headers (about)."""
RETRY_BACKOFF_S: Final = 0.1
MAX_UNWRITTEN_EVENTS: Final = 64
"""How many events may wait to be written to the client before its requests are no longer
read: what a client that does not read costs the broker is this, plus the answers to one
request (a notice per offset of an ack refused, its commit's answer), whatever it writes;
records are bounded by the credit."""
EARLIEST: Final = -2
LATEST: Final = -1

SessionAuthorizer = Callable[[grpc.aio.ServicerContext, pb.SessionStart], Awaitable[str | None]]
"""Whether the caller of ``context`` may run ``start``'s session: None, or why not
(answered PERMISSION_DENIED)."""


async def allow_every_session(context: grpc.aio.ServicerContext, start: pb.SessionStart) -> None:
    """The authorizer without ACLs: every caller may read every group and topic."""
    return None


class CoordinatorNotAvailableError(HighwaterError):
    code = ErrorCode.COORDINATOR_NOT_AVAILABLE


class SessionEnded(Exception):
    """The session ends with a gRPC status other than OK."""

    def __init__(self, status: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class BrokerGroupCluster:
    """A :class:`~highwater.group.membership.GroupCluster` over a broker's metadata image."""

    security: ClientSecurity | None = None
    """The process's own TLS (the broker's certificate) toward the coordinator."""

    def __init__(self, requests: RequestHandler) -> None:
        self._requests = requests

    async def find_coordinator(self, group_id: str) -> str:
        reply = self._requests.find_coordinator(pb.FindCoordinatorRequest(keys=[group_id]))
        (answer,) = reply.coordinators
        if answer.error != ErrorCode.NONE:
            raise CoordinatorNotAvailableError(f"group {group_id!r}: {answer.error_message}")
        return f"{answer.host}:{answer.port}"

    async def partition_counts(self, topics: Sequence[str]) -> Mapping[str, int]:
        image = self._requests.partitions.image
        counts = {}
        for name in topics:
            topic = image.topic(name)
            if topic is not None:
                counts[name] = len(topic.partitions)
        return counts


@dataclass(frozen=True, slots=True)
class _SessionStart:
    """A valid ``SessionStart``, with the defaults filled in."""

    group_id: str
    topics: tuple[str, ...]
    partitions: tuple[TopicPartitionKey, ...]
    max_records: int
    max_bytes: int
    reset: int
    settings: GroupSettings
    assignors: tuple[str, ...]


def read_start(request: pb.ConsumerSessionRequest | None) -> _SessionStart:
    """The session a first message asks for; :class:`InvalidRequestError` if it cannot be."""
    if request is None or request.WhichOneof("request") != "start":
        raise InvalidRequestError("the first message of a consumer session must be `start`")
    start = request.start
    if not start.group_id:
        raise InvalidRequestError("start.group_id is required")
    if bool(start.topics) == bool(start.partitions):
        raise InvalidRequestError("start names either topics (a group member) or partitions")
    if any(not t for t in start.topics) or any(not p.topic for p in start.partitions):
        raise InvalidRequestError("a topic name is empty")
    if any(p.partition < 0 for p in start.partitions):
        raise InvalidRequestError("a partition index is negative")
    max_records = start.max_records if start.HasField("max_records") else DEFAULT_MAX_RECORDS
    max_bytes = start.max_bytes if start.HasField("max_bytes") else DEFAULT_MAX_BYTES
    if max_records < 1 or max_bytes < 1:
        raise InvalidRequestError("max_records and max_bytes must be at least 1")
    reset = {
        pb.OFFSET_RESET_UNSPECIFIED: LATEST,
        pb.OFFSET_RESET_LATEST: LATEST,
        pb.OFFSET_RESET_EARLIEST: EARLIEST,
    }.get(start.auto_offset_reset)
    if reset is None:
        raise InvalidRequestError(f"auto_offset_reset {start.auto_offset_reset} is not known")
    assignors = tuple(start.assignors) or DEFAULT_ASSIGNORS
    for name in assignors:
        try:
            assignor_for(name)
        except ValueError as e:
            raise InvalidRequestError(str(e)) from None
    settings = GroupSettings(
        group_id=start.group_id,
        client_id=start.client_id,
        group_instance_id=(
            start.group_instance_id if start.HasField("group_instance_id") else None
        ),
        session_timeout_ms=(
            start.session_timeout_ms if start.HasField("session_timeout_ms") else 45_000
        ),
        max_poll_interval_ms=(
            start.max_poll_interval_ms if start.HasField("max_poll_interval_ms") else 300_000
        ),
    )
    if settings.session_timeout_ms < 1 or settings.max_poll_interval_ms < 1:
        raise InvalidRequestError("session_timeout_ms and max_poll_interval_ms must be positive")
    heartbeat_ms = (
        start.heartbeat_interval_ms
        if start.HasField("heartbeat_interval_ms")
        else min(3_000, max(settings.session_timeout_ms // 3, 1))
    )
    if not 0 < heartbeat_ms < settings.session_timeout_ms:
        raise InvalidRequestError("heartbeat_interval_ms must be below session_timeout_ms")
    settings = dataclasses.replace(settings, heartbeat_interval_ms=heartbeat_ms)
    return _SessionStart(
        group_id=start.group_id,
        topics=tuple(dict.fromkeys(start.topics)),
        partitions=tuple(sorted({(p.topic, p.partition) for p in start.partitions})),
        max_records=max_records,
        max_bytes=max_bytes,
        reset=reset,
        settings=settings,
        assignors=assignors,
    )


class ConsumerSessions:
    """The broker's consumer sessions: :meth:`serve` runs one per stream."""

    def __init__(self, requests: RequestHandler, leaders: LeaderChannels) -> None:
        self.requests = requests
        self.leaders = leaders
        self.cluster = BrokerGroupCluster(requests)
        self.authorizer: SessionAuthorizer = allow_every_session
        """The seam for ACLs (see the module docstring)."""
        self._sessions: set[_Session] = set()
        self._endings: set[asyncio.Task[None]] = set()
        self._closed = False

    @property
    def open_sessions(self) -> int:
        return len(self._sessions)

    @property
    def ending_sessions(self) -> int:
        return len(self._endings)

    async def serve(
        self,
        requests: AsyncIterator[pb.ConsumerSessionRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[pb.ConsumerSessionResponse]:
        """One session over one stream (``Broker.ConsumerSession``)."""
        if self._closed:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the broker is shutting down")
        try:
            start = read_start(await anext(aiter(requests), None))
            self._check_partitions(start)
        except InvalidRequestError as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
            raise AssertionError("unreachable: abort raises") from e
        refusal = await self.authorizer(context, _start_message(start))
        if refusal is not None:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, refusal)
        authorizer = self.authorizer
        session = _Session(self, start, lambda check: authorizer(context, check))
        self._sessions.add(session)
        try:
            async for event in session.run(requests):
                yield event
        except SessionEnded as e:
            await context.abort(e.status, e.message)
        finally:
            self._sessions.discard(session)
            ending = asyncio.create_task(session.end())
            self._endings.add(ending)
            ending.add_done_callback(self._endings.discard)

    def _check_partitions(self, start: _SessionStart) -> None:
        image = self.requests.partitions.image
        for topic, partition in start.partitions:
            registration = image.topic(topic)
            if registration is None or registration.partition(partition) is None:
                raise InvalidRequestError(f"{topic}-{partition} does not exist")

    async def close(self) -> None:
        """End every session (UNAVAILABLE) and wait for their memberships to end."""
        self._closed = True
        for session in list(self._sessions):
            session.shut_down()
        while self._sessions or self._endings:
            await asyncio.gather(*self._endings, return_exceptions=True)
            if self._sessions:
                await asyncio.sleep(0.01)


def _start_message(start: _SessionStart) -> pb.SessionStart:
    message = pb.SessionStart(group_id=start.group_id, topics=start.topics)
    for topic, partition in start.partitions:
        message.partitions.add(topic=topic, partition=partition)
    return message


_END: Final = object()


METADATA_CHECK_INTERVAL_S: Final = 1.0
"""How often a session compares its topics' partition counts in the broker's image with
those its group was assigned from: the image is local, so a check is a few lookups, and a
new partition is consumed within about a second (a Kafka consumer asks the cluster every
``metadata.max.age.ms``)."""


class _Session:
    """One consumer session (see the module docstring)."""

    def __init__(
        self,
        sessions: ConsumerSessions,
        start: _SessionStart,
        authorized: Callable[[pb.SessionStart], Awaitable[str | None]],
    ) -> None:
        """``authorized``: the caller's ACL check (:data:`SessionAuthorizer`), asked again
        before each round of fetches."""
        self._requests = sessions.requests
        self._authorized = authorized
        self._leaders = sessions.leaders
        self.start = start
        self.state = SessionState(start.max_records, start.max_bytes)
        self._cluster = sessions.cluster
        self._joined_counts: Mapping[str, int] | None = None
        """The subscribed topics' partition counts when the session last joined."""
        self.membership = GroupMembership(
            sessions.cluster,
            start.settings,
            [assignor_for(name) for name in start.assignors],
            on_rejoin_needed=self._interrupt,
            polling=self._waiting_for_records,
        )
        self._out: asyncio.Queue[object] = asyncio.Queue()
        self._taken = asyncio.Event()
        """Set when an event is taken from :attr:`_out` to be written."""
        self._wake = asyncio.Event()
        self._last_heard = time.monotonic()
        self._tasks: list[asyncio.Task[None]] = []
        self._record_bytes = 1024
        """About how many fetched bytes a record takes (the last deliveries'): how much a
        fetch from another leader asks for, so that it brings what the credit takes."""

    # -- the stream ----------------------------------------------------------------------

    async def run(
        self, requests: AsyncIterator[pb.ConsumerSessionRequest]
    ) -> AsyncIterator[pb.ConsumerSessionResponse]:
        self._tasks = [
            asyncio.create_task(self._read(requests)),
            asyncio.create_task(self._drive()),
        ]
        if self.start.topics:
            self._tasks.append(asyncio.create_task(self._watch_metadata()))
        try:
            while (item := await self._out.get()) is not _END:
                self._taken.set()
                if isinstance(item, SessionEnded):
                    raise item
                assert isinstance(item, pb.ConsumerSessionResponse)
                yield item
        finally:
            for task in self._tasks:
                task.cancel()
            for task in self._tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task

    def shut_down(self) -> None:
        self._out.put_nowait(
            SessionEnded(grpc.StatusCode.UNAVAILABLE, "the broker is shutting down")
        )

    async def end(self) -> None:
        """The membership ends with the stream: leave the group, close the channels."""
        try:
            if self.start.topics:
                await self.membership.leave()
        finally:
            await self.membership.close()

    def _send(self, **event: object) -> None:
        self._out.put_nowait(pb.ConsumerSessionResponse(**event))  # type: ignore[arg-type]

    def _interrupt(self) -> None:
        self._wake.set()

    def _waiting_for_records(self) -> bool:
        """Whether the client is polling now, for the membership's ``max.poll.interval.ms``:
        holding no records unacknowledged, it waits for records, as a Kafka consumer in
        ``poll()`` (with nothing assigned, or nothing fetched yet) waits, and polls."""
        return self.state.outstanding_records == 0

    # -- what the client says ------------------------------------------------------------

    async def _read(self, requests: AsyncIterator[pb.ConsumerSessionRequest]) -> None:
        """Act on the client's requests in order. A session taken out of the group for not
        polling rejoins as soon as the client speaks again, whatever it says. When the
        client ends its requests, the acknowledged positions are committed before the
        stream ends (Kafka's ``close()``); a stream cut under the reader ends without."""
        try:
            async for request in requests:
                self._last_heard = time.monotonic()
                self.membership.polled()
                kind = request.WhichOneof("request")
                if kind == "ack":
                    self._acknowledge(request.ack)
                    if request.ack.commit:
                        self._send(committed=await self._commit())
                elif kind == "commit":
                    self._send(committed=await self._commit())
                elif kind == "seek":
                    await self._seek(request.seek)
                else:
                    self._out.put_nowait(
                        SessionEnded(
                            grpc.StatusCode.INVALID_ARGUMENT,
                            f"`{kind}` is not a message a session takes after its start",
                        )
                    )
                    return
                if self.start.topics and self.membership.rejoin_needed:
                    self._wake.set()  # a session that stopped polling rejoins (_drive)
                await self._room_to_answer()
        except asyncio.CancelledError:
            raise
        except Exception as e:  # the stream broke under the reader
            log.debug("consumer session of %s: the stream broke: %r", self.start.group_id, e)
        else:
            with contextlib.suppress(HighwaterError):
                await self._commit()
        self._out.put_nowait(_END)

    async def _room_to_answer(self) -> None:
        """Wait until fewer than :data:`MAX_UNWRITTEN_EVENTS` events wait to be written: a
        client that does not read its answers is not read either."""
        while self._out.qsize() >= MAX_UNWRITTEN_EVENTS:
            self._taken.clear()
            await self._taken.wait()

    def _notice(self, code: int, message: str) -> None:
        self._send(notice=pb.SessionNotice(error=code, message=message))  # type: ignore[arg-type]

    def _acknowledge(self, ack: pb.SessionAck) -> None:
        had_credit = self.state.has_credit()
        for item in ack.offsets:
            refusal = self.state.acknowledge((item.topic, item.partition), item.offset)
            if refusal is not None:
                self._notice(ErrorCode.INVALID_REQUEST, refusal)
        if not had_credit and self.state.has_credit():
            self._wake.set()

    async def _seek(self, seek: pb.SessionSeek) -> None:
        tp = (seek.topic, seek.partition)
        offset: int | None = seek.offset
        if seek.offset in (EARLIEST, LATEST):
            offset = await self._list_offset(tp, seek.offset)
        elif seek.offset < 0:
            self._notice(ErrorCode.INVALID_REQUEST, f"seek to offset {seek.offset}")
            return
        if offset is None:
            self._notice(ErrorCode.LEADER_NOT_AVAILABLE, f"{tp[0]}-{tp[1]}: no leader answered")
            return
        refusal = self.state.seek(tp, offset)
        if refusal is not None:
            self._notice(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, refusal)
        self._wake.set()

    async def _commit(
        self, partitions: Sequence[TopicPartitionKey] | None = None
    ) -> pb.SessionCommitted:
        """Commit the acknowledged positions (of ``partitions``, or all held)."""
        offsets = self.state.to_commit(partitions)
        answer = pb.SessionCommitted()
        if not offsets:
            return answer
        results = await self.membership.commit(
            {tp: (offset, epoch, "") for tp, (offset, epoch) in offsets.items()}
        )
        for tp, (offset, _) in sorted(offsets.items()):
            code, message = results.get(tp, (ErrorCode.UNKNOWN_SERVER_ERROR, "no answer"))
            if code == ErrorCode.NONE:
                self.state.committed(tp, offset)
            answer.partitions.add(
                topic=tp[0], partition=tp[1], offset=offset, error=code, error_message=message
            )
        return answer

    # -- membership and fetching ---------------------------------------------------------

    async def _drive(self) -> None:
        try:
            if self.start.partitions:
                self.state.assign(self.start.partitions)
                await self._start_positions(self.start.partitions)
                self._send_assignment(())
            while True:
                if self.start.topics and self.membership.rejoin_needed:
                    if self._stopped_polling():
                        await self._wait_for_wake()
                        continue
                    await self._rebalance()
                    continue
                wanted = self.state.fetchable()
                if not wanted:
                    await self._wait_for_wake()
                    continue
                refusal = await self._authorized(
                    pb.SessionStart(
                        group_id=self.start.group_id, topics=sorted({tp[0] for tp, _ in wanted})
                    )
                )
                if refusal is not None:
                    self._out.put_nowait(SessionEnded(grpc.StatusCode.PERMISSION_DENIED, refusal))
                    return
                await self._fetch_interruptibly(wanted)
        except GroupError as e:
            self._out.put_nowait(SessionEnded(grpc.StatusCode.ABORTED, str(e)))
        except asyncio.CancelledError:
            raise
        except Exception as e:
            log.exception("consumer session of group %s failed", self.start.group_id)
            self._out.put_nowait(SessionEnded(grpc.StatusCode.INTERNAL, repr(e)))

    def _stopped_polling(self) -> bool:
        """Taken out of the group for holding records unacknowledged past
        max.poll.interval.ms: it rejoins only once the client speaks again."""
        idle = time.monotonic() - self._last_heard
        return (
            self.membership.lost
            and self.state.outstanding_records > 0
            and idle * 1000 > self.start.settings.max_poll_interval_ms
        )

    async def _wait_for_wake(self) -> None:
        await self._wake.wait()
        self._wake.clear()

    async def _rebalance(self) -> None:
        membership = self.membership
        if membership.lost and membership.owned:
            lost = membership.owned
            membership.revoked(lost)
            self.state.remove(lost)
            self._send_assignment(lost, lost=True)
        membership.lost = False
        before = membership.partitions_to_revoke_before_join(self.start.topics)
        if before:
            await self._revoke(before)
        self._wake.clear()
        self._joined_counts = await self._cluster.partition_counts(self.start.topics)
        rebalance = await membership.join(self.start.topics)
        if rebalance is None:
            return  # the membership was lost while joining: the next round gives it up
        if rebalance.change.revoked:
            await self._revoke(rebalance.change.revoked)
        added = rebalance.change.added
        self.state.assign(added)
        await self._start_positions(added)
        membership.assigned(added)
        self._send_assignment(())

    async def _watch_metadata(self) -> None:
        """Rejoin when a subscribed topic appeared or gained partitions since the last join,
        so that the leader assigns them; while this session leads, let the membership compare
        the whole group's topics with the counts the generation was assigned from
        (:meth:`GroupMembership.metadata_seen`, Kafka's assignment snapshot)."""
        membership = self.membership
        while True:
            await asyncio.sleep(METADATA_CHECK_INTERVAL_S)
            if membership.rejoin_needed or not membership.is_member():
                continue
            counts = await self._cluster.partition_counts(self.start.topics)
            if self._joined_counts is not None and counts != self._joined_counts:
                log.info(
                    "group %s: the partition counts of %s changed; rejoining",
                    self.start.group_id,
                    list(self.start.topics),
                )
                membership.rejoin_needed = True
                self._interrupt()
                continue
            watched = membership.watched_topics()
            if watched:
                membership.metadata_seen(await self._cluster.partition_counts(watched))

    async def _revoke(self, partitions: Sequence[TopicPartitionKey]) -> None:
        with contextlib.suppress(HighwaterError):
            await self._commit(partitions)
        self.state.remove(partitions)
        self.membership.revoked(partitions)
        self._send_assignment(partitions)

    def _send_assignment(self, revoked: Sequence[TopicPartitionKey], *, lost: bool = False) -> None:
        assignment = pb.SessionAssignment(
            member_id=self.membership.member_id,
            generation_id=self.membership.generation_id,
            lost=lost,
        )
        for topic, partition in self.state.held():
            assignment.partitions.add(topic=topic, partition=partition)
        for topic, partition in sorted(revoked):
            assignment.revoked.add(topic=topic, partition=partition)
        self._send(assignment=assignment)

    async def _start_positions(self, partitions: Sequence[TopicPartitionKey]) -> None:
        """The group's committed offset of each partition, else the reset policy's."""
        if not partitions:
            return
        while True:
            try:
                committed = await self.membership.committed(partitions)
                break
            except GroupError as e:
                if e.code not in (ErrorCode.COORDINATOR_NOT_AVAILABLE, ErrorCode.NOT_COORDINATOR):
                    raise
                await asyncio.sleep(RETRY_BACKOFF_S)
        for tp in partitions:
            found = committed.get(tp)
            if found is not None:
                self.state.start_at(tp, found[0], committed=True, leader_epoch=found[1])
            else:
                await self._reset(tp)

    async def _reset(self, tp: TopicPartitionKey) -> None:
        while tp in self.state.partitions:
            offset = await self._list_offset(tp, self.start.reset)
            if offset is not None:
                self.state.start_at(tp, offset, committed=False)
                return
            await asyncio.sleep(RETRY_BACKOFF_S)

    def _leader(self, tp: TopicPartitionKey) -> int | None:
        topic = self._requests.partitions.image.topic(tp[0])
        registration = None if topic is None else topic.partition(tp[1])
        if registration is None or not registration.has_leader:
            return None
        return registration.leader

    async def _list_offset(self, tp: TopicPartitionKey, timestamp: int) -> int | None:
        """The offset ListOffsets answers at the partition's leader; None if it did not."""
        leader = self._leader(tp)
        if leader is None:
            return None
        request = pb.ListOffsetsRequest()
        request.topics.add(topic=tp[0]).partitions.add(partition=tp[1], timestamp=timestamp)
        if leader == self._requests.node_id:
            reply = self._requests.list_offsets(request)
        else:
            stub = self._leaders.stub(leader)
            if stub is None:
                return None
            try:
                reply = await stub.ListOffsets(request, timeout=10)
            except grpc.aio.AioRpcError:
                return None
        answer = reply.topics[0].partitions[0]
        return answer.offset if answer.error == ErrorCode.NONE else None

    async def _fetch_interruptibly(self, wanted: list[tuple[TopicPartitionKey, int]]) -> None:
        """One round of fetches, given up when a rebalance or a seek interrupts it."""
        self._wake.clear()
        fetch = asyncio.create_task(self._fetch(wanted))
        woken = asyncio.create_task(self._wake.wait())
        try:
            await asyncio.wait({fetch, woken}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (fetch, woken):
                task.cancel()
            for task in (fetch, woken):
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def _fetch(self, wanted: list[tuple[TopicPartitionKey, int]]) -> None:
        by_leader: dict[int, list[tuple[TopicPartitionKey, int]]] = {}
        fetched_from = dict(wanted)
        for tp, offset in wanted:
            leader = self._leader(tp)
            if leader is not None:
                by_leader.setdefault(leader, []).append((tp, offset))
        if not by_leader:
            await asyncio.sleep(RETRY_BACKOFF_S)
            return
        replies = await asyncio.gather(
            *(self._fetch_from(leader, items) for leader, items in by_leader.items())
        )
        retry = False
        for reply in replies:
            if reply is None:
                retry = True
                continue
            for topic in reply.topics:
                for answer in topic.partitions:
                    tp = (topic.topic, answer.partition)
                    retry = await self._deliver(tp, fetched_from[tp], answer) or retry
        if retry:
            await asyncio.sleep(RETRY_BACKOFF_S)

    async def _fetch_from(
        self, leader: int, items: list[tuple[TopicPartitionKey, int]]
    ) -> pb.FetchResponse | None:
        """One fetch from ``leader``. This broker's own partitions are read as batches and
        only the records the credit allows are decoded; another leader is asked for PLAIN
        records, as many bytes as the credit's records are likely to take."""
        local = leader == self._requests.node_id
        room = self.state.byte_room()
        if not local:
            room = max(min(room, self.state.record_room() * self._record_bytes), 1)
        request = pb.FetchRequest(
            record_format=pb.RECORD_FORMAT_BATCHES if local else pb.RECORD_FORMAT_PLAIN,
            max_wait_ms=FETCH_WAIT_MS,
            min_bytes=1,
            max_bytes=room,
        )
        by_topic: dict[str, pb.FetchTopic] = {}
        for (topic, partition), offset in items:
            entry = by_topic.get(topic)
            if entry is None:
                entry = by_topic[topic] = request.topics.add(topic=topic)
            entry.partitions.add(partition=partition, fetch_offset=offset, partition_max_bytes=room)
        if local:
            reply = await self._requests.fetch(request)
            for topic_answer in reply.topics:
                for answer in topic_answer.partitions:
                    data, answer.records = answer.records, b""
                    if answer.error != ErrorCode.NONE or not data:
                        continue
                    offset = dict(items)[(topic_answer.topic, answer.partition)]
                    try:
                        add_plain_records(answer, data, offset, self.state.record_room())
                    except HighwaterError as e:
                        answer.error = e.code  # type: ignore[assignment]
            return reply
        stub = self._leaders.stub(leader)
        if stub is None:
            return None
        try:
            return await stub.Fetch(request, timeout=FETCH_WAIT_MS / 1000 + 10)
        except grpc.aio.AioRpcError as e:
            log.debug("consumer session: fetch from broker %d failed: %s", leader, e.code())
            return None

    async def _deliver(
        self, tp: TopicPartitionKey, fetched_from: int, answer: pb.FetchPartitionResponse
    ) -> bool:
        """Send what fits the credit of one partition's answer; whether to back off."""
        progress = self.state.partitions.get(tp)
        if progress is None or progress.position != fetched_from:
            return False  # revoked or sought meanwhile
        if answer.error == ErrorCode.OFFSET_OUT_OF_RANGE:
            await self._reset(tp)
            return False
        if answer.error != ErrorCode.NONE:
            return True
        records = answer.plain_records
        if not records:
            return False
        sizes = [record_size(r) for r in records]
        count = self.state.deliverable(sizes)
        if count == 0:
            self.state.short_of_bytes()
            return False
        self._record_bytes = max(sum(sizes[:count]) // count + RECORD_OVERHEAD, 1)
        delivered = pb.SessionRecords(
            topic=tp[0], partition=tp[1], high_watermark=answer.high_watermark
        )
        delivered.records.extend(records[:count])
        self.state.delivered(
            tp, ((r.offset, record_size(r), r.leader_epoch) for r in records[:count])
        )
        self._send(records=delivered)
        if count < len(sizes):
            self.state.short_of_bytes()  # (or of records: out of credit either way)
        return False
