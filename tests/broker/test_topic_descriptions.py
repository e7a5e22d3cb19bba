"""KIP-966's pages of topic descriptions (``highwater.broker.topic_descriptions``), pure.

Covered: paging every topic or the ones named, at any limit, gives each partition once,
in name and partition order, each as Metadata describes it, no page over the limit; a
page that fills at a topic's end points the cursor at partition 0 of the next topic, as
Kafka's does; topics named but unknown or impossible are answered in place and count
nothing; the caller's permission is judged before the page is cut (refused topics left
out when every topic is asked for, answered TOPIC_AUTHORIZATION_FAILED at the end when
named); a topic deleted between two pages does not stop the paging; the bad requests
Kafka refuses are refused, and the limits (0 and over the broker's) as the gRPC and Kafka
requests mean them.
"""

from __future__ import annotations

import pytest
from highwater.broker.topic_descriptions import (
    add_partition,
    describe_topic_partitions,
    page_limit,
)
from highwater.errors import InvalidRequestError
from highwater.metadata import (
    BrokerEndpoint,
    MetadataImage,
    MetadataRecord,
    PartitionRecord,
    RegisterBrokerRecord,
    RemoveTopicRecord,
    TopicRecord,
    UnfenceBrokerRecord,
    replay,
)
from highwater.v1 import broker_pb2 as pb
from highwater.v1.common_pb2 import ErrorCode
from hypothesis import given, settings
from hypothesis import strategies as st

BROKERS = (1, 2, 3)


def records_of(topics: dict[str, int]) -> list[MetadataRecord]:
    records: list[MetadataRecord] = []
    for broker_id in BROKERS:
        endpoint = BrokerEndpoint("PLAINTEXT", f"b{broker_id}", 9092)
        records.append(RegisterBrokerRecord(broker_id, f"inc-{broker_id}", 1, (endpoint,)))
        if broker_id != 3:  # broker 3 stays fenced: its replicas are offline
            records.append(UnfenceBrokerRecord(broker_id, 1))
    for number, (name, count) in enumerate(sorted(topics.items())):
        topic_id = f"{number:022d}"
        records.append(TopicRecord(name, topic_id))
        for index in range(count):
            leader = BROKERS[index % 2]
            replicas = (leader, 3)
            records.append(PartitionRecord(topic_id, index, replicas, replicas, leader))
    return records


def image_of(topics: dict[str, int]) -> MetadataImage:
    return replay(records_of(topics), 10)


def described(image: MetadataImage, names: list[str]) -> list[tuple[str, pb.PartitionMetadata]]:
    """Every partition of ``names``, as Metadata's answer describes it."""
    expected = pb.TopicMetadata()
    out = []
    for name in names:
        topic = image.topic(name)
        assert topic is not None
        del expected.partitions[:]
        for index in range(len(topic.partitions)):
            registration = topic.partition(index)
            assert registration is not None
            add_partition(expected.partitions, image, index, registration)
        out.extend((name, p) for p in expected.partitions)
    return out


def page_through(
    image: MetadataImage, topics: list[str], limit: int
) -> tuple[list[pb.DescribeTopicPartitionsResponse], list[tuple[str, pb.PartitionMetadata]]]:
    pages = []
    seen: list[tuple[str, pb.PartitionMetadata]] = []
    cursor: tuple[str, int] | None = None
    while True:
        page = describe_topic_partitions(image, topics, cursor, limit)
        pages.append(page)
        assert len(pages) < 1000, "the paging does not end"
        for topic in page.topics:
            seen.extend((topic.name, p) for p in topic.partitions)
        if not page.HasField("next_cursor"):
            return pages, seen
        cursor = (page.next_cursor.topic, page.next_cursor.partition)


topic_sets = st.dictionaries(
    st.text("abcxyz.-_", min_size=1, max_size=6).filter(lambda n: n not in (".", "..")),
    st.integers(0, 9),
    max_size=8,
)


@settings(max_examples=200, deadline=None)
@given(topics=topic_sets, limit=st.integers(1, 12), named=st.booleans())
def test_paging_gives_every_partition_once_in_order_as_metadata_describes_it(
    topics: dict[str, int], limit: int, named: bool
) -> None:
    image = image_of(topics)
    pages, seen = page_through(image, sorted(topics) if named else [], limit)
    assert seen == described(image, sorted(topics))
    for page in pages:
        assert sum(len(t.partitions) for t in page.topics) <= limit
        for topic in page.topics:
            assert topic.error == ErrorCode.NONE
            assert topic.topic_id == image.topics.by_name[topic.name].topic_id
    # Every page but the last is full: nothing is cut short of the limit.
    assert all(sum(len(t.partitions) for t in p.topics) == limit for p in pages[:-1])


