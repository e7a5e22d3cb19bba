"""The replica fetchers: a follower pulls the partitions it follows from their leaders.

Kafka's ``ReplicaFetcherManager`` and ``ReplicaFetcherThread``, on the event loop. The
:class:`ReplicaFetcherManager` keeps one :class:`ReplicaFetcher` per leader this broker
follows partitions of. A fetcher's round: the partitions it follows now (those whose
leader in the metadata image is its leader: a leader change moves a partition to another
fetcher, and a fetcher left with none ends; worked out again only when the partition
manager's roles changed, :attr:`~highwater.broker.partitions.PartitionManager.roles_version`),
one ``ReplicaFetchRequest`` (this broker's id and broker epoch, each partition's log end
offset, last fetched epoch, log start offset and current leader epoch, long-polled
``replica.fetch.wait.max.ms``), then each answer goes to its
:class:`~highwater.broker.partitions.Partition`: records are appended and the follower's
high watermark taken (:meth:`~highwater.broker.partitions.Partition.append_as_follower`),
a diverging epoch truncates the log
(:meth:`~highwater.broker.partitions.Partition.truncate_to_diverging_epoch`). An answer
for a partition that changed leader or leader epoch since the fetch was sent is dropped.
A fetch that fails, or whose every partition is an error, is followed by
``replica.fetch.backoff.ms``; an answer with nothing new is not (the leader already held
it for its long poll).

The fetches run in a KIP-227 fetch session with the leader
(:class:`~highwater.broker.fetch_sessions.FetchSessionHandler`): the first names every
partition followed and opens the session; each later one names only the partitions whose
fetch state changed (those whose answers were applied, or all of them after a change of
roles) and forgets those no longer followed, and the leader answers only the partitions
with something new. A session error (the leader evicted the session, or lost count of its
epoch), a failed fetch or another leader address: the next fetch is full again. The log
start offset a fetch names is sent when the partition is named for another reason (the
leader does not act on it); a change of it alone does not make a partition named.

The fetches go over a :class:`FetchTransport` to the leader's address, made by a
:data:`Connect` function: over gRPC a :class:`GrpcFetchTransport` (one ``ReplicaFetch``
call of the internal ``highwater.internal.v1.ReplicaFetchService``, each fetch answered
before the next), in tests a fake that answers as a leader would. Followers never use the
public ``Broker.Fetch``: it cannot name a replica.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Final, Protocol

import grpc.aio

from highwater.broker.fetch_sessions import (
    FetchPartitionState,
    FetchSessionHandler,
    SessionRequest,
    TopicPartitionKey,
)
from highwater.broker.partitions import Partition, PartitionManager
from highwater.broker.replication import EpochEndOffset
from highwater.broker.settings import BrokerSettings
from highwater.broker.telemetry import BrokerTelemetry
from highwater.errors import HighwaterError
from highwater.internal.v1 import replication_pb2 as rpb
from highwater.internal.v1 import replication_pb2_grpc
from highwater.rpc.broker_streams import Expiry
from highwater.rpc.channels import open_channel
from highwater.v1.common_pb2 import ErrorCode

__all__ = [
    "Connect",
    "FetchRound",
    "FetchTransport",
    "GrpcFetchTransport",
    "ReplicaFetchError",
    "ReplicaFetcher",
    "ReplicaFetcherManager",
]

log = logging.getLogger(__name__)

_NO_ERROR: Final = ErrorCode.NONE
"""Looked up once: each ``ErrorCode.X`` is a Python-level attribute lookup of protobuf's
enum wrapper, and every answer of every fetch is compared with it."""


class ReplicaFetchError(HighwaterError):
    """A fetch from the leader did not get an answer (unreachable, timed out, ended)."""


class FetchTransport(Protocol):
    """Fetches to one leader, each answered before the next is sent."""

    async def fetch(
        self, request: rpb.ReplicaFetchRequest, timeout_s: float
    ) -> rpb.ReplicaFetchResponse:
        """The leader's answer, or :class:`ReplicaFetchError`."""
        ...

    async def close(self) -> None: ...


Connect = Callable[[str], FetchTransport]
"""A transport to the broker at ``HOST:PORT``."""

Sleep = Callable[[float], Awaitable[None]]


