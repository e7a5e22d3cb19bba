"""SCRAM-SHA-256 and SCRAM-SHA-512 (RFC 5802, RFC 7677): stored credentials and the
server's side of one exchange, with ``scramp`` doing the cryptography.

A user's credential is what Kafka stores for it (``UserScramCredentialRecord``): the salt,
the iteration count, and the stored and server keys derived from the password, never the
password itself. :func:`make_credential` derives one; :class:`ScramExchange` runs the two
round trips of an authentication against a look-up of credentials by user name:

    client-first  ->  server-first      (the salt, the iteration count, a nonce)
    client-final  ->  server-final      (the server's signature: the client checks it)

An unknown user and a wrong password fail alike, with SASL_AUTHENTICATION_FAILED at the
client-final message and the same words, so that the answer does not say which user
names exist. The exchange is pure: no I/O, no clock; the servicer drives it.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

from highwater.errors import (
    IllegalSaslStateError,
    SaslAuthenticationError,
    UnsupportedSaslMechanismError,
)

__all__ = [
    "DEFAULT_ITERATIONS",
    "MECHANISM_NAMES",
    "MECHANISM_NUMBERS",
    "SCRAM_MECHANISMS",
    "ScramCredential",
    "ScramExchange",
    "credential_from_salted_password",
    "make_credential",
    "salted_password",
]

SCRAM_MECHANISMS: Final = ("SCRAM-SHA-256", "SCRAM-SHA-512")
MECHANISM_NUMBERS: Final = {"SCRAM-SHA-256": 1, "SCRAM-SHA-512": 2}
"""Kafka's ``ScramMechanism`` codes, as the metadata records and admin calls carry them."""
MECHANISM_NAMES: Final = {number: name for name, number in MECHANISM_NUMBERS.items()}
DEFAULT_ITERATIONS: Final = 4096
"""Kafka's default and the least RFC 7677 recommends."""
MIN_ITERATIONS: Final = 4096
MAX_ITERATIONS: Final = 16384
"""Kafka's bounds on a credential's iteration count."""

_FAILED: Final = "authentication failed: invalid credentials"
_UNKNOWN_USER_SECRET: Final = os.urandom(32)
"""Keys the stand-in credential of unknown users (:func:`_stand_in_credential`)."""


@dataclass(frozen=True, slots=True)
class ScramCredential:
    """A user's stored SCRAM credential for one mechanism."""

    mechanism: str
    salt: bytes
    stored_key: bytes = field(repr=False)
    server_key: bytes = field(repr=False)
    """The keys are left out of the repr: with the salt they allow a dictionary attack on
    the password, and the server key to pose as the server."""
    iterations: int


if TYPE_CHECKING:
    from scramp import ScramMechanism


def _mechanism(name: str) -> ScramMechanism:
    """``scramp``'s mechanism ``name``; scramp is imported here, on first use, so that a
    client that never runs a SCRAM exchange (most CLI commands) does not load it."""
    from scramp import ScramMechanism

    if name not in SCRAM_MECHANISMS:
        raise UnsupportedSaslMechanismError(
            f"{name} is not a SCRAM mechanism here ({', '.join(SCRAM_MECHANISMS)})"
        )
    return ScramMechanism(name)


def make_credential(
    mechanism: str,
    password: str,
    *,
    iterations: int = DEFAULT_ITERATIONS,
    salt: bytes | None = None,
) -> ScramCredential:
    """The credential a server stores for ``password`` (a random salt unless given)."""
    if not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
        raise ValueError(f"iterations {iterations} is outside [{MIN_ITERATIONS}, {MAX_ITERATIONS}]")
    if not password:
        raise ValueError("a SCRAM password cannot be empty")
    salt_, stored_key, server_key, count = _mechanism(mechanism).make_auth_info(
        password, iteration_count=iterations, salt=salt
    )
    return ScramCredential(mechanism, salt_, stored_key, server_key, count)


_HASHES: Final = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}


def salted_password(mechanism: str, password: str, salt: bytes, iterations: int) -> bytes:
    """RFC 5802's SaltedPassword: PBKDF2 of the password, what a client sends when it sets
    a credential (Kafka's AlterUserScramCredentials) instead of the password itself."""
    _mechanism(mechanism)
    return hashlib.pbkdf2_hmac(_HASHES[mechanism], password.encode(), salt, iterations)


