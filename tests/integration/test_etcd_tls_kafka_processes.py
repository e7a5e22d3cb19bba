"""TLS to etcd, and Kafka clients against an etcd-mode cluster, on real processes.

One etcd serving its clients over TLS and accepting only certificates its CA signed
(``--cert-file/--key-file/--trusted-ca-file/--client-cert-auth``, certificates from a
throwaway CA, ``highwater.security.certificate_authority``), three ``highwater broker
--metadata-store https://... --etcd-ca-file/--etcd-cert-file/--etcd-key-file
--kafka-listen ...`` processes and a group coordinator serve the module: every session,
registration, controller write, read and watch goes over mutual TLS.

confluent-kafka (librdkafka), unchanged: creates a topic (through the etcd controller),
produces to it, consumes it in a group that commits, and deletes it; Metadata names the
etcd controller's broker as the controller. A topic too large for one etcd transaction is
refused with Kafka's INVALID_REQUEST and the controller's message naming the limit. A
client that does not trust etcd's CA, or has no certificate etcd trusts, is refused with
an error saying the TLS handshake failed; a broker started so exits with it.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from etcd_processes import EtcdBrokerProcess, EtcdServer, EtcdServerTls, etcd_member
from highwater.cli.main import main
from highwater.coordinator.service import COORDINATOR_SERVICE_NAME
from highwater.etcd_metadata.connection import EtcdConnection, EtcdTlsError, KeyVersion
from highwater.etcd_metadata.endpoints import (
    EtcdStoreAddress,
    parse_metadata_store,
    with_client_tls,
)
from highwater.rpc.endpoints import free_loopback_ports
from highwater.security.certificate_authority import CertificateAuthority
from kafka_servers import wait_for

pytestmark = pytest.mark.timeout(300)

CLUSTER = "secured"
MAX_TXN_OPS = 128
"""etcd's default --max-txn-ops, and the brokers'."""


@dataclass(frozen=True)
class Pki:
    root: Path
    ca: CertificateAuthority

    @property
    def ca_file(self) -> Path:
        return self.root / "ca.crt"

    def issue(self, name: str, ca: CertificateAuthority | None = None) -> tuple[Path, Path]:
        cert, key = self.root / f"{name}.crt", self.root / f"{name}.key"
        (ca or self.ca).issue(name, hosts=["127.0.0.1", "localhost"]).write(cert, key)
        return cert, key


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    pki = Pki(tmp_path_factory.mktemp("pki"), CertificateAuthority())
    pki.ca_file.write_bytes(pki.ca.certificate_pem)
    return pki


@pytest.fixture(scope="module")
def etcd(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    cert, key = pki.issue("etcd")
    client_cert, client_key = pki.issue("etcdctl")
    tls = EtcdServerTls(cert, key, client_ca_file=pki.ca_file)
    etcdctl = ("--cacert", str(pki.ca_file), "--cert", str(client_cert), "--key", str(client_key))
    with etcd_member(tmp_path_factory.mktemp("etcd"), tls, etcdctl) as server:
        yield server


def store(etcd: EtcdServer) -> str:
    return f"https://{etcd.endpoint}/{CLUSTER}"


def etcd_tls_args(pki: Pki, name: str) -> tuple[str, ...]:
    cert, key = pki.issue(name)
    return (
        "--etcd-ca-file",
        str(pki.ca_file),
        "--etcd-cert-file",
        str(cert),
        "--etcd-key-file",
        str(key),
    )


@dataclass(frozen=True)
class KafkaCluster:
    bootstrap: str
    processes: list[EtcdBrokerProcess]

    def describe(self) -> str:
        """Each process's state and log tail, for a failure's message."""
        return "\n\n".join(process.describe() for process in self.processes)


@pytest.fixture(scope="module")
def cluster(
    pki: Pki, etcd: EtcdServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KafkaCluster]:
    """Three brokers with Kafka listeners and a coordinator, all over mutual TLS to etcd,
    once every broker is in Kafka's Metadata and the coordinator serves."""
    root = tmp_path_factory.mktemp("cluster")
    ports = free_loopback_ports(7)
    kafka_ports = ports[4:]
    processes = [
        EtcdBrokerProcess(
            node_id,
            port,
            store(etcd),
            root / f"b{node_id}",
            extra_args=(
                *etcd_tls_args(pki, f"broker-{node_id}"),
                "--kafka-listen",
                f"PLAINTEXT://127.0.0.1:{kafka_port}",
            ),
            log_level="INFO",
        )
        for node_id, port, kafka_port in zip((1, 2, 3), ports, kafka_ports, strict=False)
    ]
    processes.append(
        EtcdBrokerProcess(
            200,
            ports[3],
            store(etcd),
            root / "c200",
            role="coordinator",
            extra_args=etcd_tls_args(pki, "coordinator-200"),
            log_level="INFO",
        )
    )
    for process in processes:
        process.start()
    try:
        servers = ",".join(f"127.0.0.1:{port}" for port in kafka_ports)
        admin = AdminClient({"bootstrap.servers": servers})

        def registered() -> bool:
            try:
                return len(admin.list_topics(timeout=1).brokers) == 3
            except KafkaException:  # no listener bound yet
                return False

        wait_for(registered, timeout_s=120, what="three brokers in Kafka's Metadata")
        # The consumer group needs the coordinator: SERVING once it has registered and
        # loaded its __consumer_offsets partitions.
        processes[-1].wait_serving(COORDINATOR_SERVICE_NAME)
        yield KafkaCluster(servers, processes)
    finally:
        for process in reversed(processes):
            process.terminate(timeout_s=15)


