"""The per-topic ACL checks of the broker's data-plane calls (Kafka's ``KafkaApis``).

Produce, Fetch, ListOffsets, OffsetsForLeaderEpoch and DeleteRecords all carry
``topics[].partitions[]`` and answer ``topics[].partitions[]`` with an ``error``:
:func:`split_topics` keeps the topics the caller may act on and
:func:`add_refused_topics` answers the others ``TOPIC_AUTHORIZATION_FAILED``, so a
refused topic is never read nor written while the others are served. The rules, with the
authorizer on:

- Produce: WRITE on the topic, for an idempotent producer's batches too (Kafka 3's
  KIP-679: WRITE on a topic implies IDEMPOTENT_WRITE for it, so there is no second check);
  InitProducerId: IDEMPOTENT_WRITE on the cluster or WRITE on some topic that no DENY
  takes back (KIP-679), else CLUSTER_AUTHORIZATION_FAILED;
- Fetch: READ on the topic (a Fetch is always a consumer's); a follower's ReplicaFetch
  (the internal ``ReplicaFetchService``) needs CLUSTER_ACTION on the cluster, which the
  server interceptor checks, and to speak for its own node
  (``security/node_identities.py``), which :func:`replica_fetch_refusal` checks on each
  request of the stream;
- ListOffsets, OffsetsForLeaderEpoch: DESCRIBE; DeleteRecords: DELETE;
- Metadata and DescribeTopicPartitions: the topics the caller may DESCRIBE (a topic named
  but not describable is TOPIC_AUTHORIZATION_FAILED, one not named is left out);
- FindCoordinator: DESCRIBE on the group, else GROUP_AUTHORIZATION_FAILED.
"""

from __future__ import annotations

from typing import TypeVar

import grpc.aio
from google.protobuf.message import Message

from highwater.broker.topic_descriptions import MayDescribe
from highwater.internal.v1 import replication_pb2 as rpb
from highwater.rpc.auth import (
    authorize,
    authorizer_enabled,
    current_authorizer,
    may_speak_for_node,
    principal_of,
)
from highwater.security.acl import AclOperation, ResourceType
from highwater.security.authorizer import Decision
from highwater.security.rpc_access import CLUSTER_NAME
from highwater.v1 import broker_pb2 as pb
from highwater.v1.common_pb2 import ErrorCode

__all__ = [
    "add_refused_topics",
    "authorize_coordinators",
    "authorize_fetch",
    "authorize_init_producer_id",
    "filter_metadata",
    "replica_fetch_refusal",
    "split_topics",
    "topic_describer",
]

M = TypeVar("M", bound=Message)
Refused = list[tuple[str, list[int], int]]
"""Refused topics: name, partitions, error code."""


def split_topics(
    request: M,
    context: grpc.aio.ServicerContext | None,
    operation: AclOperation,
) -> tuple[M, Refused]:
    """``request`` with only the topics the caller may ``operation``, and the refused ones."""
    if not authorizer_enabled():
        return request, []
    refused: Refused = []
    kept = []
    for topic in request.topics:  # type: ignore[attr-defined]
        partitions = [p.partition for p in topic.partitions]
        if not authorize(context, operation, ResourceType.TOPIC, topic.topic):
            refused.append((topic.topic, partitions, ErrorCode.TOPIC_AUTHORIZATION_FAILED))
        else:
            kept.append(topic)
    if not refused:
        return request, []
    narrowed = type(request)()
    narrowed.CopyFrom(request)
    del narrowed.topics[:]  # type: ignore[attr-defined]
    narrowed.topics.extend(kept)  # type: ignore[attr-defined]
    return narrowed, refused


def add_refused_topics(response: M, refused: Refused) -> M:
    """``response`` with each refused topic's partitions answered with its error."""
    for name, partitions, code in refused:
        topic = response.topics.add(topic=name)  # type: ignore[attr-defined]
        for partition in partitions:
            answer = topic.partitions.add(partition=partition, error=code)
            if isinstance(answer, pb.ProducePartitionResponse):
                answer.base_offset = -1
                answer.log_append_time_ms = -1
                answer.error_message = "not authorized"
    return response


def authorize_fetch(
    request: pb.FetchRequest, context: grpc.aio.ServicerContext | None
) -> tuple[pb.FetchRequest, Refused]:
    """A consumer's fetch: READ on each topic."""
    return split_topics(request, context, AclOperation.READ)