def credential_from_salted_password(
    mechanism: str, salt: bytes, salted: bytes, iterations: int
) -> ScramCredential:
    """The stored credential of a salted password: StoredKey = H(HMAC(SaltedPassword,
    "Client Key")) and ServerKey = HMAC(SaltedPassword, "Server Key") (RFC 5802)."""
    _mechanism(mechanism)
    name = _HASHES[mechanism]
    client_key = hmac.new(salted, b"Client Key", name).digest()
    stored_key = hashlib.new(name, client_key).digest()
    server_key = hmac.new(salted, b"Server Key", name).digest()
    return ScramCredential(mechanism, salt, stored_key, server_key, iterations)


def _stand_in_credential(mechanism: str, user: str) -> ScramCredential:
    """The credential an unknown user's exchange goes on with: the same salt for the same
    name in one process, as a real user's stays the same, Kafka's default iteration count,
    and keys that are HMACs under a secret of this process rather than derived from a
    password, so that no password matches them, and so that answering an unknown user
    costs what a known user's look-up does: a PBKDF2 of the stand-in at each attempt took
    40 times the CPU, and the server-first message's delay told which names exist."""
    name = _HASHES[mechanism]

    def keyed(purpose: bytes) -> bytes:
        message = purpose + b"\0" + mechanism.encode() + b"\0" + user.encode()
        return hmac.new(_UNKNOWN_USER_SECRET, message, name).digest()

    return ScramCredential(
        mechanism, keyed(b"salt")[:16], keyed(b"stored"), keyed(b"server"), DEFAULT_ITERATIONS
    )


class _Stage(enum.Enum):
    CLIENT_FIRST = "client-first"
    CLIENT_FINAL = "client-final"
    DONE = "done"
    FAILED = "failed"


class ScramExchange:
    """The server's side of one SCRAM authentication (see the module docstring)."""

    def __init__(
        self, mechanism: str, credentials: Callable[[str, str], ScramCredential | None]
    ) -> None:
        """``credentials(user, mechanism)``: the stored credential, or ``None``."""
        self.mechanism = mechanism
        self._credentials = credentials
        self._stage = _Stage.CLIENT_FIRST
        self._user: str | None = None
        self._known = False
        self._server = _mechanism(mechanism).make_server(self._auth_info)

    @property
    def complete(self) -> bool:
        return self._stage is _Stage.DONE

    @property
    def user(self) -> str:
        """The authenticated user's name (once :attr:`complete`)."""
        if self._stage is not _Stage.DONE or self._user is None:
            raise IllegalSaslStateError("the SCRAM exchange has not completed")
        return self._user

    def _auth_info(self, user: str) -> tuple[bytes, bytes, bytes, int]:
        self._user = user
        credential = self._credentials(user, self.mechanism)
        if credential is None:
            # Go on with a credential no password matches: the exchange fails at the
            # client-final message as for a wrong password, and says nothing more.
            credential = _stand_in_credential(self.mechanism, user)
            self._known = False
        else:
            self._known = True
        return (
            credential.salt,
            credential.stored_key,
            credential.server_key,
            credential.iterations,
        )

    def respond(self, client_message: bytes) -> bytes:
        """The server's answer to the client's next message. Raises
        :class:`~highwater.errors.SaslAuthenticationError` when the client's proof does
        not match (or the message is malformed), and
        :class:`~highwater.errors.IllegalSaslStateError` after the exchange ended."""
        from scramp import ScramException

        try:
            text = client_message.decode("utf-8")
        except UnicodeDecodeError:
            self._stage = _Stage.FAILED
            raise SaslAuthenticationError("the SCRAM message is not UTF-8") from None
        if self._stage is _Stage.CLIENT_FIRST:
            try:
                self._server.set_client_first(text)
                answer = self._server.get_server_first()
            except ScramException as e:
                self._stage = _Stage.FAILED
                raise SaslAuthenticationError(f"bad SCRAM client-first message: {e}") from None
            self._stage = _Stage.CLIENT_FINAL
            return answer.encode("utf-8")
        if self._stage is _Stage.CLIENT_FINAL:
            try:
                self._server.set_client_final(text)
                answer = self._server.get_server_final()
            except ScramException:
                self._stage = _Stage.FAILED
                raise SaslAuthenticationError(_FAILED) from None
            if not self._known:
                self._stage = _Stage.FAILED
                raise SaslAuthenticationError(_FAILED)
            self._stage = _Stage.DONE
            return answer.encode("utf-8")
        raise IllegalSaslStateError(f"the SCRAM exchange is {self._stage.value}")
