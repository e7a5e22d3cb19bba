"""Authentication over gRPC: SASL exchanges that end in a session token (pure, no I/O).

gRPC has no connection-level SASL, so Highwater does what Kafka's KIP-368 describes for a
connection with a call: a client runs a SASL exchange with the ``Authenticate`` call of
the process it talks to (SCRAM-SHA-256/512 in two steps, OAUTHBEARER in one) and gets a
**session token**, which it puts in the metadata of every later call to that process. The
token is good until ``session_lifetime_ms`` runs out, bounded by the credential's own
lifetime (a JWT's ``exp``); the client authenticates again before then, as a Kafka client
re-authenticates a connection. Its lifetime is ``grpc.session.token.lifetime.ms`` (else a
positive ``connections.max.reauth.ms``, else an hour); the Kafka listener's sessions follow
``connections.max.reauth.ms`` as Kafka does (``broker/kafka_protocol/sasl.py``).

A token is good **only on the process that issued it**, like Kafka's per-connection SASL:
it is an HMAC, under a secret each process draws at start and never shares, of the
principal, the mechanism and the expiry. So no secret needs distributing, a restarted
process forgets every session (clients authenticate again, lazily, per endpoint), and a
token stolen from one broker opens no other.

:class:`Authenticator` runs the server's side:

- an exchange that needs a second step is kept under a random ``exchange_id`` for
  :data:`EXCHANGE_TIMEOUT_S` and for the peer host that began it (at most
  :data:`MAX_PENDING_PER_HOST` of one host's, :data:`MAX_PENDING_EXCHANGES` in all, the
  oldest dropped); a finished, failed, dropped or expired id is ``ILLEGAL_SASL_STATE``.
  SCRAM's server nonce makes every exchange new, so a recorded exchange replayed fails at
  its client-final message;
- an unknown user and a wrong password fail alike (``security/scram.py``);
- failed authentications are counted per peer host: each failure is answered after
  ``failed_authentication_delay_ms`` (Kafka's ``connection.failed.authentication.delay.ms``,
  the servicer waits), and after ``max_failures`` failures within ``failure_window_s`` the
  host is refused without an exchange until the window has passed (a success meanwhile
  clears nothing).

The clock is a parameter everywhere (seconds since the epoch).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from highwater.errors import (
    HighwaterError,
    IllegalSaslStateError,
    SaslAuthenticationError,
    UnsupportedSaslMechanismError,
)
from highwater.security.oauthbearer import JwtValidator, parse_client_message
from highwater.security.scram import SCRAM_MECHANISMS, ScramCredential, ScramExchange

__all__ = [
    "ANONYMOUS",
    "EXCHANGE_TIMEOUT_S",
    "MAX_PENDING_EXCHANGES",
    "MAX_PENDING_PER_HOST",
    "OAUTHBEARER",
    "SASL_MECHANISMS",
    "SESSION_EXPIRED",
    "SESSION_METADATA_KEY",
    "AuthenticationSettings",
    "Authenticator",
    "FailedAuthentications",
    "Session",
    "SessionTokens",
    "StepResult",
]

ANONYMOUS: Final = "User:ANONYMOUS"
OAUTHBEARER: Final = "OAUTHBEARER"
SASL_MECHANISMS: Final = (*SCRAM_MECHANISMS, OAUTHBEARER)
SESSION_METADATA_KEY: Final = "highwater-session"
"""The call metadata key that carries a session token."""
SESSION_EXPIRED: Final = "session expired; re-authenticate"
"""The status details (with ``UNAUTHENTICATED``) of a streaming call that its SASL session
outlived: the client authenticates again and opens another call."""
EXCHANGE_TIMEOUT_S: Final = 30.0
MAX_PENDING_EXCHANGES: Final = 1024
"""Exchanges waiting for their second step; the oldest is dropped past this."""
MAX_PENDING_PER_HOST: Final = 64
"""Exchanges of one peer host waiting for their second step; its own oldest is dropped
past this, so that one host's flood of client-first messages (they cost it nothing)
cannot push out the exchanges of the others."""


@dataclass(frozen=True, slots=True)
class Session:
    """What a valid session token stands for."""

    principal: str
    mechanism: str
    expires_at_s: float


class SessionTokens:
    """Issues and checks this process's session tokens (see the module docstring)."""

    def __init__(self, secret: bytes | None = None) -> None:
        self._secret = secret if secret is not None else secrets.token_bytes(32)

    def issue(self, principal: str, mechanism: str, expires_at_s: float) -> str:
        body = json.dumps(
            {
                "p": principal,
                "m": mechanism,
                "e": round(expires_at_s, 3),
                "n": secrets.token_hex(8),
            },
            separators=(",", ":"),
        ).encode()
        payload = base64.urlsafe_b64encode(body).rstrip(b"=")
        return (payload + b"." + self._sign(payload)).decode("ascii")

    def verify(self, token: str, now_s: float) -> Session:
        """The session of ``token``; :class:`SaslAuthenticationError` if it was not issued
        here (forged, altered, another process's) or has expired."""
        try:
            payload, _, signature = token.encode("ascii").partition(b".")
        except UnicodeEncodeError:
            raise SaslAuthenticationError("the session token is not valid") from None
        if not hmac.compare_digest(self._sign(payload), signature):
            raise SaslAuthenticationError("the session token is not valid here")
        try:
            body = json.loads(base64.urlsafe_b64decode(payload + b"=" * (-len(payload) % 4)))
            session = Session(str(body["p"]), str(body["m"]), float(body["e"]))
        except (ValueError, KeyError, TypeError):
            raise SaslAuthenticationError("the session token is not valid") from None
        if session.expires_at_s <= now_s:
            raise SaslAuthenticationError("the session has expired: authenticate again")
        return session

    def _sign(self, payload: bytes) -> bytes:
        digest = hmac.new(self._secret, payload, hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).rstrip(b"=")