class GrpcFetchTransport:
    """A :class:`FetchTransport` over gRPC: one channel to ``address`` and one
    ``ReplicaFetch`` call on it, each fetch written and its answer read before the next.
    A fetch that fails or times out ends the call (an answer read late would be out of
    step); the next fetch opens another."""

    def __init__(self, address: str) -> None:
        self.address = address
        self._channel = open_channel(address)
        self._stub = replication_pb2_grpc.ReplicaFetchServiceStub(self._channel)
        self._call: (
            grpc.aio.StreamStreamCall[rpb.ReplicaFetchRequest, rpb.ReplicaFetchResponse] | None
        ) = None

    async def fetch(
        self, request: rpb.ReplicaFetchRequest, timeout_s: float
    ) -> rpb.ReplicaFetchResponse:
        call = self._call
        if call is None or call.done():
            call = self._call = self._stub.ReplicaFetch()
        # The deadline is a bare timer that cancels this task (Expiry), not an
        # asyncio.timeout: the same rules, about 4 µs less per fetch.
        expiry = Expiry(timeout_s)
        try:
            try:
                await call.write(request)
                reply = await call.read()
            finally:
                expiry.disarm()
        except asyncio.CancelledError:
            self._end_call()  # the answer would come to the next fetch
            if expiry.expired():
                raise ReplicaFetchError(f"fetch from {self.address}: timed out") from None
            raise
        except grpc.aio.AioRpcError as e:
            self._end_call()
            raise ReplicaFetchError(
                f"fetch from {self.address}: {e.code().name} {e.details()}"
            ) from e
        except (grpc.aio.UsageError, asyncio.InvalidStateError) as e:  # the call had ended
            self._end_call()
            raise ReplicaFetchError(f"fetch from {self.address}: the call ended") from e
        except BaseException:  # cancelled: the answer would come to the next fetch
            self._end_call()
            raise
        if reply is grpc.aio.EOF:
            self._end_call()
            raise ReplicaFetchError(f"fetch from {self.address}: the leader ended the stream")
        return reply

    def _end_call(self) -> None:
        call, self._call = self._call, None
        if call is not None:
            call.cancel()

    async def close(self) -> None:
        self._end_call()
        await self._channel.close()


class FetchRound(enum.Enum):
    """How a fetcher's round ended, and so what it does next."""

    FETCHED = "fetched"
    """Some partition was answered: fetch again at once."""
    BACK_OFF = "back off"
    """The fetch failed, no answer it held could be applied (errors, stale answers), or
    the leader has no address yet: wait ``replica.fetch.backoff.ms``."""
    IDLE = "idle"
    """This broker follows no partition of the leader (any more): the fetcher ends."""