def replica_fetch_refusal(
    request: rpb.ReplicaFetchRequest, context: grpc.aio.ServicerContext | None
) -> str | None:
    """Why the caller may not fetch as broker ``request.replica_id`` (it speaks for another
    node), or None. CLUSTER_ACTION itself was checked for the whole call."""
    if may_speak_for_node(context, request.replica_id):
        return None
    return (
        f"CLUSTER_AUTHORIZATION_FAILED: {principal_of(context).principal} may not "
        f"fetch as broker {request.replica_id}"
    )


def authorize_init_producer_id(context: grpc.aio.ServicerContext | None) -> bool:
    """IDEMPOTENT_WRITE on the cluster, or WRITE on some topic that no DENY takes back
    (KIP-679, Kafka's ``authorizeByResourceType``)."""
    if authorize(context, AclOperation.IDEMPOTENT_WRITE, ResourceType.CLUSTER, CLUSTER_NAME):
        return True
    authorizer = current_authorizer()
    if authorizer is None:
        return True
    call = principal_of(context)
    decision = authorizer.authorize_by_resource_type(
        call.principal, call.host, AclOperation.WRITE, ResourceType.TOPIC
    )
    return decision is Decision.ALLOWED


def filter_metadata(
    request: pb.MetadataRequest,
    response: pb.MetadataResponse,
    context: grpc.aio.ServicerContext | None,
) -> pb.MetadataResponse:
    """Only the topics the caller may describe (see the module docstring)."""
    if not authorizer_enabled():
        return response
    named = set(request.topics)
    kept = []
    for topic in response.topics:
        asked = topic.name in named  # the topics not asked for are left out silently
        if authorize(
            context, AclOperation.DESCRIBE, ResourceType.TOPIC, topic.name, log_if_denied=asked
        ):
            kept.append(topic)
        elif asked:
            kept.append(
                pb.TopicMetadata(name=topic.name, error=ErrorCode.TOPIC_AUTHORIZATION_FAILED)
            )
    del response.topics[:]
    response.topics.extend(kept)
    return response


def topic_describer(context: grpc.aio.ServicerContext | None) -> MayDescribe | None:
    """Whether the caller may describe a topic, for a paged description to ask before it
    cuts its page (None: the checks are off, every topic may be)."""
    if not authorizer_enabled():
        return None

    def may_describe(topic: str, named: bool) -> bool:
        return authorize(
            context, AclOperation.DESCRIBE, ResourceType.TOPIC, topic, log_if_denied=named
        )

    return may_describe


def authorize_coordinators(
    request: pb.FindCoordinatorRequest, context: grpc.aio.ServicerContext | None
) -> tuple[pb.FindCoordinatorRequest, list[pb.Coordinator]]:
    """The groups the caller may describe, and the refused ones' answers."""
    if not authorizer_enabled():
        return request, []
    kept = pb.FindCoordinatorRequest(key_type=request.key_type)
    refused = []
    for key in request.keys:
        if authorize(context, AclOperation.DESCRIBE, ResourceType.GROUP, key):
            kept.keys.append(key)
        else:
            refused.append(
                pb.Coordinator(
                    key=key,
                    error=ErrorCode.GROUP_AUTHORIZATION_FAILED,
                    error_message=f"not authorized to describe group {key}",
                    node_id=-1,
                )
            )
    return kept, refused


async def authorize_consumer_session(
    context: grpc.aio.ServicerContext, start: pb.SessionStart
) -> str | None:
    """A consumer session's check (``ConsumerSessions.authorizer``): READ on its group and
    on each topic it names (Kafka's JoinGroup and Fetch checks); None, or why not."""
    if not authorizer_enabled():
        return None
    principal = principal_of(context).principal
    if not authorize(context, AclOperation.READ, ResourceType.GROUP, start.group_id):
        return f"GROUP_AUTHORIZATION_FAILED: {principal} may not read group {start.group_id}"
    topics = dict.fromkeys([*start.topics, *(p.topic for p in start.partitions)])
    for topic in topics:
        if not authorize(context, AclOperation.READ, ResourceType.TOPIC, topic):
            return f"TOPIC_AUTHORIZATION_FAILED: {principal} may not read topic {topic}"
    return None
