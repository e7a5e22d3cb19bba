"""Access control lists with Kafka's model: who may do what to which resource, from where.

An :class:`AclBinding` names a resource pattern (a resource type, a name, and whether the
name is the whole name, ``LITERAL``, or a prefix, ``PREFIXED``) and an access control
entry: a principal (``User:alice``), a host (an address, or ``*``), an operation and a
permission (``ALLOW`` or ``DENY``). The names and numbers are Kafka's (``ResourceType``,
``PatternType``, ``AclOperation``, ``AclPermissionType``), so that what ``kafka-acls``
users write means the same here.

Wildcards, as in Kafka: the literal resource name ``*`` is every resource of its type;
the principal ``User:*`` is every user; the host ``*`` is every host. An ACL for the
operation ``ALL`` covers every operation.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Final

__all__ = [
    "WILDCARD_HOST",
    "WILDCARD_PRINCIPAL",
    "WILDCARD_RESOURCE",
    "AclBinding",
    "AclOperation",
    "AclPermissionType",
    "PatternType",
    "ResourceType",
    "implied_by",
]

WILDCARD_RESOURCE: Final = "*"
WILDCARD_PRINCIPAL: Final = "User:*"
WILDCARD_HOST: Final = "*"


class ResourceType(enum.IntEnum):
    """What an ACL protects; numbers are Kafka's ``ResourceType`` codes."""

    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5


class PatternType(enum.IntEnum):
    """How an ACL's resource name matches; numbers are Kafka's ``PatternType`` codes."""

    LITERAL = 3
    PREFIXED = 4


class AclOperation(enum.IntEnum):
    """What a principal does to a resource; numbers are Kafka's ``AclOperation`` codes."""

    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12


class AclPermissionType(enum.IntEnum):
    """Whether an ACL allows or denies; numbers are Kafka's ``AclPermissionType`` codes."""

    DENY = 2
    ALLOW = 3


_IMPLIED: Final[dict[AclOperation, frozenset[AclOperation]]] = {
    # Whoever may read, write, delete or alter a resource may also describe it, and whoever
    # may alter its configs may describe them (Kafka's AclAuthorizer and StandardAuthorizer).
    AclOperation.DESCRIBE: frozenset(
        {AclOperation.READ, AclOperation.WRITE, AclOperation.DELETE, AclOperation.ALTER}
    ),
    AclOperation.DESCRIBE_CONFIGS: frozenset({AclOperation.ALTER_CONFIGS}),
}


def implied_by(operation: AclOperation) -> frozenset[AclOperation]:
    """The operations whose ALLOW also allows ``operation`` (besides itself and ALL).
    A DENY is never implied: it denies its own operation, or every one for ALL."""
    return _IMPLIED.get(operation, frozenset())


@dataclass(frozen=True, slots=True)
class AclBinding:
    """One ACL: a resource pattern and an access control entry."""

    resource_type: ResourceType
    resource_name: str
    pattern_type: PatternType
    principal: str
    host: str
    operation: AclOperation
    permission: AclPermissionType

    def __post_init__(self) -> None:
        if not self.resource_name:
            raise ValueError("an ACL needs a resource name (or * for every resource)")
        if ":" not in self.principal:
            raise ValueError(f"principal {self.principal!r} is not TYPE:NAME, e.g. User:alice")
        if not self.host:
            raise ValueError("an ACL needs a host (or * for every host)")
        if self.resource_type is ResourceType.CLUSTER and self.resource_name != "kafka-cluster":
            raise ValueError("the cluster resource is named kafka-cluster")
