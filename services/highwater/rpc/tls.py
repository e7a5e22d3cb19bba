"""Transport security: TLS and mutual TLS for every server and channel of a process.

A process's servers and channels are all made in :mod:`highwater.rpc` (``bind``,
``open_channel``), so TLS is configured once per process (:func:`configure`): the server
flags of every role (``--tls-cert-file``, ``--tls-key-file``, ``--tls-ca-file``,
``--tls-client-auth``) set both sides, because the services talk to one another with the
same certificate (controller to controller, broker to controller, follower to leader,
coordinator to broker), as Kafka's inter-broker listener does with its keystore.

- :class:`ServerTls`: the certificate and key a server presents and, with a CA file, the
  client certificates it requires (``required``) or not (``none``). The files are read
  again when they change, at the next handshake, without a restart: cert-manager rotates
  them in place. A file caught half-written, or a certificate and key that do not match
  (one renewed, the other not yet), is skipped (the previous pair stays) and read again
  at the next handshake; at start either is refused, naming the file.
- :class:`ClientTls`: the CA a channel trusts and, for mutual TLS, the certificate and key
  it presents. Each new channel reads the files, so rotated files reach new connections.

Kafka's ``ssl.client.auth=requested`` (a client certificate asked for but optional) cannot
be had here: gRPC's Python API either requires a verified client certificate or does not
ask for one, so ``requested`` is refused at start with that reason.

- :class:`SocketTls`: the same files for a listener that is not gRPC's (the Kafka
  listener), as an :class:`ssl.SSLContext` for asyncio's servers. :meth:`SocketTls.refresh`,
  called as each connection is accepted (before its handshake), loads a changed
  certificate and key into the context, so new connections get them and established ones
  keep theirs. Python's ``ssl`` can ask for a client certificate without requiring one, so
  ``requested`` is served there. Each load builds a new context (certificate, key and
  the CA file's certificates, nothing kept from the last), and the listener's context
  hands each handshake to the newest one as the client's hello arrives (its SNI
  callback), so a CA taken out of the file is no longer trusted from the next refresh.
- A CA file is parsed before it is used, as the certificate and key are: one caught
  half-written keeps the CAs in use (at start it is refused, naming the file).
"""

from __future__ import annotations

import enum
import logging
import os
import ssl
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import serialization

__all__ = [
    "ClientAuth",
    "ClientTls",
    "ServerTls",
    "SocketTls",
    "TlsConfigError",
    "client_tls",
    "client_tls_from_properties",
    "configure",
    "server_tls",
]

log = logging.getLogger(__name__)


class TlsConfigError(ValueError):
    """A TLS setting that cannot work: a missing or unreadable file, a key without a
    certificate, ``requested`` client authentication."""


class ClientAuth(enum.Enum):
    """Kafka's ``ssl.client.auth``."""

    REQUIRED = "required"
    REQUESTED = "requested"
    NONE = "none"


def _read(path: Path, what: str) -> bytes:
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise TlsConfigError(f"{what} {path}: {e.strerror or e}") from None
    if b"-----BEGIN " not in data:
        raise TlsConfigError(f"{what} {path}: not a PEM file")
    return data


def _check_pair(cert: bytes, key: bytes, cert_file: Path) -> None:
    """:class:`TlsConfigError` unless ``cert`` and ``key`` are whole PEM and the key is
    the certificate's: gRPC takes any bytes and fails every handshake after, so a pair
    caught half-rotated (one file renewed, the other not yet) or half-written must be
    seen here, where the pair in use can be kept (:meth:`ServerTls._fetch`)."""
    try:
        certificate = x509.load_pem_x509_certificate(cert)
        private_key = serialization.load_pem_private_key(key, password=None)
    except (ValueError, TypeError) as e:
        raise TlsConfigError(f"{cert_file} and its key: not whole PEM ({e})") from None
    spki = serialization.PublicFormat.SubjectPublicKeyInfo
    der = serialization.Encoding.DER
    if certificate.public_key().public_bytes(der, spki) != private_key.public_key().public_bytes(
        der, spki
    ):
        raise TlsConfigError(f"{cert_file}: the key does not match the certificate")


def _check_ca(ca: bytes, ca_file: Path) -> None:
    """:class:`TlsConfigError` unless ``ca`` is a whole PEM bundle of certificates: gRPC
    and OpenSSL take a bundle cut short (its last certificate half-written) and trust
    what came before, or nothing."""
    try:
        whole = len(x509.load_pem_x509_certificates(ca))
    except ValueError as e:
        raise TlsConfigError(f"TLS CA {ca_file}: not whole PEM certificates ({e})") from None
    begun = ca.count(b"-----BEGIN CERTIFICATE-----")
    if whole != begun:  # the parser skips a block without its end line
        raise TlsConfigError(
            f"TLS CA {ca_file}: {begun} PEM blocks begun, {whole} whole certificates"
        )


