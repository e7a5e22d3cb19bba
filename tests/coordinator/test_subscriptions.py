"""Reading a consumer group member's subscribed topics in Highwater's and Kafka's encodings."""

from __future__ import annotations

import struct

import pytest
from highwater.coordinator.subscriptions import kafka_subscription_topics, subscribed_topics
from highwater.v1.consumer_protocol_pb2 import ConsumerProtocolSubscription
from kafka.protocol.consumer.metadata import (
    ConsumerProtocolSubscription as KafkaConsumerProtocolSubscription,
)


def kafka_subscription(version: int, *topics: str) -> bytes:
    owned = [KafkaConsumerProtocolSubscription.TopicPartition(topic="orders", partitions=[1])]
    return bytes(
        KafkaConsumerProtocolSubscription(
            topics=list(topics),
            user_data=b"sticky",
            owned_partitions=owned if version >= 1 else [],
            generation_id=7,
            rack_id="r1",
            version=version,
        ).encode()
    )


@pytest.mark.parametrize("version", [0, 1, 2, 3])
def test_every_kafka_version_is_read_by_its_version_0_prefix(version: int) -> None:
    data = kafka_subscription(version, "orders", "audit")
    assert subscribed_topics(data) == {"orders", "audit"}


def test_a_version_not_defined_yet_is_read_too() -> None:
    # Kafka reads any version >= 0 with version 0's schema: later versions only append.
    future = struct.pack(">h", 9) + kafka_subscription(3, "t")[2:] + b"new fields"
    assert kafka_subscription_topics(future) == {"t"}


def test_highwater_subscriptions_are_read_as_protobuf() -> None:
    data = ConsumerProtocolSubscription(topics=["orders"], user_data=b"\x00").SerializeToString()
    assert subscribed_topics(data) == {"orders"}


@pytest.mark.parametrize(
    "data",
    [
        b"sub",
        b"\x00\x00",  # no topic array
        b"\xff\xff\x00\x00\x00\x00\xff\xff\xff\xff",  # a negative version
        b"\x00\x00\xff\xff\xff\xff\xff\xff\xff\xff",  # a null topic array
        b"\x00\x00\x00\x00\x00\x01\x00\x06ord",  # a topic shorter than its length
        b"\x00\x00\x00\x00\x00\x01\x00\x01\xff\xff\xff\xff\xff",  # not UTF-8
        b"\x00\x00\x00\x00\x00\x01\x00\x01t",  # no user data
        b"\x00\x00\x00\x00\x00\x00\x00\x00\x00\x05ab",  # user data shorter than its length
    ],
)
def test_bytes_in_neither_encoding_are_no_subscription(data: bytes) -> None:
    assert subscribed_topics(data) is None


def test_an_empty_kafka_subscription_subscribes_to_nothing() -> None:
    assert kafka_subscription_topics(struct.pack(">hii", 0, 0, -1)) == frozenset()
