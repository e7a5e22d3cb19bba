"""The Kafka listener's other APIs, each through a real client where one has it (kafka-python's
admin client) and as raw frames otherwise: CreatePartitions, DeleteRecords,
DescribeCluster (and Metadata's cluster id, the quorum's), ListGroups, DescribeGroups,
DeleteGroups, OffsetDelete, DescribeLogDirs, ElectLeaders, Alter/ListPartitionReassignments,
OffsetForLeaderEpoch, Produce with acks=0, and InitProducerId for a transactional producer
(refused: there are no transactions)."""

from __future__ import annotations

import contextlib
import re
import struct
import uuid
from collections.abc import Iterator
from typing import Any, cast

import grpc
import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from highwater.internal.v1 import raft_pb2, raft_pb2_grpc
from kafka.protocol.admin import DeleteTopicsRequest, DeleteTopicsResponse
from kafka.protocol.consumer import OffsetForLeaderEpochRequest, OffsetForLeaderEpochResponse
from kafka.protocol.metadata import MetadataRequest, MetadataResponse
from kafka.protocol.producer import (
    InitProducerIdRequest,
    InitProducerIdResponse,
    ProduceRequest,
    ProduceResponse,
)
from kafka.record.default_records import DefaultRecordBatchBuilder
from kafka_servers import KafkaServer, connect, read_frame, request_frame, wait_for

pytestmark = pytest.mark.timeout(90)


@pytest.fixture(scope="module")
def admin(server: KafkaServer) -> Iterator[Any]:
    from kafka import KafkaAdminClient

    client = KafkaAdminClient(bootstrap_servers=server.bootstrap)
    try:
        yield client
    finally:
        client.close()


def new_topic(admin: Any, name: str, partitions: int = 1) -> None:
    from kafka.admin import NewTopic

    admin.create_topics([NewTopic(name, partitions, 1)])
    wait_for(lambda: _led(admin, name, partitions))


def _led(admin: Any, name: str, partitions: int) -> bool:
    described = admin.describe_topics([name])
    return len(described[0]["partitions"]) == partitions and all(
        p["leader_id"] >= 0 for p in described[0]["partitions"]
    )


def produce(server: KafkaServer, topic: str, count: int, partition: int = 0) -> None:
    producer = Producer({"bootstrap.servers": server.bootstrap})
    for i in range(count):
        producer.produce(topic, value=str(i).encode(), partition=partition)
    assert producer.flush(30) == 0


def watermarks(server: KafkaServer, topic: str, partition: int = 0) -> tuple[int, int]:
    consumer = Consumer({"bootstrap.servers": server.bootstrap, "group.id": "watermarks"})
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), 10)
        return int(low), int(high)
    finally:
        consumer.close()


def test_create_partitions_and_delete_records(server: KafkaServer, admin: Any) -> None:
    from kafka import TopicPartition as KpTopicPartition

    new_topic(admin, "grown")
    admin.create_partitions({"grown": 3})
    wait_for(lambda: _led(admin, "grown", 3))

    produce(server, "grown", 10)
    admin.delete_records({KpTopicPartition("grown", 0): 4})
    assert watermarks(server, "grown") == (4, 10)


def test_describe_cluster_names_this_broker_as_controller(server: KafkaServer, admin: Any) -> None:
    cluster = admin.describe_cluster()
    host, port = server.bootstrap.rsplit(":", 1)
    assert [(b["broker_id"], b["host"], b["port"]) for b in cluster["brokers"]] == [
        (1, host, int(port))
    ]
    assert cluster["controller_id"] == 1


