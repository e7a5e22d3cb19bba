"""The producer's accumulator: records waiting for metadata, per-partition batches and queues.

A record goes into its partition's open :class:`ProducerBatch` (a
:class:`~highwater.records.RecordBatchBuilder` of at most ``batch.size`` bytes); a
:class:`PartitionQueue` holds the partition's queued and in-flight batches and its sequence
numbers when the producer is idempotent. Records of a topic whose metadata is not known
yet wait as :class:`WaitingRecord`. The sequence arithmetic (modulo 2**31, as Kafka's) is
here too: :meth:`PartitionQueue.acknowledge` moves the acknowledged sequence forward, and
:meth:`PartitionQueue.restart_sequences` starts them again under a new producer epoch
after a batch failed for good.
"""

from __future__ import annotations

import struct
from collections import deque
from dataclasses import dataclass, field
from typing import Final

from highwater.client.cluster import (
    TopicInfo,
)
from highwater.client.message import TIMESTAMP_CREATE_TIME, TIMESTAMP_LOG_APPEND_TIME
from highwater.client.producer.delivery import (
    BatchDeliveryCallback,
    DeliveryCallback,
    RecordMetadata,
)
from highwater.client.producer.handle import DeliveryHandle
from highwater.records import RecordBatchBuilder
from highwater.records.header import ATTRIBUTES_OFFSET, CRC_OFFSET, crc32c
from highwater.records.record import Header, RecordFields

__all__ = [
    "MAX_PRODUCER_EPOCH",
    "NO_HEADERS",
    "SEQUENCE_MODULUS",
    "PartitionQueue",
    "ProducerBatch",
    "StickyChoice",
    "WaitingRecord",
    "restamp",
]

SEQUENCE_MODULUS: Final = 1 << 31
MAX_PRODUCER_EPOCH: Final = (1 << 15) - 1
"""A producer epoch is an int16: past this one the producer needs a new producer id."""
_PRODUCER_ID_OFFSET: Final = 43
_PRODUCER_STATE = struct.Struct(">qhi")  # producer id, producer epoch, base sequence
_UINT32 = struct.Struct(">I")
NO_HEADERS: Final[tuple[Header, ...]] = ()


@dataclass(slots=True)
class WaitingRecord:
    """A record that waits for its topic's metadata before it can go into a batch."""

    partition: int
    """The partition produce() named, or -1."""
    fields: RecordFields
    handle: DeliveryHandle | None
    """None for a record produced without a handle (the blocking producer's)."""
    on_delivery: DeliveryCallback | None
    created: float
    """When produce() was called (monotonic seconds); delivery.timeout.ms counts from it."""


@dataclass(eq=False, slots=True)
class ProducerBatch:
    """Records of one partition on their way: first open, then built and sent.

    The builder holds the records (with the compiled codec as their encoded bytes, written
    as each is produced; else as ``(key, value, headers, timestamp)`` tuples encoded when
    the batch is sealed); ``callbacks`` holds, at the same index, each record's delivery
    callback (or None). The outcome (:attr:`delivered`, :attr:`base_offset`,
    :attr:`log_append_time`, :attr:`error`) is set once for the whole batch: the records'
    :class:`~highwater.client.producer.handle.DeliveryHandle` objects read theirs from it
    (:meth:`metadata_of`), and only the handles whose future was asked for before
    (:attr:`waiters`) are resolved one by one. Nothing else exists per record: a producer
    may hold hundreds of thousands of records, and every object kept per record adds to
    the garbage collector's work.
    """

    topic: str
    partition: int
    builder: RecordBatchBuilder
    created: float
    """When the batch was opened: linger.ms counts from it."""
    first_created: float
    """When its first record was produced: delivery.timeout.ms counts from it."""
    callbacks: list[DeliveryCallback | None] = field(default_factory=list)
    has_callbacks: bool = False
    """Whether any record has a delivery callback (else delivery needs no loop per record)."""
    waiters: list[DeliveryHandle] = field(default_factory=list)
    """Handles whose future was made before the batch's outcome: resolved with it."""
    delivered: bool = False
    """The outcome is set: written (:attr:`base_offset`) or failed (:attr:`error`)."""
    base_offset: int = -1
    """The first record's offset once written (-1 with ``acks=0``)."""
    log_append_time: int = -1
    """The broker's append time (ms) when the topic uses LogAppendTime, else -1."""
    error: BaseException | None = None
    closed: bool = False
    data: bytes | None = None
    base_sequence: int | None = None
    attempts: int = 0
    sequence_refused: bool = False
    """Its last attempt was answered with a sequence error (OUT_OF_ORDER_SEQUENCE_NUMBER,
    UNKNOWN_PRODUCER_ID): the broker does not hold it, so neither any later batch of the
    partition (:meth:`PartitionQueue.restart_due`)."""
    columnar: bool = False
    """A batch of :meth:`~highwater.client.producer.AsyncProducer.produce_batch`: its records
    came encoded, with no future or callback per record."""
    report: BatchDeliveryCallback | None = None
    """Where a columnar batch's one delivery report goes (None: nowhere)."""

    @property
    def count(self) -> int:
        """How many records the batch holds."""
        return self.builder.records_count

    def metadata_of(self, index: int) -> RecordMetadata:
        """The :class:`RecordMetadata` of the batch's ``index``-th record, once written."""
        builder = self.builder
        base_offset = self.base_offset
        offset = base_offset + index if base_offset >= 0 else -1
        if self.log_append_time >= 0:
            return RecordMetadata(
                self.topic, self.partition, offset, self.log_append_time, TIMESTAMP_LOG_APPEND_TIME
            )
        timestamp = builder.records[index][3] if not self.columnar else builder.base_timestamp
        assert timestamp is not None
        return RecordMetadata(self.topic, self.partition, offset, timestamp, TIMESTAMP_CREATE_TIME)

    def settle(self, base_offset: int, log_append_time: int, error: BaseException | None) -> None:
        """Set the batch's outcome and resolve the futures made for its records."""
        self.delivered = True
        self.base_offset = base_offset
        self.log_append_time = log_append_time
        self.error = error
        waiters, self.waiters = self.waiters, []
        for handle in waiters:
            handle._resolve()

    def deadline(self, delivery_timeout_s: float) -> float:
        """When the batch expires: delivery.timeout.ms after its first record."""
        return self.first_created + delivery_timeout_s


