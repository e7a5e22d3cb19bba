"""The broker's request handling: the data-plane requests of ``highwater.v1.Broker``.

Kafka's ``KafkaApis``: Produce (acks 0, 1 and all; plain records are encoded as one
batch; plain records to partition -1 are placed by Kafka's default partitioner,
:mod:`~highwater.broker.record_placement`, and each partition's share is appended at its
leader, here or over gRPC), Fetch (a long poll on ``max_wait_ms`` / ``min_bytes``; a
consumer reads up to the high watermark), a follower's ReplicaFetch (the internal
``ReplicaFetchService``: past the high watermark, or the diverging epoch; its progress
moves the high watermark and the ISR), ListOffsets, Metadata and DescribeTopicPartitions
(Metadata's topics a page at a time), OffsetsForLeaderEpoch, DeleteRecords,
InitProducerId (ids from blocks the controller allocates) and FindCoordinator (the owner
of the group's ``__consumer_offsets`` partition in the metadata image). Each partition of
a request is served by its :class:`~highwater.broker.partitions.Partition`; a failure of
one partition is an error code in its reply, and the other partitions of the request are
served. Long polls and acks=all produces wait in the
:class:`~highwater.broker.purgatory.Purgatory`; ISR changes a follower's fetch brings go
to the AlterPartition sender.

Produce answers and consumers' fetch answers are recorded under the caller's client quotas
(:mod:`highwater.broker.quotas`): their bytes and handler time. An answer over a quota
carries ``throttle_time_ms``, which the gRPC edge (:mod:`highwater.broker.service`) holds
it for; this module never waits for a throttle itself.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import grpc.aio

from highwater.broker import request_fields as fields
from highwater.broker.fetch_sessions import FetchPartitionState, SessionFetch, TopicPartitionKey
from highwater.broker.leader_channels import LeaderChannels
from highwater.broker.partitions import Partition, PartitionError, PartitionManager
from highwater.broker.plain_records import add_plain_records
from highwater.broker.purgatory import Purgatory
from highwater.broker.quota_caller import UNKNOWN_CALLER, QuotaCaller
from highwater.broker.quotas import ClientQuotaManager, Throttle, percentage_of_handler
from highwater.broker.record_placement import place_records
from highwater.broker.replica_sessions import ReplicaFetchSessions
from highwater.broker.replication import AlterPartitionProposal, EpochEndOffset
from highwater.broker.settings import BrokerSettings
from highwater.broker.telemetry import ACKS, CONSUMER, REPLICA, TOPIC, BrokerTelemetry
from highwater.broker.topic_descriptions import (
    MayDescribe,
    add_partition,
    describe_topic_partitions,
    is_internal_topic,
    page_limit,
)
from highwater.config.limits import BATCH_MAX_BYTES
from highwater.controller_api import messages as m
from highwater.controller_api.client import ControllerClient
from highwater.errors import HighwaterError, InvalidRequestError
from highwater.internal.v1 import replication_pb2 as rpb
from highwater.metadata.consumer_offsets import (
    ADMIN_CLIENT_ID,
    CONSUMER_OFFSETS_TOPIC,
    partition_for_group,
)
from highwater.metadata.records import BrokerEndpoint
from highwater.records import SimpleRecord, build_batch
from highwater.records.partitioner import StickyPartitioner
from highwater.rpc.broker_streams import CLIENT_ID_METADATA_KEY
from highwater.v1 import broker_pb2 as pb
from highwater.v1.common_pb2 import ErrorCode

__all__ = ["RequestHandler"]

log = logging.getLogger(__name__)

ACKS_ALL: Final = fields.ACKS_ALL
RECORD_FORMATS: Final = frozenset(pb.RecordFormat.values())
PLACED_BY_BROKER: Final = -1
"""``ProducePartition.partition`` for records the broker places by key."""


class RequestHandler:
    """Answers broker ``node_id``'s data-plane requests (see the module docstring)."""

    def __init__(
        self,
        *,
        node_id: int,
        settings: BrokerSettings,
        partitions: PartitionManager,
        purgatory: Purgatory,
        telemetry: BrokerTelemetry,
        controller: ControllerClient,
        broker_epoch: Callable[[], int],
        propose: Callable[[Partition, AlterPartitionProposal], None],
        throttle: Throttle | None = None,
        leaders: LeaderChannels | None = None,
    ) -> None:
        """``broker_epoch``: this broker's (producer id blocks are asked for under it);
        ``propose``: where ISR changes go (the AlterPartition sender); ``throttle``: the
        client quotas' rates (:mod:`highwater.broker.quotas`); ``leaders``: the channels to
        other brokers, for placed records whose partition another leads."""
        self.node_id = node_id
        self.settings = settings
        self.partitions = partitions
        self.telemetry = telemetry
        self.controller = controller
        self._purgatory = purgatory
        self._broker_epoch = broker_epoch
        self._propose = propose
        self._producer_ids: tuple[int, int] = (0, 0)  # next id, end (exclusive)
        self.throttle = throttle or Throttle()
        self.leaders = leaders if leaders is not None else LeaderChannels(lambda: partitions.image)
        self._sticky = StickyPartitioner()
        self.replica_sessions = ReplicaFetchSessions(partitions, clock=partitions.clock)
        """The followers' fetch sessions (KIP-227); the broker tells it of each partition
        that changed (``PartitionManager.on_change``)."""
        self.control_plane: Callable[[], tuple[str, int, str]] | None = None
        """Where Metadata answers get the cluster id, the active controller's id and the
        metadata mode from (etcd mode sets it: the pushes say who the controller is); None:
        left out, as in KRaft mode, where ``DescribeQuorum`` tells them."""

    @property
    def quotas_in_force(self) -> bool:
        """Whether any client quota is set (else no request is measured)."""
        return len(self.partitions.image.client_quotas) > 0

    def _throttle_time_ms(
        self, caller: QuotaCaller, rate: ClientQuotaManager, value: int, handler_seconds: float
    ) -> int:
        """Record a request's bytes (``rate``: produce or fetch) and handler time under its
        caller's quotas; how long its answer is held (the longer of the two throttles,
        as Kafka's)."""
        quotas = self.partitions.image.client_quotas
        if not quotas:
            return 0
        now_ms = time.monotonic() * 1000
        held = 0
        for manager, recorded in (
            (rate, float(value)),
            (self.throttle.request, percentage_of_handler(handler_seconds)),
        ):
            decision = manager.record(quotas, caller.user, caller.client_id, recorded, now_ms)
            if decision.quota is not None:
                self.telemetry.quota_throttled(manager.key, decision.quota, decision.throttle_ms)
                held = max(held, decision.throttle_ms)
        return held

    # --- Produce ------------------------------------------------------------------------

    async def produce(
        self,
        request: pb.ProduceRequest,
        caller: QuotaCaller = UNKNOWN_CALLER,
        *,
        records_aside: Mapping[tuple[str, int], bytes] | None = None,
        failures_with_acks_0: bool = False,
        internal_topics_allowed: bool = False,
    ) -> pb.ProduceResponse:
        """Append, wait for the acks, then record the request under the caller's quotas:
        the answer's ``throttle_time_ms`` is how long the caller holds it (the edge
        waits; this does not). With acks=0 the answer has no partitions, or with
        ``failures_with_acks_0`` the partitions that failed (the Kafka listener closes
        the connection of an acks=0 produce that failed, as Kafka does).

        ``records_aside``: each partition's batches by (topic, partition), appended as
        they are instead of the item's ``record_batches`` (the Kafka listener's decoded
        bytes: copied into the protobuf and out again, a megabyte each way per request,
        otherwise). An item with batches aside carries only their first batch's header in
        ``record_batches``, for the checks that read it (authorization's idempotent-write
        rule).

        ``internal_topics_allowed``: whether the request may append to internal topics
        (``__consumer_offsets``): only a request from :data:`ADMIN_CLIENT_ID`, the group
        coordinators' (Kafka's ``appendRecords(internalTopicsAllowed=...)``); for others
        each partition of such a topic is INVALID_TOPIC_EXCEPTION, nothing appended."""
        started = time.monotonic()
        handler = _HandlerTime()
        try:
            response, produced = await self._produce(
                request, handler, records_aside, failures_with_acks_0, internal_topics_allowed
            )
        finally:
            self.telemetry.produce_duration.record(
                time.monotonic() - started, _acks_attributes(fields.produce_acks(request))
            )
        throttle_ms = self._throttle_time_ms(
            caller, self.throttle.produce, produced, handler.busy()
        )
        if throttle_ms:
            response.throttle_time_ms = throttle_ms
        return response

    async def _produce(
        self,
        request: pb.ProduceRequest,
        handler: _HandlerTime,
        records_aside: Mapping[tuple[str, int], bytes] | None = None,
        failures_with_acks_0: bool = False,
        internal_topics_allowed: bool = False,
    ) -> tuple[pb.ProduceResponse, int]:
        """The answer, and the bytes the request carried (what its quota counts)."""
        acks = fields.produce_acks(request)
        produced = 0
        response = pb.ProduceResponse()
        waiting: list[tuple[pb.ProducePartitionResponse, str, int]] = []
        committed = False  # whether an append moved a high watermark (a leader alone in its ISR)
        placed: list[asyncio.Task[None]] = []
        for topic in request.topics:
            topic_response = response.topics.add(topic=topic.topic)
            internal = not internal_topics_allowed and is_internal_topic(topic.topic)
            for item in topic.partitions:
                answer = topic_response.partitions.add(partition=item.partition, base_offset=-1)
                answer.log_append_time_ms = -1
                if acks not in (0, 1, ACKS_ALL):
                    _fail(answer, ErrorCode.INVALID_REQUIRED_ACKS, f"acks={acks}")
                    continue
                if internal:
                    _fail(
                        answer,
                        ErrorCode.INVALID_TOPIC_EXCEPTION,
                        f"Cannot append to internal topic {topic.topic}",
                    )
                    continue
                if item.partition == PLACED_BY_BROKER:
                    placed.append(
                        asyncio.create_task(
                            self._produce_placed(request, topic.topic, item, answer)
                        )
                    )
                    continue
                try:
                    partition = self.partitions.get(topic.topic, item.partition)
                    aside = (
                        None
                        if records_aside is None
                        else records_aside.get((topic.topic, item.partition))
                    )
                    data = _batch_bytes(item) if aside is None else aside
                    produced += len(data)
                    high_watermark = partition.high_watermark
                    log_end_offset = partition.log_end_offset
                    info = partition.append(data, acks)
                    committed = committed or partition.high_watermark != high_watermark
                except HighwaterError as e:
                    _fail(answer, getattr(e, "code", ErrorCode.UNKNOWN_SERVER_ERROR), str(e))
                    continue
                self.replica_sessions.partition_changed(partition.topic_partition, log_end_offset)
                self.telemetry.bytes_in.add(len(data), _topic_attributes(topic.topic))
                answer.base_offset = info.first_offset
                answer.log_append_time_ms = info.log_append_time
                answer.log_start_offset = info.log_start_offset
                if acks == ACKS_ALL:
                    waiting.append((answer, topic.topic, info.last_offset + 1))
        self._purgatory.notify(committed=committed)
        if placed:
            await asyncio.gather(*placed)
        if acks == 0:
            failed = pb.ProduceResponse()
            if failures_with_acks_0:
                for topic_response in response.topics:
                    errors = [p for p in topic_response.partitions if p.error != ErrorCode.NONE]
                    if errors:
                        failed.topics.add(topic=topic_response.topic).partitions.extend(errors)
            return failed, produced
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
            # Parked on the first partition not yet replicated: woken when its high
            # watermark covers the append (or by any other change), then all are checked.
            answer, topic_name, end = waiting[0]
            began = time.perf_counter()
            await self._purgatory.wait_replicated((topic_name, answer.partition), end, remaining)
            handler.waited(time.perf_counter() - began)
        return response, produced

    async def _produce_placed(
        self,
        request: pb.ProduceRequest,
        topic: str,
        item: pb.ProducePartition,
        answer: pb.ProducePartitionResponse,
    ) -> None:
        """Records to partition -1: place each (:func:`place_records`), append each
        partition's share at its leader (this broker's own request path, or the leader's
        Produce over gRPC, with the request's acks and timeout), and fill ``answer``'s
        placements in the request's order."""
        refusal = _placement_refusal(item)
        if refusal is not None:
            _fail(answer, ErrorCode.INVALID_REQUEST, refusal)
            return
        image = self.partitions.image
        registration = image.topic(topic)
        if registration is None or not len(registration.partitions):
            _fail(answer, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"no topic {topic!r}")
            return
        count = len(registration.partitions)
        leaders = {p: registration.partition(p) for p in range(count)}
        available = [p for p, r in leaders.items() if r is not None and r.has_leader]
        records = item.records.records
        placement = place_records(topic, records, count, available, self._sticky)
        if placement.sticky is not None:
            self._sticky.on_produced(topic, placement.sticky, placement.sticky_bytes)
        placements = [answer.placements.add(partition=-1, offset=-1) for _ in records]
        shares = sorted(placement.shares.items())
        outcomes = await asyncio.gather(
            *(
                self._produce_share(request, topic, partition, [records[i] for i in indexes])
                for partition, indexes in shares
            )
        )
        for (partition, indexes), share_answer in zip(shares, outcomes, strict=True):
            for position, index in enumerate(indexes):
                where = placements[index]
                where.partition = partition
                where.error = share_answer.error
                if share_answer.error == ErrorCode.NONE and share_answer.base_offset >= 0:
                    where.offset = share_answer.base_offset + position
            if share_answer.error != ErrorCode.NONE and answer.error == ErrorCode.NONE:
                _fail(
                    answer,
                    share_answer.error,
                    f"{topic}-{partition}: {share_answer.error_message}".rstrip(": "),
                )

    async def _produce_share(
        self, request: pb.ProduceRequest, topic: str, partition: int, records: list[pb.Record]
    ) -> pb.ProducePartitionResponse:
        """Append ``records`` to ``partition`` at its leader; that partition's answer."""
        share = pb.ProduceRequest(
            topics=[
                pb.ProduceTopic(
                    topic=topic,
                    partitions=[
                        pb.ProducePartition(
                            partition=partition, records=pb.PlainRecords(records=records)
                        )
                    ],
                )
            ]
        )
        share.acks = fields.produce_acks(request)
        share.timeout_ms = fields.produce_timeout_ms(request)
        registration = self.partitions.image.topic(topic)
        leader = None if registration is None else registration.partition(partition)
        failed = pb.ProducePartitionResponse(partition=partition, base_offset=-1)
        if leader is None or not leader.has_leader:
            _fail(failed, ErrorCode.LEADER_NOT_AVAILABLE, "the partition has no leader")
            return failed
        if leader.leader == self.node_id:
            answer, _ = await self._produce(share, _HandlerTime(), internal_topics_allowed=True)
        else:
            stub = self.leaders.stub(leader.leader)
            if stub is None:
                _fail(failed, ErrorCode.LEADER_NOT_AVAILABLE, f"broker {leader.leader} unknown")
                return failed
            try:
                answer = await stub.Produce(
                    share,
                    timeout=share.timeout_ms / 1000 + 5,
                    # The request was judged here, internal topics included: the leader
                    # appends the share as it is.
                    metadata=((CLIENT_ID_METADATA_KEY, ADMIN_CLIENT_ID),),
                )
            except grpc.aio.AioRpcError as e:
                _fail(failed, ErrorCode.NETWORK_EXCEPTION, f"leader {leader.leader}: {e.code()}")
                return failed
        if share.acks == 0:
            return pb.ProducePartitionResponse(partition=partition, base_offset=-1)
        return answer.topics[0].partitions[0]

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

    async def fetch(
        self,
        request: pb.FetchRequest,
        caller: QuotaCaller = UNKNOWN_CALLER,
        *,
        records_aside: dict[tuple[str, int], bytes] | None = None,
    ) -> pb.FetchResponse:
        """A consumer's fetch (a long poll): records up to the high watermark. A public
        ``FetchRequest`` cannot name a replica, so nothing it asks moves replication state
        (followers fetch with :meth:`replica_fetch`).

        The answer is recorded under the caller's quotas (its bytes and handler time) and
        carries ``throttle_time_ms``, how long the caller holds it.

        ``records_aside``: where each partition's batches go, by (topic, partition), instead
        of the answer's ``records`` fields (which stay empty): the bytes as read, for an edge
        that writes them out itself (the Kafka listener), without the two copies a protobuf
        field costs (one in, one out)."""
        started = time.monotonic()
        handler = _HandlerTime()
        deadline = started + max(request.max_wait_ms, 0) / 1000
        if request.record_format not in RECORD_FORMATS:
            raise InvalidRequestError(f"record_format {request.record_format} is not known")
        while True:
            response, total, failed = self._read(request, records_aside)
            now = time.monotonic()
            if failed or total >= max(request.min_bytes, 1) or now >= deadline:
                self.telemetry.fetch_duration.record(now - started, CONSUMER)
                throttle_ms = self._throttle_time_ms(
                    caller, self.throttle.fetch, total, handler.busy()
                )
                if throttle_ms:
                    response.throttle_time_ms = throttle_ms
                return response
            await handler.wait(self._purgatory, deadline - now, appended=False)

    async def replica_fetch(self, request: rpb.ReplicaFetchRequest) -> rpb.ReplicaFetchResponse:
        """A follower's fetch (``ReplicaFetchService``; a long poll that an append wakes).
        Broker ``replica_id`` must be registered with the epoch the fetch names, or every
        partition's answer is STALE_BROKER_EPOCH and nothing moves: an earlier incarnation
        of the broker, or anyone else naming its id, cannot pass for the follower.
        Followers' fetches are exempt from client quotas.

        In a fetch session (:mod:`highwater.broker.replica_sessions`) an incremental fetch
        reads the partitions it names and those changed since the session's last answer,
        parks on its session until one changes, and answers only the partitions with
        something new to say; a fetch without a session reads and answers every partition
        it names, parked on the broker's purgatory."""
        # (Followers' fetches count against no quota, so their handler time is not kept.)
        started = time.monotonic()
        deadline = started + max(request.max_wait_ms, 0) / 1000
        refusal = self._follower_refusal(request)
        if refusal is not None:
            return _fail_replica_fetch(request, ErrorCode.STALE_BROKER_EPOCH, refusal)
        fetch = self.replica_sessions.resolve(request)
        if fetch.error:
            self.telemetry.fetch_duration.record(time.monotonic() - started, REPLICA)
            return rpb.ReplicaFetchResponse(error=fetch.error)  # type: ignore[arg-type]
        session = fetch.session
        budget = fields.fetch_max_bytes(request, self.settings.fetch_max_bytes)
        min_bytes = max(request.min_bytes, 1)
        answers: dict[TopicPartitionKey, _FollowerAnswer] = {}
        to_read = fetch.partitions
        total = 0
        while True:
            failed, total = self._read_for_follower(
                request.replica_id, to_read, answers, budget, fetch, total
            )
            now = time.monotonic()
            if failed or total >= min_bytes or now >= deadline:
                break
            if session is None:
                await self._purgatory.wait(deadline - now, appended=True)
            else:
                await self.replica_sessions.wait(session, deadline - now)
                to_read = session.take_changed()
        self.telemetry.fetch_duration.record(now - started, REPLICA)
        return self._replica_fetch_answer(fetch, answers)

    def _replica_fetch_answer(
        self, fetch: SessionFetch, answers: dict[TopicPartitionKey, _FollowerAnswer]
    ) -> rpb.ReplicaFetchResponse:
        """The answers a fetch reads, trimmed to what is new in an incremental one; a
        partition whose answer left records behind (the answer's byte budget ran out) is
        marked to be read at the session's next fetch."""
        response = rpb.ReplicaFetchResponse(session_id=fetch.session_id)
        session = fetch.session
        topics: dict[str, pb.FetchTopicResponse] = {}
        for key, answer in answers.items():
            diverging = answer.diverging is not None
            if session is not None and answer.error == ErrorCode.NONE and not answer.records:
                state = session.partitions.get(key)
                replica = self.partitions.replica(key)  # type: ignore[arg-type]
                if (
                    not diverging
                    and state is not None
                    and replica is not None
                    and state.fetch_offset < replica.log_end_offset
                ):
                    session.mark(key)  # left out of a full answer: read it next time
            if not fetch.include(
                key,
                answer.high_watermark,
                answer.log_start_offset,
                answer.error,
                bool(answer.records) or diverging,
            ):
                continue
            topic = topics.get(key[0])
            if topic is None:
                topic = topics[key[0]] = response.topics.add(topic=key[0])
            out = topic.partitions.add(
                partition=key[1],
                error=answer.error,
                high_watermark=answer.high_watermark,
                log_start_offset=answer.log_start_offset,
                records=answer.records,
            )
            if answer.diverging is not None:
                out.diverging_epoch.epoch = answer.diverging.epoch
                out.diverging_epoch.end_offset = answer.diverging.end_offset
        return response

    def _follower_refusal(self, request: rpb.ReplicaFetchRequest) -> str | None:
        """Why a fetch that claims to come from broker ``replica_id`` is not that broker's
        (it is not registered, or with another epoch), or ``None``."""
        replica_id = request.replica_id
        broker = self.partitions.image.broker(replica_id) if replica_id >= 0 else None
        if broker is None:
            return f"broker {replica_id} is not registered"
        if broker.broker_epoch != request.replica_epoch:
            return (
                f"broker {replica_id} is registered with epoch {broker.broker_epoch}, "
                f"not {request.replica_epoch}"
            )
        return None

    def _read(
        self,
        request: pb.FetchRequest,
        records_aside: dict[tuple[str, int], bytes] | None = None,
    ) -> tuple[pb.FetchResponse, int, bool]:
        response = pb.FetchResponse()
        if records_aside is not None:
            records_aside.clear()  # (a long poll reads again: only the last read answers)
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
                share = max(min(fields.partition_fetch_max_bytes(item), room), 0)
                plain_bytes = 0
                try:
                    partition = self.partitions.get(topic.topic, item.partition)
                    data = partition.read(
                        item.fetch_offset,
                        share,
                        fields.current_leader_epoch(item),
                        min_one_batch=_may_pass_its_share(partition, room, total),
                    )
                    if plain:
                        # Decompressed records, counted as what they add to the answer.
                        plain_bytes = add_plain_records(
                            answer,
                            data.records,
                            item.fetch_offset,
                            max_bytes=share,
                            at_least_one=total == 0,
                        ).bytes
                except HighwaterError as e:
                    answer.error = e.code  # type: ignore[assignment]
                    failed = True
                    continue
                answer.high_watermark = partition.high_watermark
                answer.log_start_offset = data.log_start_offset
                records = data.records
                if not plain and not _fits_the_answer(total, records):
                    records = b""
                if records_aside is not None and not plain:
                    records_aside[(topic.topic, item.partition)] = records
                elif not plain:
                    answer.records = records
                total += plain_bytes if plain else len(records)
                if records:
                    self.telemetry.bytes_out.add(len(records), _topic_attributes(topic.topic))
        return response, total, failed

    def _read_for_follower(
        self,
        replica_id: int,
        partitions: list[tuple[TopicPartitionKey, FetchPartitionState]],
        answers: dict[TopicPartitionKey, _FollowerAnswer],
        budget: int,
        fetch: SessionFetch,
        total: int,
    ) -> tuple[bool, int]:
        """A follower's fetch of ``partitions`` into ``answers`` (an answer read again
        replaces the earlier one): records past the high watermark too, or the diverging
        epoch; its progress moves the high watermark and may bring it back into the ISR.
        ``total``: the bytes of records in ``answers``. Returns whether some answer must go
        at once (an error, a diverging epoch), and the bytes of records in ``answers`` now."""
        failed = False
        session_id = fetch.session.session_id if fetch.session is not None else 0
        for key, item in partitions:
            topic, index = key
            answer = _FollowerAnswer()
            previous = answers.pop(key, None)
            if previous is not None:
                total -= len(previous.records)
            answers[key] = answer
            room = budget - total
            try:
                partition = self.partitions.get(topic, index)
                read = partition.read_for_follower(
                    replica_id,
                    item.fetch_offset,
                    item.last_fetched_epoch,
                    max(min(fields.partition_fetch_max_bytes(item), room), 0),
                    item.current_leader_epoch,
                    min_one_batch=_may_pass_its_share(partition, room, total),
                )
            except HighwaterError as e:  # a failed log directory: KAFKA_STORAGE_ERROR
                answer.error = getattr(e, "code", ErrorCode.UNKNOWN_SERVER_ERROR)
                failed = True
                continue
            if read.high_watermark_moved:
                # acks=all produces and consumers wait for the high watermark; the other
                # followers' fetches do not: their sessions read it with their next read
                # (records, another change, or the long poll's end), without a wake-up.
                self._purgatory.high_watermark_moved(key, partition.high_watermark)
                self.replica_sessions.high_watermark_moved(key, except_session=session_id)
            answer.high_watermark = partition.high_watermark
            answer.log_start_offset = partition.log.log_start_offset
            if read.proposal is not None:
                self._propose(partition, read.proposal)
            if read.diverging is not None:
                answer.diverging = read.diverging
                failed = True  # answer at once: the follower truncates first
                continue
            assert read.data is not None
            records = read.data.records
            if not _fits_the_answer(total, records):
                records = b""
            answer.records = records
            if records:
                total += len(records)
                self.telemetry.bytes_out.add(len(records), _replica_bytes_out_attributes(topic))
        return failed, total

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
                    timestamp, offset, epoch = partition.list_offset(
                        item.timestamp, fields.current_leader_epoch(item)
                    )
                except HighwaterError as e:  # a failed log directory: KAFKA_STORAGE_ERROR
                    answer.error = e.code  # type: ignore[assignment]
                    continue
                answer.timestamp, answer.offset, answer.leader_epoch = timestamp, offset, epoch
        return response

    def metadata(
        self, request: pb.MetadataRequest, listener: str | None = None
    ) -> pb.MetadataResponse:
        """The brokers, coordinators and topics; each broker and coordinator at its
        address on ``listener``, the listener the request arrived on, and left out if it
        has none there (Kafka's rule); at its first listener when ``listener`` is None."""
        image = self.partitions.image
        response = pb.MetadataResponse(controller_id=-1)
        if self.control_plane is not None:
            cluster_id, controller_id, mode = self.control_plane()
            response.cluster_id, response.controller_id, response.metadata_mode = (
                cluster_id,
                controller_id,
                mode,
            )
        for broker in sorted(image.cluster.brokers.values(), key=lambda b: b.broker_id):
            endpoint = endpoint_on(broker.listeners, listener)
            if not broker.is_active or endpoint is None:
                continue
            response.brokers.add(
                node_id=broker.broker_id,
                host=endpoint.host,
                port=endpoint.port,
                rack=broker.rack or "",
            )
        for coordinator in sorted(
            image.cluster.coordinators.values(), key=lambda c: c.coordinator_id
        ):
            endpoint = endpoint_on(coordinator.listeners, listener)
            if endpoint is None:
                continue
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
                name=name, topic_id=topic.topic_id, is_internal=is_internal_topic(name)
            )
            for index in range(len(topic.partitions)):
                registration = topic.partition(index)
                if registration is not None:
                    add_partition(described.partitions, image, index, registration)
        return response

    def describe_topic_partitions(
        self,
        request: pb.DescribeTopicPartitionsRequest,
        may_describe: MayDescribe | None = None,
    ) -> pb.DescribeTopicPartitionsResponse:
        """One page of Metadata's topic descriptions (KIP-966,
        :mod:`~highwater.broker.topic_descriptions`), at most the broker's
        ``max.request.partition.size.limit`` partitions.

        :raises InvalidRequestError: a negative limit or cursor partition, or a cursor
            naming a topic the request does not."""
        limit = page_limit(
            request.response_partition_limit, self.settings.max_request_partition_size_limit
        )
        cursor = (
            (request.cursor.topic, request.cursor.partition) if request.HasField("cursor") else None
        )
        return describe_topic_partitions(
            self.partitions.image, request.topics, cursor, limit, may_describe
        )

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
        """Move each partition's log start offset up to the offset asked for (-1: the high
        watermark), as its leader.

        Refused, the log untouched: a partition of an internal topic (INVALID_TOPIC_EXCEPTION;
        ``__consumer_offsets`` holds the groups' committed offsets; Kafka's
        ``ReplicaManager.deleteRecordsOnLocalLog``); a topic whose ``cleanup.policy`` has no
        ``delete`` (POLICY_VIOLATION: a compacted log keeps the latest record of every key;
        Kafka's ``Partition.deleteRecordsOnLeader``); an offset past the high watermark
        (OFFSET_OUT_OF_RANGE).
        """
        response = pb.DeleteRecordsResponse()
        for topic in request.topics:
            topic_response = response.topics.add(topic=topic.topic)
            internal = is_internal_topic(topic.topic)
            for item in topic.partitions:
                answer = topic_response.partitions.add(partition=item.partition, low_watermark=-1)
                if internal:
                    answer.error = ErrorCode.INVALID_TOPIC_EXCEPTION
                    continue
                try:
                    partition = self.partitions.get(topic.topic, item.partition)
                    partition.check_leader(-1)
                    if not partition.log.config.delete:
                        raise PartitionError(
                            ErrorCode.POLICY_VIOLATION,
                            f"{partition.topic_partition}: cleanup.policy has no 'delete'",
                        )
                    offset = partition.high_watermark if item.offset == -1 else item.offset
                    if not 0 <= offset <= partition.high_watermark:
                        raise PartitionError(
                            ErrorCode.OFFSET_OUT_OF_RANGE,
                            f"{offset} is beyond the high watermark {partition.high_watermark}",
                        )
                    partition.log.maybe_increment_log_start_offset(offset)
                except HighwaterError as e:  # a failed log directory: KAFKA_STORAGE_ERROR
                    answer.error = e.code  # type: ignore[assignment]
                    continue
                self.replica_sessions.partition_changed(partition.topic_partition)
                answer.low_watermark = partition.log.log_start_offset
        return response

    def describe_log_dirs(self, request: pb.DescribeLogDirsRequest) -> pb.DescribeLogDirsResponse:
        """This broker's log directories (Kafka's DescribeLogDirs): each one's path, id,
        health and disk usage, and the replicas in it of the topics (and partitions)
        asked for, or of every topic."""
        wanted: dict[str, frozenset[int] | None] | None = None
        if request.topics:
            wanted = {
                t.topic: frozenset(t.partitions) if t.partitions else None for t in request.topics
            }
        response = pb.DescribeLogDirsResponse()
        log_manager = self.partitions.log_manager
        for described in log_manager.describe(None if wanted is None else wanted.keys()):
            result = response.results.add(
                log_dir=described.path,
                directory_id=described.directory_id,
                total_bytes=described.total_bytes,
                usable_bytes=described.usable_bytes,
            )
            if described.error is not None:
                result.error = ErrorCode.KAFKA_STORAGE_ERROR
                result.error_message = described.error
            topics: dict[str, pb.LogDirTopic] = {}
            for replica in described.replicas:
                tp = replica.topic_partition
                partitions = None if wanted is None else wanted.get(tp.topic)
                if partitions is not None and tp.partition not in partitions:
                    continue
                topic = topics.get(tp.topic)
                if topic is None:
                    topic = topics[tp.topic] = result.topics.add(name=tp.topic)
                topic.partitions.add(
                    partition_index=tp.partition,
                    partition_size=replica.size,
                    offset_lag=replica.offset_lag,
                    is_future_key=replica.is_future,
                )
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
                m.AllocateProducerIdsRequest(self.node_id, self._broker_epoch())
            )
            if reply.error != ErrorCode.NONE:
                return pb.InitProducerIdResponse(error=reply.error)  # type: ignore[arg-type]
            next_id, end = reply.producer_id_start, reply.producer_id_start + reply.producer_id_len
        self._producer_ids = (next_id + 1, end)
        return pb.InitProducerIdResponse(producer_id=next_id, producer_epoch=0)

    def find_coordinator(
        self, request: pb.FindCoordinatorRequest, listener: str | None = None
    ) -> pb.FindCoordinatorResponse:
        """The coordinator of each group, from the metadata image: the owner of the group's
        ``__consumer_offsets`` partition (Kafka's ``partitionFor``) at its address on
        ``listener`` (the request's; its first listener when None).

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
            if request.key_type not in (pb.COORDINATOR_TYPE_UNSPECIFIED, pb.COORDINATOR_TYPE_GROUP):
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
            endpoint = None if owner is None else endpoint_on(owner.listeners, listener)
            if owner is None or endpoint is None:
                where = "" if listener is None else f" with a listener {listener}"
                _fail(
                    answer,
                    ErrorCode.COORDINATOR_NOT_AVAILABLE,
                    f"no coordinator{where} owns partition {partition_id} of "
                    f"{CONSUMER_OFFSETS_TOPIC}",
                )
                continue
            answer.node_id = owner.coordinator_id
            answer.host = endpoint.host
            answer.port = endpoint.port
        return response


def _may_pass_its_share(partition: Partition, room: int, total: int) -> bool:
    """Whether a partition read into a fetch answer holding ``total`` bytes of records, with
    ``room`` left of its budget, may return its first batch whole past its share (so that a
    consumer or follower always progresses): the answer's first partition with records
    always, a later one only while the answer has room and the largest batch its topic
    takes (``max.message.bytes``) would still leave the answer within one gRPC message
    (:data:`~highwater.config.limits.BATCH_MAX_BYTES` of records). Kafka lets only the first
    one pass; later ones here pass too while that holds, so that a partition whose next
    batch is larger than its share is not starved behind busier ones listed before it."""
    if total == 0:
        return True
    return room > 0 and total + partition.log.config.max_message_bytes <= BATCH_MAX_BYTES


def _fits_the_answer(total: int, records: bytes) -> bool:
    """Whether ``records`` read for a fetch answer already holding ``total`` bytes of
    records keep it within one gRPC message (:data:`~highwater.config.limits.BATCH_MAX_BYTES`
    of records). :func:`_may_pass_its_share` judges a partition by the largest batch its
    topic takes now; a batch written while it took larger ones (``max.message.bytes``
    lowered since) can pass that, and the answer would then be refused by gRPC on every
    retry. Such a partition answers without records this time: the answer's first
    partition with records always carries its batch, as in a fetch where the partitions
    before it have nothing new."""
    return total == 0 or total + len(records) <= BATCH_MAX_BYTES


# Metric attributes made once each and shared (a meter does not change the attributes it
# is given), instead of a dict built per request and partition.


@functools.lru_cache(maxsize=1024)
def _topic_attributes(topic: str) -> dict[str, str]:
    return {TOPIC: topic}


@functools.lru_cache(maxsize=8)
def _acks_attributes(acks: int) -> dict[str, int]:
    return {ACKS: acks}


@functools.lru_cache(maxsize=1024)
def _replica_bytes_out_attributes(topic: str) -> dict[str, str | bool]:
    return {**REPLICA, TOPIC: topic}


@dataclass(slots=True)
class _FollowerAnswer:
    """One partition's answer to a follower's fetch, before the fetch session decides
    whether it goes into the response."""

    error: int = ErrorCode.NONE
    high_watermark: int = -1
    log_start_offset: int = -1
    records: bytes = b""
    diverging: EpochEndOffset | None = None


class _HandlerTime:
    """The time a request kept the handler busy: since it began, less its waits in the
    purgatory (``request_percentage`` counts handler time, not waiting)."""

    __slots__ = ("_started", "_waited")

    def __init__(self) -> None:
        self._started = time.perf_counter()
        self._waited = 0.0

    async def wait(self, purgatory: Purgatory, timeout_s: float, **kwargs: bool) -> None:
        began = time.perf_counter()
        try:
            await purgatory.wait(timeout_s, **kwargs)
        finally:
            self._waited += time.perf_counter() - began

    def waited(self, seconds: float) -> None:
        """Count ``seconds`` spent waiting elsewhere (a fetch session's park)."""
        self._waited += seconds

    def busy(self) -> float:
        return time.perf_counter() - self._started - self._waited


def endpoint_on(listeners: Sequence[BrokerEndpoint], name: str | None) -> BrokerEndpoint | None:
    """The endpoint named ``name`` (the first one when ``name`` is None), if any."""
    if name is None:
        return listeners[0] if listeners else None
    return next((endpoint for endpoint in listeners if endpoint.name == name), None)


def _fail_replica_fetch(
    request: rpb.ReplicaFetchRequest, code: int, message: str
) -> rpb.ReplicaFetchResponse:
    """The answer to a follower's fetch refused as a whole: ``code`` for each partition."""
    log.warning("replica fetch refused: %s", message)
    response = rpb.ReplicaFetchResponse()
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


def _placement_refusal(item: pb.ProducePartition) -> str | None:
    """Why a produce to partition -1 cannot be placed, or None."""
    if item.WhichOneof("data") != "records":
        return (
            "partition -1 (placed by the broker) takes plain records only: "
            "record batches name their partition"
        )
    if item.records.HasField("producer_id"):
        return (
            "partition -1 (placed by the broker) cannot carry an idempotent producer's "
            "sequence: sequences are per partition"
        )
    if not item.records.records:
        return "no records to produce"
    return None


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
