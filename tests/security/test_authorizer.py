"""The authorizer's matching rules: unit cases from Kafka's documentation, and a property
test against a model that checks every ACL one by one (no index)."""

from __future__ import annotations

import contextvars
import dataclasses

import pytest
from highwater.broker.authorization import authorize_init_producer_id
from highwater.metadata.image import AclsImage, MetadataImage
from highwater.rpc import auth
from highwater.security import (
    AclAuthorizer,
    AclBinding,
    AclOperation,
    AclPermissionType,
    Decision,
    PatternType,
    ResourceType,
)
from highwater.security import authorizer as authorizer_module
from hypothesis import given, settings
from hypothesis import strategies as st

ALLOW, DENY = AclPermissionType.ALLOW, AclPermissionType.DENY
LITERAL, PREFIXED = PatternType.LITERAL, PatternType.PREFIXED
TOPIC, GROUP, CLUSTER = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER
Op = AclOperation


def acl(
    name: str,
    operation: AclOperation,
    permission: AclPermissionType = ALLOW,
    *,
    principal: str = "User:alice",
    host: str = "*",
    pattern: PatternType = LITERAL,
    resource_type: ResourceType = TOPIC,
) -> AclBinding:
    return AclBinding(resource_type, name, pattern, principal, host, operation, permission)


def decide(
    authorizer: AclAuthorizer,
    name: str,
    operation: AclOperation,
    *,
    principal: str = "User:alice",
    host: str = "10.0.0.1",
    resource_type: ResourceType = TOPIC,
) -> Decision:
    return authorizer.authorize(principal, host, operation, resource_type, name)


def test_an_allow_for_the_operation_allows_only_it_and_what_it_implies() -> None:
    authorizer = AclAuthorizer([acl("orders", Op.WRITE)])
    assert decide(authorizer, "orders", Op.WRITE) is Decision.ALLOWED
    assert decide(authorizer, "orders", Op.DESCRIBE) is Decision.ALLOWED  # implied by WRITE
    assert decide(authorizer, "orders", Op.READ) is Decision.DENIED
    assert decide(authorizer, "orders", Op.WRITE, principal="User:bob") is Decision.DENIED
    assert decide(authorizer, "payments", Op.WRITE) is Decision.DENIED


def test_deny_wins_over_allow_and_is_not_implied() -> None:
    authorizer = AclAuthorizer(
        [
            acl("orders", Op.ALL),
            acl("orders", Op.READ, DENY, host="10.0.0.9"),
            acl("ord", Op.WRITE, DENY, pattern=PREFIXED),
        ]
    )
    assert decide(authorizer, "orders", Op.READ) is Decision.ALLOWED
    assert decide(authorizer, "orders", Op.READ, host="10.0.0.9") is Decision.DENIED
    # DENY READ does not deny DESCRIBE, which ALL allows.
    assert decide(authorizer, "orders", Op.DESCRIBE, host="10.0.0.9") is Decision.ALLOWED
    assert decide(authorizer, "orders", Op.WRITE) is Decision.DENIED  # the prefixed DENY


def test_wildcards_and_prefixes() -> None:
    authorizer = AclAuthorizer(
        [
            acl("*", Op.DESCRIBE, principal="User:*"),
            acl("logs-", Op.READ, pattern=PREFIXED),
            acl("app", Op.READ, principal="User:bob", resource_type=GROUP),
        ]
    )
    assert decide(authorizer, "anything", Op.DESCRIBE, principal="User:zed") is Decision.ALLOWED
    assert decide(authorizer, "logs-nginx", Op.READ) is Decision.ALLOWED
    assert decide(authorizer, "logs-", Op.READ) is Decision.ALLOWED
    assert decide(authorizer, "logs", Op.READ) is Decision.DENIED
    assert decide(authorizer, "app", Op.READ, principal="User:bob", resource_type=GROUP) is (
        Decision.ALLOWED
    )
    # A group ACL says nothing of a topic of the same name.
    assert decide(authorizer, "app", Op.READ, principal="User:bob") is Decision.DENIED


def test_super_users_and_allow_everyone_if_no_acl_found() -> None:
    authorizer = AclAuthorizer(
        [acl("guarded", Op.READ)],
        super_users=["User:admin"],
        allow_everyone_if_no_acl_found=True,
    )
    assert decide(authorizer, "guarded", Op.DELETE, principal="User:admin") is Decision.ALLOWED
    # No ACL covers "open": everyone may. One covers "guarded": only what it allows.
    assert decide(authorizer, "open", Op.WRITE, principal="User:bob") is Decision.ALLOWED
    assert decide(authorizer, "guarded", Op.READ, principal="User:bob") is Decision.DENIED
    assert decide(AclAuthorizer(), "open", Op.WRITE) is Decision.DENIED  # deny by default


def test_with_changes_leaves_the_old_authorizer_alone() -> None:
    before = AclAuthorizer([acl("orders", Op.READ)])
    after = before.with_changes(added=[acl("orders", Op.WRITE)], removed=[acl("orders", Op.READ)])
    assert decide(before, "orders", Op.READ) is Decision.ALLOWED
    assert decide(after, "orders", Op.READ) is Decision.DENIED
    assert decide(after, "orders", Op.WRITE) is Decision.ALLOWED


