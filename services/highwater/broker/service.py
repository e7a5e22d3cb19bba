"""``BrokerServer``: a broker assembled from its parts; its ``highwater.v1.Broker`` service.

The broker keeps its partitions in a :class:`~highwater.storage.log_manager.LogManager`
data directory and follows the cluster metadata through an image source — the
:class:`~highwater.metadata.observer.MetadataObserver` a standalone broker runs, or, in
``highwater server``, the co-located controller's own state machine; both offer
``image`` and ``add_listener``. Each new image goes to the
:class:`~highwater.broker.partitions.PartitionManager`, then to the replica fetchers and
the readiness report.

Its parts, by role as Kafka's broker is laid out:

* :mod:`~highwater.broker.lifecycle` — registration with the active controller,
  heartbeats, controlled shutdown, the readiness reported to the gRPC host;
* :mod:`~highwater.broker.request_handler` — Produce, Fetch, followers' ReplicaFetch
  (the internal ``ReplicaFetchService``, served beside ``Broker``), ListOffsets,
  Metadata and DescribeTopicPartitions (:mod:`~highwater.broker.topic_descriptions`),
  OffsetsForLeaderEpoch, DeleteRecords, InitProducerId, FindCoordinator, waiting in the
  :mod:`~highwater.broker.purgatory`;
* :mod:`~highwater.broker.replica_fetcher` — one fetcher per leader this broker follows;
* :mod:`~highwater.broker.alter_partition` — the ISR changes sent to the controller, and
  :mod:`~highwater.broker.isr_expiration` — the followers that fell behind, proposed out.

``start`` opens the data directory, follows the metadata, registers and starts the
heartbeats, the ISR-shrink loop, the data directory's upkeep (retention, compaction,
flushes and checkpoints per topic config: :meth:`LogManager.run_background`) and the
fetchers. ``stop`` asks for a controlled shutdown (the controller moves leadership away
first), stops them, then closes the logs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import grpc
import grpc.aio

from highwater.broker.alter_partition import AlterPartitionManager
from highwater.broker.authorization import (
    add_refused_topics,
    authorize_consumer_session,
    authorize_coordinators,
    authorize_fetch,
    authorize_init_producer_id,
    filter_metadata,
    replica_fetch_refusal,
    split_topics,
    topic_describer,
)
from highwater.broker.consumer_session import ConsumerSessions
from highwater.broker.forwarding import ForwardedAdminCalls
from highwater.broker.isr_expiration import expire_isr_forever
from highwater.broker.leader_channels import LeaderChannels
from highwater.broker.lifecycle import BROKER_SERVICE_NAME, BrokerLifecycle, ServingReport
from highwater.broker.partitions import PartitionManager
from highwater.broker.purgatory import Purgatory
from highwater.broker.quota_caller import (
    UNKNOWN_CALLER,
    QuotaCaller,
    client_id_of,
    quota_caller,
)
from highwater.broker.quotas import QuotaSettings, Throttle
from highwater.broker.replica_fetcher import Connect, GrpcFetchTransport, ReplicaFetcherManager
from highwater.broker.request_handler import RequestHandler
from highwater.broker.settings import BrokerSettings
from highwater.broker.telemetry import BrokerTelemetry
from highwater.config.topic import LogConfig
from highwater.controller_api.client import ControllerClient
from highwater.errors import InvalidRequestError, KafkaStorageError
from highwater.internal.v1 import replication_pb2 as rpb
from highwater.internal.v1 import replication_pb2_grpc
from highwater.metadata.consumer_offsets import ADMIN_CLIENT_ID
from highwater.metadata.image import MetadataImage
from highwater.metadata.records import BrokerEndpoint
from highwater.rpc.auth import authorizer_enabled, follow_image
from highwater.rpc.listener_context import current_listener
from highwater.security.acl import AclOperation
from highwater.storage.log_manager import LogDirectory, LogManager
from highwater.storage.topic_partition import TopicPartition
from highwater.v1 import broker_pb2 as pb
from highwater.v1 import broker_pb2_grpc
from highwater.v1.common_pb2 import ErrorCode

if TYPE_CHECKING:
    from highwater.broker.kafka_protocol.door import KafkaDoor

__all__ = [
    "BROKER_SERVICE_NAME",
    "BrokerServer",
    "BrokerServicer",
    "BrokerSettings",
    "ImageSource",
    "ServingReport",
]

log = logging.getLogger(__name__)


class ImageSource(Protocol):
    """Where the broker's metadata comes from: the committed image and its updates."""

    @property
    def image(self) -> MetadataImage: ...

    def add_listener(self, listener: Callable[[MetadataImage], None]) -> None: ...


