"""The client library's consumer: confluent-kafka's ``Consumer`` API (manual assignment) over gRPC.

:class:`AsyncConsumer` runs on an asyncio event loop; :class:`Consumer` is the blocking
wrapper, which runs an :class:`AsyncConsumer` on an event loop of its own in a background
thread, like :class:`~highwater.client.producer.Producer`.

Partitions come from a consumer group (:meth:`AsyncConsumer.subscribe` with ``group.id``:
the group's coordinator and its leader share the partitions of the subscribed topics out
among the members, :mod:`highwater.group.membership`) or are named by hand
(:meth:`AsyncConsumer.assign`). With a ``group.id`` the consumer commits offsets to the
group's coordinator (:meth:`~AsyncConsumer.commit`, and, while ``enable.auto.commit`` is
on, every ``auto.commit.interval.ms`` and on close, for partitions assigned by hand too,
which do not make the consumer join the group) and a partition it starts on without an
offset begins at the group's committed offset, else where ``auto.offset.reset`` says. A
commit of the positions carries the leader epoch of the batch the last consumed record
came in (the committed offset's epoch until a record is consumed), as Kafka's consumer
commits ``offsetEpoch``; a commit of a message the epoch of its batch when it was the
last one returned of its partition; offsets given to :meth:`~AsyncConsumer.commit` the
``leader_epoch`` of each :class:`TopicPartition` (none without).

Rebalances happen inside :meth:`~AsyncConsumer.poll`, as in Kafka: the ``on_revoke``
callback runs before partitions go (with auto-commit on, their positions are committed
first), ``on_assign`` after new ones arrive, ``on_lost`` when the membership was lost and
the partitions may already be another member's (the coordinator answered
UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION or FENCED_INSTANCE_ID, or ``max.poll.interval.ms``
passed without a poll; a static member fenced by another consumer of its
``group.instance.id`` then gets the error from :meth:`~AsyncConsumer.poll` instead of
taking the place back). Which partitions go depends on the rebalance protocol of the
configured ``partition.assignment.strategy``: all of them under the eager protocol
(``range``, ``roundrobin``, ``sticky``), where ``on_revoke`` starts every rebalance of a
member of a generation even with nothing to give up; only those moving elsewhere under
the cooperative one (``cooperative-sticky``): before it joins, those of topics no longer
subscribed; after, those the new assignment gives to others. ``on_assign`` ends every
rebalance, with no partitions too. Callbacks take ``(consumer, partitions)`` as
confluent-kafka's do, and may be coroutine functions.

How records arrive (Kafka's ``Fetcher``):

- Each assigned partition has a *position*, the offset of the next record :meth:`poll`
  returns. It starts at the offset given to :meth:`~AsyncConsumer.assign` (or
  :meth:`~AsyncConsumer.seek`). Without one (None, :data:`OFFSET_STORED`,
  :data:`OFFSET_INVALID`) and with a ``group.id`` it starts at the group's committed
  offset (``OffsetFetch``, retried after ``retry.backoff.ms`` while the coordinator cannot
  answer), as Kafka's ``updateFetchPositions`` does for any assignment; where there is no
  commit or no group (or with :data:`OFFSET_BEGINNING` / :data:`OFFSET_END`) it is looked
  up with ``ListOffsets``: earliest or latest, as ``auto.offset.reset`` says. With
  ``auto.offset.reset=none`` a partition without a position gets an error
  :class:`~highwater.client.message.Message` instead.
- When no fetched record is waiting, :meth:`~AsyncConsumer.poll` sends one ``Fetch`` request
  per leader broker for the assigned, unpaused partitions that have nothing buffered: a long
  poll of up to ``fetch.max.wait.ms`` (bounded by the poll's own timeout) until
  ``fetch.min.bytes`` are there. The answer's batches are framed and CRC-checked (``check.crcs``)
  when it arrives (:func:`~highwater.records.iter_batches`), control batches
  skipped; their records are decoded one batch at a time as :meth:`~AsyncConsumer.poll` and
  :meth:`~AsyncConsumer.consume` take them (as Kafka's ``CompletedFetch`` does), records
  below the position skipped. Only what the caller takes becomes messages: a seek drops
  the rest undecoded, and a large answer is not held as thousands of objects.
- While the caller takes a partition's buffered records, the next ``Fetch`` of the
  partition is already on its way (Kafka's fetch pipelining): once at most half of the
  answer's batches are left, and when its high watermark says the broker holds records
  after it, a ``Fetch`` from the answer's end (no long poll) goes out in a task of its
  own, one per leader, and its answer is buffered after the rest, so the round trip is
  not on the caller's path. A partition is not fetched again while such a fetch is
  unanswered; its answer is dropped if a seek, an assignment or an error moved the
  partition meanwhile, and an error it carries is left to the fetch that follows. While
  one is on its way the other partitions' fetches do not long-poll, so an idle partition
  does not hold the busy one's records back for ``fetch.max.wait.ms``.
- ``OFFSET_OUT_OF_RANGE`` resets the position by ``auto.offset.reset`` (``none``: an error
  message, and the partition waits for a :meth:`~AsyncConsumer.seek`). Leader errors
  (``NOT_LEADER_OR_FOLLOWER``, ``FENCED_LEADER_EPOCH``, ``UNKNOWN_LEADER_EPOCH``,
  ``LEADER_NOT_AVAILABLE``, ...) and failed requests refresh the metadata and retry after
  ``retry.backoff.ms``. ``UNKNOWN_TOPIC_OR_PARTITION`` (the topic does not exist yet, or
  was deleted) is delivered once as an error message (as librdkafka does) and the
  partition is kept: the metadata is refreshed and it is fetched again after
  ``retry.backoff.ms``, at its position, until the topic exists (Kafka's fetcher). Corrupt
  data and other errors are delivered as error messages; the partition is then not
  fetched again until it is sought or assigned anew. Each ``Fetch`` names the leader
  epoch the metadata gave, so a stale leader answers ``FENCED_LEADER_EPOCH`` or
  ``UNKNOWN_LEADER_EPOCH`` instead of serving it.
- A position is validated by leader epoch (KIP-320) when its epoch is known (a committed
  offset's, or the epoch of the batch the last record came in) and the metadata names a
  leader it was not checked against yet: a committed offset when the partition starts on
  it, any such position after a leader change. The partition is not fetched meanwhile
  (records fetched before are dropped), and ``OffsetsForLeaderEpoch`` asks the leader
  where the position's epoch ends in its log. An end below the position means the log
  was truncated under it (an unclean leader election): the position moves to that end,
  the first offset known to diverge; with ``auto.offset.reset=none`` the partition gets a
  :class:`~highwater.client.consumer.LogTruncationError` naming it instead, and waits for
  a :meth:`~AsyncConsumer.seek`. A log with no epoch up to the position resets it by
  ``auto.offset.reset``. A position given by hand carries no epoch and is not validated.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping, Sequence
from concurrent.futures import Future as ConcurrentFuture
from dataclasses import dataclass
from typing import Any, Final, TypeVar

import grpc
import grpc.aio

from highwater.client.cluster import (
    BROKER_MESSAGE_MAX_BYTES,
    ClusterError,
    ClusterMetadata,
    LeaderNotAvailableError,
    UnknownTopicOrPartitionError,
)
from highwater.client.consumer.config import ConsumerConfig
from highwater.client.consumer.errors import (
    CommitFailedError,
    ConsumerClosedError,
    ConsumerError,
    FetchError,
    LogTruncationError,
    NoOffsetForPartitionError,
    error_for,
)
from highwater.client.consumer.fetcher import (
    EARLIEST_TIMESTAMP,
    FETCH_RETRIABLE_ERRORS,
    LATEST_TIMESTAMP,
    OFFSET_BEGINNING,
    OFFSET_END,
    OFFSET_INVALID,
    OFFSET_STORED,
    PartitionState,
    TopicPartition,
    create_fetch_request,
)
from highwater.client.consumer.message_batch import MessageBatch
from highwater.client.loop_thread import LoopThread
from highwater.client.message import Message
from highwater.client.metrics import CLIENT_METRICS, PartitionLag
from highwater.errors import (
    HighwaterError,
    OffsetOutOfRangeError,
)
from highwater.group.assignors import assignor_for
from highwater.group.membership import GroupError, GroupMembership, GroupSettings
from highwater.group.protocol import RebalanceProtocol, TopicPartitionKey
from highwater.records.columnar import RecordColumns, finish_columns
from highwater.telemetry.configure import tracing_enabled
from highwater.telemetry.messaging import ConsumerTracing
from highwater.v1 import broker_pb2 as pb
from highwater.v1.common_pb2 import ErrorCode

__all__ = ["AsyncConsumer", "Consumer", "ConsumerGroupMetadata", "RebalanceCallback"]

log = logging.getLogger(__name__)

_NO_ERROR: Final = ErrorCode.NONE
"""Looked up once: each ``ErrorCode.X`` is a Python-level attribute lookup of protobuf's
enum wrapper, and the fetch path compares every answer with it."""


RebalanceCallback = Callable[[Any, list["TopicPartition"]], object]
"""``on_assign`` / ``on_revoke`` / ``on_lost``: ``(consumer, partitions)``; may be async."""


@dataclass(frozen=True, slots=True)
class ConsumerGroupMetadata:
    """Who a consumer is in its group right now."""

    group_id: str
    generation_id: int
    member_id: str
    group_instance_id: str | None


def _code_name(code: int) -> str:
    return ErrorCode.Name(code)  # type: ignore[arg-type]


def _timeout_s(timeout: float | None) -> float:
    """confluent-kafka timeouts: None or negative means forever."""
    return math.inf if timeout is None or timeout < 0 else timeout


# --- The asyncio consumer ---------------------------------------------------------------


def _epoch(leader_epoch: int | None) -> int:
    """A :class:`TopicPartition`'s ``leader_epoch`` as the wire carries it (-1: none)."""
    return -1 if leader_epoch is None or leader_epoch < 0 else leader_epoch


