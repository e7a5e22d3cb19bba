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
* :mod:`~highwater.broker.request_handler` — Produce, Fetch (consumers' and followers'),
  ListOffsets, Metadata, OffsetsForLeaderEpoch, DeleteRecords, InitProducerId,
  FindCoordinator, waiting in the :mod:`~highwater.broker.purgatory`;
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
from collections.abc import AsyncIterator, Callable, Iterable
from pathlib import Path
from typing import Protocol

import grpc
import grpc.aio

from highwater.broker.alter_partition import AlterPartitionManager
from highwater.broker.consumer_session import ConsumerSessions
from highwater.broker.forwarding import ForwardedAdminCalls
from highwater.broker.isr_expiration import expire_isr_forever
from highwater.broker.leader_channels import LeaderChannels
from highwater.broker.lifecycle import BROKER_SERVICE_NAME, BrokerLifecycle, ServingReport
from highwater.broker.partitions import PartitionManager
from highwater.broker.purgatory import Purgatory
from highwater.broker.replica_fetcher import Connect, GrpcFetchTransport, ReplicaFetcherManager
from highwater.broker.request_handler import RequestHandler
from highwater.broker.settings import BrokerSettings
from highwater.broker.telemetry import BrokerTelemetry
from highwater.controller_api.client import ControllerClient
from highwater.errors import InvalidRequestError
from highwater.metadata.image import MetadataImage
from highwater.storage.log_manager import LogManager
from highwater.v1 import broker_pb2 as pb
from highwater.v1 import broker_pb2_grpc

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
        data_dir: Path,
        controllers: Iterable[str],
        metadata: ImageSource,
        settings: BrokerSettings | None = None,
        report_serving: ServingReport | None = None,
        connect: Connect = GrpcFetchTransport,
    ) -> None:
        """``report_serving``: where the broker says whether it can serve, for its gRPC
        host's health (:meth:`~highwater.rpc.server.GrpcHost.report_serving`);
        ``connect``: how its replica fetchers reach a leader."""
        self.node_id = node_id
        self.advertised = advertised
        self.settings = settings = settings or BrokerSettings()
        self.log_manager = LogManager(data_dir, settings=settings.log)
        self.partitions = PartitionManager(
            node_id, self.log_manager, replica_lag_time_max_ms=settings.replica_lag_time_max_ms
        )
        self.telemetry = BrokerTelemetry(self.partitions)
        self.controller = ControllerClient(list(controllers), timeout_s=30)
        self._metadata = metadata
        self.lifecycle = BrokerLifecycle(
            node_id=node_id,
            advertised=advertised,
            settings=settings,
            controller=self.controller,
            metadata_offset=lambda: self.partitions.image.offset,
            report_serving=report_serving,
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
            leaders=self.leaders,
        )
        self.sessions = ConsumerSessions(self.requests, self.leaders)
        """Consumer sessions (``Broker.ConsumerSession``); ``sessions.authorizer`` is where
        ACL checks of a session's group and topics plug in."""
        self._shrinker: asyncio.Task[None] | None = None
        self._upkeep: asyncio.Task[None] | None = None

    @property
    def broker_epoch(self) -> int:
        """This incarnation's broker epoch; -1 before it registered."""
        return self.lifecycle.broker_epoch

    @property
    def is_fenced(self) -> bool:
        return self.lifecycle.is_fenced

    def add_servicer(self, server: grpc.aio.Server) -> None:
        """Serve ``highwater.v1.Broker`` (:data:`BROKER_SERVICE_NAME`) on ``server``."""
        broker_pb2_grpc.add_BrokerServicer_to_server(BrokerServicer(self), server)

    async def start(self) -> None:
        """Open the data directory, follow the metadata, register and start heartbeating."""
        await asyncio.to_thread(self.log_manager.startup, node_id=self.node_id)
        self._metadata.add_listener(self._on_image)
        self._on_image(self._metadata.image)
        await self.lifecycle.register(self.log_manager.previous_broker_epoch)
        self.lifecycle.report_readiness(self._metadata.image)
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

    def _on_image(self, image: MetadataImage) -> None:
        self.partitions.apply_image(image)
        if self.lifecycle.is_registered and not self.lifecycle.stopping:
            self.fetchers.ensure_fetchers()
        self.purgatory.notify()
        self.lifecycle.report_readiness(image)


class BrokerServicer(ForwardedAdminCalls, broker_pb2_grpc.BrokerServicer):
    """``highwater.v1.Broker``: each data-plane call goes to the broker's
    :class:`~highwater.broker.request_handler.RequestHandler`, the admin calls to the active
    controller (:class:`~highwater.broker.forwarding.ForwardedAdminCalls`)."""

    def __init__(self, broker: BrokerServer) -> None:
        self._broker = broker.requests
        self._sessions = broker.sessions
        self.controller = broker.controller

    async def Produce(
        self, request: pb.ProduceRequest, context: grpc.aio.ServicerContext
    ) -> pb.ProduceResponse:
        return await self._broker.produce(request)

    async def ProduceStream(
        self,
        request_iterator: AsyncIterator[pb.ProduceRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[pb.ProduceResponse]:
        """Each request is appended as it arrives, while those before it may still wait for
        the ISR (tasks run their first step, the appends, in the order they were made), and
        the answers go back in the requests' order, as Kafka pipelines a connection."""
        answers: asyncio.Queue[asyncio.Task[pb.ProduceResponse] | None] = asyncio.Queue()

        async def read() -> None:
            try:
                async for request in request_iterator:
                    answers.put_nowait(asyncio.create_task(self._broker.produce(request)))
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

    async def Fetch(
        self, request: pb.FetchRequest, context: grpc.aio.ServicerContext
    ) -> pb.FetchResponse:
        try:
            return await self._broker.fetch(request)
        except InvalidRequestError as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
            raise AssertionError("unreachable: abort raises") from e

    async def FetchStream(
        self, request_iterator: AsyncIterator[pb.FetchRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.FetchResponse]:
        async for request in request_iterator:
            try:
                answer = await self._broker.fetch(request)
            except InvalidRequestError as e:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
                raise AssertionError("unreachable: abort raises") from e
            yield answer

    async def ListOffsets(
        self, request: pb.ListOffsetsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListOffsetsResponse:
        return self._broker.list_offsets(request)

    async def Metadata(
        self, request: pb.MetadataRequest, context: grpc.aio.ServicerContext
    ) -> pb.MetadataResponse:
        return self._broker.metadata(request)

    async def OffsetsForLeaderEpoch(
        self, request: pb.OffsetsForLeaderEpochRequest, context: grpc.aio.ServicerContext
    ) -> pb.OffsetsForLeaderEpochResponse:
        return self._broker.offsets_for_leader_epoch(request)

    async def DeleteRecords(
        self, request: pb.DeleteRecordsRequest, context: grpc.aio.ServicerContext
    ) -> pb.DeleteRecordsResponse:
        return self._broker.delete_records(request)

    async def InitProducerId(
        self, request: pb.InitProducerIdRequest, context: grpc.aio.ServicerContext
    ) -> pb.InitProducerIdResponse:
        return await self._broker.init_producer_id(request)

    async def FindCoordinator(
        self, request: pb.FindCoordinatorRequest, context: grpc.aio.ServicerContext
    ) -> pb.FindCoordinatorResponse:
        return self._broker.find_coordinator(request)

    async def ConsumerSession(
        self,
        request_iterator: AsyncIterator[pb.ConsumerSessionRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[pb.ConsumerSessionResponse]:
        async for event in self._sessions.serve(request_iterator, context):
            yield event
