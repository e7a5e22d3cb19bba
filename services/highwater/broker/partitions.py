"""The partitions a broker holds: their logs, their roles from the metadata image, and the
rules a partition leader applies to produce, fetch and offset requests.

:class:`PartitionManager` follows the :class:`~highwater.metadata.image.MetadataImage`:
every partition that names this broker among its replicas gets a log in the data
directory (created empty, with the topic's effective config) and a role — leader in the
partition's leader epoch, or follower. The leader appends produced batches through the
storage engine (which checks them, stamps offsets and the leader epoch, and detects an
idempotent producer's duplicates) and serves reads up to the high watermark.

The high watermark is the smallest log end offset in the ISR. Replication between brokers
(follower fetchers and the leader's view of their progress) is not here yet: a leader
whose ISR is itself alone moves the high watermark with every append; a leader with
other ISR members keeps it where the log's checkpoint left it.

Everything here is synchronous and runs on the broker's event loop; waiting (long polls,
acks) is the service's business (:mod:`highwater.broker.service`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass

from highwater.errors import HighwaterError, OffsetOutOfRangeError
from highwater.metadata.image import MetadataImage, PartitionRegistration
from highwater.storage.log import AppendInfo, FetchData, PartitionLog
from highwater.storage.log_manager import LogManager
from highwater.storage.topic_partition import TopicPartition
from highwater.v1.common_pb2 import ErrorCode

__all__ = [
    "EARLIEST_TIMESTAMP",
    "LATEST_TIMESTAMP",
    "MAX_TIMESTAMP",
    "Partition",
    "PartitionError",
    "PartitionManager",
]

log = logging.getLogger(__name__)

LATEST_TIMESTAMP = -1
EARLIEST_TIMESTAMP = -2
MAX_TIMESTAMP = -3
NO_EPOCH = -1


class PartitionError(HighwaterError):
    """A request for one partition failed with ``code`` (the rest of the request goes on)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(slots=True)
class Partition:
    """One partition replica on this broker."""

    topic_partition: TopicPartition
    log: PartitionLog
    registration: PartitionRegistration
    broker_id: int

    @property
    def is_leader(self) -> bool:
        return self.registration.leader == self.broker_id

    @property
    def leader_epoch(self) -> int:
        return self.registration.leader_epoch

    @property
    def high_watermark(self) -> int:
        return self.log.high_watermark

    @property
    def log_end_offset(self) -> int:
        return self.log.log_end_offset

    def check_leader(self, current_leader_epoch: int) -> None:
        """Refuse a request for a leader this replica is not, or for another epoch."""
        if current_leader_epoch != NO_EPOCH:
            if current_leader_epoch < self.leader_epoch:
                raise PartitionError(
                    ErrorCode.FENCED_LEADER_EPOCH,
                    f"{self.topic_partition}: leader epoch {current_leader_epoch} is older "
                    f"than {self.leader_epoch}",
                )
            if current_leader_epoch > self.leader_epoch:
                raise PartitionError(
                    ErrorCode.UNKNOWN_LEADER_EPOCH,
                    f"{self.topic_partition}: leader epoch {current_leader_epoch} is newer "
                    f"than {self.leader_epoch}",
                )
        if not self.is_leader:
            raise PartitionError(
                ErrorCode.NOT_LEADER_OR_FOLLOWER,
                f"{self.topic_partition}: broker {self.broker_id} does not lead it "
                f"(leader {self.registration.leader})",
            )

    def append(self, data: bytes, required_acks: int) -> AppendInfo:
        """Append a producer's batches as leader. ``required_acks`` -1 (all) first checks
        ``min.insync.replicas`` against the ISR (NOT_ENOUGH_REPLICAS)."""
        self.check_leader(NO_EPOCH)
        isr = self.registration.isr
        min_isr = self.log.config.min_insync_replicas
        if required_acks == -1 and len(isr) < min_isr:
            raise PartitionError(
                ErrorCode.NOT_ENOUGH_REPLICAS,
                f"{self.topic_partition}: the ISR {list(isr)} is smaller than "
                f"min.insync.replicas={min_isr}",
            )
        info = self.log.append_as_leader(data, self.leader_epoch)
        self.maybe_advance_high_watermark()
        return info

    def maybe_advance_high_watermark(self) -> None:
        if self.registration.isr == (self.broker_id,):
            self.log.update_high_watermark(self.log.log_end_offset)

    def read(self, fetch_offset: int, max_bytes: int, current_leader_epoch: int) -> FetchData:
        """Whole batches from ``fetch_offset`` up to the high watermark (a consumer's read)."""
        self.check_leader(current_leader_epoch)
        try:
            return self.log.read(fetch_offset, max_bytes, max_offset=self.high_watermark)
        except OffsetOutOfRangeError as e:
            raise PartitionError(ErrorCode.OFFSET_OUT_OF_RANGE, str(e)) from None

    def list_offset(self, timestamp: int, current_leader_epoch: int) -> tuple[int, int]:
        """ListOffsets for a consumer: (timestamp, offset); -1, -1 when no record matches."""
        self.check_leader(current_leader_epoch)
        if timestamp == EARLIEST_TIMESTAMP:
            return -1, self.log.log_start_offset
        if timestamp == LATEST_TIMESTAMP:
            return -1, self.high_watermark
        if timestamp == MAX_TIMESTAMP:
            found = self._max_timestamp()
        elif timestamp >= 0:
            found = self.log.offset_for_timestamp(timestamp)
        else:
            raise PartitionError(
                ErrorCode.INVALID_REQUEST, f"{timestamp} is not a timestamp ListOffsets knows"
            )
        if found is None or found[1] >= self.high_watermark:
            return -1, -1
        return found

    def _max_timestamp(self) -> tuple[int, int] | None:
        best: tuple[int, int] | None = None
        for _, _, header in self.log.iter_batches():
            if header.base_offset >= self.high_watermark:
                break
            if best is None or header.max_timestamp > best[0]:
                best = (header.max_timestamp, header.base_offset + header.last_offset_delta)
        return best


