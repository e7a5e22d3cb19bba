"""ACLs: CreateAcls, DescribeAcls and DeleteAcls as metadata records (Kafka's AclControlManager).

Each ACL is an ``AccessControlEntryRecord`` with an id of its own; every broker and
controller replays them into the image's :class:`~highwater.metadata.image.AclsImage`,
whose authorizer decides requests. Creating an ACL that exists already changes nothing and
succeeds, as in Kafka. A creation with an unknown code, an empty name or host, a principal
that is not ``TYPE:NAME`` or a cluster resource not named ``kafka-cluster`` is refused
INVALID_REQUEST on its own; the others of the request are created.

Filters follow Kafka's ``AclBindingFilter``: an unset field matches anything (ANY); a
pattern type of MATCH (2) matches every pattern that covers the filter's resource name
(the literal name, the literal ``*``, and each prefix of it); a literal or prefixed pattern
type matches that pattern type and, when given, exactly that name. A DeleteAcls filter's
result lists every ACL it matches, even one an earlier filter of the request matched too;
each ACL is removed by one record (Kafka's ``AclControlManager.deleteAcls``).
"""

from __future__ import annotations

import base64
import random
from collections.abc import Iterable
from typing import Final

from highwater.controller.results import ControllerResult
from highwater.controller_api.messages import (
    ACL_FILTER_ANY,
    ACL_PATTERN_MATCH,
    AclEntry,
    AclFilter,
    AclResult,
    CreateAclsRequest,
    CreateAclsResponse,
    DeleteAclsFilterResult,
    DeleteAclsRequest,
    DeleteAclsResponse,
    DescribeAclsRequest,
    DescribeAclsResponse,
)
from highwater.metadata.delta import MetadataDelta
from highwater.metadata.image import MetadataImage
from highwater.metadata.records import (
    AccessControlEntryRecord,
    MetadataRecord,
    RemoveAccessControlEntryRecord,
)
from highwater.security import (
    WILDCARD_RESOURCE,
    AclBinding,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
)
from highwater.v1.common_pb2 import ErrorCode

__all__ = ["ANY", "MATCH", "AclControl", "matches"]

ANY: Final = ACL_FILTER_ANY
MATCH: Final = ACL_PATTERN_MATCH


def check_filter(acl_filter: AclFilter) -> None:
    """``ValueError`` for codes no ACL has (ANY aside, and MATCH for the pattern type)."""
    checks = (
        ("resource type", acl_filter.resource_type, {int(t) for t in ResourceType}),
        ("pattern type", acl_filter.pattern_type, {int(t) for t in PatternType} | {MATCH}),
        ("operation", acl_filter.operation, {int(o) for o in AclOperation}),
        ("permission type", acl_filter.permission_type, {int(p) for p in AclPermissionType}),
    )
    for what, value, known in checks:
        if value is not None and value != ANY and value not in known:
            raise ValueError(f"unknown {what} {value}")


def matches(acl_filter: AclFilter, acl: AclBinding) -> bool:
    """Whether ``acl`` is one ``acl_filter`` is about (see the module docstring)."""
    f = acl_filter
    if f.resource_type not in (None, ANY) and f.resource_type != acl.resource_type:
        return False
    if f.principal is not None and f.principal != acl.principal:
        return False
    if f.host is not None and f.host != acl.host:
        return False
    if f.operation not in (None, ANY) and f.operation != acl.operation:
        return False
    if f.permission_type not in (None, ANY) and f.permission_type != acl.permission:
        return False
    if f.pattern_type == MATCH:
        if f.resource_name is None:
            return True
        if acl.pattern_type is PatternType.LITERAL:
            return acl.resource_name in (f.resource_name, WILDCARD_RESOURCE)
        return f.resource_name.startswith(acl.resource_name)
    if f.pattern_type not in (None, ANY) and f.pattern_type != acl.pattern_type:
        return False
    return f.resource_name is None or f.resource_name == acl.resource_name


class AclControl:
    """The controller's ACL requests (see the module docstring)."""

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng

    def create_acls(
        self, image: MetadataImage, request: CreateAclsRequest
    ) -> ControllerResult[CreateAclsResponse]:
        delta = MetadataDelta(image)
        existing = set(image.acls.by_id.values())
        records: list[MetadataRecord] = []
        results: list[AclResult] = []
        for entry in request.creations:
            try:
                acl = entry.binding()
            except ValueError as e:
                results.append(AclResult(ErrorCode.INVALID_REQUEST, str(e)))
                continue
            if acl not in existing:
                existing.add(acl)
                record = AccessControlEntryRecord.of(self._new_id(delta), acl)
                delta.replay(record)
                records.append(record)
            results.append(AclResult())
        return ControllerResult(records, CreateAclsResponse(results=tuple(results)))

    def describe_acls(
        self, image: MetadataImage, request: DescribeAclsRequest
    ) -> ControllerResult[DescribeAclsResponse]:
        try:
            check_filter(request.filter)
        except ValueError as e:
            return ControllerResult(
                [], DescribeAclsResponse(error=ErrorCode.INVALID_REQUEST, error_message=str(e))
            )
        found = _sorted(a for a in image.acls.by_id.values() if matches(request.filter, a))
        return ControllerResult([], DescribeAclsResponse(acls=tuple(map(AclEntry.of, found))))

    def delete_acls(
        self, image: MetadataImage, request: DeleteAclsRequest
    ) -> ControllerResult[DeleteAclsResponse]:
        removed: set[str] = set()
        records: list[MetadataRecord] = []
        results: list[DeleteAclsFilterResult] = []
        for acl_filter in request.filters:
            try:
                check_filter(acl_filter)
            except ValueError as e:
                results.append(DeleteAclsFilterResult(ErrorCode.INVALID_REQUEST, str(e)))
                continue
            deleted = []
            for acl_id, acl in sorted(image.acls.by_id.items()):
                if matches(acl_filter, acl):
                    deleted.append(acl)
                    if acl_id not in removed:
                        removed.add(acl_id)
                        records.append(RemoveAccessControlEntryRecord(acl_id))
            results.append(
                DeleteAclsFilterResult(deleted=tuple(map(AclEntry.of, _sorted(deleted))))
            )
        return ControllerResult(records, DeleteAclsResponse(results=tuple(results)))

    def _new_id(self, delta: MetadataDelta) -> str:
        while True:
            raw = self._rng.getrandbits(128).to_bytes(16, "big")
            acl_id = base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")
            if not acl_id.startswith("-") and raw != bytes(16) and delta.acl(acl_id) is None:
                return acl_id


def _sorted(acls: Iterable[AclBinding]) -> list[AclBinding]:
    return sorted(
        acls,
        key=lambda a: (
            a.resource_type,
            a.resource_name,
            a.pattern_type,
            a.principal,
            a.host,
            a.operation,
            a.permission,
        ),
    )
