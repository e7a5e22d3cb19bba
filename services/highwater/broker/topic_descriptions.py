"""Topic descriptions from the metadata image: Metadata's partitions, and KIP-966's pages.

Metadata (:meth:`~highwater.broker.request_handler.RequestHandler.metadata`) describes
every topic asked for in one answer. On a cluster of a few hundred thousand partitions that
answer passes what a client takes in one message (gRPC's default limit is 4 MiB, about
200,000 partitions at some 20 bytes each), so Kafka 3.8 added DescribeTopicPartitions
(KIP-966): the same descriptions a page at a time. :func:`describe_topic_partitions` is
its rule, from Kafka's ``DescribeTopicPartitionsRequestHandler`` and
``KRaftMetadataCache.getTopicMetadataForDescribeTopicResponse``:

* the topics are the ones asked for, or every topic when none is; those before the
  cursor's topic in name order are left out, and a cursor must name one of the topics
  asked for;
* the caller's permission is judged before the page is cut: a topic it may not describe
  is left out silently when every topic was asked for, and answered
  ``TOPIC_AUTHORIZATION_FAILED`` at the end of the page when it was named;
* in name order, each topic gives its partitions from the cursor's partition (the
  cursor's topic only) until the page holds the limit; a topic asked for but unknown is
  answered in its place without partitions (it counts nothing);
* ``next_cursor`` names the first partition left out: within a topic cut short, or
  partition 0 of the next topic when the page filled exactly at a topic's end (which does
  not mean that topic exists). No cursor: nothing is left.

The limit is the request's, at most the broker's ``max.request.partition.size.limit``
(2,000). Kafka's request field defaults to 2,000 and a protobuf field to 0, so a gRPC
request's 0 asks for the broker's limit (:func:`page_limit`) and a negative one is
refused; a Kafka request's limit is taken as Kafka takes it. Pure: an image and a request
in, an answer out.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Final

from google.protobuf.internal.containers import RepeatedCompositeFieldContainer

from highwater.errors import InvalidRequestError, InvalidTopicError
from highwater.metadata.image import MetadataImage, PartitionRegistration
from highwater.storage.topic_partition import validate_topic_name
from highwater.v1 import broker_pb2 as pb
from highwater.v1.common_pb2 import ErrorCode

__all__ = [
    "DEFAULT_MAX_REQUEST_PARTITION_SIZE_LIMIT",
    "MayDescribe",
    "add_partition",
    "describe_topic_partitions",
    "is_internal_topic",
    "page_limit",
]

DEFAULT_MAX_REQUEST_PARTITION_SIZE_LIMIT: Final = 2000
"""Kafka's ``max.request.partition.size.limit``: the most partitions one page holds."""

MayDescribe = Callable[[str, bool], bool]
"""``(topic, named)`` → may the caller describe it? ``named``: the request named it (a
refusal is worth logging), rather than asking for every topic."""


def is_internal_topic(name: str) -> bool:
    """A topic the cluster keeps for itself (``__consumer_offsets``...)."""
    return name.startswith("__")


def add_partition(
    partitions: RepeatedCompositeFieldContainer[pb.PartitionMetadata],
    image: MetadataImage,
    index: int,
    registration: PartitionRegistration,
) -> None:
    """Append partition ``index``'s description to ``partitions``: leader, epoch, replicas,
    ISR, the replicas on brokers not active, and the eligible leader replicas."""
    partitions.add(
        error=ErrorCode.NONE if registration.has_leader else ErrorCode.LEADER_NOT_AVAILABLE,
        partition=index,
        leader_id=registration.leader,
        leader_epoch=registration.leader_epoch,
        replicas=registration.replicas,
        isr=registration.isr,
        offline_replicas=[r for r in registration.replicas if not image.is_active_broker(r)],
        eligible_leader_replicas=registration.elr,
        last_known_elr=registration.last_known_elr,
    )


def _unknown_topic_error(name: str) -> ErrorCode.ValueType:
    try:
        validate_topic_name(name)
    except InvalidTopicError:
        return ErrorCode.INVALID_TOPIC_EXCEPTION
    return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


def page_limit(requested: int, broker_limit: int) -> int:
    """The partitions a gRPC request's page holds: ``requested``, 0 meaning the broker's
    limit, never more than that.

    :raises InvalidRequestError: a negative ``requested``."""
    if requested < 0:
        raise InvalidRequestError(f"response_partition_limit {requested} is negative")
    return min(requested or broker_limit, broker_limit)


def describe_topic_partitions(
    image: MetadataImage,
    topics: Sequence[str],
    cursor: tuple[str, int] | None,
    limit: int,
    may_describe: MayDescribe | None = None,
) -> pb.DescribeTopicPartitionsResponse:
    """One page of at most ``limit`` partitions of ``topics`` (empty: every topic) from
    ``cursor`` (topic, partition; None: the first), by the module docstring's rule;
    ``may_describe`` None: the caller may describe every topic. A ``limit`` of 0 answers
    only a cursor at the first topic, a negative one nothing, as Kafka's loop does.

    :raises InvalidRequestError: a negative cursor partition, or a cursor naming a topic
        ``topics`` does not."""
    cursor_topic, cursor_partition = cursor if cursor is not None else ("", 0)
    if cursor_partition < 0:
        raise InvalidRequestError(f"The cursor's partition {cursor_partition} is negative")
    every = not topics
    if every:
        names = {name for name in image.topics.by_name if name >= cursor_topic}
    else:
        names = {name for name in topics if name >= cursor_topic}
        if cursor is not None and cursor_topic not in names:
            raise InvalidRequestError(
                f"The topics asked for do not include the cursor's topic {cursor_topic!r}"
            )
    refused: list[str] = []
    if may_describe is not None:
        allowed = []
        for name in names:
            if may_describe(name, not every):
                allowed.append(name)
            elif not every:
                refused.append(name)
    else:
        allowed = list(names)
    first_partition = cursor_partition if cursor_topic in allowed else 0

    response = pb.DescribeTopicPartitionsResponse()
    remaining = limit
    for name in sorted(allowed):
        if remaining <= 0:
            if remaining == 0:
                response.next_cursor.topic, response.next_cursor.partition = name, 0
            break
        topic = image.topic(name)
        if topic is None:
            if not every:
                response.topics.add(name=name, error=_unknown_topic_error(name))
            continue
        described = response.topics.add(
            name=name, topic_id=topic.topic_id, is_internal=is_internal_topic(name)
        )
        count = len(topic.partitions)
        start = first_partition if name == cursor_topic else 0
        end = min(count, start + remaining)
        for index in range(start, end):
            registration = topic.partition(index)
            if registration is not None:
                add_partition(described.partitions, image, index, registration)
        if end < count:
            response.next_cursor.topic, response.next_cursor.partition = name, end
            break
        remaining -= max(end - start, 0)
    for name in sorted(refused):
        response.topics.add(name=name, error=ErrorCode.TOPIC_AUTHORIZATION_FAILED)
    return response
