"""How a coordinator appends to and reads back its partitions of ``__consumer_offsets``.

The coordinator owns no storage: it writes its records to the brokers that lead the
partitions of ``__consumer_offsets`` with ``acks=all`` and reads them back when it takes
a partition over. Its writes are fenced by the coordinator epoch the controller gave it
for the partition: every owner of partition *p* appends as the idempotent producer
``COORDINATOR_PRODUCER_ID_BASE + p`` with producer epoch = coordinator epoch. The broker
refuses a producer epoch lower than one it has appended (INVALID_PRODUCER_EPOCH), and its
producer state is rebuilt on followers and after restarts from the log itself, so once
the new owner's first record is appended no write of an earlier owner can follow it,
whichever broker leads the partition.

Taking a partition over (:meth:`PartitionAppender.fence`): append a
:class:`~highwater.coordinator.records.CoordinatorEpochMarker` as sequence 0 of the new
epoch, then read the partition from its start up to the marker (it is committed: it was
appended with ``acks=all``) and replay that. Appends after it carry increasing sequence
numbers, one batch in flight at a time; a batch whose outcome is unknown (a timeout, a
lost connection, a leader that lost its leadership while it waited for the followers) is
sent again unchanged until the broker answers for it, and the broker's duplicate
detection makes that safe. Given up, its sequence numbers would go to the next batch,
which the broker would take for a duplicate of it if it was appended after all.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final, Protocol

import grpc
import grpc.aio

from highwater.coordinator.records import KeyValue, encode_epoch_marker
from highwater.errors import CorruptRecordError, HighwaterError
from highwater.metadata.consumer_offsets import ADMIN_CLIENT_ID, CONSUMER_OFFSETS_TOPIC
from highwater.metadata.image import MetadataImage
from highwater.metadata.records import NO_LEADER
from highwater.records import iter_batches
from highwater.rpc.broker_streams import CLIENT_ID_METADATA_KEY
from highwater.rpc.channels import open_channel
from highwater.v1 import broker_pb2 as pb
from highwater.v1 import broker_pb2_grpc
from highwater.v1.common_pb2 import ErrorCode

log = logging.getLogger(__name__)

COORDINATOR_PRODUCER_ID_BASE: Final = 1 << 62
"""Producer ids from here on name the owners of ``__consumer_offsets`` partitions; the
controller's producer-id blocks start at 0 and never reach them."""

_AS_ADMIN_CLIENT: Final = ((CLIENT_ID_METADATA_KEY, ADMIN_CLIENT_ID),)
"""The call metadata of the coordinator's appends: brokers take appends to internal topics
only from :data:`~highwater.metadata.consumer_offsets.ADMIN_CLIENT_ID` (Kafka's rule)."""

MAX_COORDINATOR_EPOCH: Final = (1 << 15) - 1
"""A batch's producer epoch is 16 bits: how many times a partition can change owner."""

_NOT_LEADER: Final = ErrorCode.NOT_LEADER_OR_FOLLOWER

_LEADER_ERRORS: Final = frozenset(
    {
        ErrorCode.LEADER_NOT_AVAILABLE,
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ErrorCode.FENCED_LEADER_EPOCH,
        ErrorCode.UNKNOWN_LEADER_EPOCH,
    }
)
"""The batch was not appended: the partition is led elsewhere, or by nobody right now."""

_IN_DOUBT_ERRORS: Final = frozenset(
    {
        ErrorCode.REQUEST_TIMED_OUT,
        ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
        _NOT_LEADER,
    }
)
"""The batch may have been appended: it must be sent again unchanged. A broker answers
NOT_LEADER_OR_FOLLOWER also when it lost its leadership after the append, while it
waited for the followers, and the new leader may hold the batch."""

_FENCED_ERRORS: Final = frozenset({ErrorCode.INVALID_PRODUCER_EPOCH, ErrorCode.PRODUCER_FENCED})


class CoordinatorFencedError(HighwaterError):
    """A newer owner of the partition has appended: this coordinator no longer owns it."""


class ImageView(Protocol):
    @property
    def image(self) -> MetadataImage: ...


@dataclass(frozen=True, slots=True)
class OffsetsLogSettings:
    offsets_commit_timeout_ms: int = 5_000
    """``offsets.commit.timeout.ms``: how long the leader may wait for acks=all."""
    retry_backoff_ms: int = 100
    """The wait before sending again after a leader change or a lost connection."""
    offsets_load_buffer_size: int = 5 * 1024 * 1024
    """``offsets.load.buffer.size``: the most one read of a partition being loaded brings."""


