"""The client's security settings by Kafka's names, shared by the producer, the consumer
and the admin client: ``security.protocol`` (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL),
``ssl.ca.location``, ``ssl.certificate.location``, ``ssl.key.location``,
``sasl.mechanism``, ``sasl.username``, ``sasl.password``, ``sasl.oauthbearer.token`` and
``sasl.oauthbearer.token.file`` (docs/security.md).

A client given none of them uses the process's settings (``--command-config`` in the CLI,
:func:`highwater.rpc.tls.configure`); a client given any uses exactly those, on every
channel it opens. With SASL, each channel authenticates with its broker or coordinator
before its first call and again before the session expires (``rpc/client_auth.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from highwater.config.definition import ConfigKey, ConfigType
from highwater.errors import InvalidConfigError
from highwater.rpc.client_auth import ClientSecurity, client_security_from_properties
from highwater.rpc.tls import CLIENT_SECURITY_KEYS, TlsConfigError

__all__ = ["SECURITY_CONFIG_KEYS", "security_from_config"]

SECURITY_CONFIG_KEYS: Final = [
    ConfigKey(
        "security.protocol",
        ConfigType.STRING,
        "PLAINTEXT",
        doc="PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL.",
    ),
    *(
        ConfigKey(key, ConfigType.STRING, "", doc="A client security setting (docs/security.md).")
        for key in sorted(CLIENT_SECURITY_KEYS - {"security.protocol"})
    ),
]


def security_from_config(config: Mapping[str, Any]) -> ClientSecurity | None:
    """The channels' security of a client config (``None``: none of the keys given, use
    the process's); :class:`InvalidConfigError` naming the key that cannot work."""
    given = {
        key: str(value)
        for key, value in config.items()
        if key in CLIENT_SECURITY_KEYS and value not in (None, "")
    }
    if not given:
        return None
    try:
        return client_security_from_properties(given)
    except TlsConfigError as e:
        raise InvalidConfigError(f"Invalid security configuration: {e}") from None
