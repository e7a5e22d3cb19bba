"""Mutual TLS between every process, and towards clients, on real processes.

A controller and two brokers run with ``--tls-cert-file/--tls-key-file/--tls-ca-file``
(certificates from a throwaway CA, ``highwater.security.certificate_authority``): the
quorum, the brokers' registration and heartbeats, the follower fetches all go over mutual
TLS. A client of the same CA produces and consumes a replicated topic; a plaintext client,
a client whose certificate another CA signed, and one without a certificate are refused in
the handshake. The controller serves its metrics over HTTPS with its certificate
(``--metrics-tls``), to scrapers with a certificate of the CA. Then the brokers'
certificate files are replaced (a new key, as cert-manager renews) while a producer keeps
writing: no request fails, and a new handshake gets the new certificate.
"""

from __future__ import annotations

import asyncio
import http.client
import socket
import ssl
import subprocess
import sys
import urllib.request
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc.aio
import pytest
from broker_processes import (
    ProcessCluster,
    consume_all,
    create_topic,
    process_cluster,
    wait_partition,
)
from cryptography import x509
from embedded_servers import free_port
from grpc_health.v1 import health_pb2, health_pb2_grpc
from highwater.client.admin import NewTopic
from highwater.client.producer import AsyncProducer
from highwater.rpc import tls
from highwater.security.certificate_authority import CertificateAuthority

pytestmark = pytest.mark.timeout(180)

TOPIC = "secured"
BROKERS = (2, 3)  # the controller is node 1


@dataclass
class Pki:
    ca: CertificateAuthority
    root: Path

    @property
    def ca_file(self) -> Path:
        return self.root / "ca.crt"

    def issue(self, name: str) -> tuple[Path, Path]:
        cert, key = self.root / f"{name}.crt", self.root / f"{name}.key"
        self.ca.issue(name, hosts=["127.0.0.1", "localhost"]).write(cert, key)
        return cert, key


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    pki = Pki(CertificateAuthority(), tmp_path / "pki")
    pki.root.mkdir()
    pki.ca_file.write_bytes(pki.ca.certificate_pem)
    return pki


def tls_args(pki: Pki, name: str) -> tuple[str, ...]:
    cert, key = pki.issue(name)
    return (
        "--tls-cert-file",
        str(cert),
        "--tls-key-file",
        str(key),
        "--tls-ca-file",
        str(pki.ca_file),
    )


@pytest.fixture
def client_tls(pki: Pki) -> Iterator[tls.ClientTls]:
    """This test process's channels (the client library's) use mutual TLS as ``alice``."""
    cert, key = pki.issue("alice")
    client = tls.ClientTls(pki.ca_file, cert, key)
    tls.configure(server=None, client=client)
    try:
        yield client
    finally:
        tls.configure(server=None, client=None)


@pytest.fixture
def metrics_address() -> str:
    """Where the controller serves its metrics, over HTTPS (``--metrics-tls``)."""
    return f"127.0.0.1:{free_port()}"


@pytest.fixture
async def cluster(tmp_path: Path, pki: Pki, metrics_address: str) -> AsyncIterator[ProcessCluster]:
    cluster = process_cluster(
        tmp_path,
        BROKERS,
        controller_args=(
            *tls_args(pki, "controller-1"),
            "--metrics-listen",
            metrics_address,
            "--metrics-tls",
        ),
        broker_args=lambda node_id: tls_args(pki, f"broker-{node_id}"),
    )
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.kill()


async def health(address: str, credentials: grpc.ChannelCredentials | None) -> None:
    channel = (
        grpc.aio.secure_channel(address, credentials)
        if credentials is not None
        else grpc.aio.insecure_channel(address)
    )
    async with channel:
        await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service="highwater.v1.Raft"), timeout=5
        )


def served_serial(address: str, pki: Pki, client: tls.ClientTls) -> int:
    """The serial number of the certificate a fresh TLS handshake with ``address`` gets."""
    context = ssl.create_default_context(cafile=str(pki.ca_file))
    assert client.cert_file is not None and client.key_file is not None
    context.load_cert_chain(str(client.cert_file), str(client.key_file))
    context.set_alpn_protocols(["h2"])
    host, port = address.rsplit(":", 1)
    with (
        socket.create_connection((host, int(port)), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname=host) as wrapped,
    ):
        der = wrapped.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


