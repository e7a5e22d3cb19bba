"""The producer, laid out by role as Kafka's and aiokafka's are.

- :mod:`~highwater.client.producer.producer`: :class:`AsyncProducer` (the asyncio producer:
  ``produce()``, the sender task and delivery) and :class:`Producer` (the blocking wrapper);
- :mod:`~highwater.client.producer.accumulator`: the per-partition batches and queues, the
  records waiting for metadata and the sequence numbers of an idempotent producer;
- :mod:`~highwater.client.producer.sender`: Produce requests built from drained batches and
  what each partition's answer means (pure);
- :mod:`~highwater.client.producer.delivery`: :class:`RecordMetadata`, the delivery callback
  and the errors a record is delivered with;
- :mod:`~highwater.client.producer.handle`: :class:`DeliveryHandle`, what ``produce()``
  returns (a record's delivery report, its future made only when awaited);
- :mod:`~highwater.client.producer.columns`: the columns ``produce_batch()`` takes (an Arrow
  table or a mapping of sequences);
- :mod:`~highwater.client.producer.config`: the settings (:class:`ProducerConfig`).

Every public name is importable from here, ``from highwater.client.producer import ...``.
"""

from highwater.client.message import TIMESTAMP_CREATE_TIME, TIMESTAMP_LOG_APPEND_TIME, Message
from highwater.client.producer.config import PRODUCER_CONFIG_DEF, ProducerConfig
from highwater.client.producer.delivery import (
    BatchDeliveryCallback,
    BatchMetadata,
    DeliveryCallback,
    DeliveryTimeoutError,
    ProduceAuthorizationError,
    ProduceError,
    ProducerClosedError,
    ProducerError,
    RecordMetadata,
    RecordTooLargeError,
)
from highwater.client.producer.handle import DeliveryHandle
from highwater.client.producer.producer import AsyncProducer, Producer

__all__ = [
    "PRODUCER_CONFIG_DEF",
    "TIMESTAMP_CREATE_TIME",
    "TIMESTAMP_LOG_APPEND_TIME",
    "AsyncProducer",
    "BatchDeliveryCallback",
    "BatchMetadata",
    "DeliveryCallback",
    "DeliveryHandle",
    "DeliveryTimeoutError",
    "Message",
    "ProduceAuthorizationError",
    "ProduceError",
    "Producer",
    "ProducerClosedError",
    "ProducerConfig",
    "ProducerError",
    "RecordMetadata",
    "RecordTooLargeError",
]
