"""The client library's producer: confluent-kafka's ``Producer`` API over Highwater's gRPC broker.

:class:`AsyncProducer` runs on an asyncio event loop; :class:`Producer` is the blocking
wrapper, which runs an :class:`AsyncProducer` on an event loop of its own in a background
thread and serves delivery callbacks from :meth:`Producer.poll` and :meth:`Producer.flush`,
as confluent-kafka does.

How a record travels (Kafka's ``RecordAccumulator`` and ``Sender``):

- :meth:`AsyncProducer.produce` picks the partition (:func:`choose_partition`: the named one,
  else murmur2 of the key over all partitions, else the topic's sticky partition) and appends
  the record to the partition's open batch, a :class:`RecordBatchBuilder` of at most
  ``batch.size`` bytes (a single larger record gets a batch of its own). A topic whose
  metadata is not known yet waits in a side queue until the sender has fetched it.
  ``produce()`` is the per-record cost of the library, so it keeps only the record's
  fields, its future and its callback: the batch is encoded in one pass when it is
  drained, and messages and :class:`RecordMetadata` are made when it is delivered.
- The sender task drains a batch once it is full or ``linger.ms`` passed since it was
  opened (at once during :meth:`~AsyncProducer.flush`), and sends one ``Produce`` request per
  leader broker, holding at most one batch per partition.
- With ``enable.idempotence`` (the default) the producer gets a producer id and epoch from
  ``InitProducerId`` once, and stamps each batch, when it is first drained, with the
  partition's next sequence number. Up to ``max.in.flight.requests.per.connection`` batches
  of a partition are in flight. A batch that fails with a retriable error (a stale leader,
  a timeout, a lost reply) is put back in sequence order and resent with the same sequence,
  one at a time until the partition has caught up; the broker answers a resent batch it
  already holds with the original offset, so nothing is written twice.
- A batch is delivered with an error when it fails for good: a non-retriable error code,
  ``retries`` exhausted, or ``delivery.timeout.ms`` passed since it was opened.

The sender runs on the same event loop as the code that calls ``produce()``: a loop that
queues records without awaiting leaves the sender no turn. Give the loop one every few
hundred records (``await asyncio.sleep(0)``, or ``await producer.poll(0)``): records then
leave while others are queued, and few wait at a time (each waiting record's future is
work for the garbage collector).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import queue
import random
import struct
import threading
import time
from collections import deque
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, NamedTuple, TypeAlias, TypeVar

import grpc
import grpc.aio

from highwater.client.cluster import (
    ClusterError,
    ClusterMetadata,
    TopicInfo,
    UnknownTopicOrPartitionError,
    parse_bootstrap_servers,
)
from highwater.client.loop_thread import LoopThread
from highwater.client.metrics import CLIENT_METRICS
from highwater.client.partitioner import StickyPartitioner, choose_partition
from highwater.config.definition import (
    INT_MAX,
    ConfigDef,
    ConfigKey,
    ConfigType,
    at_least,
    between,
    one_of,
)
from highwater.errors import HighwaterError, InvalidConfigError
from highwater.records import Compression, RecordBatchBuilder
from highwater.records.header import ATTRIBUTES_OFFSET, CRC_OFFSET, crc32c
from highwater.records.record import Header, RecordFields
from highwater.telemetry.configure import tracing_enabled
from highwater.telemetry.messaging import ProducerTracing
from highwater.v1 import broker_pb2 as pb
from highwater.v1.common_pb2 import ErrorCode

__all__ = [
    "PRODUCER_CONFIG_DEF",
    "TIMESTAMP_CREATE_TIME",
    "TIMESTAMP_LOG_APPEND_TIME",
    "AsyncProducer",
    "DeliveryCallback",
    "DeliveryTimeoutError",
    "Message",
    "ProduceError",
    "Producer",
    "ProducerClosedError",
    "ProducerConfig",
    "ProducerError",
    "RecordMetadata",
]

log = logging.getLogger(__name__)

#: confluent-kafka's timestamp types, as :meth:`Message.timestamp` returns them.
TIMESTAMP_CREATE_TIME: Final = 1
TIMESTAMP_LOG_APPEND_TIME: Final = 2

_SEQUENCE_MODULUS: Final = 1 << 31
_PRODUCER_ID_OFFSET: Final = 43
_PRODUCER_STATE = struct.Struct(">qhi")  # producer id, producer epoch, base sequence
_UINT32 = struct.Struct(">I")

# --- Configuration ----------------------------------------------------------------------

PRODUCER_CONFIG_DEF: Final = ConfigDef(
    [
        ConfigKey(
            "bootstrap.servers",
            ConfigType.LIST,
            doc="HOST:PORT pairs of brokers to fetch the cluster's metadata from.",
        ),
        ConfigKey("client.id", ConfigType.STRING, "", doc="A name for this producer in logs."),
        ConfigKey(
            "acks",
            ConfigType.STRING,
            "all",
            one_of("all", "-1", "0", "1"),
            "How many replicas must have a batch before it counts as written: 0 (no answer), "
            "1 (the leader) or all (-1: every in-sync replica).",
        ),
        ConfigKey(
            "linger.ms",
            ConfigType.LONG,
            5,
            at_least(0),
            "How long a batch waits for more records before it is sent.",
        ),
        ConfigKey(
            "batch.size",
            ConfigType.INT,
            16384,
            at_least(1),
            "The most bytes of records (before compression) one batch holds; a single larger "
            "record is sent alone.",
        ),
        ConfigKey(
            "compression.type",
            ConfigType.STRING,
            "none",
            one_of("none", "gzip", "snappy", "lz4", "zstd"),
            "The codec batches are compressed with.",
        ),
        ConfigKey(
            "enable.idempotence",
            ConfigType.BOOLEAN,
            True,
            doc="Stamp batches with a producer id and sequence numbers, so retries never "
            "duplicate or reorder records. Needs acks=all, retries > 0 and at most 5 "
            "in-flight requests.",
        ),
        ConfigKey(
            "max.in.flight.requests.per.connection",
            ConfigType.INT,
            5,
            at_least(1),
            "The most unanswered batches per partition.",
        ),
        ConfigKey(
            "retries",
            ConfigType.INT,
            INT_MAX,
            at_least(0),
            "How many times a batch that failed with a retriable error is sent again "
            "(delivery.timeout.ms bounds the time it may take).",
        ),
        ConfigKey(
            "delivery.timeout.ms",
            ConfigType.INT,
            120000,
            at_least(0),
            "The most time between produce() and the record's delivery report, retries "
            "included; at least linger.ms + request.timeout.ms.",
        ),
        ConfigKey(
            "request.timeout.ms",
            ConfigType.INT,
            30000,
            at_least(0),
            "How long a request waits for its answer before it counts as failed.",
        ),
        ConfigKey(
            "retry.backoff.ms",
            ConfigType.LONG,
            100,
            at_least(0),
            "The wait before a failed batch is sent again.",
        ),
        ConfigKey(
            "partitioner.ignore.keys",
            ConfigType.BOOLEAN,
            False,
            doc="Place keyed records with the sticky partitioner, as if they had no key.",
        ),
        ConfigKey(
            "compression.level",
            ConfigType.INT,
            -1,
            between(-1, 22),
            "The codec's level; -1: the codec's default.",
        ),
    ]
)


@dataclass(frozen=True, slots=True)
class ProducerConfig:
    """A validated producer configuration, typed (durations in milliseconds)."""

    bootstrap_servers: tuple[str, ...]
    client_id: str
    acks: int
    linger_ms: int
    batch_size: int
    compression: Compression
    compression_level: int | None
    enable_idempotence: bool
    max_in_flight: int
    retries: int
    delivery_timeout_ms: int
    request_timeout_ms: int
    retry_backoff_ms: int
    ignore_keys: bool

    @classmethod
    def parse(cls, config: Mapping[str, Any]) -> ProducerConfig:
        """Validate Kafka-named settings; :class:`InvalidConfigError` names the bad key.

        As in Kafka: idempotence set explicitly conflicts with ``acks`` other than all,
        ``retries=0`` or more than 5 in-flight requests (an error); left at its default,
        it is quietly turned off by such settings. ``delivery.timeout.ms`` below
        ``linger.ms + request.timeout.ms`` is an error when set, raised to it otherwise.
        """
        raw = dict(config)
        acks = raw.get("acks")
        if isinstance(acks, int) and not isinstance(acks, bool):
            raw["acks"] = str(acks)
        values = PRODUCER_CONFIG_DEF.parse(raw)
        try:
            servers = parse_bootstrap_servers(values["bootstrap.servers"])
        except ValueError as e:
            raise InvalidConfigError(
                f"Invalid value {raw['bootstrap.servers']!r} for configuration "
                f"bootstrap.servers: {e}"
            ) from None
        acks_value = -1 if values["acks"] == "all" else int(values["acks"])
        idempotent: bool = values["enable.idempotence"]
        explicit_idempotence = "enable.idempotence" in raw and idempotent
        conflicts = []
        if acks_value != -1:
            conflicts.append(f"acks={values['acks']} (must be all)")
        if values["retries"] == 0:
            conflicts.append("retries=0 (must be > 0)")
        if values["max.in.flight.requests.per.connection"] > 5:
            conflicts.append("max.in.flight.requests.per.connection > 5")
        if conflicts and explicit_idempotence:
            raise InvalidConfigError(
                "Invalid configuration enable.idempotence=true: it conflicts with "
                + ", ".join(conflicts)
            )
        if conflicts:
            idempotent = False
        delivery_timeout: int = values["delivery.timeout.ms"]
        floor = values["linger.ms"] + values["request.timeout.ms"]
        if delivery_timeout < floor:
            if "delivery.timeout.ms" in raw:
                raise InvalidConfigError(
                    f"Invalid value {delivery_timeout} for configuration delivery.timeout.ms: "
                    f"it must be at least linger.ms + request.timeout.ms = {floor}"
                )
            delivery_timeout = floor
        level: int = values["compression.level"]
        return cls(
            bootstrap_servers=servers,
            client_id=values["client.id"],
            acks=acks_value,
            linger_ms=values["linger.ms"],
            batch_size=values["batch.size"],
            compression=Compression.parse(values["compression.type"]),
            compression_level=None if level < 0 else level,
            enable_idempotence=idempotent,
            max_in_flight=values["max.in.flight.requests.per.connection"],
            retries=values["retries"],
            delivery_timeout_ms=delivery_timeout,
            request_timeout_ms=values["request.timeout.ms"],
            retry_backoff_ms=values["retry.backoff.ms"],
            ignore_keys=values["partitioner.ignore.keys"],
        )


# --- Errors -----------------------------------------------------------------------------


class ProducerError(HighwaterError):
    """Base of the errors the producer delivers or raises."""


class ProducerClosedError(ProducerError):
    """The producer was closed before the record could be delivered, or is used after close."""


class DeliveryTimeoutError(ProducerError):
    """The record was not acknowledged within ``delivery.timeout.ms``."""

    code = ErrorCode.REQUEST_TIMED_OUT


class ProduceError(ProducerError):
    """The broker refused the record's batch for good; ``code`` is the broker's error code."""

    def __init__(self, code: int, message: str) -> None:
        """An error with the broker's ``code`` and message."""
        super().__init__(message)
        self.code = code