class PartitionManager:
    """This broker's partitions, kept in step with the metadata image (see the module
    docstring)."""

    def __init__(self, broker_id: int, log_manager: LogManager) -> None:
        self.broker_id = broker_id
        self.log_manager = log_manager
        self._partitions: dict[TopicPartition, Partition] = {}
        self.image = MetadataImage()

    def __iter__(self) -> Iterator[Partition]:
        return iter(list(self._partitions.values()))

    def get(self, topic: str, partition: int) -> Partition:
        """The partition, or PartitionError UNKNOWN_TOPIC_OR_PARTITION /
        NOT_LEADER_OR_FOLLOWER (it exists, on other brokers)."""
        found = self._partitions.get(TopicPartition(topic, partition))
        if found is not None:
            return found
        topic_image = self.image.topic(topic)
        if topic_image is None or topic_image.partition(partition) is None:
            raise PartitionError(
                ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"{topic}-{partition} does not exist"
            )
        raise PartitionError(
            ErrorCode.NOT_LEADER_OR_FOLLOWER,
            f"{topic}-{partition} has no replica on broker {self.broker_id}",
        )

    def apply_image(self, image: MetadataImage) -> None:
        """Open logs for the partitions assigned here and take the roles the image gives;
        partitions no longer assigned here (a deleted topic) are removed with their logs."""
        self.image = image
        wanted: set[TopicPartition] = set()
        for topic in image.topics.by_name.values():
            config = None
            for index in range(len(topic.partitions)):
                registration = topic.partition(index)
                if registration is None or self.broker_id not in registration.replicas:
                    continue
                tp = TopicPartition(topic.name, index)
                wanted.add(tp)
                existing = self._partitions.get(tp)
                if existing is not None:
                    if existing.registration != registration:
                        existing.registration = registration
                        existing.maybe_advance_high_watermark()
                    continue
                if config is None:
                    config = image.log_config(topic.name, self.log_manager.default_config)
                partition_log = self.log_manager.get_or_create_log(tp, config)
                created = Partition(tp, partition_log, registration, self.broker_id)
                created.maybe_advance_high_watermark()
                self._partitions[tp] = created
                log.info(
                    "broker %d: %s as %s in leader epoch %d",
                    self.broker_id,
                    tp,
                    "leader" if created.is_leader else "follower",
                    registration.leader_epoch,
                )
        for tp in [tp for tp in self._partitions if tp not in wanted]:
            del self._partitions[tp]
            self.log_manager.delete_log(tp)
            log.info("broker %d: %s removed", self.broker_id, tp)
