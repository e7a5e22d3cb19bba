"""Appends to internal topics: only from the client id ``__admin_client`` (Kafka's
``ReplicaManager.appendRecords(internalTopicsAllowed)``), which the group coordinators
name themselves with.

Covered, on a running server over gRPC and the Kafka listener: a client's records for
``__consumer_offsets`` are refused INVALID_TOPIC_EXCEPTION and nothing is appended (a
client could otherwise rewrite a group's offsets, or fence the group's coordinator by
appending as its producer id); the coordinator's own appends go on (a group commits and
reads its offsets back); a request from ``__admin_client`` is appended.
"""

from __future__ import annotations

from typing import Any

import grpc
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from highwater.metadata.consumer_offsets import ADMIN_CLIENT_ID, CONSUMER_OFFSETS_TOPIC
from highwater.rpc.broker_streams import CLIENT_ID_METADATA_KEY
from highwater.v1 import admin_pb2, broker_pb2_grpc
from highwater.v1 import broker_pb2 as pb
from highwater.v1.common_pb2 import ErrorCode
from kafka.protocol.producer import ProduceRequest, ProduceResponse
from kafka.record.default_records import DefaultRecordBatchBuilder
from kafka_servers import KafkaServer, connect, read_frame, wait_for

pytestmark = pytest.mark.timeout(90)

INVALID_TOPIC_EXCEPTION = 17


def end_offsets(stub: broker_pb2_grpc.BrokerStub) -> list[int]:
    """The log end offset of every partition of ``__consumer_offsets``."""
    metadata = stub.Metadata(pb.MetadataRequest(topics=[CONSUMER_OFFSETS_TOPIC]), timeout=10)
    count = len(metadata.topics[0].partitions)
    request = pb.ListOffsetsRequest(
        topics=[
            pb.ListOffsetsTopic(
                topic=CONSUMER_OFFSETS_TOPIC,
                partitions=[
                    pb.ListOffsetsPartition(partition=p, timestamp=-1) for p in range(count)
                ],
            )
        ]
    )
    answer = stub.ListOffsets(request, timeout=10)
    return [p.offset for p in answer.topics[0].partitions]


def commit_through_a_group(server: KafkaServer, stub: broker_pb2_grpc.BrokerStub) -> None:
    """A group commits through its coordinator, which appends to ``__consumer_offsets``."""
    created = stub.CreateTopics(
        admin_pb2.CreateTopicsRequest(
            topics=[admin_pb2.CreatableTopic(name="internal-guard", num_partitions=1)]
        ),
        timeout=30,
    )
    assert created.topics[0].error == ErrorCode.NONE, created
    delivered: list[Any] = []
    producer = Producer({"bootstrap.servers": server.bootstrap})
    producer.produce("internal-guard", b"x", on_delivery=lambda e, m: delivered.append(e))
    assert producer.flush(30) == 0 and delivered == [None]
    consumer = Consumer(
        {
            "bootstrap.servers": server.bootstrap,
            "group.id": "internal-guard-group",
            "enable.auto.commit": False,
        }
    )
    try:
        consumer.assign([TopicPartition("internal-guard", 0, 0)])
        message = consumer.poll(30)
        assert message is not None and message.error() is None
        consumer.commit(message, asynchronous=False)
        committed = consumer.committed([TopicPartition("internal-guard", 0)], timeout=30)
        assert committed[0].offset == 1
    finally:
        consumer.close()


def test_a_clients_appends_to_an_internal_topic_are_refused(server: KafkaServer) -> None:
    with grpc.insecure_channel(server.address) as channel:
        stub = broker_pb2_grpc.BrokerStub(channel)
        wait_for(
            lambda: (
                stub.Metadata(pb.MetadataRequest(topics=[CONSUMER_OFFSETS_TOPIC]))
                .topics[0]
                .partitions
            ),
            what="__consumer_offsets",
        )
        before = end_offsets(stub)
        plain = pb.PlainRecords(records=[pb.Record(key=b"forged", value=b"offsets")])
        request = pb.ProduceRequest(
            acks=-1,
            topics=[
                pb.ProduceTopic(
                    topic=CONSUMER_OFFSETS_TOPIC,
                    partitions=[pb.ProducePartition(partition=0, records=plain)],
                )
            ],
        )
        for metadata in ((), ((CLIENT_ID_METADATA_KEY, "my-app"),)):
            answer = stub.Produce(request, timeout=10, metadata=metadata)
            refused = answer.topics[0].partitions[0]
            assert refused.error == ErrorCode.INVALID_TOPIC_EXCEPTION
            assert "internal topic" in refused.error_message

        R = ProduceRequest
        builder = DefaultRecordBatchBuilder(
            magic=2, compression_type=0, is_transactional=False, producer_id=-1,
            producer_epoch=-1, base_sequence=-1, batch_size=1 << 20,
        )  # fmt: skip
        builder.append(0, timestamp=None, key=b"forged", value=b"offsets", headers=[])
        kafka_request = R(
            transactional_id=None, acks=1, timeout_ms=5000,
            topic_data=[R.TopicProduceData(name=CONSUMER_OFFSETS_TOPIC, partition_data=[
                R.TopicProduceData.PartitionProduceData(index=0, records=bytes(builder.build()))])],
        )  # fmt: skip
        kafka_request.API_VERSION = 9
        kafka_request.with_header(correlation_id=5, client_id="my-app")
        with connect(server) as sock:
            sock.sendall(bytes(kafka_request.encode(header=True, framed=True)))
            answer9 = ProduceResponse.decode(read_frame(sock)[5:], version=9)
        assert answer9.responses[0].partition_responses[0].error_code == INVALID_TOPIC_EXCEPTION
        assert end_offsets(stub) == before  # nothing appended

        # The coordinator's own appends go on.
        commit_through_a_group(server, stub)
        assert end_offsets(stub) != before

        # A request from __admin_client is appended, as Kafka's broker appends it.
        answer = stub.Produce(
            request, timeout=10, metadata=((CLIENT_ID_METADATA_KEY, ADMIN_CLIENT_ID),)
        )
        assert answer.topics[0].partitions[0].error == ErrorCode.NONE
