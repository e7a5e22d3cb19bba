"""The client library's producer: confluent-kafka's ``Producer`` API over Highwater's gRPC broker.

:class:`AsyncProducer` runs on an asyncio event loop; :class:`Producer` is the blocking
wrapper, which runs an :class:`AsyncProducer` on an event loop of its own in a background
thread and serves delivery callbacks from :meth:`Producer.poll` and :meth:`Producer.flush`,
as confluent-kafka does.

How a record travels (Kafka's ``RecordAccumulator`` and ``Sender``; their state and pure parts
are :mod:`~highwater.client.producer.accumulator` and :mod:`~highwater.client.producer.sender`):

- :meth:`AsyncProducer.produce` picks the partition (:func:`choose_partition`: the named one,
  else murmur2 of the key over all partitions, else the topic's sticky partition) and appends
  the record to the partition's open batch, a :class:`RecordBatchBuilder` of at most
  ``batch.size`` bytes, and never more than ``max.request.size`` (a single larger record
  gets a batch of its own; one larger than ``max.request.size`` fails with
  :class:`RecordTooLargeError` and is never sent). A topic whose metadata is not known yet
  waits in a side queue until the sender has fetched it; one the metadata does not name
  (created a moment ago, or not yet known to the broker asked) is asked for again every
  ``retry.backoff.ms`` until ``topic.metadata.propagation.max.ms`` (librdkafka's; at most
  ``delivery.timeout.ms``) passes, then its records fail with UNKNOWN_TOPIC_OR_PARTITION.
  ``produce()`` is the per-record cost of the library, so it keeps only the record's
  fields, its callback and a small :class:`~highwater.client.producer.handle.DeliveryHandle`
  (index into the batch; a future is made only if the caller awaits it): the batch is
  encoded in one pass when it is drained, its outcome is set once when it is delivered,
  and messages are made only for delivery callbacks. A record of plain bytes without
  headers for a partition whose batch is open takes a fast lane at the top of
  ``_enqueue``; the rest take the general path (``_place``).
  :meth:`AsyncProducer.produce_without_handle` is the same without the handle, for callers
  that learn of deliveries only through callbacks (confluent-kafka's ``produce()``).
- The sender task drains a batch once it is full or ``linger.ms`` passed since it was
  opened (at once during :meth:`~AsyncProducer.flush`), and sends the batches of each
  leader broker in as few ``Produce`` requests of at most ``max.request.size`` batch bytes
  as hold them, at most one batch per partition.
- With ``enable.idempotence`` (the default) the producer gets a producer id and epoch from
  ``InitProducerId`` once, and stamps each batch, when it is first drained, with the
  partition's next sequence number. Up to ``max.in.flight.requests.per.connection`` batches
  of a partition are in flight. A batch that fails with a retriable error (a stale leader,
  a timeout, a lost reply) is put back in sequence order and resent with the same sequence,
  one at a time until the partition has caught up; the broker answers a resent batch it
  already holds with the original offset, so nothing is written twice. A batch answered
  UNKNOWN_PRODUCER_ID (the broker lost the producer's state of the partition: its records
  were deleted, or the topic created again) is not in the log: the partition's sequences
  start again from 0 under the next epoch and it is resent, as Kafka's idempotent
  producer does.
- A batch is delivered with an error when it fails for good: a non-retriable error code,
  ``retries`` exhausted, or ``delivery.timeout.ms`` passed since it was opened. Sent, it may
  be in the log all the same, so its partition's sequences start again from 0 under a new
  producer epoch (:meth:`~highwater.client.producer.accumulator.PartitionQueue.restart_due`)
  instead of the later batches taking its numbers.

The sender runs on the same event loop as the code that calls ``produce()``: a loop that
queues records without awaiting leaves the sender no turn. Give the loop one every few
hundred records (``await asyncio.sleep(0)``, or ``await producer.poll(0)``): records then
leave while others are queued, and few wait at a time (each waiting record is work for
the garbage collector).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import queue
import random
import threading
import time
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, Final, TypeAlias, TypeVar

import grpc
import grpc.aio

from highwater.client.cluster import (
    ClusterError,
    ClusterMetadata,
    TopicInfo,
    UnknownTopicOrPartitionError,
)
from highwater.client.loop_thread import LoopThread
from highwater.client.message import (
    TIMESTAMP_CREATE_TIME,
    TIMESTAMP_LOG_APPEND_TIME,
    Message,
    message_factory,
)
from highwater.client.metrics import CLIENT_METRICS
from highwater.client.producer.accumulator import (
    MAX_PRODUCER_EPOCH,
    NO_HEADERS,
    SEQUENCE_MODULUS,
    PartitionQueue,
    ProducerBatch,
    StickyChoice,
    WaitingRecord,
)
from highwater.client.producer.columns import RecordsArg, column_chunks
from highwater.client.producer.config import ProducerConfig
from highwater.client.producer.delivery import (
    BatchDeliveryCallback,
    BatchMetadata,
    DeliveryCallback,
    DeliveryTimeoutError,
    HeadersArg,
    ProduceAuthorizationError,
    ProduceError,
    ProducerClosedError,
    ProducerError,
    RecordMetadata,
    RecordTooLargeError,
    headers_list,
    to_bytes,
)
from highwater.client.producer.handle import DeliveryHandle
from highwater.client.producer.sender import (
    PRODUCE_REQUEST_MAX_BYTES,
    SEQUENCE_ERRORS,
    answer_error,
    answers_by_partition,
    create_produce_request,
    is_retriable_answer,
    request_failure,
    split_requests,
)
from highwater.errors import AuthenticationError, HighwaterError
from highwater.records import BATCH_HEADER_SIZE, RecordBatchBuilder
from highwater.records.batch import append_fields
from highwater.records.columnar import encode_rows, partition_rows
from highwater.records.implementation import codec
from highwater.records.partitioner import StickyPartitioner, choose_partition
from highwater.records.record import RecordFields
from highwater.telemetry.configure import tracing_enabled
from highwater.telemetry.messaging import ProducerTracing
from highwater.v1 import broker_pb2 as pb
from highwater.v1.common_pb2 import ErrorCode

__all__ = ["AsyncProducer", "Producer"]

log = logging.getLogger(__name__)

_WRITTEN: Final = frozenset((ErrorCode.NONE, ErrorCode.DUPLICATE_SEQUENCE_NUMBER))
"""The answers that mean a batch is written (a duplicate: written before). Looked up once:
each ``ErrorCode.X`` is a Python-level attribute lookup of protobuf's enum wrapper."""


_time_ns = time.time_ns

_ProduceLane: Callable[..., Any] | None = None if codec is None else codec.ProduceLane
_deliver_records: Callable[..., tuple[int, BaseException, Message] | None] | None = (
    None if codec is None else codec.deliver_records
)
"""The delivery callbacks' loop of a written batch in C, None on the pure-Python paths."""
"""The compiled ``produce()`` (``highwater.records._codec.ProduceLane``), None when the
pure-Python paths serve (``HIGHWATER_PURE_PYTHON=1``)."""


def _negative_timestamp(timestamp: int) -> str:
    """What a record with a negative ``timestamp`` is refused with: Kafka's
    ``ProducerRecord`` refuses it (IllegalArgumentException), since -1 means "no
    timestamp" on the wire and the broker's time index takes none below 0."""
    return f"Invalid timestamp: {timestamp}. Timestamp should always be non-negative or None."


