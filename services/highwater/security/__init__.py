"""Security shared by every service: ACLs and the authorization decision (Kafka's model)."""

from highwater.security.acl import (
    WILDCARD_HOST,
    WILDCARD_PRINCIPAL,
    WILDCARD_RESOURCE,
    AclBinding,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
)
from highwater.security.authorizer import AclAuthorizer, Decision

__all__ = [
    "WILDCARD_HOST",
    "WILDCARD_PRINCIPAL",
    "WILDCARD_RESOURCE",
    "AclAuthorizer",
    "AclBinding",
    "AclOperation",
    "AclPermissionType",
    "Decision",
    "PatternType",
    "ResourceType",
]
