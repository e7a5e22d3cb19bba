"""Real Kafka clients against the Kafka listener of ``highwater server --kafka-listen``.

confluent-kafka (librdkafka), kafka-python, aiokafka and kcat, unchanged: admin calls,
produce with every compression codec and with idempotence, consume in a group with commits
and a rebalance when a second member joins; and the two front doors against each other: a
record produced over gRPC reads back identically over Kafka's protocol and the other way
round (key, value, headers, timestamp), and a group's committed offsets are the same
whichever door commits or reads them. The server is this folder's (conftest.py).
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import grpc
import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
)
from highwater.v1 import broker_pb2 as pb
from highwater.v1 import broker_pb2_grpc, coordinator_pb2, coordinator_pb2_grpc
from highwater.v1.common_pb2 import ErrorCode
from kafka_servers import KafkaServer, wait_for

pytestmark = pytest.mark.timeout(120)


def create_topic(server: KafkaServer, name: str, partitions: int = 1) -> None:
    admin = AdminClient({"bootstrap.servers": server.bootstrap})
    for future in admin.create_topics([NewTopic(name, partitions, 1)]).values():
        future.result(30)

    def led() -> bool:
        topic = admin.list_topics(name, timeout=10).topics[name]
        return topic.error is None and all(p.leader >= 0 for p in topic.partitions.values())

    wait_for(led, what=f"{name} to have leaders")


def read_all(server: KafkaServer, topic: str, partition: int, count: int) -> list[Any]:
    """``count`` records of ``topic``'s ``partition`` from offset 0, by an assigned consumer."""
    consumer = Consumer(
        {"bootstrap.servers": server.bootstrap, "group.id": f"reader-{topic}",
         "enable.auto.commit": False, "fetch.wait.max.ms": 50}
    )  # fmt: skip
    try:
        consumer.assign([TopicPartition(topic, partition, 0)])
        records: list[Any] = []
        deadline = time.monotonic() + 30
        while len(records) < count and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None:
                assert message.error() is None, message.error()
                records.append(message)
        return records
    finally:
        consumer.close()


# --- confluent-kafka (librdkafka) --------------------------------------------------------------


CODECS = ("none", "gzip", "snappy", "lz4", "zstd")


def test_librdkafka_idempotent_producer_with_each_codec(server: KafkaServer) -> None:
    """One idempotent producer per codec, each to a partition of its own; every record is
    read back once, in order, with its header."""
    topic = "codecs"
    create_topic(server, topic, partitions=len(CODECS))
    failures: list[Any] = []
    for partition, codec in enumerate(CODECS):
        producer = Producer(
            {"bootstrap.servers": server.bootstrap, "enable.idempotence": True,
             "compression.type": codec, "linger.ms": 5, "batch.num.messages": 50}
        )  # fmt: skip
        for i in range(200):
            producer.produce(
                topic, key=f"k{i % 7}".encode(), value=f"{codec} {i}".encode() * 3,
                headers=[("n", str(i).encode())], partition=partition,
                on_delivery=lambda err, _msg: err is not None and failures.append(err),
            )  # fmt: skip
        assert producer.flush(30) == 0
        assert failures == [], codec
    for partition, codec in enumerate(CODECS):
        records = read_all(server, topic, partition, 200)
        assert [r.value() for r in records] == [f"{codec} {i}".encode() * 3 for i in range(200)]
        assert [r.offset() for r in records] == list(range(200))  # each once: no duplicate
        assert records[5].headers() == [("n", b"5")]