class BrokerServer:
    """One broker (see the module docstring): ``await start()``, ``await stop()``; serve
    :meth:`add_servicer` on a gRPC server."""

    def __init__(
        self,
        *,
        node_id: int,
        advertised: str,
        data_dir: Path | Sequence[Path],
        controllers: Iterable[str],
        metadata: ImageSource,
        settings: BrokerSettings | None = None,
        report_serving: ServingReport | None = None,
        connect: Connect = GrpcFetchTransport,
        kafka_listen: str | None = None,
        kafka_advertised: str | None = None,
        listeners: Sequence[BrokerEndpoint] = (),
        cluster_id: str | None = None,
        quorum_cluster_id: Callable[[], str] | None = None,
    ) -> None:
        """``report_serving``: where the broker says whether it can serve, for its gRPC
        host's health (:meth:`~highwater.rpc.server.GrpcHost.report_serving`);
        ``connect``: how its replica fetchers reach a leader; ``data_dir``: its log
        directory, or several (``log.dirs``); ``kafka_listen``: where to serve Kafka's
        protocol too (none: not served), registered as ``kafka_advertised`` (else the
        address it listens on) under the listener name ``KAFKA``; ``listeners``: every
        advertised listener, the inter-broker one first (empty: ``advertised`` as the one
        listener ``PLAINTEXT``); ``cluster_id``: the cluster the data directories must
        belong to (their ``meta.properties`` records it), when the caller knows it;
        ``quorum_cluster_id``: the id of the metadata quorum the broker follows (KRaft),
        once it has started."""
        self.node_id = node_id
        self.cluster_id = cluster_id
        self._quorum_cluster_id = quorum_cluster_id
        self.advertised = advertised
        self.settings = settings = settings or BrokerSettings()
        self.log_manager = LogManager(data_dir, settings=settings.log)
        self.partitions = PartitionManager(
            node_id, self.log_manager, replica_lag_time_max_ms=settings.replica_lag_time_max_ms
        )
        self.telemetry = BrokerTelemetry(self.partitions)
        self.controller = ControllerClient(list(controllers), timeout_s=30)
        self._metadata = metadata
        follow_image(lambda: metadata.image)
        self.lifecycle = BrokerLifecycle(
            node_id=node_id,
            advertised=advertised,
            listeners=listeners,
            settings=settings,
            controller=self.controller,
            metadata_offset=lambda: self.partitions.image.offset,
            report_serving=report_serving,
            offline_report=lambda: self.partitions.offline_report(),
        )
        self.purgatory = Purgatory()
        self.alter_partitions = AlterPartitionManager(
            self.controller,
            broker_id=node_id,
            broker_epoch=lambda: self.lifecycle.broker_epoch,
            retry_backoff_ms=settings.alter_partition_retry_backoff_ms,
            on_proposed=lambda partition, proposal: self.telemetry.isr_change_proposed(
                proposal, partition.topic_partition.topic
            ),
            on_dropped=lambda partition: self.requests.replica_sessions.partition_changed(
                partition.topic_partition
            ),
        )
        self.fetchers = ReplicaFetcherManager(
            self.partitions,
            replica_id=node_id,
            broker_epoch=lambda: self.lifecycle.broker_epoch,
            settings=settings,
            connect=connect,
            on_change=self.purgatory.notify,
            telemetry=self.telemetry,
        )
        self.leaders = LeaderChannels(lambda: self.partitions.image)
        self.requests = RequestHandler(
            node_id=node_id,
            settings=settings,
            partitions=self.partitions,
            purgatory=self.purgatory,
            telemetry=self.telemetry,
            controller=self.controller,
            broker_epoch=lambda: self.lifecycle.broker_epoch,
            propose=self.alter_partitions.propose,
            throttle=Throttle(
                QuotaSettings(settings.quota_window_num, settings.quota_window_size_seconds)
            ),
            leaders=self.leaders,
        )
        self.partitions.on_change = self.requests.replica_sessions.partition_changed
        self.telemetry.fetch_sessions.watch(self.requests.replica_sessions.cache, replica=True)
        self.sessions = ConsumerSessions(self.requests, self.leaders)
        self.sessions.authorizer = authorize_consumer_session
        """Consumer sessions (``Broker.ConsumerSession``); ``sessions.authorizer`` is where
        ACL checks of a session's group and topics plug in."""
        self._shrinker: asyncio.Task[None] | None = None
        self._upkeep: asyncio.Task[None] | None = None
        self._log_creation: asyncio.Task[None] | None = None
        self.failure: BaseException | None = None
        """Why the broker stopped serving by itself (every log directory failed)."""
        self._failed = asyncio.Event()
        self.log_manager.add_failure_listener(self._on_log_dir_failed)
        self.kafka: KafkaDoor | None = None
        if kafka_listen is not None:
            # Imported here: Kafka's protocol (kafka-python's codec) only for brokers serving it.
            from highwater.broker.kafka_protocol.door import KafkaDoor

            self.kafka = KafkaDoor(self, listen=kafka_listen, advertised=kafka_advertised)

    def known_cluster_id(self) -> str | None:
        """The cluster's id: its metadata quorum's (KRaft), else the one the broker was
        started with (etcd mode), else ``None`` (not known yet)."""
        if self._quorum_cluster_id is not None:
            with contextlib.suppress(RuntimeError):  # the quorum has not started
                return self._quorum_cluster_id()
        return self.cluster_id

    @property
    def broker_epoch(self) -> int:
        """This incarnation's broker epoch; -1 before it registered."""
        return self.lifecycle.broker_epoch

    @property
    def is_fenced(self) -> bool:
        return self.lifecycle.is_fenced

    def add_servicer(self, server: grpc.aio.Server) -> None:
        """Serve ``highwater.v1.Broker`` (:data:`BROKER_SERVICE_NAME`) on ``server``, and
        beside it the followers' ``highwater.internal.v1.ReplicaFetchService``."""
        broker_pb2_grpc.add_BrokerServicer_to_server(BrokerServicer(self), server)
        replication_pb2_grpc.add_ReplicaFetchServiceServicer_to_server(
            ReplicaFetchServicer(self), server
        )

    async def start(self) -> None:
        """Open the data directory, follow the metadata, register and start heartbeating."""
        await asyncio.to_thread(
            self.log_manager.startup, cluster_id=self.cluster_id, node_id=self.node_id
        )
        self._metadata.add_listener(self._on_image)
        self._on_image(self._metadata.image)
        if self.kafka is not None:
            await self.kafka.start()
            self.lifecycle.extra_listeners = (self.kafka.endpoint,)
        await self.lifecycle.register(
            self.log_manager.previous_broker_epoch,
            log_dirs=[d.directory_id for d in self.log_manager.online_dirs],
        )
        # The image may already hold the registration (it reached the metadata before the
        # answer did): take its roles now rather than at the next change.
        self._on_image(self._metadata.image)
        self.lifecycle.start_heartbeats()
        self._shrinker = asyncio.create_task(
            expire_isr_forever(
                self.partitions,
                self.alter_partitions.propose,
                replica_lag_time_max_ms=self.settings.replica_lag_time_max_ms,
            )
        )
        self._upkeep = asyncio.create_task(self.log_manager.run_background())
        self.fetchers.ensure_fetchers()
        log.info("broker %d registered with epoch %d", self.node_id, self.broker_epoch)

    async def wait_unfenced(self, timeout_s: float = 30) -> None:
        await self.lifecycle.wait_unfenced(timeout_s)

    async def stop(self) -> None:
        """Controlled shutdown (leadership moves away first), then close the logs."""
        await self.sessions.close()
        await self.lifecycle.controlled_shutdown()
        self.lifecycle.stopping = True
        if self.kafka is not None:
            await self.kafka.stop()
        if self._log_creation is not None:
            # Its round ends once its worker thread has made the files: not cancelled,
            # so that every log it made is adopted and closed with the others.
            await asyncio.shield(self._log_creation)
        await self.fetchers.close()
        for task in (self._shrinker, self._upkeep):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await self.alter_partitions.close()
        await self.leaders.close()
        await self.lifecycle.stop_heartbeats()
        await self.controller.close()
        await asyncio.to_thread(self.log_manager.shutdown, broker_epoch=self.broker_epoch)

    async def wait_failed(self) -> None:
        """Return once the broker failed by itself (:attr:`failure`)."""
        await self._failed.wait()

    def _on_log_dir_failed(self, directory: LogDirectory) -> None:
        """A log directory failed: its partitions stop serving (KAFKA_STORAGE_ERROR), the
        controller hears of it at once, and with no directory left the broker stops, as
        Kafka's does."""
        self.partitions.stop_offline()
        self.purgatory.notify()
        self.lifecycle.heartbeat_now()
        if not self.log_manager.online_dirs and self.failure is None:
            self.failure = KafkaStorageError(
                f"broker {self.node_id}: every log directory failed (the last: "
                f"{directory.path}: {directory.error})"
            )
            log.critical("%s; shutting down", self.failure)
            self._failed.set()

    def _on_image(self, image: MetadataImage) -> None:
        """Take the roles ``image`` gives, once it holds this incarnation's registration.

        A restarting broker first replays the metadata of its previous incarnation, in
        which it may still lead in an old leader epoch. Acting on those images would make
        it a leader whose log a crash may have cut short, and its followers would truncate
        to that log (a diverging epoch) and drop acknowledged records. Kafka's broker waits
        for its registration in the metadata, after which the controller has moved the old
        incarnation's leaderships away; so does this one. Until then it serves nothing
        (its partitions are not open for requests: retriable errors).
        """
        if self._holds_registration(image):
            to_create = self.partitions.apply_image(image, create_logs=False)
            if to_create and self._log_creation is None and not self.lifecycle.stopping:
                self._log_creation = asyncio.create_task(self._create_logs(to_create))
            if not self.lifecycle.stopping:
                self.fetchers.ensure_fetchers()
        self.purgatory.notify()
        self.lifecycle.report_readiness(image)

    async def _create_logs(self, to_create: list[tuple[TopicPartition, LogConfig]]) -> None:
        """Create new replicas' logs off the event loop, then take their roles from the
        latest image; again while images name more (a topic created meanwhile). One round
        at a time: an image that arrives during a round leaves its new logs to the next."""
        try:
            while to_create and not self.lifecycle.stopping:
                await self.partitions.create_logs(to_create)
                image = self._metadata.image
                if not self._holds_registration(image):
                    return
                to_create = self.partitions.apply_image(image, create_logs=False)
                self.fetchers.ensure_fetchers()
                self.purgatory.notify()
                self.lifecycle.report_readiness(image)
        finally:
            self._log_creation = None

    def _holds_registration(self, image: MetadataImage) -> bool:
        """Whether ``image`` holds this incarnation's registration (its broker epoch)."""
        registration = image.broker(self.node_id)
        return (
            self.lifecycle.is_registered
            and registration is not None
            and registration.broker_epoch == self.lifecycle.broker_epoch
        )


