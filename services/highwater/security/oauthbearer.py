"""OAUTHBEARER (RFC 7628, Kafka's KIP-255/KIP-768): a JWT checked against a JWKS file.

The client sends ``n,[a=<authzid>],\\x01auth=Bearer <token>\\x01\\x01``;
:class:`JwtValidator` checks the token with PyJWT as Kafka's
``OAuthBearerValidatorCallbackHandler`` does: the signature against the key of the JWKS
whose ``kid`` the token names (an asymmetric algorithm only: RS/PS/ES/EdDSA, never
``none`` nor an HMAC keyed by a public key), the issuer and audience configured, an
expiry and an issued-at time (both required, neither negative: Kafka's validator sets
``setRequireIssuedAt``), not-before with a little leeway for clock skew, and the subject
claim (``sub`` unless configured) as the principal's name, trimmed and refused if nothing
is left (Kafka's ``ClaimValidationUtils.validateSubject``). A client may name an
authorization id, but only the token's own principal name (Kafka's
``OAuthBearerSaslServer``): a token of ``alice`` never acts for ``admin``. Every failure
is one :class:`~highwater.errors.SaslAuthenticationError` naming the reason, so the
refusal can be logged; the client is told no more than that.

The clock is a parameter (seconds since the epoch), so the check is pure.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from highwater.errors import SaslAuthenticationError

__all__ = [
    "ALGORITHMS",
    "ClientMessage",
    "JwtValidator",
    "ValidatedToken",
    "parse_client_message",
]

ALGORITHMS: Final = (
    "RS256",
    "RS384",
    "RS512",
    "PS256",
    "PS384",
    "PS512",
    "ES256",
    "ES384",
    "ES512",
    "EdDSA",
)


_KEY_TYPES: Final = {"RS": "RSA", "PS": "RSA", "ES": "EC", "Ed": "OKP"}
"""The JWK key type (``kty``) each algorithm family of :data:`ALGORITHMS` signs with."""


_JAVA_WHITESPACE: Final = "".join(map(chr, range(0x21)))
"""What Java's ``String.trim`` strips, as Kafka trims the subject: ASCII space and controls."""


def _seconds(claims: Mapping[str, Any], name: str) -> float:
    """A NumericDate claim (RFC 7519: seconds since the epoch, a finite number); PyJWT
    checks their type only when it checks the times, which it does not here."""
    value = claims[name]
    try:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TypeError(name)
        seconds = float(value)  # OverflowError for an integer beyond any float
        if not math.isfinite(seconds):
            raise ValueError(name)
    except (TypeError, ValueError, OverflowError):
        raise SaslAuthenticationError(
            f"the token's {name} claim is not a number of seconds"
        ) from None
    return seconds


@dataclass(frozen=True, slots=True)
class ValidatedToken:
    """What a valid token proves: the principal's name and until when."""

    subject: str
    expires_at_s: float

    @property
    def principal(self) -> str:
        return f"User:{self.subject}"


@dataclass(frozen=True, slots=True)
class ClientMessage:
    """An OAUTHBEARER client message: the bearer token and the authorization id the
    client asks to act as (``""``: none asked, the token's own principal)."""

    token: str
    authzid: str = ""


def _saslname(value: str) -> str:
    """A GS2 ``saslname`` decoded (RFC 5801: ``=2C`` is ``,`` and ``=3D`` is ``=``)."""
    if re.fullmatch(r"(?:[^=,]|=2C|=3D)+", value) is None:
        raise SaslAuthenticationError("the OAUTHBEARER authorization id is malformed")
    return value.replace("=2C", ",").replace("=3D", "=")


def parse_client_message(message: bytes) -> ClientMessage:
    """The bearer token and authorization id of an OAUTHBEARER client message (RFC 7628,
    section 3.1; the GS2 header of RFC 5801)."""
    try:
        text = message.decode("utf-8")
    except UnicodeDecodeError:
        raise SaslAuthenticationError("the OAUTHBEARER message is not UTF-8") from None
    header, sep, rest = text.partition("\x01")
    if not sep or not header.startswith(("n,", "y,")) or not rest.endswith("\x01\x01"):
        raise SaslAuthenticationError("the OAUTHBEARER message is malformed")
    authzid, comma, tail = header[2:].partition(",")
    if not comma or tail:
        raise SaslAuthenticationError("the OAUTHBEARER message is malformed")
    if authzid:
        if not authzid.startswith("a="):
            raise SaslAuthenticationError("the OAUTHBEARER message is malformed")
        authzid = _saslname(authzid[2:])
    for item in rest[:-2].split("\x01"):
        key, _, value = item.partition("=")
        if key == "auth":
            scheme, _, token = value.partition(" ")
            if scheme.lower() != "bearer" or not token:
                raise SaslAuthenticationError("the OAUTHBEARER auth value is not 'Bearer <token>'")
            return ClientMessage(token, authzid)
    raise SaslAuthenticationError("the OAUTHBEARER message has no auth value")