#: Error codes after which a batch is sent again (with the same sequence number).
_RETRIABLE: Final[frozenset[int]] = frozenset(
    {
        ErrorCode.NOT_LEADER_OR_FOLLOWER,
        ErrorCode.FENCED_LEADER_EPOCH,
        ErrorCode.UNKNOWN_LEADER_EPOCH,
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ErrorCode.LEADER_NOT_AVAILABLE,
        ErrorCode.REQUEST_TIMED_OUT,
        ErrorCode.NOT_ENOUGH_REPLICAS,
        ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
        ErrorCode.NETWORK_EXCEPTION,
        ErrorCode.BROKER_NOT_AVAILABLE,
        ErrorCode.REPLICA_NOT_AVAILABLE,
        ErrorCode.KAFKA_STORAGE_ERROR,
        ErrorCode.CORRUPT_MESSAGE,
    }
)
#: Answers that are retriable only when an earlier batch of the partition is still unanswered.
_SEQUENCE_ERRORS: Final[frozenset[int]] = frozenset(
    {ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, ErrorCode.UNKNOWN_PRODUCER_ID}
)
#: Whole-request gRPC failures after which the batches are sent again.
_RETRIABLE_STATUS: Final[frozenset[grpc.StatusCode]] = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNKNOWN,
    }
)


