"""``CoordinatorServer``: the group coordinator service, the asyncio and gRPC edge of the core.

It registers with the controller and heartbeats (its session keeps its partitions of
``__consumer_offsets``); it follows the metadata image (an observer of the metadata log,
or the embedded server's own image) and serves the partitions the controller assigns it,
as :class:`~highwater.coordinator.ownership.PartitionOwnership` decides (never one taken
over twice in a coordinator epoch): for each it fences earlier owners and replays the
partition (:mod:`highwater.coordinator.offsets_log`), then hands requests to the pure
:class:`~highwater.coordinator.core.GroupCoordinatorCore`. The core's effects are carried
out here: replies resolve the futures of waiting gRPC calls, writes go to the partition's
appender (writes queued while one is in flight go together as one batch), and a timer
wakes the core at its next deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

import grpc
import grpc.aio

from highwater.config.listeners import DEFAULT_LISTENER_NAME
from highwater.controller_api import messages as m
from highwater.controller_api.client import ControllerClient, ControllerUnavailableError
from highwater.coordinator.authorization import (
    group_allowed,
    narrow_offset_commit,
    narrow_offset_delete,
    narrow_offset_fetch,
    visible_groups,
)
from highwater.coordinator.core import (
    CommitResult,
    DeleteResult,
    Effect,
    GroupCoordinatorCore,
    GroupCoordinatorSettings,
    JoinRequest,
    JoinResult,
    OffsetDeleteResult,
    OffsetToCommit,
    RebalanceCompleted,
    Reply,
    SyncRequest,
    SyncResult,
    Write,
)
from highwater.coordinator.group import Protocol as GroupProtocol
from highwater.coordinator.metrics import CoordinatorMetrics
from highwater.coordinator.offsets_log import (
    CoordinatorFencedError,
    OffsetsLogSettings,
    OffsetsTopicClient,
    PartitionAppender,
)
from highwater.coordinator.ownership import PartitionOwnership
from highwater.coordinator.records import CorruptOffsetsRecordError, OffsetsRecord, decode_record
from highwater.errors import HighwaterError
from highwater.metadata.consumer_offsets import CONSUMER_OFFSETS_TOPIC, partition_for_group
from highwater.metadata.image import MetadataImage
from highwater.metadata.records import BrokerEndpoint
from highwater.rpc.auth import follow_image
from highwater.rpc.endpoints import parse_endpoint
from highwater.security.acl import AclOperation
from highwater.storage.topic_partition import TopicPartition
from highwater.v1 import coordinator_pb2 as pb
from highwater.v1 import coordinator_pb2_grpc
from highwater.v1.common_pb2 import ErrorCode

log = logging.getLogger(__name__)

COORDINATOR_SERVICE_NAME: Final = "highwater.v1.GroupCoordinator"
DEFAULT_OFFSETS_TOPIC_PARTITIONS: Final = 50
_MAX_BATCH_BYTES: Final = 512 * 1024
DEFAULT_SESSION_TIMEOUT_MS: Final = 45_000
"""An unset ``JoinGroupRequest.session_timeout_ms``: Kafka's ``session.timeout.ms``."""
DEFAULT_REBALANCE_TIMEOUT_MS: Final = 300_000
"""An unset ``rebalance_timeout_ms``: Kafka's ``max.poll.interval.ms``, which its consumer
sends as the rebalance timeout."""


class ImageSource(Protocol):
    @property
    def image(self) -> MetadataImage: ...

    def add_listener(self, listener: Callable[[MetadataImage], None]) -> None: ...


@dataclass(frozen=True, slots=True)
class CoordinatorSettings:
    """The coordinator process's settings, with Kafka's names and defaults."""

    group: GroupCoordinatorSettings = field(default_factory=GroupCoordinatorSettings)
    offsets_log: OffsetsLogSettings = field(default_factory=OffsetsLogSettings)
    heartbeat_interval_ms: int = 2_000
    """How often the coordinator heartbeats to the controller."""
    session_timeout_ms: int = 9_000
    """The controller's ``coordinator.session.timeout.ms`` (or less): once this long has
    passed since the last acknowledged heartbeat was sent, the controller may have given
    the partitions to another coordinator, so this one stops serving them."""
    registration_retry_backoff_ms: int = 500
    initial_registration_timeout_ms: int = 60_000
    """``initial.broker.registration.timeout.ms``: how long the first registration is tried
    (no controller answering, a previous incarnation's session lasting) before the
    coordinator gives up starting."""
    unregister_timeout_ms: int = 5_000
    """How long ``stop`` waits for the controller to take its partitions back."""
    rack: str | None = None


