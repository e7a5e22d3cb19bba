"""DescribeTopicPartitions (KIP-966) on a running server: over gRPC and as Kafka's API 75.

Covered: paging over gRPC gives exactly the partitions Metadata gives, named topics or
every topic; the Kafka listener's pages (raw frames, as kafka-python's schema encodes
them) match the gRPC ones field for field, cursors included, and ApiVersions lists the
API; a cursor naming a topic not asked for is INVALID_ARGUMENT over gRPC and
INVALID_REQUEST for each topic in Kafka's answer; a server started with
``max.request.partition.size.limit`` 3 holds every page to 3 partitions whatever either
protocol asks.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from highwater.broker.kafka_protocol.apis import topic_uuid
from highwater.broker.kafka_protocol.codec import (
    DescribeTopicPartitionsRequest,
    DescribeTopicPartitionsResponse,
)
from highwater.v1 import admin_pb2, broker_pb2_grpc
from highwater.v1 import broker_pb2 as pb
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse
from kafka_servers import KafkaServer, connect, kafka_server, read_frame, request_frame, wait_for

pytestmark = pytest.mark.timeout(120)

TOPICS = {"pages-a": 3, "pages-b": 1, "pages-c": 5}
INVALID_REQUEST = 42


@pytest.fixture(scope="module")
def stub(server: KafkaServer) -> Iterator[broker_pb2_grpc.BrokerStub]:
    with grpc.insecure_channel(server.address) as channel:
        stub = broker_pb2_grpc.BrokerStub(channel)
        create(stub, TOPICS)
        yield stub


def create(stub: broker_pb2_grpc.BrokerStub, topics: dict[str, int]) -> None:
    answer = stub.CreateTopics(
        admin_pb2.CreateTopicsRequest(
            topics=[
                admin_pb2.CreatableTopic(name=name, num_partitions=count, replication_factor=1)
                for name, count in topics.items()
            ]
        ),
        timeout=30,
    )
    assert all(t.error == 0 for t in answer.topics), answer

    def led() -> bool:
        described = stub.Metadata(pb.MetadataRequest(topics=list(topics)), timeout=10)
        return all(
            len(t.partitions) == topics[t.name] and all(p.leader_id >= 0 for p in t.partitions)
            for t in described.topics
        )

    wait_for(led, what="the topics' leaders")


def grpc_pages(
    stub: broker_pb2_grpc.BrokerStub, topics: list[str], limit: int
) -> list[pb.DescribeTopicPartitionsResponse]:
    pages = []
    request = pb.DescribeTopicPartitionsRequest(topics=topics, response_partition_limit=limit)
    while True:
        page = stub.DescribeTopicPartitions(request, timeout=10)
        pages.append(page)
        assert len(pages) < 200
        if not page.HasField("next_cursor"):
            return pages
        request.cursor.CopyFrom(page.next_cursor)


def partitions_of(pages: list[Any]) -> list[tuple[str, pb.PartitionMetadata]]:
    return [(t.name, p) for page in pages for t in page.topics for p in t.partitions]


def kafka_page(
    server: KafkaServer, topics: list[str], limit: int, cursor: tuple[str, int] | None
) -> Any:
    R = DescribeTopicPartitionsRequest
    request = R(
        topics=[R.TopicRequest(name=name) for name in topics],
        response_partition_limit=limit,
        cursor=None
        if cursor is None
        else R.Cursor(topic_name=cursor[0], partition_index=cursor[1]),
    )
    with connect(server) as sock:
        sock.sendall(request_frame(request, 0, 75))
        # The flexible response header: the correlation id and its tagged fields.
        return DescribeTopicPartitionsResponse.decode(read_frame(sock)[5:], version=0)


def kafka_pages(server: KafkaServer, topics: list[str], limit: int) -> list[Any]:
    pages = []
    cursor = None
    while True:
        page = kafka_page(server, topics, limit, cursor)
        pages.append(page)
        assert len(pages) < 200
        if page.next_cursor is None:
            return pages
        cursor = (page.next_cursor.topic_name, page.next_cursor.partition_index)


def test_grpc_pages_give_what_metadata_gives(stub: broker_pb2_grpc.BrokerStub) -> None:
    named = sorted(TOPICS)
    metadata = stub.Metadata(pb.MetadataRequest(topics=named), timeout=10)
    expected = [(t.name, p) for t in metadata.topics for p in t.partitions]
    for limit in (1, 2, 4, 9, 0):
        pages = grpc_pages(stub, named, limit)
        assert partitions_of(pages) == expected, limit
        assert all(t.topic_id for page in pages for t in page.topics)
    assert len(grpc_pages(stub, named, 2)) == 5  # 9 partitions, 2 a page
    # Every topic: the cluster's whole description, __consumer_offsets among it.
    everything = stub.Metadata(pb.MetadataRequest(), timeout=10)
    pages = grpc_pages(stub, [], 7)
    assert partitions_of(pages) == [(t.name, p) for t in everything.topics for p in t.partitions]
    assert "__consumer_offsets" in {t.name for page in pages for t in page.topics if t.is_internal}


def test_a_cursor_not_among_the_topics_is_refused(stub: broker_pb2_grpc.BrokerStub) -> None:
    request = pb.DescribeTopicPartitionsRequest(topics=["pages-a"])
    request.cursor.topic = "pages-b"
    with pytest.raises(grpc.RpcError) as refused:
        stub.DescribeTopicPartitions(request, timeout=10)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "cursor's topic 'pages-b'" in (refused.value.details() or "")
    with pytest.raises(grpc.RpcError) as negative:
        stub.DescribeTopicPartitions(
            pb.DescribeTopicPartitionsRequest(response_partition_limit=-1), timeout=10
        )
    assert negative.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_kafka_pages_match_the_grpc_ones(
    server: KafkaServer, stub: broker_pb2_grpc.BrokerStub
) -> None:
    with connect(server) as sock:
        asking = ApiVersionsRequest(client_software_name="raw", client_software_version="1")
        sock.sendall(request_frame(asking, 3, 1))
        # ApiVersions answers with header v0 (no tagged fields) at every version.
        versions = ApiVersionsResponse.decode(read_frame(sock)[4:], version=3)
    assert [(k.min_version, k.max_version) for k in versions.api_keys if k.api_key == 75] == [
        (0, 0)
    ]
    named = [*sorted(TOPICS), "pages-unknown"]
    grpc_answer = grpc_pages(stub, named, 2)
    kafka_answer = kafka_pages(server, named, 2)

    def from_grpc(page: pb.DescribeTopicPartitionsResponse) -> Any:
        return (
            [
                (
                    t.error,
                    t.name,
                    topic_uuid(t.topic_id) if t.topic_id else uuid.UUID(int=0),
                    [
                        (p.partition, p.leader_id, p.leader_epoch, list(p.replicas), list(p.isr))
                        for p in t.partitions
                    ],
                )
                for t in page.topics
            ],
            (page.next_cursor.topic, page.next_cursor.partition)
            if page.HasField("next_cursor")
            else None,
        )

    def from_kafka(page: Any) -> Any:
        return (
            [
                (
                    t.error_code,
                    t.name,
                    t.topic_id or uuid.UUID(int=0),  # kafka-python reads the zero id as None
                    [
                        (
                            p.partition_index,
                            p.leader_id,
                            p.leader_epoch,
                            p.replica_nodes,
                            p.isr_nodes,
                        )
                        for p in t.partitions
                    ],
                )
                for t in page.topics
            ],
            None
            if page.next_cursor is None
            else (page.next_cursor.topic_name, page.next_cursor.partition_index),
        )

    assert [from_kafka(p) for p in kafka_answer] == [from_grpc(p) for p in grpc_answer]
    assert from_kafka(kafka_answer[-1])[0][-1][:2] == (3, "pages-unknown")  # UNKNOWN_TOPIC


def test_a_kafka_cursor_not_among_the_topics_is_an_invalid_request(server: KafkaServer) -> None:
    answer = kafka_page(server, ["pages-a", "pages-c"], 10, ("pages-b", 0))
    assert [(t.error_code, t.name, t.partitions) for t in answer.topics] == [
        (INVALID_REQUEST, "pages-a", []),
        (INVALID_REQUEST, "pages-c", []),
    ]
    assert answer.next_cursor is None


def test_the_brokers_limit_holds_whatever_is_asked(tmp_path: Path) -> None:
    with kafka_server(tmp_path, "--override", "max.request.partition.size.limit=3") as limited:
        with grpc.insecure_channel(limited.address) as channel:
            stub = broker_pb2_grpc.BrokerStub(channel)
            create(stub, {"limited": 5})
            for asked in (0, 100):
                pages = grpc_pages(stub, ["limited"], asked)
                assert [sum(len(t.partitions) for t in p.topics) for p in pages] == [3, 2]
        pages = kafka_pages(limited, ["limited"], 2000)
        assert [sum(len(t.partitions) for t in p.topics) for p in pages] == [3, 2]