# --- Delivered records ------------------------------------------------------------------


class RecordMetadata(NamedTuple):
    """Where a record was written: what an awaited :meth:`AsyncProducer.produce` returns.

    ``offset`` is -1 with ``acks=0``; ``timestamp`` is the broker's append time when the
    topic uses LogAppendTime, else the record's create time. A named tuple, as
    kafka-python's is: a producer makes one per record, and a tuple is the cheapest to make.
    """

    topic: str
    partition: int
    offset: int
    timestamp: int
    timestamp_type: int = TIMESTAMP_CREATE_TIME


HeaderValue: TypeAlias = str | bytes | None
HeadersArg: TypeAlias = Mapping[str, HeaderValue] | Sequence[tuple[str, HeaderValue]] | None


class Message:
    """A produced record as a delivery callback sees it (confluent-kafka's ``Message``)."""

    __slots__ = (
        "_error",
        "_headers",
        "_key",
        "_offset",
        "_partition",
        "_timestamp",
        "_timestamp_type",
        "_topic",
        "_value",
    )

    def __init__(
        self,
        topic: str,
        partition: int,
        key: bytes | None,
        value: bytes | None,
        headers: Sequence[tuple[str, bytes | None]],
        timestamp: int,
        offset: int = -1,
        error: BaseException | None = None,
        timestamp_type: int = TIMESTAMP_CREATE_TIME,
    ) -> None:
        """A message of ``topic``; ``partition`` -1 until one was chosen."""
        self._topic = topic
        self._partition = partition
        self._key = key
        self._value = value
        self._headers = headers
        self._timestamp = timestamp
        self._offset = offset
        self._error = error
        self._timestamp_type = timestamp_type

    def topic(self) -> str:
        """The topic the record was produced to."""
        return self._topic

    def partition(self) -> int:
        """The partition (-1 if none could be chosen)."""
        return self._partition

    def offset(self) -> int:
        """The record's offset (-1 before delivery, on error, or with ``acks=0``)."""
        return self._offset

    def key(self) -> bytes | None:
        """The record's key, as bytes."""
        return self._key

    def value(self) -> bytes | None:
        """The record's value, as bytes (None: a tombstone)."""
        return self._value

    def headers(self) -> list[tuple[str, bytes | None]] | None:
        """The record's headers, or None when it has none (as confluent-kafka returns them)."""
        return list(self._headers) if self._headers else None

    def timestamp(self) -> tuple[int, int]:
        """``(timestamp type, milliseconds)``, confluent-kafka's form."""
        return (self._timestamp_type, self._timestamp)

    def error(self) -> BaseException | None:
        """The delivery error, or None."""
        return self._error

    def __len__(self) -> int:
        """The value's length in bytes (0 for a tombstone)."""
        return 0 if self._value is None else len(self._value)

    def __repr__(self) -> str:
        """A short description: topic, partition, offset."""
        return f"Message({self._topic}-{self._partition}@{self._offset})"


