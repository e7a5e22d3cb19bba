"""A record as delivery callbacks and the consumer's poll see it: confluent-kafka's ``Message``.

The producer hands one to each delivery callback and the consumer returns them from
``poll`` and ``consume``; ``timestamp()`` pairs the time with its type, as confluent-kafka
does (:data:`TIMESTAMP_CREATE_TIME` or :data:`TIMESTAMP_LOG_APPEND_TIME`).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Final

from highwater.records import IMPLEMENTATION, SlotFactory
from highwater.records.record import RecordFactory

__all__ = [
    "TIMESTAMP_CREATE_TIME",
    "TIMESTAMP_LOG_APPEND_TIME",
    "Message",
    "message_factory",
    "message_makers",
]

#: confluent-kafka's timestamp types, as :meth:`Message.timestamp` returns them.
TIMESTAMP_CREATE_TIME: Final = 1
TIMESTAMP_LOG_APPEND_TIME: Final = 2


class Message:
    """A produced record as a delivery callback sees it (confluent-kafka's ``Message``)."""

    __slots__ = (
        "_error",
        "_headers",
        "_key",
        "_leader_epoch",
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
        leader_epoch: int | None = None,
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
        self._leader_epoch = leader_epoch

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

    def leader_epoch(self) -> int | None:
        """The partition leader epoch of the batch a consumed record came in (the epoch of
        the leader that appended it), or None when not known (a produced record's delivery
        report, an error): what ``commit(message=)`` sends with the offset, so that the
        committed position can be validated against a later leader's log (KIP-320)."""
        return self._leader_epoch

    def __len__(self) -> int:
        """The value's length in bytes (0 for a tombstone)."""
        return 0 if self._value is None else len(self._value)

    def __repr__(self) -> str:
        """A short description: topic, partition, offset."""
        return f"Message({self._topic}-{self._partition}@{self._offset})"


_RECORD_SLOTS = ("_key", "_value", "_headers", "_timestamp", "_offset")


def message_factory(
    topic: str, partition: int, timestamp_type: int, leader_epoch: int | None = None
) -> RecordFactory[Message]:
    """``make(key, value, headers, timestamp, offset)``: a :class:`Message` of the partition
    (no error), as the consumer's decoder and the producer's delivery reports make them;
    ``leader_epoch`` is the batch's partition leader epoch (None, or below 0: not known).

    With the compiled codec a :class:`~highwater.records.SlotFactory` fills the message's
    slots from C (what ``__init__`` sets, without the call: several times cheaper); the
    pure-Python paths call the class. The compiled factory also leaves out of the cycle
    collector a message whose fields are all atomic (bytes, str, int, None, and headers as
    a tuple of such pairs), which can be in no reference cycle: a consumer holds each
    fetched batch's messages while it hands them out, and walking thousands of them at
    every collection had taken over 40 % of a consumer's CPU with 1 MB batches. Nothing
    assigns a message's slots after it is made.
    """
    epoch = None if leader_epoch is None or leader_epoch < 0 else leader_epoch
    if IMPLEMENTATION == "compiled":
        constants = {
            "_topic": topic,
            "_partition": partition,
            "_error": None,
            "_timestamp_type": timestamp_type,
            "_leader_epoch": epoch,
        }
        return SlotFactory(Message, _RECORD_SLOTS, constants)  # type: ignore[return-value]
    return functools.partial(
        Message, topic, partition, timestamp_type=timestamp_type, leader_epoch=epoch
    )


def message_makers(
    topic: str, partition: int, leader_epoch: int
) -> tuple[RecordFactory[Message], RecordFactory[Message]]:
    """The :func:`message_factory` of each timestamp type, indexed as
    :class:`~highwater.records.TimestampType` (CREATE_TIME 0, LOG_APPEND_TIME 1), for the
    records of batches of ``leader_epoch`` (below 0: not known)."""
    return (
        message_factory(topic, partition, TIMESTAMP_CREATE_TIME, leader_epoch),
        message_factory(topic, partition, TIMESTAMP_LOG_APPEND_TIME, leader_epoch),
    )
