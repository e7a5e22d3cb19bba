"""A Kafka connection's security: its listener's protocol, its principal, and its SASL
authentication (pure: events in, answers out; the clock is a parameter).

**Security protocols.** A Kafka listener is declared as Kafka declares one, with its
security protocol in front of its address (``--kafka-listen SASL_SSL://0.0.0.0:9093``;
no prefix: ``PLAINTEXT``):

- ``PLAINTEXT``: no TLS, no authentication: every connection is ``User:ANONYMOUS``;
- ``SSL``: TLS with the process's ``--tls-*`` files; with a verified client certificate
  the connection is ``User:<CN>`` (``ssl.principal.mapping.rules``), else ``User:ANONYMOUS``;
- ``SASL_PLAINTEXT`` and ``SASL_SSL``: the connection is the principal its SASL
  authentication proves (over TLS for ``SASL_SSL``), whatever certificate it shows.

**SASL** (KIP-43 and KIP-152): a client sends ``SaslHandshake`` naming a mechanism of
``sasl.enabled.mechanisms``, then its mechanism's messages each in a ``SaslAuthenticate``
request (after a v1 handshake), or each as a bare size-prefixed frame (after a v0 one,
KIP-43's framing, answered the same way), and gets the server's in the answers:
SCRAM-SHA-256/512 in two round trips, OAUTHBEARER in one. Each message goes to the process's
:class:`~highwater.security.authentication.Authenticator`, the one the gRPC
``Authenticate`` call uses: the same SCRAM credentials from the metadata image, the same
JWKS checks, and the same count of failures per host, so a host refused for too many
failures over gRPC is refused here too. Until a connection has authenticated, only
``ApiVersions``, ``SaslHandshake`` and ``SaslAuthenticate`` are served; any other request
closes it. A failed authentication is answered ``SASL_AUTHENTICATION_FAILED`` (saying no
more than that; the reason is logged), after ``connection.failed.authentication.delay.ms``,
and the connection is closed.

**Sessions** (KIP-368): the last ``SaslAuthenticate`` answer (v1+) carries
``session_lifetime_ms``, as Kafka's ``SaslServerAuthenticator`` computes it: 0 (the session
never expires) when ``connections.max.reauth.ms`` is 0, its default, and the credential
does not expire (SCRAM); else the shorter of ``connections.max.reauth.ms`` (if positive)
and the time to the credential's expiry (an OAUTHBEARER token's ``exp``, which bounds the
session even when ``connections.max.reauth.ms`` is 0). The
client re-authenticates on the same connection before then (``SaslHandshake`` and
``SaslAuthenticate`` again, its other requests still served meanwhile); a
re-authentication must use the same mechanism and prove the same principal, else it fails
and the connection is closed. A request other than those after the session has expired
closes the connection.

Where no authentication is under way (a listener without SASL, or a connection
authenticated and not re-authenticating), ``SaslHandshake`` and ``SaslAuthenticate`` are
answered ILLEGAL_SASL_STATE and the connection goes on, as Kafka's ``KafkaApis`` answers
them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Final

from highwater.rpc.auth import CallPrincipal
from highwater.rpc.endpoints import parse_endpoint
from highwater.security.authentication import ANONYMOUS, Authenticator
from highwater.v1.common_pb2 import ErrorCode

__all__ = [
    "AuthenticateAnswer",
    "ConnectionSecurity",
    "HandshakeAnswer",
    "KafkaListenerAddress",
    "SecurityProtocol",
    "kafka_session",
    "parse_kafka_listener",
]

_API_VERSIONS, _SASL_HANDSHAKE, _SASL_AUTHENTICATE = 18, 17, 36
_AUTHENTICATION_APIS: Final = frozenset({_API_VERSIONS, _SASL_HANDSHAKE, _SASL_AUTHENTICATE})
_FAILED: Final = "authentication failed"


class SecurityProtocol(enum.Enum):
    """Kafka's listener security protocols (``security.protocol``)."""

    PLAINTEXT = "PLAINTEXT"
    SSL = "SSL"
    SASL_PLAINTEXT = "SASL_PLAINTEXT"
    SASL_SSL = "SASL_SSL"

    @property
    def uses_tls(self) -> bool:
        return self in (SecurityProtocol.SSL, SecurityProtocol.SASL_SSL)

    @property
    def uses_sasl(self) -> bool:
        return self in (SecurityProtocol.SASL_PLAINTEXT, SecurityProtocol.SASL_SSL)