class AsyncConsumer:
    """A Kafka consumer for asyncio, with manual partition assignment (see the module
    docstring). Not thread-safe: use it from the event loop it was first polled on.
    """

    def __init__(self, config: Mapping[str, Any]) -> None:
        """Validate ``config`` (Kafka's consumer settings); nothing connects yet."""
        self.config = ConsumerConfig.parse(config)
        self.cluster = ClusterMetadata(
            self.config.bootstrap_servers,
            request_timeout_s=self.config.request_timeout_ms / 1000,
            max_message_bytes=BROKER_MESSAGE_MAX_BYTES,
            client_id=self.config.client_id,
            security=self.config.security,
        )
        self._states: dict[tuple[str, int], PartitionState] = {}
        self._errors: deque[Message] = deque()
        self._ready: deque[PartitionState] = deque()
        self._wakeup = asyncio.Event()
        self._closed = False
        self._rotation = 0
        self._subscription: tuple[str, ...] | None = None
        self._on_assign: RebalanceCallback | None = None
        self._on_revoke: RebalanceCallback | None = None
        self._on_lost: RebalanceCallback | None = None
        self._listener_owner: Any = self
        self._membership: GroupMembership | None = None
        self._next_auto_commit: float | None = None
        """When the positions are committed next (the event loop's clock); None without
        auto-commit (no ``group.id``, or ``enable.auto.commit`` off)."""
        self._next_metadata_check = 0.0
        self._partition_counts: dict[str, int] = {}
        self._commits: set[asyncio.Task[object]] = set()
        self._ahead: set[asyncio.Task[None]] = set()
        """Fetches ahead of the buffers in flight (:meth:`_fetch_ahead`)."""
        self._ahead_unsent = False
        """A fetch ahead was made since the loop last had a turn: its request is not sent
        yet (:meth:`_run_fetches_ahead`)."""
        self._loop: asyncio.AbstractEventLoop | None = None
        """The loop the consumer was last polled on (:meth:`_running_loop`)."""
        self._tracing = ConsumerTracing(self.config.group_id) if tracing_enabled() else None
        """``receive`` and ``process`` spans, when a tracer provider is installed."""
        CLIENT_METRICS.observe_lag(self)
        if self.config.group_id and self.config.enable_auto_commit:
            # Auto-commit serves partitions assigned by hand too, periodically and on close
            # (Kafka's ConsumerCoordinator.poll and close): the membership that commits
            # exists from the start, and joins the group only if subscribe() is called.
            self._group()
            self._next_auto_commit = 0.0

    # --- assignment ---------------------------------------------------------------------

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Replace the assignment with ``partitions``, each starting at its offset (see
        :class:`TopicPartition`). One without an offset (None, :data:`OFFSET_STORED`,
        :data:`OFFSET_INVALID`) starts at the group's committed offset when there is a
        ``group.id`` and a commit, else where ``auto.offset.reset`` says. This consumer
        does not join the group for it: partitions assigned by hand are not shared."""
        self._check_open()
        if self._subscription is not None:
            raise ConsumerError("the consumer is subscribed to topics; unsubscribe() first")
        states: dict[tuple[str, int], PartitionState] = {}
        for tp in partitions:
            if not isinstance(tp, TopicPartition):
                raise TypeError(f"expected a TopicPartition, not {type(tp).__name__}")
            if tp.partition < 0:
                raise ValueError(f"{tp.topic}-{tp.partition}: a partition index is >= 0")
            state = PartitionState(tp.topic, tp.partition, reset=self.config.auto_offset_reset)
            if self.cluster.is_unknown(tp.topic):
                self.cluster.invalidate(tp.topic)  # it may exist by now: ask again
            self._set_offset(state, tp.offset, _epoch(tp.leader_epoch))
            states[tp.key()] = state
        self._states = states
        self._ready.clear()
        self._errors.clear()
        self._wakeup.set()

    def assignment(self) -> list[TopicPartition]:
        """The assigned partitions (without offsets), in assignment order."""
        return [TopicPartition(s.topic, s.partition) for s in self._states.values()]

    def unassign(self) -> None:
        """Drop every assigned partition and what was fetched for them."""
        self.assign([])

    def seek(self, partition: TopicPartition) -> None:
        """Move an assigned partition's position to ``partition.offset`` (an offset,
        :data:`OFFSET_BEGINNING` or :data:`OFFSET_END`); buffered records are dropped."""
        self._check_open()
        state = self._states.get(partition.key())
        if state is None:
            raise ValueError(f"{partition.topic}-{partition.partition} is not assigned")
        if partition.offset is None or partition.offset in (OFFSET_STORED, OFFSET_INVALID):
            raise ValueError("seek needs an offset, OFFSET_BEGINNING or OFFSET_END")
        self._set_offset(state, partition.offset, _epoch(partition.leader_epoch))
        self._wakeup.set()

    def position(self, partitions: Iterable[TopicPartition]) -> list[TopicPartition]:
        """The position (next offset :meth:`poll` returns) of each of ``partitions``;
        offset None while it is not known yet, and an error for a partition not assigned."""
        result = []
        for tp in partitions:
            state = self._states.get(tp.key())
            if state is None:
                result.append(
                    TopicPartition(
                        tp.topic,
                        tp.partition,
                        None,
                        ConsumerError(f"{tp.topic}-{tp.partition} is not assigned"),
                    )
                )
            else:
                result.append(TopicPartition(tp.topic, tp.partition, state.position))
        return result

    def pause(self, partitions: Iterable[TopicPartition]) -> None:
        """Stop fetching and returning records of ``partitions`` (their buffers are kept)."""
        for state in self._assigned(partitions):
            state.paused = True

    def resume(self, partitions: Iterable[TopicPartition]) -> None:
        """Fetch and return records of paused ``partitions`` again."""
        for state in self._assigned(partitions):
            state.paused = False
        self._wakeup.set()

    def _assigned(self, partitions: Iterable[TopicPartition]) -> list[PartitionState]:
        """The states of ``partitions``; ValueError if one is not assigned."""
        states = []
        for tp in partitions:
            state = self._states.get(tp.key())
            if state is None:
                raise ValueError(f"{tp.topic}-{tp.partition} is not assigned")
            states.append(state)
        return states

    def _set_offset(
        self,
        state: PartitionState,
        offset: int | None,
        leader_epoch: int = -1,
        *,
        committed_known: bool = False,
    ) -> None:
        """Start ``state`` at ``offset`` (a logical offset means a lookup), a committed
        offset with its ``leader_epoch``. No offset (None, :data:`OFFSET_STORED`,
        :data:`OFFSET_INVALID`) means the group's committed one when there is a group and
        the caller did not look it up already (``committed_known``), else a lookup by
        ``auto.offset.reset``."""
        state.clear_buffer()
        state.position_epoch = leader_epoch
        state.position_leader_epoch = -1
        state.awaiting_validation = False
        state.awaiting_committed = False
        state.failed = False
        state.missing_reported = False
        state.backoff_until = 0.0
        state.generation += 1
        with contextlib.suppress(ValueError):
            self._ready.remove(state)
        if offset is None or offset in (OFFSET_STORED, OFFSET_INVALID):
            state.position, state.reset = None, self.config.auto_offset_reset
            state.awaiting_committed = bool(self.config.group_id) and not committed_known
        elif offset == OFFSET_BEGINNING:
            state.position, state.reset = None, "earliest"
        elif offset == OFFSET_END:
            state.position, state.reset = None, "latest"
        elif offset >= 0:
            state.position = offset
        else:
            raise ValueError(f"{state.topic}-{state.partition}: invalid offset {offset}")

    # --- polling ------------------------------------------------------------------------

    async def poll(self, timeout: float | None = None) -> Message | None:
        """The next record (or error message) of the assigned partitions, waiting up to
        ``timeout`` seconds (None or negative: until one arrives); None on timeout."""
        tracing = self._tracing
        if (
            tracing is None
            and self._subscription is None
            and not self._errors
            and (
                self._next_auto_commit is None
                or self._running_loop().time() < self._next_auto_commit
            )
        ):
            message = self._take_decoded()
            if message is not None:
                CLIENT_METRICS.consumed(self.config.group_id, 1)
                if self._ahead_unsent:
                    await self._run_fetches_ahead()
                return message
        if tracing is not None:
            tracing.end_processing()
            started = time.time_ns()
        message = await self._poll(timeout)
        if message is not None:
            CLIENT_METRICS.consumed(self.config.group_id, 1)
            if tracing is not None:
                tracing.received([message], started)
        return message

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        """The running event loop, kept: ``asyncio.get_running_loop`` makes a ``getpid``
        system call per call in CPython 3.11, and a waiting ``poll()`` asked for it several
        times per fetch. Looked up again when the kept loop is not running (the consumer
        moved to another loop)."""
        loop = self._loop
        if loop is None or not loop.is_running():
            loop = self._loop = asyncio.get_running_loop()
        return loop

    async def _poll(self, timeout: float | None) -> Message | None:
        """:meth:`poll` without its spans."""
        self._check_open()
        loop = self._running_loop()
        deadline = loop.time() + _timeout_s(timeout)
        first = True
        while True:
            await self._poll_group()
            message = self._next_message()
            if message is not None:
                if self._ahead_unsent:
                    await self._run_fetches_ahead()
                return message
            remaining = deadline - loop.time()
            if self._closed or (remaining <= 0 and not first):
                return None
            first = False
            await self._fetch_round(max(remaining, 0.0))

    async def consume(self, num_messages: int = 1, timeout: float | None = None) -> list[Message]:
        """Up to ``num_messages`` messages, waiting until that many arrived or ``timeout``
        seconds passed (None or negative: no limit), as confluent-kafka's ``consume``."""
        if num_messages < 0:
            raise ValueError("num_messages must be >= 0")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _timeout_s(timeout)
        tracing = self._tracing
        if tracing is not None:
            tracing.end_processing()
            started = time.time_ns()
        messages: list[Message] = []
        while len(messages) < num_messages:
            message = await self._poll(max(deadline - loop.time(), 0.0))
            if message is None:
                break
            messages.append(message)
            # What else is buffered is taken at once, not one poll() per message: a
            # poll's group duties and awaits cost more than the message itself.
            self._take_buffered(messages, num_messages)
        await self._run_fetches_ahead()
        if messages:
            CLIENT_METRICS.consumed(self.config.group_id, len(messages))
            if tracing is not None:
                tracing.received(messages, started)
        return messages

    async def consume_columns(
        self,
        partition: TopicPartition,
        columns: Any,
        num_records: int,
        timeout: float | None = None,
    ) -> BaseException | None:
        """Records of one assigned ``partition`` appended to ``columns`` (a
        :data:`~highwater.records.columnar.RecordColumns`), with no :class:`Message` per
        record: what a columnar reader (the Spark source) takes. Waits until ``columns``
        hold ``num_records`` more or ``timeout`` seconds passed (None or negative: no
        limit); batches are decoded whole, so up to a batch more may come.

        Returns the error :meth:`consume` would deliver for the partition (an error
        message's ``error()``: out of range, corrupt data...), its records before the error
        appended; else None. Other partitions' records and errors stay buffered.
        """
        if num_records < 0:
            raise ValueError("num_records must be >= 0")
        self._check_open()
        state = self._states.get(partition.key())
        if state is None:
            raise ValueError(f"{partition.topic}-{partition.partition} is not assigned")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _timeout_s(timeout)
        before = len(columns)
        target = before + num_records
        first = True
        error: BaseException | None = None
        while True:
            await self._poll_group()
            error = self._take_error(state)
            if error is None and not state.paused and state in self._ready:
                state.take_columns(columns, target)
                if not state.buffered():
                    self._finish_buffer(state)
                self._fetch_ahead()
                error = self._take_error(state)
            remaining = deadline - loop.time()
            if (
                error is not None
                or len(columns) >= target
                or self._closed
                or (remaining <= 0 and not first)
            ):
                break
            first = False
            await self._fetch_round(max(remaining, 0.0))
        await self._run_fetches_ahead()
        if len(columns) > before:
            CLIENT_METRICS.consumed(self.config.group_id, len(columns) - before)
        return error

    async def consume_batches(
        self, num_records: int = 500, timeout: float | None = None
    ) -> list[MessageBatch]:
        """:meth:`consume` as batches: up to about ``num_records`` records (batches are
        decoded whole, so up to a batch more may come) of the assigned partitions, waiting
        until that many arrived or ``timeout`` seconds passed (None or negative: no limit).

        Each :class:`MessageBatch` holds a run of one partition's records, decoded into
        column buffers with no object per record; it makes a :class:`Message` only for the
        records that are indexed or iterated (see :mod:`~highwater.client.consumer.message_batch`).
        An error :meth:`consume` would return as an error message comes as a batch of no
        records whose ``error()`` is set (it counts as one record). The records, their
        order and the positions are those :meth:`consume` gives.
        """
        if num_records < 0:
            raise ValueError("num_records must be >= 0")
        self._check_open()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _timeout_s(timeout)
        batches: list[MessageBatch] = []
        taken = 0
        first = True
        while True:
            await self._poll_group()
            taken += self._take_batches(batches, num_records - taken)
            remaining = deadline - loop.time()
            if taken >= num_records or self._closed or (remaining <= 0 and not first):
                break
            first = False
            await self._fetch_round(max(remaining, 0.0))
        await self._run_fetches_ahead()
        records = taken - sum(1 for batch in batches if batch.error() is not None)
        if records:
            CLIENT_METRICS.consumed(self.config.group_id, records)
        return batches

    def _take_batches(self, batches: list[MessageBatch], limit: int) -> int:
        """:meth:`_take_buffered` into :class:`MessageBatch` views, a partition's buffered
        records decoded into one set of columns; returns how many records (and errors)
        were taken."""
        taken = 0
        while taken < limit:
            if self._errors:
                message = self._errors.popleft()
                batches.append(
                    MessageBatch(
                        message._topic, message._partition, None, message._error, message._offset
                    )
                )
                taken += 1
                continue
            state = next((s for s in self._ready if not s.paused), None)
            if state is None:
                break
            columns = RecordColumns(include_headers=True)
            epochs: list[tuple[int, int]] = []
            state.take_columns(columns, limit - taken, epochs)
            if len(columns):
                taken += len(columns)
                batches.append(
                    MessageBatch(
                        state.topic, state.partition, finish_columns(columns), epochs=epochs
                    )
                )
            if not state.buffered():
                self._finish_buffer(state)
        self._fetch_ahead()
        return taken

    def _take_error(self, state: PartitionState) -> BaseException | None:
        """The first queued error of ``state``'s partition, taken out of the queue."""
        for message in self._errors:
            if message._topic == state.topic and message._partition == state.partition:
                self._errors.remove(message)
                return message._error
        return None

    def _take_decoded(self) -> Message | None:
        """:meth:`poll`'s short way: the next record of the first ready partition when it
        is decoded already and is not the last one decoded (so the partition's buffer
        stays non-empty and nothing but its position moves), else None and the general
        path (:meth:`_poll`) decides. Only for a consumer not subscribed to a group, with no
        error queued and no auto-commit due: a group's poll has duties first (rebalance,
        auto-commit).

        A record taken from the buffer costs about as much as the general path's
        bookkeeping around it (``_poll``, ``_poll_group``, ``_next_message``, a list
        per call): at 10,000 records/s with a ``poll()`` per record that bookkeeping was a
        tenth of the benchmark's process (docs/broker.md)."""
        ready = self._ready
        if not ready:
            return None
        state = ready[0]
        records, i = state.records, state.taken
        if state.paused or i + 1 >= len(records):
            return None
        message = records[i]
        position = state.position
        if position is None or message._offset < position:
            return None
        state.taken = i + 1
        state.position = message._offset + 1
        state.position_epoch = state.records_epoch
        self._fetch_ahead()
        return message

    def _next_message(self) -> Message | None:
        """A buffered error or record, advancing the partition's position."""
        taken: list[Message] = []
        self._take_buffered(taken, 1)
        return taken[0] if taken else None

    def _take_buffered(self, messages: list[Message], limit: int) -> None:
        """Move buffered errors and records to ``messages`` until it holds ``limit``:
        errors first, then partition by partition in the order their answers arrived,
        advancing the positions."""
        while len(messages) < limit:
            if self._errors:
                messages.append(self._errors.popleft())
                continue
            state = next((s for s in self._ready if not s.paused), None)
            if state is None:
                break
            state.take(messages, limit)
            if not state.buffered():
                self._finish_buffer(state)
        self._fetch_ahead()

    def _finish_buffer(self, state: PartitionState) -> None:
        """The partition's buffer is empty: move past what the answer covered."""
        with contextlib.suppress(ValueError):
            self._ready.remove(state)
        if state.position is not None and state.fetched_end > state.position:
            state.position = state.fetched_end
        state.fetched_end = -1
        if state.pending_error is not None:
            self._deliver_error(state, state.pending_error)

    def _deliver_error(self, state: PartitionState, error: BaseException) -> None:
        """Queue an error message for the partition and stop fetching it."""
        state.failed = True
        state.clear_buffer()
        self._queue_error(state, error)

    def _queue_error(self, state: PartitionState, error: BaseException) -> None:
        """Queue an error message for the partition, at its position."""
        offset = -1 if state.position is None else state.position
        self._errors.append(
            Message(state.topic, state.partition, None, None, [], -1, offset, error)
        )

    def _topic_missing(self, state: PartitionState, error: BaseException) -> None:
        """The partition's topic (or the partition) does not exist: deliver ``error`` once,
        as librdkafka does, and keep the partition, fetched again after a metadata refresh
        and ``retry.backoff.ms``. As Kafka's fetcher, which requests a metadata update on
        UNKNOWN_TOPIC_OR_PARTITION and fetches on: a topic created after assign(), or
        deleted and created again, is read once the metadata names it (at the position,
        or where ``auto.offset.reset`` says if the new log does not hold it)."""
        state.clear_buffer()
        with contextlib.suppress(ValueError):
            self._ready.remove(state)
        self.cluster.invalidate(state.topic)
        self._backoff(state)
        if not state.missing_reported:
            state.missing_reported = True
            self._queue_error(state, error)

    async def _idle(self, seconds: float) -> None:
        """Wait ``seconds`` or until assign/seek/resume/close changes something."""
        if seconds <= 0:
            return
        self._wakeup.clear()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(None if math.isinf(seconds) else seconds):
                await self._wakeup.wait()

    async def _fetch_round(self, budget: float) -> None:
        """One round: refresh metadata, resolve positions, fetch from every leader once;
        waits at most ``budget`` seconds (a short idle wait when nothing can be fetched)."""
        loop = self._running_loop()
        backoff = self.config.retry_backoff_ms / 1000
        states = [s for s in self._states.values() if not s.failed]
        if not states:
            await self._idle(budget)
            return
        try:
            await self._refresh_metadata(states)
        except ClusterError as e:
            log.info("consumer: metadata refresh failed: %s", e)
            await self._idle(min(backoff, budget))
            return
        try:
            # Not those backing off (a lookup failed, the topic is missing): each round
            # would ask again, and refresh a missing topic's metadata per fetch.
            now = loop.time()
            unpositioned = [
                s for s in states if s.position is None and not s.paused and s.backoff_until <= now
            ]
            if any(s.awaiting_committed for s in unpositioned):
                await self._init_committed(unpositioned)
                unpositioned = [
                    s for s in unpositioned if s.position is None and not s.awaiting_committed
                ]
            if unpositioned:
                await self._reset_positions(unpositioned)
        except ClusterError as e:
            log.info("consumer: offset lookup failed: %s", e)
            await self._idle(min(backoff, budget))
            return
        unvalidated = [s for s in states if self._leader_known(s) and not s.paused]
        if unvalidated:
            await self._validate_positions(unvalidated)
        now = loop.time()
        fetchable = [s for s in self._states.values() if s.fetchable(now)]
        if self._errors:
            return
        if not fetchable and self._ahead:
            # Answers to fetches ahead are on their way: wait for one, not an idle turn.
            await asyncio.wait(self._ahead, timeout=budget, return_when=asyncio.FIRST_COMPLETED)
            return
        if not fetchable:
            waits = [s.backoff_until - now for s in self._states.values() if s.backoff_until > now]
            await self._idle(min([budget, *waits]) if waits else min(budget, backoff))
            return
        # Rotate the order so that fetch.max.bytes does not always favour the same ones.
        self._rotation = (self._rotation + 1) % len(fetchable)
        fetchable = fetchable[self._rotation :] + fetchable[: self._rotation]
        by_leader: dict[str, list[PartitionState]] = {}
        for state in fetchable:
            address = self._leader_address(state)
            if address is not None:
                by_leader.setdefault(address, []).append(state)
        if not by_leader:
            return
        # While a fetch ahead is on its way, the others do not long-poll: an idle partition
        # would hold the records coming ahead back for up to fetch.max.wait.ms.
        ahead = bool(self._ahead)
        max_wait_ms = 0 if ahead else int(min(self.config.fetch_max_wait_ms, budget * 1000))
        started = loop.time()
        fetches = [self._fetch(address, group, max_wait_ms) for address, group in by_leader.items()]
        if len(fetches) == 1:
            await fetches[0]  # one leader: no task to run it in, one loop turn less per fetch
        else:
            await asyncio.gather(*fetches)
        if ahead and self._ahead and not self._ready and not self._errors:
            remaining = max(budget - (loop.time() - started), 0.0)
            await asyncio.wait(self._ahead, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)

    async def _refresh_metadata(self, states: Sequence[PartitionState]) -> None:
        """Refresh the topics whose leaders are unknown or stale."""
        topics = {s.topic for s in states if self.cluster.needs_refresh(s.topic)}
        topics |= {
            s.topic
            for s in states
            if (info := self.cluster.topic(s.topic)) is not None
            and s.partition < info.num_partitions
            and info.partitions[s.partition].leader_id < 0
        }
        if topics:
            await self.cluster.refresh(topics)

    def _leader_address(self, state: PartitionState) -> str | None:
        """The leader's address; None (after an error message or a backoff) if unusable."""
        try:
            return self.cluster.leader_address(state.topic, state.partition)
        except UnknownTopicOrPartitionError as e:
            if self.cluster.is_unknown(state.topic) or self.cluster.topic(state.topic):
                self._topic_missing(state, e)
            else:
                self._backoff(state)
        except LeaderNotAvailableError:
            self.cluster.invalidate(state.topic, state.partition)
            self._backoff(state)
        return None

    def _backoff(self, state: PartitionState) -> None:
        """Do not fetch ``state`` again before ``retry.backoff.ms``."""
        loop = asyncio.get_running_loop()
        state.backoff_until = loop.time() + self.config.retry_backoff_ms / 1000

    async def _init_committed(self, states: Sequence[PartitionState]) -> None:
        """Start the partitions that await the group's committed offset
        (:attr:`PartitionState.awaiting_committed`) at it, with its leader epoch (so it is
        validated, KIP-320); those the group has no commit for are left to
        ``auto.offset.reset``. Kafka's ``updateFetchPositions`` does the same for manually
        assigned partitions as for the group's (``initWithCommittedOffsetsIfNeeded`` before
        ``resetInitializingPositions``): a consumer restarted with ``latest`` must not skip
        what was produced while it was down. When the coordinator cannot answer, the
        partitions wait ``retry.backoff.ms`` and ask again; they are not reset."""
        now = self._running_loop().time()
        wanted = [s for s in states if s.awaiting_committed and s.backoff_until <= now]
        if not wanted:
            return
        generations = [s.generation for s in wanted]
        try:
            committed = await self._group().committed([(s.topic, s.partition) for s in wanted])
        except HighwaterError as e:
            log.info("consumer: fetching the committed offsets failed: %s", e)
            for state in wanted:
                self._backoff(state)
            return
        for state, generation in zip(wanted, generations, strict=True):
            if (
                state.generation != generation
                or self._states.get((state.topic, state.partition)) is not state
            ):
                continue  # sought or unassigned meanwhile
            state.awaiting_committed = False
            found = committed.get((state.topic, state.partition))
            if found is not None:
                state.position, state.position_epoch = found[0], found[1]

    async def _reset_positions(self, states: Sequence[PartitionState]) -> None:
        """Look up the positions of partitions that have none (``auto.offset.reset``)."""
        wanted: list[PartitionState] = []
        for state in states:
            if state.reset == "none":
                self._deliver_error(
                    state,
                    NoOffsetForPartitionError(
                        f"{state.topic}-{state.partition}: no offset to start from and "
                        "auto.offset.reset is none"
                    ),
                )
            elif self._leader_address(state) is not None:
                wanted.append(state)
        if not wanted:
            return
        timestamps = [
            EARLIEST_TIMESTAMP if s.reset == "earliest" else LATEST_TIMESTAMP for s in wanted
        ]
        generations = [s.generation for s in wanted]
        answers = await self._list_offsets(
            [(s.topic, s.partition) for s in wanted], timestamps, raise_errors=False
        )
        for state, generation, answer in zip(wanted, generations, answers, strict=True):
            if (
                state.generation != generation
                or self._states.get((state.topic, state.partition)) is not state
            ):
                continue
            if isinstance(answer, BaseException):
                if isinstance(answer, UnknownTopicOrPartitionError):
                    self._topic_missing(state, answer)
                else:
                    self._backoff(state)
                continue
            offset, _ = answer
            log.debug("consumer: %s-%s reset to %d", state.topic, state.partition, offset)
            state.position = offset

    def _leader_known(self, state: PartitionState) -> bool:
        """Check ``state``'s position against the leader the metadata names
        (:meth:`PartitionState.leader_known`); whether it awaits validation."""
        if state.position is None:
            return False
        try:
            info = self.cluster.partition(state.topic, state.partition)
        except UnknownTopicOrPartitionError:
            return state.awaiting_validation
        if info.leader_id < 0:
            return state.awaiting_validation
        was_buffered = state.buffered()
        awaiting = state.leader_known(info.leader_epoch)
        if awaiting and was_buffered:
            with contextlib.suppress(ValueError):
                self._ready.remove(state)
        return awaiting

    async def _validate_positions(self, states: Sequence[PartitionState]) -> None:
        """Ask each leader where the epochs of the positions awaiting validation end
        (``OffsetsForLeaderEpoch``, KIP-320) and apply the answers."""
        by_leader: dict[str, list[PartitionState]] = {}
        for state in states:
            if state.backoff_until > self._running_loop().time():
                continue
            address = self._leader_address(state)
            if address is not None:
                by_leader.setdefault(address, []).append(state)
        await asyncio.gather(*(self._validate_from(a, group) for a, group in by_leader.items()))

    async def _validate_from(self, address: str, states: list[PartitionState]) -> None:
        """One ``OffsetsForLeaderEpoch`` request to ``address`` for ``states``: each asks
        for the end of its position's epoch, fenced by the leader epoch it was checked
        against, so that a stale leader answers FENCED_LEADER_EPOCH or
        UNKNOWN_LEADER_EPOCH and the metadata is refreshed before the next try."""
        request = pb.OffsetsForLeaderEpochRequest()
        topics: dict[str, pb.OffsetForLeaderTopic] = {}
        sent: dict[tuple[str, int], tuple[PartitionState, int]] = {}
        for state in states:
            topic = topics.get(state.topic)
            if topic is None:
                topic = topics[state.topic] = request.topics.add(topic=state.topic)
            topic.partitions.add(
                partition=state.partition,
                current_leader_epoch=state.position_leader_epoch,
                leader_epoch=state.position_epoch,
            )
            sent[(state.topic, state.partition)] = (state, state.generation)
        try:
            reply: pb.OffsetsForLeaderEpochResponse = await self.cluster.stub(
                address
            ).OffsetsForLeaderEpoch(request, timeout=self.config.request_timeout_ms / 1000)
        except grpc.aio.AioRpcError as e:
            log.info(
                "consumer: OffsetsForLeaderEpoch to %s failed: %s: %s",
                address,
                e.code(),
                e.details(),
            )
            for state in states:
                self.cluster.invalidate(state.topic, state.partition)
                self._backoff(state)
            return
        except ClusterError:  # closed meanwhile
            return
        for topic_answer in reply.topics:
            for answer in topic_answer.partitions:
                entry = sent.get((topic_answer.topic, answer.partition))
                if entry is None:
                    continue
                state, generation = entry
                if (
                    self._states.get((state.topic, state.partition)) is not state
                    or state.generation != generation
                    or not state.awaiting_validation
                ):
                    continue  # unassigned, sought or checked against another leader meanwhile
                self._handle_validation(state, answer)

    def _handle_validation(self, state: PartitionState, answer: pb.EpochEndOffsetResult) -> None:
        """Apply a partition's ``OffsetsForLeaderEpoch`` answer (see
        :meth:`PartitionState.complete_validation`), or act on its error code."""
        code = answer.error
        if code in FETCH_RETRIABLE_ERRORS:
            self.cluster.invalidate(state.topic, state.partition)
            self._backoff(state)
            return
        if code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
            self._topic_missing(state, error_for(code, state.topic, state.partition))
            return
        if code != _NO_ERROR:
            self.cluster.handle_error(state.topic, state.partition, code)
            self._deliver_error(state, error_for(code, state.topic, state.partition))
            return
        position = state.position
        truncation = state.complete_validation(
            answer.leader_epoch, answer.end_offset, self.config.auto_offset_reset
        )
        if truncation is not None:
            self._deliver_error(state, LogTruncationError(state.topic, state.partition, truncation))
        elif state.position != position:
            log.info(
                "consumer: %s-%s: the log was truncated below offset %s of epoch %s; "
                "resuming at %s",
                state.topic,
                state.partition,
                position,
                answer.leader_epoch if state.position is not None else "-",
                "the reset offset" if state.position is None else state.position,
            )

    async def _fetch(self, address: str, states: list[PartitionState], max_wait_ms: int) -> None:
        """One Fetch request to ``address`` for ``states``; buffers or handles each answer."""
        cfg = self.config
        request, sent = create_fetch_request(
            states,
            self.cluster.leader_epoch,
            max_wait_ms=max_wait_ms,
            min_bytes=cfg.fetch_min_bytes,
            max_bytes=cfg.fetch_max_bytes,
            partition_max_bytes=cfg.max_partition_fetch_bytes,
        )
        try:
            reply = await self.cluster.fetch(
                address, request, (max_wait_ms + cfg.request_timeout_ms) / 1000
            )
        except grpc.aio.AioRpcError as e:
            log.info("consumer: Fetch from %s failed: %s: %s", address, e.code(), e.details())
            for state in states:
                self.cluster.invalidate(state.topic, state.partition)
                self._backoff(state)
            return
        except ClusterError:  # closed meanwhile
            return
        for topic_answer in reply.topics:
            for answer in topic_answer.partitions:
                entry = sent.get((topic_answer.topic, answer.partition))
                if entry is None:
                    continue
                state, offset, generation = entry
                current = self._states.get((state.topic, state.partition))
                if current is not state or state.generation != generation:
                    continue  # unassigned or sought meanwhile
                self._handle_answer(state, offset, answer)

    def _fetch_ahead(self) -> None:
        """Send the next Fetch of each buffered partition that wants one
        (:meth:`PartitionState.fetch_ahead_offset`) while the caller works through its
        records, one request per leader in a task of its own: the next answer is on its
        way, or already buffered, when the buffer runs out, instead of a round trip on the
        caller's path (Kafka's fetch pipelining)."""
        if self._closed or not self._ready:
            return
        wanting = [state for state in self._ready if state.fetch_ahead_offset() is not None]
        if not wanting:  # the common case, checked per poll(): nothing more to make
            return
        by_leader: dict[str, list[PartitionState]] = {}
        for state in wanting:
            try:
                address = self.cluster.leader_address(state.topic, state.partition)
            except HighwaterError:
                continue  # the fetch at the buffer's end finds out and acts
            by_leader.setdefault(address, []).append(state)
        cfg = self.config
        for address, states in by_leader.items():
            request, sent = create_fetch_request(
                states,
                self.cluster.leader_epoch,
                max_wait_ms=0,
                min_bytes=cfg.fetch_min_bytes,
                max_bytes=cfg.fetch_max_bytes,
                partition_max_bytes=cfg.max_partition_fetch_bytes,
                ahead=True,
            )
            for state in states:
                state.ahead_generation = state.generation
            task = self._running_loop().create_task(self._fetch_ahead_from(address, request, sent))
            self._ahead.add(task)
            task.add_done_callback(self._ahead.discard)
            self._ahead_unsent = True

    async def _run_fetches_ahead(self) -> None:
        """One turn of the event loop while fetches ahead are in flight, before records go
        back to the caller: a fetch ahead made meanwhile sends its request, and an answer
        that arrived is received and buffered. Without it, a caller whose calls are answered
        from the buffer (no await that waits) never lets the loop run: the fetch ahead
        would leave only when the buffer ran dry, a round trip on the caller's path, and
        the broker's work on the next answer would not overlap the caller's on this one.
        One turn per ``consume``/``consume_batches`` call, per ``poll`` only when a fetch
        ahead was just made."""
        if self._ahead:
            self._ahead_unsent = False
            await asyncio.sleep(0)

    async def _fetch_ahead_from(
        self,
        address: str,
        request: pb.FetchRequest,
        sent: dict[tuple[str, int], tuple[PartitionState, int, int]],
    ) -> None:
        """A Fetch ahead (``request``, asking what ``sent`` says) to ``address``: each
        answer with records is buffered after what its partition holds, if nothing moved
        the partition meanwhile; an answer with an error, or a failed request, is dropped
        (the fetch sent when the buffer runs out meets it again and acts on it), and an
        error that says the leader is stale forgets the leader, so no fetch ahead goes to
        it again meanwhile."""
        cfg = self.config
        try:
            reply = await self.cluster.fetch(address, request, cfg.request_timeout_ms / 1000)
        except grpc.aio.AioRpcError as e:
            log.debug("consumer: Fetch ahead from %s failed: %s", address, e.code())
            reply = None
        except ClusterError:  # closed meanwhile
            reply = None
        finally:
            for state, _, generation in sent.values():
                if state.ahead_generation == generation:
                    state.ahead_generation = -1
        for topic_answer in () if reply is None else reply.topics:
            for answer in topic_answer.partitions:
                entry = sent.get((topic_answer.topic, answer.partition))
                if entry is None:
                    continue
                if answer.error != _NO_ERROR:
                    # A stale leader: forget it, so that no fetch ahead goes to it again
                    # while the buffer lasts (its end's fetch refreshes the metadata).
                    self.cluster.handle_error(topic_answer.topic, answer.partition, answer.error)
                    continue
                state, offset, generation = entry
                if (
                    self._states.get((state.topic, state.partition)) is not state
                    or state.generation != generation
                    or state.failed
                    or state.fetched_end != (offset if state.buffered() else -1)
                ):
                    continue  # unassigned, sought, failed or drained and fetched meanwhile
                if not state.buffered() and state.position != offset:
                    continue
                state.high_watermark = answer.high_watermark
                state.log_start_offset = answer.log_start_offset
                self._buffer(state, offset, answer.records)
        self._wakeup.set()

    def _handle_answer(
        self, state: PartitionState, offset: int, answer: pb.FetchPartitionResponse
    ) -> None:
        """Buffer a partition's fetched records, or act on its error code."""
        code = answer.error
        if code == _NO_ERROR:
            state.high_watermark = answer.high_watermark
            state.log_start_offset = answer.log_start_offset
            state.missing_reported = False
            self._buffer(state, offset, answer.records)
        elif code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
            self._topic_missing(state, error_for(code, state.topic, state.partition))
        elif code == ErrorCode.OFFSET_OUT_OF_RANGE:
            if self.config.auto_offset_reset == "none":
                self._deliver_error(
                    state,
                    OffsetOutOfRangeError(
                        f"{state.topic}-{state.partition}: offset {offset} is out of range "
                        "and auto.offset.reset is none"
                    ),
                )
            else:
                log.info(
                    "consumer: %s-%s: offset %d out of range, resetting to %s",
                    state.topic,
                    state.partition,
                    offset,
                    self.config.auto_offset_reset,
                )
                state.position, state.reset = None, self.config.auto_offset_reset
        elif code in FETCH_RETRIABLE_ERRORS:
            self.cluster.invalidate(state.topic, state.partition)
            self._backoff(state)
        else:
            self.cluster.handle_error(state.topic, state.partition, code)
            self._deliver_error(state, error_for(code, state.topic, state.partition))

    def _buffer(self, state: PartitionState, offset: int, data: bytes) -> None:
        """Buffer a fetched answer's batches (:meth:`PartitionState.buffer`): the partition
        joins the ready ones, or its error is delivered."""
        ready, error = state.buffer(offset, data, self.config.check_crcs)
        if ready and state not in self._ready:
            self._ready.append(state)
        if error is not None:
            self._deliver_error(state, error)

    # --- offsets ------------------------------------------------------------------------

    async def _list_offsets(
        self,
        partitions: Sequence[tuple[str, int]],
        timestamps: Sequence[int],
        *,
        raise_errors: bool = True,
        timeout: float | None = None,
    ) -> list[tuple[int, int] | BaseException]:
        """``ListOffsets`` of each partition at its timestamp: ``(offset, timestamp)`` or an
        error; leader errors are retried until ``timeout`` (default ``request.timeout.ms``)."""
        loop = asyncio.get_running_loop()
        limit = _timeout_s(timeout)
        if math.isinf(limit):
            limit = self.config.request_timeout_ms / 1000
        deadline = loop.time() + limit
        results: list[tuple[int, int] | BaseException | _Retriable | None] = [None] * len(
            partitions
        )
        todo = list(range(len(partitions)))
        while True:
            retry: list[int] = []
            topics = {partitions[i][0] for i in todo}
            stale = {t for t in topics if self.cluster.needs_refresh(t)}
            if stale:
                await self.cluster.refresh(stale)
            by_leader: dict[str, list[int]] = {}
            for i in todo:
                topic, partition = partitions[i]
                try:
                    address = self.cluster.leader_address(topic, partition)
                except UnknownTopicOrPartitionError as e:
                    results[i] = e
                    continue
                except LeaderNotAvailableError as e:
                    self.cluster.invalidate(topic, partition)
                    results[i] = e
                    retry.append(i)
                    continue
                by_leader.setdefault(address, []).append(i)
            replies = await asyncio.gather(
                *(
                    self._list_offsets_from(address, indexes, partitions, timestamps)
                    for address, indexes in by_leader.items()
                )
            )
            for indexes, answers in zip(by_leader.values(), replies, strict=True):
                for i, answer in zip(indexes, answers, strict=True):
                    results[i] = answer
                    if isinstance(answer, _Retriable):
                        retry.append(i)
            if not retry or loop.time() + self.config.retry_backoff_ms / 1000 >= deadline:
                break
            todo = retry
            await asyncio.sleep(self.config.retry_backoff_ms / 1000)
        final: list[tuple[int, int] | BaseException] = []
        for result in results:
            assert result is not None
            if isinstance(result, _Retriable):
                result = result.error
            if raise_errors and isinstance(result, BaseException):
                raise result
            final.append(result)
        return final

    async def _list_offsets_from(
        self,
        address: str,
        indexes: list[int],
        partitions: Sequence[tuple[str, int]],
        timestamps: Sequence[int],
    ) -> list[tuple[int, int] | BaseException | _Retriable]:
        """One ListOffsets request to ``address``; answers in the order of ``indexes``."""
        asked = []
        for i in indexes:
            topic, partition = partitions[i]
            epoch = self.cluster.leader_epoch(topic, partition)
            asked.append((topic, partition, timestamps[i], epoch))
        try:
            answers = await self.cluster.list_offsets(
                address, asked, self.config.request_timeout_ms / 1000
            )
        except grpc.aio.AioRpcError as e:
            error = FetchError(
                ErrorCode.NETWORK_EXCEPTION,
                f"ListOffsets to {address} failed: {e.code()}: {e.details()}",
            )
            for i in indexes:
                self.cluster.invalidate(*partitions[i])
            return [_Retriable(error) for _ in indexes]
        results: list[tuple[int, int] | BaseException | _Retriable] = []
        for (topic, partition, _, _), answer in zip(asked, answers, strict=True):
            if answer is None:
                results.append(
                    FetchError(ErrorCode.UNKNOWN_SERVER_ERROR, f"{topic}-{partition}: no answer")
                )
                continue
            if answer.error == ErrorCode.NONE:
                results.append((answer.offset, answer.timestamp))
                continue
            failure = error_for(answer.error, topic, partition)
            self.cluster.handle_error(topic, partition, answer.error)
            if answer.error in FETCH_RETRIABLE_ERRORS:
                results.append(_Retriable(failure))
            else:
                results.append(failure)
        return results

    async def get_watermark_offsets(
        self, partition: TopicPartition, timeout: float | None = None, cached: bool = False
    ) -> tuple[int, int]:
        """``(low, high)``: the partition's log start offset and high watermark, from
        ListOffsets (earliest, latest); with ``cached``, as the last Fetch answer gave them
        (:data:`OFFSET_INVALID` when none did). Raises the partition's typed error."""
        self._check_open()
        if cached:
            state = self._states.get(partition.key())
            if state is None:
                return (OFFSET_INVALID, OFFSET_INVALID)
            return (state.log_start_offset, state.high_watermark)
        key = partition.key()
        answers = await self._list_offsets(
            [key, key], [EARLIEST_TIMESTAMP, LATEST_TIMESTAMP], timeout=timeout
        )
        (low, _), (high, _) = answers  # type: ignore[misc]
        return (low, high)

    async def offsets_for_times(
        self, partitions: Iterable[TopicPartition], timeout: float | None = None
    ) -> list[TopicPartition]:
        """For each partition (``offset`` holding a timestamp in ms), the offset of its first
        record with a timestamp at or after it: -1 (:data:`OFFSET_END`) when there is
        none; a partition's failure is set as its ``error``."""
        self._check_open()
        items = list(partitions)
        for tp in items:
            if tp.offset is None or tp.offset < 0:
                raise ValueError(
                    f"{tp.topic}-{tp.partition}: offsets_for_times needs a timestamp >= 0"
                )
        answers = await self._list_offsets(
            [tp.key() for tp in items],
            [tp.offset for tp in items if tp.offset is not None],
            raise_errors=False,
            timeout=timeout,
        )
        result = []
        for tp, answer in zip(items, answers, strict=True):
            if isinstance(answer, BaseException):
                result.append(TopicPartition(tp.topic, tp.partition, OFFSET_INVALID, answer))
            else:
                result.append(TopicPartition(tp.topic, tp.partition, answer[0]))
        return result

    async def partitions_for(self, topic: str) -> list[int]:
        """The partition indexes of ``topic`` (Kafka's ``partitionsFor``), from fresh
        metadata; raises :class:`UnknownTopicOrPartitionError` if it does not exist."""
        self._check_open()
        await self.cluster.refresh([topic])
        info = self.cluster.topic(topic)
        if info is None:
            raise UnknownTopicOrPartitionError(f"Topic '{topic}' does not exist")
        return [p.partition for p in info.partitions]

    # --- consumer groups ----------------------------------------------------------------

    def _group(self) -> GroupMembership:
        """The group membership (created on first use); needs ``group.id``."""
        if not self.config.group_id:
            raise ConsumerError("group.id must be set to subscribe or commit offsets")
        if self._membership is None:
            settings = GroupSettings(
                group_id=self.config.group_id,
                client_id=self.config.client_id,
                group_instance_id=self.config.group_instance_id,
                session_timeout_ms=self.config.session_timeout_ms,
                heartbeat_interval_ms=self.config.heartbeat_interval_ms,
                max_poll_interval_ms=self.config.max_poll_interval_ms,
                retry_backoff_ms=self.config.retry_backoff_ms,
                request_timeout_ms=self.config.request_timeout_ms,
            )
            assignors = [assignor_for(n) for n in self.config.partition_assignment_strategy]
            self._membership = GroupMembership(
                self.cluster, settings, assignors, on_rejoin_needed=self._wakeup.set
            )
        return self._membership

    def subscribe(
        self,
        topics: Sequence[str],
        on_assign: RebalanceCallback | None = None,
        on_revoke: RebalanceCallback | None = None,
        on_lost: RebalanceCallback | None = None,
    ) -> None:
        """Join ``group.id`` for ``topics``: the group shares their partitions out among its
        members; :meth:`poll` rebalances as members come and go (see the module docstring)."""
        self._check_open()
        names = [topics] if isinstance(topics, str) else list(topics)
        if not names or not all(isinstance(t, str) and t for t in names):
            raise ValueError("subscribe needs a list of topic names")
        membership = self._group()
        if self._subscription is None and self._states:
            raise ConsumerError("partitions are assigned by hand; unassign() first")
        self._subscription = tuple(dict.fromkeys(names))
        self._on_assign, self._on_revoke, self._on_lost = on_assign, on_revoke, on_lost
        membership.rejoin_needed = True
        self._next_metadata_check = 0.0
        self._wakeup.set()

    def subscription(self) -> list[str]:
        """The subscribed topics."""
        return list(self._subscription or ())

    def consumer_group_metadata(self) -> ConsumerGroupMetadata:
        """The group, generation and member id this consumer has now (confluent-kafka's
        ``consumer_group_metadata``); generation -1 and no member id outside a group."""
        membership = self._group()
        return ConsumerGroupMetadata(
            membership.settings.group_id,
            membership.generation_id,
            membership.member_id,
            membership.settings.group_instance_id,
        )

    async def unsubscribe(self) -> None:
        """Give the partitions back (``on_revoke``; ``on_lost`` when the membership was
        lost) and leave the group."""
        if self._subscription is None or self._membership is None:
            return
        membership = self._membership
        await self._give_up_before_leaving(membership)
        await membership.leave()
        self._subscription = None

    async def _poll_group(self) -> None:
        """What a poll does for the group: rebalance when needed, and auto-commit."""
        membership = self._membership
        if membership is None or self._closed:
            return
        membership.polled()
        if self._subscription is not None:
            await self._check_partition_counts()
            while membership.rejoin_needed and not self._closed:
                await self._rebalance(membership, self._subscription)
        if self._next_auto_commit is not None and self._states:
            now = asyncio.get_running_loop().time()
            if now >= self._next_auto_commit:
                self._next_auto_commit = now + self.config.auto_commit_interval_ms / 1000
                self._commit_in_background(self._positions(list(self._states)))

    async def _check_partition_counts(self) -> None:
        """The metadata check, every ``metadata.max.age.ms``: rejoin when a subscribed topic
        appears or gains partitions, so that the leader assigns them; and, while this member
        leads, when a topic of the group's subscription (other members' topics too) no
        longer has the partition count the generation was assigned from
        (:meth:`GroupMembership.metadata_seen`, Kafka's assignment snapshot)."""
        loop = asyncio.get_running_loop()
        if loop.time() < self._next_metadata_check or self._subscription is None:
            return
        self._next_metadata_check = loop.time() + self.config.metadata_max_age_ms / 1000
        membership = self._membership
        watched = membership.watched_topics() if membership is not None else ()
        topics = tuple(dict.fromkeys((*self._subscription, *watched)))
        with contextlib.suppress(ClusterError):
            await self.cluster.refresh(topics)
        if membership is None or not membership.is_member():
            return
        if self._current_partition_counts(self._subscription) != self._partition_counts:
            membership.rejoin_needed = True
        membership.metadata_seen(
            {t: n for t, n in self._current_partition_counts(watched).items() if n}
        )

    def _current_partition_counts(self, topics: Sequence[str]) -> dict[str, int]:
        """The cached partition count of each of ``topics`` (0: not known to exist)."""
        counts = {}
        for topic in topics:
            info = self.cluster.topic(topic)
            counts[topic] = 0 if info is None else info.num_partitions
        return counts

    async def _rebalance(self, membership: GroupMembership, topics: tuple[str, ...]) -> None:
        """One rebalance: give up what must go, join, and start on what arrived."""
        if membership.lost:
            await self._lose(membership)
        before = membership.partitions_to_revoke_before_join(topics)
        if before:
            await self._revoke(before)
        elif membership.protocol is RebalanceProtocol.EAGER and membership.is_member():
            # Eager: on_revoke starts every rebalance of a member of a generation, even
            # one with nothing to give up (Kafka's ConsumerRebalanceListener).
            await self._invoke(self._on_revoke, ())
        self._partition_counts = self._current_partition_counts(topics)
        rebalance = await membership.join(topics)
        if rebalance is None:
            return  # the membership was lost while joining: the next round gives it up
        if rebalance.change.revoked:
            await self._revoke(rebalance.change.revoked)
        added = rebalance.change.added
        await self._add_partitions(membership, added)
        membership.assigned(added)
        log.info(
            "group %s: generation %d, %d partition(s) assigned",
            self.config.group_id,
            rebalance.generation_id,
            len(membership.owned),
        )
        await self._invoke(self._on_assign, added)

    async def _lose(self, membership: GroupMembership) -> None:
        """The membership was lost: drop its partitions with ``on_lost`` (``on_revoke``
        without one), and no commit: they may be another member's already."""
        lost = membership.owned
        membership.lost = False
        if lost:
            membership.revoked(lost)
            self._remove_partitions(lost)
            await self._invoke(self._on_lost or self._on_revoke, lost)

    async def _give_up_before_leaving(self, membership: GroupMembership) -> None:
        """Before leaving the group (close, unsubscribe): the partitions go with
        ``on_revoke`` (committed first with auto-commit), or as lost when the membership
        is gone (Kafka's ``onLeavePrepare``)."""
        if membership.lost or not membership.is_member():
            await self._lose(membership)
        else:
            await self._revoke(membership.owned)

    async def _revoke(self, partitions: Sequence[TopicPartitionKey]) -> None:
        """Commit (with auto-commit on), tell ``on_revoke``, and stop consuming ``partitions``."""
        if not partitions:
            return
        if self.config.enable_auto_commit:
            with contextlib.suppress(HighwaterError):
                await self._commit(self._positions(partitions), raise_errors=False)
        await self._invoke(self._on_revoke, partitions)
        self._remove_partitions(partitions)
        if self._membership is not None:
            self._membership.revoked(partitions)

    async def _invoke(
        self, callback: RebalanceCallback | None, partitions: Sequence[TopicPartitionKey]
    ) -> None:
        if callback is None:
            return
        result = callback(self._listener_owner, [TopicPartition(t, p) for t, p in partitions])
        if isinstance(result, Awaitable):
            await result

    async def _add_partitions(
        self, membership: GroupMembership, partitions: Sequence[TopicPartitionKey]
    ) -> None:
        """Start on ``partitions``: at the group's committed offsets, else per
        ``auto.offset.reset``. A partition the cached metadata does not know (its topic
        appeared or grew since this consumer last looked) has its topic described afresh
        before it is fetched, not taken for one that does not exist."""
        if not partitions:
            return
        committed = await membership.committed(partitions)
        for key in partitions:
            info = self.cluster.topic(key[0])
            if info is None or key[1] >= info.num_partitions:
                self.cluster.invalidate(key[0])
            state = PartitionState(key[0], key[1], reset=self.config.auto_offset_reset)
            found = committed.get(key)
            if found is None:
                self._set_offset(state, None, committed_known=True)
            else:
                self._set_offset(state, found[0], found[1])
            self._states[key] = state
        self._wakeup.set()

    def _remove_partitions(self, partitions: Sequence[TopicPartitionKey]) -> None:
        for key in partitions:
            state = self._states.pop(key, None)
            if state is not None:
                with contextlib.suppress(ValueError):
                    self._ready.remove(state)

    def _positions(
        self, partitions: Sequence[TopicPartitionKey]
    ) -> dict[TopicPartitionKey, tuple[int, int]]:
        """The known positions of ``partitions`` and their leader epochs: what a commit of
        "consumed so far" sends."""
        positions = {}
        for key in partitions:
            state = self._states.get(key)
            if state is not None and state.position is not None:
                positions[key] = (state.position, state.position_epoch)
        return positions

    async def commit(
        self,
        message: Message | None = None,
        offsets: Iterable[TopicPartition] | None = None,
        asynchronous: bool = True,
    ) -> list[TopicPartition] | None:
        """Commit offsets to the group (confluent-kafka's ``commit``): the offset after
        ``message``, or ``offsets``, or else the positions of every assigned partition.

        Asynchronous (the default) returns None at once, failures are logged; synchronous
        returns the committed partitions, or raises :class:`CommitFailedError` whose
        ``partitions`` carry each error.
        """
        self._check_open()
        self._group()
        if message is not None:
            key = (message.topic(), message.partition())
            offset = message.offset() + 1
            epoch = message.leader_epoch()
            to_commit = {key: (offset, self._epoch_before(key, offset) if epoch is None else epoch)}
        elif offsets is not None:
            to_commit = {}
            for tp in offsets:
                if tp.offset is None or tp.offset < 0:
                    raise ValueError(f"{tp.topic}-{tp.partition}: commit needs an offset >= 0")
                to_commit[tp.key()] = (tp.offset, _epoch(tp.leader_epoch))
        else:
            to_commit = self._positions(list(self._states))
        if asynchronous:
            self._commit_in_background(to_commit)
            return None
        return await self._commit(to_commit, raise_errors=True)

    def _epoch_before(self, key: TopicPartitionKey, offset: int) -> int:
        """The leader epoch of the record before ``offset`` of partition ``key`` when the
        consumer knows it (``offset`` is the partition's position: the record was the last
        one returned, its batch's epoch is the position's), else -1."""
        state = self._states.get(key)
        if state is not None and state.position == offset:
            return state.position_epoch
        return -1

    def _commit_in_background(self, offsets: dict[TopicPartitionKey, tuple[int, int]]) -> None:
        if not offsets:
            return
        task: asyncio.Task[object] = asyncio.create_task(self._commit(offsets, raise_errors=False))
        self._commits.add(task)
        task.add_done_callback(self._commits.discard)

    async def _commit(
        self, offsets: Mapping[TopicPartitionKey, tuple[int, int]], *, raise_errors: bool
    ) -> list[TopicPartition]:
        """Commit ``{(topic, partition): (offset, leader epoch)}`` (epoch -1: not known)."""
        membership = self._group()
        if not offsets:
            return []
        errors = await membership.commit({k: (o, e, "") for k, (o, e) in offsets.items()})
        result = []
        failed = []
        for key, (offset, _) in offsets.items():
            code, detail = errors.get(key, (ErrorCode.NONE, ""))
            text = _code_name(code) + (f" ({detail})" if detail else "")
            error = None if code == ErrorCode.NONE else GroupError(code, text)
            result.append(TopicPartition(key[0], key[1], offset, error))
            if error is not None:
                failed.append(f"{key[0]}-{key[1]}: {text}")
        if failed:
            message = f"group {self.config.group_id}: commit failed for {', '.join(failed)}"
            if raise_errors:
                raise CommitFailedError(message, result)
            log.warning("%s", message)
        return result

    async def committed(
        self, partitions: Iterable[TopicPartition], timeout: float | None = None
    ) -> list[TopicPartition]:
        """The group's committed offset of each of ``partitions`` (:data:`OFFSET_INVALID`
        where none is)."""
        self._check_open()
        membership = self._group()
        keys = [tp.key() for tp in partitions]
        async with asyncio.timeout(None if timeout is None or timeout < 0 else timeout):
            committed = await membership.committed(keys)
        answer = []
        for t, p in keys:
            found = committed.get((t, p))
            if found is None:
                answer.append(TopicPartition(t, p, OFFSET_INVALID))
            else:
                epoch = None if found[1] < 0 else found[1]
                answer.append(TopicPartition(t, p, found[0], leader_epoch=epoch))
        return answer

    async def _close_group(self) -> None:
        membership = self._membership
        if membership is None:
            return
        try:
            if self._subscription is not None:
                await self._give_up_before_leaving(membership)
            elif self.config.enable_auto_commit and self._states:
                with contextlib.suppress(HighwaterError):
                    await self._commit(self._positions(list(self._states)), raise_errors=False)
            if self._commits:
                await asyncio.gather(*self._commits, return_exceptions=True)
            await membership.leave()
        finally:
            await membership.close()

    # --- lifecycle ----------------------------------------------------------------------

    async def close(self) -> None:
        """Stop: drop the assignment and close the connections; later calls raise
        :class:`ConsumerClosedError` (closing again does nothing).

        Leaving the group may fail: a broker's error or a timeout is passed over, anything
        else (an ``on_revoke`` callback that raised, a cancellation) is raised once the
        consumer is closed all the same, its connections too (as Kafka's consumer closes
        everything and then throws the first error)."""
        if self._closed:
            return
        if self._tracing is not None:
            self._tracing.end_processing()
        try:
            with contextlib.suppress(HighwaterError, TimeoutError):
                await self._close_group()
        finally:
            self._closed = True
            try:
                for task in list(self._ahead):
                    task.cancel()
                if self._ahead:
                    await asyncio.wait(self._ahead)
                self._states = {}
                self._ready.clear()
                self._errors.clear()
                self._wakeup.set()
            finally:
                await self.cluster.close()

    def _check_open(self) -> None:
        """Raise :class:`ConsumerClosedError` after close."""
        if self._closed:
            raise ConsumerClosedError("the consumer is closed")

    @property
    def group_id(self) -> str:
        """``group.id`` (empty: no group)."""
        return self.config.group_id

    def partition_lags(self) -> list[PartitionLag]:
        """``(topic, partition, lag)`` of each assigned partition whose position and high
        watermark are known: the records between them (Kafka's ``records-lag``)."""
        return [
            (state.topic, state.partition, max(state.high_watermark - state.position, 0))
            for state in self._states.values()
            if state.position is not None and state.high_watermark >= 0
        ]

    async def __aenter__(self) -> AsyncConsumer:
        """``async with AsyncConsumer(...)``: closes on exit."""
        return self

    async def __aexit__(self, *exc: object) -> None:
        """Close the consumer."""
        await self.close()


