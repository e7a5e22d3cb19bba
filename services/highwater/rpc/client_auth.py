"""The client's side of security: Kafka's client settings, and SASL over gRPC channels.

:func:`client_security_from_properties` reads Kafka's (librdkafka's) client settings:
``security.protocol`` (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL), ``ssl.ca.location``,
``ssl.certificate.location``, ``ssl.key.location``, ``sasl.mechanism`` (SCRAM-SHA-256,
SCRAM-SHA-512, OAUTHBEARER), ``sasl.username``, ``sasl.password``,
``sasl.oauthbearer.token``, ``sasl.oauthbearer.token.file``, into a
:class:`ClientSecurity`: the channels' TLS and SASL credentials.

With SASL, every channel :func:`~highwater.rpc.channels.open_channel` opens gets a
:class:`SaslSession` interceptor for its one address: before the first call it runs the
``Authenticate`` exchange with that process (lazily, per endpoint: a session token is good
only on the process that issued it) and puts the token in each call's metadata; it
authenticates again when 80% of the session's lifetime has passed (KIP-368), and once
more when a unary call is answered UNAUTHENTICATED (the server restarted and forgot the
session). A failed authentication raises
:class:`~highwater.errors.SaslAuthenticationError` from the call.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import grpc
import grpc.aio

from highwater.errors import SaslAuthenticationError, UnsupportedSaslMechanismError
from highwater.rpc.tls import (
    ClientTls,
    TlsConfigError,
    client_tls_from_properties,
)
from highwater.security.authentication import SESSION_METADATA_KEY
from highwater.security.sasl_client import SaslCredentials
from highwater.v1 import security_pb2 as pb
from highwater.v1 import security_pb2_grpc
from highwater.v1.common_pb2 import ErrorCode

__all__ = [
    "ClientSecurity",
    "SaslSession",
    "client_sasl",
    "client_security_from_properties",
    "configure_client_sasl",
]

REAUTHENTICATE_AT: Final = 0.8
"""The share of a session's lifetime after which the client authenticates again."""


@dataclass(frozen=True, slots=True)
class ClientSecurity:
    """A client's channels: their TLS (``None``: plaintext) and SASL (``None``: none)."""

    tls: ClientTls | None = None
    sasl: SaslCredentials | None = None


def client_security_from_properties(props: Mapping[str, str]) -> ClientSecurity:
    """Kafka's client settings (see the module docstring); :class:`TlsConfigError` naming
    the key for an unknown key or a value that cannot work."""
    tls = client_tls_from_properties(props)
    protocol = props.get("security.protocol", "PLAINTEXT").upper()
    sasl_keys = sorted(key for key in props if key.startswith("sasl."))
    if not protocol.startswith("SASL"):
        if sasl_keys:
            raise TlsConfigError(
                f"{sasl_keys[0]} needs security.protocol=SASL_SSL or SASL_PLAINTEXT"
            )
        return ClientSecurity(tls, None)
    mechanism = props.get("sasl.mechanism", "").upper()
    if not mechanism:
        raise TlsConfigError(f"security.protocol={protocol} needs sasl.mechanism")
    token_file = props.get("sasl.oauthbearer.token.file")
    try:
        sasl = SaslCredentials(
            mechanism,
            username=props.get("sasl.username", ""),
            password=props.get("sasl.password", ""),
            token=props.get("sasl.oauthbearer.token", ""),
            token_file=Path(token_file) if token_file else None,
        )
    except ValueError as e:
        raise TlsConfigError(str(e)) from None
    return ClientSecurity(tls, sasl)


_sasl: SaslCredentials | None = None


def configure_client_sasl(credentials: SaslCredentials | None) -> None:
    """Set the SASL credentials of the process's channels (``--command-config``)."""
    global _sasl
    _sasl = credentials


def client_sasl() -> SaslCredentials | None:
    return _sasl


