"""Who a call comes from, for quotas: its user (from the principal) and its client id.

:func:`quota_principal` is the one place where the quota code learns a call's principal.
Today it reads the verified client certificate of a mutual-TLS call (``User:<CN>`` by the
default ``ssl.principal.mapping.rules``, :mod:`highwater.security.principal`) and is
``User:ANONYMOUS`` otherwise, as Kafka's principal of a PLAINTEXT connection is. It is the
seam where the per-call principal of the authentication layer (SASL sessions, the mapping
rules the broker is configured with) plugs in: when that exists, this function returns the
principal it attached to the call, and nothing else here changes.

The client id is the ``client-id`` call metadata, which the client library sets from
``client.id`` on every call it makes to a broker (:class:`~highwater.client.cluster.
ClusterMetadata`), as Kafka's request header carries it; a call without it has the empty
client id, as a Kafka client without ``client.id`` would.

A quota's ``user`` entity is the principal's name (``alice`` for ``User:alice``), as
Kafka's user quotas are.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Final

from cryptography import x509

from highwater.errors import HighwaterError
from highwater.rpc.broker_streams import CLIENT_ID_METADATA_KEY
from highwater.security.principal import SslPrincipalMapper

__all__ = [
    "ANONYMOUS",
    "CLIENT_ID_METADATA_KEY",
    "UNKNOWN_CALLER",
    "QuotaCaller",
    "client_id_of",
    "quota_caller",
    "quota_principal",
]

ANONYMOUS: Final = "User:ANONYMOUS"
_MAPPER: Final = SslPrincipalMapper()


@dataclass(frozen=True, slots=True)
class QuotaCaller:
    """The user (the principal's name) and client id a request is measured under."""

    user: str = "ANONYMOUS"
    client_id: str = ""


UNKNOWN_CALLER: Final = QuotaCaller()


def quota_principal(context: Any) -> str:
    """The principal of the call behind ``context`` (a ``grpc.aio.ServicerContext``):
    ``User:<CN>`` of its verified client certificate, else ``User:ANONYMOUS``."""
    try:
        certificates = context.auth_context().get("x509_pem_cert")
    except (AttributeError, RuntimeError):  # a context without a transport (tests' fakes)
        return ANONYMOUS
    if not certificates:
        return ANONYMOUS
    return _certificate_principal(bytes(certificates[0]))


@functools.lru_cache(maxsize=256)
def _certificate_principal(pem: bytes) -> str:
    try:
        return _MAPPER.principal(x509.load_pem_x509_certificate(pem))
    except (ValueError, HighwaterError):  # not a certificate, or no rule applies
        return ANONYMOUS


def client_id_of(context: Any) -> str:
    """The ``client-id`` metadata of the call (``""`` without one)."""
    for key, value in context.invocation_metadata() or ():
        if key == CLIENT_ID_METADATA_KEY:
            return value if isinstance(value, str) else value.decode("utf-8", "replace")
    return ""


def quota_caller(context: Any) -> QuotaCaller:
    """The user and client id of the call behind ``context``."""
    principal = quota_principal(context)
    _, _, name = principal.partition(":")
    return QuotaCaller(name or principal, client_id_of(context))