@dataclass(frozen=True, slots=True)
class KafkaListenerAddress:
    """A Kafka listener: its security protocol and where it is bound."""

    protocol: SecurityProtocol
    host: str
    port: int


def parse_kafka_listener(text: str) -> KafkaListenerAddress:
    """``[PROTOCOL://]HOST:PORT`` (``ValueError`` naming what is wrong)."""
    scheme, separator, address = text.partition("://")
    if not separator:
        scheme, address = SecurityProtocol.PLAINTEXT.value, text
    try:
        protocol = SecurityProtocol(scheme.upper())
    except ValueError:
        known = ", ".join(p.value for p in SecurityProtocol)
        raise ValueError(f"{text}: {scheme!r} is not a security protocol ({known})") from None
    host, port = parse_endpoint(address)
    return KafkaListenerAddress(protocol, host, port)


@dataclass(frozen=True, slots=True)
class HandshakeAnswer:
    """A ``SaslHandshake`` answer, and whether the connection ends after it."""

    error_code: int
    mechanisms: tuple[str, ...]
    close: bool = False


@dataclass(frozen=True, slots=True)
class AuthenticateAnswer:
    """A ``SaslAuthenticate`` answer; ``close``: the connection ends after it; ``delay_s``:
    how long the answer waits (a failed authentication's); ``log``: what to log (the
    reason of a failure, or who authenticated), empty for a step in between."""

    error_code: int = ErrorCode.NONE
    error_message: str | None = None
    auth_bytes: bytes = b""
    session_lifetime_ms: int = 0
    close: bool = False
    delay_s: float = 0.0
    log: str = ""


def kafka_session(
    max_reauth_s: float, credential_expires_s: float | None, now_s: float
) -> tuple[int, float | None]:
    """A Kafka connection's SASL session from an authentication completed at ``now_s``:
    the ``session_lifetime_ms`` to answer and when the session expires (``None``: never),
    as Kafka's ``SaslServerAuthenticator`` computes them (see the module docstring)."""
    limits = [] if credential_expires_s is None else [credential_expires_s - now_s]
    if max_reauth_s > 0:
        limits.append(max_reauth_s)
    if not limits:
        return 0, None
    lifetime_s = max(min(limits), 0.0)
    return int(lifetime_s * 1000), now_s + lifetime_s


