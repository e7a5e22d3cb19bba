"""Who a call is for quotas, on real gRPC calls: ``User:<CN>`` of a verified client
certificate (else ``User:ANONYMOUS``) and the ``client-id`` metadata the client library's
broker streams send."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import grpc.aio
import pytest
from embedded_servers import free_port
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from highwater.broker.quota_caller import QuotaCaller, quota_caller, quota_principal
from highwater.rpc.broker_streams import CLIENT_ID_METADATA_KEY
from highwater.security.certificate_authority import CertificateAuthority

pytestmark = pytest.mark.timeout(30)


class _Recording(health.aio.HealthServicer):
    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[str, QuotaCaller]] = []

    async def Check(self, request, context):  # type: ignore[no-untyped-def]
        self.seen.append((quota_principal(context), quota_caller(context)))
        return await super().Check(request, context)


@pytest.fixture
async def servers() -> AsyncIterator[tuple[CertificateAuthority, str, str, _Recording]]:
    """One server with mutual TLS and one plaintext, recording who called."""
    ca = CertificateAuthority()
    issued = ca.issue("broker-1", hosts=["127.0.0.1"])
    recording = _Recording()
    server = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(recording, server)
    tls = f"127.0.0.1:{free_port()}"
    plain = f"127.0.0.1:{free_port()}"
    server.add_secure_port(
        tls,
        grpc.ssl_server_credentials(
            [(issued.key_pem, issued.certificate_pem)],
            root_certificates=ca.certificate_pem,
            require_client_auth=True,
        ),
    )
    server.add_insecure_port(plain)
    await server.start()
    try:
        yield ca, tls, plain, recording
    finally:
        await server.stop(0)


async def test_the_certificate_names_the_user_and_metadata_the_client_id(
    servers: tuple[CertificateAuthority, str, str, _Recording],
) -> None:
    ca, tls, plain, recording = servers
    alice = ca.issue("alice", server=False)
    credentials = grpc.ssl_channel_credentials(
        root_certificates=ca.certificate_pem,
        private_key=alice.key_pem,
        certificate_chain=alice.certificate_pem,
    )
    request = health_pb2.HealthCheckRequest()
    async with grpc.aio.secure_channel(tls, credentials) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        await stub.Check(request, metadata=((CLIENT_ID_METADATA_KEY, "app"),), timeout=5)
        await stub.Check(request, timeout=5)
    async with grpc.aio.insecure_channel(plain) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        await stub.Check(request, metadata=((CLIENT_ID_METADATA_KEY, "app"),), timeout=5)
    assert recording.seen == [
        ("User:alice", QuotaCaller("alice", "app")),
        ("User:alice", QuotaCaller("alice", "")),
        ("User:ANONYMOUS", QuotaCaller("ANONYMOUS", "app")),
    ]
