"""Who a call comes from, for quotas: its user (from the principal) and its client id.

:func:`quota_principal` is the one place where the quota code learns a call's principal:
the principal the authentication layer gave the call (:func:`highwater.rpc.auth.
principal_of`: ``User:<CN>`` of a verified client certificate by the broker's
``ssl.principal.mapping.rules``, the user of a SASL session, else ``User:ANONYMOUS`` as
Kafka's principal of a PLAINTEXT connection is). For a forwarded admin call it is the
original caller, not the forwarding broker.

The client id is the ``client-id`` call metadata, which the client library sets from
``client.id`` on every call it makes to a broker (:class:`~highwater.client.cluster.
ClusterMetadata`), as Kafka's request header carries it; a call without it has the empty
client id, as a Kafka client without ``client.id`` would.

A quota's ``user`` entity is the principal's name (``alice`` for ``User:alice``), as
Kafka's user quotas are.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from highwater.rpc.auth import principal_of
from highwater.rpc.broker_streams import CLIENT_ID_METADATA_KEY

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


@dataclass(frozen=True, slots=True)
class QuotaCaller:
    """The user (the principal's name) and client id a request is measured under."""

    user: str = "ANONYMOUS"
    client_id: str = ""


UNKNOWN_CALLER: Final = QuotaCaller()


def quota_principal(context: Any) -> str:
    """The principal of the call behind ``context`` (a ``grpc.aio.ServicerContext``)."""
    return principal_of(context).principal


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