if TYPE_CHECKING:
    import jwt


class JwtValidator:
    """Checks tokens against one JWKS, issuer and audience (see the module docstring).

    PyJWT (and the ``cryptography`` it loads) is imported by the validator, not by this
    module: clients import the SASL layer, and only a broker that validates tokens needs it.
    """

    def __init__(
        self,
        jwks: Mapping[str, Any],
        *,
        issuer: str,
        audience: str,
        subject_claim: str = "sub",
        clock_skew_s: float = 30,
    ) -> None:
        import jwt

        try:
            self._keys = jwt.PyJWKSet.from_dict(dict(jwks))
        except jwt.PyJWTError as e:
            raise ValueError(f"the JWKS is not usable: {e}") from None
        self.issuer = issuer
        self.audience = audience
        self.subject_claim = subject_claim
        self.clock_skew_s = clock_skew_s

    @classmethod
    def from_file(cls, path: Path, *, issuer: str, audience: str, **kwargs: Any) -> JwtValidator:
        """A validator of the JWKS in ``path`` (a JSON file, as an identity provider serves
        it at its jwks_uri)."""
        try:
            jwks = json.loads(Path(path).read_text())
        except (OSError, ValueError) as e:
            raise ValueError(f"{path}: not a JWKS file: {e}") from None
        return cls(jwks, issuer=issuer, audience=audience, **kwargs)

    def authenticate(self, message: ClientMessage, now_s: float) -> ValidatedToken:
        """The principal ``message`` proves at ``now_s``: its token's, which any
        authorization id it names must equal (Kafka: "Client requested an authorization
        id (...) that is different from the token's principal name (...)")."""
        token = self.validate(message.token, now_s)
        if message.authzid and message.authzid != token.subject:
            raise SaslAuthenticationError(
                f"the client asked to act as {message.authzid!r}, "
                f"not the token's principal name {token.subject!r}"
            )
        return token

    def validate(self, token: str, now_s: float) -> ValidatedToken:
        """The subject and expiry of ``token`` if it is valid at ``now_s``."""
        import jwt

        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError as e:
            raise SaslAuthenticationError(f"the token is not a JWT: {e}") from None
        algorithm = header.get("alg")
        if algorithm not in ALGORITHMS:
            raise SaslAuthenticationError(f"the token's algorithm {algorithm!r} is not accepted")
        kid = header.get("kid")
        try:
            key = self._keys[kid] if kid is not None else self._only_key()
        except KeyError:
            raise SaslAuthenticationError(f"no key {kid!r} in the JWKS") from None
        if key.key_type != _KEY_TYPES[algorithm[:2]]:
            # PyJWT raises TypeError, not one of its errors, for such a pair.
            raise SaslAuthenticationError(
                f"the token's algorithm {algorithm} does not fit key {kid!r} ({key.key_type})"
            )
        try:
            claims = jwt.decode(
                token,
                key.key,
                algorithms=[algorithm],
                audience=self.audience,
                issuer=self.issuer,
                leeway=self.clock_skew_s,
                options={
                    "require": ["exp", "iat", "iss", "aud", self.subject_claim],
                    # Times are checked below against now_s, not PyJWT's clock.
                    "verify_exp": False,
                    "verify_nbf": False,
                    "verify_iat": False,
                },
            )
        except jwt.PyJWTError as e:
            raise SaslAuthenticationError(f"the token is not valid: {e}") from None
        expires = _seconds(claims, "exp")
        if _seconds(claims, "iat") < 0:
            raise SaslAuthenticationError("the token's iat claim is negative")
        if expires + self.clock_skew_s <= now_s:
            raise SaslAuthenticationError("the token has expired")
        not_before = _seconds(claims, "nbf") if "nbf" in claims else None
        if not_before is not None and not_before - self.clock_skew_s > now_s:
            raise SaslAuthenticationError("the token is not valid yet")
        subject = claims[self.subject_claim]
        if not isinstance(subject, str) or not subject.strip(_JAVA_WHITESPACE):
            raise SaslAuthenticationError(f"the token's {self.subject_claim} claim is empty")
        subject = subject.strip(_JAVA_WHITESPACE)
        return ValidatedToken(subject, expires)

    def _only_key(self) -> jwt.PyJWK:
        if len(self._keys.keys) != 1:
            raise KeyError(None)
        return self._keys.keys[0]
