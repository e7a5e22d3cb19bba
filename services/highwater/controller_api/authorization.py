"""The per-item ACL checks of the admin calls, shared by the broker that forwards them and
the controller that answers them (``security/rpc_access.py`` has the whole table).

:func:`split_admin_request` takes an admin request and the call's context and returns the
request with only the items the caller may act on, and the answers of the refused ones
(``TOPIC_AUTHORIZATION_FAILED``, or ``CLUSTER_AUTHORIZATION_FAILED`` for a broker's or the
cluster's configs); :func:`merge_refusals` puts those answers into the response of the
rest. A request left with no item is not sent on: nothing is written. The rules are
Kafka's ``KafkaApis``:

- CreateTopics: CREATE on the cluster, else CREATE on each topic;
- DeleteTopics: DELETE on each topic (one named by id: on its name, answered with the
  name only if the caller may DESCRIBE it; an unknown id is UNKNOWN_TOPIC_ID; a name or
  id asked twice is left to the controller, which refuses it INVALID_REQUEST);
- CreatePartitions: ALTER on each topic;
- AlterConfigs / DescribeConfigs: ALTER_CONFIGS / DESCRIBE_CONFIGS on each topic, or on the
  cluster for broker and cluster-default resources.

The calls checked whole (ACLs, SCRAM credentials, elections, reassignments) are the
interceptor's (``rpc/auth.py``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any, Final

import grpc.aio
from google.protobuf.message import Message

from highwater.rpc.auth import authorize, authorizer_enabled
from highwater.security.acl import AclOperation, ResourceType
from highwater.security.rpc_access import CLUSTER_NAME
from highwater.v1 import admin_pb2 as pb
from highwater.v1.admin_pb2 import ConfigResourceType
from highwater.v1.common_pb2 import ErrorCode

__all__ = ["PER_ITEM_ADMIN_RPCS", "TopicNameOf", "merge_refusals", "split_admin_request"]

_TOPIC, _CLUSTER = ResourceType.TOPIC, ResourceType.CLUSTER
_TOPIC_DENIED: Final = "TOPIC_AUTHORIZATION_FAILED"

TopicNameOf = Callable[[str], str | None]
"""A topic's name from its id (``None``: unknown)."""


def _message(principal_hint: str, what: str) -> str:
    return f"not authorized to {principal_hint} {what}"


def _create_topics(
    context: Any, request: pb.CreateTopicsRequest, _: TopicNameOf
) -> tuple[Message, list[Message]]:
    if authorize(context, AclOperation.CREATE, _CLUSTER, CLUSTER_NAME):
        return request, []
    kept = pb.CreateTopicsRequest(validate_only=request.validate_only)
    refused: list[Message] = []
    for topic in request.topics:
        if authorize(context, AclOperation.CREATE, _TOPIC, topic.name):
            kept.topics.append(topic)
        else:
            refused.append(
                pb.CreatableTopicResult(
                    name=topic.name,
                    error=ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                    error_message=_message("create", f"topic {topic.name}"),
                )
            )
    return kept, refused


def _delete_topics(
    context: Any, request: pb.DeleteTopicsRequest, topic_name_of: TopicNameOf
) -> tuple[Message, list[Message]]:
    kept = pb.DeleteTopicsRequest()
    refused: list[Message] = []
    # A name or an id asked twice goes on unchecked: Kafka's ControllerApis answers a
    # duplicate INVALID_REQUEST before it authorizes anything, and so does the controller
    # (deleting nothing of it).
    names, ids = Counter(request.names), Counter(request.topic_ids)
    kept.names.extend(name for name, count in names.items() for _ in range(count) if count > 1)
    kept.topic_ids.extend(i for i, count in ids.items() for _ in range(count) if count > 1)
    for name in (name for name, count in names.items() if count == 1):
        if authorize(context, AclOperation.DELETE, _TOPIC, name):
            kept.names.append(name)
        else:
            refused.append(
                pb.DeletableTopicResult(
                    name=name,
                    error=ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                    error_message=_message("delete", f"topic {name}"),
                )
            )
    for topic_id in (topic_id for topic_id, count in ids.items() if count == 1):
        topic_name = topic_name_of(topic_id)
        if topic_name is None:
            # Kafka's ControllerApis: an id that names no topic is UNKNOWN_TOPIC_ID to
            # anyone (ids are not secret, and there is no name to check).
            refused.append(
                pb.DeletableTopicResult(
                    topic_id=topic_id,
                    error=ErrorCode.UNKNOWN_TOPIC_ID,
                    error_message=f"no topic has the id {topic_id}",
                )
            )
        elif authorize(context, AclOperation.DELETE, _TOPIC, topic_name):
            kept.topic_ids.append(topic_id)
        else:
            # The name only to a caller that may describe the topic, as Kafka answers.
            describable = authorize(
                context, AclOperation.DESCRIBE, _TOPIC, topic_name, log_if_denied=False
            )
            refused.append(
                pb.DeletableTopicResult(
                    name=topic_name if describable else "",
                    topic_id=topic_id,
                    error=ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                    error_message=_message(
                        "delete", f"topic {topic_name if describable else topic_id}"
                    ),
                )
            )
    return kept, refused