def _stamp(paths: tuple[Path, ...]) -> tuple[tuple[int, int], ...]:
    stamps = []
    for path in paths:
        st = os.stat(path)
        stamps.append((st.st_mtime_ns, st.st_size))
    return tuple(stamps)


class ServerTls:
    """A server's TLS (see the module docstring)."""

    def __init__(
        self,
        cert_file: Path,
        key_file: Path,
        ca_file: Path | None = None,
        client_auth: ClientAuth | None = None,
    ) -> None:
        if client_auth is None:
            client_auth = ClientAuth.REQUIRED if ca_file is not None else ClientAuth.NONE
        if client_auth is ClientAuth.REQUESTED:
            raise TlsConfigError(
                "--tls-client-auth requested is not supported: gRPC's Python API either "
                "requires a verified client certificate (required) or asks for none (none)"
            )
        if client_auth is ClientAuth.REQUIRED and ca_file is None:
            raise TlsConfigError("--tls-client-auth required needs --tls-ca-file")
        self.cert_file = Path(cert_file)
        self.key_file = Path(key_file)
        self.ca_file = Path(ca_file) if ca_file is not None else None
        self.client_auth = client_auth
        self._lock = threading.Lock()
        self._paths = tuple(p for p in (self.cert_file, self.key_file, self.ca_file) if p)
        self._current = self._load()
        self._stamp = _stamp(self._paths)

    @property
    def requires_client_certificate(self) -> bool:
        return self.client_auth is ClientAuth.REQUIRED

    def _load(self) -> grpc.ServerCertificateConfiguration:
        key = _read(self.key_file, "TLS key")
        cert = _read(self.cert_file, "TLS certificate")
        ca = _read(self.ca_file, "TLS CA") if self.ca_file is not None else None
        _check_pair(cert, key, self.cert_file)
        if ca is not None:
            assert self.ca_file is not None
            _check_ca(ca, self.ca_file)
        return grpc.ssl_server_certificate_configuration([(key, cert)], root_certificates=ca)

    def credentials(self) -> grpc.ServerCredentials:
        """Credentials that re-read the files when they change (at the next handshake)."""
        return grpc.dynamic_ssl_server_credentials(
            self._current,
            self._fetch,
            require_client_authentication=self.requires_client_certificate,
        )

    def _fetch(self) -> grpc.ServerCertificateConfiguration | None:
        """gRPC's certificate fetcher, called at each handshake: a new configuration when
        the files changed, else ``None`` (keep the one in use)."""
        with self._lock:
            try:
                stamp = _stamp(self._paths)
                if stamp == self._stamp:
                    return None
                configuration = self._load()
            except (OSError, TlsConfigError) as e:
                log.warning("TLS files changed but cannot be read yet (%s); keeping the old", e)
                return None
            self._stamp, self._current = stamp, configuration
            log.info("TLS certificate reloaded from %s", self.cert_file)
            return configuration


class SocketTls:
    """A server's TLS as an :class:`ssl.SSLContext` (see the module docstring)."""

    _VERIFY: Final = {
        ClientAuth.REQUIRED: ssl.CERT_REQUIRED,
        ClientAuth.REQUESTED: ssl.CERT_OPTIONAL,
        ClientAuth.NONE: ssl.CERT_NONE,
    }

    def __init__(self, server: ServerTls, client_auth: ClientAuth | None = None) -> None:
        """``client_auth``: this listener's ``ssl.client.auth`` (default: ``server``'s)."""
        self.server = server
        self.client_auth = client_auth or server.client_auth
        if self.client_auth is not ClientAuth.NONE and server.ca_file is None:
            raise TlsConfigError(f"ssl.client.auth={self.client_auth.value} needs --tls-ca-file")
        self._stamp = _stamp(server._paths)
        self.context = self._build()
        """The listener's context (given to asyncio once): each handshake is moved to the
        newest loaded context as the client's hello arrives."""
        self.context.sni_callback = self._to_current
        self._current = self.context

    def _to_current(
        self, connection: ssl.SSLObject | ssl.SSLSocket, server_name: str | None, _: object
    ) -> None:
        # Called for every hello, with or without a server name: the handshake goes on
        # with the newest certificate, key and trusted CAs.
        connection.context = self._current

    def _build(self) -> ssl.SSLContext:
        """A context of the files as they are now (raises if they cannot be used)."""
        server = self.server
        _read(server.cert_file, "TLS certificate")
        _read(server.key_file, "TLS key")
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.verify_mode = self._VERIFY[self.client_auth]
        try:
            context.load_cert_chain(server.cert_file, server.key_file)
            if server.ca_file is not None and self.client_auth is not ClientAuth.NONE:
                ca = _read(server.ca_file, "TLS CA")
                _check_ca(ca, server.ca_file)
                context.load_verify_locations(cadata=ca.decode("ascii", "replace"))
        except (ssl.SSLError, OSError) as e:
            raise TlsConfigError(f"{server.cert_file}: {e}") from None
        return context

    def refresh(self) -> None:
        """Load the files again if they changed (a half-written file: keep the old)."""
        try:
            stamp = _stamp(self.server._paths)
            if stamp == self._stamp:
                return
            self._current, self._stamp = self._build(), stamp
        except (OSError, TlsConfigError) as e:
            log.warning("TLS files changed but cannot be read yet (%s); keeping the old", e)
            return
        log.info("TLS certificate reloaded from %s", self.server.cert_file)