@dataclass(eq=False, slots=True)
class StickyChoice:
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
    queue: PartitionQueue
    """The partition's queue (queues are kept for the producer's life)."""
    threshold: int
    """The bytes that make the partitioner switch (``batch.size`` minus what it counted)."""
    unreported: int = 0
    """Bytes appended to the partition and not reported to the partitioner yet."""


@dataclass(slots=True)
class PartitionQueue:
    """One partition's queued and in-flight batches and its sequence numbers."""

    topic: str
    partition: int
    batches: deque[ProducerBatch] = field(default_factory=deque)
    in_flight: list[ProducerBatch] = field(default_factory=list)
    next_sequence: int = 0
    """The sequence the next newly drained batch gets."""
    acked_sequence: int = 0
    """The sequence after the last acknowledged batch: the one the broker expects next."""
    retrying: bool = False
    """A batch is being resent: send one at a time, nothing new, until caught up."""
    backoff_until: float = 0.0
    producer_id: int = -1
    producer_epoch: int = -1
    """The producer id and epoch the partition's sequence numbers belong to (-1 until its
    first batch is sealed). The broker keeps a producer's sequence per partition, so one
    partition may move to a new epoch (:meth:`restart_sequences`) while the others go on."""
    restart_pending: bool = False
    """A sequenced batch failed for good: the partition's sequences start again from 0
    under a new epoch once it is known which of its batches the broker holds
    (:meth:`restart_due`)."""

    def open_batch(self) -> ProducerBatch | None:
        """The batch new records go into, if one is open."""
        if self.batches and not self.batches[-1].closed:
            return self.batches[-1]
        return None

    def requeue(self, batch: ProducerBatch) -> None:
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

    def expired(self, now: float, delivery_timeout_s: float) -> list[ProducerBatch]:
        """The queued batches whose ``delivery.timeout.ms`` has passed at ``now``.

        Batches never sent are queued in the order they were made, so their deadlines
        rise: the scan stops at the first of them that has not expired, as Kafka's
        ``RecordAccumulator.expiredBatches`` does. Resent batches, put back at the front in
        sequence order (:meth:`requeue`), are all looked at. The sender asks at every turn,
        and :meth:`~highwater.client.producer.AsyncProducer.produce_batch` queues hundreds
        of batches at once: a scan of them all each time was most of its cost per batch.
        """
        expired: list[ProducerBatch] = []
        for batch in self.batches:
            if batch.deadline(delivery_timeout_s) <= now:
                expired.append(batch)
            elif batch.attempts == 0:
                break
        return expired

    def has_sequenced_queued(self) -> bool:
        """Whether a batch that was sent before waits in the queue."""
        return any(b.base_sequence is not None for b in self.batches)

    def send_delay(
        self, now: float, linger_s: float, flushing: bool, max_in_flight: int
    ) -> float | None:
        """Whether the head batch may be drained at ``now``: 0.0 if so, else the seconds
        until it may (a back-off after a failure, or ``linger.ms`` since it was opened), or
        None when only an answer can change it (nothing queued, the most batches in
        flight, or a resent batch still unanswered).

        A full or closed batch, and every batch while flushing, need not linger. While
        the queue resends (:attr:`retrying`) one batch is in flight at a time; it stops
        resending once no batch that was sent before is queued or in flight.

        With ``linger.ms`` 0 a batch that is not full waits while any of the partition's
        batches is in flight, and goes once they are answered (or once it is full, or at
        a flush): Nagle's rule. Records produced during a round trip then leave together
        in one request, not one request per turn of the event loop. Each request costs
        every process on the path about the same CPU whatever it carries (docs/broker.md,
        "Where end-to-end latency goes"): at 10,000 records/s, RF 3, acks=all, five small
        requests in flight took the five processes to nearly both CPUs of the benchmark
        machine, and each record's wait for a CPU cost more than its wait for the answer
        before it. Full batches still go up to the in-flight limit, so a producer that
        fills its batches (the throughput case) pipelines as before.
        """
        if not self.batches:
            return None
        if self.retrying and not self.in_flight and not self.has_sequenced_queued():
            self.retrying = False
        if (self.retrying and self.in_flight) or len(self.in_flight) >= max_in_flight:
            return None
        if now < self.backoff_until:
            return self.backoff_until - now
        head = self.batches[0]
        if head.closed or flushing:
            return 0.0
        if linger_s == 0.0 and self.in_flight:
            return None  # a batch that is not full goes with the answer (see above)
        ready_at = head.created + linger_s
        if ready_at <= now:
            return 0.0
        return ready_at - now

    def acknowledge(self, batch: ProducerBatch) -> None:
        """Take an answered batch out of flight; advance the acknowledged sequence."""
        if batch in self.in_flight:
            self.in_flight.remove(batch)
        if batch.base_sequence is not None:
            end = (batch.base_sequence + batch.count) % SEQUENCE_MODULUS
            # A resent batch may be answered after later ones: never move backwards.
            if (end - self.acked_sequence) % SEQUENCE_MODULUS < SEQUENCE_MODULUS // 2:
                self.acked_sequence = end

    def restart_due(self) -> bool:
        """Whether the pending restart of the sequences (:attr:`restart_pending`) may
        happen now.

        A batch that failed for good may be in the log all the same (its reply was lost,
        or it was appended and its answer said otherwise), so its sequence numbers cannot
        be given to the later batches, as they could if it certainly was not: the broker
        would answer a later batch carrying them as a duplicate of the failed one, and its
        records would be reported written without being in the log. Kafka's idempotent
        producer bumps its epoch instead, and so does this queue, once nothing is in flight
        and its first sent batch still queued is known not to be in the log (its last
        answer was a sequence error), or none is queued: the broker accepts a producer's batches
        only in sequence order, so no later one is in the log either, and all of them may
        take new numbers. Until then the first one is resent under the old numbers, one
        batch at a time (:attr:`retrying`): written, it is acknowledged (or answered as a
        duplicate); not written, it is refused for its sequence.
        """
        if not self.restart_pending or self.in_flight:
            return False
        head = self.batches[0] if self.batches else None
        return head is None or head.base_sequence is None or head.sequence_refused

    def restart_sequences(self, producer_id: int, producer_epoch: int) -> None:
        """Number the sent batches still queued again from 0 under ``producer_epoch``
        (and ``producer_id``), in their order, and go on from there
        (:meth:`restart_due` says when)."""
        assert not self.in_flight
        self.producer_id, self.producer_epoch = producer_id, producer_epoch
        sequence = 0
        for batch in self.batches:
            if batch.base_sequence is None:
                break  # sent batches are queued first, in sequence order (requeue)
            assert batch.data is not None
            batch.base_sequence = sequence
            batch.sequence_refused = False
            batch.data = restamp(batch.data, producer_id, producer_epoch, sequence)
            sequence = (sequence + batch.count) % SEQUENCE_MODULUS
        self.next_sequence = sequence
        self.acked_sequence = 0
        self.restart_pending = False


def restamp(data: bytes, producer_id: int, producer_epoch: int, base_sequence: int) -> bytes:
    """The batch ``data`` with new producer fields and its CRC recomputed."""
    buf = bytearray(data)
    _PRODUCER_STATE.pack_into(buf, _PRODUCER_ID_OFFSET, producer_id, producer_epoch, base_sequence)
    with memoryview(buf) as view:
        _UINT32.pack_into(buf, CRC_OFFSET, crc32c(view[ATTRIBUTES_OFFSET:]))
    return bytes(buf)