class OffsetsTopicClient:
    """Produce and Fetch against the leaders of ``__consumer_offsets`` partitions, found in
    the metadata image; one channel per broker."""

    def __init__(self, metadata: ImageView, settings: OffsetsLogSettings | None = None) -> None:
        self.metadata = metadata
        self.settings = settings or OffsetsLogSettings()
        self._channels: dict[str, grpc.aio.Channel] = {}

    def leader_address(self, partition: int) -> str | None:
        image = self.metadata.image
        topic = image.topic(CONSUMER_OFFSETS_TOPIC)
        if topic is None:
            return None
        registration = topic.partitions.get(partition)
        if registration is None or registration.leader == NO_LEADER:
            return None
        broker = image.broker(registration.leader)
        if broker is None or not broker.listeners:
            return None
        return broker.listeners[0].address

    def _stub(self, address: str) -> broker_pb2_grpc.BrokerStub:
        channel = self._channels.get(address)
        if channel is None:
            channel = open_channel(address)
            self._channels[address] = channel
        return broker_pb2_grpc.BrokerStub(channel)

    async def close(self) -> None:
        channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            await channel.close()

    async def produce(
        self,
        partition: int,
        records: Sequence[KeyValue],
        *,
        producer_epoch: int,
        base_sequence: int,
    ) -> tuple[int, int]:
        """One attempt: ``(error code, base offset)``; a failed call is NETWORK_EXCEPTION
        (in doubt), no leader LEADER_NOT_AVAILABLE (not sent)."""
        address = self.leader_address(partition)
        if address is None:
            return ErrorCode.LEADER_NOT_AVAILABLE, -1
        plain = pb.PlainRecords(
            producer_id=COORDINATOR_PRODUCER_ID_BASE + partition,
            producer_epoch=producer_epoch,
            base_sequence=base_sequence,
        )
        for key, value in records:
            record = plain.records.add(key=key)
            if value is not None:
                record.value = value
        request = pb.ProduceRequest(
            acks=-1,
            timeout_ms=self.settings.offsets_commit_timeout_ms,
            topics=[
                pb.ProduceTopic(
                    topic=CONSUMER_OFFSETS_TOPIC,
                    partitions=[pb.ProducePartition(partition=partition, records=plain)],
                )
            ],
        )
        timeout_s = self.settings.offsets_commit_timeout_ms / 1000 + 5
        try:
            reply = await self._stub(address).Produce(
                request, timeout=timeout_s, metadata=_AS_ADMIN_CLIENT
            )
        except grpc.aio.AioRpcError as e:
            log.debug("produce to %s for partition %d failed: %s", address, partition, e.code())
            return ErrorCode.NETWORK_EXCEPTION, -1
        answer = reply.topics[0].partitions[0]
        return answer.error, answer.base_offset

    async def read(
        self, partition: int, end_offset: int
    ) -> list[tuple[bytes | None, bytes | None]]:
        """Every record of ``partition`` below ``end_offset`` (which must be committed), in
        order, from the log start; leader changes and lost connections are retried."""
        records: list[tuple[bytes | None, bytes | None]] = []
        offset = 0
        first = True
        backoff = self.settings.retry_backoff_ms / 1000
        while offset < end_offset:
            address = self.leader_address(partition)
            if address is None:
                await asyncio.sleep(backoff)
                continue
            request = pb.FetchRequest(
                max_wait_ms=500,
                min_bytes=1,
                max_bytes=self.settings.offsets_load_buffer_size,
                topics=[
                    pb.FetchTopic(
                        topic=CONSUMER_OFFSETS_TOPIC,
                        partitions=[
                            pb.FetchPartition(
                                partition=partition,
                                fetch_offset=offset,
                                partition_max_bytes=self.settings.offsets_load_buffer_size,
                            )
                        ],
                    )
                ],
            )
            try:
                reply = await self._stub(address).Fetch(request, timeout=10)
            except grpc.aio.AioRpcError:
                await asyncio.sleep(backoff)
                continue
            answer = reply.topics[0].partitions[0]
            if answer.error == ErrorCode.OFFSET_OUT_OF_RANGE and first:
                offset = answer.log_start_offset  # the log start moved past 0
                first = False
                continue
            if answer.error != ErrorCode.NONE:
                if answer.error in _LEADER_ERRORS or answer.error == _NOT_LEADER:
                    await asyncio.sleep(backoff)
                    continue
                raise HighwaterError(
                    f"{CONSUMER_OFFSETS_TOPIC}-{partition}: reading at {offset} failed "
                    f"with {ErrorCode.Name(answer.error)}"
                )
            first = False
            if offset < answer.log_start_offset:
                offset = answer.log_start_offset
                continue
            try:
                for batch in iter_batches(answer.records):
                    if batch.next_offset <= offset:
                        continue
                    for record in batch.records():
                        if offset <= record.offset < end_offset:
                            records.append((record.key, record.value))
                    offset = batch.next_offset
            except CorruptRecordError as e:
                raise HighwaterError(f"{CONSUMER_OFFSETS_TOPIC}-{partition}: {e}") from e
        return records