def test_metadata_and_describe_cluster_answer_the_quorums_cluster_id(
    server: KafkaServer, admin: Any
) -> None:
    """The cluster id both Kafka answers carry is the metadata quorum's (KRaft), the one
    the gRPC side describes, not a constant."""
    with grpc.insecure_channel(server.address) as channel:
        quorum = raft_pb2_grpc.RaftStub(channel).DescribeQuorum(
            raft_pb2.DescribeQuorumRequest(), timeout=10
        )
    assert quorum.cluster_id and quorum.cluster_id != "highwater"
    assert admin.describe_cluster()["cluster_id"] == quorum.cluster_id
    consumer = Consumer({"bootstrap.servers": server.bootstrap, "group.id": "cluster-id"})
    try:
        assert consumer.list_topics(timeout=10).cluster_id == quorum.cluster_id
    finally:
        consumer.close()


def test_list_describe_and_delete_a_group(server: KafkaServer, admin: Any) -> None:
    new_topic(admin, "grouped-admin")
    produce(server, "grouped-admin", 3)
    consumer = Consumer(
        {"bootstrap.servers": server.bootstrap, "group.id": "admin-group",
         "auto.offset.reset": "earliest", "enable.auto.commit": False,
         "heartbeat.interval.ms": 100}
    )  # fmt: skip
    try:
        consumer.subscribe(["grouped-admin"])
        seen: list[Any] = []

        def read_all() -> bool:
            message = consumer.poll(0.2)
            if message is not None and message.error() is None:
                seen.append(message)
            return len(seen) == 3

        wait_for(read_all)
        consumer.commit(asynchronous=False)
        described = admin.describe_groups(["admin-group"])["admin-group"]
        assert described["group_state"] == "Stable"
        assert described["protocol_type"] == "consumer"
        assert described["protocol_data"] == "range"  # librdkafka's default assignor
        assert len(described["members"]) == 1
    finally:
        consumer.close()
    listed = admin.list_groups()
    assert "admin-group" in {g["group_id"] for g in listed}
    admin.delete_groups(["admin-group"])
    assert "admin-group" not in {g["group_id"] for g in admin.list_groups()}


def test_elect_leaders_and_partition_reassignments(server: KafkaServer, admin: Any) -> None:
    from kafka import TopicPartition as KpTopicPartition

    new_topic(admin, "elected")
    # The only replica leads already: Kafka's ELECTION_NOT_NEEDED, not a failure.
    answer = admin.elect_leaders(0, {"elected": [0]}, raise_errors=False)  # 0: PREFERRED
    (result,) = answer.replica_election_results[0].partition_result
    assert result.error_code == 84
    admin.alter_partition_reassignments({KpTopicPartition("elected", 0): [1]})
    wait_for(lambda: not admin.list_partition_reassignments())
    assert _led(admin, "elected", 1)


def test_offset_for_leader_epoch_names_the_end_of_the_epoch(
    server: KafkaServer, admin: Any
) -> None:
    new_topic(admin, "epochs")
    produce(server, "epochs", 5)
    R = OffsetForLeaderEpochRequest
    request = R(
        replica_id=-1,
        topics=[R.OffsetForLeaderTopic(topic="epochs", partitions=[
            R.OffsetForLeaderTopic.OffsetForLeaderPartition(
                partition=0, current_leader_epoch=-1, leader_epoch=0)])],
    )  # fmt: skip
    with connect(server) as sock:
        sock.sendall(request_frame(request, 4, 11))
        answer = OffsetForLeaderEpochResponse.decode(read_frame(sock)[5:], version=4)
    (result,) = answer.topics[0].partitions
    assert (result.error_code, result.leader_epoch, result.end_offset) == (0, 0, 5)


def batch(value: bytes) -> bytes:
    builder = DefaultRecordBatchBuilder(
        magic=2, compression_type=0, is_transactional=False, producer_id=-1,
        producer_epoch=-1, base_sequence=-1, batch_size=1 << 20,
    )  # fmt: skip
    builder.append(0, timestamp=None, key=None, value=value, headers=[])
    return bytes(builder.build())


