"""``BrokerServer``: a broker's lifecycle and its ``highwater.v1.Broker`` gRPC service.

The broker keeps its partitions in a :class:`~highwater.storage.log_manager.LogManager`
data directory and follows the cluster metadata through an image source — the
:class:`~highwater.metadata.observer.MetadataObserver` a standalone broker runs, or, in
``highwater server``, the co-located controller's own state machine; both offer
``image`` and ``add_listener``. Each new image goes to the
:class:`~highwater.broker.partitions.PartitionManager`.

Lifecycle (KIP-631): ``start`` opens the data directory, registers with the active
controller (an incarnation id per process) and heartbeats every
``broker.heartbeat.interval.ms`` with the offset of the metadata it has applied; the
controller unfences it once it has caught up. The data directory's upkeep runs in the
background (retention, compaction, flushes and checkpoints per topic config:
:meth:`LogManager.run_background`). ``stop`` asks for a controlled shutdown (the
controller moves leadership away first), then closes the logs.

Requests: Produce (acks 0, 1 and all; plain records are encoded as one batch), Fetch (a
long poll on ``max_wait_ms`` / ``min_bytes``, reads up to the high watermark),
ListOffsets, Metadata, OffsetsForLeaderEpoch, DeleteRecords, InitProducerId (ids from
blocks the controller allocates) and FindCoordinator (the owner of the group's
``__consumer_offsets`` partition in the metadata image). A failure of one partition is an
error code in its reply; the other partitions of the request are served.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Protocol, TypeVar

import grpc
import grpc.aio

from highwater.broker import request_fields as fields
from highwater.broker.forwarding import ForwardedAdminCalls
from highwater.broker.partitions import Partition, PartitionError, PartitionManager
from highwater.broker.plain_records import add_plain_records
from highwater.broker.replication import AlterPartitionProposal, EpochEndOffset, truncation_offset
from highwater.broker.rolling import READY_SERVICE, broker_readiness
from highwater.broker.telemetry import ACKS, CONSUMER, REPLICA, TOPIC, BrokerTelemetry
from highwater.controller_api import messages as m
from highwater.controller_api.client import ControllerClient
from highwater.errors import HighwaterError, InvalidRequestError
from highwater.metadata.consumer_offsets import CONSUMER_OFFSETS_TOPIC, partition_for_group
from highwater.metadata.image import MetadataImage
from highwater.metadata.records import BrokerEndpoint
from highwater.records import SimpleRecord, build_batch
from highwater.rpc.broker_streams import FetchStream
from highwater.rpc.channels import open_channel
from highwater.rpc.endpoints import parse_endpoint
from highwater.storage.log_manager import LogManager, LogManagerSettings
from highwater.storage.topic_partition import TopicPartition
from highwater.v1 import broker_pb2 as pb
from highwater.v1 import broker_pb2_grpc
from highwater.v1.common_pb2 import ErrorCode

__all__ = ["BROKER_SERVICE_NAME", "BrokerServer", "BrokerSettings", "ImageSource"]

log = logging.getLogger(__name__)

BROKER_SERVICE_NAME: Final = pb.DESCRIPTOR.services_by_name["Broker"].full_name
ACKS_ALL: Final = fields.ACKS_ALL
RECORD_FORMATS: Final = frozenset(pb.RecordFormat.values())
NO_PRODUCER: Final = -1

T = TypeVar("T")


ServingReport = Callable[[str, bool], None]
"""Says whether a gRPC service (by its full name) can serve: the host's health."""


class ImageSource(Protocol):
    """Where the broker's metadata comes from: the committed image and its updates."""

    @property
    def image(self) -> MetadataImage: ...

    def add_listener(self, listener: Callable[[MetadataImage], None]) -> None: ...