class ConnectionSecurity:
    """One connection's principal and SASL state (see the module docstring)."""

    def __init__(
        self,
        protocol: SecurityProtocol,
        host: str,
        authenticator: Authenticator,
        *,
        certificate_principal: str | None = None,
    ) -> None:
        """``certificate_principal``: the principal of the client's verified certificate."""
        self.protocol = protocol
        self.host = host
        self._authenticator = authenticator
        self._authenticated = not protocol.uses_sasl
        if certificate_principal is not None and not protocol.uses_sasl:
            self._principal = CallPrincipal(certificate_principal, host, "certificate")
        else:
            self._principal = CallPrincipal(ANONYMOUS, host)
        self._mechanism: str | None = None
        self._bare_tokens = False
        self._exchange_id = ""
        self._expires_at_s: float | None = None
        self._authenticated_with: str | None = None
        """The mechanism of the SASL authentication that opened the session."""

    @property
    def principal(self) -> CallPrincipal:
        return self._principal

    @property
    def authenticated(self) -> bool:
        return self._authenticated

    @property
    def expects_bare_token(self) -> bool:
        """Whether the next frame is a bare SASL token (after a v0 handshake), not a request."""
        return self._bare_tokens and self._mechanism is not None

    @property
    def session_expires_at_s(self) -> float | None:
        return self._expires_at_s

    def admit(self, api_key: int, now_s: float) -> str | None:
        """``None`` if a request of ``api_key`` may be served now, else why the connection
        is closed instead."""
        if not self.protocol.uses_sasl or api_key in _AUTHENTICATION_APIS:
            return None
        if not self._authenticated:
            return f"API {api_key} before SASL authentication"
        if self._expires_at_s is not None and now_s >= self._expires_at_s:
            return f"API {api_key} after the SASL session of {self._principal.principal} expired"
        return None

    def handshake(self, mechanism: str, version: int = 1) -> HandshakeAnswer:
        """``version``: the request's (0: the tokens that follow are bare frames)."""
        enabled = self._authenticator.enabled_mechanisms
        if not self.protocol.uses_sasl:  # (answered as Kafka's KafkaApis does: no SASL here)
            return HandshakeAnswer(ErrorCode.ILLEGAL_SASL_STATE, ())
        if self._mechanism is not None:
            return HandshakeAnswer(ErrorCode.ILLEGAL_SASL_STATE, enabled, close=True)
        if mechanism not in enabled:
            return HandshakeAnswer(ErrorCode.UNSUPPORTED_SASL_MECHANISM, enabled, close=True)
        self._mechanism = mechanism
        self._bare_tokens = version == 0
        self._exchange_id = ""
        return HandshakeAnswer(ErrorCode.NONE, enabled)

    def authenticate(self, auth_bytes: bytes, now_s: float) -> AuthenticateAnswer:
        mechanism = self._mechanism
        if mechanism is None and self._authenticated:
            # No authentication under way (no SASL here, or done and no re-authentication
            # begun): answered as Kafka's KafkaApis does, the connection going on.
            return AuthenticateAnswer(
                ErrorCode.ILLEGAL_SASL_STATE,
                "SaslAuthenticate request received after successful authentication",
            )
        if mechanism is None:
            return AuthenticateAnswer(
                ErrorCode.ILLEGAL_SASL_STATE,
                "SaslAuthenticate without a SaslHandshake before it",
                close=True,
                log="SaslAuthenticate without a SaslHandshake before it",
            )
        if self._authenticated_with not in (None, mechanism):
            self._mechanism, self._exchange_id = None, ""
            return self._refused(
                ErrorCode.SASL_AUTHENTICATION_FAILED,
                "cannot change the SASL mechanism during re-authentication",
                f"re-authentication with {mechanism} of a session opened with "
                f"{self._authenticated_with} (the mechanism cannot change)",
            )
        step = self._authenticator.step(self.host, mechanism, auth_bytes, self._exchange_id, now_s)
        if step.error:
            self._mechanism, self._exchange_id = None, ""
            failed = step.error == ErrorCode.SASL_AUTHENTICATION_FAILED
            return self._refused(
                step.error, _FAILED if failed else step.error_message, step.error_message
            )
        if not step.complete:
            self._exchange_id = step.exchange_id
            return AuthenticateAnswer(auth_bytes=step.auth_bytes)
        self._mechanism, self._exchange_id = None, ""
        if self._authenticated and step.principal != self._principal.principal:
            return self._refused(
                ErrorCode.SASL_AUTHENTICATION_FAILED,
                "cannot change principals during re-authentication",
                f"re-authentication as {step.principal} on a connection of "
                f"{self._principal.principal}",
            )
        again = self._authenticated
        self._authenticated = True
        self._authenticated_with = mechanism
        self._principal = CallPrincipal(step.principal, self.host, mechanism)
        lifetime_ms, self._expires_at_s = kafka_session(
            self._authenticator.settings.max_reauth_s, step.credential_expires_s, now_s
        )
        return AuthenticateAnswer(
            auth_bytes=step.auth_bytes,
            session_lifetime_ms=lifetime_ms,
            log=f"{step.principal} {'re-' if again else ''}authenticated with {mechanism}",
        )

    def _refused(self, code: int, message: str, reason: str) -> AuthenticateAnswer:
        delay = 0.0
        if code == ErrorCode.SASL_AUTHENTICATION_FAILED:
            delay = self._authenticator.settings.failed_authentication_delay_ms / 1000
        return AuthenticateAnswer(code, message, close=True, delay_s=delay, log=reason)
