"""The controller's ACL requests: CreateAcls, DescribeAcls, DeleteAcls on the pure core."""

from __future__ import annotations

import random

from highwater.controller.acl_control import ANY, MATCH, AclControl, matches
from highwater.controller_api.messages import (
    AclEntry,
    AclFilter,
    CreateAclsRequest,
    DeleteAclsRequest,
    DescribeAclsRequest,
)
from highwater.metadata.delta import replay
from highwater.metadata.image import MetadataImage
from highwater.metadata.records import AccessControlEntryRecord, RemoveAccessControlEntryRecord
from highwater.security import AclBinding, AclOperation, AclPermissionType, PatternType
from highwater.security import ResourceType as RT
from highwater.v1.common_pb2 import ErrorCode

TOPIC, GROUP, CLUSTER = 2, 3, 4
LITERAL, PREFIXED = 3, 4
READ, WRITE, DESCRIBE = 3, 4, 8
DENY, ALLOW = 2, 3


def entry(
    name: str,
    op: int = READ,
    *,
    pattern: int = LITERAL,
    principal: str = "User:alice",
    resource_type: int = TOPIC,
    permission: int = ALLOW,
    host: str = "*",
) -> AclEntry:
    return AclEntry(resource_type, name, pattern, principal, host, op, permission)


def apply(image: MetadataImage, records: list[object]) -> MetadataImage:
    return replay(records, image.offset + len(records), image=image)  # type: ignore[arg-type]


def create(control: AclControl, image: MetadataImage, *entries: AclEntry) -> MetadataImage:
    result = control.create_acls(image, CreateAclsRequest(entries))
    assert all(r.error == ErrorCode.NONE for r in result.response.results), result.response
    return apply(image, list(result.records))


def test_created_acls_are_records_the_image_holds_and_describe_finds() -> None:
    control = AclControl(random.Random(1))
    image = create(
        control,
        MetadataImage.empty(),
        entry("orders"),
        entry("logs-", WRITE, pattern=PREFIXED),
        entry("app", principal="User:bob", resource_type=GROUP),
    )
    assert len(image.acls) == 3
    everything = control.describe_acls(image, DescribeAclsRequest()).response
    assert everything.error == ErrorCode.NONE and len(everything.acls) == 3
    topics = control.describe_acls(image, DescribeAclsRequest(AclFilter(resource_type=TOPIC)))
    assert {a.resource_name for a in topics.response.acls} == {"orders", "logs-"}
    bob = control.describe_acls(image, DescribeAclsRequest(AclFilter(principal="User:bob")))
    assert [a.resource_name for a in bob.response.acls] == ["app"]


def test_creating_an_acl_twice_writes_it_once_and_bad_entries_are_refused_alone() -> None:
    control = AclControl(random.Random(1))
    image = create(control, MetadataImage.empty(), entry("orders"))
    result = control.create_acls(
        image,
        CreateAclsRequest(
            (
                entry("orders"),  # exists: nothing to write, success
                entry("orders", 99),  # unknown operation
                entry("x", principal="alice"),  # not TYPE:NAME
                entry("c", resource_type=CLUSTER),  # the cluster is kafka-cluster
                entry("", WRITE),  # no name
                entry("payments", WRITE),
            )
        ),
    )
    codes = [r.error for r in result.response.results]
    assert codes == [ErrorCode.NONE] + [ErrorCode.INVALID_REQUEST] * 4 + [ErrorCode.NONE]
    assert len(result.records) == 1
    assert isinstance(result.records[0], AccessControlEntryRecord)
    assert result.records[0].resource_name == "payments"


def test_delete_reports_each_acl_under_every_filter_and_removes_it_once() -> None:
    control = AclControl(random.Random(1))
    image = create(
        control,
        MetadataImage.empty(),
        entry("orders"),
        entry("orders", WRITE),
        entry("payments", permission=DENY),
    )
    result = control.delete_acls(
        image,
        DeleteAclsRequest(
            (
                AclFilter(resource_name="orders", operation=READ),
                AclFilter(resource_name="orders"),  # READ is reported again (as Kafka)
                AclFilter(operation=77),
            )
        ),
    )
    first, second, bad = result.response.results
    assert [a.operation for a in first.deleted] == [READ]
    assert [a.operation for a in second.deleted] == [READ, WRITE]
    assert bad.error == ErrorCode.INVALID_REQUEST
    assert all(isinstance(r, RemoveAccessControlEntryRecord) for r in result.records)
    assert len({r.id for r in result.records}) == len(result.records) == 2  # type: ignore[attr-defined]
    after = apply(image, list(result.records))
    assert [a.resource_name for a in after.acls.by_id.values()] == ["payments"]


def test_filters_match_as_kafkas_acl_binding_filter() -> None:
    literal = AclBinding(
        RT.TOPIC,
        "orders",
        PatternType.LITERAL,
        "User:a",
        "*",
        AclOperation.READ,
        AclPermissionType.ALLOW,
    )
    wildcard = AclBinding(
        RT.TOPIC,
        "*",
        PatternType.LITERAL,
        "User:a",
        "*",
        AclOperation.READ,
        AclPermissionType.ALLOW,
    )
    prefixed = AclBinding(
        RT.TOPIC,
        "ord",
        PatternType.PREFIXED,
        "User:a",
        "*",
        AclOperation.READ,
        AclPermissionType.ALLOW,
    )
    match_orders = AclFilter(resource_name="orders", pattern_type=MATCH)
    assert [matches(match_orders, a) for a in (literal, wildcard, prefixed)] == [True] * 3
    exact = AclFilter(resource_name="orders")
    assert [matches(exact, a) for a in (literal, wildcard, prefixed)] == [True, False, False]
    prefixed_only = AclFilter(pattern_type=PREFIXED)
    assert [matches(prefixed_only, a) for a in (literal, wildcard, prefixed)] == [
        False,
        False,
        True,
    ]
    assert matches(AclFilter(operation=ANY, permission_type=ANY, resource_type=ANY), literal)
    assert not matches(AclFilter(host="10.0.0.1"), literal)
    assert not matches(AclFilter(operation=DESCRIBE), literal)
