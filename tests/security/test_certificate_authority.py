"""The throwaway CA's certificates work for gRPC's TLS and mutual TLS on loopback: a
client that trusts the CA reaches a server with a certificate for 127.0.0.1, the server
sees the client certificate's subject, and a certificate of another CA or an expired one
is refused in the handshake."""

from __future__ import annotations

import datetime
import stat
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import grpc.aio
import pytest
from cryptography import x509
from embedded_servers import free_port
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from highwater.security.certificate_authority import CertificateAuthority, Issued

pytestmark = pytest.mark.timeout(30)


@pytest.fixture(scope="module")
def ca() -> CertificateAuthority:
    return CertificateAuthority()


@pytest.fixture
async def mtls_server(ca: CertificateAuthority) -> AsyncIterator[tuple[str, list[str]]]:
    """A health server that requires a client certificate of ``ca``; the subjects seen."""
    issued = ca.issue("broker-1", hosts=["127.0.0.1", "localhost"])
    seen: list[str] = []

    server = grpc.aio.server()

    class Health(health.aio.HealthServicer):
        async def Check(self, request, context):  # type: ignore[no-untyped-def]
            auth = context.auth_context()
            seen.extend(v.decode() for v in auth.get("x509_common_name", []))
            return await super().Check(request, context)

    health_pb2_grpc.add_HealthServicer_to_server(Health(), server)
    credentials = grpc.ssl_server_credentials(
        [(issued.key_pem, issued.certificate_pem)],
        root_certificates=ca.certificate_pem,
        require_client_auth=True,
    )
    address = f"127.0.0.1:{free_port()}"
    server.add_secure_port(address, credentials)
    await server.start()
    try:
        yield address, seen
    finally:
        await server.stop(0)


async def check(address: str, roots: bytes, client: Issued | None) -> None:
    credentials = grpc.ssl_channel_credentials(
        root_certificates=roots,
        private_key=client.key_pem if client else None,
        certificate_chain=client.certificate_pem if client else None,
    )
    async with grpc.aio.secure_channel(address, credentials) as channel:
        await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)


async def test_mutual_tls_with_the_cas_certificates(
    ca: CertificateAuthority, mtls_server: tuple[str, list[str]]
) -> None:
    address, seen = mtls_server
    await check(address, ca.certificate_pem, ca.issue("alice", server=False))
    assert seen == ["alice"]


async def test_foreign_expired_and_missing_client_certificates_are_refused(
    ca: CertificateAuthority, mtls_server: tuple[str, list[str]]
) -> None:
    address, seen = mtls_server
    other = CertificateAuthority("another CA")
    long_ago = datetime.datetime(2020, 1, 1, tzinfo=datetime.UTC)
    expired = ca.issue("old", server=False, not_before=long_ago, not_after=long_ago)
    for client in (other.issue("mallory", server=False), expired, None):
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await check(address, ca.certificate_pem, client)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    # A client that does not trust the server's CA refuses the server.
    with pytest.raises(grpc.aio.AioRpcError):
        await check(address, other.certificate_pem, ca.issue("alice", server=False))
    assert seen == []


def test_written_files_are_pem_and_the_key_is_private(
    ca: CertificateAuthority, tmp_path: Path
) -> None:
    issued = ca.issue("broker-1", hosts=["127.0.0.1"], organization="example")
    issued.write(tmp_path / "tls.crt", tmp_path / "tls.key")
    loaded = x509.load_pem_x509_certificate((tmp_path / "tls.crt").read_bytes())
    assert loaded.subject.rfc4514_string() == "CN=broker-1,O=example"
    assert loaded.issuer == ca.ca.certificate.subject
    assert stat.S_IMODE((tmp_path / "tls.key").stat().st_mode) == 0o600
    assert not list(tmp_path.glob(".*.tmp"))
