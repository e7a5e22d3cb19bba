"""What ``produce()`` takes and what a delivery report gives: keys, values and headers as
bytes, :class:`RecordMetadata`, the delivery callback, and the errors a record is delivered
with (:class:`ProduceError` carries the broker's error code).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import NamedTuple, TypeAlias

from highwater import errors
from highwater.client.message import TIMESTAMP_CREATE_TIME, Message
from highwater.errors import AuthorizationError, HighwaterError
from highwater.v1.common_pb2 import ErrorCode

__all__ = [
    "BatchDeliveryCallback",
    "BatchMetadata",
    "DeliveryCallback",
    "DeliveryTimeoutError",
    "HeaderValue",
    "HeadersArg",
    "ProduceAuthorizationError",
    "ProduceError",
    "ProducerClosedError",
    "ProducerError",
    "RecordMetadata",
    "RecordTooLargeError",
    "consume_exception",
    "headers_list",
    "produce_error",
    "to_bytes",
]


class ProducerError(HighwaterError):
    """Base of the errors the producer delivers or raises."""


class ProducerClosedError(ProducerError):
    """The producer was closed before the record could be delivered, or is used after close."""


class DeliveryTimeoutError(ProducerError):
    """The record was not acknowledged within ``delivery.timeout.ms``."""

    code = ErrorCode.REQUEST_TIMED_OUT


class RecordTooLargeError(ProducerError, errors.RecordTooLargeError):
    """The record is larger than ``max.request.size`` as a batch of its own (its size
    encoded, before compression, plus a batch header): it failed at ``produce()`` and was
    never sent, as Kafka's producer raises ``RecordTooLargeException``. Code
    ``MESSAGE_TOO_LARGE``, the broker's for a batch over a topic's ``max.message.bytes``."""


class ProduceError(ProducerError):
    """The broker refused the record's batch for good; ``code`` is the broker's error code."""

    def __init__(self, code: int, message: str) -> None:
        """An error with the broker's ``code`` and message."""
        super().__init__(message)
        self.code = code


class ProduceAuthorizationError(ProduceError, AuthorizationError):
    """The ACLs refused the record: TOPIC_AUTHORIZATION_FAILED (no WRITE on the topic) or
    CLUSTER_AUTHORIZATION_FAILED (no idempotent writes for this principal)."""


def produce_error(code: int, message: str) -> ProduceError:
    """The typed :class:`ProduceError` of a broker's error ``code``."""
    if code in (ErrorCode.TOPIC_AUTHORIZATION_FAILED, ErrorCode.CLUSTER_AUTHORIZATION_FAILED):
        return ProduceAuthorizationError(code, message)
    return ProduceError(code, message)


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


DeliveryCallback: TypeAlias = Callable[[BaseException | None, Message], object]


class BatchMetadata(NamedTuple):
    """Where a batch of records was written: the per-batch delivery report.

    Its ``record_count`` records have the offsets ``offset`` to ``offset + record_count - 1``
    (``offset`` -1 with ``acks=0`` or an error); ``timestamp`` is the broker's append time
    when the topic uses LogAppendTime, else the records' create time. One report per batch, in
    place of a :class:`Message` and a callback per record.
    """

    topic: str
    partition: int
    offset: int
    record_count: int
    timestamp: int
    timestamp_type: int = TIMESTAMP_CREATE_TIME


BatchDeliveryCallback: TypeAlias = Callable[[BaseException | None, BatchMetadata], object]
"""``on_delivery_batch(err, batch)``: called once per batch, ``err`` None when written."""


def to_bytes(value: str | bytes | bytearray | memoryview | None, what: str) -> bytes | None:
    """A key, value or header value as bytes (str as UTF-8), like confluent-kafka."""
    if value is None:
        return None
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    raise TypeError(f"{what} must be str, bytes or None, not {type(value).__name__}")


def headers_list(headers: HeadersArg) -> list[tuple[str, bytes | None]]:
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
        result.append((key, to_bytes(value, f"header {key!r}")))
    return result


def consume_exception(future: asyncio.Future[RecordMetadata]) -> None:
    """Mark a failed future's exception as seen: callbacks already reported it."""
    if not future.cancelled():
        future.exception()