def test_remembered_decisions_are_bounded_and_stay_right(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(authorizer_module, "DECISIONS_KEPT", 4)
    authorizer = AclAuthorizer(
        [acl("logs-", Op.READ, pattern=PREFIXED), acl("logs-secret", Op.READ, DENY)]
    )
    names = [f"logs-{i}" for i in range(10)] + ["logs-secret", "other"]
    expected = {
        name: Decision.DENIED if name in ("logs-secret", "other") else Decision.ALLOWED
        for name in names
    }
    for _ in range(3):  # asked anew, then remembered (or forgotten and asked anew)
        for name in names:
            assert decide(authorizer, name, Op.READ) is expected[name], name
            assert len(authorizer._decisions) <= 4


def test_bindings_are_checked() -> None:
    with pytest.raises(ValueError, match="TYPE:NAME"):
        acl("orders", Op.READ, principal="alice")
    with pytest.raises(ValueError, match="kafka-cluster"):
        acl("c", Op.ALTER, resource_type=CLUSTER)


# --- the model ----------------------------------------------------------------------------

NAMES = ["a", "ab", "abc", "b", "*"]
PRINCIPALS = ["User:alice", "User:bob", "User:*"]
HOSTS = ["10.0.0.1", "10.0.0.2", "*"]
IMPLIES = {
    Op.DESCRIBE: {Op.READ, Op.WRITE, Op.DELETE, Op.ALTER},
    Op.DESCRIBE_CONFIGS: {Op.ALTER_CONFIGS},
}


def model(
    acls: list[AclBinding],
    super_users: set[str],
    allow_if_none: bool,
    principal: str,
    host: str,
    operation: AclOperation,
    resource_type: ResourceType,
    name: str,
) -> Decision:
    if principal in super_users:
        return Decision.ALLOWED

    def covers(a: AclBinding) -> bool:
        if a.resource_type != resource_type:
            return False
        if a.pattern_type is LITERAL:
            return a.resource_name in (name, "*")
        return name.startswith(a.resource_name)

    covering = [a for a in acls if covers(a)]
    mine = [a for a in covering if a.principal in (principal, "User:*") and a.host in (host, "*")]
    if any(a.permission is DENY and a.operation in (operation, Op.ALL) for a in mine):
        return Decision.DENIED
    allowing = {operation, Op.ALL} | IMPLIES.get(operation, set())
    if any(a.permission is ALLOW and a.operation in allowing for a in mine):
        return Decision.ALLOWED
    if not covering and allow_if_none:
        return Decision.ALLOWED
    return Decision.DENIED


bindings = st.builds(
    AclBinding,
    st.sampled_from([TOPIC, GROUP]),
    st.sampled_from(NAMES),
    st.sampled_from([LITERAL, PREFIXED]),
    st.sampled_from(PRINCIPALS),
    st.sampled_from(HOSTS),
    st.sampled_from(list(AclOperation)),
    st.sampled_from([ALLOW, DENY]),
)


@settings()  # examples: the profile's (tests/conftest.py)
@given(
    acls=st.lists(bindings, max_size=12),
    super_users=st.sets(st.sampled_from(["User:alice", "User:admin"]), max_size=1),
    allow_if_none=st.booleans(),
    principal=st.sampled_from(["User:alice", "User:bob", "User:admin"]),
    host=st.sampled_from(["10.0.0.1", "10.0.0.2"]),
    operation=st.sampled_from(list(AclOperation)),
    resource_type=st.sampled_from([TOPIC, GROUP]),
    name=st.sampled_from(["a", "ab", "abc", "abd", "b", "c"]),
)
def test_decisions_match_the_model(
    acls: list[AclBinding],
    super_users: set[str],
    allow_if_none: bool,
    principal: str,
    host: str,
    operation: AclOperation,
    resource_type: ResourceType,
    name: str,
) -> None:
    authorizer = AclAuthorizer(
        acls, super_users=super_users, allow_everyone_if_no_acl_found=allow_if_none
    )
    expected = model(
        acls, super_users, allow_if_none, principal, host, operation, resource_type, name
    )
    assert authorizer.authorize(principal, host, operation, resource_type, name) is expected
    # Asked again: the remembered decision.
    assert authorizer.authorize(principal, host, operation, resource_type, name) is expected


@pytest.mark.parametrize(
    ("acls", "allowed"),
    [
        ([acl("orders", Op.WRITE)], True),
        ([acl("ord", Op.ALL, pattern=PREFIXED)], True),
        ([acl("*", Op.WRITE, principal="User:*")], True),
        ([acl("orders", Op.READ)], False),
        ([acl("orders", Op.WRITE, host="10.0.0.2")], False),
        ([acl("orders", Op.WRITE, principal="User:bob")], False),
        ([acl("orders", Op.WRITE, resource_type=GROUP)], False),
        # Kafka's authorizeByResourceType: a DENY that covers the ALLOW's pattern wins.
        ([acl("orders", Op.WRITE), acl("*", Op.WRITE, DENY)], False),
        ([acl("orders", Op.WRITE), acl("*", Op.ALL, DENY, principal="User:*")], False),
        ([acl("orders", Op.WRITE), acl("orders", Op.WRITE, DENY)], False),
        ([acl("orders", Op.WRITE), acl("ord", Op.WRITE, DENY, pattern=PREFIXED)], False),
        ([acl("ord", Op.WRITE, pattern=PREFIXED), acl("o", Op.ALL, DENY, pattern=PREFIXED)], False),
        # ...and one that covers less, another topic, or another operation does not.
        ([acl("ord", Op.WRITE, pattern=PREFIXED), acl("orders", Op.WRITE, DENY)], True),
        ([acl("orders", Op.WRITE), acl("payments", Op.WRITE, DENY)], True),
        ([acl("orders", Op.WRITE), acl("orders", Op.READ, DENY)], True),
        ([acl("orders", Op.WRITE), acl("*", Op.WRITE, DENY, host="10.0.0.2")], True),
    ],
)
def test_init_producer_id_needs_write_on_some_topic_that_no_deny_covers(
    acls: list[AclBinding], allowed: bool
) -> None:
    """KIP-679: InitProducerId without IDEMPOTENT_WRITE on the cluster is allowed with an
    ALLOW of WRITE on some topic, as Kafka's ``authorizeByResourceType`` answers it: not
    when a DENY of WRITE (or ALL) on ``*``, on the same name or on a prefix of it takes
    that ALLOW back."""
    image = dataclasses.replace(
        MetadataImage.empty(), acls=AclsImage({f"acl-{i}": a for i, a in enumerate(acls)})
    )
    before = auth.server_security()
    auth.configure(auth.ServerSecurity(authorizer="acl"))
    auth.follow_image(lambda: image)

    def asked() -> bool:
        auth.serve_as(auth.CallPrincipal("User:alice", "10.0.0.1"))
        return authorize_init_producer_id(None)

    try:
        assert contextvars.copy_context().run(asked) is allowed
    finally:
        auth.configure(before)


@pytest.mark.parametrize(
    ("acls", "allowed"),
    [
        # No topic ACL at all: everyone may write to any topic, so may start a producer.
        ([acl("kafka-cluster", Op.CLUSTER_ACTION, resource_type=CLUSTER)], True),
        ([], True),
        # An ACL on the name Kafka probes covers it: allow-everyone no longer applies.
        ([acl("hardcode", Op.READ, principal="User:bob")], False),
        ([acl("hard", Op.READ, principal="User:bob", pattern=PREFIXED)], False),
        # ACLs on other topics leave the probed name uncovered (Kafka's behaviour too).
        ([acl("orders", Op.READ, principal="User:bob")], True),
        ([acl("orders", Op.WRITE, DENY)], True),
    ],
)
def test_by_resource_type_allows_everyone_where_no_acl_covers_the_probed_name(
    acls: list[AclBinding], allowed: bool
) -> None:
    """Kafka's ``authorizeByResourceType`` first authorizes the caller on the literal
    topic ``hardcode``, so ``allow.everyone.if.no.acl.found`` lets an idempotent producer
    start where no topic ACL covers that name."""
    open_authorizer = AclAuthorizer(acls, allow_everyone_if_no_acl_found=True)
    decision = open_authorizer.authorize_by_resource_type("User:alice", "10.0.0.1", Op.WRITE, TOPIC)
    assert decision is (Decision.ALLOWED if allowed else Decision.DENIED)
    # Without the setting, only an ALLOW does.
    closed = AclAuthorizer(acls).authorize_by_resource_type(
        "User:alice", "10.0.0.1", Op.WRITE, TOPIC
    )
    assert closed is Decision.DENIED


def test_init_producer_id_is_allowed_to_everyone_where_no_acl_is_found() -> None:
    cluster_only = acl(
        "kafka-cluster", Op.CLUSTER_ACTION, principal="User:broker", resource_type=CLUSTER
    )
    image = dataclasses.replace(MetadataImage.empty(), acls=AclsImage({"acl-0": cluster_only}))
    before = auth.server_security()
    auth.configure(auth.ServerSecurity(authorizer="acl", allow_everyone_if_no_acl_found=True))
    auth.follow_image(lambda: image)

    def asked() -> bool:
        auth.serve_as(auth.CallPrincipal("User:alice", "10.0.0.1"))
        return authorize_init_producer_id(None)

    try:
        assert contextvars.copy_context().run(asked)
    finally:
        auth.configure(before)


def test_by_resource_type_still_allows_super_users_over_any_deny() -> None:
    authorizer = AclAuthorizer(
        [acl("*", Op.ALL, DENY, principal="User:*")], super_users=["User:admin"]
    )
    assert authorizer.authorize_by_resource_type("User:admin", "h", Op.WRITE, TOPIC) is (
        Decision.ALLOWED
    )