def test_librdkafka_group_commits_and_rebalances_when_a_second_member_joins(
    server: KafkaServer,
) -> None:
    topic, group = "grouped", "librdkafka-group"
    create_topic(server, topic, partitions=2)
    producer = Producer({"bootstrap.servers": server.bootstrap})
    for i in range(40):
        producer.produce(topic, value=str(i).encode(), partition=i % 2)
    assert producer.flush(30) == 0

    def member() -> Consumer:
        return Consumer(
            {"bootstrap.servers": server.bootstrap, "group.id": group,
             "auto.offset.reset": "earliest", "enable.auto.commit": False,
             "heartbeat.interval.ms": 100, "session.timeout.ms": 6000,
             "fetch.wait.max.ms": 50}
        )  # fmt: skip

    first = member()
    second = member()
    try:
        first.subscribe([topic])
        seen: list[bytes] = []

        def first_has_both() -> bool:
            message = first.poll(0.2)
            if message is not None and message.error() is None:
                seen.append(message.value())
            return len(first.assignment()) == 2 and len(seen) >= 40

        wait_for(first_has_both, what="the first member to own both partitions")
        assert sorted(int(v) for v in seen) == list(range(40))
        first.commit(asynchronous=False)
        committed = first.committed([TopicPartition(topic, 0), TopicPartition(topic, 1)], 10)
        assert [tp.offset for tp in committed] == [20, 20]

        second.subscribe([topic])

        def split() -> bool:
            first.poll(0.05)
            second.poll(0.05)
            return len(first.assignment()) == 1 and len(second.assignment()) == 1

        wait_for(split, what="the partitions to be split between the two members")
        owned = {tp.partition for tp in first.assignment()} | {
            tp.partition for tp in second.assignment()
        }
        assert owned == {0, 1}
    finally:
        first.close()
        second.close()


def test_librdkafka_admin_creates_describes_and_deletes_a_topic_and_alters_configs(
    server: KafkaServer,
) -> None:
    admin = AdminClient({"bootstrap.servers": server.bootstrap})
    create_topic(server, "administered", partitions=3)
    metadata = admin.list_topics("administered", timeout=10)
    assert sorted(metadata.topics["administered"].partitions) == [0, 1, 2]
    assert metadata.topics["administered"].error is None

    resource = ConfigResource(
        "topic",
        "administered",
        incremental_configs=[
            ConfigEntry("retention.ms", "3600000", incremental_operation=AlterConfigOpType.SET)
        ],
    )
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(30)
    (described,) = admin.describe_configs([ConfigResource("topic", "administered")]).values()
    configs = described.result(30)
    assert configs["retention.ms"].value == "3600000"
    assert configs["cleanup.policy"].value == "delete"

    for future in admin.delete_topics(["administered"]).values():
        future.result(30)
    wait_for(
        lambda: "administered" not in admin.list_topics(timeout=10).topics,
        what="the topic to be gone",
    )


def test_an_unknown_topic_is_not_created_by_a_metadata_request(server: KafkaServer) -> None:
    """Kafka's docs: a broker creates a topic a client asks metadata for
    (``auto.create.topics.enable``, true by default). Highwater follows its gRPC API and
    creates topics only when asked: the answer is UNKNOWN_TOPIC_OR_PARTITION."""
    admin = AdminClient({"bootstrap.servers": server.bootstrap})
    topic = admin.list_topics("never-created", timeout=10).topics["never-created"]
    assert topic.error is not None
    assert topic.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART
    assert "never-created" not in admin.list_topics(timeout=10).topics


# --- kafka-python ----------------------------------------------------------------------------