@dataclass(slots=True)
class _Failures:
    times: list[float] = field(default_factory=list)


class FailedAuthentications:
    """Failed authentications per peer host, and whether a host is refused for now."""

    def __init__(self, *, max_failures: int = 5, window_s: float = 10.0) -> None:
        self.max_failures = max_failures
        self.window_s = window_s
        self._by_host: dict[str, _Failures] = {}

    def refused_for(self, host: str, now_s: float) -> float:
        """Seconds ``host`` stays refused (0: it may try)."""
        failures = self._by_host.get(host)
        if failures is None:
            return 0.0
        failures.times = [t for t in failures.times if t > now_s - self.window_s]
        if not failures.times:
            del self._by_host[host]
            return 0.0
        if len(failures.times) < self.max_failures:
            return 0.0
        return failures.times[-self.max_failures] + self.window_s - now_s

    def failed(self, host: str, now_s: float) -> None:
        if len(self._by_host) > 10_000:  # many hosts: forget the stale ones
            for stale in [
                h for h, f in self._by_host.items() if f.times[-1] <= now_s - self.window_s
            ]:
                del self._by_host[stale]
        self._by_host.setdefault(host, _Failures()).times.append(now_s)


@dataclass(frozen=True, slots=True)
class AuthenticationSettings:
    """A process's SASL settings (Kafka's names in docs/security.md)."""

    enabled_mechanisms: tuple[str, ...] = ()
    """``sasl.enabled.mechanisms``: empty, no ``Authenticate`` served."""
    jwt_validator: JwtValidator | None = None
    """OAUTHBEARER's token check (``--oauthbearer-jwks-file``, issuer, audience)."""
    max_session_s: float = 3600.0
    """``grpc.session.token.lifetime.ms``: the longest a gRPC session token lasts; a JWT's
    expiry may shorten it."""
    max_reauth_s: float = 0.0
    """``connections.max.reauth.ms``, as Kafka means it, for the Kafka listener: the longest
    a connection's SASL session lasts before the client must re-authenticate (KIP-368);
    0: no limit of its own (a credential's expiry still ends the session, as in Kafka)."""
    failed_authentication_delay_ms: int = 100
    """``connection.failed.authentication.delay.ms``: how long a failure's answer waits."""
    max_failures: int = 5
    failure_window_s: float = 10.0

    def __post_init__(self) -> None:
        for mechanism in self.enabled_mechanisms:
            if mechanism not in SASL_MECHANISMS:
                known = ", ".join(SASL_MECHANISMS)
                raise ValueError(f"sasl.enabled.mechanisms: {mechanism!r} is not one of {known}")
        if OAUTHBEARER in self.enabled_mechanisms and self.jwt_validator is None:
            raise ValueError(
                "OAUTHBEARER needs --oauthbearer-jwks-file, --oauthbearer-issuer "
                "and --oauthbearer-audience"
            )
        if self.max_session_s <= 0:
            raise ValueError("grpc.session.token.lifetime.ms must be positive")
        if self.max_reauth_s < 0:
            raise ValueError("connections.max.reauth.ms must not be negative")

    @staticmethod
    def parse_mechanisms(text: str) -> tuple[str, ...]:
        """``SCRAM-SHA-256,OAUTHBEARER`` as a tuple (``ValueError`` for an unknown one)."""
        names = tuple(name.strip().upper() for name in text.split(",") if name.strip())
        for name in names:
            if name not in SASL_MECHANISMS:
                raise ValueError(f"{name!r} is not one of {', '.join(SASL_MECHANISMS)}")
        return names


@dataclass(frozen=True, slots=True)
class StepResult:
    """The answer to one ``Authenticate`` step; ``error`` is a Kafka error code (0: none)."""

    error: int = 0
    error_message: str = ""
    auth_bytes: bytes = b""
    exchange_id: str = ""
    complete: bool = False
    session_token: str = ""
    session_lifetime_ms: int = 0
    principal: str = ""
    credential_expires_s: float | None = None
    """When the credential proved expires (a JWT's ``exp``; ``None``: it does not)."""
    failed: bool = False
    """A failed authentication (its answer is delayed and counted)."""


@dataclass(slots=True)
class _Pending:
    exchange: ScramExchange
    host: str
    started_s: float