@dataclass(frozen=True, slots=True)
class ClientTls:
    """What a channel trusts and, for mutual TLS, presents (see the module docstring)."""

    ca_file: Path | None = None
    """The CA certificates to trust; ``None``: the system's."""
    cert_file: Path | None = None
    key_file: Path | None = None

    def __post_init__(self) -> None:
        if (self.cert_file is None) != (self.key_file is None):
            raise TlsConfigError("a client certificate needs its key, and a key its certificate")

    def credentials(self) -> grpc.ChannelCredentials:
        ca = _read(self.ca_file, "TLS CA") if self.ca_file is not None else None
        key = _read(self.key_file, "TLS key") if self.key_file is not None else None
        cert = _read(self.cert_file, "TLS certificate") if self.cert_file is not None else None
        return grpc.ssl_channel_credentials(
            root_certificates=ca, private_key=key, certificate_chain=cert
        )


SECURITY_PROTOCOLS: Final = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
CLIENT_SECURITY_KEYS: Final = frozenset(
    {
        "security.protocol",
        "ssl.ca.location",
        "ssl.certificate.location",
        "ssl.key.location",
        "sasl.mechanism",
        "sasl.username",
        "sasl.password",
        "sasl.oauthbearer.token",
        "sasl.oauthbearer.token.file",
    }
)
"""The client security settings, by their Kafka (librdkafka) names."""


def client_tls_from_properties(props: Mapping[str, str]) -> ClientTls | None:
    """The TLS a client configured with Kafka's names uses (``None``: plaintext). Raises
    :class:`TlsConfigError` naming the key for an unknown key or value. The ``sasl.*``
    settings are read by :func:`highwater.rpc.client_auth.client_security_from_properties`."""
    unknown = sorted(set(props) - CLIENT_SECURITY_KEYS)
    if unknown:
        raise TlsConfigError(
            f"unknown client security setting {unknown[0]!r} "
            f"(known: {', '.join(sorted(CLIENT_SECURITY_KEYS))})"
        )
    protocol = props.get("security.protocol", "PLAINTEXT").upper()
    if protocol not in SECURITY_PROTOCOLS:
        raise TlsConfigError(
            f"security.protocol={props['security.protocol']}: not one of "
            f"{', '.join(SECURITY_PROTOCOLS)}"
        )
    if protocol in ("PLAINTEXT", "SASL_PLAINTEXT"):
        ssl_keys = sorted(key for key in props if key.startswith("ssl."))
        if ssl_keys:
            raise TlsConfigError(f"{ssl_keys[0]} needs security.protocol=SSL or SASL_SSL")
        return None

    def path(key: str) -> Path | None:
        value = props.get(key)
        return Path(value) if value else None

    return ClientTls(
        path("ssl.ca.location"), path("ssl.certificate.location"), path("ssl.key.location")
    )


_server: ServerTls | None = None
_client: ClientTls | None = None


def configure(*, server: ServerTls | None, client: ClientTls | None) -> None:
    """Set the process's TLS: what its servers present (``None``: plaintext) and what its
    channels use (``None``: plaintext)."""
    global _server, _client
    _server, _client = server, client


def server_tls() -> ServerTls | None:
    """The TLS of the process's servers, or ``None`` for plaintext."""
    return _server


def client_tls() -> ClientTls | None:
    """The TLS of the process's channels, or ``None`` for plaintext."""
    return _client