@dataclass(frozen=True, slots=True)
class BrokerSettings:
    """The broker's own settings, with Kafka's names and defaults."""

    heartbeat_interval_ms: int = 2000
    """``broker.heartbeat.interval.ms``."""
    fenced_heartbeat_interval_ms: int = 100
    """How often a fenced broker heartbeats while it waits to be unfenced."""
    rack: str | None = None
    """``broker.rack``."""
    controlled_shutdown_timeout_ms: int = 10_000
    """How long ``stop`` waits for the controller to let the broker go."""
    replica_lag_time_max_ms: int = 30_000
    """``replica.lag.time.max.ms``: a follower not caught up for this long leaves the ISR."""
    replica_fetch_max_wait_ms: int = 500
    """``replica.fetch.wait.max.ms``: a follower's long poll."""
    replica_fetch_max_bytes: int = 1024 * 1024
    """``replica.fetch.max.bytes``: per partition."""
    replica_fetch_response_max_bytes: int = 10 * 1024 * 1024
    """``replica.fetch.response.max.bytes``."""
    replica_fetch_backoff_ms: int = 100
    """``replica.fetch.backoff.ms``: the wait after a failed fetch."""
    fetch_max_bytes: int = 55 * 1024 * 1024
    """``fetch.max.bytes``: the most one fetch answer carries, whatever it asks for (one
    batch more at most), below the 64 MiB gRPC message limit of the broker's server."""
    registration_retry_backoff_ms: int = 500
    """The wait between registrations while a previous incarnation's session lasts."""
    alter_partition_retry_backoff_ms: int = 100
    """The wait before an ISR change the controller refused for now is sent again."""
    log: LogManagerSettings = field(default_factory=LogManagerSettings)
    """Retention, compaction, flush and checkpoint intervals of the data directory."""


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
    ) -> None:
        """``report_serving``: where the broker says whether it can serve, for its gRPC
        host's health (:meth:`~highwater.rpc.server.GrpcHost.report_serving`)."""
        self.node_id = node_id
        self.advertised = advertised
        self.settings = settings or BrokerSettings()
        self.log_manager = LogManager(data_dir, settings=self.settings.log)
        self.partitions = PartitionManager(
            node_id,
            self.log_manager,
            replica_lag_time_max_ms=self.settings.replica_lag_time_max_ms,
        )
        self.telemetry = BrokerTelemetry(self.partitions)
        self._metadata = metadata
        self._report_serving = report_serving
        self.controller = ControllerClient(list(controllers), timeout_s=30)
        self._incarnation_id = str(uuid.uuid4())
        self.broker_epoch = -1
        self.is_fenced = True
        # What long polls wait for: followers' fetches for records appended to a log,
        # consumers' fetches and acks=all produces for a high watermark that moved (or a
        # metadata change, which sets both).
        self._appended = asyncio.Event()
        self._committed = asyncio.Event()
        self._heartbeats: asyncio.Task[None] | None = None
        self._producer_ids: tuple[int, int] = (0, 0)  # next id, end (exclusive)
        self._fetchers: dict[int, asyncio.Task[None]] = {}
        self._alter_queue: dict[TopicPartition, tuple[Partition, AlterPartitionProposal]] = {}
        self._alter_wake = asyncio.Event()
        self._alter_sender: asyncio.Task[None] | None = None
        self._shrinker: asyncio.Task[None] | None = None
        self._upkeep: asyncio.Task[None] | None = None
        self._stopping = False

    # --- lifecycle ----------------------------------------------------------------------

    def add_servicer(self, server: grpc.aio.Server) -> None:
        """Serve ``highwater.v1.Broker`` (:data:`BROKER_SERVICE_NAME`) on ``server``."""
        broker_pb2_grpc.add_BrokerServicer_to_server(BrokerServicer(self), server)

    async def start(self) -> None:
        """Open the data directory, follow the metadata, register and start heartbeating."""
        await asyncio.to_thread(self.log_manager.startup, node_id=self.node_id)
        self._metadata.add_listener(self._on_image)
        self._on_image(self._metadata.image)
        self.broker_epoch = await self._register()
        self._report_readiness(self._metadata.image)
        self._heartbeats = asyncio.create_task(self._heartbeat_forever())
        self._shrinker = asyncio.create_task(self._shrink_isr_forever())
        self._upkeep = asyncio.create_task(self.log_manager.run_background())
        self._ensure_fetchers()
        log.info("broker %d registered with epoch %d", self.node_id, self.broker_epoch)

    async def _register(self) -> int:
        """Register this incarnation; the broker epoch. A previous incarnation that did not
        shut down cleanly holds the id until its session expires: wait for that, as
        Kafka's brokers do."""
        host, port = parse_endpoint(self.advertised)
        request = m.RegisterBrokerRequest(
            broker_id=self.node_id,
            incarnation_id=self._incarnation_id,
            listeners=(BrokerEndpoint("PLAINTEXT", host, port),),
            rack=self.settings.rack,
            previous_broker_epoch=self.log_manager.previous_broker_epoch,
        )
        waited = False
        while True:
            reply = await self.controller.register_broker(request)
            if reply.error == ErrorCode.NONE:
                return reply.broker_epoch
            if reply.error != ErrorCode.DUPLICATE_BROKER_REGISTRATION:
                raise HighwaterError(
                    f"broker {self.node_id} could not register: {reply.error_message}"
                )
            if not waited:
                log.info(
                    "broker %d: the previous incarnation's session has not expired yet; "
                    "registering again until it has",
                    self.node_id,
                )
                waited = True
            await asyncio.sleep(self.settings.registration_retry_backoff_ms / 1000)

    async def wait_unfenced(self, timeout_s: float = 30) -> None:
        async with asyncio.timeout(timeout_s):
            while self.is_fenced:
                await asyncio.sleep(0.02)

    async def stop(self) -> None:
        """Controlled shutdown (leadership moves away first), then close the logs."""
        if self._heartbeats is not None:
            with contextlib.suppress(HighwaterError, asyncio.TimeoutError, grpc.aio.AioRpcError):
                async with asyncio.timeout(self.settings.controlled_shutdown_timeout_ms / 1000):
                    await self._controlled_shutdown()
        self._stopping = True
        tasks = [*self._fetchers.values()]
        tasks += [t for t in (self._shrinker, self._upkeep, self._alter_sender) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._heartbeats is not None:
            self._heartbeats.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._heartbeats
            self._heartbeats = None
        await self.controller.close()
        await asyncio.to_thread(self.log_manager.shutdown, broker_epoch=self.broker_epoch)

    async def _controlled_shutdown(self) -> None:
        while True:
            reply = await self.controller.broker_heartbeat(
                m.BrokerHeartbeatRequest(
                    self.node_id, self.broker_epoch, self._metadata_offset(), want_shutdown=True
                )
            )
            if reply.should_shut_down or reply.error != ErrorCode.NONE:
                return
            await asyncio.sleep(self.settings.fenced_heartbeat_interval_ms / 1000)

    async def _heartbeat_forever(self) -> None:
        while True:
            try:
                reply = await self.controller.broker_heartbeat(
                    m.BrokerHeartbeatRequest(
                        self.node_id, self.broker_epoch, self._metadata_offset()
                    )
                )
                if reply.error == ErrorCode.NONE:
                    self.is_fenced = reply.is_fenced
            except HighwaterError as e:
                log.warning("broker %d: heartbeat failed: %s", self.node_id, e)
            interval_ms = (
                self.settings.fenced_heartbeat_interval_ms
                if self.is_fenced
                else self.settings.heartbeat_interval_ms
            )
            await asyncio.sleep(interval_ms / 1000)

    def _metadata_offset(self) -> int:
        return self.partitions.image.offset

    def _on_image(self, image: MetadataImage) -> None:
        self.partitions.apply_image(image)
        if self.broker_epoch >= 0 and not self._stopping:
            self._ensure_fetchers()
        self._notify()
        self._report_readiness(image)

    def _report_readiness(self, image: MetadataImage) -> None:
        """Health: the Broker service is SERVING while this incarnation is registered,
        unfenced and not shutting down in ``image`` (before, its answers would be
        NOT_LEADER_OR_FOLLOWER and its topic creations INVALID_REPLICATION_FACTOR), and
        :data:`~highwater.broker.rolling.READY_SERVICE` while it is also back in the ISR
        of every partition it replicates (the rolling-restart gate, docs/kubernetes.md)."""
        report = self._report_serving
        if report is None:
            return
        registration = image.broker(self.node_id)
        serving = (
            self.broker_epoch >= 0
            and not self._stopping
            and registration is not None
            and registration.broker_epoch == self.broker_epoch
            and registration.is_active
        )
        report(BROKER_SERVICE_NAME, serving)
        report(READY_SERVICE, serving and broker_readiness(image, self.node_id).allowed)

    def _notify(self, *, appended: bool = True, committed: bool = True) -> None:
        """Wake the long polls and acks=all waits: records were ``appended`` to a log, a
        high watermark moved (``committed``), or both (any other change)."""
        if appended:
            self._appended.set()
            self._appended = asyncio.Event()
        if committed:
            self._committed.set()
            self._committed = asyncio.Event()

    async def _wait_change(self, timeout_s: float, *, appended: bool = False) -> None:
        """Wait up to ``timeout_s`` for the next :meth:`_notify` of records ``appended``
        (a follower's fetch), else of a high watermark that moved."""
        if timeout_s <= 0:
            return
        event = self._appended if appended else self._committed
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await event.wait()

    # --- Produce ------------------------------------------------------------------------

    async def produce(self, request: pb.ProduceRequest) -> pb.ProduceResponse:
        started = time.monotonic()
        try:
            return await self._produce(request)
        finally:
            self.telemetry.produce_duration.record(
                time.monotonic() - started, {ACKS: fields.produce_acks(request)}
            )

    async def _produce(self, request: pb.ProduceRequest) -> pb.ProduceResponse:
        acks = fields.produce_acks(request)
        response = pb.ProduceResponse()
        waiting: list[tuple[pb.ProducePartitionResponse, str, int]] = []
        committed = False  # whether an append moved a high watermark (a leader alone in its ISR)
        for topic in request.topics:
            topic_response = response.topics.add(topic=topic.topic)
            for item in topic.partitions:
                answer = topic_response.partitions.add(partition=item.partition, base_offset=-1)
                answer.log_append_time_ms = -1
                if acks not in (0, 1, ACKS_ALL):
                    _fail(answer, ErrorCode.INVALID_REQUIRED_ACKS, f"acks={acks}")
                    continue
                try:
                    partition = self.partitions.get(topic.topic, item.partition)
                    data = _batch_bytes(item)
                    high_watermark = partition.high_watermark
                    info = partition.append(data, acks)
                    committed = committed or partition.high_watermark != high_watermark
                except HighwaterError as e:
                    _fail(answer, getattr(e, "code", ErrorCode.UNKNOWN_SERVER_ERROR), str(e))
                    continue
                self.telemetry.bytes_in.add(len(data), {TOPIC: topic.topic})
                answer.base_offset = info.first_offset
                answer.log_append_time_ms = info.log_append_time
                answer.log_start_offset = info.log_start_offset
                if acks == ACKS_ALL:
                    waiting.append((answer, topic.topic, info.last_offset + 1))
        self._notify(committed=committed)
        if acks == 0:
            return pb.ProduceResponse()
        deadline = time.monotonic() + max(fields.produce_timeout_ms(request), 0) / 1000
        while waiting:
            waiting = [w for w in waiting if not self._replicated(*w)]
            if not waiting:
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                for answer, _, _ in waiting:
                    _fail(answer, ErrorCode.REQUEST_TIMED_OUT, "not replicated to the ISR in time")
                break
            await self._wait_change(remaining)
        return response

    def _replicated(self, answer: pb.ProducePartitionResponse, topic: str, end: int) -> bool:
        """Whether an acks=all append that ended at ``end`` is done (setting its error)."""
        try:
            partition = self.partitions.get(topic, answer.partition)
        except PartitionError as e:
            _fail(answer, e.code, str(e))
            return True
        completed, error = partition.produce_completion(end)
        if completed and error != ErrorCode.NONE:
            _fail(
                answer, error, f"{topic}-{answer.partition}: not replicated to min.insync.replicas"
            )
        return completed

    # --- Fetch --------------------------------------------------------------------------

    async def fetch(self, request: pb.FetchRequest) -> pb.FetchResponse:
        """A consumer's or a follower's fetch (a long poll). A fetch is a follower's only
        when it names a replica id (``request_fields.follower_id``); then that broker must
        be registered with the epoch the fetch names, or every partition's answer is
        STALE_BROKER_EPOCH and nothing moves: a consumer that sets a replica id, or an
        earlier incarnation of the broker, cannot pass for the follower."""
        started = time.monotonic()
        deadline = started + max(request.max_wait_ms, 0) / 1000
        if request.record_format not in RECORD_FORMATS:
            raise InvalidRequestError(f"record_format {request.record_format} is not known")
        follower = fields.follower_id(request)
        if follower is not None:
            refusal = self._follower_refusal(request, follower)
            if refusal is not None:
                return _fail_fetch(request, ErrorCode.STALE_BROKER_EPOCH, refusal)
        read = self._read if follower is None else self._read_for_follower
        while True:
            response, total, failed = read(request)
            now = time.monotonic()
            if failed or total >= max(request.min_bytes, 1) or now >= deadline:
                self.telemetry.fetch_duration.record(
                    now - started, CONSUMER if follower is None else REPLICA
                )
                return response
            await self._wait_change(deadline - now, appended=follower is not None)

    def _follower_refusal(self, request: pb.FetchRequest, replica_id: int) -> str | None:
        """Why a fetch that claims to come from broker ``replica_id`` is not that broker's
        (its epoch is missing or is not the registered one), or ``None``."""
        if not request.HasField("replica_epoch"):
            return f"a fetch as replica {replica_id} must name that broker's epoch"
        broker = self.partitions.image.broker(replica_id)
        if broker is None:
            return f"broker {replica_id} is not registered"
        if broker.broker_epoch != request.replica_epoch:
            return (
                f"broker {replica_id} is registered with epoch {broker.broker_epoch}, "
                f"not {request.replica_epoch}"
            )
        return None

    def _read(self, request: pb.FetchRequest) -> tuple[pb.FetchResponse, int, bool]:
        response = pb.FetchResponse()
        budget = fields.fetch_max_bytes(request, self.settings.fetch_max_bytes)
        plain = request.record_format == pb.RECORD_FORMAT_PLAIN
        total = 0
        failed = False
        for topic in request.topics:
            topic_response = response.topics.add(topic=topic.topic)
            for item in topic.partitions:
                answer = topic_response.partitions.add(partition=item.partition)
                answer.high_watermark = answer.log_start_offset = -1
                room = budget - total
                try:
                    partition = self.partitions.get(topic.topic, item.partition)
                    data = partition.read(
                        item.fetch_offset,
                        max(min(fields.partition_fetch_max_bytes(item), room), 0),
                        fields.current_leader_epoch(item),
                        min_one_batch=room > 0,
                    )
                    if plain:
                        add_plain_records(answer, data.records, item.fetch_offset)
                except HighwaterError as e:
                    answer.error = e.code  # type: ignore[assignment]
                    failed = True
                    continue
                answer.high_watermark = partition.high_watermark
                answer.log_start_offset = data.log_start_offset
                if not plain:
                    answer.records = data.records
                total += len(data.records)
                if data.records:
                    self.telemetry.bytes_out.add(len(data.records), {TOPIC: topic.topic})
        return response, total, failed

    def _read_for_follower(self, request: pb.FetchRequest) -> tuple[pb.FetchResponse, int, bool]:
        """A follower's fetch: records past the high watermark too, or the diverging epoch;
        its progress moves the high watermark and may bring it back into the ISR."""
        response = pb.FetchResponse()
        budget = fields.fetch_max_bytes(request, self.settings.fetch_max_bytes)
        total = 0
        failed = False
        moved = False
        for topic in request.topics:
            topic_response = response.topics.add(topic=topic.topic)
            for item in topic.partitions:
                answer = topic_response.partitions.add(partition=item.partition)
                answer.high_watermark = answer.log_start_offset = -1
                room = budget - total
                try:
                    partition = self.partitions.get(topic.topic, item.partition)
                    read = partition.read_for_follower(
                        request.replica_id,
                        item.fetch_offset,
                        fields.last_fetched_epoch(item),
                        max(min(fields.partition_fetch_max_bytes(item), room), 0),
                        fields.current_leader_epoch(item),
                        min_one_batch=room > 0,
                    )
                except PartitionError as e:
                    answer.error = e.code  # type: ignore[assignment]
                    failed = True
                    continue
                moved = moved or read.high_watermark_moved
                answer.high_watermark = partition.high_watermark
                answer.log_start_offset = partition.log.log_start_offset
                if read.proposal is not None:
                    self._propose(partition, read.proposal)
                if read.diverging is not None:
                    answer.diverging_epoch.epoch = read.diverging.epoch
                    answer.diverging_epoch.end_offset = read.diverging.end_offset
                    failed = True  # answer at once: the follower truncates first
                    continue
                assert read.data is not None
                answer.records = read.data.records
                total += len(read.data.records)
                if read.data.records:
                    self.telemetry.bytes_out.add(
                        len(read.data.records), {**REPLICA, TOPIC: topic.topic}
                    )
        if moved:
            # acks=all produces and consumers wait for the high watermark; the other
            # followers' fetches do not (they would only find nothing new).
            self._notify(appended=False)
        return response, total, failed

    # --- ISR changes ----------------------------------------------------------------------

    def _propose(self, partition: Partition, proposal: AlterPartitionProposal) -> None:
        """Queue an ISR change for the controller; the committed change comes back through
        the metadata (and is applied to the partition then).

        As Kafka's ``AlterPartitionManager`` does, the changes queued while a request is in
        flight go together in the next one: a broker coming back into the ISRs of a
        thousand partitions sends a few requests, not a thousand.
        """
        self._alter_queue[partition.topic_partition] = (partition, proposal)
        self.telemetry.isr_change_proposed(proposal, partition.topic_partition.topic)
        self._alter_wake.set()
        if self._alter_sender is None or self._alter_sender.done():
            self._alter_sender = asyncio.create_task(self._send_alter_partitions_forever())

    async def _send_alter_partitions_forever(self) -> None:
        while True:
            await self._alter_wake.wait()
            self._alter_wake.clear()
            batch, self._alter_queue = self._alter_queue, {}
            if batch:
                await self._send_alter_partitions(list(batch.values()))

    async def _send_alter_partitions(
        self, batch: list[tuple[Partition, AlterPartitionProposal]]
    ) -> None:
        items = tuple(
            m.AlterPartitionItem(
                partition.topic_id,
                partition.topic_partition.partition,
                proposal.leader_epoch,
                proposal.partition_epoch,
                tuple(proposal.new_isr),
            )
            for partition, proposal in batch
        )
        errors: dict[tuple[str, int], int] = {}
        try:
            reply = await self.controller.alter_partition(
                m.AlterPartitionRequest(self.node_id, self.broker_epoch, items)
            )
        except HighwaterError as e:
            log.warning("broker %d: AlterPartition failed: %s", self.node_id, e)
            whole: int = ErrorCode.REQUEST_TIMED_OUT
        else:
            whole = reply.error
            errors = {(r.topic_id, r.partition_id): r.error for r in reply.partitions}
        for partition, proposal in batch:
            key = (partition.topic_id, partition.topic_partition.partition)
            error = whole or errors.get(key, ErrorCode.NONE)
            if error == ErrorCode.NONE or partition.leader_state is None:
                continue
            again = partition.leader_state.on_alter_partition_error(proposal, error)
            log.info(
                "broker %d: %s: ISR change %s refused (error %d)",
                self.node_id,
                partition.topic_partition,
                list(proposal.new_isr),
                error,
            )
            if again is not None:
                asyncio.get_running_loop().call_later(
                    self.settings.alter_partition_retry_backoff_ms / 1000,
                    self._propose_unless_stopping,
                    partition,
                    again,
                )

    def _propose_unless_stopping(
        self, partition: Partition, proposal: AlterPartitionProposal
    ) -> None:
        if not self._stopping:
            self._propose(partition, proposal)

    async def _shrink_isr_forever(self) -> None:
        """Kafka's ``isr-expiration`` task: every half ``replica.lag.time.max.ms``, drop
        the followers that fell behind from the ISRs this broker leads."""
        interval_s = self.settings.replica_lag_time_max_ms / 2000
        while True:
            await asyncio.sleep(interval_s)
            for partition in self.partitions:
                proposal = partition.maybe_shrink_isr()
                if proposal is not None:
                    self._propose(partition, proposal)

    # --- follower fetchers ----------------------------------------------------------------

    def _ensure_fetchers(self) -> None:
        """One fetcher per leader this broker follows partitions of."""
        leaders = {
            p.registration.leader
            for p in self.partitions
            if not p.is_leader and p.registration.has_leader
        }
        for leader_id in leaders:
            task = self._fetchers.get(leader_id)
            if task is None or task.done():
                self._fetchers[leader_id] = asyncio.create_task(self._fetch_from(leader_id))

    async def _fetch_from(self, leader_id: int) -> None:
        """Replicate the partitions ``leader_id`` leads into this broker's logs, by pull.

        The fetches go over a :class:`FetchStream` to the leader, each answered before the
        next is sent.
        """
        channel: grpc.aio.Channel | None = None
        fetches: FetchStream | None = None
        address = ""
        backoff_s = self.settings.replica_fetch_backoff_ms / 1000
        try:
            while True:
                followed = {
                    (p.topic_partition.topic, p.topic_partition.partition): p
                    for p in self.partitions
                    if not p.is_leader and p.registration.leader == leader_id
                }
                if not followed or self._stopping:
                    return
                broker = self.partitions.image.broker(leader_id)
                wanted = (
                    f"{broker.listeners[0].host}:{broker.listeners[0].port}"
                    if broker is not None and broker.listeners
                    else ""
                )
                if not wanted:
                    await asyncio.sleep(backoff_s)
                    continue
                if wanted != address or channel is None or fetches is None:
                    if fetches is not None:
                        fetches.close()
                    if channel is not None:
                        await channel.close()
                    address, channel = wanted, open_channel(wanted)
                    fetches = FetchStream(broker_pb2_grpc.BrokerStub(channel))
                request = self._follower_fetch_request(followed.values())
                try:
                    reply = await fetches.fetch(
                        request, self.settings.replica_fetch_max_wait_ms / 1000 + 30
                    )
                except grpc.aio.AioRpcError as e:
                    log.debug("broker %d: fetch from %d failed: %s", self.node_id, leader_id, e)
                    await asyncio.sleep(backoff_s)
                    continue
                span = self.telemetry.replica_fetch_span(leader_id, reply)
                try:
                    answered = await self._apply_fetched(reply, followed)
                finally:
                    if span is not None:
                        span.end()
                if not answered:
                    await asyncio.sleep(backoff_s)
        finally:
            if fetches is not None:
                fetches.close()
            if channel is not None:
                await channel.close()

    def _follower_fetch_request(self, followed: Iterable[Partition]) -> pb.FetchRequest:
        settings = self.settings
        request = pb.FetchRequest(
            replica_id=self.node_id,
            replica_epoch=self.broker_epoch,
            max_wait_ms=settings.replica_fetch_max_wait_ms,
            min_bytes=1,
            max_bytes=settings.replica_fetch_response_max_bytes,
        )
        topics: dict[str, pb.FetchTopic] = {}
        for partition in followed:
            tp = partition.topic_partition
            topic = topics.get(tp.topic)
            if topic is None:
                topic = topics[tp.topic] = request.topics.add(topic=tp.topic)
            latest = partition.log.leader_epoch_cache.latest_epoch
            topic.partitions.add(
                partition=tp.partition,
                current_leader_epoch=partition.leader_epoch,
                fetch_offset=partition.log.log_end_offset,
                last_fetched_epoch=-1 if latest is None else latest,
                log_start_offset=partition.log.log_start_offset,
                partition_max_bytes=settings.replica_fetch_max_bytes,
            )
        return request

    async def _apply_fetched(
        self, reply: pb.FetchResponse, followed: dict[tuple[str, int], Partition]
    ) -> bool:
        """Append what the leader sent (or truncate where the logs diverged); False if every
        partition's answer was an error (then the fetcher backs off). An answer with nothing
        new is no reason to wait: the leader already held the fetch up to its long poll."""
        answered = False
        for topic in reply.topics:
            for answer in topic.partitions:
                partition = followed.get((topic.topic, answer.partition))
                if partition is None or partition.is_leader:
                    continue
                if answer.error == ErrorCode.NONE:
                    answered = True
                else:
                    log.debug(
                        "broker %d: %s: %s from the leader",
                        self.node_id,
                        partition.topic_partition,
                        ErrorCode.Name(answer.error),
                    )
                    continue
                log_ = partition.log
                if answer.HasField("diverging_epoch"):
                    decision = truncation_offset(
                        EpochEndOffset(
                            answer.diverging_epoch.epoch, answer.diverging_epoch.end_offset
                        ),
                        log_.log_end_offset,
                        log_.latest_epoch_end_offset,
                    )
                    await self.log_manager.truncate_to(partition.topic_partition, decision.offset)
                    log.info(
                        "broker %d: %s truncated to %d (diverging epoch %d)",
                        self.node_id,
                        partition.topic_partition,
                        decision.offset,
                        answer.diverging_epoch.epoch,
                    )
                    continue
                if answer.records:
                    try:
                        log_.append_as_follower(answer.records)
                    except HighwaterError as e:
                        log.error(
                            "broker %d: %s: cannot append the fetched records: %s",
                            self.node_id,
                            partition.topic_partition,
                            e,
                        )
                        continue
                log_.update_high_watermark(min(answer.high_watermark, log_.log_end_offset))
        self._notify()
        return answered

    # --- offsets and metadata -------------------------------------------------------------

    def list_offsets(self, request: pb.ListOffsetsRequest) -> pb.ListOffsetsResponse:
        response = pb.ListOffsetsResponse()
        for topic in request.topics:
            topic_response = response.topics.add(topic=topic.topic)
            for item in topic.partitions:
                answer = topic_response.partitions.add(
                    partition=item.partition, timestamp=-1, offset=-1, leader_epoch=-1
                )
                try:
                    partition = self.partitions.get(topic.topic, item.partition)
                    timestamp, offset = partition.list_offset(
                        item.timestamp, fields.current_leader_epoch(item)
                    )
                except PartitionError as e:
                    answer.error = e.code  # type: ignore[assignment]
                    continue
                answer.timestamp, answer.offset = timestamp, offset
                answer.leader_epoch = partition.leader_epoch
        return response

    def metadata(self, request: pb.MetadataRequest) -> pb.MetadataResponse:
        image = self.partitions.image
        response = pb.MetadataResponse(controller_id=-1)
        for broker in sorted(image.cluster.brokers.values(), key=lambda b: b.broker_id):
            if not broker.is_active or not broker.listeners:
                continue
            endpoint = broker.listeners[0]
            response.brokers.add(
                node_id=broker.broker_id,
                host=endpoint.host,
                port=endpoint.port,
                rack=broker.rack or "",
            )
        for coordinator in sorted(
            image.cluster.coordinators.values(), key=lambda c: c.coordinator_id
        ):
            if not coordinator.listeners:
                continue
            endpoint = coordinator.listeners[0]
            response.coordinators.add(
                node_id=coordinator.coordinator_id,
                host=endpoint.host,
                port=endpoint.port,
                rack=coordinator.rack or "",
            )
        names = list(request.topics) or sorted(image.topics.by_name)
        for name in names:
            topic = image.topic(name)
            if topic is None:
                response.topics.add(name=name, error=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
                continue
            described = response.topics.add(
                name=name, topic_id=topic.topic_id, is_internal=name.startswith("__")
            )
            for index in range(len(topic.partitions)):
                registration = topic.partition(index)
                if registration is None:
                    continue
                described.partitions.add(
                    error=(
                        ErrorCode.NONE
                        if registration.has_leader
                        else ErrorCode.LEADER_NOT_AVAILABLE
                    ),
                    partition=index,
                    leader_id=registration.leader,
                    leader_epoch=registration.leader_epoch,
                    replicas=registration.replicas,
                    isr=registration.isr,
                    offline_replicas=[
                        r for r in registration.replicas if not image.is_active_broker(r)
                    ],
                )
        return response

    def offsets_for_leader_epoch(
        self, request: pb.OffsetsForLeaderEpochRequest
    ) -> pb.OffsetsForLeaderEpochResponse:
        response = pb.OffsetsForLeaderEpochResponse()
        for topic in request.topics:
            topic_response = response.topics.add(topic=topic.topic)
            for item in topic.partitions:
                answer = topic_response.partitions.add(
                    partition=item.partition, leader_epoch=-1, end_offset=-1
                )
                try:
                    partition = self.partitions.get(topic.topic, item.partition)
                    partition.check_leader(fields.current_leader_epoch(item))
                except PartitionError as e:
                    answer.error = e.code  # type: ignore[assignment]
                    continue
                epoch, end = partition.log.latest_epoch_end_offset(item.leader_epoch)
                answer.leader_epoch, answer.end_offset = epoch, end
        return response

    def delete_records(self, request: pb.DeleteRecordsRequest) -> pb.DeleteRecordsResponse:
        response = pb.DeleteRecordsResponse()
        for topic in request.topics:
            topic_response = response.topics.add(topic=topic.topic)
            for item in topic.partitions:
                answer = topic_response.partitions.add(partition=item.partition, low_watermark=-1)
                try:
                    partition = self.partitions.get(topic.topic, item.partition)
                    partition.check_leader(-1)
                    offset = partition.high_watermark if item.offset == -1 else item.offset
                    if not 0 <= offset <= partition.high_watermark:
                        raise PartitionError(
                            ErrorCode.OFFSET_OUT_OF_RANGE,
                            f"{offset} is beyond the high watermark {partition.high_watermark}",
                        )
                    partition.log.maybe_increment_log_start_offset(offset)
                except PartitionError as e:
                    answer.error = e.code  # type: ignore[assignment]
                    continue
                answer.low_watermark = partition.log.log_start_offset
        return response

    async def init_producer_id(
        self, request: pb.InitProducerIdRequest
    ) -> pb.InitProducerIdResponse:
        if request.HasField("producer_id") and request.producer_id >= 0:
            # A known producer asking again: the same id with the next epoch.
            known = request.producer_epoch if request.HasField("producer_epoch") else -1
            epoch = max(known, -1) + 1
            if epoch > 32767:
                return pb.InitProducerIdResponse(error=ErrorCode.PRODUCER_FENCED)
            return pb.InitProducerIdResponse(producer_id=request.producer_id, producer_epoch=epoch)
        next_id, end = self._producer_ids
        if next_id >= end:
            reply = await self.controller.allocate_producer_ids(
                m.AllocateProducerIdsRequest(self.node_id, self.broker_epoch)
            )
            if reply.error != ErrorCode.NONE:
                return pb.InitProducerIdResponse(error=reply.error)  # type: ignore[arg-type]
            next_id, end = reply.producer_id_start, reply.producer_id_start + reply.producer_id_len
        self._producer_ids = (next_id + 1, end)
        return pb.InitProducerIdResponse(producer_id=next_id, producer_epoch=0)

    def find_coordinator(self, request: pb.FindCoordinatorRequest) -> pb.FindCoordinatorResponse:
        """The coordinator of each group, from the metadata image: the owner of the group's
        ``__consumer_offsets`` partition (Kafka's ``partitionFor``) and its first listener.

        Per key: INVALID_REQUEST for an empty group id or an unknown key type;
        COORDINATOR_NOT_AVAILABLE while the topic does not exist, the partition has no
        owner, or the owner's registration is gone.
        """
        image = self.partitions.image
        topic = image.topic(CONSUMER_OFFSETS_TOPIC)
        partition_count = 0 if topic is None else len(topic.partitions)
        response = pb.FindCoordinatorResponse()
        for key in request.keys:
            answer = response.coordinators.add(key=key, node_id=-1, port=-1)
            if request.key_type != pb.COORDINATOR_TYPE_GROUP:
                _fail(answer, ErrorCode.INVALID_REQUEST, f"unknown key type {request.key_type}")
                continue
            if not key:
                _fail(answer, ErrorCode.INVALID_REQUEST, "the group id is empty")
                continue
            if partition_count == 0:
                _fail(
                    answer,
                    ErrorCode.COORDINATOR_NOT_AVAILABLE,
                    f"{CONSUMER_OFFSETS_TOPIC} does not exist yet",
                )
                continue
            partition_id = partition_for_group(key, partition_count)
            assignment = image.coordinator_assignment(partition_id)
            owner = None if assignment is None else image.coordinator(assignment.coordinator_id)
            if owner is None or not owner.listeners:
                _fail(
                    answer,
                    ErrorCode.COORDINATOR_NOT_AVAILABLE,
                    f"no coordinator owns partition {partition_id} of {CONSUMER_OFFSETS_TOPIC}",
                )
                continue
            endpoint = owner.listeners[0]
            answer.node_id = owner.coordinator_id
            answer.host = endpoint.host
            answer.port = endpoint.port
        return response


def _fail_fetch(request: pb.FetchRequest, code: int, message: str) -> pb.FetchResponse:
    """The answer to a fetch refused as a whole: ``code`` for each partition it names."""
    log.warning("fetch refused: %s", message)
    response = pb.FetchResponse()
    for topic in request.topics:
        topic_response = response.topics.add(topic=topic.topic)
        for item in topic.partitions:
            topic_response.partitions.add(
                partition=item.partition, error=code, high_watermark=-1, log_start_offset=-1
            )
    return response


def _fail(answer: Any, code: int, message: str) -> None:
    answer.error = code
    answer.error_message = message


def _batch_bytes(item: pb.ProducePartition) -> bytes:
    """The batches of a produce item: as sent, or its plain records encoded as one batch."""
    if item.WhichOneof("data") == "record_batches":
        return item.record_batches
    plain = item.records
    if not plain.records:
        raise PartitionError(ErrorCode.INVALID_RECORD, "no records to produce")
    now = time.time_ns() // 1_000_000
    records = [
        SimpleRecord(
            key=record.key if record.HasField("key") else None,
            value=record.value if record.HasField("value") else None,
            headers=tuple(
                (h.key, h.value if h.HasField("value") else None) for h in record.headers
            ),
            timestamp=record.timestamp_ms if record.HasField("timestamp_ms") else now,
        )
        for record in plain.records
    ]
    if plain.HasField("producer_id"):
        return build_batch(
            records,
            producer_id=plain.producer_id,
            producer_epoch=plain.producer_epoch,
            base_sequence=plain.base_sequence,
        )
    return build_batch(records)


class BrokerServicer(ForwardedAdminCalls, broker_pb2_grpc.BrokerServicer):
    """``highwater.v1.Broker``: each call goes to the :class:`BrokerServer`, the admin
    calls to the active controller (:class:`~highwater.broker.forwarding.ForwardedAdminCalls`)."""

    def __init__(self, broker: BrokerServer) -> None:
        self._broker = broker
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