@dataclass(slots=True)
class _Partition:
    """A partition of ``__consumer_offsets`` this coordinator was assigned."""

    epoch: int
    task: asyncio.Task[None] | None = None
    writes: list[Write] = field(default_factory=list)
    wake: asyncio.Event = field(default_factory=asyncio.Event)


class CoordinatorServer:
    """One group coordinator (see the module docstring): ``await start()``, ``await stop()``;
    serve :meth:`add_servicer` on a gRPC server."""

    def __init__(
        self,
        *,
        node_id: int,
        advertised: str,
        controllers: Iterable[str],
        metadata: ImageSource,
        settings: CoordinatorSettings | None = None,
        report_serving: Callable[[str, bool], None] | None = None,
        listeners: Sequence[BrokerEndpoint] = (),
    ) -> None:
        """``report_serving``: where the coordinator says whether it can serve, for its
        gRPC host's health (:meth:`~highwater.rpc.server.GrpcHost.report_serving`);
        ``listeners``: every advertised listener, registered (empty: ``advertised`` as
        the one listener ``PLAINTEXT``)."""
        self.node_id = node_id
        self._report_serving = report_serving
        self.advertised = advertised
        self.listeners = tuple(listeners)
        self.settings = settings or CoordinatorSettings()
        self.controller = ControllerClient(list(controllers))
        self._metadata = metadata
        follow_image(lambda: metadata.image)
        self.core = GroupCoordinatorCore(
            self.settings.group, self.partition_for, partition_exists=self.partition_exists
        )
        self.metrics = CoordinatorMetrics(self.core)
        self.offsets = OffsetsTopicClient(metadata, self.settings.offsets_log)
        self.ownership = PartitionOwnership(
            node_id, self.settings.session_timeout_ms, lambda: str(uuid.uuid4())
        )
        """Which partitions this coordinator serves, in which epochs, under which
        incarnation, and until when (its session lease, in monotonic ms)."""
        self.registration_epoch = -1
        self._partitions: dict[int, _Partition] = {}
        self._waiting: dict[int, asyncio.Future[object]] = {}
        self._tokens = itertools.count()
        self._timer_wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False

    @property
    def incarnation_id(self) -> str:
        """The incarnation registered (or being registered) with the controller."""
        return self.ownership.incarnation_id

    # -- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        await self._register(initial=True)
        self._metadata.add_listener(self._on_image)
        self._tasks = [
            asyncio.create_task(self._heartbeat_forever()),
            asyncio.create_task(self._timer_forever()),
        ]
        self._on_image(self._metadata.image)
        self._report_readiness()
        log.info("coordinator %d registered with epoch %d", self.node_id, self.registration_epoch)

    async def stop(self) -> None:
        """Stop serving the partitions, then give them back to the controller, which
        moves them at once: a partition leaves a live coordinator only once it has let it
        go (:mod:`highwater.controller.coordinators`), and this one has."""
        self._stopping = True
        self._report_readiness()
        for partition in list(self._partitions):
            await self._release(partition)
        if self.registration_epoch >= 0:
            with contextlib.suppress(HighwaterError, TimeoutError, grpc.aio.AioRpcError):
                async with asyncio.timeout(self.settings.unregister_timeout_ms / 1000):
                    await self.controller.unregister_coordinator(
                        m.UnregisterCoordinatorRequest(self.node_id, self.registration_epoch)
                    )
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for future in self._waiting.values():
            if not future.done():
                future.cancel()
        await self.offsets.close()
        await self.controller.close()

    async def _register(self, *, initial: bool = False) -> None:
        """Register the current incarnation; its lease runs from the first attempt sent.

        The first registration (``initial``) is tried for
        ``initial.broker.registration.timeout.ms``, as a broker's, then fails the start
        naming the setting; a later one (the session lost) fails as a heartbeat does, and
        the next heartbeat tries again."""
        sent = time.monotonic()
        timeout_ms = self.settings.initial_registration_timeout_ms
        deadline = sent + timeout_ms / 1000 if initial else None
        incarnation_id = self.ownership.incarnation_id
        host, port = parse_endpoint(self.advertised)
        request = m.RegisterCoordinatorRequest(
            coordinator_id=self.node_id,
            incarnation_id=incarnation_id,
            listeners=self.listeners or (BrokerEndpoint(DEFAULT_LISTENER_NAME, host, port),),
            rack=self.settings.rack,
        )
        session_not_expired = HighwaterError(
            f"coordinator {self.node_id} could not register in {timeout_ms} ms "
            "(initial.broker.registration.timeout.ms): the previous incarnation's "
            "session has not expired"
        )
        refused = False
        while True:
            try:
                reply = await self.controller.register_coordinator(
                    request,
                    timeout_s=None if deadline is None else max(deadline - time.monotonic(), 0.001),
                )
            except ControllerUnavailableError as e:
                if deadline is None:
                    raise
                if refused:  # refused as a duplicate before: the last try ran out of time
                    raise session_not_expired from e
                raise HighwaterError(
                    f"coordinator {self.node_id} could not register with the controllers in "
                    f"{timeout_ms} ms (initial.broker.registration.timeout.ms): {e}"
                ) from e
            if reply.error == ErrorCode.NONE:
                self.registration_epoch = reply.registration_epoch
                self.ownership.registered(incarnation_id)
                self._renew_lease(sent)
                return
            if reply.error != ErrorCode.DUPLICATE_BROKER_REGISTRATION:
                raise HighwaterError(
                    f"coordinator {self.node_id} could not register: {reply.error_message}"
                )
            if deadline is not None and time.monotonic() >= deadline:
                raise session_not_expired
            refused = True
            await asyncio.sleep(self.settings.registration_retry_backoff_ms / 1000)

    async def _heartbeat_forever(self) -> None:
        interval = self.settings.heartbeat_interval_ms / 1000
        while True:
            sent = time.monotonic()
            try:
                reply = await self.controller.coordinator_heartbeat(
                    m.CoordinatorHeartbeatRequest(
                        self.node_id,
                        self.registration_epoch,
                        metadata_offset=self.ownership.applied_offset,
                    )
                )
                if reply.error in (
                    ErrorCode.BROKER_ID_NOT_REGISTERED,
                    ErrorCode.STALE_BROKER_EPOCH,
                ):
                    # The session expired (a long pause): the partitions went elsewhere
                    # and come back, with new epochs, after registering again.
                    log.warning(
                        "coordinator %d: registration lost; registering again", self.node_id
                    )
                    self.check_lease()
                    await self._register()
                elif reply.error == ErrorCode.NONE:
                    self._renew_lease(sent)
                if self.ownership.register_again:
                    # A partition still assigned in an epoch it was taken over in (after
                    # a lapse or a failure): a new incarnation gets new epochs.
                    log.warning(
                        "coordinator %d: registering again as incarnation %s to take its "
                        "partitions over in new coordinator epochs",
                        self.node_id,
                        self.ownership.incarnation_id,
                    )
                    await self._register()
            except HighwaterError as e:
                log.warning("coordinator %d: heartbeat failed: %s", self.node_id, e)
            self.check_lease()
            await asyncio.sleep(interval)

    # -- the session lease ------------------------------------------------------------------

    def check_lease(self) -> None:
        """Stop serving every partition once the controller may have given them away: the
        last acknowledged heartbeat was sent a session timeout ago or more (a long pause,
        a network cut from the controller). Waiting requests are answered NOT_COORDINATOR
        and clients find the new coordinator; nothing is served from a cache another
        coordinator's commits may have overtaken. Once a heartbeat is acknowledged, the
        partitions still assigned here are taken over again, in new coordinator epochs: the
        coordinator registers again as a new incarnation first
        (:mod:`highwater.coordinator.ownership`)."""
        stop = self.ownership.lapse(_monotonic_ms())
        if stop is None:
            return
        if stop:
            log.warning(
                "coordinator %d: no heartbeat acknowledged for the session timeout; "
                "not serving partitions %s until one is",
                self.node_id,
                sorted(stop),
            )
        self._stop_serving(stop)
        self._report_readiness()

    def _renew_lease(self, sent: float) -> None:
        """A heartbeat (or registration) sent at ``sent`` was acknowledged."""
        if self.ownership.renew(int(sent * 1000)):
            self._on_image(self._metadata.image)

    # -- partitions -------------------------------------------------------------------------

    def partition_for(self, group_id: str) -> int:
        return partition_for_group(group_id, self.offsets_partition_count())

    def partition_exists(self, tp: TopicPartition) -> bool:
        """Whether the metadata image has ``tp``: OffsetCommit answers a partition it has
        not UNKNOWN_TOPIC_OR_PARTITION (Kafka's ``handleOffsetCommitRequest``)."""
        topic = self._metadata.image.topic(tp.topic)
        return topic is not None and tp.partition in topic.partitions

    def offsets_partition_count(self) -> int:
        image = self._metadata.image
        topic = image.topic(CONSUMER_OFFSETS_TOPIC)
        if topic is not None:
            return len(topic.partitions)
        assigned = image.coordinators.assignments
        return max(assigned) + 1 if assigned else DEFAULT_OFFSETS_TOPIC_PARTITIONS

    def _on_image(self, image: MetadataImage) -> None:
        """Carry out what :meth:`PartitionOwnership.follow` decides for ``image``."""
        if self._stopping:
            return
        change = self.ownership.follow(image)
        self._stop_serving(change.stop)
        for partition, epoch in change.take_over:
            state = _Partition(epoch)
            self._partitions[partition] = state
            self.core.begin_loading(partition)
            state.task = asyncio.create_task(self._serve_partition(partition, state))
        self._report_readiness()

    def _stop_serving(self, partitions: Iterable[int]) -> None:
        for partition in partitions:
            state = self._partitions.pop(partition, None)
            if state is not None:
                self._drop(partition, state)

    def _report_readiness(self) -> None:
        """Health: the GroupCoordinator service is SERVING while this incarnation is
        registered, serves its lease, and has loaded every ``__consumer_offsets`` partition
        assigned to it (before, its groups' calls answer COORDINATOR_LOAD_IN_PROGRESS)."""
        if self._report_serving is None:
            return
        me = self._metadata.image.coordinator(self.node_id)
        serving = (
            not self._stopping
            and not self.ownership.lapsed
            and me is not None
            and me.incarnation_id == self.ownership.incarnation_id
            and not self.core.loading
        )
        self._report_serving(COORDINATOR_SERVICE_NAME, serving)

    def _drop(self, partition: int, state: _Partition) -> None:
        if state.task is not None:
            state.task.cancel()
        self._apply(self.core.unload(partition))
        log.info("coordinator %d: no longer serves partition %d", self.node_id, partition)

    async def _release(self, partition: int) -> None:
        state = self._partitions.pop(partition, None)
        if state is None:
            return
        self.ownership.lost(partition, state.epoch, fenced=False)
        self._drop(partition, state)
        if state.task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await state.task

    async def _serve_partition(self, partition: int, state: _Partition) -> None:
        """Take the partition over, replay it, then append the core's writes in order."""
        appender = PartitionAppender(
            self.offsets,
            partition,
            self.node_id,
            state.epoch,
            still_owner=lambda: self._partitions.get(partition) is state,
        )
        fenced = False
        try:
            started = time.monotonic()
            marker_offset = await appender.fence()
            raw = await self.offsets.read(partition, marker_offset)
            self.core.load(partition, state.epoch, _decode_all(partition, raw), _now_ms())
            self._timer_wake.set()
            self._report_readiness()
            log.info(
                "coordinator %d: serving partition %d (epoch %d, %d records replayed in %.0f ms)",
                self.node_id,
                partition,
                state.epoch,
                len(raw),
                (time.monotonic() - started) * 1000,
            )
            while True:
                if not state.writes:
                    state.wake.clear()
                    await state.wake.wait()
                    continue
                writes = _take_batch(state.writes)
                records = [r for w in writes for r in w.records]
                error = await appender.append(records)
                now = _now_ms()
                for write in writes:
                    self._apply(self.core.write_completed(write.write_id, error, now))
        except CoordinatorFencedError as e:
            # A newer owner appended: the image will show the partition moved.
            log.warning("coordinator %d: %s", self.node_id, e)
            fenced = True
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("coordinator %d: partition %d failed", self.node_id, partition)
        if self._partitions.get(partition) is state:
            self._partitions.pop(partition)
            self.ownership.lost(partition, state.epoch, fenced=fenced)
            self._apply(self.core.unload(partition))
            # Failed, it is most likely still assigned here in this epoch: the ownership
            # then has a new incarnation registered, for new epochs (_heartbeat_forever).
            self._on_image(self._metadata.image)

    # -- effects and time -------------------------------------------------------------------

    def _apply(self, effects: Iterable[Effect]) -> None:
        for effect in effects:
            if isinstance(effect, Reply):
                assert isinstance(effect.token, int)
                future = self._waiting.pop(effect.token, None)
                if future is not None and not future.done():
                    future.set_result(effect.result)
            elif isinstance(effect, RebalanceCompleted):
                self.metrics.rebalance_completed(effect)
            else:
                state = self._partitions.get(effect.partition)
                if state is None:
                    self._apply(
                        self.core.write_completed(
                            effect.write_id, ErrorCode.NOT_COORDINATOR, _now_ms()
                        )
                    )
                    continue
                state.writes.append(effect)
                state.wake.set()
        self._timer_wake.set()

    async def _timer_forever(self) -> None:
        """Tick the core at its next deadline, or sooner when something changed it."""
        while not self._stopping:
            deadline = self.core.next_deadline()
            self._timer_wake.clear()
            delay = None if deadline is None else (deadline - _now_ms()) / 1000
            if delay is not None and delay <= 0:
                # A coordinator that wakes from a pause acts on no group before it knows
                # its lease holds: it would expire members that were heartbeating to
                # nobody while it slept, and store the groups it emptied so.
                self.check_lease()
                self._apply(self.core.tick(_now_ms()))
                continue
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for can swallow the
            # cancellation of a stop that raced with a wake-up.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._timer_wake.wait()

    async def _call(self, start: Callable[[int], list[Effect]]) -> object:
        """Run a core call that answers by token; wait for its answer."""
        token = next(self._tokens)
        future: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        self._waiting[token] = future
        try:
            self._apply(start(token))
            return await future
        finally:
            self._waiting.pop(token, None)

    # -- the gRPC API -----------------------------------------------------------------------

    def add_servicer(self, server: grpc.aio.Server) -> None:
        coordinator_pb2_grpc.add_GroupCoordinatorServicer_to_server(_Servicer(self), server)

    async def join_group(self, request: pb.JoinGroupRequest, peer: str) -> pb.JoinGroupResponse:
        join = JoinRequest(
            group_id=request.group_id,
            member_id=request.member_id,
            group_instance_id=_optional(request, "group_instance_id"),
            protocol_type=request.protocol_type,
            protocols=tuple(GroupProtocol(p.name, p.metadata) for p in request.protocols),
            session_timeout_ms=(
                request.session_timeout_ms
                if request.HasField("session_timeout_ms")
                else DEFAULT_SESSION_TIMEOUT_MS
            ),
            rebalance_timeout_ms=(
                request.rebalance_timeout_ms
                if request.HasField("rebalance_timeout_ms")
                else DEFAULT_REBALANCE_TIMEOUT_MS
            ),
            client_id=request.client_id,
            client_host=_client_host(peer),
        )
        result = await self._call(lambda token: self.core.join_group(token, join, _now_ms()))
        assert isinstance(result, JoinResult)
        response = pb.JoinGroupResponse(
            error=_code(result.error),
            error_message=result.error_message,
            generation_id=result.generation_id,
            protocol_type=result.protocol_type,
            protocol_name=result.protocol_name,
            leader=result.leader,
            member_id=result.member_id,
            skip_assignment=result.skip_assignment,
        )
        for member in result.members:
            entry = response.members.add(member_id=member.member_id, metadata=member.metadata)
            if member.group_instance_id is not None:
                entry.group_instance_id = member.group_instance_id
        return response

    async def sync_group(self, request: pb.SyncGroupRequest) -> pb.SyncGroupResponse:
        sync = SyncRequest(
            group_id=request.group_id,
            generation_id=request.generation_id,
            member_id=request.member_id,
            group_instance_id=_optional(request, "group_instance_id"),
            protocol_type=request.protocol_type,
            protocol_name=request.protocol_name,
            assignments={a.member_id: a.assignment for a in request.assignments},
        )
        result = await self._call(lambda token: self.core.sync_group(token, sync, _now_ms()))
        assert isinstance(result, SyncResult)
        return pb.SyncGroupResponse(
            error=_code(result.error),
            error_message=result.error_message,
            protocol_type=result.protocol_type,
            protocol_name=result.protocol_name,
            assignment=result.assignment,
        )

    def heartbeat(self, request: pb.HeartbeatRequest) -> pb.HeartbeatResponse:
        outcome = self.core.heartbeat(
            request.group_id,
            request.member_id,
            request.generation_id,
            _optional(request, "group_instance_id"),
            _now_ms(),
        )
        self._timer_wake.set()
        return pb.HeartbeatResponse(error=_code(outcome.error), error_message=outcome.error_message)

    def leave_group(self, request: pb.LeaveGroupRequest) -> pb.LeaveGroupResponse:
        members = [(mm.member_id, _optional(mm, "group_instance_id")) for mm in request.members]
        outcomes, effects = self.core.leave_group(request.group_id, members, _now_ms())
        self._apply(effects)
        response = pb.LeaveGroupResponse()
        for (member_id, instance_id), outcome in zip(members, outcomes, strict=True):
            entry = response.members.add(
                member_id=member_id, error=outcome.error, error_message=outcome.error_message
            )
            if instance_id is not None:
                entry.group_instance_id = instance_id
        errors = {o.error for o in outcomes} - {ErrorCode.NONE}
        if len(errors) == 1 and len(outcomes) == 1:
            response.error = _code(outcomes[0].error)
            response.error_message = outcomes[0].error_message
        return response

    async def offset_commit(self, request: pb.OffsetCommitRequest) -> pb.OffsetCommitResponse:
        items = [
            OffsetToCommit(
                TopicPartition(topic.name, p.partition_index),
                p.committed_offset,
                p.committed_leader_epoch if p.HasField("committed_leader_epoch") else -1,
                p.metadata,
            )
            for topic in request.topics
            for p in topic.partitions
        ]
        result = await self._call(
            lambda token: self.core.commit_offsets(
                token,
                request.group_id,
                request.member_id,
                request.generation_id if request.HasField("generation_id") else -1,
                _optional(request, "group_instance_id"),
                items,
                _now_ms(),
            )
        )
        assert isinstance(result, CommitResult)
        response = pb.OffsetCommitResponse()
        by_topic: dict[str, pb.OffsetCommitTopicResult] = {}
        for tp, outcome in result.errors.items():
            topic_result = by_topic.get(tp.topic)
            if topic_result is None:
                topic_result = response.topics.add(name=tp.topic)
                by_topic[tp.topic] = topic_result
            topic_result.partitions.add(
                partition_index=tp.partition,
                error=outcome.error,
                error_message=outcome.error_message,
            )
        codes = {o.error for o in result.errors.values()}
        if len(codes) == 1 and items:
            only = next(iter(result.errors.values()))
            response.error, response.error_message = _code(only.error), only.error_message
        return response

    def offset_fetch(self, request: pb.OffsetFetchRequest) -> pb.OffsetFetchResponse:
        wanted: list[TopicPartition] | None = None
        if not request.all_topics:
            wanted = [
                TopicPartition(t.name, p) for t in request.topics for p in t.partition_indexes
            ]
        outcome, offsets = self.core.fetch_offsets(request.group_id, wanted)
        response = pb.OffsetFetchResponse(
            error=_code(outcome.error), error_message=outcome.error_message
        )
        by_topic: dict[str, pb.OffsetFetchTopicResult] = {}
        for tp, fetched in offsets.items():
            topic_result = by_topic.get(tp.topic)
            if topic_result is None:
                topic_result = response.topics.add(name=tp.topic)
                by_topic[tp.topic] = topic_result
            topic_result.partitions.add(
                partition_index=tp.partition,
                committed_offset=fetched.offset,
                committed_leader_epoch=fetched.leader_epoch,
                metadata=fetched.metadata,
                error=fetched.error,
            )
        return response

    def list_groups(self, request: pb.ListGroupsRequest) -> pb.ListGroupsResponse:
        outcome, listings = self.core.list_groups(request.states_filter)
        response = pb.ListGroupsResponse(
            error=_code(outcome.error), error_message=outcome.error_message
        )
        if self.ownership.lapsed or self._stopping:
            # Its partitions are not served (their groups are missing from the list) until
            # a heartbeat renews the lease: as Kafka's inactive coordinator, say so.
            response.error = ErrorCode.COORDINATOR_NOT_AVAILABLE
            response.error_message = f"coordinator {self.node_id} serves no partition now"
        for listing in listings:
            response.groups.add(
                group_id=listing.group_id,
                protocol_type=listing.protocol_type,
                group_state=listing.state.value,
            )
        return response

    def describe_groups(self, request: pb.DescribeGroupsRequest) -> pb.DescribeGroupsResponse:
        response = pb.DescribeGroupsResponse()
        for group_id in request.group_ids:
            d = self.core.describe_group(group_id)
            entry = response.groups.add(
                error=d.error,
                error_message=d.error_message,
                group_id=d.group_id,
                group_state=d.state.value,
                protocol_type=d.protocol_type,
                protocol_name=d.protocol_name,
                generation_id=d.generation_id,
                leader=d.leader,
            )
            for member in d.members:
                described = entry.members.add(
                    member_id=member.member_id,
                    client_id=member.client_id,
                    client_host=member.client_host,
                    member_metadata=member.metadata,
                    member_assignment=member.assignment,
                )
                if member.group_instance_id is not None:
                    described.group_instance_id = member.group_instance_id
        return response

    async def delete_groups(self, request: pb.DeleteGroupsRequest) -> pb.DeleteGroupsResponse:
        group_ids = list(dict.fromkeys(request.group_ids))
        result = await self._call(
            lambda token: self.core.delete_groups(token, group_ids, _now_ms())
        )
        assert isinstance(result, DeleteResult)
        response = pb.DeleteGroupsResponse()
        for group_id in group_ids:
            outcome = result.errors[group_id]
            response.results.add(
                group_id=group_id, error=outcome.error, error_message=outcome.error_message
            )
        return response

    async def offset_delete(self, request: pb.OffsetDeleteRequest) -> pb.OffsetDeleteResponse:
        partitions = [
            TopicPartition(t.name, p) for t in request.topics for p in t.partition_indexes
        ]
        result = await self._call(
            lambda token: self.core.delete_offsets(token, request.group_id, partitions, _now_ms())
        )
        assert isinstance(result, OffsetDeleteResult)
        response = pb.OffsetDeleteResponse(
            error=_code(result.error.error), error_message=result.error.error_message
        )
        by_topic: dict[str, pb.OffsetDeleteTopicResult] = {}
        for tp, outcome in result.partitions.items():
            topic_result = by_topic.get(tp.topic)
            if topic_result is None:
                topic_result = by_topic[tp.topic] = response.topics.add(name=tp.topic)
            topic_result.partitions.add(
                partition_index=tp.partition,
                error=_code(outcome.error),
                error_message=outcome.error_message,
            )
        return response