def test_produce_with_acks_0_gets_no_answer_and_is_appended(
    server: KafkaServer, admin: Any
) -> None:
    new_topic(admin, "acks-zero")
    # The metadata names the leader before the leader has made the partition's log; an
    # acks=0 produce refused meanwhile would close the connection (as it should).
    wait_for(lambda: _serving(server, "acks-zero"), what="the new partition served")
    R = ProduceRequest
    request = R(
        transactional_id=None, acks=0, timeout_ms=5000,
        topic_data=[R.TopicProduceData(name="acks-zero", partition_data=[
            R.TopicProduceData.PartitionProduceData(index=0, records=batch(b"fire"))])],
    )  # fmt: skip
    with connect(server) as sock:
        sock.sendall(request_frame(request, 9, 21) + request_frame(MetadataRequest(), 12, 22))
        answer = read_frame(sock)
        assert struct.unpack(">i", answer[:4]) == (22,)  # the produce got none
    wait_for(lambda: watermarks(server, "acks-zero") == (0, 1))


def _serving(server: KafkaServer, topic: str) -> bool:
    """Whether the leader of ``topic``'s partition 0 answers ListOffsets for it."""
    try:
        return watermarks(server, topic) == (0, 0)
    except KafkaException:
        return False


def test_produce_with_acks_0_that_fails_closes_the_connection(server: KafkaServer) -> None:
    """An acks=0 producer reads no answer, so a failed produce (here an unknown topic) is
    told by closing the connection (Kafka's ``closeConnection``): the producer then
    refreshes its metadata instead of sending to the wrong place for ever. The requests
    behind it are not answered."""
    R = ProduceRequest
    request = R(
        transactional_id=None, acks=0, timeout_ms=5000,
        topic_data=[R.TopicProduceData(name="acks-zero-nowhere", partition_data=[
            R.TopicProduceData.PartitionProduceData(index=0, records=batch(b"lost"))])],
    )  # fmt: skip
    with connect(server) as sock:
        port = sock.getsockname()[1]
        sock.sendall(request_frame(request, 9, 23) + request_frame(MetadataRequest(), 12, 24))
        with contextlib.suppress(ConnectionResetError):
            assert sock.recv(1) == b""
    line = rf"Kafka connection from \('127\.0\.0\.1', {port}\) closed: .*acks=0.*"
    assert re.search(line + "acks-zero-nowhere", server.log.read_text())


def test_produce_records_must_be_one_batch_of_magic_2_as_kafka_validates_them(
    server: KafkaServer, admin: Any
) -> None:
    """Kafka's ``ProduceRequest.validateRecords`` (Produce v3+): exactly one batch per
    partition, of magic 2, and zstd only from v7; else INVALID_RECORD (87), or
    UNSUPPORTED_COMPRESSION_TYPE (76), and nothing is appended."""
    new_topic(admin, "one-batch")
    good = batch(b"one")
    magic_1 = good[:16] + b"\x01" + good[17:]
    zstd = DefaultRecordBatchBuilder(
        magic=2, compression_type=4, is_transactional=False, producer_id=-1,
        producer_epoch=-1, base_sequence=-1, batch_size=1 << 20,
    )  # fmt: skip
    zstd.append(0, timestamp=None, key=None, value=b"z" * 100, headers=[])
    R = ProduceRequest
    with connect(server) as sock:

        def produce(records: bytes, version: int = 9) -> tuple[int, str | None]:
            request = R(
                transactional_id=None, acks=1, timeout_ms=5000,
                topic_data=[R.TopicProduceData(name="one-batch", partition_data=[
                    R.TopicProduceData.PartitionProduceData(index=0, records=records)])],
            )  # fmt: skip
            sock.sendall(request_frame(request, version, 61))
            answer = ProduceResponse.decode(read_frame(sock)[4 + (version >= 9) :], version=version)
            (partition,) = answer.responses[0].partition_responses
            return partition.error_code, partition.error_message

        wait_for(lambda: produce(good)[0] == 0)
        assert produce(good + batch(b"two"))[0] == 87
        assert produce(magic_1)[0] == 87
        # Built once: kafka-python's build() compresses its buffer in place, so a second
        # call compresses it again (a batch whose records do not decode, INVALID_RECORD).
        zstd_batch = bytes(zstd.build())
        assert produce(zstd_batch, version=6)[0] == 76
        assert produce(zstd_batch, version=7)[0] == 0
    assert watermarks(server, "one-batch") == (0, 2)


