"""Kafka clients against an etcd-mode cluster on real processes and a real etcd.

One etcd, three ``highwater broker --metadata-store etcd://... --kafka-listen ...``
processes and a group coordinator serve the module. confluent-kafka (librdkafka), unchanged:
creates a topic (through the etcd controller), produces to it, consumes it in a group that
commits, and deletes it; Metadata names the etcd controller's broker as the controller. A
topic too large for one etcd transaction is refused with Kafka's INVALID_REQUEST and the
controller's message naming the limit.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from etcd_processes import EtcdBrokerProcess, EtcdServer, etcd_member, read_prefix
from quorum_processes import free_ports

pytestmark = pytest.mark.timeout(300)

CLUSTER = "kafka"
MAX_TXN_OPS = 128
"""etcd's default --max-txn-ops, and the brokers'."""


def wait_for(condition: Callable[[], Any], timeout_s: float = 30, what: str = "") -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what or condition}")


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    with etcd_member(tmp_path_factory.mktemp("etcd")) as server:
        yield server


@pytest.fixture(scope="module")
def bootstrap(etcd: EtcdServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Three brokers with Kafka listeners and a coordinator; the Kafka bootstrap servers,
    once every broker is in Kafka's Metadata."""
    store = f"etcd://{etcd.endpoint}/{CLUSTER}"
    root = tmp_path_factory.mktemp("cluster")
    ports = free_ports(7)
    kafka_ports = ports[4:]
    processes = [
        EtcdBrokerProcess(
            node_id,
            port,
            store,
            root / f"b{node_id}",
            extra_args=("--kafka-listen", f"PLAINTEXT://127.0.0.1:{kafka_port}"),
        )
        for node_id, port, kafka_port in zip((1, 2, 3), ports, kafka_ports, strict=False)
    ]
    processes.append(EtcdBrokerProcess(200, ports[3], store, root / "c200", role="coordinator"))
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
        yield servers
    finally:
        for process in reversed(processes):
            process.terminate(timeout_s=15)


def etcd_controller(etcd: EtcdServer) -> int:
    keys = asyncio.run(read_prefix(f"etcd://{etcd.endpoint}/{CLUSTER}"))
    claim = keys.get(f"/highwater/{CLUSTER}/controller")
    return int(json.loads(claim.value)["broker_id"]) if claim is not None else -1


def test_kafka_clients_create_produce_consume_in_a_group_and_delete(
    etcd: EtcdServer, bootstrap: str
) -> None:
    topic, group = "through-etcd", "etcd-group"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, 2, 3)]).values():
        future.result(30)

    def led() -> bool:
        found = admin.list_topics(topic, timeout=5).topics[topic]
        return found.error is None and all(p.leader >= 0 for p in found.partitions.values())

    wait_for(led, what=f"{topic} to have leaders")
    # Metadata names the broker whose candidate holds etcd's controller key.
    assert admin.list_topics(timeout=5).controller_id == etcd_controller(etcd) > 0

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
        assert values == {f"v{i}".encode() for i in range(40)}
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


def test_a_topic_too_large_for_one_etcd_transaction_is_refused_naming_the_limit(
    bootstrap: str,
) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    (future,) = admin.create_topics([NewTopic("too-large", 3 * MAX_TXN_OPS, 1)]).values()
    with pytest.raises(KafkaException) as refused:
        future.result(30)
    error = refused.value.args[0]
    assert error.code() == KafkaError.INVALID_REQUEST
    assert "max-txn-ops" in error.str()
    assert "too-large" not in admin.list_topics(timeout=5).topics