class _Servicer(coordinator_pb2_grpc.GroupCoordinatorServicer):
    """``highwater.v1.GroupCoordinator`` over a :class:`CoordinatorServer`."""

    def __init__(self, server: CoordinatorServer) -> None:
        self.server = server
        self._check_lease = server.check_lease
        """Run before every call: a coordinator whose lease lapsed serves nothing."""

    async def JoinGroup(
        self, request: pb.JoinGroupRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.JoinGroupResponse:
        self._check_lease()
        if not group_allowed(context, AclOperation.READ, request.group_id):
            return pb.JoinGroupResponse(error=_DENIED, error_message=_denied(request.group_id))
        return await self.server.join_group(request, context.peer())

    async def SyncGroup(
        self, request: pb.SyncGroupRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.SyncGroupResponse:
        self._check_lease()
        if not group_allowed(context, AclOperation.READ, request.group_id):
            return pb.SyncGroupResponse(error=_DENIED, error_message=_denied(request.group_id))
        return await self.server.sync_group(request)

    async def Heartbeat(
        self, request: pb.HeartbeatRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.HeartbeatResponse:
        self._check_lease()
        if not group_allowed(context, AclOperation.READ, request.group_id):
            return pb.HeartbeatResponse(error=_DENIED, error_message=_denied(request.group_id))
        return self.server.heartbeat(request)

    async def LeaveGroup(
        self, request: pb.LeaveGroupRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.LeaveGroupResponse:
        self._check_lease()
        if not group_allowed(context, AclOperation.READ, request.group_id):
            return pb.LeaveGroupResponse(error=_DENIED, error_message=_denied(request.group_id))
        return self.server.leave_group(request)

    async def OffsetCommit(
        self, request: pb.OffsetCommitRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.OffsetCommitResponse:
        self._check_lease()
        if not group_allowed(context, AclOperation.READ, request.group_id):
            return pb.OffsetCommitResponse(error=_DENIED, error_message=_denied(request.group_id))
        allowed, refused = narrow_offset_commit(request, context)
        if refused and not allowed.topics:
            return pb.OffsetCommitResponse(topics=refused)
        answer = await self.server.offset_commit(allowed)
        answer.topics.extend(refused)
        return answer

    async def OffsetFetch(
        self, request: pb.OffsetFetchRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.OffsetFetchResponse:
        self._check_lease()
        if not group_allowed(context, AclOperation.DESCRIBE, request.group_id):
            return pb.OffsetFetchResponse(error=_DENIED, error_message=_denied(request.group_id))
        return narrow_offset_fetch(
            self.server.offset_fetch(request), context, all_topics=request.all_topics
        )

    async def ListGroups(
        self, request: pb.ListGroupsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.ListGroupsResponse:
        self._check_lease()
        return visible_groups(self.server.list_groups(request), context)

    async def DescribeGroups(
        self, request: pb.DescribeGroupsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.DescribeGroupsResponse:
        self._check_lease()
        allowed = [g for g in request.group_ids if group_allowed(context, AclOperation.DESCRIBE, g)]
        answer = (
            self.server.describe_groups(pb.DescribeGroupsRequest(group_ids=allowed))
            if allowed or not request.group_ids
            else pb.DescribeGroupsResponse()
        )
        for group_id in request.group_ids:
            if group_id not in allowed:
                answer.groups.add(group_id=group_id, error=_DENIED, error_message=_denied(group_id))
        return answer

    async def DeleteGroups(
        self, request: pb.DeleteGroupsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.DeleteGroupsResponse:
        self._check_lease()
        allowed = [g for g in request.group_ids if group_allowed(context, AclOperation.DELETE, g)]
        answer = (
            await self.server.delete_groups(pb.DeleteGroupsRequest(group_ids=allowed))
            if allowed
            else pb.DeleteGroupsResponse()
        )
        for group_id in request.group_ids:
            if group_id not in allowed:
                answer.results.add(
                    group_id=group_id, error=_DENIED, error_message=_denied(group_id)
                )
        return answer

    async def OffsetDelete(
        self, request: pb.OffsetDeleteRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.OffsetDeleteResponse:
        self._check_lease()
        if not group_allowed(context, AclOperation.DELETE, request.group_id):
            return pb.OffsetDeleteResponse(error=_DENIED, error_message=_denied(request.group_id))
        allowed, refused = narrow_offset_delete(request, context)
        if refused and not allowed.topics:
            return pb.OffsetDeleteResponse(topics=refused)
        answer = await self.server.offset_delete(allowed)
        answer.topics.extend(refused)
        return answer


_DENIED: Final = ErrorCode.GROUP_AUTHORIZATION_FAILED


def _denied(group_id: str) -> str:
    return f"not authorized to use group {group_id}"


def _decode_all(
    partition: int, raw: Sequence[tuple[bytes | None, bytes | None]]
) -> list[OffsetsRecord]:
    records: list[OffsetsRecord] = []
    for key, value in raw:
        try:
            records.append(decode_record(key, value))
        except CorruptOffsetsRecordError as e:
            log.error("%s-%d: skipping a record: %s", CONSUMER_OFFSETS_TOPIC, partition, e)
    return records


def _take_batch(writes: list[Write]) -> list[Write]:
    """The queued writes that go together in the next batch (at least one)."""
    taken: list[Write] = []
    size = 0
    while writes:
        write = writes[0]
        write_size = sum(len(k) + len(v or b"") for k, v in write.records)
        if taken and size + write_size > _MAX_BATCH_BYTES:
            break
        taken.append(writes.pop(0))
        size += write_size
    return taken


def _optional(message: Any, name: str) -> str | None:
    return getattr(message, name) if message.HasField(name) else None


def _client_host(peer: str) -> str:
    """``ipv4:127.0.0.1:5000`` → ``/127.0.0.1``, as Kafka prints a member's host."""
    kind, _, rest = peer.partition(":")
    if kind == "ipv6":
        host = rest.rsplit(":", 1)[0].strip("[]")
    elif kind == "ipv4":
        host = rest.rsplit(":", 1)[0]
    else:
        host = peer
    return "/" + host


def _code(error: int) -> ErrorCode.ValueType:
    return ErrorCode.ValueType(error)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _monotonic_ms() -> int:
    return int(time.monotonic() * 1000)
