"""The producer's sender, its pure part: Produce requests built from drained batches, and
what each partition's answer means (written, resent, or failed for good).

The I/O (draining the queues, sending, retry timing) is :class:`~highwater.client.producer.
AsyncProducer`'s sender task; what it sends and how an answer is read are here, free of
asyncio and gRPC calls, as aiokafka's sender splits each request into creating it and
handling its response.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final

import grpc
import grpc.aio

from highwater.client.cluster import BROKER_MESSAGE_MAX_BYTES
from highwater.client.producer.accumulator import PartitionQueue, ProducerBatch
from highwater.client.producer.delivery import ProduceError, produce_error
from highwater.v1 import broker_pb2 as pb
from highwater.v1.common_pb2 import ErrorCode

__all__ = [
    "PRODUCE_REQUEST_MAX_BYTES",
    "RETRIABLE_ERRORS",
    "RETRIABLE_STATUS",
    "SEQUENCE_ERRORS",
    "answer_error",
    "answers_by_partition",
    "create_produce_request",
    "is_retriable_answer",
    "request_failure",
    "split_requests",
]

#: Error codes after which a batch is sent again (with the same sequence number).
RETRIABLE_ERRORS: Final[frozenset[int]] = frozenset(
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
SEQUENCE_ERRORS: Final[frozenset[int]] = frozenset(
    {ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, ErrorCode.UNKNOWN_PRODUCER_ID}
)
#: Whole-request gRPC failures after which the batches are sent again.
RETRIABLE_STATUS: Final[frozenset[grpc.StatusCode]] = frozenset(
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


PRODUCE_REQUEST_MAX_BYTES: Final = BROKER_MESSAGE_MAX_BYTES - (1 << 20)
"""The most batch bytes one Produce request carries: the brokers' gRPC message limit, less
room for the request's own fields. Batches ready for one broker at once (one per
partition) go in as few requests as fit, as Kafka's producer holds a request to
``max.request.size``. One request of them all was refused whole past the limit and resent
whole: 70 partitions' 1 MB batches on one broker were refused three times, until the
retries' timing happened to split them."""


def split_requests(
    batches: Sequence[ProducerBatch], max_bytes: int = PRODUCE_REQUEST_MAX_BYTES
) -> list[list[ProducerBatch]]:
    """``batches`` (sealed, for one broker) as the requests that carry them, in their order:
    each request up to ``max_bytes`` of batch bytes, a batch larger than that alone."""
    requests: list[list[ProducerBatch]] = []
    current: list[ProducerBatch] = []
    size = 0
    for batch in batches:
        assert batch.data is not None
        if current and size + len(batch.data) > max_bytes:
            requests.append(current)
            current, size = [], 0
        current.append(batch)
        size += len(batch.data)
    if current:
        requests.append(current)
    return requests


def create_produce_request(
    batches: Iterable[ProducerBatch], acks: int, timeout_ms: int
) -> pb.ProduceRequest:
    """One Produce request carrying each (sealed) batch, grouped by topic."""
    request = pb.ProduceRequest(acks=acks, timeout_ms=timeout_ms)
    by_topic: dict[str, pb.ProduceTopic] = {}
    for batch in batches:
        topic = by_topic.get(batch.topic)
        if topic is None:
            topic = by_topic[batch.topic] = request.topics.add(topic=batch.topic)
        topic.partitions.add(partition=batch.partition, record_batches=batch.data)
    return request


def request_failure(address: str, error: grpc.aio.AioRpcError) -> tuple[ProduceError, bool]:
    """A whole request's gRPC failure as the error its batches get, and whether they are
    sent again."""
    code = error.code()
    failure = ProduceError(
        ErrorCode.NETWORK_EXCEPTION, f"Produce to {address} failed: {code}: {error.details()}"
    )
    return failure, code in RETRIABLE_STATUS


def answers_by_partition(
    reply: pb.ProduceResponse,
) -> dict[tuple[str, int], pb.ProducePartitionResponse]:
    """Each partition's answer in ``reply``, by ``(topic, partition)``."""
    return {(t.topic, p.partition): p for t in reply.topics for p in t.partitions}


def answer_error(batch: ProducerBatch, answer: pb.ProducePartitionResponse) -> ProduceError:
    """The error a batch's failed answer carries, naming the partition and the code."""
    code = answer.error
    message = answer.error_message or ErrorCode.Name(code)
    return produce_error(
        code, f"{batch.topic}-{batch.partition}: {ErrorCode.Name(code)}: {message}"
    )


def is_retriable_answer(code: int, batch: ProducerBatch, queue: PartitionQueue) -> bool:
    """Whether a batch answered with error ``code`` is sent again.

    A sequence error is retriable while an earlier batch of the partition is still
    unanswered or being resent (the broker will accept this one after it).
    UNKNOWN_PRODUCER_ID always is: the broker lost the producer's state of the partition,
    so the batch is resent once the partition's sequences start again under the next
    epoch (the producer sets :attr:`PartitionQueue.restart_pending`), as Kafka's
    idempotent producer retries it after bumping its epoch (``TransactionManager.canRetry``).
    """
    return (
        code in RETRIABLE_ERRORS
        or code == ErrorCode.UNKNOWN_PRODUCER_ID
        or (
            code in SEQUENCE_ERRORS
            and (queue.retrying or batch.base_sequence != queue.acked_sequence)
        )
    )