DeliveryCallback: TypeAlias = Callable[[BaseException | None, Message], object]


# --- Internal state ---------------------------------------------------------------------


_Fields: TypeAlias = RecordFields
"""A record's ``(key, value, headers, timestamp)``, as the batch builder holds it."""
_NO_HEADERS: Final[tuple[Header, ...]] = ()


@dataclass(slots=True)
class _Pending:
    """A record that waits for its topic's metadata before it can go into a batch."""

    partition: int
    """The partition produce() named, or -1."""
    fields: _Fields
    future: asyncio.Future[RecordMetadata]
    on_delivery: DeliveryCallback | None
    created: float
    """When produce() was called (monotonic seconds); delivery.timeout.ms counts from it."""


@dataclass(eq=False, slots=True)
class _Batch:
    """Records of one partition on their way: first open, then built and sent.

    The builder holds each record's ``(key, value, headers, timestamp)`` and encodes them
    all when the batch is sealed; ``futures`` and ``callbacks`` hold, at the same index,
    where its delivery report goes. Nothing else exists per record until the report is
    delivered: a producer may hold hundreds of thousands of records, and every object
    kept per record adds to the garbage collector's work.
    """

    topic: str
    partition: int
    builder: RecordBatchBuilder
    created: float
    """When the batch was opened: linger.ms counts from it."""
    first_created: float
    """When its first record was produced: delivery.timeout.ms counts from it."""
    futures: list[asyncio.Future[RecordMetadata]] = field(default_factory=list)
    callbacks: list[DeliveryCallback | None] = field(default_factory=list)
    closed: bool = False
    data: bytes | None = None
    base_sequence: int | None = None
    attempts: int = 0

    @property
    def count(self) -> int:
        """How many records the batch holds."""
        return len(self.futures)

    def deadline(self, delivery_timeout_s: float) -> float:
        """When the batch expires: delivery.timeout.ms after its first record."""
        return self.first_created + delivery_timeout_s


@dataclass(eq=False, slots=True)
class _StickyChoice:
    """The sticky partitioner's partition for a topic's records, reused without asking it.

    The partitioner answers the same partition until the bytes it is told of reach
    ``batch.size`` (it then switches), or the metadata changes (a :class:`TopicInfo` is
    replaced, never mutated). Asking it and reporting each record costs more than the rest
    of ``produce()``, so the producer counts the bytes itself and reports them in one
    :meth:`~StickyPartitioner.on_produced` call when they reach the switch, then forgets
    the choice: the partitioner switches at the very record it would have switched at.
    """

    info: TopicInfo
    """The metadata the partition was chosen with."""
    partition: int
    queue: _PartitionQueue
    """The partition's queue (queues are kept for the producer's life)."""
    threshold: int
    """The bytes that make the partitioner switch (``batch.size`` minus what it counted)."""
    unreported: int = 0
    """Bytes appended to the partition and not reported to the partitioner yet."""


@dataclass(slots=True)
class _PartitionQueue:
    """One partition's queued and in-flight batches and its sequence numbers."""

    topic: str
    partition: int
    batches: deque[_Batch] = field(default_factory=deque)
    in_flight: list[_Batch] = field(default_factory=list)
    next_sequence: int = 0
    """The sequence the next newly drained batch gets."""
    acked_sequence: int = 0
    """The sequence after the last acknowledged batch: the one the broker expects next."""
    retrying: bool = False
    """A batch is being resent: send one at a time, nothing new, until caught up."""
    backoff_until: float = 0.0

    def open_batch(self) -> _Batch | None:
        """The batch new records go into, if one is open."""
        if self.batches and not self.batches[-1].closed:
            return self.batches[-1]
        return None

    def requeue(self, batch: _Batch) -> None:
        """Put a sent batch back, before the unsent ones, in sequence order."""
        index = 0
        while index < len(self.batches):
            other = self.batches[index]
            if other.base_sequence is None or (
                batch.base_sequence is not None and other.base_sequence > batch.base_sequence
            ):
                break
            index += 1
        self.batches.insert(index, batch)

    def has_sequenced_queued(self) -> bool:
        """Whether a batch that was sent before waits in the queue."""
        return any(b.base_sequence is not None for b in self.batches)


# RecordMetadata(...) handles keywords and defaults; a producer makes one per record, so
# _succeed makes them as tuples of the class directly.
_new_tuple = tuple.__new__


def _to_bytes(value: str | bytes | bytearray | memoryview | None, what: str) -> bytes | None:
    """A key, value or header value as bytes (str as UTF-8), like confluent-kafka."""
    if value is None:
        return None
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    raise TypeError(f"{what} must be str, bytes or None, not {type(value).__name__}")


def _headers_list(headers: HeadersArg) -> list[tuple[str, bytes | None]]:
    """Headers given as a dict or a list of pairs, as a list of (str, bytes | None)."""
    if headers is None:
        return []
    items: Iterable[tuple[str, HeaderValue]] = (
        headers.items() if isinstance(headers, Mapping) else headers
    )
    result: list[tuple[str, bytes | None]] = []
    for key, value in items:
        if not isinstance(key, str):
            raise TypeError(f"header keys must be str, not {type(key).__name__}")
        result.append((key, _to_bytes(value, f"header {key!r}")))
    return result