def _create_partitions(
    context: Any, request: pb.CreatePartitionsRequest, _: TopicNameOf
) -> tuple[Message, list[Message]]:
    kept = pb.CreatePartitionsRequest(validate_only=request.validate_only)
    refused: list[Message] = []
    for topic in request.topics:
        if authorize(context, AclOperation.ALTER, _TOPIC, topic.name):
            kept.topics.append(topic)
        else:
            refused.append(
                pb.CreatePartitionsTopicResult(
                    name=topic.name,
                    error=ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                    error_message=_message("alter", f"topic {topic.name}"),
                )
            )
    return kept, refused


def _config_allowed(context: Any, operation: AclOperation, resource_type: int, name: str) -> int:
    """``ErrorCode.NONE`` or the refusal's code for a config resource."""
    if resource_type == ConfigResourceType.CONFIG_RESOURCE_TYPE_TOPIC:
        return (
            ErrorCode.NONE
            if authorize(context, operation, _TOPIC, name)
            else ErrorCode.TOPIC_AUTHORIZATION_FAILED
        )
    return (
        ErrorCode.NONE
        if authorize(context, operation, _CLUSTER, CLUSTER_NAME)
        else ErrorCode.CLUSTER_AUTHORIZATION_FAILED
    )


def _alter_configs(
    context: Any, request: pb.AlterConfigsRequest, _: TopicNameOf
) -> tuple[Message, list[Message]]:
    kept = pb.AlterConfigsRequest(validate_only=request.validate_only)
    refused: list[Message] = []
    for resource in request.resources:
        code = _config_allowed(
            context, AclOperation.ALTER_CONFIGS, resource.resource_type, resource.resource_name
        )
        if code == ErrorCode.NONE:
            kept.resources.append(resource)
        else:
            refused.append(
                pb.AlterConfigsResourceResult(
                    resource_type=resource.resource_type,
                    resource_name=resource.resource_name,
                    error=code,  # type: ignore[arg-type]
                    error_message=_message(
                        "alter the configs of", resource.resource_name or "the cluster"
                    ),
                )
            )
    return kept, refused


def _describe_configs(
    context: Any, request: pb.DescribeConfigsRequest, _: TopicNameOf
) -> tuple[Message, list[Message]]:
    kept = pb.DescribeConfigsRequest()
    refused: list[Message] = []
    for resource in request.resources:
        code = _config_allowed(
            context, AclOperation.DESCRIBE_CONFIGS, resource.resource_type, resource.resource_name
        )
        if code == ErrorCode.NONE:
            kept.resources.append(resource)
        else:
            refused.append(
                pb.DescribeConfigsResult(
                    resource_type=resource.resource_type,
                    resource_name=resource.resource_name,
                    error=code,  # type: ignore[arg-type]
                    error_message=_message(
                        "describe the configs of", resource.resource_name or "the cluster"
                    ),
                )
            )
    return kept, refused


_SPLITTERS: Final[dict[str, tuple[Callable[..., tuple[Message, list[Message]]], str, str]]] = {
    # name: (splitter, the request's item field, the response's result field)
    "CreateTopics": (_create_topics, "topics", "topics"),
    "DeleteTopics": (_delete_topics, "", "topics"),
    "CreatePartitions": (_create_partitions, "topics", "topics"),
    "AlterConfigs": (_alter_configs, "resources", "resources"),
    "DescribeConfigs": (_describe_configs, "resources", "results"),
}
PER_ITEM_ADMIN_RPCS: Final = frozenset(_SPLITTERS)


def split_admin_request(
    name: str,
    request: Message,
    context: grpc.aio.ServicerContext | None,
    topic_name_of: TopicNameOf,
) -> tuple[Message | None, list[Message]]:
    """The part of ``request`` (admin call ``name``) to run, ``None`` if nothing is left
    to run, and the refused items' results (see the module docstring)."""
    splitter = _SPLITTERS.get(name)
    if splitter is None or not authorizer_enabled():
        return request, []
    kept, refused = splitter[0](context, request, topic_name_of)
    if not refused:
        return request, []
    left = (
        len(getattr(kept, "names")) + len(getattr(kept, "topic_ids"))  # noqa: B009
        if name == "DeleteTopics"
        else len(getattr(kept, splitter[1]))
    )
    return (kept if left else None), refused


def merge_refusals(name: str, response: Message, refused: list[Message]) -> Message:
    """``response`` with the refused items' results added."""
    if refused:
        getattr(response, _SPLITTERS[name][2]).extend(refused)
    return response