def test_a_transactional_producer_is_refused(server: KafkaServer) -> None:
    request = InitProducerIdRequest(transactional_id="txn", transaction_timeout_ms=60000)
    with connect(server) as sock:
        sock.sendall(request_frame(request, 4, 31))
        answer = InitProducerIdResponse.decode(read_frame(sock)[5:], version=4)
    assert answer.error_code == 42  # INVALID_REQUEST: Highwater has no transactions
    assert answer.producer_id == -1


def test_delete_topics_needs_a_name_or_an_id_not_both(server: KafkaServer) -> None:
    """DeleteTopics v6 names each topic by name or by id: Kafka's controller answers an
    entry with neither, or with both, INVALID_REQUEST (42), and goes on with the others
    (here an unknown name: 3). An entry with neither closed the connection."""
    R = DeleteTopicsRequest
    both = uuid.uuid4()
    request = R(
        topics=[
            R.DeleteTopicState(name=None, topic_id=uuid.UUID(int=0)),
            R.DeleteTopicState(name="named-and-id", topic_id=both),
            R.DeleteTopicState(name="no-such-topic", topic_id=uuid.UUID(int=0)),
        ],
        timeout_ms=10_000,
    )
    with connect(server) as sock:
        sock.sendall(request_frame(request, 6, 32))
        answer = DeleteTopicsResponse.decode(read_frame(sock)[5:], version=6)
    assert sorted(
        ((r.name or "", r.topic_id, r.error_code) for r in answer.responses), key=str
    ) == sorted([("", None, 42), ("named-and-id", both, 42), ("no-such-topic", None, 3)], key=str)


def test_delete_group_offsets_and_describe_log_dirs(server: KafkaServer, admin: Any) -> None:
    """OffsetDelete (KIP-496) removes a memberless group's committed offsets, partition by
    partition; DescribeLogDirs lists the broker's directory with the topic's size."""
    from kafka.structs import OffsetAndMetadata
    from kafka.structs import TopicPartition as KafkaTopicPartition

    new_topic(admin, "offsets-deleted", partitions=2)
    produce(server, "offsets-deleted", 3)
    first, second = (KafkaTopicPartition("offsets-deleted", p) for p in (0, 1))
    admin.alter_group_offsets(
        "deleting", {first: OffsetAndMetadata(2, "", -1), second: OffsetAndMetadata(0, "", -1)}
    )
    assert admin.delete_group_offsets("deleting", [first]) == {first: kafka_no_error()}
    left = admin.list_group_offsets("deleting")["deleting"]
    assert set(left) == {second} and left[second].offset == 0

    (broker,) = admin.describe_log_dirs(["offsets-deleted"])
    (log_dir,) = broker["log_dirs"]
    assert log_dir["error_code"] == 0 and log_dir["total_bytes"] > log_dir["usable_bytes"] > 0
    sizes = {
        (t["name"], p["partition_index"]): p["partition_size"]
        for t in log_dir["topics"]
        for p in t["partitions"]
    }
    assert set(sizes) == {("offsets-deleted", 0), ("offsets-deleted", 1)}
    assert sizes[("offsets-deleted", 0)] > 0 and sizes[("offsets-deleted", 1)] == 0


def kafka_no_error() -> Any:
    from kafka.errors import NoError

    return NoError


