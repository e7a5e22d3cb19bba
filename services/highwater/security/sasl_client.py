"""The client's side of a SASL exchange (SCRAM with ``scramp``, OAUTHBEARER), pure.

:class:`SaslCredentials` is what a client is configured with (Kafka's ``sasl.mechanism``,
``sasl.username``, ``sasl.password``, ``sasl.oauthbearer.token`` or
``sasl.oauthbearer.token.file``); :meth:`SaslCredentials.exchange` starts one exchange,
whose :meth:`ClientExchange.first` and :meth:`ClientExchange.respond` give the messages to
send. The driver that sends them over the ``Authenticate`` call lives in ``rpc/auth.py``.
A SCRAM client checks the server's signature in server-final: a server that does not
know the password cannot complete the exchange.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from highwater.errors import SaslAuthenticationError
from highwater.security.authentication import OAUTHBEARER, SASL_MECHANISMS
from highwater.security.scram import SCRAM_MECHANISMS

__all__ = ["ClientExchange", "SaslCredentials", "oauthbearer_client_message"]


def oauthbearer_client_message(token: str) -> bytes:
    """RFC 7628's initial client response for ``token``."""
    return f"n,,\x01auth=Bearer {token}\x01\x01".encode()


@dataclass(frozen=True, slots=True)
class SaslCredentials:
    """A client's SASL settings (see the module docstring)."""

    mechanism: str
    username: str = ""
    password: str = field(default="", repr=False)
    token: str = field(default="", repr=False)
    """The password and the token are left out of the repr: a log line never shows them."""
    token_file: Path | None = None
    """Read at each authentication: a token refreshed in the file is used at the next."""

    def __post_init__(self) -> None:
        if self.mechanism not in SASL_MECHANISMS:
            raise ValueError(
                f"sasl.mechanism={self.mechanism}: not one of {', '.join(SASL_MECHANISMS)}"
            )
        if self.mechanism in SCRAM_MECHANISMS and not (self.username and self.password):
            raise ValueError(
                f"sasl.mechanism={self.mechanism} needs sasl.username and sasl.password"
            )
        if self.mechanism == OAUTHBEARER and not (self.token or self.token_file):
            raise ValueError(
                "sasl.mechanism=OAUTHBEARER needs sasl.oauthbearer.token or "
                "sasl.oauthbearer.token.file"
            )

    def exchange(self) -> ClientExchange:
        return ClientExchange(self)

    def bearer_token(self) -> str:
        if self.token:
            return self.token
        assert self.token_file is not None
        try:
            return self.token_file.read_text().strip()
        except OSError as e:
            raise SaslAuthenticationError(
                f"sasl.oauthbearer.token.file {self.token_file}: {e.strerror or e}"
            ) from None


if TYPE_CHECKING:
    from scramp import ScramClient


class ClientExchange:
    """One exchange: :meth:`first`, then :meth:`respond` to each server message until
    :attr:`complete`. ``scramp`` is imported by a SCRAM exchange's first message: a
    client without SASL, or with OAUTHBEARER, does not load it."""

    def __init__(self, credentials: SaslCredentials) -> None:
        self.mechanism = credentials.mechanism
        self._credentials = credentials
        self._scram: ScramClient | None = None
        self._step = 0

    @property
    def complete(self) -> bool:
        """Whether the server proved itself: a SCRAM server's final message checked out
        (RFC 5802's mutual authentication); OAUTHBEARER has nothing to check of it, once
        the token is sent."""
        if self.mechanism == OAUTHBEARER:
            return self._step > 0
        return self._step == 3

    def first(self) -> bytes:
        if self.mechanism == OAUTHBEARER:
            self._step = 1
            return oauthbearer_client_message(self._credentials.bearer_token())
        from scramp import ScramClient

        self._scram = ScramClient(
            [self.mechanism], self._credentials.username, self._credentials.password
        )
        self._step = 1
        return self._scram.get_client_first().encode()

    def respond(self, server_message: bytes) -> bytes | None:
        """The next client message, or ``None`` once the server's last message checks out.
        Raises :class:`SaslAuthenticationError` when the server's messages do not."""
        if self._scram is None:
            return None
        from scramp import ScramException

        if self._step == 3:
            raise SaslAuthenticationError("the server's SCRAM exchange went on past its end")
        try:
            if self._step == 1:
                self._scram.set_server_first(server_message.decode())
                self._step = 2
                return self._scram.get_client_final().encode()
            self._scram.set_server_final(server_message.decode())
            self._step = 3
        except (ScramException, UnicodeDecodeError) as e:
            raise SaslAuthenticationError(
                f"the server's SCRAM message does not check out: {e}"
            ) from None
        return None