@pytest.fixture(scope="module")
def bootstrap(cluster: KafkaCluster) -> str:
    return cluster.bootstrap


def secured(pki: Pki, etcd: EtcdServer, name: str = "reader") -> EtcdStoreAddress:
    cert, key = pki.issue(name)
    return with_client_tls(
        parse_metadata_store(store(etcd)), ca_file=pki.ca_file, cert_file=cert, key_file=key
    )


async def read_prefix(address: EtcdStoreAddress) -> dict[str, KeyVersion]:
    connection = EtcdConnection(address)
    try:
        _, keys = await connection.get_prefix(address.prefix)
        return keys
    finally:
        await connection.close()


def etcd_controller(pki: Pki, etcd: EtcdServer) -> int:
    keys = asyncio.run(read_prefix(secured(pki, etcd)))
    claim = keys.get(f"/highwater/{CLUSTER}/controller")
    return int(json.loads(claim.value)["broker_id"]) if claim is not None else -1


def test_brokers_register_over_mutual_tls_and_kafka_clients_create_produce_consume_delete(
    pki: Pki, etcd: EtcdServer, cluster: KafkaCluster
) -> None:
    bootstrap = cluster.bootstrap
    keys = asyncio.run(read_prefix(secured(pki, etcd)))
    assert {k.rsplit("/", 1)[1] for k in keys if "/brokers/ids/" in k} == {"1", "2", "3"}

    topic, group = "through-etcd", "etcd-group"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, 2, 3)]).values():
        future.result(30)

    def led() -> bool:
        found = admin.list_topics(topic, timeout=5).topics[topic]
        return found.error is None and all(p.leader >= 0 for p in found.partitions.values())

    wait_for(led, what=f"{topic} to have leaders")
    assert f"/highwater/{CLUSTER}/brokers/topics/{topic}" in asyncio.run(
        read_prefix(secured(pki, etcd))
    )
    # Metadata names the broker whose candidate holds etcd's controller key.
    assert admin.list_topics(timeout=5).controller_id == etcd_controller(pki, etcd) > 0

    failures: list[Any] = []
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    for i in range(40):
        producer.produce(
            topic,
            key=f"k{i}".encode(),
            value=f"v{i}".encode(),
            partition=i % 2,
            on_delivery=lambda err, _msg: err is not None and failures.append(err),
        )
    assert producer.flush(30) == 0
    assert failures == []

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 50,
        }
    )
    try:
        consumer.subscribe([topic])
        values: set[bytes] = set()
        deadline = time.monotonic() + 30
        while len(values) < 40 and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            assert message.error() is None, message.error()
            values.add(message.value())
        print("CONSUMED-IN", time.monotonic() - deadline + 30, len(values))
        assert values == {f"v{i}".encode() for i in range(40)}, cluster.describe()
        consumer.commit(asynchronous=False)
        committed = consumer.committed([TopicPartition(topic, 0), TopicPartition(topic, 1)], 10)
        assert sorted(tp.offset for tp in committed) == [20, 20]
    finally:
        consumer.close()

    for future in admin.delete_topics([topic]).values():
        future.result(30)
    wait_for(
        lambda: topic not in admin.list_topics(timeout=5).topics, what=f"{topic} to be deleted"
    )


def test_a_topic_too_large_for_one_etcd_transaction_is_refused_through_kafka(
    bootstrap: str,
) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    (future,) = admin.create_topics([NewTopic("too-large", MAX_TXN_OPS + 10, 1)]).values()
    with pytest.raises(KafkaException) as refused:
        future.result(30)
    error = refused.value.args[0]
    assert error.code() == KafkaError.INVALID_REQUEST
    assert "--max-txn-ops" in error.str()
    assert "too-large" not in admin.list_topics(timeout=5).topics


def test_clients_without_the_ca_or_a_trusted_certificate_are_refused(
    pki: Pki, etcd: EtcdServer, bootstrap: str
) -> None:
    """Checked after the cluster is up (``bootstrap``), so etcd is known to serve."""
    other = CertificateAuthority("another CA")
    other_ca = pki.root / "other-ca.crt"
    other_ca.write_bytes(other.certificate_pem)
    cert, key = pki.issue("stranger", ca=other)
    refused = {
        # the system's CAs (no --etcd-ca-file) do not include the test CA
        "no CA": parse_metadata_store(store(etcd)),
        "another CA": with_client_tls(parse_metadata_store(store(etcd)), ca_file=other_ca),
        # the server is trusted, but etcd requires a client certificate its CA signed
        "no client certificate": with_client_tls(
            parse_metadata_store(store(etcd)), ca_file=pki.ca_file
        ),
        "a client certificate of another CA": with_client_tls(
            parse_metadata_store(store(etcd)), ca_file=pki.ca_file, cert_file=cert, key_file=key
        ),
    }
    for why, address in refused.items():
        try:
            asyncio.run(read_prefix(address))
        except EtcdTlsError as e:
            assert "TLS handshake failed" in str(e), (why, e)
        else:
            raise AssertionError(f"{why}: etcd was read")

    # A broker started without the CA stops at start-up with the error.
    result = CliRunner().invoke(
        main,
        [
            "broker",
            "--node-id",
            "9",
            "--listen",
            f"127.0.0.1:{free_loopback_ports(1)[0]}",
            "--data-dir",
            str(pki.root / "b9"),
            "--metadata-store",
            store(etcd),
        ],
    )
    assert result.exit_code == 1
    assert f"etcd at {etcd.endpoint}: the TLS handshake failed" in result.output
