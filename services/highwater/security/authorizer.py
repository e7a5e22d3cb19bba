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

The index is built for that question, principal first: per resource type and principal
(the caller's, then ``User:*``), the literal names and the prefixes that principal's ACLs
name, and the prefix lengths *that principal* uses. Each pattern's ACLs are folded, when
the index is built, into two bit masks of operations per host (``*`` apart): the
operations they deny (all of them for a DENY ALL) and the operations they allow (with
ALL and the implied DESCRIBE and DESCRIBE_CONFIGS already expanded). So a decision is a
few dict look-ups (the name, ``*``, each prefix length of the name the caller's ACLs use)
and an OR of integers, however many ACLs there are; for a caller with no ACL of its own,
only ``User:*``'s are read. Whether *any* ACL covers the resource (whatever its
principal), which only ``allow.everyone.if.no.acl.found`` asks, is answered from a second
index, by name and prefix, and only when that setting is on and nothing allowed the call
(that index is built at its first use).

Decisions are remembered, by (principal, host, operation, resource), up to
:data:`DECISIONS_KEPT` of them (then all are forgotten and remembering starts again), as
a request's checks are mostly those of the requests before it: the same producer writing
to the same topics. An authorizer's ACLs never change, so a remembered decision never goes
stale: a new set of ACLs is a new authorizer, with nothing remembered.

The object is immutable in use: :meth:`with_changes` returns a new authorizer (the
metadata image replaces it as ACL records are applied), so a decision never sees half an
update.
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

DECISIONS_KEPT = 65_536
"""How many decisions an authorizer remembers (all are forgotten when it is full)."""
_DENY = AclPermissionType.DENY

PROBE_RESOURCE_NAME = "hardcode"
"""The name :meth:`AclAuthorizer.authorize_by_resource_type` first authorizes the caller
on, as Kafka's ``Authorizer.authorizeByResourceType`` does."""


def _bit(operation: AclOperation) -> int:
    return 1 << int(operation)


_BIT: dict[AclOperation, int] = {operation: _bit(operation) for operation in AclOperation}
"""The bit of each operation in the masks."""

_DENIES: dict[AclOperation, int] = {
    operation: (sum(_BIT.values()) if operation is AclOperation.ALL else _BIT[operation])
    for operation in AclOperation
}
"""The operations a DENY of each operation denies: its own, or every one for ALL."""

_ALLOWS: dict[AclOperation, int] = {
    granted: sum(
        _BIT[asked]
        for asked in AclOperation
        if granted in (asked, AclOperation.ALL) or granted in implied_by(asked)
    )
    for granted in AclOperation
}
"""The operations an ALLOW of each operation allows: its own, every one for ALL, and
those it implies (DESCRIBE for READ, WRITE, DELETE and ALTER; DESCRIBE_CONFIGS for
ALTER_CONFIGS)."""


_Masks = tuple[int, int]
"""(denied, allowed): the operations some ACLs deny and allow, as bits."""

_Pattern = tuple[int, int, dict[str, _Masks] | None]
"""One principal's ACLs on one resource pattern: the masks of those for any host
(``*``), and by host those for one host (``None`` when there are none)."""


@dataclass(frozen=True, slots=True)
class _Grants:
    """What one principal's ACLs (or ``User:*``'s) say of one resource type."""

    literal: dict[str, _Pattern]
    prefixed: dict[str, _Pattern]
    prefix_lengths: tuple[int, ...]
    """The lengths of the prefixes in ``prefixed``, ascending."""


_ByPrincipal = dict[str, tuple[AclBinding, ...]]
"""The ACLs of one resource pattern, by principal."""


@dataclass(frozen=True, slots=True)
class _TypeIndex:
    """The ACLs of one resource type, by pattern (whatever their principal)."""

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
        self._index: dict[ResourceType, _TypeIndex] | None = None
        """By pattern, for :meth:`matching`: built at its first use."""
        self._grants = _build_grants(self._acls)
        self._decisions: dict[tuple[str, str, AclOperation, ResourceType, str], Decision] = {}

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
        key = (principal, host, operation, resource_type, resource_name)
        decision = self._decisions.get(key)
        if decision is None:
            decision = self._decide(principal, host, operation, resource_type, resource_name)
            if len(self._decisions) >= DECISIONS_KEPT:
                self._decisions.clear()
            self._decisions[key] = decision
        return decision

    def _decide(
        self,
        principal: str,
        host: str,
        operation: AclOperation,
        resource_type: ResourceType,
        resource_name: str,
    ) -> Decision:
        by_principal = self._grants.get(resource_type)
        if by_principal is not None:
            denied = allowed = 0
            size = len(resource_name)
            everyone = (
                by_principal.get(WILDCARD_PRINCIPAL) if principal != WILDCARD_PRINCIPAL else None
            )
            for grants in (by_principal.get(principal), everyone):
                if grants is None:
                    continue
                literal = grants.literal
                patterns = [literal.get(resource_name), literal.get(WILDCARD_RESOURCE)]
                if grants.prefix_lengths:
                    prefixed = grants.prefixed
                    for length in grants.prefix_lengths:
                        if length > size:
                            break
                        patterns.append(prefixed.get(resource_name[:length]))
                for pattern in patterns:
                    if pattern is None:
                        continue
                    any_denied, any_allowed, by_host = pattern
                    denied |= any_denied
                    allowed |= any_allowed
                    if by_host is not None:
                        masks = by_host.get(host)
                        if masks is not None:
                            denied |= masks[0]
                            allowed |= masks[1]
            bit = _BIT[operation]
            if denied & bit:
                return DENIED
            if allowed & bit:
                return ALLOWED
        if self.allow_everyone_if_no_acl_found and not self.matching(resource_type, resource_name):
            return ALLOWED
        return DENIED

    def authorize_by_resource_type(
        self, principal: str, host: str, operation: AclOperation, resource_type: ResourceType
    ) -> Decision:
        """May ``principal`` from ``host`` do ``operation`` to *some* resource of the type?
        Kafka's ``authorizeByResourceType`` (KIP-679: InitProducerId with WRITE on some
        topic). First, as Kafka does, the caller is simply authorized on the literal
        resource named :data:`PROBE_RESOURCE_NAME`: that allows a super user, and, with
        ``allow.everyone.if.no.acl.found``, anyone where no ACL covers that name (as
        where the type has no ACL at all). Otherwise: some ALLOW of the operation (or
        ALL) for the caller (or ``User:*``) and its host (or ``*``) that no such DENY
        takes back: a DENY on the literal ``*`` takes back every one, a literal DENY the
        literal ALLOW of its name, a prefixed DENY every ALLOW whose name it is a prefix
        of. An ALLOW on ``*`` that only the literal ``*`` could take back allows. Every
        ACL is read: it is asked once per producer, not per request."""
        if (
            self.authorize(principal, host, operation, resource_type, PROBE_RESOURCE_NAME)
            is ALLOWED
        ):
            return ALLOWED
        denied_literal: set[str] = set()
        denied_prefixes: set[str] = set()
        allowed: list[tuple[bool, str]] = []
        wildcard_allowed = False
        for acl in self._acls:
            if (
                acl.resource_type is not resource_type
                or acl.principal not in (principal, WILDCARD_PRINCIPAL)
                or acl.host not in (host, WILDCARD_HOST)
                or acl.operation not in (operation, AclOperation.ALL)
            ):
                continue
            literal = acl.pattern_type is PatternType.LITERAL
            if acl.permission is _DENY:
                if literal and acl.resource_name == WILDCARD_RESOURCE:
                    return DENIED
                (denied_literal if literal else denied_prefixes).add(acl.resource_name)
            elif literal and acl.resource_name == WILDCARD_RESOURCE:
                wildcard_allowed = True
            else:
                allowed.append((literal, acl.resource_name))
        if wildcard_allowed:
            return ALLOWED
        for literal, name in allowed:
            if literal and name in denied_literal:
                continue
            if any(name[:length] in denied_prefixes for length in range(1, len(name) + 1)):
                continue
            return ALLOWED
        return DENIED

    def matching(self, resource_type: ResourceType, resource_name: str) -> list[AclBinding]:
        """Every ACL that covers the resource, whatever its principal, host or operation."""
        if self._index is None:
            self._index = _build_index(self._acls)
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


def _build_grants(acls: Iterable[AclBinding]) -> dict[ResourceType, dict[str, _Grants]]:
    """The principal-first index :meth:`AclAuthorizer.authorize` reads."""
    # (type, principal, is literal, name) -> host -> [denied, allowed]
    folded: dict[tuple[ResourceType, str, bool, str], dict[str, list[int]]] = {}
    for acl in acls:
        key = (
            acl.resource_type,
            acl.principal,
            acl.pattern_type is PatternType.LITERAL,
            acl.resource_name,
        )
        masks = folded.setdefault(key, {}).setdefault(acl.host, [0, 0])
        if acl.permission is _DENY:
            masks[0] |= _DENIES[acl.operation]
        else:
            masks[1] |= _ALLOWS[acl.operation]
    tables: dict[tuple[ResourceType, str], tuple[dict[str, _Pattern], dict[str, _Pattern]]] = {}
    for (resource_type, principal, is_literal, name), by_host in folded.items():
        any_host = by_host.pop(WILDCARD_HOST, [0, 0])
        pattern: _Pattern = (
            any_host[0],
            any_host[1],
            {host: (m[0], m[1]) for host, m in by_host.items()} or None,
        )
        literal, prefixed = tables.setdefault((resource_type, principal), ({}, {}))
        (literal if is_literal else prefixed)[name] = pattern
    grants: dict[ResourceType, dict[str, _Grants]] = {}
    for (resource_type, principal), (literal, prefixed) in tables.items():
        grants.setdefault(resource_type, {})[principal] = _Grants(
            literal, prefixed, tuple(sorted({len(prefix) for prefix in prefixed}))
        )
    return grants