class SaslSession:
    """The session of one channel with one process (see the module docstring); its
    :meth:`interceptors` go on the channel (gRPC files an interceptor under one kind only,
    so there is one per kind of call)."""

    def __init__(
        self,
        address: str,
        credentials: SaslCredentials,
        open_plain_channel: Callable[[], grpc.aio.Channel],
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``open_plain_channel``: a channel to ``address`` without this interceptor, for
        the ``Authenticate`` calls."""
        self.address = address
        self.credentials = credentials
        self._open = open_plain_channel
        self._clock = clock
        self._token: str | None = None
        self._refresh_at = 0.0
        self._lock: asyncio.Lock | None = None
        self.principal = ""
        self.authentications = 0

    async def token(self) -> str:
        """A session token good for a while yet (authenticating if needed)."""
        if self._token is not None and self._clock() < self._refresh_at:
            return self._token
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._token is None or self._clock() >= self._refresh_at:
                await self._authenticate()
            assert self._token is not None
            return self._token

    def forget(self, token: str) -> None:
        """``token`` was refused: authenticate again at the next call."""
        if self._token == token:
            self._token = None

    async def _authenticate(self) -> None:
        started = self._clock()
        exchange = self.credentials.exchange()
        message: bytes | None = exchange.first()
        exchange_id = ""
        async with self._open() as channel:
            stub = security_pb2_grpc.AuthenticationStub(channel)
            while message is not None:
                try:
                    answer = await stub.Authenticate(
                        pb.AuthenticateRequest(
                            mechanism=exchange.mechanism,
                            auth_bytes=message,
                            exchange_id=exchange_id,
                        ),
                        timeout=30,
                    )
                except grpc.aio.AioRpcError as e:
                    if e.code() == grpc.StatusCode.UNIMPLEMENTED:
                        raise UnsupportedSaslMechanismError(
                            f"{self.address} does not offer SASL authentication"
                        ) from None
                    raise
                if answer.error == ErrorCode.UNSUPPORTED_SASL_MECHANISM:
                    raise UnsupportedSaslMechanismError(
                        f"{self.address}: {answer.error_message} "
                        f"(offered: {', '.join(answer.enabled_mechanisms) or 'none'})"
                    )
                if answer.error != ErrorCode.NONE:
                    raise SaslAuthenticationError(
                        f"{self.address}: {exchange.mechanism} authentication failed: "
                        f"{answer.error_message}"
                    )
                exchange_id = answer.exchange_id
                reply = exchange.respond(answer.auth_bytes) if answer.auth_bytes else None
                if answer.complete:
                    if not exchange.complete:  # SCRAM is mutual: no session without proof
                        raise SaslAuthenticationError(
                            f"{self.address}: the server ended the {exchange.mechanism} "
                            "exchange without proving that it knows the credential"
                        )
                    break
                message = reply
                if message is None:
                    raise SaslAuthenticationError(f"{self.address}: the exchange did not complete")
        self._token = answer.session_token
        self._refresh_at = started + answer.session_lifetime_ms / 1000 * REAUTHENTICATE_AT
        self.principal = answer.principal
        self.authentications += 1

    def interceptors(self) -> list[Any]:
        return [
            _UnaryUnary(self),
            _UnaryStream(self),
            _StreamUnary(self),
            _StreamStream(self),
        ]

    def details(self, details: grpc.aio.ClientCallDetails, token: str) -> Any:
        metadata = grpc.aio.Metadata(*(details.metadata or ()))
        metadata.add(SESSION_METADATA_KEY, token)
        return details._replace(metadata=metadata)


class _UnaryUnary(grpc.aio.UnaryUnaryClientInterceptor):
    def __init__(self, session: SaslSession) -> None:
        self.session = session

    async def intercept_unary_unary(
        self, continuation: Any, client_call_details: Any, request: Any
    ) -> Any:
        session = self.session
        token = await session.token()
        call = await continuation(session.details(client_call_details, token), request)
        if await call.code() != grpc.StatusCode.UNAUTHENTICATED:
            return call
        session.forget(token)  # the process forgot the session (restarted): once more
        token = await session.token()
        return await continuation(session.details(client_call_details, token), request)


class _UnaryStream(grpc.aio.UnaryStreamClientInterceptor):
    def __init__(self, session: SaslSession) -> None:
        self.session = session

    async def intercept_unary_stream(
        self, continuation: Any, client_call_details: Any, request: Any
    ) -> Any:
        token = await self.session.token()
        return await continuation(self.session.details(client_call_details, token), request)


class _StreamUnary(grpc.aio.StreamUnaryClientInterceptor):
    def __init__(self, session: SaslSession) -> None:
        self.session = session

    async def intercept_stream_unary(
        self, continuation: Any, client_call_details: Any, request_iterator: Any
    ) -> Any:
        token = await self.session.token()
        details = self.session.details(client_call_details, token)
        return await continuation(details, request_iterator)


class _StreamStream(grpc.aio.StreamStreamClientInterceptor):
    def __init__(self, session: SaslSession) -> None:
        self.session = session

    async def intercept_stream_stream(
        self, continuation: Any, client_call_details: Any, request_iterator: Any
    ) -> Any:
        token = await self.session.token()
        details = self.session.details(client_call_details, token)
        return await continuation(details, request_iterator)