def _restamp(data: bytes, producer_id: int, producer_epoch: int, base_sequence: int) -> bytes:
    """The batch ``data`` with new producer fields and its CRC recomputed."""
    buf = bytearray(data)
    _PRODUCER_STATE.pack_into(buf, _PRODUCER_ID_OFFSET, producer_id, producer_epoch, base_sequence)
    with memoryview(buf) as view:
        _UINT32.pack_into(buf, CRC_OFFSET, crc32c(view[ATTRIBUTES_OFFSET:]))
    return bytes(buf)


_time_ns = time.time_ns


def _consume_exception(future: asyncio.Future[RecordMetadata]) -> None:
    """Mark a failed future's exception as seen: callbacks already reported it."""
    if not future.cancelled():
        future.exception()


# --- The asyncio producer ---------------------------------------------------------------


class AsyncProducer:
    """A Kafka producer for asyncio (see the module docstring).

    ``produce`` must be called on the event loop the producer runs on (the first call
    starts the sender there). Delivery callbacks run on that loop.
    """

    def __init__(self, config: Mapping[str, Any], *, rng: random.Random | None = None) -> None:
        """Validate ``config`` (Kafka's producer settings); nothing connects yet."""
        self.config = ProducerConfig.parse(config)
        cfg = self.config
        self.cluster = ClusterMetadata(
            cfg.bootstrap_servers, request_timeout_s=cfg.request_timeout_ms / 1000
        )
        self._topics = self.cluster.topics
        self._batch_size = cfg.batch_size
        self._sticky = StickyPartitioner(cfg.batch_size, rng=rng)
        self._sticky_choices: dict[str, _StickyChoice] = {}
        self._queues: dict[tuple[str, int], _PartitionQueue] = {}
        self._waiting: dict[str, list[_Pending]] = {}
        self._pending = 0
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

    def produce(
        self,
        topic: str,
        value: str | bytes | None = None,
        key: str | bytes | None = None,
        partition: int | None = None,
        headers: HeadersArg = None,
        timestamp: int | None = None,
        on_delivery: DeliveryCallback | None = None,
    ) -> asyncio.Future[RecordMetadata]:
        """Queue a record; returns a future of its :class:`RecordMetadata`.

        ``partition`` None (or -1) lets the partitioner choose; ``timestamp`` None (or 0)
        means now. ``on_delivery(err, msg)`` is called once the record is written (``err``
        None) or failed for good. Raises :class:`ProducerClosedError` after :meth:`close`
        and TypeError for keys or values that are not str or bytes.
        """
        if self._closed:
            raise ProducerClosedError("the producer is closed")
        if not isinstance(topic, str) or not topic:
            raise TypeError("topic must be a non-empty str")
        # Plain bytes (or None) need no conversion: test for them before calling _to_bytes.
        if value is not None and type(value) is not bytes:
            value = _to_bytes(value, "value")
        if key is not None and type(key) is not bytes:
            key = _to_bytes(key, "key")
        # The sender's loop once it runs (asking for the running loop costs more than the
        # future): produce() is called on that loop.
        loop = self._sender_loop or asyncio.get_running_loop()
        future: asyncio.Future[RecordMetadata] = asyncio.Future(loop=loop)
        record_headers = _headers_list(headers) if headers is not None else _NO_HEADERS
        if self._tracing is not None:
            span, record_headers = self._tracing.start_send(topic, partition, record_headers)
            if span.is_recording():
                future.add_done_callback(functools.partial(ProducerTracing.end_send, span))
        fields = (key, value, record_headers, timestamp or _time_ns() // 1_000_000)
        self._pending += 1
        if self._pending == 1:
            self._idle.clear()
        if self._sender is None:
            self._ensure_sender()
        requested = -1 if partition is None or partition < 0 else partition
        if self._fatal is not None:
            self._fail_one(topic, requested, fields, future, on_delivery, self._fatal)
            return future
        info = self._topics.get(topic)
        if info is None or topic in self._waiting:
            created = future.get_loop().time()
            pending = _Pending(requested, fields, future, on_delivery, created)
            self._waiting.setdefault(topic, []).append(pending)
            self._wakeup.set()
        else:
            self._place(topic, requested, fields, future, on_delivery, info, None)
        return future

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
        remaining = await self.flush(timeout)
        self._closed = True
        tasks = [t for t in (self._sender, *self._requests) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._sender = None
        self._fail_all(
            ProducerClosedError("the producer was closed before the record was delivered")
        )
        await self.cluster.close()
        return remaining

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
        """If the sender died of a bug, fail every record instead of leaving them hanging."""
        if task.cancelled() or task.exception() is None:
            return
        cause = task.exception()
        log.error("the producer's sender failed", exc_info=cause)
        self._fatal = ProducerError(f"the producer's sender failed: {cause!r}")
        self._fail_all(self._fatal)

    def _take_all(self) -> tuple[dict[str, list[_Pending]], list[_Batch]]:
        """Every record not delivered yet, taken out of the queues: the records waiting
        for metadata, by topic, and the batches."""
        waiting = dict(self._waiting)
        self._waiting.clear()
        batches: list[_Batch] = []
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
        fields: _Fields,
        future: asyncio.Future[RecordMetadata],
        on_delivery: DeliveryCallback | None,
        info: TopicInfo,
        created: float | None,
    ) -> None:
        """Choose the record's partition and append it to that partition's open batch.

        ``requested`` is the partition produce() named, or -1; ``created`` when the record
        was produced, None for now.
        """
        key = fields[0]
        choice: _StickyChoice | None = None
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
                partition = self._choose(topic, requested, key, info, fields, future, on_delivery)
                if partition < 0:
                    return
                q = self._queue(topic, partition)
                choice = self._sticky_choices[topic] = _StickyChoice(
                    info,
                    partition,
                    q,
                    self._sticky.batch_size - self._sticky.produced_bytes(topic),
                )
        else:
            partition = self._choose(topic, requested, key, info, fields, future, on_delivery)
            if partition < 0:
                return
            q = self._queue(topic, partition)
        batches = q.batches
        batch = batches[-1] if batches else None
        try:
            if batch is None or batch.closed or not (size := batch.builder.append_fields(fields)):
                if batch is not None:
                    batch.closed = True
                batch = self._new_batch(topic, partition, created)
                size = batch.builder.append_fields(fields)  # the first record always fits
                batches.append(batch)
                self._wakeup.set()  # a new batch: the sender times its linger.ms
        except HighwaterError as e:  # a record that cannot be encoded (a bad timestamp)
            self._fail_one(topic, partition, fields, future, on_delivery, e)
            return
        batch.futures.append(future)
        batch.callbacks.append(on_delivery)
        if batch.builder.estimated_size >= self._batch_size:
            batch.closed = True
            self._wakeup.set()
        if choice is not None:
            choice.unreported += size
            if choice.unreported >= choice.threshold:
                self._sticky.on_produced(topic, partition, choice.unreported)
                del self._sticky_choices[topic]

    def _queue(self, topic: str, partition: int) -> _PartitionQueue:
        """The queue of a partition's batches, made on first use."""
        q = self._queues.get((topic, partition))
        if q is None:
            q = self._queues[(topic, partition)] = _PartitionQueue(topic, partition)
        return q

    def _choose(
        self,
        topic: str,
        requested: int,
        key: bytes | None,
        info: TopicInfo,
        fields: _Fields,
        future: asyncio.Future[RecordMetadata],
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
            self._fail_one(topic, requested, fields, future, on_delivery, e)
            return -1

    def _new_batch(self, topic: str, partition: int, created: float | None) -> _Batch:
        """An empty open batch for ``topic``-``partition``; ``created`` as in :meth:`_place`."""
        builder = RecordBatchBuilder(
            max_bytes=self.config.batch_size,
            compression=self.config.compression,
            compression_level=self.config.compression_level,
        )
        now = asyncio.get_running_loop().time()
        return _Batch(topic, partition, builder, now, now if created is None else created)

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
        fields: _Fields,
        future: asyncio.Future[RecordMetadata],
        on_delivery: DeliveryCallback | None,
        error: BaseException,
    ) -> None:
        """Fail one record's future and call its callback with ``error``."""
        self._pending -= 1
        if not future.done():
            future.set_exception(error)
            future.add_done_callback(_consume_exception)
        if on_delivery is not None:
            key, value, headers, timestamp = fields
            message = Message(topic, partition, key, value, headers, timestamp, -1, error)
            try:
                on_delivery(error, message)
            except Exception:
                log.exception("a delivery callback of %s raised", message)

    def _fail_one(
        self,
        topic: str,
        partition: int,
        fields: _Fields,
        future: asyncio.Future[RecordMetadata],
        on_delivery: DeliveryCallback | None,
        error: BaseException,
    ) -> None:
        """Deliver ``error`` to one record."""
        self._report_error(topic, partition, fields, future, on_delivery, error)
        self._delivered_some(1)

    def _fail_waiting(self, topic: str, records: list[_Pending], error: BaseException) -> None:
        """Deliver ``error`` to records that waited for metadata."""
        for pending in records:
            self._report_error(
                topic, pending.partition, pending.fields, pending.future, pending.on_delivery, error
            )
        self._delivered_some(len(records))

    def _fail_batch(self, batch: _Batch, error: BaseException) -> None:
        """Deliver ``error`` to every record of ``batch``."""
        for fields, future, on_delivery in zip(
            batch.builder.records, batch.futures, batch.callbacks, strict=True
        ):
            self._report_error(batch.topic, batch.partition, fields, future, on_delivery, error)
        self._delivered_some(batch.count)

    def _succeed(self, batch: _Batch, base_offset: int, log_append_time: int) -> None:
        """Deliver a written batch's records with their offsets.

        One loop per batch, the producer's other per-record cost after produce(): the
        futures' results and the callbacks' messages are made here, not before.
        """
        topic, partition = batch.topic, batch.partition
        timestamp_type = TIMESTAMP_CREATE_TIME if log_append_time < 0 else TIMESTAMP_LOG_APPEND_TIME
        offset = base_offset if base_offset >= 0 else -1
        step = 1 if base_offset >= 0 else 0
        new_tuple, metadata_type = _new_tuple, RecordMetadata
        self._metrics.sent(topic, batch.count)
        # The batch's records are no longer pending once it is written, before any callback
        # runs (one may look at len(producer)), as with confluent-kafka.
        self._pending -= batch.count
        appended = log_append_time >= 0
        for (key, value, headers, timestamp), future, on_delivery in zip(
            batch.builder.records, batch.futures, batch.callbacks, strict=True
        ):
            if appended:
                timestamp = log_append_time
            if not future.done():
                future.set_result(
                    new_tuple(metadata_type, (topic, partition, offset, timestamp, timestamp_type))
                )
            if on_delivery is not None:
                message = Message(
                    topic, partition, key, value, headers, timestamp, offset, None, timestamp_type
                )
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
            if wait is None or wait > 0:
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
                self._fail_waiting(
                    topic,
                    self._waiting.pop(topic),
                    UnknownTopicOrPartitionError(f"topic {topic!r} does not exist"),
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
                    pending.future,
                    pending.on_delivery,
                    info,
                    pending.created,
                )

    def _wakeup_later(self, delay: float) -> None:
        """Wake the sender after ``delay`` seconds."""
        asyncio.get_running_loop().call_later(max(delay, 0.0), self._wakeup.set)

    def _expire(self, now: float) -> None:
        """Fail records and queued batches older than ``delivery.timeout.ms``."""
        timeout_s = self.config.delivery_timeout_ms / 1000
        for topic, waiting in list(self._waiting.items()):
            expired = [p for p in waiting if p.created + timeout_s <= now]
            if expired:
                self._waiting[topic] = [p for p in waiting if p.created + timeout_s > now]
                self._fail_waiting(
                    topic,
                    expired,
                    DeliveryTimeoutError(
                        f"no metadata for topic {topic!r} within delivery.timeout.ms"
                    ),
                )
        for q in self._queues.values():
            for batch in list(q.batches):
                if batch.deadline(timeout_s) <= now:
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
        requests: dict[str, list[_Batch]] = {}

        def wake_in(delay: float) -> None:
            nonlocal wait
            wait = delay if wait is None else min(wait, delay)

        for q in self._queues.values():
            if not q.batches:
                continue
            if q.retrying and not q.has_sequenced_queued() and not q.in_flight:
                q.retrying = False
            if q.retrying and q.in_flight:
                continue
            if len(q.in_flight) >= self.config.max_in_flight:
                continue
            if now < q.backoff_until:
                wake_in(q.backoff_until - now)
                continue
            head = q.batches[0]
            ready_at = head.created + linger
            if not (head.closed or flushing or ready_at <= now):
                wake_in(ready_at - now)
                continue
            if self.config.enable_idempotence and self._producer_id < 0:
                wake_in(self.config.retry_backoff_ms / 1000)
                continue
            try:
                address = self.cluster.leader_address(q.topic, q.partition)
            except ClusterError:
                self.cluster.invalidate(q.topic, q.partition)
                wake_in(self.config.retry_backoff_ms / 1000)
                continue
            q.batches.popleft()
            head.closed = True
            self._seal(q, head)
            q.in_flight.append(head)
            requests.setdefault(address, []).append(head)
        for address, batches in requests.items():
            task = asyncio.get_running_loop().create_task(self._send(address, batches))
            self._requests.add(task)
            task.add_done_callback(self._requests.discard)
        if requests:
            return 0.0
        return wait

    def _seal(self, q: _PartitionQueue, batch: _Batch) -> None:
        """Build the batch's bytes, with the partition's next sequence when idempotent."""
        if batch.data is not None:
            return
        if self.config.enable_idempotence:
            batch.base_sequence = q.next_sequence
            q.next_sequence = (q.next_sequence + batch.count) % _SEQUENCE_MODULUS
            batch.builder.set_producer_state(
                self._producer_id, self._producer_epoch, batch.base_sequence
            )
        batch.data = batch.builder.build()

    async def _send(self, address: str, batches: list[_Batch]) -> None:
        """Send one Produce request to ``address`` and handle each partition's answer."""
        cfg = self.config
        request = pb.ProduceRequest(acks=cfg.acks, timeout_ms=cfg.request_timeout_ms)
        by_topic: dict[str, pb.ProduceTopic] = {}
        for batch in batches:
            batch.attempts += 1
            topic = by_topic.get(batch.topic)
            if topic is None:
                topic = by_topic[batch.topic] = request.topics.add(topic=batch.topic)
            topic.partitions.add(partition=batch.partition, record_batches=batch.data)
        try:
            reply = await self.cluster.produce(address, request, cfg.request_timeout_ms / 1000)
        except grpc.aio.AioRpcError as e:
            code = e.code()
            error = ProduceError(
                ErrorCode.NETWORK_EXCEPTION, f"Produce to {address} failed: {code}: {e.details()}"
            )
            for batch in batches:
                self.cluster.invalidate(batch.topic, batch.partition)
                self._on_failure(batch, error, retriable=code in _RETRIABLE_STATUS)
            self._wakeup.set()
            return
        except ClusterError as e:  # closed underneath us
            for batch in batches:
                self._on_failure(batch, e, retriable=False)
            return
        answers = {(t.topic, p.partition): p for t in reply.topics for p in t.partitions}
        for batch in batches:
            q = self._queues[(batch.topic, batch.partition)]
            answer = answers.get((batch.topic, batch.partition))
            if answer is None:
                if cfg.acks == 0:
                    self._done(q, batch)
                    self._succeed(batch, -1, -1)
                else:
                    self._on_failure(
                        batch,
                        ProduceError(ErrorCode.UNKNOWN_SERVER_ERROR, "no answer for the batch"),
                        retriable=True,
                    )
                continue
            code = answer.error
            if code in (ErrorCode.NONE, ErrorCode.DUPLICATE_SEQUENCE_NUMBER):
                self._done(q, batch)
                self._succeed(batch, answer.base_offset, answer.log_append_time_ms)
                continue
            message = answer.error_message or ErrorCode.Name(code)
            error = ProduceError(
                code, f"{batch.topic}-{batch.partition}: {ErrorCode.Name(code)}: {message}"
            )
            self.cluster.handle_error(batch.topic, batch.partition, code)
            retriable = code in _RETRIABLE or (
                code in _SEQUENCE_ERRORS and (q.retrying or batch.base_sequence != q.acked_sequence)
            )
            self._on_failure(batch, error, retriable=retriable)
        self._wakeup.set()

    def _done(self, q: _PartitionQueue, batch: _Batch) -> None:
        """Take an answered batch out of flight; advance the acknowledged sequence."""
        if batch in q.in_flight:
            q.in_flight.remove(batch)
        if batch.base_sequence is not None:
            end = (batch.base_sequence + batch.count) % _SEQUENCE_MODULUS
            # A resent batch may be answered after later ones: never move backwards.
            if (end - q.acked_sequence) % _SEQUENCE_MODULUS < _SEQUENCE_MODULUS // 2:
                q.acked_sequence = end

    def _on_failure(self, batch: _Batch, error: BaseException, *, retriable: bool) -> None:
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

    def _give_up(self, q: _PartitionQueue, batch: _Batch, error: BaseException) -> None:
        """Deliver ``error`` to a batch's records; close the gap its sequences leave.

        The later batches of the partition take the failed batch's sequence numbers (they
        are restamped and, if in flight, resent), as Kafka's producer adjusts them.
        """
        if batch.base_sequence is not None:
            failed, count = batch.base_sequence, batch.count
            later = [
                b
                for b in (*q.in_flight, *q.batches)
                if b.base_sequence is not None
                and (b.base_sequence - failed) % _SEQUENCE_MODULUS < _SEQUENCE_MODULUS // 2
                and b.base_sequence != failed
            ]
            for other in later:
                assert other.base_sequence is not None and other.data is not None
                other.base_sequence = (other.base_sequence - count) % _SEQUENCE_MODULUS
                other.data = _restamp(
                    other.data, self._producer_id, self._producer_epoch, other.base_sequence
                )
            q.next_sequence = (q.next_sequence - count) % _SEQUENCE_MODULUS
            if later:
                q.retrying = True
        self._fail_batch(batch, error)


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

    def __init__(self, config: Mapping[str, Any]) -> None:
        """Validate ``config`` (raising :class:`InvalidConfigError`) and start the thread."""
        ProducerConfig.parse(config)
        self._callbacks: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._handover_lock = threading.Lock()
        self._handover: list[_Handover] = []
        """Records :meth:`produce` queued that the loop has not taken yet."""
        self._loop_thread = LoopThread("highwater-producer")
        self._closed = False
        self._producer: AsyncProducer = self._call(self._create(dict(config)))

    @staticmethod
    async def _create(config: dict[str, Any]) -> AsyncProducer:
        """Build the async producer on the background loop (its events belong to it)."""
        return AsyncProducer(config)

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
        if value is not None and type(value) is not bytes:
            value = _to_bytes(value, "value")
        if key is not None and type(key) is not bytes:
            key = _to_bytes(key, "key")
        record_headers = _headers_list(headers) if headers is not None else None
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
        for topic, value, key, partition, headers, timestamp, report in records:
            forward = None if report is None else functools.partial(self._forward, report)
            try:
                self._producer.produce(topic, value, key, partition, headers, timestamp, forward)
            except HighwaterError as e:  # closed while the record waited: report it
                if report is not None:
                    message = Message(topic, -1, key, value, headers or [], timestamp or 0, -1, e)
                    self._callbacks.put((report, e, message))

    def _forward(self, report: DeliveryCallback, err: BaseException | None, msg: Message) -> None:
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
        remaining = self.flush(timeout)
        self._closed = True
        self._call(self._producer.close(0))
        self.poll(0)
        self._loop_thread.stop()
        return remaining

    def __enter__(self) -> Producer:
        """``with Producer(...)``: closes (after flushing) on exit."""
        return self

    def __exit__(self, *exc: object) -> None:
        """Close the producer."""
        self.close()
