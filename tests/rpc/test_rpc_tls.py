"""TLS settings that cannot work are refused at start, naming the flag or file; the
process's TLS reaches the servers and channels rpc makes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import grpc.aio
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from highwater.rpc import tls
from highwater.rpc.channels import open_channel
from highwater.rpc.server import GrpcHost, GrpcService
from highwater.security.certificate_authority import CertificateAuthority


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tls")
    ca = CertificateAuthority()
    (root / "ca.crt").write_bytes(ca.certificate_pem)
    ca.issue("server", hosts=["127.0.0.1"]).write(root / "server.crt", root / "server.key")
    ca.issue("client", server=False).write(root / "client.crt", root / "client.key")
    (root / "garbage.pem").write_text("not a certificate")
    return {p.stem + p.suffix: p for p in root.iterdir()}


@pytest.fixture
def process_tls() -> Iterator[None]:
    yield
    tls.configure(server=None, client=None)


def test_settings_that_cannot_work_are_refused(files: dict[str, Path]) -> None:
    cert, key, ca = files["server.crt"], files["server.key"], files["ca.crt"]
    with pytest.raises(tls.TlsConfigError, match="requested is not supported"):
        tls.ServerTls(cert, key, ca, tls.ClientAuth.REQUESTED)
    with pytest.raises(tls.TlsConfigError, match="needs --tls-ca-file"):
        tls.ServerTls(cert, key, None, tls.ClientAuth.REQUIRED)
    with pytest.raises(tls.TlsConfigError, match="not a PEM file"):
        tls.ServerTls(files["garbage.pem"], key)
    with pytest.raises(tls.TlsConfigError, match="No such file"):
        tls.ServerTls(cert, key.with_name("missing.key"))
    with pytest.raises(tls.TlsConfigError, match="needs its key"):
        tls.ClientTls(ca, cert_file=files["client.crt"])
    assert tls.ServerTls(cert, key, ca).requires_client_certificate
    assert not tls.ServerTls(cert, key, ca, tls.ClientAuth.NONE).requires_client_certificate


async def test_the_process_tls_reaches_hosts_and_channels(
    files: dict[str, Path], process_tls: None
) -> None:
    tls.configure(
        server=tls.ServerTls(files["server.crt"], files["server.key"], files["ca.crt"]),
        client=tls.ClientTls(files["ca.crt"], files["client.crt"], files["client.key"]),
    )
    host = GrpcHost(
        "127.0.0.1:0",
        [GrpcService("highwater.test.Nothing", lambda server: None, serving_at_start=True)],
        max_message_bytes=1 << 20,
    )
    await host.start()
    try:
        request = health_pb2.HealthCheckRequest()
        async with open_channel(f"127.0.0.1:{host.port}") as channel:
            reply = await health_pb2_grpc.HealthStub(channel).Check(request, timeout=5)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        async with grpc.aio.insecure_channel(f"127.0.0.1:{host.port}") as plaintext:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await health_pb2_grpc.HealthStub(plaintext).Check(request, timeout=5)
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        await host.stop(0)


def test_client_settings_with_kafkas_names(files: dict[str, Path]) -> None:
    ssl = tls.client_tls_from_properties(
        {
            "security.protocol": "ssl",
            "ssl.ca.location": str(files["ca.crt"]),
            "ssl.certificate.location": str(files["client.crt"]),
            "ssl.key.location": str(files["client.key"]),
        }
    )
    assert ssl == tls.ClientTls(files["ca.crt"], files["client.crt"], files["client.key"])
    assert tls.client_tls_from_properties({}) is None
    assert tls.client_tls_from_properties({"security.protocol": "PLAINTEXT"}) is None
    refused = {
        "unknown client security setting 'ssl.keystore'": {"ssl.keystore": "x"},
        "not one of": {"security.protocol": "TLS"},
        "needs security.protocol=SSL": {"ssl.ca.location": "/ca.crt"},
    }
    for message, props in refused.items():
        with pytest.raises(tls.TlsConfigError, match=message):
            tls.client_tls_from_properties(props)
    # SASL_SSL is TLS too; the sasl.* keys are client_auth's (tests/rpc/test_rpc_auth.py).
    assert tls.client_tls_from_properties(
        {"security.protocol": "SASL_SSL", "ssl.ca.location": str(files["ca.crt"])}
    ) == tls.ClientTls(files["ca.crt"])


def test_a_half_rotated_pair_keeps_the_pair_in_use(tmp_path: Path) -> None:
    """Certificate and key files rotated one after the other, or caught half-written
    (the PEM header there, its end not yet): the server keeps the pair it serves, as it
    does for an unreadable file, until the new pair is whole and matches; gRPC would
    otherwise take it and fail every handshake meanwhile."""
    ca = CertificateAuthority()
    cert, key = tmp_path / "server.crt", tmp_path / "server.key"
    ca.issue("server", hosts=["127.0.0.1"]).write(cert, key)
    server = tls.ServerTls(cert, key)
    renewed = ca.issue("server", hosts=["127.0.0.1"])

    cert.write_bytes(renewed.certificate_pem)  # the certificate first, the key not yet
    assert server._fetch() is None
    key.write_bytes(renewed.key_pem[: len(renewed.key_pem) // 2])  # the key half-written
    assert server._fetch() is None
    key.write_bytes(renewed.key_pem)
    assert server._fetch() is not None  # the whole new pair

    other_key = tmp_path / "other.key"  # at start, a pair that does not match is refused
    ca.issue("other").write(tmp_path / "other.crt", other_key)
    with pytest.raises(tls.TlsConfigError, match="the key does not match the certificate"):
        tls.ServerTls(cert, other_key)


def test_a_half_written_ca_file_keeps_the_ca_in_use(tmp_path: Path) -> None:
    """A CA bundle caught half-written is not handed to gRPC, which would refuse every
    client certificate until the file is whole; at start it is refused, naming the file."""
    ca = CertificateAuthority()
    cert, key, ca_file = tmp_path / "server.crt", tmp_path / "server.key", tmp_path / "ca.crt"
    ca.issue("server", hosts=["127.0.0.1"]).write(cert, key)
    ca_file.write_bytes(ca.certificate_pem)
    server = tls.ServerTls(cert, key, ca_file)
    bundle = ca.certificate_pem + CertificateAuthority("next").certificate_pem
    ca_file.write_bytes(bundle[: len(bundle) - 200])  # the second CA's end not written yet
    assert server._fetch() is None
    ca_file.write_bytes(bundle)
    assert server._fetch() is not None
    ca_file.write_bytes(ca.certificate_pem[:300])
    with pytest.raises(tls.TlsConfigError, match=r"ca\.crt"):
        tls.ServerTls(cert, key, ca_file)
