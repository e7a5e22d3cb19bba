"""The client's view of the cluster: brokers, topic partitions and their leaders, from Metadata.

A :class:`ClusterMetadata` starts from bootstrap addresses (``HOST:PORT``), asks any reachable
broker for ``Metadata`` and keeps what it answered: the brokers (node id -> ``host:port``) and,
per topic, the partition count and each partition's leader id and leader epoch. It opens one
``grpc.aio`` channel per broker address and reuses it for every request to that broker, and
sends fetches and produce requests over a :class:`~highwater.rpc.broker_streams.FetchStream`
and a :class:`~highwater.rpc.broker_streams.ProduceStream` kept per broker (produce requests
are unary calls while tracing is on: each carries its trace context in its call's metadata,
which a stream sends once).

Requests any broker may answer (``Metadata``, ``FindCoordinator``) go through one loop,
:meth:`ClusterMetadata.any_broker`, shaped by a :class:`BrokerPolicy`: producers and
consumers try the known brokers, then the bootstrap ones, moving on after any failure;
the admin client asks its bootstrap brokers only, starting with the last that answered,
and moves on only after failures that say the broker is unreachable (its own errors and
messages come from its policy). ``ListOffsets`` is sent here too
(:meth:`ClusterMetadata.list_offsets`), for the consumer and the admin client alike, each
with its own rule for what to retry.

Every fetch and produce request carries the client's ``client.id`` as the ``client-id``
call metadata (what Kafka's request header carries), which brokers' quotas count by. A
broker that throttled an answer (its ``throttle_time_ms``) gets no fetch or produce
request from this client until that long after the throttled request was sent
(:class:`BrokerThrottles`; the producer holds its batches meanwhile, as Kafka's client
mutes a throttled connection).

Requests that answer ``NOT_LEADER_OR_FOLLOWER``, ``FENCED_LEADER_EPOCH``,
``UNKNOWN_TOPIC_OR_PARTITION``, ``LEADER_NOT_AVAILABLE`` or ``KAFKA_STORAGE_ERROR`` (the
leader's log directory failed) make the cached leader stale:
:meth:`ClusterMetadata.handle_error` forgets it, and the next :meth:`ClusterMetadata.refresh`
asks again (Kafka's ``Metadata.requestUpdate``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

import grpc
import grpc.aio

from highwater.client.errors import (
    BrokerNotAvailableError,
    ClusterError,
    CoordinatorNotAvailableError,
    GroupAuthorizationFailedError,
    LeaderNotAvailableError,
    UnknownTopicOrPartitionError,
)
from highwater.rpc.broker_streams import CLIENT_ID_METADATA_KEY, FetchStream, ProduceStream
from highwater.rpc.channels import MAX_MESSAGE_BYTES, close_channels, open_channel
from highwater.rpc.client_auth import ClientSecurity
from highwater.telemetry.configure import tracing_enabled
from highwater.v1 import broker_pb2 as pb
from highwater.v1 import broker_pb2_grpc, coordinator_pb2_grpc
from highwater.v1.common_pb2 import ErrorCode

__all__ = [
    "BROKER_MESSAGE_MAX_BYTES",
    "INVALIDATING_ERRORS",
    "BrokerNotAvailableError",
    "BrokerPolicy",
    "BrokerThrottles",
    "ClusterError",
    "ClusterMetadata",
    "CoordinatorNotAvailableError",
    "LeaderNotAvailableError",
    "PartitionInfo",
    "TopicInfo",
    "UnknownTopicOrPartitionError",
    "parse_bootstrap_servers",
]

BROKER_MESSAGE_MAX_BYTES = MAX_MESSAGE_BYTES
"""The largest gRPC message a broker's server takes and sends (both ways): the shared
:data:`~highwater.rpc.channels.MAX_MESSAGE_BYTES` its server is made with. A Fetch answer
carries up to the broker's ``fetch.max.bytes`` (55 MiB) and one batch more, far past
gRPC's default 4 MiB receive limit: a consumer's channels take what the broker may send."""

#: Partition error codes after which the client's leader for that partition is stale.
INVALIDATING_ERRORS: frozenset[int] = frozenset(
    {
        ErrorCode.NOT_LEADER_OR_FOLLOWER,
        ErrorCode.FENCED_LEADER_EPOCH,
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ErrorCode.LEADER_NOT_AVAILABLE,
        ErrorCode.UNKNOWN_LEADER_EPOCH,
        # The leader's log directory failed: leadership is moving (Kafka's
        # KafkaStorageException is an InvalidMetadataException).
        ErrorCode.KAFKA_STORAGE_ERROR,
    }
)


_R = TypeVar("_R")


def _no_broker_answered(
    what: str, tried: Sequence[str], failures: Sequence[tuple[str, grpc.aio.AioRpcError]]
) -> Exception:
    """The producer's and consumer's error when no broker answered a request."""
    last = failures[-1][1] if failures else None
    return BrokerNotAvailableError(f"no broker answered {what} (tried {', '.join(tried)}): {last}")


@dataclass(frozen=True, slots=True)
class BrokerPolicy:
    """How :meth:`ClusterMetadata.any_broker` asks a request of "any broker".

    ``bootstrap_only``: ask only the bootstrap brokers, starting with the last that
    answered (else the known brokers first, then the bootstrap ones, in order).
    ``retriable_status``: the gRPC failures after which the next broker is asked (None:
    every failure); any other failure is raised as ``rpc_error`` makes it.
    ``unavailable``: the error raised when no broker answered, from the request's name,
    the brokers tried and each failure.
    """

    bootstrap_only: bool = False
    retriable_status: frozenset[grpc.StatusCode] | None = None
    rpc_error: Callable[[grpc.aio.AioRpcError], Exception] | None = None
    unavailable: Callable[
        [str, Sequence[str], Sequence[tuple[str, grpc.aio.AioRpcError]]], Exception
    ] = _no_broker_answered


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    """One partition as Metadata described it: its leader (-1: none) and leader epoch."""

    partition: int
    leader_id: int
    leader_epoch: int
    error: int = ErrorCode.NONE


@dataclass(frozen=True, slots=True)
class TopicInfo:
    """One topic as Metadata described it: its partitions, by index."""

    name: str
    partitions: tuple[PartitionInfo, ...]

    @property
    def num_partitions(self) -> int:
        """How many partitions the topic has."""
        return len(self.partitions)

    def available_partitions(self) -> list[int]:
        """The partitions that have a leader."""
        return [p.partition for p in self.partitions if p.leader_id >= 0]


def parse_bootstrap_servers(servers: str | Sequence[str]) -> tuple[str, ...]:
    """``"h1:p1,h2:p2"`` (or a list of ``HOST:PORT``) as a tuple of addresses, checked."""
    items = servers.split(",") if isinstance(servers, str) else list(servers)
    result: list[str] = []
    for item in items:
        address = item.strip()
        host, sep, port = address.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"bootstrap server {address!r} is not of the form HOST:PORT")
        result.append(address)
    if not result:
        raise ValueError("no bootstrap servers given")
    return tuple(result)


class BrokerThrottles:
    """When each broker's throttle ends: a request sent at ``sent_at`` and answered with
    ``throttle_time_ms`` keeps the client from that broker until ``sent_at`` plus that
    time. Times are the caller's clock, in seconds."""

    def __init__(self) -> None:
        self._until: dict[str, float] = {}

    def note(self, address: str, sent_at: float, throttle_time_ms: int) -> None:
        """An answer from ``address`` to a request sent at ``sent_at``."""
        if throttle_time_ms > 0:
            until = sent_at + throttle_time_ms / 1000
            if until > self._until.get(address, 0.0):
                self._until[address] = until

    def remaining(self, address: str, now: float) -> float:
        """Seconds until requests may go to ``address`` again (0: now)."""
        until = self._until.get(address)
        if until is None:
            return 0.0
        if until <= now:
            del self._until[address]
            return 0.0
        return until - now


