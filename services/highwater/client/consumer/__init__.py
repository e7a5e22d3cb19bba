"""The consumer, laid out by role as Kafka's and aiokafka's are.

- :mod:`~highwater.client.consumer.consumer`: :class:`AsyncConsumer` (the asyncio consumer:
  assignment, polling, offsets, its group membership and commits) and :class:`Consumer`
  (the blocking wrapper);
- :mod:`~highwater.client.consumer.fetcher`: topic partitions, their positions, Fetch
  requests and the decoding of fetched batches into messages (pure);
- :mod:`~highwater.client.consumer.message_batch`: :class:`MessageBatch`, what
  ``consume_batches()`` returns (records in column buffers, a message made per index);
- :mod:`~highwater.client.consumer.errors`: the errors it raises or delivers;
- :mod:`~highwater.client.consumer.config`: the settings (:class:`ConsumerConfig`).

The group membership (JoinGroup, SyncGroup, heartbeats) and the assignors live beside it
in :mod:`highwater.group`, whose protocol types the admin client decodes too.
Every public name is importable from here, ``from highwater.client.consumer import ...``.
"""

from highwater.client.consumer.config import CONSUMER_CONFIG_DEF, ConsumerConfig
from highwater.client.consumer.consumer import AsyncConsumer, Consumer, ConsumerGroupMetadata
from highwater.client.consumer.errors import (
    CommitFailedError,
    ConsumerClosedError,
    ConsumerError,
    FetchError,
    LogTruncationError,
    NoOffsetForPartitionError,
)
from highwater.client.consumer.fetcher import (
    OFFSET_BEGINNING,
    OFFSET_END,
    OFFSET_INVALID,
    OFFSET_STORED,
    TopicPartition,
)
from highwater.client.consumer.message_batch import MessageBatch
from highwater.client.message import Message

__all__ = [
    "CONSUMER_CONFIG_DEF",
    "OFFSET_BEGINNING",
    "OFFSET_END",
    "OFFSET_INVALID",
    "OFFSET_STORED",
    "AsyncConsumer",
    "CommitFailedError",
    "Consumer",
    "ConsumerClosedError",
    "ConsumerConfig",
    "ConsumerError",
    "ConsumerGroupMetadata",
    "FetchError",
    "LogTruncationError",
    "Message",
    "MessageBatch",
    "NoOffsetForPartitionError",
    "TopicPartition",
]