def test_a_page_full_at_a_topics_end_points_at_the_next_topic() -> None:
    """Kafka's rule: when the limit is reached exactly at the end of a topic, the cursor
    names partition 0 of the next topic; within a topic, the first partition left out."""
    image = image_of({"a": 2, "b": 3, "c": 1})
    pages, _ = page_through(image, [], 2)
    assert [
        (
            [(t.name, [p.partition for p in t.partitions]) for t in page.topics],
            (page.next_cursor.topic, page.next_cursor.partition)
            if page.HasField("next_cursor")
            else None,
        )
        for page in pages
    ] == [
        ([("a", [0, 1])], ("b", 0)),
        ([("b", [0, 1])], ("b", 2)),
        ([("b", [2]), ("c", [0])], None),
    ]
    # The partition's description: the leader, the ISR, broker 3's replica offline.
    first = pages[0].topics[0].partitions[0]
    assert (first.leader_id, list(first.replicas), list(first.offline_replicas)) == (1, [1, 3], [3])


def test_named_topics_that_are_unknown_or_impossible_are_answered_in_place() -> None:
    image = image_of({"a": 2, "c": 2})
    page = describe_topic_partitions(image, ["c", "b", "a", "no/such"], None, 3)
    assert [(t.name, t.error, len(t.partitions)) for t in page.topics] == [
        ("a", ErrorCode.NONE, 2),
        ("b", ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, 0),  # counts nothing
        ("c", ErrorCode.NONE, 1),
    ]
    assert (page.next_cursor.topic, page.next_cursor.partition) == ("c", 1)
    # "no/such" (a name no topic can have) comes after "c" in name order: the next page.
    rest = describe_topic_partitions(image, ["c", "b", "a", "no/such"], ("c", 1), 3)
    assert [(t.name, t.error, len(t.partitions)) for t in rest.topics] == [
        ("c", ErrorCode.NONE, 1),
        ("no/such", ErrorCode.INVALID_TOPIC_EXCEPTION, 0),
    ]
    assert not rest.HasField("next_cursor")


def test_permission_is_judged_before_the_page_is_cut() -> None:
    image = image_of({"a": 1, "b": 3, "c": 1})
    asked: list[tuple[str, bool]] = []

    def may_describe(topic: str, named: bool) -> bool:
        asked.append((topic, named))
        return topic != "b"

    every = describe_topic_partitions(image, [], None, 2, may_describe)
    # "b" is left out silently, so "a" and "c" fill the page together.
    assert [(t.name, t.error) for t in every.topics] == [("a", 0), ("c", 0)]
    assert not every.HasField("next_cursor")
    assert sorted(asked) == [("a", False), ("b", False), ("c", False)]

    asked.clear()
    named = describe_topic_partitions(image, ["b", "c", "gone"], None, 5, may_describe)
    assert [(t.name, t.error) for t in named.topics] == [
        ("c", ErrorCode.NONE),
        ("gone", ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
        ("b", ErrorCode.TOPIC_AUTHORIZATION_FAILED),  # at the end, without partitions
    ]
    assert named.topics[2].topic_id == "" and not named.topics[2].partitions
    assert sorted(asked) == [("b", True), ("c", True), ("gone", True)]


def test_a_topic_deleted_between_pages_does_not_stop_the_paging() -> None:
    records = records_of({"a": 1, "b": 3, "c": 2})
    image = replay(records, 10)
    first = describe_topic_partitions(image, [], None, 2)
    assert (first.next_cursor.topic, first.next_cursor.partition) == ("b", 1)
    topic_id = image.topics.by_name["b"].topic_id
    after = replay([*records, RemoveTopicRecord(topic_id)], 11)
    second = describe_topic_partitions(after, [], ("b", 1), 2)
    assert [(t.name, len(t.partitions)) for t in second.topics] == [("c", 2)]
    assert not second.HasField("next_cursor")


def test_limits_and_bad_requests() -> None:
    image = image_of({"a": 3, "b": 1})
    # Kafka refuses a cursor whose topic is not among those named.
    with pytest.raises(InvalidRequestError, match="cursor's topic 'b'"):
        describe_topic_partitions(image, ["a"], ("b", 0), 5)
    with pytest.raises(InvalidRequestError, match="negative"):
        describe_topic_partitions(image, [], ("a", -1), 5)
    # A gRPC request: 0 asks for the broker's limit, more is cut to it, negative refused.
    assert page_limit(0, 2000) == 2000
    assert page_limit(7, 2000) == 7
    assert page_limit(5000, 2000) == 2000
    with pytest.raises(InvalidRequestError, match="negative"):
        page_limit(-1, 2000)
    # A Kafka request's limit of 0 or less, as Kafka's loop answers it: 0 gives only a
    # cursor at the first topic, a negative limit nothing at all.
    zero = describe_topic_partitions(image, [], None, 0)
    assert not zero.topics and (zero.next_cursor.topic, zero.next_cursor.partition) == ("a", 0)
    negative = describe_topic_partitions(image, [], None, -5)
    assert not negative.topics and not negative.HasField("next_cursor")
    # A cursor past a topic's last partition gives the topic without partitions.
    past = describe_topic_partitions(image, [], ("a", 9), 5)
    assert [(t.name, len(t.partitions)) for t in past.topics] == [("a", 0), ("b", 1)]