class ClusterMetadata:
    """Brokers, topics and partition leaders as the cluster last described them.

    Not thread-safe: use it from one event loop. ``request_timeout_s`` bounds each
    Metadata call; ``max_message_bytes`` sets the channels' message limit (a broker's own
    by default: :data:`BROKER_MESSAGE_MAX_BYTES`); ``policy`` shapes the requests any broker
    may answer.
    """

    def __init__(
        self,
        bootstrap_servers: str | Sequence[str],
        *,
        request_timeout_s: float = 30.0,
        max_message_bytes: int = BROKER_MESSAGE_MAX_BYTES,
        policy: BrokerPolicy = BrokerPolicy(),
        client_id: str = "",
        security: ClientSecurity | None = None,
    ) -> None:
        """Remember the bootstrap addresses; no connection is made until the first request.
        ``client_id``: the ``client.id`` fetch and produce requests carry. ``security``:
        every channel's TLS and SASL (``None``: the process's)."""
        self.security = security
        self.bootstrap_servers = parse_bootstrap_servers(bootstrap_servers)
        self.request_timeout_s = request_timeout_s
        self.policy = policy
        self._max_message_bytes = max_message_bytes
        self._next_bootstrap = 0
        """The bootstrap broker that answered last (``bootstrap_only``: asked first)."""
        self.brokers: dict[int, str] = {}
        self.cluster_id = ""
        self._topics: dict[str, TopicInfo] = {}
        self.topics: Mapping[str, TopicInfo] = self._topics
        """The described topics by name, as :meth:`topic` gives them (a live view)."""
        self._unknown: set[str] = set()
        self.unauthorized: set[str] = set()
        """The topics the last Metadata answer said this client may not describe."""
        self._stale: set[str] = set()
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._stubs: dict[str, broker_pb2_grpc.BrokerStub] = {}
        self._coordinator_stubs: dict[str, coordinator_pb2_grpc.GroupCoordinatorStub] = {}
        self._fetch_streams: dict[str, FetchStream] = {}
        self._produce_streams: dict[str, ProduceStream] = {}
        self._lock = asyncio.Lock()
        self._closed = False
        self._call_metadata: tuple[tuple[str, str], ...] = (
            ((CLIENT_ID_METADATA_KEY, client_id),) if client_id else ()
        )
        self.throttles = BrokerThrottles()
        """When each throttled broker may be sent fetch and produce requests again."""

    # --- channels -------------------------------------------------------------------------

    def stub(self, address: str) -> broker_pb2_grpc.BrokerStub:
        """The Broker stub for ``address``, over the one channel kept for that address."""
        if self._closed:
            raise ClusterError("the cluster client is closed")
        stub = self._stubs.get(address)
        if stub is None:
            channel = open_channel(
                address,
                max_message_bytes=self._max_message_bytes,
                traced=True,
                security=self.security,
            )
            self._channels[address] = channel
            stub = broker_pb2_grpc.BrokerStub(channel)
            self._stubs[address] = stub
        return stub

    def coordinator_stub(self, address: str) -> coordinator_pb2_grpc.GroupCoordinatorStub:
        """The GroupCoordinator stub for ``address``, over the same one channel."""
        stub = self._coordinator_stubs.get(address)
        if stub is None:
            self.stub(address)  # opens the address's one channel
            stub = coordinator_pb2_grpc.GroupCoordinatorStub(self._channels[address])
            self._coordinator_stubs[address] = stub
        return stub

    async def fetch(
        self, address: str, request: pb.FetchRequest, timeout_s: float
    ) -> pb.FetchResponse:
        """``request`` answered by the broker at ``address``, over the :class:`FetchStream`
        kept for that address; raises ``grpc.aio.AioRpcError`` as a unary call would."""
        stub = self.stub(address)
        stream = self._fetch_streams.get(address)
        if stream is None:
            stream = self._fetch_streams[address] = FetchStream(stub, self._call_metadata)
        sent = await self._after_throttle(address)
        reply = await stream.fetch(request, timeout_s)
        self.throttles.note(address, sent, reply.throttle_time_ms)
        return reply

    async def produce(
        self, address: str, request: pb.ProduceRequest, timeout_s: float
    ) -> pb.ProduceResponse:
        """``request`` answered by the broker at ``address``, over the :class:`ProduceStream`
        kept for that address (a unary call while tracing is on); raises
        ``grpc.aio.AioRpcError`` as a unary call would."""
        stub = self.stub(address)
        sent = await self._after_throttle(address)
        if tracing_enabled():
            reply: pb.ProduceResponse = await stub.Produce(
                request, timeout=timeout_s, metadata=self._call_metadata or None
            )
        else:
            stream = self._produce_streams.get(address)
            if stream is None:
                stream = self._produce_streams[address] = ProduceStream(stub, self._call_metadata)
            reply = await stream.produce(request, timeout_s)
        self.throttles.note(address, sent, reply.throttle_time_ms)
        return reply

    def throttle_delay(self, address: str) -> float:
        """Seconds until fetch and produce requests may go to ``address`` again."""
        return self.throttles.remaining(address, asyncio.get_running_loop().time())

    async def _after_throttle(self, address: str) -> float:
        """Wait out the broker's throttle, if any; the time the request goes."""
        loop = asyncio.get_running_loop()
        delay = self.throttles.remaining(address, loop.time())
        if delay > 0:
            await asyncio.sleep(delay)
        return loop.time()

    async def close(self) -> None:
        """Close every channel, their calls' ends delivered before it returns
        (:func:`~highwater.rpc.channels.close_channels`); the object cannot be used
        afterwards."""
        self._closed = True
        for streams in (self._fetch_streams, self._produce_streams):
            for stream in streams.values():
                stream.close()
            streams.clear()
        channels = list(self._channels.values())
        self._channels.clear()
        self._stubs.clear()
        self._coordinator_stubs.clear()
        await close_channels(channels)

    # --- metadata -------------------------------------------------------------------------

    async def any_broker(
        self,
        what: str,
        send: Callable[[broker_pb2_grpc.BrokerStub, float], Awaitable[_R]],
        *,
        timeout_s: float | None = None,
    ) -> _R:
        """``send(stub, timeout)`` to the brokers in turn (see :class:`BrokerPolicy`) until
        one answers; ``timeout_s`` bounds each attempt (default ``request_timeout_s``).

        ``what`` names the request in errors: the policy's ``unavailable`` error when no
        broker answered, its ``rpc_error`` for a failure it does not move on after.
        """
        policy = self.policy
        timeout = self.request_timeout_s if timeout_s is None else timeout_s
        if policy.bootstrap_only:
            count = len(self.bootstrap_servers)
            order = [(self._next_bootstrap + i) % count for i in range(count)]
            candidates = [self.bootstrap_servers[i] for i in order]
        else:
            order = []
            candidates = list(dict.fromkeys([*self.brokers.values(), *self.bootstrap_servers]))
        failures: list[tuple[str, grpc.aio.AioRpcError]] = []
        for attempt, address in enumerate(candidates):
            try:
                reply = await send(self.stub(address), timeout)
            except grpc.aio.AioRpcError as e:
                retriable = policy.retriable_status
                if retriable is not None and e.code() not in retriable:
                    raise (policy.rpc_error(e) if policy.rpc_error else e) from None
                failures.append((address, e))
                continue
            if order:
                self._next_bootstrap = order[attempt]
            return reply
        raise policy.unavailable(what, candidates, failures)

    async def refresh(self, topics: Iterable[str] | None = None) -> pb.MetadataResponse:
        """Ask a broker for Metadata of ``topics`` (all topics when None) and apply it.

        Brokers are asked as :meth:`any_broker` does; with the default policy, raises
        :class:`BrokerNotAvailableError` when none answers.
        """
        request = pb.MetadataRequest(topics=sorted(set(topics)) if topics is not None else [])
        async with self._lock:
            reply: pb.MetadataResponse = await self.any_broker(
                "Metadata", lambda stub, timeout: stub.Metadata(request, timeout=timeout)
            )
            self._apply(reply)
            return reply

    async def coordinator(
        self, group_id: str, *, timeout_s: float | None = None, what: str = "FindCoordinator"
    ) -> pb.Coordinator:
        """The answer of ``FindCoordinator`` for ``group_id`` from any broker, error or not
        (``what`` names the request in the error when no broker answers)."""
        request = pb.FindCoordinatorRequest(keys=[group_id])
        reply: pb.FindCoordinatorResponse = await self.any_broker(
            what,
            lambda stub, timeout: stub.FindCoordinator(request, timeout=timeout),
            timeout_s=timeout_s,
        )
        (answer,) = reply.coordinators
        return answer

    async def find_coordinator(self, group_id: str) -> str:
        """The address of the coordinator of ``group_id`` (``FindCoordinator`` to any broker).

        Raises :class:`CoordinatorNotAvailableError` when the group has none right now (a
        retriable condition), :class:`BrokerNotAvailableError` when no broker answers.
        """
        answer = await self.coordinator(group_id)
        if answer.error == ErrorCode.GROUP_AUTHORIZATION_FAILED:  # not retriable
            raise GroupAuthorizationFailedError(
                f"group {group_id!r}: GROUP_AUTHORIZATION_FAILED {answer.error_message}"
            )
        if answer.error != ErrorCode.NONE:
            raise CoordinatorNotAvailableError(
                f"group {group_id!r}: {ErrorCode.Name(answer.error)} {answer.error_message}"
            )
        return f"{answer.host}:{answer.port}"

    async def list_offsets(
        self,
        address: str,
        partitions: Sequence[tuple[str, int, int, int | None]],
        timeout_s: float,
    ) -> list[pb.ListOffsetsPartitionResponse | None]:
        """One ``ListOffsets`` request to the leader at ``address``.

        ``partitions`` are ``(topic, partition, timestamp, current leader epoch or None)``;
        the same partition may be asked twice (at two timestamps). Returns each one's
        answer in the same order (None where the broker gave none); raises
        ``grpc.aio.AioRpcError`` when the request fails as a whole. What an error code
        means is the caller's rule.
        """
        request = pb.ListOffsetsRequest()
        topics: dict[str, pb.ListOffsetsTopic] = {}
        for topic, partition, timestamp, leader_epoch in partitions:
            entry = topics.get(topic)
            if entry is None:
                entry = topics[topic] = request.topics.add(topic=topic)
            asked = entry.partitions.add(partition=partition, timestamp=timestamp)
            if leader_epoch is not None:
                asked.current_leader_epoch = leader_epoch
        reply: pb.ListOffsetsResponse = await self.stub(address).ListOffsets(
            request, timeout=timeout_s
        )
        # The broker answers in request order; match each topic's answers in turn.
        queues: dict[str, deque[pb.ListOffsetsPartitionResponse]] = {}
        for topic_answer in reply.topics:
            queues.setdefault(topic_answer.topic, deque()).extend(topic_answer.partitions)
        answers: list[pb.ListOffsetsPartitionResponse | None] = []
        for topic, partition, _, _ in partitions:
            pending = queues.get(topic)
            answer = pending.popleft() if pending else None
            answers.append(answer if answer is not None and answer.partition == partition else None)
        return answers

    def _apply(self, reply: pb.MetadataResponse) -> None:
        """Replace the cached brokers and the described topics with ``reply``'s."""
        self.cluster_id = reply.cluster_id
        self.brokers = {b.node_id: f"{b.host}:{b.port}" for b in reply.brokers}
        for topic in reply.topics:
            self._stale.discard(topic.name)
            if topic.error == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
                self._topics.pop(topic.name, None)
                self._unknown.add(topic.name)
                continue
            if topic.error == ErrorCode.TOPIC_AUTHORIZATION_FAILED:
                self._topics.pop(topic.name, None)
                self.unauthorized.add(topic.name)
                continue
            self._unknown.discard(topic.name)
            self.unauthorized.discard(topic.name)
            partitions = sorted(topic.partitions, key=lambda p: p.partition)
            self._topics[topic.name] = TopicInfo(
                topic.name,
                tuple(
                    PartitionInfo(
                        p.partition,
                        p.leader_id if p.error == ErrorCode.NONE else -1,
                        p.leader_epoch,
                        p.error,
                    )
                    for p in partitions
                ),
            )

    async def partition_counts(self, topics: Sequence[str]) -> dict[str, int]:
        """The partition count of each of ``topics`` the cluster has, from a fresh Metadata
        answer when one can be had, else from the cache (a group leader's view:
        :class:`~highwater.group.membership.GroupCluster`)."""
        with contextlib.suppress(ClusterError):
            await self.refresh(topics)
        return {t: info.num_partitions for t in topics if (info := self._topics.get(t)) is not None}

    def topic(self, name: str) -> TopicInfo | None:
        """The cached description of ``name``; None if unknown or not fetched yet."""
        return self._topics.get(name)

    def is_unknown(self, name: str) -> bool:
        """Whether the last Metadata answer said the topic does not exist."""
        return name in self._unknown

    def needs_refresh(self, name: str) -> bool:
        """Whether ``name`` was never described, or a request found its leaders stale."""
        return name in self._stale or (name not in self._topics and name not in self._unknown)

    async def topic_info(self, name: str) -> TopicInfo:
        """The description of ``name``, refreshing first when it is missing or stale.

        Raises :class:`UnknownTopicOrPartitionError` when the cluster has no such topic.
        """
        if self.needs_refresh(name):
            await self.refresh([name])
        info = self._topics.get(name)
        if info is None:
            raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist")
        return info

    def partition(self, topic: str, partition: int) -> PartitionInfo:
        """The cached description of one partition; typed errors when there is none."""
        info = self._topics.get(topic)
        if info is None:
            raise UnknownTopicOrPartitionError(f"topic {topic!r} is not known")
        if not 0 <= partition < info.num_partitions:
            raise UnknownTopicOrPartitionError(
                f"topic {topic!r} has no partition {partition} (it has {info.num_partitions})"
            )
        return info.partitions[partition]

    def leader_id(self, topic: str, partition: int) -> int:
        """The node id of the partition's leader; :class:`LeaderNotAvailableError` if none."""
        leader = self.partition(topic, partition).leader_id
        if leader < 0:
            raise LeaderNotAvailableError(f"{topic}-{partition} has no leader")
        return leader

    def leader_address(self, topic: str, partition: int) -> str:
        """``host:port`` of the partition's leader, from the cached metadata."""
        leader = self.leader_id(topic, partition)
        address = self.brokers.get(leader)
        if address is None:
            raise LeaderNotAvailableError(
                f"the leader {leader} of {topic}-{partition} is not among the live brokers"
            )
        return address

    def leader_epoch(self, topic: str, partition: int) -> int:
        """The leader epoch Metadata gave for the partition."""
        return self.partition(topic, partition).leader_epoch

    def invalidate(self, topic: str, partition: int | None = None) -> None:
        """Forget the leader of one partition (or of all of the topic's): refresh next."""
        self._stale.add(topic)
        info = self._topics.get(topic)
        if info is None:
            return
        self._topics[topic] = TopicInfo(
            topic,
            tuple(
                PartitionInfo(p.partition, -1, p.leader_epoch, ErrorCode.LEADER_NOT_AVAILABLE)
                if partition is None or p.partition == partition
                else p
                for p in info.partitions
            ),
        )

    def handle_error(self, topic: str, partition: int, code: int) -> bool:
        """Invalidate the partition's leader if ``code`` says it is stale; True if it did."""
        if code in INVALIDATING_ERRORS:
            self.invalidate(topic, partition)
            return True
        return False

    def stale_topics(self) -> set[str]:
        """The topics whose leaders a request found stale since their last refresh."""
        return set(self._stale)
