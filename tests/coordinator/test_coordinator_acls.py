"""The group coordinator's ACL checks, in one process: an embedded server with the checks
on and SCRAM logins; a user may commit and fetch offsets of the group it may read, is
refused GROUP_AUTHORIZATION_FAILED elsewhere (nothing stored), TOPIC_AUTHORIZATION_FAILED
for a topic it may not read, and lists only the groups it may describe; deleting offsets
(OffsetDelete) needs DELETE on the group and READ on each topic.

Plaintext callers are ``User:ANONYMOUS``, made a super user here so that the test can set
the users and ACLs up; the user speaks SASL_PLAINTEXT, so its calls are its own.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from embedded_servers import running_embedded_server
from highwater.client.admin import AdminClient, NewTopic
from highwater.client.errors import GroupAuthorizationFailedError, TopicAuthorizationFailedError
from highwater.rpc import auth
from highwater.security import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
)
from highwater.security.authentication import AuthenticationSettings

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def secured_process() -> Iterator[None]:
    auth.configure(
        auth.ServerSecurity(
            authentication=AuthenticationSettings(enabled_mechanisms=("SCRAM-SHA-256",)),
            super_users=frozenset({"User:ANONYMOUS"}),
        )
    )
    try:
        yield
    finally:
        auth.configure(auth.ServerSecurity())


def allow(operation: AclOperation, resource_type: ResourceType, name: str) -> AclBinding:
    return AclBinding(
        resource_type,
        name,
        PatternType.LITERAL,
        "User:gina",
        "*",
        operation,
        AclPermissionType.ALLOW,
    )


def as_gina(bootstrap: str) -> dict[str, str]:
    """The client settings of user gina, speaking SASL_PLAINTEXT with SCRAM."""
    return {
        "bootstrap.servers": bootstrap,
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "SCRAM-SHA-256",
        "sasl.username": "gina",
        "sasl.password": "gina-pw",
    }


async def test_group_calls_need_the_groups_acls(
    tmp_path: Path, secured_process: None, caplog: pytest.LogCaptureFixture
) -> None:
    async with running_embedded_server(tmp_path) as server:
        async with AdminClient(server.listen) as admin:
            assert (await admin.create_topics([NewTopic("t", 1, 1), NewTopic("u", 1, 1)]))[
                "t"
            ].error is None
            assert await admin.alter_user_scram_credentials(
                [("gina", "SCRAM-SHA-256", "gina-pw")]
            ) == {"gina": None}
            assert await admin.create_acls(
                [
                    allow(AclOperation.READ, ResourceType.GROUP, "mine"),
                    allow(AclOperation.READ, ResourceType.TOPIC, "t"),
                ]
            ) == [None, None]
            await admin.alter_consumer_group_offsets("theirs", {("t", 0): 5})
        gina = as_gina(server.listen)
        async with AdminClient(gina) as client:
            await client.alter_consumer_group_offsets("mine", {("t", 0): 3})
            assert {
                tp: o.offset for tp, o in (await client.list_consumer_group_offsets("mine")).items()
            } == {("t", 0): 3}
            # A topic named that gina may not describe is answered TOPIC_AUTHORIZATION_FAILED;
            # as Kafka's admin client, its partition is left out with a warning.
            with caplog.at_level(logging.WARNING, logger="highwater.client.admin"):
                partial = await client.list_consumer_group_offsets("mine", [("t", 0), ("u", 0)])
            assert {tp: o.offset for tp, o in partial.items()} == {("t", 0): 3}
            [warned] = [
                r.getMessage() for r in caplog.records if r.name == "highwater.client.admin"
            ]
            assert "u-0" in warned and "TOPIC_AUTHORIZATION_FAILED" in warned
            with pytest.raises(GroupAuthorizationFailedError):
                await client.alter_consumer_group_offsets("theirs", {("t", 0): 9})
            with pytest.raises(TopicAuthorizationFailedError):
                await client.alter_consumer_group_offsets("mine", {("u", 0): 1})
            listed = [g.group_id for g in await client.list_consumer_groups()]
            assert listed == ["mine"]  # READ implies DESCRIBE; "theirs" is not shown
            with pytest.raises(GroupAuthorizationFailedError):  # OffsetDelete: DELETE on it
                await client.delete_consumer_group_offsets("mine", [("t", 0)])
        async with AdminClient(server.listen) as admin:
            assert await admin.create_acls(
                [allow(AclOperation.DELETE, ResourceType.GROUP, "mine")]
            ) == [None]
            await admin.alter_consumer_group_offsets("mine", {("u", 0): 2})
        async with AdminClient(gina) as client:
            deleted = await client.delete_consumer_group_offsets("mine", [("t", 0), ("u", 0)])
        assert deleted[("t", 0)] is None
        assert isinstance(deleted[("u", 0)], TopicAuthorizationFailedError)  # READ on u: no
        async with AdminClient(server.listen) as admin:
            theirs = await admin.list_consumer_group_offsets("theirs")
            mine = await admin.list_consumer_group_offsets("mine")
        assert {tp: o.offset for tp, o in theirs.items()} == {("t", 0): 5}  # untouched
        assert {tp: o.offset for tp, o in mine.items()} == {("u", 0): 2}  # (t, 0) deleted


async def test_listings_leave_out_what_the_caller_may_not_see_without_logging_refusals(
    tmp_path: Path, secured_process: None, caplog: pytest.LogCaptureFixture
) -> None:
    """Listing every topic (Metadata with no names) or every group is not a refusal of what
    is left out (Kafka's ``logIfDenied = false``); a topic asked for by name is, and it is
    logged."""
    caplog.set_level(logging.WARNING, logger="highwater.rpc.auth")
    async with running_embedded_server(tmp_path) as server:
        async with AdminClient(server.listen) as admin:
            await admin.create_topics([NewTopic("t", 1, 1), NewTopic("u", 1, 1)])
            await admin.alter_user_scram_credentials([("gina", "SCRAM-SHA-256", "gina-pw")])
            await admin.create_acls([allow(AclOperation.DESCRIBE, ResourceType.TOPIC, "t")])
            await admin.alter_consumer_group_offsets("theirs", {("t", 0): 5})
        gina = as_gina(server.listen)
        async with AdminClient(gina) as client:
            assert [t.name for t in await client.list_topics()] == ["t"]
            assert await client.list_consumer_groups() == []
            refusals = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
            assert refusals == []
            with pytest.raises(TopicAuthorizationFailedError):
                await client.describe_topics(["u"])
        async with AdminClient(server.listen) as admin:
            await admin.create_acls(
                [allow(AclOperation.DESCRIBE, ResourceType.CLUSTER, "kafka-cluster")]
            )
        async with AdminClient(gina) as client:  # DESCRIBE on the cluster: every group
            assert [g.group_id for g in await client.list_consumer_groups()] == ["theirs"]
    refusals = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert refusals == ["refused: principal User:gina from 127.0.0.1 may not DESCRIBE Topic:u"]