def scrape(url: str, context: ssl.SSLContext | None) -> str:
    with urllib.request.urlopen(url, timeout=5, context=context) as answer:
        return str(answer.read().decode())


async def test_mutual_tls_between_services_and_clients_with_rotation(
    cluster: ProcessCluster, pki: Pki, client_tls: tls.ClientTls, metrics_address: str
) -> None:
    bootstrap = cluster.bootstrap
    await create_topic(bootstrap.split(",")[0], NewTopic(TOPIC, replica_assignment={0: BROKERS}))
    await wait_partition(
        cluster.brokers.values(),
        TOPIC,
        lambda p: sorted(p.isr) == list(BROKERS),
        what="both brokers in the ISR over mutual TLS",
    )
    async with AsyncProducer({"bootstrap.servers": bootstrap, "acks": "all"}) as producer:
        for i in range(20):
            await producer.send(TOPIC, f"m{i}".encode(), partition=0)
    assert await consume_all(bootstrap, TOPIC) == [f"m{i}".encode() for i in range(20)]

    # Refused in the handshake: plaintext, another CA's certificate, no certificate.
    leader = cluster.brokers[BROKERS[0]].address
    other = CertificateAuthority("another CA").issue("mallory", server=False)
    for credentials in (
        None,
        grpc.ssl_channel_credentials(pki.ca.certificate_pem, other.key_pem, other.certificate_pem),
        grpc.ssl_channel_credentials(pki.ca.certificate_pem),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await health(leader, credentials)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE

    # Rotation under load: new certificates and keys in place, while a producer writes.
    before = served_serial(leader, pki, client_tls)
    async with AsyncProducer({"bootstrap.servers": bootstrap, "acks": "all"}) as producer:
        writes = [asyncio.ensure_future(producer.send(TOPIC, b"during", partition=0))]
        for node_id in BROKERS:
            pki.issue(f"broker-{node_id}")
            for _ in range(10):
                writes.append(asyncio.ensure_future(producer.send(TOPIC, b"during", partition=0)))
                await asyncio.sleep(0.05)
        results = await asyncio.gather(*writes)
    assert len(results) == 21  # every write acknowledged: none failed
    after = served_serial(leader, pki, client_tls)
    assert after != before
    assert len(await consume_all(bootstrap, TOPIC)) == 41

    # The CLI, as Kafka's tools: --command-config with security.protocol=SSL and ssl.*.
    assert client_tls.cert_file is not None and client_tls.key_file is not None
    config = pki.root / "client.properties"
    config.write_text(
        "security.protocol=SSL\n"
        f"ssl.ca.location={pki.ca_file}\n"
        f"ssl.certificate.location={client_tls.cert_file}\n"
        f"ssl.key.location={client_tls.key_file}\n"
    )

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "highwater", "topics", "list", "--bootstrap-server"]
        return subprocess.run(
            [*command, leader, "--timeout", "5", *args],
            capture_output=True,
            text=True,
            timeout=60,
        )

    listed = await asyncio.to_thread(cli, "--command-config", str(config))
    assert listed.returncode == 0, listed.stderr
    assert TOPIC in listed.stdout.split()

    # The controller's metrics endpoint speaks HTTPS with its certificate (--metrics-tls)
    # and, with its CA file, wants the scraper's certificate.
    trusted = ssl.create_default_context(cafile=str(pki.ca_file))
    trusted.load_cert_chain(str(client_tls.cert_file), str(client_tls.key_file))
    url = f"https://{metrics_address}/metrics"
    assert "# TYPE" in await asyncio.to_thread(scrape, url, trusted)
    anonymous = ssl.create_default_context(cafile=str(pki.ca_file))
    for refused_url, context in ((url, anonymous), (f"http://{metrics_address}/metrics", None)):
        with pytest.raises((OSError, http.client.HTTPException)):
            await asyncio.to_thread(scrape, refused_url, context)
    plaintext = await asyncio.to_thread(cli)
    assert plaintext.returncode != 0 and "Error" in plaintext.stderr
    typo = pki.root / "typo.properties"
    typo.write_text("security.protocol=SSL\nssl.ca.locaton=/x\n")
    refused = await asyncio.to_thread(cli, "--command-config", str(typo))
    assert refused.returncode == 2 and "ssl.ca.locaton" in refused.stderr
