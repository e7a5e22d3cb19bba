"""Security shared by every service, pure and I/O-free (Kafka's model and names).

- :mod:`~highwater.security.acl` and :mod:`~highwater.security.authorizer`: ACLs and the
  authorization decision;
- :mod:`~highwater.security.scram`: SCRAM-SHA-256/512 credentials and the server's exchange;
- :mod:`~highwater.security.oauthbearer`: OAUTHBEARER JWTs checked against a JWKS;
- :mod:`~highwater.security.principal`: the principal of a client certificate
  (``ssl.principal.mapping.rules``).
"""

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
