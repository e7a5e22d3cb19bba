"""The ACL checks of the group coordinator's calls (Kafka's ``KafkaApis``).

With the authorizer on: JoinGroup, SyncGroup, Heartbeat, LeaveGroup need READ on the group
(else the answer's ``error`` is GROUP_AUTHORIZATION_FAILED and the group is untouched);
OffsetCommit needs READ on the group and READ on each topic (a refused topic's partitions
are TOPIC_AUTHORIZATION_FAILED and not committed); OffsetFetch needs DESCRIBE on the
group, and of the topics the caller may not DESCRIBE it leaves them out when asked for
every topic and answers their partitions TOPIC_AUTHORIZATION_FAILED when they are named;
ListGroups shows every group to a caller that may DESCRIBE the cluster, else only the groups
it may DESCRIBE; DescribeGroups needs DESCRIBE
and DeleteGroups DELETE on each group (a refused one is answered
GROUP_AUTHORIZATION_FAILED); OffsetDelete needs DELETE on the group and READ on each topic
(a refused topic's partitions are TOPIC_AUTHORIZATION_FAILED and keep their offsets).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeAlias, TypeVar

import grpc.aio

from highwater.rpc.auth import authorize, authorizer_enabled
from highwater.security.acl import AclOperation, ResourceType
from highwater.security.rpc_access import CLUSTER_NAME
from highwater.v1 import coordinator_pb2 as pb
from highwater.v1.common_pb2 import ErrorCode

__all__ = [
    "group_allowed",
    "narrow_offset_commit",
    "narrow_offset_delete",
    "narrow_offset_fetch",
    "visible_groups",
]

Context: TypeAlias = "grpc.aio.ServicerContext[Any, Any] | None"
_Topic = TypeVar("_Topic", pb.OffsetCommitTopic, pb.OffsetDeleteTopic)


def group_allowed(context: Context, operation: AclOperation, group_id: str) -> bool:
    return authorize(context, operation, ResourceType.GROUP, group_id)


_TopicResult = TypeVar("_TopicResult", pb.OffsetCommitTopicResult, pb.OffsetDeleteTopicResult)


def _split_readable(
    context: Context,
    topics: Iterable[_Topic],
    partition_indexes: Callable[[_Topic], Iterable[int]],
    result_type: type[_TopicResult],
) -> tuple[list[_Topic], list[_TopicResult]]:
    """The topics the caller may READ, and an answer for each refused one: its partitions
    TOPIC_AUTHORIZATION_FAILED."""
    kept: list[_Topic] = []
    refused: list[_TopicResult] = []
    for topic in topics:
        if authorize(context, AclOperation.READ, ResourceType.TOPIC, topic.name):
            kept.append(topic)
            continue
        result = result_type(name=topic.name)
        for index in partition_indexes(topic):
            result.partitions.add(
                partition_index=index,
                error=ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                error_message=f"not authorized to read topic {topic.name}",
            )
        refused.append(result)
    return kept, refused


def narrow_offset_commit(
    request: pb.OffsetCommitRequest, context: Context
) -> tuple[pb.OffsetCommitRequest, list[pb.OffsetCommitTopicResult]]:
    """The topics the caller may commit, and the refused ones' answers."""
    if not authorizer_enabled():
        return request, []
    kept, refused = _split_readable(
        context,
        request.topics,
        lambda topic: (p.partition_index for p in topic.partitions),
        pb.OffsetCommitTopicResult,
    )
    if not refused:
        return request, []
    narrowed = pb.OffsetCommitRequest()
    narrowed.CopyFrom(request)
    del narrowed.topics[:]
    narrowed.topics.extend(kept)
    return narrowed, refused


def narrow_offset_delete(
    request: pb.OffsetDeleteRequest, context: Context
) -> tuple[pb.OffsetDeleteRequest, list[pb.OffsetDeleteTopicResult]]:
    """The topics whose offsets the caller may delete, and the refused ones' answers."""
    if not authorizer_enabled():
        return request, []
    kept, refused = _split_readable(
        context,
        request.topics,
        lambda topic: topic.partition_indexes,
        pb.OffsetDeleteTopicResult,
    )
    return pb.OffsetDeleteRequest(group_id=request.group_id, topics=kept), refused


def narrow_offset_fetch(
    response: pb.OffsetFetchResponse, context: Context, *, all_topics: bool
) -> pb.OffsetFetchResponse:
    """Only what the caller may describe, as Kafka's ``handleOffsetFetchRequest``: asked
    for every topic, the others are left out (not logged as refusals); asked for by name,
    a refused topic's partitions are answered TOPIC_AUTHORIZATION_FAILED with no offset."""
    if not authorizer_enabled():
        return response
    for topic in list(response.topics):
        if authorize(
            context,
            AclOperation.DESCRIBE,
            ResourceType.TOPIC,
            topic.name,
            log_if_denied=not all_topics,
        ):
            continue
        if all_topics:
            response.topics.remove(topic)
            continue
        for partition in topic.partitions:
            partition.committed_offset = -1
            partition.committed_leader_epoch = -1
            partition.metadata = ""
            partition.error = ErrorCode.TOPIC_AUTHORIZATION_FAILED
            partition.error_message = f"not authorized to describe topic {topic.name}"
    return response


def visible_groups(response: pb.ListGroupsResponse, context: Context) -> pb.ListGroupsResponse:
    """Every group for a caller that may DESCRIBE the cluster, else only the groups it may
    describe (Kafka's ``handleListGroupsRequest``)."""
    if not authorizer_enabled() or authorize(
        context, AclOperation.DESCRIBE, ResourceType.CLUSTER, CLUSTER_NAME, log_if_denied=False
    ):
        return response
    kept = [
        group
        for group in response.groups
        if authorize(
            context, AclOperation.DESCRIBE, ResourceType.GROUP, group.group_id, log_if_denied=False
        )
    ]
    del response.groups[:]
    response.groups.extend(kept)
    return response