def test_kafka_python_admin_producer_and_group_consumer(server: KafkaServer) -> None:
    from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
    from kafka.admin import ConfigResource as KpConfigResource
    from kafka.admin import ConfigResourceType
    from kafka.admin import NewTopic as KpNewTopic

    admin = KafkaAdminClient(bootstrap_servers=server.bootstrap)
    try:
        admin.create_topics([KpNewTopic("kafka-python", 2, 1)])
        wait_for(
            lambda: "kafka-python" in admin.list_topics(), what="kafka-python's topic to appear"
        )
        (described,) = admin.describe_topics(["kafka-python"])
        assert len(described["partitions"]) == 2
        admin.alter_configs(
            [KpConfigResource(ConfigResourceType.TOPIC, "kafka-python", {"retention.ms": "60000"})]
        )
        answer = admin.describe_configs(
            [KpConfigResource(ConfigResourceType.TOPIC, "kafka-python")]
        )
        # kafka-python 3 answers a dict, only the configs that differ from the defaults.
        assert answer["topic"]["kafka-python"]["retention.ms"]["value"] == "60000"
        assert answer["topic"]["kafka-python"]["retention.ms"]["config_source"] == (
            "DYNAMIC_TOPIC_CONFIG"
        )
    finally:
        admin.close()

    for codec in (None, "gzip", "snappy", "lz4", "zstd"):
        producer = KafkaProducer(
            bootstrap_servers=server.bootstrap, acks="all", enable_idempotence=True,
            compression_type=codec,
        )  # fmt: skip
        for i in range(10):
            producer.send("kafka-python", key=b"k", value=f"{codec}-{i}".encode(), partition=0)
        producer.flush(30)
        producer.close()

    consumer = KafkaConsumer(
        "kafka-python", bootstrap_servers=server.bootstrap, group_id="kafka-python-group",
        auto_offset_reset="earliest", enable_auto_commit=False, consumer_timeout_ms=15000,
    )  # fmt: skip
    try:
        values = []
        for message in consumer:
            values.append(message.value)
            if len(values) == 50:
                break
        assert values == [f"{c}-{i}".encode() for c in (None, "gzip", "snappy", "lz4", "zstd")
                          for i in range(10)]  # fmt: skip
        consumer.commit()
        from kafka import TopicPartition as KpTopicPartition

        assert consumer.committed(KpTopicPartition("kafka-python", 0)) == 50
    finally:
        consumer.close()


# --- aiokafka --------------------------------------------------------------------------------


def test_aiokafka_produces_and_consumes_in_a_group(server: KafkaServer) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    create_topic(server, "aiokafka")

    async def run() -> list[bytes]:
        producer = AIOKafkaProducer(
            bootstrap_servers=server.bootstrap, enable_idempotence=True, compression_type="gzip"
        )
        await producer.start()
        try:
            for i in range(20):
                await producer.send_and_wait("aiokafka", f"a{i}".encode(), partition=0)
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(
            "aiokafka", bootstrap_servers=server.bootstrap, group_id="aiokafka-group",
            auto_offset_reset="earliest", enable_auto_commit=False,
        )  # fmt: skip
        await consumer.start()
        try:
            values: list[bytes] = []
            async with asyncio.timeout(30):
                async for message in consumer:
                    values.append(message.value)
                    if len(values) == 20:
                        break
            await consumer.commit()
            from aiokafka import TopicPartition as AioTopicPartition

            assert await consumer.committed(AioTopicPartition("aiokafka", 0)) == 20
            return values
        finally:
            await consumer.stop()

    assert asyncio.run(run()) == [f"a{i}".encode() for i in range(20)]


# --- kcat ------------------------------------------------------------------------------------