class PartitionAppender:
    """Appends for the owner of one partition of ``__consumer_offsets`` in one coordinator
    epoch (see the module docstring): fenced, sequenced, one batch at a time."""

    def __init__(
        self,
        client: OffsetsTopicClient,
        partition: int,
        coordinator_id: int,
        coordinator_epoch: int,
        *,
        still_owner: Callable[[], bool],
    ) -> None:
        if not 0 <= coordinator_epoch <= MAX_COORDINATOR_EPOCH:
            raise HighwaterError(
                f"{CONSUMER_OFFSETS_TOPIC}-{partition}: coordinator epoch {coordinator_epoch} "
                f"does not fit a producer epoch (at most {MAX_COORDINATOR_EPOCH})"
            )
        self.client = client
        self.partition = partition
        self.coordinator_id = coordinator_id
        self.coordinator_epoch = coordinator_epoch
        self.still_owner = still_owner
        self.next_sequence = 0
        self._lock = asyncio.Lock()

    async def fence(self) -> int:
        """Append the epoch marker (sequence 0); its offset. After it, the partition's
        earlier owners can append nothing more.

        Raises :class:`CoordinatorFencedError` when a newer owner has appended, and
        :class:`HighwaterError` when the broker refused the marker for another reason (an
        appender is for one take-over: a second one in the same epoch restarts at
        sequence 0, which the broker refuses as OUT_OF_ORDER_SEQUENCE_NUMBER; see
        :mod:`highwater.coordinator.ownership`)."""
        marker = encode_epoch_marker(self.coordinator_id, self.coordinator_epoch)
        error, offset = await self._append_until_known([marker], give_up_after_ms=None)
        if error != ErrorCode.NONE:
            raise HighwaterError(
                f"{CONSUMER_OFFSETS_TOPIC}-{self.partition}: taking over in epoch "
                f"{self.coordinator_epoch} failed with {_name(error)}"
            )
        return offset

    async def append(self, records: Sequence[KeyValue]) -> int:
        """Append ``records`` as one batch: NONE, or the error that kept them out.

        A leader change or too few in-sync replicas is retried for up to
        ``offsets.commit.timeout.ms``; a batch in doubt until the broker answers for it.
        Raises :class:`CoordinatorFencedError` when a newer owner has appended.
        """
        timeout_ms = self.client.settings.offsets_commit_timeout_ms
        return (await self._append_until_known(records, give_up_after_ms=timeout_ms))[0]

    async def _append_until_known(
        self, records: Sequence[KeyValue], *, give_up_after_ms: int | None
    ) -> tuple[int, int]:
        loop = asyncio.get_running_loop()
        deadline = None if give_up_after_ms is None else loop.time() + give_up_after_ms / 1000
        backoff = self.client.settings.retry_backoff_ms / 1000
        async with self._lock:
            in_doubt = False
            while True:
                if not self.still_owner():
                    raise CoordinatorFencedError(
                        f"{CONSUMER_OFFSETS_TOPIC}-{self.partition} moved to another coordinator"
                    )
                error, offset = await self.client.produce(
                    self.partition,
                    records,
                    producer_epoch=self.coordinator_epoch,
                    base_sequence=self.next_sequence,
                )
                if error == ErrorCode.NONE:
                    self.next_sequence += len(records)
                    return ErrorCode.NONE, offset
                if error in _FENCED_ERRORS:
                    raise CoordinatorFencedError(
                        f"{CONSUMER_OFFSETS_TOPIC}-{self.partition}: epoch "
                        f"{self.coordinator_epoch} was fenced by a newer owner"
                    )
                if error == ErrorCode.UNKNOWN_PRODUCER_ID and not in_doubt:
                    # The broker forgot this producer (its state expired): start again at 0.
                    self.next_sequence = 0
                    continue
                if error in _IN_DOUBT_ERRORS or error == ErrorCode.NETWORK_EXCEPTION:
                    in_doubt = True
                elif error not in _LEADER_ERRORS and error != ErrorCode.NOT_ENOUGH_REPLICAS:
                    if in_doubt:
                        raise HighwaterError(
                            f"{CONSUMER_OFFSETS_TOPIC}-{self.partition}: a resent batch got "
                            f"{_name(error)}; its first attempt's outcome is unknown"
                        )
                    return error, -1  # refused outright: nothing appended, sequence unused
                elif not in_doubt and deadline is not None and loop.time() >= deadline:
                    return error, -1
                await asyncio.sleep(backoff)


def _name(error: int) -> str:
    return ErrorCode.Name(error)  # type: ignore[arg-type]


async def close_quietly(client: OffsetsTopicClient) -> None:
    with contextlib.suppress(Exception):
        await client.close()
