"""A throwaway certificate authority: certificates for development clusters and tests.

``highwater dev-cluster --secure``, the chaos harness and the TLS tests need a CA, server
certificates for loopback addresses and client certificates with a chosen subject, with
nothing but the ``cryptography`` package. :class:`CertificateAuthority` makes an ECDSA
P-256 CA and issues leaf certificates signed by it; :meth:`Issued.write` puts a
certificate and its key in PEM files, the key readable by its owner only. Nothing here is
meant for production: a real deployment gets its certificates from cert-manager or its
own PKI.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = [
    "CertificateAuthority",
    "ClusterPki",
    "Issued",
    "secure_server_args",
    "write_cluster_pki",
]

_DAY = datetime.timedelta(days=1)


@dataclass(frozen=True, slots=True)
class Issued:
    """A certificate and its private key."""

    certificate: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    @property
    def certificate_pem(self) -> bytes:
        return self.certificate.public_bytes(serialization.Encoding.PEM)

    @property
    def key_pem(self) -> bytes:
        return self.key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )

    def write(self, certificate_path: Path, key_path: Path) -> None:
        """Write both as PEM, atomically each (a reader never sees half a file, as when
        cert-manager rotates them); the key with mode 0600."""
        _write_atomically(Path(certificate_path), self.certificate_pem, 0o644)
        _write_atomically(Path(key_path), self.key_pem, 0o600)


class CertificateAuthority:
    """A self-signed CA that issues server and client certificates."""

    def __init__(self, name: str = "Highwater development CA", *, days: int = 30) -> None:
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = datetime.datetime.now(datetime.UTC)
        certificate = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _DAY)
            .not_valid_after(now + days * _DAY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False
            )
            .sign(key, hashes.SHA256())
        )
        self.ca = Issued(certificate, key)

    @property
    def certificate_pem(self) -> bytes:
        return self.ca.certificate_pem

    def issue(
        self,
        common_name: str,
        *,
        hosts: Sequence[str] = (),
        server: bool = True,
        client: bool = True,
        not_before: datetime.datetime | None = None,
        not_after: datetime.datetime | None = None,
        organization: str | None = None,
    ) -> Issued:
        """A leaf certificate for ``common_name``: ``hosts`` (names or IP addresses) as
        subject alternative names; usable by a server, a client, or both (services talk
        to each other with one certificate, as Kafka brokers do). The validity defaults
        to a day either side of now; a test of expiry passes its own."""
        key = ec.generate_private_key(ec.SECP256R1())
        attributes = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
        if organization is not None:
            attributes.insert(0, x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
        now = datetime.datetime.now(datetime.UTC)
        usages = [ExtendedKeyUsageOID.SERVER_AUTH] if server else []
        usages += [ExtendedKeyUsageOID.CLIENT_AUTH] if client else []
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name(attributes))
            .issuer_name(self.ca.certificate.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(not_before or now - _DAY)
            .not_valid_after(not_after or now + _DAY)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.ca.key.public_key()),
                critical=False,
            )
        )
        if hosts:
            builder = builder.add_extension(
                x509.SubjectAlternativeName([_general_name(h) for h in hosts]), critical=False
            )
        return Issued(builder.sign(self.ca.key, hashes.SHA256()), key)


def _general_name(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def _write_atomically(path: Path, data: bytes, mode: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temporary, path)


@dataclass(frozen=True, slots=True)
class ClusterPki:
    """The files of a development cluster's certificates (:func:`write_cluster_pki`)."""

    directory: Path
    ca_file: Path

    def files(self, name: str) -> tuple[Path, Path]:
        """The certificate and key files of ``name`` (a process, or ``admin``)."""
        return self.directory / f"{name}.crt", self.directory / f"{name}.key"


def write_cluster_pki(
    directory: Path, hosts_by_name: dict[str, Sequence[str]], *, admin: str = "admin"
) -> ClusterPki:
    """A new CA under ``directory`` (``ca.crt``), a certificate ``CN=<name>`` for each
    process with its hosts as subject alternative names, and a client certificate
    ``CN=<admin>``: what ``highwater dev-cluster --secure`` and the chaos harness run on."""
    directory.mkdir(parents=True, exist_ok=True)
    authority = CertificateAuthority("Highwater development cluster CA")
    pki = ClusterPki(directory, directory / "ca.crt")
    pki.ca_file.write_bytes(authority.certificate_pem)
    for name, hosts in hosts_by_name.items():
        authority.issue(name, hosts=list(dict.fromkeys([*hosts, "127.0.0.1", "localhost"]))).write(
            *pki.files(name)
        )
    authority.issue(admin, server=False).write(*pki.files(admin))
    return pki


def secure_server_args(pki: ClusterPki, name: str, services: Sequence[str]) -> list[str]:
    """The flags of process ``name`` in a secured development cluster: its certificate,
    mutual TLS, the ACL checks on with the admin and every service as super users (Kafka's
    practice for brokers), and SCRAM logins."""
    cert, key = pki.files(name)
    super_users = ";".join(["User:admin", *(f"User:{service}" for service in services)])
    return [
        *("--tls-cert-file", str(cert), "--tls-key-file", str(key)),
        *("--tls-ca-file", str(pki.ca_file), "--super-users", super_users),
        *("--sasl-enabled-mechanisms", "SCRAM-SHA-256,SCRAM-SHA-512"),
    ]
