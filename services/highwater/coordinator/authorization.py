"""The ACL checks of the group coordinator's calls (Kafka's ``KafkaApis``).

With the authorizer on: JoinGroup, SyncGroup, Heartbeat, LeaveGroup need READ on the group
(else the answer's ``error`` is GROUP_AUTHORIZATION_FAILED and the group is untouched);
OffsetCommit needs READ on the group and READ on each topic (a refused topic's partitions
are TOPIC_AUTHORIZATION_FAILED and not committed); OffsetFetch needs DESCRIBE on the
group and shows only the topics the caller may DESCRIBE; ListGroups shows only the groups
the caller may DESCRIBE; DescribeGroups needs DESCRIBE and DeleteGroups DELETE on each
group (a refused one is answered GROUP_AUTHORIZATION_FAILED); OffsetDelete needs DELETE on
the group and READ on each topic (a refused topic's partitions are
TOPIC_AUTHORIZATION_FAILED and keep their offsets).
"""

from __future__ import annotations

from typing import Any, TypeAlias

import grpc.aio

from highwater.rpc.auth import authorize, authorizer_enabled
from highwater.security.acl import AclOperation, ResourceType
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


def group_allowed(context: Context, operation: AclOperation, group_id: str) -> bool:
    return authorize(context, operation, ResourceType.GROUP, group_id)


def narrow_offset_commit(
    request: pb.OffsetCommitRequest, context: Context
) -> tuple[pb.OffsetCommitRequest, list[pb.OffsetCommitTopicResult]]:
    """The topics the caller may commit, and the refused ones' answers."""
    if not authorizer_enabled():
        return request, []
    refused = []
    kept = []
    for topic in request.topics:
        if authorize(context, AclOperation.READ, ResourceType.TOPIC, topic.name):
            kept.append(topic)
            continue
        result = pb.OffsetCommitTopicResult(name=topic.name)
        for partition in topic.partitions:
            result.partitions.add(
                partition_index=partition.partition_index,
                error=ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                error_message=f"not authorized to read topic {topic.name}",
            )
        refused.append(result)
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
    refused = []
    kept = []
    for topic in request.topics:
        if authorize(context, AclOperation.READ, ResourceType.TOPIC, topic.name):
            kept.append(topic)
            continue
        result = pb.OffsetDeleteTopicResult(name=topic.name)
        for partition in topic.partition_indexes:
            result.partitions.add(
                partition_index=partition,
                error=ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                error_message=f"not authorized to read topic {topic.name}",
            )
        refused.append(result)
    return pb.OffsetDeleteRequest(group_id=request.group_id, topics=kept), refused


def narrow_offset_fetch(
    response: pb.OffsetFetchResponse, context: Context
) -> pb.OffsetFetchResponse:
    """Only the topics the caller may describe."""
    if not authorizer_enabled():
        return response
    kept = [
        topic
        for topic in response.topics
        if authorize(context, AclOperation.DESCRIBE, ResourceType.TOPIC, topic.name)
    ]
    del response.topics[:]
    response.topics.extend(kept)
    return response


def visible_groups(response: pb.ListGroupsResponse, context: Context) -> pb.ListGroupsResponse:
    """Only the groups the caller may describe."""
    if not authorizer_enabled():
        return response
    kept = [
        group
        for group in response.groups
        if authorize(context, AclOperation.DESCRIBE, ResourceType.GROUP, group.group_id)
    ]
    del response.groups[:]
    response.groups.extend(kept)
    return response
