"""The Kafka door's admin calls when forwarding to the controller fails, in process: a
broker whose controller does not answer (a port nobody listens on) still answers every
entry of the request, those it had refused before forwarding with their refusals."""

from __future__ import annotations

import dataclasses
import socket
import uuid
from collections.abc import Callable
from typing import Any, cast

from highwater.broker.kafka_protocol.apis import GroupCalls, KafkaApis
from highwater.broker.kafka_protocol.codec import decode_request
from highwater.broker.request_handler import RequestHandler
from highwater.controller_api.client import ControllerClient
from highwater.metadata.image import AclsImage, MetadataImage
from highwater.rpc import auth
from highwater.security import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
)
from kafka.protocol.admin import DeleteTopicsRequest
from kafka_servers import request_frame

REQUEST_TIMED_OUT, TOPIC_AUTHORIZATION_FAILED, UNKNOWN_TOPIC_ID = 7, 29, 100


def unanswered_address() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


async def delete_topics(image: MetadataImage, entries: list[tuple[str | None, uuid.UUID]]) -> Any:
    controller = ControllerClient(unanswered_address(), timeout_s=0.3, attempt_timeout_s=0.1)
    apis = KafkaApis(
        node_id=1,
        requests=cast(RequestHandler, None),
        controller=controller,
        groups=cast(GroupCalls, None),
        image=cast(Callable[[], MetadataImage], lambda: image),
    )
    R = DeleteTopicsRequest
    request = R(
        topics=[R.DeleteTopicState(name=n, topic_id=i) for n, i in entries], timeout_ms=1_000
    )
    try:
        answer = await apis.delete_topics(decode_request(request_frame(request, 6, 1)[4:]))
    finally:
        await controller.close()
    return sorted(
        ((r.name, r.topic_id if r.topic_id and r.topic_id.int else None, r.error_code)
         for r in answer.responses),
        key=str,
    )  # fmt: skip


async def test_delete_topics_answers_entries_by_id_when_the_controller_does_not_answer() -> None:
    """The door answered only the names; the entry by id got no answer at all."""
    asked = uuid.uuid4()
    answers = await delete_topics(
        MetadataImage.empty(), [("orders", uuid.UUID(int=0)), (None, asked)]
    )
    assert answers == sorted(
        [("orders", None, REQUEST_TIMED_OUT), (None, asked, REQUEST_TIMED_OUT)], key=str
    )


async def test_delete_topics_keeps_the_refusals_made_before_forwarding() -> None:
    """With ACLs: User:alice may delete "mine" only; "theirs" is refused and an unknown id
    is UNKNOWN_TOPIC_ID before anything is forwarded, and those answers stand when the
    forwarding of "mine" fails (they were dropped)."""
    binding = AclBinding(
        ResourceType.TOPIC,
        "mine",
        PatternType.LITERAL,
        "User:alice",
        "*",
        AclOperation.DELETE,
        AclPermissionType.ALLOW,
    )
    image = dataclasses.replace(MetadataImage.empty(), acls=AclsImage({"acl-0": binding}))
    auth.configure(auth.ServerSecurity(authorizer="acl"))
    auth.follow_image(lambda: image)
    auth.serve_as(auth.CallPrincipal("User:alice", "127.0.0.1"))
    zero, unknown = uuid.UUID(int=0), uuid.uuid4()
    answers = await delete_topics(image, [("mine", zero), ("theirs", zero), (None, unknown)])
    assert answers == sorted(
        [
            ("mine", None, REQUEST_TIMED_OUT),
            ("theirs", None, TOPIC_AUTHORIZATION_FAILED),
            (None, unknown, UNKNOWN_TOPIC_ID),
        ],
        key=str,
    )
