"""The authorization decision: may this principal, from this host, do this to that resource.

:class:`AclAuthorizer` holds ACLs indexed for the question every request asks, and answers
it as Kafka's ``StandardAuthorizer`` does:

1. a super user (``super.users``) may do anything;
2. otherwise the ACLs that match are those of the resource's type whose pattern covers
   the resource name (the literal name, the literal ``*``, or a prefix of the name), whose
   principal is the caller's or ``User:*``, and whose host is the caller's or ``*``;
3. a matching DENY for the operation (or for ALL) denies: DENY wins;
4. else a matching ALLOW for the operation, for ALL, or for one that implies it (READ,
   WRITE, DELETE or ALTER imply DESCRIBE; ALTER_CONFIGS implies DESCRIBE_CONFIGS) allows;
5. else, when no ACL at all covers the resource (whatever its principal, host or
   operation), ``allow.everyone.if.no.acl.found`` decides; otherwise the answer is deny.

The index: per resource type, literal ACLs by name and prefixed ACLs by prefix, each by
principal, plus the set of prefix lengths in use, so a decision looks up the name, ``*``,
and each prefix length of the name that some ACL uses, and in each the caller's principal
and ``User:*``: a handful of dict look-ups however many ACLs there are, and only the
caller's own ACLs (and the wildcard ones) are read. The object is immutable in use:
:meth:`with_changes` returns a new authorizer (the metadata image replaces it as ACL
records are applied), so a decision never sees half an update.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

from highwater.security.acl import (
    WILDCARD_HOST,
    WILDCARD_PRINCIPAL,
    WILDCARD_RESOURCE,
    AclBinding,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
    implied_by,
)

__all__ = ["AclAuthorizer", "Decision"]


class Decision(enum.Enum):
    ALLOWED = "ALLOWED"
    DENIED = "DENIED"


ALLOWED, DENIED = Decision.ALLOWED, Decision.DENIED
_DENY, _ALL = AclPermissionType.DENY, AclOperation.ALL
_ALLOWING: dict[AclOperation, frozenset[AclOperation]] = {
    operation: frozenset({operation, AclOperation.ALL, *implied_by(operation)})
    for operation in AclOperation
}
"""The ALLOW operations that allow each operation."""


_ByPrincipal = dict[str, tuple[AclBinding, ...]]
"""The ACLs of one resource pattern, by principal."""


@dataclass(frozen=True, slots=True)
class _TypeIndex:
    """The ACLs of one resource type."""

    literal: dict[str, _ByPrincipal]
    prefixed: dict[str, _ByPrincipal]
    prefix_lengths: tuple[int, ...]
    """The lengths of the prefixes in ``prefixed``, ascending."""


class AclAuthorizer:
    """Decisions over a set of ACLs (see the module docstring)."""

    def __init__(
        self,
        acls: Iterable[AclBinding] = (),
        *,
        super_users: Iterable[str] = (),
        allow_everyone_if_no_acl_found: bool = False,
    ) -> None:
        self._acls = frozenset(acls)
        self.super_users = frozenset(super_users)
        self.allow_everyone_if_no_acl_found = allow_everyone_if_no_acl_found
        self._index = _build_index(self._acls)

    @property
    def acls(self) -> frozenset[AclBinding]:
        return self._acls

    def with_changes(
        self, added: Iterable[AclBinding] = (), removed: Iterable[AclBinding] = ()
    ) -> AclAuthorizer:
        """A new authorizer with ``added`` and without ``removed``; this one is unchanged."""
        acls = (self._acls - frozenset(removed)) | frozenset(added)
        return AclAuthorizer(
            acls,
            super_users=self.super_users,
            allow_everyone_if_no_acl_found=self.allow_everyone_if_no_acl_found,
        )

    def authorize(
        self,
        principal: str,
        host: str,
        operation: AclOperation,
        resource_type: ResourceType,
        resource_name: str,
    ) -> Decision:
        """May ``principal`` from ``host`` do ``operation`` to the resource?"""
        if principal in self.super_users:
            return ALLOWED
        index = self._index.get(resource_type)
        if index is None:
            return ALLOWED if self.allow_everyone_if_no_acl_found else DENIED
        allowing = _ALLOWING[operation]
        allowed = False
        found = False
        literal = index.literal
        candidates = [literal.get(resource_name)]
        if resource_name != WILDCARD_RESOURCE:
            candidates.append(literal.get(WILDCARD_RESOURCE))
        if index.prefix_lengths:
            prefixed = index.prefixed
            size = len(resource_name)
            for length in index.prefix_lengths:
                if length > size:
                    break
                candidates.append(prefixed.get(resource_name[:length]))
        for by_principal in candidates:
            if by_principal is None:
                continue
            found = True
            for acls in (by_principal.get(principal), by_principal.get(WILDCARD_PRINCIPAL)):
                if acls is None:
                    continue
                for acl in acls:
                    if acl.host == host or acl.host == WILDCARD_HOST:
                        op = acl.operation
                        if acl.permission is _DENY:
                            if op is operation or op is _ALL:
                                return DENIED
                        elif op in allowing:
                            allowed = True
        if allowed or (not found and self.allow_everyone_if_no_acl_found):
            return ALLOWED
        return DENIED

    def matching(self, resource_type: ResourceType, resource_name: str) -> list[AclBinding]:
        """Every ACL that covers the resource, whatever its principal, host or operation."""
        index = self._index.get(resource_type)
        if index is None:
            return []
        return [
            acl
            for by_principal in _candidates(index, resource_name)
            for acls in by_principal.values()
            for acl in acls
        ]


def _candidates(index: _TypeIndex, name: str) -> list[_ByPrincipal]:
    """The ACL lists of ``index`` whose pattern covers ``name``."""
    literal = index.literal
    found = []
    exact = literal.get(name)
    if exact is not None:
        found.append(exact)
    if name != WILDCARD_RESOURCE:
        everything = literal.get(WILDCARD_RESOURCE)
        if everything is not None:
            found.append(everything)
    if index.prefix_lengths:
        prefixed = index.prefixed
        size = len(name)
        for length in index.prefix_lengths:
            if length > size:
                break
            acls = prefixed.get(name[:length])
            if acls is not None:
                found.append(acls)
    return found


def _build_index(acls: Iterable[AclBinding]) -> dict[ResourceType, _TypeIndex]:
    Table = dict[ResourceType, dict[str, dict[str, list[AclBinding]]]]
    literal: Table = {}
    prefixed: Table = {}
    for acl in acls:
        table = literal if acl.pattern_type is PatternType.LITERAL else prefixed
        by_name = table.setdefault(acl.resource_type, {})
        by_name.setdefault(acl.resource_name, {}).setdefault(acl.principal, []).append(acl)

    def frozen(by_name: dict[str, dict[str, list[AclBinding]]]) -> dict[str, _ByPrincipal]:
        return {
            name: {principal: tuple(v) for principal, v in by_principal.items()}
            for name, by_principal in by_name.items()
        }

    index: dict[ResourceType, _TypeIndex] = {}
    for resource_type in literal.keys() | prefixed.keys():
        by_prefix = prefixed.get(resource_type, {})
        index[resource_type] = _TypeIndex(
            frozen(literal.get(resource_type, {})),
            frozen(by_prefix),
            tuple(sorted({len(prefix) for prefix in by_prefix})),
        )
    return index