class Authenticator:
    """The server's side of ``Authenticate`` (see the module docstring)."""

    def __init__(
        self,
        settings: AuthenticationSettings,
        credentials: Callable[[str, str], ScramCredential | None],
        *,
        tokens: SessionTokens | None = None,
    ) -> None:
        """``credentials(user, mechanism)``: the stored SCRAM credential (the image's)."""
        self.settings = settings
        self.tokens = tokens or SessionTokens()
        self._credentials = credentials
        self._pending: OrderedDict[str, _Pending] = OrderedDict()
        self._pending_by_host: dict[str, int] = {}
        self.failures = FailedAuthentications(
            max_failures=settings.max_failures, window_s=settings.failure_window_s
        )

    @property
    def enabled_mechanisms(self) -> tuple[str, ...]:
        return self.settings.enabled_mechanisms

    def step(
        self, host: str, mechanism: str, auth_bytes: bytes, exchange_id: str, now_s: float
    ) -> StepResult:
        """Answer one client message from ``host`` (see the module docstring)."""
        self._expire(now_s)
        refused = self.failures.refused_for(host, now_s)
        if refused > 0:
            return StepResult(
                error=SaslAuthenticationError.code,
                error_message=f"too many failed authentications from {host}: "
                f"retry in {refused:.1f} s",
            )
        try:
            result = self._step(host, mechanism, auth_bytes, exchange_id, now_s)
        except HighwaterError as e:
            failed = isinstance(e, SaslAuthenticationError)
            if failed:
                self.failures.failed(host, now_s)
            return StepResult(
                error=int(getattr(e, "code", -1)), error_message=str(e), failed=failed
            )
        # A success does not clear the host's failures: they count until their window has
        # passed, else a caller with an account of its own could log in as itself between
        # guesses at another's password and never reach the limit.
        return result

    def _step(
        self, host: str, mechanism: str, auth_bytes: bytes, exchange_id: str, now_s: float
    ) -> StepResult:
        if exchange_id:
            pending = self._forget(exchange_id)
            if pending is None or pending.host != host:
                raise IllegalSaslStateError(
                    "no SASL exchange under that id here (finished, expired or never begun)"
                )
            if pending.exchange.mechanism != mechanism:
                raise IllegalSaslStateError("the exchange began with another mechanism")
            answer = pending.exchange.respond(auth_bytes)
            return self._complete(f"User:{pending.exchange.user}", mechanism, now_s, None, answer)
        if mechanism not in self.settings.enabled_mechanisms:
            raise UnsupportedSaslMechanismError(
                f"SASL mechanism {mechanism!r} is not enabled here "
                f"({', '.join(self.settings.enabled_mechanisms) or 'none'})"
            )
        if mechanism == OAUTHBEARER:
            validator = self.settings.jwt_validator
            assert validator is not None  # AuthenticationSettings checks it
            token = validator.authenticate(parse_client_message(auth_bytes), now_s)
            return self._complete(token.principal, mechanism, now_s, token.expires_at_s, b"")
        exchange = ScramExchange(mechanism, self._credentials)
        answer = exchange.respond(auth_bytes)
        if self._pending_by_host.get(host, 0) >= MAX_PENDING_PER_HOST:
            self._forget(next(i for i, p in self._pending.items() if p.host == host))
        while len(self._pending) >= MAX_PENDING_EXCHANGES:
            self._forget(next(iter(self._pending)))
        new_id = secrets.token_urlsafe(18)
        self._pending[new_id] = _Pending(exchange, host, now_s)
        self._pending_by_host[host] = self._pending_by_host.get(host, 0) + 1
        return StepResult(auth_bytes=answer, exchange_id=new_id)

    def _forget(self, exchange_id: str) -> _Pending | None:
        """Take ``exchange_id`` out of the exchanges waiting (``None``: not there)."""
        pending = self._pending.pop(exchange_id, None)
        if pending is not None:
            left = self._pending_by_host[pending.host] - 1
            if left:
                self._pending_by_host[pending.host] = left
            else:
                del self._pending_by_host[pending.host]
        return pending

    def _complete(
        self,
        principal: str,
        mechanism: str,
        now_s: float,
        credential_expires_s: float | None,
        answer: bytes,
    ) -> StepResult:
        expires = now_s + self.settings.max_session_s
        if credential_expires_s is not None:
            expires = min(expires, credential_expires_s)
        lifetime_ms = max(int((expires - now_s) * 1000), 1)
        return StepResult(
            auth_bytes=answer,
            complete=True,
            session_token=self.tokens.issue(principal, mechanism, expires),
            session_lifetime_ms=lifetime_ms,
            principal=principal,
            credential_expires_s=credential_expires_s,
        )

    def _expire(self, now_s: float) -> None:
        while self._pending:
            exchange_id, pending = next(iter(self._pending.items()))
            if pending.started_s > now_s - EXCHANGE_TIMEOUT_S:
                break
            self._forget(exchange_id)

    def session(self, token: str, now_s: float) -> Session:
        """The session of a token presented with a call (raises if not valid)."""
        return self.tokens.verify(token, now_s)