class ReplicaFetcher:
    """Replicates the partitions broker ``leader_id`` leads into this broker's logs, by
    pull (see the module docstring). :meth:`run` until cancelled or idle;
    :meth:`fetch_round` is one round."""

    def __init__(
        self,
        leader_id: int,
        *,
        partitions: PartitionManager,
        replica_id: int,
        broker_epoch: Callable[[], int],
        settings: BrokerSettings,
        connect: Connect = GrpcFetchTransport,
        on_change: Callable[[], None] | None = None,
        telemetry: BrokerTelemetry | None = None,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        """``broker_epoch``: this broker's, which its fetches name; ``on_change``: called
        after each answer was applied (the long polls wake)."""
        self.leader_id = leader_id
        self._partitions = partitions
        self._replica_id = replica_id
        self._broker_epoch = broker_epoch
        self._settings = settings
        self._connect = connect
        self._on_change = on_change
        self._telemetry = telemetry
        self._sleep = sleep
        self._transport: FetchTransport | None = None
        self._address = ""
        self.session = FetchSessionHandler()
        self._followed: dict[TopicPartitionKey, Partition] = {}
        self._roles_version = -1
        self._touched: set[TopicPartitionKey] | None = None
        """Partitions whose fetch state may have changed since the last fetch (answers
        applied); None: any (the roles changed)."""

    def followed(self) -> list[Partition]:
        """The partitions this broker follows from the leader now."""
        return list(self._followed_now().values())

    def _followed_now(self) -> dict[TopicPartitionKey, Partition]:
        """:meth:`followed` by key, worked out again only when the roles changed."""
        version = self._partitions.roles_version
        if version != self._roles_version:
            self._roles_version = version
            self._touched = None
            self._followed = {
                (p.topic_partition.topic, p.topic_partition.partition): p
                for p in self._partitions
                if p.follower_state is not None and p.registration.leader == self.leader_id
            }
        return self._followed

    def leader_address(self) -> str | None:
        """The leader's first listener in the metadata image; None while it has none."""
        broker = self._partitions.image.broker(self.leader_id)
        if broker is None or not broker.listeners:
            return None
        return f"{broker.listeners[0].host}:{broker.listeners[0].port}"

    async def run(self) -> None:
        """Fetch round after round until no partition is followed from the leader."""
        backoff_s = self._settings.replica_fetch_backoff_ms / 1000
        try:
            while True:
                outcome = await self.fetch_round()
                if outcome is FetchRound.IDLE:
                    return
                if outcome is FetchRound.BACK_OFF:
                    await self._sleep(backoff_s)
        finally:
            await self.close()

    async def close(self) -> None:
        """Close the transport (a later round opens another, and a new session)."""
        transport, self._transport, self._address = self._transport, None, ""
        self.session = FetchSessionHandler()
        if transport is not None:
            await transport.close()

    async def fetch_round(self) -> FetchRound:
        """One fetch for the followed partitions (in the session: those that changed), its
        answers applied."""
        followed = self._followed_now()
        if not followed:
            return FetchRound.IDLE
        address = self.leader_address()
        if address is None:
            return FetchRound.BACK_OFF
        if address != self._address or self._transport is None:
            await self.close()
            self._address, self._transport = address, self._connect(address)
        touched, self._touched = self._touched, set()
        built = self.session.build(followed, self._fetch_state, touched)
        request = self.fetch_request(built)
        timeout_s = self._settings.replica_fetch_max_wait_ms / 1000 + 30
        try:
            reply = await self._transport.fetch(request, timeout_s)
        except ReplicaFetchError as e:
            log.debug("broker %d: %s", self._replica_id, e)
            self.session.failed()
            return FetchRound.BACK_OFF
        if not self.session.handle(built, reply.session_id, reply.error):
            log.debug(
                "broker %d: fetch session %d with broker %d: %s; fetching in full",
                self._replica_id,
                built.session_id,
                self.leader_id,
                ErrorCode.Name(reply.error),
            )
            return FetchRound.FETCHED
        span = (
            None
            if self._telemetry is None
            else self._telemetry.replica_fetch_span(self.leader_id, reply)
        )
        try:
            # Each partition was fetched in the leader epoch the session last named.
            answered = await self.apply(reply, self.session.sent)
        finally:
            if span is not None:
                span.end()
        return FetchRound.FETCHED if answered else FetchRound.BACK_OFF

    def _fetch_state(self, key: TopicPartitionKey) -> FetchPartitionState:
        """What a fetch names for followed partition ``key``: from its log's end, with its
        last fetched epoch and the leader epoch it follows in."""
        partition = self._followed[key]
        return FetchPartitionState(
            fetch_offset=partition.log_end_offset,
            partition_max_bytes=self._settings.replica_fetch_max_bytes,
            current_leader_epoch=partition.leader_epoch,
            last_fetched_epoch=partition.last_fetched_epoch,
            log_start_offset=partition.log.log_start_offset,
        )

    def fetch_request(self, built: SessionRequest) -> rpb.ReplicaFetchRequest:
        """The follower's fetch: the session's id and epoch, the partitions ``built``
        names and those it forgets."""
        settings = self._settings
        request = rpb.ReplicaFetchRequest(
            replica_id=self._replica_id,
            replica_epoch=self._broker_epoch(),
            max_wait_ms=settings.replica_fetch_max_wait_ms,
            min_bytes=1,
            max_bytes=settings.replica_fetch_response_max_bytes,
            session_id=built.session_id,
            session_epoch=built.epoch,
        )
        topics: dict[str, rpb.ReplicaFetchTopic] = {}
        for (name, index), state in built.partitions:
            topic = topics.get(name)
            if topic is None:
                topic = topics[name] = request.topics.add(topic=name)
            topic.partitions.add(
                partition=index,
                current_leader_epoch=state.current_leader_epoch,
                fetch_offset=state.fetch_offset,
                last_fetched_epoch=state.last_fetched_epoch,
                log_start_offset=state.log_start_offset,
                partition_max_bytes=state.partition_max_bytes,
            )
        forgotten: dict[str, rpb.ReplicaFetchForgottenTopic] = {}
        for name, index in built.forgotten:
            gone = forgotten.get(name)
            if gone is None:
                gone = forgotten[name] = request.forgotten_topics.add(topic=name)
            gone.partitions.append(index)
        return request

    async def apply(
        self,
        reply: rpb.ReplicaFetchResponse,
        fetched: Mapping[TopicPartitionKey, FetchPartitionState],
    ) -> bool:
        """Hand each answer of ``reply`` to its partition (``fetched``: the partitions
        fetched, each with the leader epoch it was fetched in); False if it held answers
        and none could be applied (each an error, or for a partition no longer followed
        from this leader in that epoch): then the fetcher backs off. A reply with no
        answer at all is the leader's long poll ending with nothing new (an incremental
        fetch answers only the partitions with news): the fetcher fetches again at once, as
        Kafka's does, since a back-off there would hold the records produced during it by
        ``replica.fetch.backoff.ms`` (100 ms). The partitions answered with records or a
        diverging epoch are the ones whose fetch state the next fetch looks at (a high
        watermark alone moves none); one whose answer could not be applied is named again,
        so that the leader sends it again."""
        answered = False
        held = False
        touched = self._touched
        for topic in reply.topics:
            for answer in topic.partitions:
                held = True
                key = (topic.topic, answer.partition)
                state = fetched.get(key)
                partition = self._current(
                    key, None if state is None else state.current_leader_epoch
                )
                if partition is None:
                    continue
                tp = partition.topic_partition
                if answer.error != _NO_ERROR:
                    log.debug(
                        "broker %d: %s: %s from the leader",
                        self._replica_id,
                        tp,
                        ErrorCode.Name(answer.error),
                    )
                    continue
                answered = True
                diverges = answer.HasField("diverging_epoch")
                if touched is not None and (diverges or answer.records):
                    touched.add(key)  # its log end (and last fetched epoch) moves
                if diverges:
                    diverging = EpochEndOffset(
                        answer.diverging_epoch.epoch, answer.diverging_epoch.end_offset
                    )
                    try:
                        decision = await partition.truncate_to_diverging_epoch(diverging)
                    except HighwaterError as e:  # its log directory failed
                        log.error("broker %d: %s: cannot truncate: %s", self._replica_id, tp, e)
                        self.session.forget(key)
                        continue
                    log.info(
                        "broker %d: %s truncated to %d (diverging epoch %d)",
                        self._replica_id,
                        tp,
                        decision.offset,
                        diverging.epoch,
                    )
                    continue
                try:
                    partition.append_as_follower(answer.records, answer.high_watermark)
                except HighwaterError as e:
                    log.error(
                        "broker %d: %s: cannot append the fetched records: %s",
                        self._replica_id,
                        tp,
                        e,
                    )
                    self.session.forget(key)
        if self._on_change is not None:
            self._on_change()
        return answered or not held

    def _current(self, key: TopicPartitionKey, fetched_epoch: int | None) -> Partition | None:
        """Partition ``key`` if it still follows this fetcher's leader in the epoch it was
        fetched in; None for an answer that is stale or was not asked for."""
        if fetched_epoch is None:
            return None
        try:
            partition = self._partitions.get(*key)
        except HighwaterError:
            return None  # no longer a replica here
        if (
            partition.follower_state is None
            or partition.registration.leader != self.leader_id
            or partition.leader_epoch != fetched_epoch
        ):
            return None
        return partition


class ReplicaFetcherManager:
    """One :class:`ReplicaFetcher` per leader this broker follows partitions of (Kafka's
    ``ReplicaFetcherManager``): :meth:`ensure_fetchers` after each metadata image,
    :meth:`close` when the broker stops."""

    def __init__(
        self,
        partitions: PartitionManager,
        *,
        replica_id: int,
        broker_epoch: Callable[[], int],
        settings: BrokerSettings,
        connect: Connect = GrpcFetchTransport,
        on_change: Callable[[], None] | None = None,
        telemetry: BrokerTelemetry | None = None,
    ) -> None:
        self._partitions = partitions
        self._replica_id = replica_id
        self._broker_epoch = broker_epoch
        self._settings = settings
        self._connect = connect
        self._on_change = on_change
        self._telemetry = telemetry
        self._fetchers: dict[int, asyncio.Task[None]] = {}
        self._closed = False

    @property
    def leaders(self) -> frozenset[int]:
        """The leaders a fetcher runs for now."""
        return frozenset(leader for leader, task in self._fetchers.items() if not task.done())

    def ensure_fetchers(self) -> None:
        """Start a fetcher for each leader followed that has none running."""
        if self._closed:
            return
        leaders = {
            p.registration.leader
            for p in self._partitions
            if p.follower_state is not None and p.registration.has_leader
        }
        for leader_id in leaders:
            task = self._fetchers.get(leader_id)
            if task is None or task.done():
                fetcher = ReplicaFetcher(
                    leader_id,
                    partitions=self._partitions,
                    replica_id=self._replica_id,
                    broker_epoch=self._broker_epoch,
                    settings=self._settings,
                    connect=self._connect,
                    on_change=self._on_change,
                    telemetry=self._telemetry,
                )
                self._fetchers[leader_id] = asyncio.create_task(fetcher.run())

    async def close(self) -> None:
        """Stop every fetcher; none starts after."""
        self._closed = True
        tasks = list(self._fetchers.values())
        self._fetchers.clear()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
