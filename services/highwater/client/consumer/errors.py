"""The errors the consumer raises, or delivers in error messages, and the typed error of a
partition's error code in a Fetch or ListOffsets answer."""

from __future__ import annotations

from highwater.client.cluster import (
    UnknownTopicOrPartitionError,
)
from highwater.client.consumer.fetcher import TopicPartition, Truncation
from highwater.errors import (
    HighwaterError,
    OffsetOutOfRangeError,
)
from highwater.v1.common_pb2 import ErrorCode

__all__ = [
    "CommitFailedError",
    "ConsumerClosedError",
    "ConsumerError",
    "FetchError",
    "LogTruncationError",
    "NoOffsetForPartitionError",
    "error_for",
]


class ConsumerError(HighwaterError):
    """Base of the errors the consumer raises or delivers in error messages."""


class CommitFailedError(ConsumerError):
    """A synchronous commit failed for some partitions (``partitions`` carry the errors)."""

    def __init__(self, message: str, partitions: list[TopicPartition]) -> None:
        super().__init__(message)
        self.partitions = partitions


class ConsumerClosedError(ConsumerError):
    """The consumer is used after :meth:`AsyncConsumer.close`."""


class NoOffsetForPartitionError(ConsumerError):
    """A partition has no position and ``auto.offset.reset`` is ``none``."""

    code = ErrorCode.OFFSET_OUT_OF_RANGE


class LogTruncationError(OffsetOutOfRangeError):
    """The leader's log no longer holds a partition's position (an unclean leader election
    or a truncation under it) and ``auto.offset.reset`` is ``none`` (Kafka's
    ``LogTruncationException``): ``truncation`` says where, with the first offset known to
    diverge (``divergent_offset`` -1: not known). Seek to go on."""

    def __init__(self, topic: str, partition: int, truncation: Truncation) -> None:
        where = (
            f"diverges from offset {truncation.divergent_offset} "
            f"(epoch {truncation.divergent_epoch})"
            if truncation.divergent_offset >= 0
            else "holds no epoch up to it"
        )
        super().__init__(
            f"{topic}-{partition}: offset {truncation.offset} (epoch {truncation.epoch}) "
            f"was truncated: the leader's log {where}, and auto.offset.reset is none"
        )
        self.truncation = truncation


class FetchError(ConsumerError):
    """The broker answered a partition's Fetch or ListOffsets with ``code``."""

    def __init__(self, code: int, message: str) -> None:
        """An error with the broker's ``code`` and a message."""
        super().__init__(message)
        self.code = code


def error_for(code: int, topic: str, partition: int, detail: str = "") -> HighwaterError:
    """The typed error for a partition's error ``code``."""
    name = ErrorCode.Name(code)  # type: ignore[arg-type]
    text = f"{topic}-{partition}: {name}" + (f": {detail}" if detail else "")
    if code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
        return UnknownTopicOrPartitionError(text)
    if code == ErrorCode.OFFSET_OUT_OF_RANGE:
        return OffsetOutOfRangeError(text)
    return FetchError(code, text)