@pytest.mark.parametrize("version", [10, 11])
def test_metadata_before_v12_with_a_null_name_or_a_topic_id_is_an_invalid_request(
    server: KafkaServer, admin: Any, version: int
) -> None:
    """Metadata v10 and v11 carry a topic id field but cannot look a topic up by it: as
    Kafka's ``handleTopicMetadataRequest`` does, an entry with a null name or a non-zero
    id makes the whole request INVALID_REQUEST (42), answered for each entry asked (a null
    name as "", as the response has no null names before v12), with no brokers and no
    topic described; the door looked the id up instead."""
    new_topic(admin, f"metadata-v{version}")
    topic_id = _metadata_topic_id(server, f"metadata-v{version}")
    T = MetadataRequest.MetadataRequestTopic
    for entries in (
        [T(name=None, topic_id=topic_id)],
        [T(name=f"metadata-v{version}", topic_id=topic_id)],
        [T(name=f"metadata-v{version}", topic_id=uuid.UUID(int=0)), T(name=None, topic_id=None)],
    ):
        request = MetadataRequest(
            topics=entries,
            allow_auto_topic_creation=False,
            include_topic_authorized_operations=False,
        )
        with connect(server) as sock:
            sock.sendall(request_frame(request, version, 60))
            answer = MetadataResponse.decode(read_frame(sock)[5:], version=version)
        assert answer.brokers == [] and answer.controller_id == -1
        assert [(t.error_code, t.name, t.topic_id, t.partitions) for t in answer.topics] == [
            (42, e.name or "", e.topic_id if e.topic_id and e.topic_id.int else None, [])
            for e in entries
        ]


def _metadata_topic_id(server: KafkaServer, name: str) -> uuid.UUID:
    request = MetadataRequest(
        topics=[MetadataRequest.MetadataRequestTopic(name=name, topic_id=uuid.UUID(int=0))],
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=False,
    )
    with connect(server) as sock:
        sock.sendall(request_frame(request, 12, 61))
        answer = MetadataResponse.decode(read_frame(sock)[5:], version=12)
    assert answer.topics[0].error_code == 0
    return cast(uuid.UUID, answer.topics[0].topic_id)


def test_delete_topics_answers_a_duplicate_name_or_id_invalid_request_and_deletes_neither(
    server: KafkaServer, admin: Any
) -> None:
    """As Kafka's ControllerApis.deleteTopics: a name asked twice, an id asked twice, and a
    name whose topic's id is asked too are each answered INVALID_REQUEST (42) once, and
    those topics stay; the other entries go on (an unknown name: 3). The controller
    deleted the first of two and answered the second as unknown."""
    for name in ("twice-by-name", "twice-by-id", "by-name-and-id"):
        new_topic(admin, name)
    by_id, both = (_metadata_topic_id(server, n) for n in ("twice-by-id", "by-name-and-id"))
    R = DeleteTopicsRequest
    zero = uuid.UUID(int=0)
    request = R(
        topics=[
            R.DeleteTopicState(name="twice-by-name", topic_id=zero),
            R.DeleteTopicState(name="twice-by-name", topic_id=zero),
            R.DeleteTopicState(name=None, topic_id=by_id),
            R.DeleteTopicState(name=None, topic_id=by_id),
            R.DeleteTopicState(name="by-name-and-id", topic_id=zero),
            R.DeleteTopicState(name=None, topic_id=both),
            R.DeleteTopicState(name="no-such-topic", topic_id=zero),
        ],
        timeout_ms=10_000,
    )
    with connect(server) as sock:
        sock.sendall(request_frame(request, 6, 62))
        answer = DeleteTopicsResponse.decode(read_frame(sock)[5:], version=6)
    assert sorted(((r.name, r.topic_id, r.error_code) for r in answer.responses), key=str) == (
        sorted(
            [
                ("twice-by-name", None, 42),
                (None, by_id, 42),
                ("by-name-and-id", both, 42),
                ("no-such-topic", None, 3),
            ],
            key=str,
        )
    )
    assert {"twice-by-name", "twice-by-id", "by-name-and-id"} <= set(admin.list_topics())