class BrokerServicer(ForwardedAdminCalls, broker_pb2_grpc.BrokerServicer):
    """``highwater.v1.Broker``: each data-plane call goes to the broker's
    :class:`~highwater.broker.request_handler.RequestHandler`, the admin calls to the active
    controller (:class:`~highwater.broker.forwarding.ForwardedAdminCalls`)."""

    def __init__(self, broker: BrokerServer) -> None:
        self._broker = broker.requests
        self._sessions = broker.sessions
        self.controller = broker.controller
        image = broker.partitions

        def topic_name_of(topic_id: str) -> str | None:
            topic = image.image.topics.by_id.get(topic_id)
            return topic.name if topic is not None else None

        self.topic_name_of = topic_name_of

    def _caller(self, context: grpc.aio.ServicerContext) -> QuotaCaller:
        """Who the call is from, for quotas (read only while quotas are set)."""
        return quota_caller(context) if self._broker.quotas_in_force else UNKNOWN_CALLER

    async def Produce(
        self, request: pb.ProduceRequest, context: grpc.aio.ServicerContext
    ) -> pb.ProduceResponse:
        answer = await self._produce(request, context, self._caller(context))
        await _hold(answer.throttle_time_ms)
        return answer

    async def _produce(
        self, request: pb.ProduceRequest, context: grpc.aio.ServicerContext, caller: QuotaCaller
    ) -> pb.ProduceResponse:
        allowed, refused = split_topics(request, context, AclOperation.WRITE)
        if refused and not allowed.topics:
            return add_refused_topics(pb.ProduceResponse(), refused)
        answer = await self._broker.produce(
            allowed, caller, internal_topics_allowed=client_id_of(context) == ADMIN_CLIENT_ID
        )
        return add_refused_topics(answer, refused)

    async def ProduceStream(
        self,
        request_iterator: AsyncIterator[pb.ProduceRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[pb.ProduceResponse]:
        """Each request is appended as it arrives, while those before it may still wait for
        the ISR (tasks run their first step, the appends, in the order they were made), and
        the answers go back in the requests' order, as Kafka pipelines a connection.

        A throttled answer is held for its ``throttle_time_ms``, and the stream reads no
        further request until that time has passed, as Kafka mutes a throttled client's
        connection: the requests already read are the most a client gets ahead."""
        answers: asyncio.Queue[asyncio.Task[pb.ProduceResponse] | None] = asyncio.Queue()
        caller = quota_caller(context)
        loop = asyncio.get_running_loop()
        muted_until = 0.0

        async def produce(request: pb.ProduceRequest) -> pb.ProduceResponse:
            nonlocal muted_until
            answer = await self._produce(request, context, caller)
            if answer.throttle_time_ms:
                muted_until = max(muted_until, loop.time() + answer.throttle_time_ms / 1000)
                await _hold(answer.throttle_time_ms)
            return answer

        async def read() -> None:
            try:
                async for request in request_iterator:
                    if (muted := muted_until - loop.time()) > 0:
                        await asyncio.sleep(muted)
                    answers.put_nowait(asyncio.create_task(produce(request)))
            finally:
                answers.put_nowait(None)

        reader = asyncio.create_task(read())
        try:
            while (task := await answers.get()) is not None:
                yield await task
        finally:
            reader.cancel()
            while not answers.empty():  # the client went away: stop waiting for their acks
                if (task := answers.get_nowait()) is not None:
                    task.cancel()

    async def _fetch(
        self, request: pb.FetchRequest, context: grpc.aio.ServicerContext, caller: QuotaCaller
    ) -> pb.FetchResponse:
        allowed, refused = authorize_fetch(request, context)
        if refused and not allowed.topics:
            return add_refused_topics(pb.FetchResponse(), refused)
        try:
            answer = await self._broker.fetch(allowed, caller)
        except InvalidRequestError as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
            raise AssertionError("unreachable: abort raises") from e
        return add_refused_topics(answer, refused)

    async def Fetch(
        self, request: pb.FetchRequest, context: grpc.aio.ServicerContext
    ) -> pb.FetchResponse:
        answer = await self._fetch(request, context, self._caller(context))
        await _hold(answer.throttle_time_ms)
        return answer

    async def FetchStream(
        self, request_iterator: AsyncIterator[pb.FetchRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.FetchResponse]:
        """Fetches answered one at a time; a throttled answer is held for its
        ``throttle_time_ms`` (the stream's next fetch comes after it)."""
        caller = quota_caller(context)
        async for request in request_iterator:
            answer = await self._fetch(request, context, caller)
            await _hold(answer.throttle_time_ms)
            yield answer

    async def ListOffsets(
        self, request: pb.ListOffsetsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListOffsetsResponse:
        allowed, refused = split_topics(request, context, AclOperation.DESCRIBE)
        return add_refused_topics(self._broker.list_offsets(allowed), refused)

    async def Metadata(
        self, request: pb.MetadataRequest, context: grpc.aio.ServicerContext
    ) -> pb.MetadataResponse:
        return filter_metadata(request, self._broker.metadata(request, current_listener()), context)

    async def DescribeTopicPartitions(
        self, request: pb.DescribeTopicPartitionsRequest, context: grpc.aio.ServicerContext
    ) -> pb.DescribeTopicPartitionsResponse:
        try:
            return self._broker.describe_topic_partitions(request, topic_describer(context))
        except InvalidRequestError as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
            raise AssertionError("unreachable: abort raises") from e

    async def OffsetsForLeaderEpoch(
        self, request: pb.OffsetsForLeaderEpochRequest, context: grpc.aio.ServicerContext
    ) -> pb.OffsetsForLeaderEpochResponse:
        allowed, refused = split_topics(request, context, AclOperation.DESCRIBE)
        return add_refused_topics(self._broker.offsets_for_leader_epoch(allowed), refused)

    async def DeleteRecords(
        self, request: pb.DeleteRecordsRequest, context: grpc.aio.ServicerContext
    ) -> pb.DeleteRecordsResponse:
        allowed, refused = split_topics(request, context, AclOperation.DELETE)
        return add_refused_topics(self._broker.delete_records(allowed), refused)

    async def InitProducerId(
        self, request: pb.InitProducerIdRequest, context: grpc.aio.ServicerContext
    ) -> pb.InitProducerIdResponse:
        if authorizer_enabled() and not authorize_init_producer_id(context):
            return pb.InitProducerIdResponse(
                error=ErrorCode.CLUSTER_AUTHORIZATION_FAILED, producer_id=-1, producer_epoch=-1
            )
        return await self._broker.init_producer_id(request)

    async def DescribeLogDirs(
        self, request: pb.DescribeLogDirsRequest, context: grpc.aio.ServicerContext
    ) -> pb.DescribeLogDirsResponse:
        return self._broker.describe_log_dirs(request)

    async def FindCoordinator(
        self, request: pb.FindCoordinatorRequest, context: grpc.aio.ServicerContext
    ) -> pb.FindCoordinatorResponse:
        allowed, refused = authorize_coordinators(request, context)
        answer = self._broker.find_coordinator(allowed, current_listener())
        answer.coordinators.extend(refused)
        return answer

    async def ConsumerSession(
        self,
        request_iterator: AsyncIterator[pb.ConsumerSessionRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[pb.ConsumerSessionResponse]:
        async for event in self._sessions.serve(request_iterator, context):
            yield event


class ReplicaFetchServicer(replication_pb2_grpc.ReplicaFetchServiceServicer):
    """``highwater.internal.v1.ReplicaFetchService``: followers' fetches, one stream per
    follower and leader, each request answered in turn by the broker's
    :meth:`~highwater.broker.request_handler.RequestHandler.replica_fetch`.

    The server interceptor admits the call only with CLUSTER_ACTION on the cluster (with
    the authorizer on); each request must then speak for the caller's own node, or the
    stream ends ``PERMISSION_DENIED`` before anything is read or moved."""

    def __init__(self, broker: BrokerServer) -> None:
        self._broker = broker.requests
        self._server = broker

    async def GetReplicaLogInfo(
        self, request: rpb.GetReplicaLogInfoRequest, context: grpc.aio.ServicerContext
    ) -> rpb.GetReplicaLogInfoResponse:
        """The active controller's unclean recovery asks for this broker's logs of
        partitions left without ISR and ELR (KIP-966's GetReplicaLogInfo); CLUSTER_ACTION
        on the cluster, checked by the interceptor."""
        partitions = self._server.partitions
        answer = rpb.GetReplicaLogInfoResponse(
            broker_id=self._server.node_id, broker_epoch=self._server.broker_epoch
        )
        for asked in request.partitions:
            info = partitions.replica_log_info(asked.topic_id, asked.partition)
            answer.partitions.add(
                topic_id=info.topic_id,
                partition=info.partition_id,
                last_leader_epoch=info.last_leader_epoch,
                log_end_offset=info.log_end_offset,
                error=info.error,
            )
        return answer

    async def ReplicaFetch(
        self,
        request_iterator: AsyncIterator[rpb.ReplicaFetchRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[rpb.ReplicaFetchResponse]:
        async for request in request_iterator:
            refusal = replica_fetch_refusal(request, context)
            if refusal is not None:
                await context.abort(grpc.StatusCode.PERMISSION_DENIED, refusal)
            yield await self._broker.replica_fetch(request)


async def _hold(throttle_time_ms: int) -> None:
    """Hold a throttled answer (Kafka's delayed response) for ``throttle_time_ms``."""
    if throttle_time_ms > 0:
        await asyncio.sleep(throttle_time_ms / 1000)