@dataclass(frozen=True, slots=True)
class _Retriable:
    """A ListOffsets answer worth retrying, with the error to report if retries run out."""

    error: BaseException


# --- The blocking consumer --------------------------------------------------------------

_T = TypeVar("_T")


class Consumer:
    """A blocking consumer, confluent-kafka's ``Consumer``: safe to use from plain sync code.

    An :class:`AsyncConsumer` runs on an event loop in a daemon thread; every method
    runs there and waits for its result. Use it from one thread at a time.
    """

    def __init__(self, config: Mapping[str, Any]) -> None:
        """Validate ``config`` (raising :class:`InvalidConfigError`) and start the thread."""
        ConsumerConfig.parse(config)
        self._loop_thread = LoopThread("highwater-consumer")
        self._closed = False
        self._consumer: AsyncConsumer = self._call(self._create(dict(config)))

    @staticmethod
    async def _create(config: dict[str, Any]) -> AsyncConsumer:
        """Build the async consumer on the background loop (its events belong to it)."""
        return AsyncConsumer(config)

    def _call(self, coro: Coroutine[Any, Any, _T]) -> _T:
        """Run ``coro`` on the background loop and wait for its result."""
        return self._submit(coro).result()

    def _submit(self, coro: Coroutine[Any, Any, _T]) -> ConcurrentFuture[_T]:
        """Start ``coro`` on the background loop; its future."""
        if self._closed:
            coro.close()
            raise ConsumerClosedError("the consumer is closed")
        return self._loop_thread.submit(coro)

    def _run(self, fn: Callable[..., _T], *args: Any) -> _T:
        """Call a plain method of the async consumer on its loop."""

        async def call() -> _T:
            return fn(*args)

        return self._call(call())

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """See :meth:`AsyncConsumer.assign`."""
        self._run(self._consumer.assign, list(partitions))

    def assignment(self) -> list[TopicPartition]:
        """See :meth:`AsyncConsumer.assignment`."""
        return self._run(self._consumer.assignment)

    def unassign(self) -> None:
        """See :meth:`AsyncConsumer.unassign`."""
        self._run(self._consumer.unassign)

    def seek(self, partition: TopicPartition) -> None:
        """See :meth:`AsyncConsumer.seek`."""
        self._run(self._consumer.seek, partition)

    def position(self, partitions: Iterable[TopicPartition]) -> list[TopicPartition]:
        """See :meth:`AsyncConsumer.position`."""
        return self._run(self._consumer.position, list(partitions))

    def pause(self, partitions: Iterable[TopicPartition]) -> None:
        """See :meth:`AsyncConsumer.pause`."""
        self._run(self._consumer.pause, list(partitions))

    def resume(self, partitions: Iterable[TopicPartition]) -> None:
        """See :meth:`AsyncConsumer.resume`."""
        self._run(self._consumer.resume, list(partitions))

    def subscribe(
        self,
        topics: Sequence[str],
        on_assign: RebalanceCallback | None = None,
        on_revoke: RebalanceCallback | None = None,
        on_lost: RebalanceCallback | None = None,
    ) -> None:
        """See :meth:`AsyncConsumer.subscribe`. The callbacks get this consumer and run in a
        worker thread while :meth:`poll` waits, so they may call its methods (commit...)."""

        def blocking(callback: RebalanceCallback | None) -> RebalanceCallback | None:
            if callback is None:
                return None

            async def run(_owner: Any, partitions: list[TopicPartition]) -> None:
                await asyncio.to_thread(callback, self, partitions)

            return run

        self._run(
            self._consumer.subscribe,
            list(topics),
            blocking(on_assign),
            blocking(on_revoke),
            blocking(on_lost),
        )

    def subscription(self) -> list[str]:
        """See :meth:`AsyncConsumer.subscription`."""
        return self._run(self._consumer.subscription)

    def unsubscribe(self) -> None:
        """See :meth:`AsyncConsumer.unsubscribe`."""
        self._call(self._consumer.unsubscribe())

    def commit(
        self,
        message: Message | None = None,
        offsets: Iterable[TopicPartition] | None = None,
        asynchronous: bool = True,
    ) -> list[TopicPartition] | None:
        """See :meth:`AsyncConsumer.commit`."""
        listed = None if offsets is None else list(offsets)
        return self._call(self._consumer.commit(message, listed, asynchronous))

    def committed(
        self, partitions: Iterable[TopicPartition], timeout: float | None = None
    ) -> list[TopicPartition]:
        """See :meth:`AsyncConsumer.committed`."""
        return self._call(self._consumer.committed(list(partitions), timeout))

    def poll(self, timeout: float | None = None) -> Message | None:
        """See :meth:`AsyncConsumer.poll`."""
        return self._call(self._consumer.poll(timeout))

    def consume(self, num_messages: int = 1, timeout: float | None = None) -> list[Message]:
        """See :meth:`AsyncConsumer.consume`."""
        return self._call(self._consumer.consume(num_messages, timeout))

    def consume_batches(
        self, num_records: int = 500, timeout: float | None = None
    ) -> list[MessageBatch]:
        """See :meth:`AsyncConsumer.consume_batches`."""
        return self._call(self._consumer.consume_batches(num_records, timeout))

    def consume_columns(
        self,
        partition: TopicPartition,
        columns: Any,
        num_records: int,
        timeout: float | None = None,
    ) -> BaseException | None:
        """See :meth:`AsyncConsumer.consume_columns`."""
        return self._call(self._consumer.consume_columns(partition, columns, num_records, timeout))

    def consume_columns_ahead(
        self,
        partition: TopicPartition,
        columns: Any,
        num_records: int,
        timeout: float | None = None,
    ) -> ConcurrentFuture[BaseException | None]:
        """:meth:`consume_columns` started on the consumer's thread, returning at once: its
        future's result is what :meth:`consume_columns` returns. The records are fetched and
        decoded into ``columns`` while the caller does other work (the Spark source hands
        its last batch to Spark meanwhile). Until the future is done the caller must leave
        ``columns`` alone and make no other call on the consumer."""
        return self._submit(
            self._consumer.consume_columns(partition, columns, num_records, timeout)
        )

    def get_watermark_offsets(
        self, partition: TopicPartition, timeout: float | None = None, cached: bool = False
    ) -> tuple[int, int]:
        """See :meth:`AsyncConsumer.get_watermark_offsets`."""
        return self._call(self._consumer.get_watermark_offsets(partition, timeout, cached))

    def offsets_for_times(
        self, partitions: Iterable[TopicPartition], timeout: float | None = None
    ) -> list[TopicPartition]:
        """See :meth:`AsyncConsumer.offsets_for_times`."""
        return self._call(self._consumer.offsets_for_times(list(partitions), timeout))

    def partitions_for(self, topic: str) -> list[int]:
        """See :meth:`AsyncConsumer.partitions_for`."""
        return self._call(self._consumer.partitions_for(topic))

    def close(self) -> None:
        """Close the consumer and stop its thread; closing again does nothing."""
        if self._closed:
            return
        try:
            self._call(self._consumer.close())
        finally:
            self._closed = True
            self._loop_thread.stop()

    def __enter__(self) -> Consumer:
        """``with Consumer(...)``: closes on exit."""
        return self

    def __exit__(self, *exc: object) -> None:
        """Close the consumer."""
        self.close()