def test_kcat_produces_and_consumes(server: KafkaServer) -> None:
    kcat = shutil.which("kcat")
    assert kcat is not None, "kcat is installed by `make test` (Debian's kcat package)"
    create_topic(server, "kcat")
    lines = [f"line {i}" for i in range(25)]
    subprocess.run(
        [kcat, "-b", server.bootstrap, "-t", "kcat", "-P", "-z", "lz4",
         "-X", "enable.idempotence=true"],
        input="\n".join(lines) + "\n", text=True, check=True, timeout=60,
    )  # fmt: skip
    consumed = subprocess.run(
        [kcat, "-b", server.bootstrap, "-t", "kcat", "-C", "-o", "beginning", "-e", "-q"],
        capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    assert consumed.stdout.splitlines() == lines


# --- the two front doors ---------------------------------------------------------------------


def test_a_record_produced_over_grpc_reads_back_identically_over_kafka(
    server: KafkaServer,
) -> None:
    create_topic(server, "grpc-to-kafka")
    request = pb.ProduceRequest(acks=-1)
    records = request.topics.add(topic="grpc-to-kafka").partitions.add(partition=0).records
    records.records.add(
        key=b"the key", value=b"the value", timestamp_ms=1_700_000_000_123,
        headers=[pb.RecordHeader(key="trace", value=b"abc"), pb.RecordHeader(key="empty")],
    )  # fmt: skip
    records.records.add(value=b"no key", timestamp_ms=1_700_000_000_456)
    with grpc.insecure_channel(server.address) as channel:
        stub = broker_pb2_grpc.BrokerStub(channel)

        def produced() -> bool:
            # Metadata names the leader once the image does, a moment before the broker
            # has made the partition's log (Kafka's window too): that is retriable.
            error = stub.Produce(request, timeout=30).topics[0].partitions[0].error
            assert error in (0, ErrorCode.NOT_LEADER_OR_FOLLOWER), error
            return error == 0

        wait_for(produced, what="the produce over gRPC to be taken")
    first, second = read_all(server, "grpc-to-kafka", 0, 2)
    assert (first.key(), first.value()) == (b"the key", b"the value")
    assert first.headers() == [("trace", b"abc"), ("empty", None)]
    assert first.timestamp() == (1, 1_700_000_000_123)  # (CreateTime, ms)
    assert (second.key(), second.value(), second.headers()) == (None, b"no key", None)
    assert second.timestamp() == (1, 1_700_000_000_456)


def test_a_record_produced_over_kafka_reads_back_identically_over_grpc(
    server: KafkaServer,
) -> None:
    create_topic(server, "kafka-to-grpc")
    producer = Producer({"bootstrap.servers": server.bootstrap, "compression.type": "zstd"})
    producer.produce(
        "kafka-to-grpc", key=b"k", value=b"v", timestamp=1_600_000_000_001,
        headers=[("h1", b"x"), ("h2", None)],
    )  # fmt: skip
    producer.produce("kafka-to-grpc", key=None, value=None, timestamp=1_600_000_000_002)
    assert producer.flush(30) == 0
    fetch = pb.FetchRequest(record_format=pb.RECORD_FORMAT_PLAIN, max_wait_ms=1000, min_bytes=1)
    fetch.topics.add(topic="kafka-to-grpc").partitions.add(partition=0, fetch_offset=0)
    with grpc.insecure_channel(server.address) as channel:
        answer = broker_pb2_grpc.BrokerStub(channel).Fetch(fetch, timeout=30)
    first, second = answer.topics[0].partitions[0].plain_records
    assert (first.offset, first.key, first.value, first.timestamp_ms) == (
        0, b"k", b"v", 1_600_000_000_001,
    )  # fmt: skip
    assert [(h.key, h.value if h.HasField("value") else None) for h in first.headers] == [
        ("h1", b"x"),
        ("h2", None),
    ]
    assert not second.HasField("key") and not second.HasField("value")  # a tombstone
    assert second.timestamp_ms == 1_600_000_000_002


def test_a_groups_committed_offsets_are_the_same_through_either_door(server: KafkaServer) -> None:
    topic, group = "both-doors", "both-doors-group"
    create_topic(server, topic, partitions=2)
    consumer = Consumer(
        {"bootstrap.servers": server.bootstrap, "group.id": group, "enable.auto.commit": False}
    )
    try:
        consumer.commit(offsets=[TopicPartition(topic, 0, 7)], asynchronous=False)
        with grpc.insecure_channel(server.address) as channel:
            coordinator = coordinator_pb2_grpc.GroupCoordinatorStub(channel)
            fetched = coordinator.OffsetFetch(
                coordinator_pb2.OffsetFetchRequest(group_id=group, all_topics=True), timeout=30
            )
            assert [
                (t.name, p.partition_index, p.committed_offset)
                for t in fetched.topics
                for p in t.partitions
            ] == [(topic, 0, 7)]
            commit = coordinator_pb2.OffsetCommitRequest(group_id=group)
            commit.topics.add(name=topic).partitions.add(partition_index=1, committed_offset=11)
            answer = coordinator.OffsetCommit(commit, timeout=30)
            assert answer.topics[0].partitions[0].error == 0
        committed = consumer.committed([TopicPartition(topic, 0), TopicPartition(topic, 1)], 10)
        assert [tp.offset for tp in committed] == [7, 11]
    finally:
        consumer.close()


def test_the_server_log_has_no_failed_request(server: KafkaServer) -> None:
    """Runs last: nothing the clients above sent made a request fail unexpectedly."""
    assert "a Kafka request failed" not in Path(server.log).read_text()
