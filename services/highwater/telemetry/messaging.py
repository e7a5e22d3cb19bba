"""Messaging spans of the client library, after OpenTelemetry's messaging semantic conventions.

The attribute names are those of semantic conventions 1.44.0 (:data:`SCHEMA_URL`), as
``opentelemetry-semantic-conventions`` 0.66b2, the version pinned in ``pyproject.toml``,
ships them. A record's trace context travels in its headers as W3C ``traceparent`` (and
``tracestate``), written by the producer and read by every consumer:

* ``send <topic>`` (PRODUCER): one per record, from ``produce()`` to its delivery report;
  the record's ``traceparent`` names it, so what consumers do becomes part of the
  producer's trace.
* ``receive <topic>`` (CLIENT): one per ``poll``/``consume`` call that returned records,
  with ``messaging.batch.message_count`` and a link to each record's context.
* ``process <topic>`` (CONSUMER): one per record handed to the application, a child of
  the record's ``send`` span, open until the next ``poll``/``consume`` call (or ``close``),
  the time the application spends on it, as Kafka instrumentations measure it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Sequence
from typing import Any, Final, Protocol

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.semconv._incubating.attributes import messaging_attributes as messaging
from opentelemetry.semconv.attributes import error_attributes
from opentelemetry.semconv.schemas import Schemas
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode

from highwater import __version__

__all__ = [
    "MESSAGING_SYSTEM",
    "SCHEMA_URL",
    "ConsumerTracing",
    "ProducerTracing",
    "record_context",
]

SCHEMA_URL: Final = Schemas.V1_44_0.value
MESSAGING_SYSTEM: Final = "highwater"
"""``messaging.system`` of every Highwater span."""
TRACE_HEADERS: Final = frozenset({"traceparent", "tracestate"})
_SEND: Final = messaging.MessagingOperationTypeValues.SEND.value
MAX_RECEIVE_LINKS: Final = 128
"""Links a ``receive`` span carries at most (one per record)."""

Headers = list[tuple[str, bytes | None]]


class ReceivedMessage(Protocol):
    """What the tracing needs of a consumed message (the client's ``Message``)."""

    def topic(self) -> str: ...

    def partition(self) -> int: ...

    def headers(self) -> Headers | None: ...

    def error(self) -> BaseException | None: ...


def _tracer() -> trace.Tracer:
    return trace.get_tracer("highwater.client", __version__, schema_url=SCHEMA_URL)


def record_context(
    headers: Iterable[tuple[str, bytes | None]] | None,
) -> otel_context.Context | None:
    """The trace context a record's headers carry, or None if they carry none."""
    if not headers:
        return None
    carrier = {
        key: value.decode("ascii", "replace")
        for key, value in headers
        if key in TRACE_HEADERS and value is not None
    }
    if "traceparent" not in carrier:
        return None
    return propagate.extract(carrier)


def _error_type(error: BaseException) -> str:
    code = getattr(error, "code", None)
    if isinstance(code, int) and code:
        from highwater.v1.common_pb2 import ErrorCode

        try:
            return ErrorCode.Name(code)  # type: ignore[arg-type]
        except ValueError:
            pass
    return type(error).__qualname__


class ProducerTracing:
    """The ``send`` spans of one producer."""

    def __init__(self) -> None:
        self._tracer = _tracer()

    def start_send(
        self, topic: str, partition: int | None, headers: Sequence[tuple[str, bytes | None]]
    ) -> tuple[Span, Headers]:
        """Start the record's ``send`` span; the headers to send, with its context added
        (a ``traceparent`` the caller set already is replaced).

        A span the sampler dropped gets no attributes, and its context is written as a
        bare ``traceparent`` (flags 00, so consumers drop theirs too): most records of a
        sampled trace cost only the sampler's decision.
        """
        span = self._tracer.start_span(f"send {topic}", kind=SpanKind.PRODUCER)
        sent: Headers = [(k, v) for k, v in headers if k not in TRACE_HEADERS]
        if not span.is_recording():
            context = span.get_span_context()
            traceparent = f"00-{context.trace_id:032x}-{context.span_id:016x}-00"
            sent.append(("traceparent", traceparent.encode("ascii")))
            return span, sent
        span.set_attributes(
            {
                messaging.MESSAGING_SYSTEM: MESSAGING_SYSTEM,
                messaging.MESSAGING_OPERATION_NAME: "send",
                messaging.MESSAGING_OPERATION_TYPE: _SEND,
                messaging.MESSAGING_DESTINATION_NAME: topic,
            }
        )
        if partition is not None and partition >= 0:
            span.set_attribute(messaging.MESSAGING_DESTINATION_PARTITION_ID, str(partition))
        carrier: dict[str, str] = {}
        propagate.inject(carrier, context=trace.set_span_in_context(span))
        sent.extend((key, value.encode("ascii")) for key, value in carrier.items())
        return span, sent

    @staticmethod
    def end_send(span: Span, future: asyncio.Future[Any]) -> None:
        """End ``span`` with the delivery report in ``future`` (a ``RecordMetadata``)."""
        if future.cancelled():
            span.set_attribute(error_attributes.ERROR_TYPE, "cancelled")
            span.set_status(Status(StatusCode.ERROR, "cancelled"))
        elif (error := future.exception()) is not None:
            span.set_attribute(error_attributes.ERROR_TYPE, _error_type(error))
            span.set_status(Status(StatusCode.ERROR, str(error)))
        else:
            report = future.result()
            span.set_attribute(messaging.MESSAGING_DESTINATION_PARTITION_ID, str(report.partition))
        span.end()


class ConsumerTracing:
    """The ``receive`` and ``process`` spans of one consumer."""

    def __init__(self, group_id: str) -> None:
        self._tracer = _tracer()
        self._group_id = group_id
        self._processing: list[Span] = []

    def _attributes(self, operation: messaging.MessagingOperationTypeValues) -> dict[str, Any]:
        attributes: dict[str, Any] = {
            messaging.MESSAGING_SYSTEM: MESSAGING_SYSTEM,
            messaging.MESSAGING_OPERATION_NAME: operation.value,
            messaging.MESSAGING_OPERATION_TYPE: operation.value,
        }
        if self._group_id:
            attributes[messaging.MESSAGING_CONSUMER_GROUP_NAME] = self._group_id
        return attributes

    def end_processing(self) -> None:
        """The application is done with what the last call returned."""
        for span in self._processing:
            span.end()
        self._processing.clear()

    def received(self, messages: Sequence[ReceivedMessage], started_ns: int) -> None:
        """Record the ``receive`` of ``messages`` (a call that began at ``started_ns``,
        ``time.time_ns()``) and open a ``process`` span for each record."""
        self.end_processing()
        records = [m for m in messages if m.error() is None]
        if not records:
            return
        contexts = [record_context(m.headers()) for m in records]
        topics = {m.topic() for m in records}
        topic = next(iter(topics)) if len(topics) == 1 else None
        attributes = self._attributes(messaging.MessagingOperationTypeValues.RECEIVE)
        attributes[messaging.MESSAGING_BATCH_MESSAGE_COUNT] = len(records)
        if topic is not None:
            attributes[messaging.MESSAGING_DESTINATION_NAME] = topic
        links = [
            Link(span_context)
            for c in contexts[:MAX_RECEIVE_LINKS]
            if c is not None
            and (span_context := trace.get_current_span(c).get_span_context()).is_valid
        ]
        receive = self._tracer.start_span(
            "receive" if topic is None else f"receive {topic}",
            kind=SpanKind.CLIENT,
            attributes=attributes,
            links=links,
            start_time=started_ns,
        )
        receive.end(time.time_ns())
        for message, parent in zip(records, contexts, strict=True):
            attributes = self._attributes(messaging.MessagingOperationTypeValues.PROCESS)
            attributes[messaging.MESSAGING_DESTINATION_NAME] = message.topic()
            attributes[messaging.MESSAGING_DESTINATION_PARTITION_ID] = str(message.partition())
            self._processing.append(
                self._tracer.start_span(
                    f"process {message.topic()}",
                    context=parent,
                    kind=SpanKind.CONSUMER,
                    attributes=attributes,
                )
            )