_Handle: TypeAlias = "DeliveryHandle | None"
"""A record's handle, or None for a record produced without one (the blocking producer)."""


# --- The asyncio producer ---------------------------------------------------------------


class AsyncProducer:
    """A Kafka producer for asyncio (see the module docstring).

    ``produce`` must be called on the event loop the producer runs on (the first call
    starts the sender there). Delivery callbacks run on that loop.
    """

    def __init__(
        self,
        config: Mapping[str, Any],
        *,
        rng: random.Random | None = None,
        on_delivery_batch: BatchDeliveryCallback | None = None,
    ) -> None:
        """Validate ``config`` (Kafka's producer settings); nothing connects yet.

        ``on_delivery_batch(err, batch)``, if given, is called once per batch of records
        :meth:`produce` queued, when it is written (``err`` None) or failed for good, with
        its :class:`BatchMetadata` (its records have the offsets ``batch.offset`` to
        ``batch.offset + batch.record_count - 1``, in the order they were produced;
        ``batch.timestamp`` is the first record's create time, or the broker's append
        time): librdkafka's batch-level delivery events, for callers who count or check
        deliveries without a callback per record. Per-record callbacks and handles work
        beside it. A record that fails before it reaches a batch (an unknown topic or
        partition, a timestamp out of range) is reported as a batch of one.
        """
        self.config = ProducerConfig.parse(config)
        self._on_delivery_batch = on_delivery_batch
        cfg = self.config
        self.cluster = ClusterMetadata(
            cfg.bootstrap_servers,
            request_timeout_s=cfg.request_timeout_ms / 1000,
            client_id=cfg.client_id,
            security=cfg.security,
        )
        self._topics = self.cluster.topics
        self._max_request_size = min(cfg.max_request_size, PRODUCE_REQUEST_MAX_BYTES)
        """The most batch bytes of one Produce request, and of one batch."""
        self._batch_size = min(cfg.batch_size, self._max_request_size)
        """The bytes at which a batch is closed (and the most its builder takes): no batch of
        more than one record is larger than ``max.request.size``."""
        self._ignore_keys = cfg.ignore_keys
        self._sticky = StickyPartitioner(self._batch_size, rng=rng)
        self._sticky_choices: dict[str, StickyChoice] = {}
        self._message_factories: dict[tuple[str, int, int], Callable[..., Message]] = {}
        self._queues: dict[tuple[str, int], PartitionQueue] = {}
        self._waiting: dict[str, list[WaitingRecord]] = {}
        self._lane: Any = None
        """The compiled ``produce()`` (see :meth:`produce`), or None."""
        self._pending_records = 0
        """:attr:`_pending` without the compiled lane."""
        self._idle = asyncio.Event()
        self._idle.set()
        self._wakeup = asyncio.Event()
        self._sender: asyncio.Task[None] | None = None
        self._sender_loop: asyncio.AbstractEventLoop | None = None
        self._requests: set[asyncio.Task[None]] = set()
        self._flushing = 0
        self._closed = False
        self._producer_id = -1
        self._producer_epoch = -1
        self._delivered = 0
        self._delivered_event = asyncio.Event()
        self._last_refresh = float("-inf")
        self._fatal: BaseException | None = None
        self._metrics = CLIENT_METRICS
        self._tracing = ProducerTracing() if tracing_enabled() else None
        """``send`` spans, when a tracer provider is installed (checked once, here)."""
        if _ProduceLane is not None and type(self).produce is AsyncProducer.produce:
            self._lane = _ProduceLane(
                self.__dict__,
                ProducerBatch,
                PartitionQueue,
                StickyChoice,
                DeliveryHandle,
                self.produce,  # the calls it does not take
            )
            self.__dict__["produce"] = self._lane
            self.__dict__["produce_without_handle"] = self._lane.produce_without_handle

    # --- public API -----------------------------------------------------------------------

    @property
    def producer_id(self) -> int:
        """The id InitProducerId gave (-1 before it, or without idempotence)."""
        return self._producer_id

    @property
    def producer_epoch(self) -> int:
        """The epoch InitProducerId gave (-1 before it, or without idempotence)."""
        return self._producer_epoch

    def __len__(self) -> int:
        """How many produced records have had no delivery report yet."""
        return self._pending

    @property
    def _pending(self) -> int:
        """Records produced and not delivered yet: counted by the compiled lane where there
        is one (it adds each record it places without a Python int or a write to this
        object's ``__dict__``), else here."""
        lane = self._lane
        return self._pending_records if lane is None else int(lane.pending)

    @_pending.setter
    def _pending(self, count: int) -> None:
        lane = self._lane
        if lane is None:
            self._pending_records = count
        else:
            lane.pending = count

    def produce(
        self,
        topic: str,
        value: str | bytes | None = None,
        key: str | bytes | None = None,
        partition: int | None = None,
        headers: HeadersArg = None,
        timestamp: int | None = None,
        on_delivery: DeliveryCallback | None = None,
    ) -> DeliveryHandle:
        """Queue a record; returns its :class:`DeliveryHandle`: ``await`` it for the
        record's :class:`RecordMetadata` (or its delivery error), as a future; the future
        is made only then (see :mod:`~highwater.client.producer.handle`).

        ``partition`` None (or -1) lets the partitioner choose; ``timestamp`` None (or 0)
        means now. ``on_delivery(err, msg)`` is called once the record is written (``err``
        None) or failed for good. Raises :class:`ProducerClosedError` after :meth:`close`,
        TypeError for keys or values that are not str or bytes, and ValueError for a
        negative ``timestamp`` (as Kafka's ``ProducerRecord``). A record larger than
        ``max.request.size`` as a batch of its own is failed before this returns (its
        handle done with :class:`RecordTooLargeError`, ``on_delivery`` called) and never
        sent, once the topic's metadata is known (else when it arrives).

        With the compiled codec, an instance's ``produce`` is ``highwater.records._codec.
        ProduceLane``, this method in C as librdkafka's ``produce()`` is: a record of bytes
        without headers whose partition (named, sticky, or murmur2 of its key) has an open
        batch is checked, placed, written into the batch's bytes with its size bookkeeping,
        counted and given its handle in that one call, as ``_enqueue``'s fast lane does in
        Python (the reference, ``HIGHWATER_PURE_PYTHON=1``); every other call comes here
        with its arguments as given, so the errors are this method's.
        """
        handle = DeliveryHandle()
        self._enqueue(topic, value, key, partition, headers, timestamp, on_delivery, handle)
        return handle

    def produce_without_handle(
        self,
        topic: str,
        value: str | bytes | None = None,
        key: str | bytes | None = None,
        partition: int | None = None,
        headers: HeadersArg = None,
        timestamp: int | None = None,
        on_delivery: DeliveryCallback | None = None,
    ) -> None:
        """:meth:`produce` without the :class:`DeliveryHandle`: the record's delivery is
        reported only through ``on_delivery`` and the producer's ``on_delivery_batch``, as
        confluent-kafka's ``produce()`` (which returns None) reports it. The same checks and
        typed errors as :meth:`produce`; what is saved is the handle's allocation and its
        fields, about a quarter of the compiled ``produce()``'s own cost (docs/client.md).
        """
        self._enqueue(topic, value, key, partition, headers, timestamp, on_delivery, None)

    def _enqueue(
        self,
        topic: str,
        value: str | bytes | None,
        key: str | bytes | None,
        partition: int | None,
        headers: HeadersArg,
        timestamp: int | None,
        on_delivery: DeliveryCallback | None,
        handle: _Handle,
    ) -> None:
        """:meth:`produce` with its handle made by the caller, or none at all (None: the
        blocking :class:`Producer`, whose callers get delivery reports only, needs no
        handle per record)."""
        if timestamp is not None and timestamp < 0:
            raise ValueError(_negative_timestamp(timestamp))
        # The fast lane: a record of plain bytes, without headers, for a partition whose
        # batch is open (the sticky one, or a named one), appended without the general
        # path's calls; anything else, or a record that does not fit, takes that path.
        if (
            headers is None
            and (value is None or type(value) is bytes)
            and (key is None or type(key) is bytes)
            and self._tracing is None
            and self._fatal is None
            and not self._closed
            and topic not in self._waiting
        ):
            choice: StickyChoice | None = None
            if partition is None or partition < 0:
                choice = (
                    self._sticky_choices.get(topic) if key is None or self._ignore_keys else None
                )
                q = (
                    None
                    if choice is None or choice.info is not self._topics.get(topic)
                    else choice.queue
                )
            else:
                q = self._queues.get((topic, partition)) if topic in self._topics else None
            batches = q.batches if q is not None else None
            if batches and not (batch := batches[-1]).closed:
                record: RecordFields = (
                    key,
                    value,
                    NO_HEADERS,
                    timestamp or _time_ns() // 1_000_000,
                )
                try:
                    size = append_fields(batch.builder, record)
                except HighwaterError:  # the general path reports it to the record
                    size = 0
                if size:
                    # An open batch holds undelivered records: the producer is not idle.
                    self._pending += 1
                    callbacks = batch.callbacks
                    if handle is not None:
                        handle._batch = batch
                        handle._index = len(callbacks)
                    callbacks.append(on_delivery)
                    if on_delivery is not None:
                        batch.has_callbacks = True
                    if batch.builder.estimated_size >= self._batch_size:
                        batch.closed = True
                        self._wakeup.set()
                    if choice is not None:
                        choice.unreported += size
                        if choice.unreported >= choice.threshold:
                            self._sticky.on_produced(topic, choice.partition, choice.unreported)
                            del self._sticky_choices[topic]
                    return
        if self._closed:
            raise ProducerClosedError("the producer is closed")
        if not isinstance(topic, str) or not topic:
            raise TypeError("topic must be a non-empty str")
        # Plain bytes (or None) need no conversion: test for them before calling to_bytes.
        if value is not None and type(value) is not bytes:
            value = to_bytes(value, "value")
        if key is not None and type(key) is not bytes:
            key = to_bytes(key, "key")
        record_headers = headers_list(headers) if headers is not None else NO_HEADERS
        if self._tracing is not None:
            span, record_headers = self._tracing.start_send(topic, partition, record_headers)
            if span.is_recording():
                if handle is None:
                    handle = DeliveryHandle()
                handle.add_done_callback(functools.partial(ProducerTracing.end_send, span))
        fields = (key, value, record_headers, timestamp or _time_ns() // 1_000_000)
        self._pending += 1
        if self._pending == 1:
            self._idle.clear()
        if self._sender is None:
            self._ensure_sender()
        requested = -1 if partition is None or partition < 0 else partition
        if self._fatal is not None:
            self._fail_one(topic, requested, fields, handle, on_delivery, self._fatal)
            return
        info = self._topics.get(topic)
        if info is None or topic in self._waiting:
            assert self._sender_loop is not None
            created = self._sender_loop.time()
            pending = WaitingRecord(requested, fields, handle, on_delivery, created)
            self._waiting.setdefault(topic, []).append(pending)
            self._wakeup.set()
        else:
            self._place(topic, requested, fields, handle, on_delivery, info, None)

    async def produce_batch(
        self,
        topic: str,
        records: RecordsArg,
        *,
        partition: int | None = None,
        timestamp: int | None = None,
        on_delivery_batch: BatchDeliveryCallback | None = None,
    ) -> int:
        """Queue many records given as columns; returns how many were queued.

        ``records`` is a pyarrow ``Table`` or ``RecordBatch`` with a ``value`` and maybe a
        ``key`` column (binary or string), or a mapping of such columns to sequences (see
        :mod:`~highwater.client.producer.columns`). Records go to ``partition``, else to
        ``to_positive(murmur2(key)) % partitions`` (computed over the key column in one
        pass), else, keyless, to the topic's sticky partition; all get ``timestamp`` (None:
        now) and no headers. They are encoded into batches of up to ``batch.size`` bytes
        straight from the columns, with no object, future or callback per record:
        ``on_delivery_batch(err, batch)`` gets one :class:`BatchMetadata` per batch (the
        offsets are ``batch.offset`` to ``batch.offset + batch.record_count - 1``). Waits only for
        the topic's metadata when it is not known yet; raises what cannot be produced
        (TypeError, ValueError, an unknown topic or partition) before queueing anything.
        """
        if self._closed:
            raise ProducerClosedError("the producer is closed")
        if not isinstance(topic, str) or not topic:
            raise TypeError("topic must be a non-empty str")
        if timestamp is not None and timestamp < 0:
            raise ValueError(_negative_timestamp(timestamp))
        chunks = list(column_chunks(records))
        info = self._topics.get(topic)
        if info is None:
            await self.cluster.refresh([topic])
            if self.cluster.is_unknown(topic):
                raise UnknownTopicOrPartitionError(f"topic {topic!r} does not exist")
            info = self.cluster.topic(topic)
            if info is None:
                raise UnknownTopicOrPartitionError(f"no metadata for topic {topic!r}")
        if self._fatal is not None:
            raise self._fatal
        for pending in self._waiting.pop(topic, ()):  # records produce() queued go first
            self._place(
                topic,
                pending.partition,
                pending.fields,
                pending.handle,
                pending.on_delivery,
                info,
                pending.created,
            )
        choice = self._sticky_choices.pop(topic, None)
        if choice is not None and choice.unreported:  # its bytes, before batches follow
            self._sticky.on_produced(topic, choice.partition, choice.unreported)
        num_partitions = info.num_partitions
        if partition is not None and partition >= 0 and partition >= num_partitions:
            raise UnknownTopicOrPartitionError(
                f"{topic}-{partition} does not exist (the topic has {num_partitions})"
            )
        if self._sender is None:
            self._ensure_sender()
        timestamp = timestamp or _time_ns() // 1_000_000
        max_records_bytes = self._batch_size - BATCH_HEADER_SIZE
        queued = 0
        for keys, values in chunks:
            if partition is not None and partition >= 0:
                groups: list[tuple[int, bytes | None]] = [(partition, None)]
            elif keys is not None and not self.config.ignore_keys:
                rows = partition_rows(keys, num_partitions)
                groups = [(p, rows[p]) for p in range(num_partitions) if rows[p]]
                if rows[num_partitions]:
                    groups.append((-1, rows[num_partitions]))
            else:
                groups = [(-1, None)]
            for target, rows_of in groups:
                total = values[4] if rows_of is None else len(rows_of) // 4
                start = 0
                while start < total:
                    body, following = encode_rows(keys, values, rows_of, start, max_records_bytes)
                    p = target
                    if p < 0:  # keyless: the sticky partition, told of each batch
                        p = choose_partition(
                            topic,
                            num_partitions,
                            None,
                            None,
                            info.available_partitions(),
                            sticky=self._sticky,
                        )
                        self._sticky.on_produced(topic, p, self._batch_size)
                    self._queue_encoded(
                        topic, p, body, following - start, timestamp, on_delivery_batch
                    )
                    queued += following - start
                    start = following
        return queued

    def _queue_encoded(
        self,
        topic: str,
        partition: int,
        body: bytes,
        count: int,
        timestamp: int,
        report: BatchDeliveryCallback | None,
    ) -> None:
        """Queue a batch of ``count`` records encoded already (:meth:`produce_batch`)."""
        batch = self._new_batch(topic, partition, None)
        batch.builder.adopt_records(body, count, timestamp)
        batch.closed = batch.columnar = True
        batch.report = report
        self._pending += count
        self._idle.clear()
        if batch.builder.estimated_size > self._max_request_size:  # one record, too large
            self._fail_batch(batch, self._too_large(batch.builder.estimated_size))
            return
        q = self._queue(topic, partition)
        open_batch = q.open_batch()
        if open_batch is not None:
            open_batch.closed = True  # records stay in the order they were produced
        q.batches.append(batch)
        self._wakeup.set()

    async def send(
        self,
        topic: str,
        value: str | bytes | None = None,
        key: str | bytes | None = None,
        partition: int | None = None,
        headers: HeadersArg = None,
        timestamp: int | None = None,
    ) -> RecordMetadata:
        """Produce a record and wait for it to be written; raises its delivery error."""
        return await self.produce(topic, value, key, partition, headers, timestamp)

    async def flush(self, timeout: float | None = None) -> int:
        """Send every queued record now and wait for all delivery reports (or ``timeout``
        seconds); returns how many records are still undelivered (0: all done)."""
        if self._pending == 0:
            return 0
        self._flushing += 1
        self._wakeup.set()
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._idle.wait(), timeout)
        finally:
            self._flushing -= 1
        return self._pending

    async def poll(self, timeout: float = 0) -> int:
        """Wait up to ``timeout`` seconds for a delivery; returns how many happened meanwhile.

        Callbacks of this producer run on the event loop as deliveries happen, so ``poll``
        is only a way to wait; it exists to match confluent-kafka's API.
        """
        before = self._delivered
        self._delivered_event.clear()
        if timeout > 0 and self._pending:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._delivered_event.wait(), timeout)
        else:
            await asyncio.sleep(0)
        return self._delivered - before

    async def close(self, timeout: float | None = None) -> int:
        """Flush (up to ``timeout`` seconds), stop the sender and close the connections.

        Records still undelivered then fail with :class:`ProducerClosedError`; returns
        how many did.
        """
        if self._closed:
            return 0
        try:
            remaining = await self.flush(timeout)
        finally:
            # A flush that raised (or was cancelled) still closes the producer and its
            # connections; the error goes on to the caller.
            self._closed = True
            try:
                await self._stop_sending()
            finally:
                await self.cluster.close()
        return remaining

    async def _stop_sending(self) -> None:
        """Stop the sender and the requests in flight; fail the undelivered records."""
        tasks = [t for t in (self._sender, *self._requests) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            if task.done() and not task.cancelled() and task.exception() is not None:
                continue  # the sender's failure was delivered to every record already
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._sender = None
        self._fail_all(
            ProducerClosedError("the producer was closed before the record was delivered")
        )

    async def __aenter__(self) -> AsyncProducer:
        """``async with AsyncProducer(...)``: closes (after flushing) on exit."""
        return self

    async def __aexit__(self, *exc: object) -> None:
        """Close the producer."""
        await self.close()

    # --- accumulating -----------------------------------------------------------------------

    def _ensure_sender(self) -> None:
        """Start the sender task on the running loop, once."""
        if self._sender is None:
            self._sender_loop = asyncio.get_running_loop()
            self._sender = self._sender_loop.create_task(self._run())
            self._sender.add_done_callback(self._on_sender_done)

    def _on_sender_done(self, task: asyncio.Task[None]) -> None:
        """If the sender died of a bug, fail every record instead of leaving them hanging.
        A failed authentication is fatal too, as in Kafka: every record gets that error."""
        if task.cancelled() or task.exception() is None:
            return
        cause = task.exception()
        if isinstance(cause, AuthenticationError):
            log.error("the producer could not authenticate: %s", cause)
            self._fatal = cause
            self._fail_all(cause)
            return
        log.error("the producer's sender failed", exc_info=cause)
        self._fatal = ProducerError(f"the producer's sender failed: {cause!r}")
        self._fail_all(self._fatal)

    def _take_all(self) -> tuple[dict[str, list[WaitingRecord]], list[ProducerBatch]]:
        """Every record not delivered yet, taken out of the queues: the records waiting
        for metadata, by topic, and the batches."""
        waiting = dict(self._waiting)
        self._waiting.clear()
        batches: list[ProducerBatch] = []
        for q in self._queues.values():
            batches.extend(q.in_flight)
            batches.extend(q.batches)
            q.in_flight.clear()
            q.batches.clear()
        return waiting, batches

    def _fail_all(self, error: BaseException) -> None:
        """Deliver ``error`` to every record not delivered yet."""
        waiting, batches = self._take_all()
        for topic, records in waiting.items():
            self._fail_waiting(topic, records, error)
        for batch in batches:
            self._fail_batch(batch, error)

    def _place(
        self,
        topic: str,
        requested: int,
        fields: RecordFields,
        handle: _Handle,
        on_delivery: DeliveryCallback | None,
        info: TopicInfo,
        created: float | None,
    ) -> None:
        """Choose the record's partition and append it to that partition's open batch.

        ``requested`` is the partition produce() named, or -1; ``created`` when the record
        was produced, None for now.
        """
        key = fields[0]
        choice: StickyChoice | None = None
        if 0 <= requested < info.num_partitions:
            partition = requested  # the common explicit case, without choose_partition
            q = self._queue(topic, partition)
        elif requested < 0 and (key is None or self.config.ignore_keys):
            choice = self._sticky_choices.get(topic)
            if choice is not None and choice.info is info:
                partition, q = choice.partition, choice.queue
            else:
                if choice is not None and choice.unreported:  # the metadata changed
                    self._sticky.on_produced(topic, choice.partition, choice.unreported)
                partition = self._choose(topic, requested, key, info, fields, handle, on_delivery)
                if partition < 0:
                    return
                q = self._queue(topic, partition)
                choice = self._sticky_choices[topic] = StickyChoice(
                    info,
                    partition,
                    q,
                    self._sticky.batch_size - self._sticky.produced_bytes(topic),
                )
        else:
            partition = self._choose(topic, requested, key, info, fields, handle, on_delivery)
            if partition < 0:
                return
            q = self._queue(topic, partition)
        batches = q.batches
        batch = batches[-1] if batches else None
        try:
            if batch is None or batch.closed or not (size := append_fields(batch.builder, fields)):
                fresh = self._new_batch(topic, partition, created)
                size = append_fields(fresh.builder, fields)  # the first record always fits
                if fresh.builder.estimated_size > self._max_request_size:
                    raise self._too_large(fresh.builder.estimated_size)
                if batch is not None:
                    batch.closed = True
                    self._wakeup.set()  # the closed batch may go
                elif not self._held_by_answer(q, fresh):
                    self._wakeup.set()  # a new batch: the sender times its linger.ms
                batch = fresh
                batches.append(batch)
        except HighwaterError as e:  # a bad timestamp, a record over max.request.size
            self._fail_one(topic, partition, fields, handle, on_delivery, e)
            return
        if handle is not None:
            handle._batch = batch
            handle._index = len(batch.callbacks)
            if handle._future is not None:  # awaited while it waited for metadata
                batch.waiters.append(handle)
        batch.callbacks.append(on_delivery)
        if on_delivery is not None:
            batch.has_callbacks = True
        if batch.builder.estimated_size >= self._batch_size:
            batch.closed = True
            self._wakeup.set()
        if choice is not None:
            choice.unreported += size
            if choice.unreported >= choice.threshold:
                self._sticky.on_produced(topic, partition, choice.unreported)
                del self._sticky_choices[topic]

    def _held_by_answer(self, q: PartitionQueue, fresh: ProducerBatch) -> bool:
        """Whether ``fresh``, the only batch queued for ``q``'s partition, can go only with
        the answer to a request in flight (:meth:`PartitionQueue.send_delay`'s Nagle rule
        at ``linger.ms`` 0: not full, not flushing, no back-off): then waking the sender
        for it would find nothing to do, and the answer wakes it anyway. At 10,000
        records/s with acks=all that was one sender turn in three."""
        return (
            self.config.linger_ms == 0
            and bool(q.in_flight)
            and not q.retrying
            and fresh.created >= q.backoff_until
            and self._flushing == 0
            and not self._closed
        )

    def _too_large(self, size: int) -> RecordTooLargeError:
        """The error of a record that is ``size`` bytes as a batch of its own, past
        ``max.request.size`` (Kafka's message, with its names)."""
        return RecordTooLargeError(
            f"The message is {size} bytes when serialized which is larger than "
            f"{self._max_request_size}, which is the value of the max.request.size "
            "configuration."
        )

    def _queue(self, topic: str, partition: int) -> PartitionQueue:
        """The queue of a partition's batches, made on first use."""
        q = self._queues.get((topic, partition))
        if q is None:
            q = self._queues[(topic, partition)] = PartitionQueue(topic, partition)
        return q

    def _choose(
        self,
        topic: str,
        requested: int,
        key: bytes | None,
        info: TopicInfo,
        fields: RecordFields,
        handle: _Handle,
        on_delivery: DeliveryCallback | None,
    ) -> int:
        """:func:`choose_partition` for the record; -1 after failing it if there is none."""
        try:
            return choose_partition(
                topic,
                info.num_partitions,
                key,
                requested if requested >= 0 else None,
                info.available_partitions(),
                sticky=self._sticky,
                ignore_keys=self.config.ignore_keys,
            )
        except HighwaterError as e:
            self._fail_one(topic, requested, fields, handle, on_delivery, e)
            return -1

    def _new_batch(self, topic: str, partition: int, created: float | None) -> ProducerBatch:
        """An empty open batch for ``topic``-``partition``; ``created`` as in :meth:`_place`."""
        builder = RecordBatchBuilder(
            max_bytes=self._batch_size,
            compression=self.config.compression,
            compression_level=self.config.compression_level,
        )
        loop = self._sender_loop or asyncio.get_running_loop()
        now = loop.time()
        return ProducerBatch(topic, partition, builder, now, now if created is None else created)

    # --- delivering -------------------------------------------------------------------------

    def _delivered_some(self, count: int) -> None:
        """Count ``count`` delivery reports, made (and taken off ``_pending``) just before."""
        self._delivered += count
        self._delivered_event.set()
        if self._pending == 0:
            self._idle.set()

    def _report_error(
        self,
        topic: str,
        partition: int,
        fields: RecordFields,
        handle: _Handle,
        on_delivery: DeliveryCallback | None,
        error: BaseException,
    ) -> None:
        """Fail one record's handle and call its callback with ``error``; the producer's
        ``on_delivery_batch`` gets it as a batch of one (it never reached a batch), so a
        caller who counts batch reports accounts for every record."""
        self._pending -= 1
        if handle is not None:
            handle._fail(error)
        if on_delivery is not None:
            key, value, headers, timestamp = fields
            message = Message(topic, partition, key, value, headers, timestamp, -1, error)
            try:
                on_delivery(error, message)
            except Exception:
                log.exception("a delivery callback of %s raised", message)
        if self._on_delivery_batch is not None:
            metadata = BatchMetadata(topic, partition, -1, 1, fields[3], TIMESTAMP_CREATE_TIME)
            try:
                self._on_delivery_batch(error, metadata)
            except Exception:
                log.exception("a batch delivery callback of %s raised", metadata)

    def _fail_one(
        self,
        topic: str,
        partition: int,
        fields: RecordFields,
        handle: _Handle,
        on_delivery: DeliveryCallback | None,
        error: BaseException,
    ) -> None:
        """Deliver ``error`` to one record."""
        self._report_error(topic, partition, fields, handle, on_delivery, error)
        self._delivered_some(1)

    def _fail_waiting(self, topic: str, records: list[WaitingRecord], error: BaseException) -> None:
        """Deliver ``error`` to records that waited for metadata."""
        for pending in records:
            self._report_error(
                topic, pending.partition, pending.fields, pending.handle, pending.on_delivery, error
            )
        self._delivered_some(len(records))

    def _fail_batch(self, batch: ProducerBatch, error: BaseException) -> None:
        """Deliver ``error`` to every record of ``batch``."""
        self._pending -= batch.count
        batch.settle(-1, -1, error)
        self._report_batch(batch, error, -1, -1, TIMESTAMP_CREATE_TIME)
        if batch.has_callbacks:
            topic, partition = batch.topic, batch.partition
            for (key, value, headers, timestamp), on_delivery in zip(
                batch.builder.records, batch.callbacks, strict=True
            ):
                if on_delivery is not None:
                    message = Message(topic, partition, key, value, headers, timestamp, -1, error)
                    try:
                        on_delivery(error, message)
                    except Exception:
                        log.exception("a delivery callback of %s raised", message)
        self._delivered_some(batch.count)

    def _report_batch(
        self,
        batch: ProducerBatch,
        error: BaseException | None,
        offset: int,
        timestamp: int,
        timestamp_type: int,
    ) -> None:
        """Call the batch's ``on_delivery_batch``, if it has one: a columnar batch's own,
        else the producer's."""
        report = batch.report if batch.columnar else self._on_delivery_batch
        if report is None:
            return
        metadata = BatchMetadata(
            batch.topic, batch.partition, offset, batch.count, timestamp, timestamp_type
        )
        try:
            report(error, metadata)
        except Exception:
            log.exception("a batch delivery callback of %s raised", metadata)

    def _message_factory(
        self, topic: str, partition: int, timestamp_type: int
    ) -> Callable[..., Message]:
        """What makes the delivery reports' messages of a partition (made once, kept)."""
        key = (topic, partition, timestamp_type)
        make = self._message_factories.get(key)
        if make is None:
            make = self._message_factories[key] = message_factory(*key)
        return make

    def _succeed(self, batch: ProducerBatch, base_offset: int, log_append_time: int) -> None:
        """Deliver a written batch's records with their offsets.

        The outcome is set once on the batch (the records' handles read theirs from it);
        only the futures made before it and the delivery callbacks cost a step per record,
        and the callbacks' messages are made here, not before.
        """
        topic, partition = batch.topic, batch.partition
        timestamp_type = TIMESTAMP_CREATE_TIME if log_append_time < 0 else TIMESTAMP_LOG_APPEND_TIME
        offset = base_offset if base_offset >= 0 else -1
        step = 1 if base_offset >= 0 else 0
        self._metrics.sent(topic, batch.count)
        # The batch's records are no longer pending once it is written, before any callback
        # runs (one may look at len(producer)), as with confluent-kafka.
        self._pending -= batch.count
        appended = log_append_time >= 0
        batch.settle(offset, log_append_time, None)
        first_timestamp = log_append_time if appended else batch.builder.base_timestamp
        assert first_timestamp is not None
        self._report_batch(batch, None, offset, first_timestamp, timestamp_type)
        if not batch.has_callbacks:
            self._delivered_some(batch.count)
            return
        make_message = self._message_factory(topic, partition, timestamp_type)
        if _deliver_records is not None:  # the loop below, in C
            start = 0
            append_time = log_append_time if appended else -1
            while failed := _deliver_records(
                batch.builder.records,
                batch.callbacks,
                make_message,
                offset,
                step,
                append_time,
                start,
            ):
                index, error, message = failed
                if not isinstance(error, Exception):
                    raise error
                log.error("a delivery callback of %s raised", message, exc_info=error)
                start = index + 1
            self._delivered_some(batch.count)
            return
        for (key, value, headers, timestamp), on_delivery in zip(
            batch.builder.records, batch.callbacks, strict=True
        ):
            if appended:
                timestamp = log_append_time
            if on_delivery is not None:
                message = make_message(key, value, headers, timestamp, offset)
                try:
                    on_delivery(None, message)
                except Exception:
                    log.exception("a delivery callback of %s raised", message)
            offset += step
        self._delivered_some(batch.count)

    # --- the sender -------------------------------------------------------------------------

    async def _run(self) -> None:
        """The sender: fetch metadata, drain ready batches, send them; until cancelled."""
        loop = asyncio.get_running_loop()
        while True:
            self._wakeup.clear()
            now = loop.time()
            self._expire(now)
            await self._update_metadata(now)
            if self.config.enable_idempotence and self._producer_id < 0 and self._has_batches():
                await self._init_producer_id()
            now = loop.time()
            wait = self._drain(now)
            if wait is None:
                # Nothing to time: only a wake-up (a record, an answer) changes anything.
                await self._wakeup.wait()
            elif wait > 0:
                # asyncio.timeout, not wait_for: no task per wait on the way to each send.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(wait):
                        await self._wakeup.wait()

    def _has_batches(self) -> bool:
        """Whether any partition has a queued batch."""
        return any(q.batches for q in self._queues.values())

    async def _init_producer_id(self) -> None:
        """Get a producer id and epoch (InitProducerId), retrying after a back-off."""
        candidates = list(
            dict.fromkeys([*self.cluster.brokers.values(), *self.config.bootstrap_servers])
        )
        for address in candidates:
            try:
                reply: pb.InitProducerIdResponse = await self.cluster.stub(address).InitProducerId(
                    pb.InitProducerIdRequest(),
                    timeout=self.config.request_timeout_ms / 1000,
                )
            except grpc.aio.AioRpcError as e:
                log.warning("InitProducerId to %s failed: %s", address, e.code())
                continue
            if reply.error == ErrorCode.NONE:
                self._producer_id = reply.producer_id
                self._producer_epoch = reply.producer_epoch
                return
            if reply.error == ErrorCode.CLUSTER_AUTHORIZATION_FAILED:
                # Not retriable: this principal may not write idempotently (Kafka fails
                # the queued batches with ClusterAuthorizationException the same way).
                refused = ProduceAuthorizationError(
                    ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                    "InitProducerId: CLUSTER_AUTHORIZATION_FAILED: this principal may not "
                    "write idempotently (IDEMPOTENT_WRITE on the cluster, or WRITE on a topic)",
                )
                for queue in self._queues.values():
                    while queue.batches:
                        self._fail_batch(queue.batches.popleft(), refused)
                return
            log.warning("InitProducerId answered %s", ErrorCode.Name(reply.error))
        await asyncio.sleep(self.config.retry_backoff_ms / 1000)

    async def _update_metadata(self, now: float) -> None:
        """Refresh the topics records wait for and those with stale leaders; place records."""
        stale = {t for t in self.cluster.stale_topics() if any(k[0] == t for k in self._queues)}
        topics = set(self._waiting) | stale
        if not topics:
            return
        backoff = self.config.retry_backoff_ms / 1000
        if now - self._last_refresh < backoff:
            self._wakeup_later(self._last_refresh + backoff - now)
            return
        self._last_refresh = now
        try:
            await self.cluster.refresh(topics)
        except ClusterError as e:
            log.warning("metadata refresh failed: %s", e)
            self._wakeup_later(backoff)
            return
        for topic in list(self._waiting):
            if self.cluster.is_unknown(topic):
                # Not (yet) in the metadata: the records wait, and the metadata is asked
                # again after retry.backoff.ms, until the propagation window passes
                # (:meth:`_expire`).
                self._wakeup_later(backoff)
                continue
            if topic in self.cluster.unauthorized:
                self._fail_waiting(
                    topic,
                    self._waiting.pop(topic),
                    ProduceAuthorizationError(
                        ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                        f"topic {topic!r}: TOPIC_AUTHORIZATION_FAILED: not authorized",
                    ),
                )
                continue
            info = self.cluster.topic(topic)
            if info is None:
                continue
            for pending in self._waiting.pop(topic):
                self._place(
                    topic,
                    pending.partition,
                    pending.fields,
                    pending.handle,
                    pending.on_delivery,
                    info,
                    pending.created,
                )

    def _wakeup_later(self, delay: float) -> None:
        """Wake the sender after ``delay`` seconds."""
        asyncio.get_running_loop().call_later(max(delay, 0.0), self._wakeup.set)

    def _expire(self, now: float) -> None:
        """Fail records and queued batches older than ``delivery.timeout.ms``, and records
        of a topic the metadata does not name after ``topic.metadata.propagation.max.ms``.

        A topic just created may not be in every broker's metadata yet, so a record for
        one the metadata does not name waits for it, as librdkafka's records do for
        ``topic.metadata.propagation.max.ms`` (Kafka's producer waits ``max.block.ms``
        in ``send()``), and fails with UNKNOWN_TOPIC_OR_PARTITION after that, or after
        ``delivery.timeout.ms`` if that is shorter."""
        timeout_s = self.config.delivery_timeout_ms / 1000
        unknown_s = min(self.config.topic_metadata_propagation_max_ms / 1000, timeout_s)
        for topic, waiting in list(self._waiting.items()):
            if self.cluster.is_unknown(topic):
                expired = [p for p in waiting if p.created + unknown_s <= now]
                error: BaseException = UnknownTopicOrPartitionError(
                    f"topic {topic!r} does not exist (not in the metadata after "
                    f"{round(unknown_s * 1000)} ms)"
                )
            else:
                expired = [p for p in waiting if p.created + timeout_s <= now]
                error = DeliveryTimeoutError(
                    f"no metadata for topic {topic!r} within delivery.timeout.ms"
                )
            if expired:
                limit = unknown_s if self.cluster.is_unknown(topic) else timeout_s
                self._waiting[topic] = [p for p in waiting if p.created + limit > now]
                self._fail_waiting(topic, expired, error)
        for q in self._queues.values():
            for batch in q.expired(now, timeout_s):
                q.batches.remove(batch)
                self._give_up(
                    q,
                    batch,
                    DeliveryTimeoutError(
                        f"{batch.count} record(s) for {batch.topic}-{batch.partition} "
                        f"expired: not written within delivery.timeout.ms "
                        f"({self.config.delivery_timeout_ms} ms)"
                    ),
                )

    def _drain(self, now: float) -> float | None:
        """Send every batch that is ready; returns the seconds until the next is (None: idle)."""
        linger = self.config.linger_ms / 1000
        flushing = self._flushing > 0 or self._closed
        wait: float | None = None
        requests: dict[str, list[ProducerBatch]] = {}

        def wake_in(delay: float) -> None:
            nonlocal wait
            wait = delay if wait is None else min(wait, delay)

        max_in_flight = self.config.max_in_flight
        more = False
        for q in self._queues.values():
            if not q.batches:
                continue
            delay = q.send_delay(now, linger, flushing, max_in_flight)
            if delay != 0.0:
                if delay is not None:
                    wake_in(delay)
                continue
            head = q.batches[0]
            if self.config.enable_idempotence and self._producer_id < 0:
                wake_in(self.config.retry_backoff_ms / 1000)
                continue
            if q.restart_pending and q.restart_due() and not self._restart_sequences(q):
                wake_in(self.config.retry_backoff_ms / 1000)
                continue
            try:
                address = self.cluster.leader_address(q.topic, q.partition)
            except ClusterError:
                self.cluster.invalidate(q.topic, q.partition)
                wake_in(self.config.retry_backoff_ms / 1000)
                continue
            throttled = self.cluster.throttles.remaining(address, now)
            if throttled > 0:  # the broker throttled us: the batches wait (and grow)
                wake_in(throttled)
                continue
            q.batches.popleft()
            head.closed = True
            self._seal(q, head)
            q.in_flight.append(head)
            requests.setdefault(address, []).append(head)
            more = more or bool(q.batches)
        loop = self._sender_loop
        assert loop is not None
        for address, batches in requests.items():
            for carried in split_requests(batches, self._max_request_size):
                task = loop.create_task(self._send(address, carried))
                self._requests.add(task)
                task.add_done_callback(self._requests.discard)
        # A queue drains one batch a turn: one that holds more is looked at again at once.
        # One that holds none has nothing the next turn could send before a wake-up (a new
        # record's batch, an answer) or the ``wait`` of the others: no turn for nothing.
        if more:
            return 0.0
        return wait

    def _seal(self, q: PartitionQueue, batch: ProducerBatch) -> None:
        """Build the batch's bytes, with the partition's next sequence when idempotent."""
        if batch.data is not None:
            return
        if self.config.enable_idempotence:
            if q.producer_id < 0:
                q.producer_id, q.producer_epoch = self._producer_id, self._producer_epoch
            batch.base_sequence = q.next_sequence
            q.next_sequence = (q.next_sequence + batch.count) % SEQUENCE_MODULUS
            batch.builder.set_producer_state(q.producer_id, q.producer_epoch, batch.base_sequence)
        batch.data = batch.builder.build()

    async def _send(self, address: str, batches: list[ProducerBatch]) -> None:
        """Send one Produce request to ``address`` and handle each partition's answer."""
        cfg = self.config
        for batch in batches:
            batch.attempts += 1
            batch.sequence_refused = False
        request = create_produce_request(batches, cfg.acks, cfg.request_timeout_ms)
        try:
            reply = await self.cluster.produce(address, request, cfg.request_timeout_ms / 1000)
        except grpc.aio.AioRpcError as e:
            error, retriable = request_failure(address, e)
            for batch in batches:
                self.cluster.invalidate(batch.topic, batch.partition)
                self._on_failure(batch, error, retriable=retriable)
            self._wakeup.set()
            return
        except ClusterError as e:  # closed underneath us
            for batch in batches:
                self._on_failure(batch, e, retriable=False)
            return
        answers = answers_by_partition(reply)
        for batch in batches:
            q = self._queues[(batch.topic, batch.partition)]
            answer = answers.get((batch.topic, batch.partition))
            if answer is None:
                if cfg.acks == 0:
                    q.acknowledge(batch)
                    self._succeed(batch, -1, -1)
                else:
                    self._on_failure(
                        batch,
                        ProduceError(ErrorCode.UNKNOWN_SERVER_ERROR, "no answer for the batch"),
                        retriable=True,
                    )
                continue
            code = answer.error
            if code in _WRITTEN:
                q.acknowledge(batch)
                self._succeed(batch, answer.base_offset, answer.log_append_time_ms)
                continue
            self.cluster.handle_error(batch.topic, batch.partition, code)
            batch.sequence_refused = code in SEQUENCE_ERRORS
            if code == ErrorCode.UNKNOWN_PRODUCER_ID and batch.base_sequence is not None:
                # The broker lost this producer's state of the partition (the records it
                # held went: DeleteRecords, retention, the topic created again): the
                # batch is not in the log. Its sequences start again from 0 under the
                # next epoch and it is sent again, as Kafka's idempotent producer bumps
                # the epoch (TransactionManager.canRetry); the caller sees nothing.
                q.restart_pending = True
            retriable = is_retriable_answer(code, batch, q)
            self._on_failure(batch, answer_error(batch, answer), retriable=retriable)
        self._wakeup.set()

    def _on_failure(self, batch: ProducerBatch, error: BaseException, *, retriable: bool) -> None:
        """Resend a batch that failed with a retriable error, else deliver ``error``."""
        q = self._queues[(batch.topic, batch.partition)]
        if batch in q.in_flight:
            q.in_flight.remove(batch)
        if self._closed:
            return
        now = asyncio.get_running_loop().time()
        expired = batch.deadline(self.config.delivery_timeout_ms / 1000) <= now
        if retriable and batch.attempts <= self.config.retries and not expired:
            log.info("retrying %s-%s: %s", batch.topic, batch.partition, error)
            q.requeue(batch)
            q.retrying = q.retrying or batch.base_sequence is not None
            q.backoff_until = now + self.config.retry_backoff_ms / 1000
            return
        if retriable and expired:
            error = DeliveryTimeoutError(f"delivery.timeout.ms passed; last error: {error}")
        self._give_up(q, batch, error)

    def _give_up(self, q: PartitionQueue, batch: ProducerBatch, error: BaseException) -> None:
        """Deliver ``error`` to a batch's records. Had it been sent, the partition's
        sequences start again under a new epoch (:meth:`PartitionQueue.restart_due`):
        it may be in the log although it failed."""
        if batch.base_sequence is not None:
            q.restart_pending = True
            q.retrying = True  # one batch at a time until the restart
            self._wakeup.set()
        self._fail_batch(batch, error)

    def _restart_sequences(self, q: PartitionQueue) -> bool:
        """Start the partition's sequences again (:meth:`PartitionQueue.restart_sequences`)
        under the next epoch of its producer id, or under the producer's id if that
        changed since; False while a new producer id is needed first. An id whose epochs
        are used up is replaced by a new one from InitProducerId, as Kafka's producer
        does."""
        if q.producer_id != self._producer_id:
            q.restart_sequences(self._producer_id, self._producer_epoch)
        elif q.producer_epoch < MAX_PRODUCER_EPOCH:
            q.restart_sequences(q.producer_id, q.producer_epoch + 1)
        else:
            self._producer_id = self._producer_epoch = -1
            return False
        log.info(
            "%s-%s: sequences start again at 0 under producer %d epoch %d",
            q.topic,
            q.partition,
            q.producer_id,
            q.producer_epoch,
        )
        return True


# --- The blocking producer --------------------------------------------------------------

_T = TypeVar("_T")
_FLUSH_DONE: Final = object()


_Handover: TypeAlias = tuple[
    str,
    bytes | None,
    bytes | None,
    int | None,
    list[tuple[str, bytes | None]] | None,
    int | None,
    DeliveryCallback | None,
]
"""A record :meth:`Producer.produce` queued for the loop: the arguments of
:meth:`AsyncProducer.produce`, checked and converted."""


class Producer:
    """A blocking producer, confluent-kafka's ``Producer``: safe to use from plain sync code.

    An :class:`AsyncProducer` runs on an event loop in a daemon thread. :meth:`produce`
    checks the record and queues it without waiting for that thread: records produced
    while the loop is busy are handed over together, in order, on its next turn. Delivery
    callbacks are queued and run in the caller's thread by :meth:`poll` and :meth:`flush`,
    as in confluent-kafka; call ``poll(0)`` regularly, or ``flush()`` at the end.
    """

    def __init__(
        self, config: Mapping[str, Any], *, on_delivery_batch: BatchDeliveryCallback | None = None
    ) -> None:
        """Validate ``config`` (raising :class:`InvalidConfigError`) and start the thread.

        ``on_delivery_batch(err, batch)``: a report per batch of :meth:`produce`'s records
        (see :class:`AsyncProducer`), run by :meth:`poll` and :meth:`flush` as the
        callbacks are."""
        ProducerConfig.parse(config)
        self._callbacks: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._handover_lock = threading.Lock()
        self._handover: list[_Handover] = []
        """Records :meth:`produce` queued that the loop has not taken yet."""
        self._loop_thread = LoopThread("highwater-producer")
        self._closed = False
        forward = (
            None
            if on_delivery_batch is None
            else functools.partial(self._forward, on_delivery_batch)
        )
        self._producer: AsyncProducer = self._call(self._create(dict(config), forward))

    @staticmethod
    async def _create(
        config: dict[str, Any], on_delivery_batch: BatchDeliveryCallback | None
    ) -> AsyncProducer:
        """Build the async producer on the background loop (its events belong to it)."""
        return AsyncProducer(config, on_delivery_batch=on_delivery_batch)

    def _call(self, coro: Coroutine[Any, Any, _T], timeout: float | None = None) -> _T:
        """Run ``coro`` on the background loop and wait for its result."""
        return self._loop_thread.run(coro, timeout)

    def __len__(self) -> int:
        """How many records await their delivery report (callbacks not yet served included)."""
        return len(self._producer) + len(self._handover) + self._callbacks.qsize()

    def produce(
        self,
        topic: str,
        value: str | bytes | None = None,
        key: str | bytes | None = None,
        partition: int | None = None,
        headers: HeadersArg = None,
        timestamp: int | None = None,
        on_delivery: DeliveryCallback | None = None,
        callback: DeliveryCallback | None = None,
    ) -> None:
        """Queue a record (see :meth:`AsyncProducer.produce`); ``callback`` is an alias of
        ``on_delivery``. The callback runs in the thread that calls :meth:`poll`/:meth:`flush`.
        """
        if self._closed:
            raise ProducerClosedError("the producer is closed")
        if not isinstance(topic, str) or not topic:
            raise TypeError("topic must be a non-empty str")
        if timestamp is not None and timestamp < 0:
            raise ValueError(_negative_timestamp(timestamp))
        if value is not None and type(value) is not bytes:
            value = to_bytes(value, "value")
        if key is not None and type(key) is not bytes:
            key = to_bytes(key, "key")
        record_headers = headers_list(headers) if headers is not None else None
        record = (topic, value, key, partition, record_headers, timestamp, on_delivery or callback)
        with self._handover_lock:
            self._handover.append(record)
            first = len(self._handover) == 1
        if first:
            self._loop_thread.call_soon(self._take_handover)

    def _take_handover(self) -> None:
        """On the loop: give the queued records to the async producer, in order."""
        with self._handover_lock:
            records, self._handover = self._handover, []
        lane = self._producer._lane
        for topic, value, key, partition, headers, timestamp, report in records:
            forward = None if report is None else functools.partial(self._forward, report)
            if (
                lane is not None
                and lane.place(topic, value, key, partition, headers, timestamp, forward)
                is not None
            ):
                continue
            try:
                self._producer._enqueue(
                    topic, value, key, partition, headers, timestamp, forward, None
                )
            except HighwaterError as e:  # closed while the record waited: report it
                if report is not None:
                    message = Message(topic, -1, key, value, headers or [], timestamp or 0, -1, e)
                    self._callbacks.put((report, e, message))

    def produce_batch(
        self,
        topic: str,
        records: RecordsArg,
        *,
        partition: int | None = None,
        timestamp: int | None = None,
        on_delivery_batch: BatchDeliveryCallback | None = None,
    ) -> int:
        """Queue many records given as columns (see :meth:`AsyncProducer.produce_batch`);
        returns how many were queued. ``on_delivery_batch(err, batch)`` runs, once per
        batch, in the thread that calls :meth:`poll`/:meth:`flush`."""
        if self._closed:
            raise ProducerClosedError("the producer is closed")
        forward = (
            None
            if on_delivery_batch is None
            else functools.partial(self._forward, on_delivery_batch)
        )

        async def queue_all() -> int:
            self._take_handover()  # the records produce() queued before go first
            return await self._producer.produce_batch(
                topic, records, partition=partition, timestamp=timestamp, on_delivery_batch=forward
            )

        return self._call(queue_all())

    def _forward(self, report: Callable[..., object], err: BaseException | None, msg: Any) -> None:
        self._callbacks.put((report, err, msg))

    def poll(self, timeout: float | None = 0) -> int:
        """Serve queued delivery callbacks, waiting up to ``timeout`` seconds (None: until
        one arrives) for the first; returns how many were served."""
        served = 0
        try:
            item = self._callbacks.get(timeout=timeout) if timeout != 0 else None
        except queue.Empty:
            return 0
        while True:
            if item is not None and item is not _FLUSH_DONE:
                callback, err, msg = item
                callback(err, msg)
                served += 1
            try:
                item = self._callbacks.get_nowait()
            except queue.Empty:
                return served

    def flush(self, timeout: float | None = None) -> int:
        """Send everything queued and serve callbacks until every record is delivered or
        ``timeout`` seconds passed; returns how many records are still undelivered."""
        if self._closed:
            return 0

        async def flush_all() -> int:
            self._take_handover()
            return await self._producer.flush(timeout)

        future = self._loop_thread.submit(flush_all())
        future.add_done_callback(lambda _: self._callbacks.put(_FLUSH_DONE))
        while True:
            item = self._callbacks.get()
            if item is _FLUSH_DONE:
                break
            callback, err, msg = item
            callback(err, msg)
        self.poll(0)
        return future.result()

    def close(self, timeout: float | None = None) -> int:
        """Flush (up to ``timeout`` seconds), close the producer and stop the thread;
        returns how many records failed undelivered."""
        if self._closed:
            return 0
        try:
            remaining = self.flush(timeout)
        finally:
            self._closed = True
            try:
                self._call(self._producer.close(0))
                self.poll(0)
            finally:
                self._loop_thread.stop()
        return remaining

    def __enter__(self) -> Producer:
        """``with Producer(...)``: closes (after flushing) on exit."""
        return self

    def __exit__(self, *exc: object) -> None:
        """Close the producer."""
        self.close()
