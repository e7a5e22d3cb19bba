"""Produce to partition -1: the broker places plain records with Kafka's default partitioner.

Two brokers share the topic's partitions, so a request sent to one appends some records
here and forwards the others to their leader. Every keyed record lands where the Python
client's partitioner (and Java's, with which murmur2 is checked in
tests/records/test_records_partitioner.py) would put it, with the offset the answer names;
keyless records stay together on one sticky partition; batches and idempotent sequences
with -1 are refused.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc.aio
import pytest
import pytest_asyncio
from highwater.records.partitioner import partition_for_key
from highwater.v1 import broker_pb2 as pb
from highwater.v1 import broker_pb2_grpc
from highwater.v1.common_pb2 import ErrorCode
from two_brokers import TwoBrokers, two_brokers

pytestmark = [pytest.mark.timeout(90), pytest.mark.asyncio(loop_scope="module")]

TOPIC = "placed"
PARTITIONS = 4


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def cluster(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[TwoBrokers]:
    async with two_brokers(tmp_path_factory.mktemp("placement")) as running:
        leaders = await running.create_topic(TOPIC, PARTITIONS)
        assert set(leaders.values()) == {1, 2}, leaders
        yield running


@pytest_asyncio.fixture(loop_scope="module")
async def broker(cluster: TwoBrokers) -> AsyncIterator[broker_pb2_grpc.BrokerStub]:
    async with grpc.aio.insecure_channel(cluster.address) as channel:
        yield broker_pb2_grpc.BrokerStub(channel)


def produce_request(records: list[pb.Record], *, acks: int = -1) -> pb.ProduceRequest:
    request = pb.ProduceRequest(acks=acks)
    request.topics.add(topic=TOPIC).partitions.add(
        partition=-1, records=pb.PlainRecords(records=records)
    )
    return request


async def read(broker: broker_pb2_grpc.BrokerStub, partition: int, offset: int) -> pb.FetchedRecord:
    """The record at ``offset`` of ``partition``, fetched from whichever broker leads it."""
    request = pb.FetchRequest(record_format=pb.RECORD_FORMAT_PLAIN)
    request.topics.add(topic=TOPIC).partitions.add(partition=partition, fetch_offset=offset)
    answer = (await broker.Fetch(request)).topics[0].partitions[0]
    if answer.error == ErrorCode.NOT_LEADER_OR_FOLLOWER:
        raise LookupError(partition)
    assert answer.error == ErrorCode.NONE, answer
    return answer.plain_records[0]


async def test_keyed_records_go_where_the_client_partitioner_puts_them(
    cluster: TwoBrokers, broker: broker_pb2_grpc.BrokerStub
) -> None:
    keys = [f"user-{i}".encode() for i in range(40)] + [b""]
    records = [pb.Record(key=key, value=b"v-" + key) for key in keys]
    answer = (await broker.Produce(produce_request(records))).topics[0].partitions[0]

    assert answer.error == ErrorCode.NONE, answer
    assert answer.base_offset == -1
    assert len(answer.placements) == len(keys)
    assert {p.partition for p in answer.placements} == set(range(PARTITIONS))
    seen: dict[int, list[int]] = {}
    for key, where in zip(keys, answer.placements, strict=True):
        assert where.partition == partition_for_key(key, PARTITIONS)
        assert where.error == ErrorCode.NONE
        seen.setdefault(where.partition, []).append(where.offset)
    for offsets in seen.values():  # one batch per partition, in request order
        assert offsets == list(range(offsets[0], offsets[0] + len(offsets)))

    other = cluster.standalone.listen
    async with grpc.aio.insecure_channel(other) as channel:
        brokers = (broker, broker_pb2_grpc.BrokerStub(channel))
        for key, where in list(zip(keys, answer.placements, strict=True))[::7]:
            for stub in brokers:
                try:
                    record = await read(stub, where.partition, where.offset)
                except LookupError:
                    continue
                assert (record.key, record.value) == (key, b"v-" + key)
                break
            else:
                raise AssertionError(f"no broker leads {where.partition}")


async def test_keyless_records_of_a_request_stay_together_and_acks_0_says_nothing(
    broker: broker_pb2_grpc.BrokerStub,
) -> None:
    records = [pb.Record(value=f"{i}".encode()) for i in range(10)]
    answer = (await broker.Produce(produce_request(records))).topics[0].partitions[0]
    assert answer.error == ErrorCode.NONE
    assert len({p.partition for p in answer.placements}) == 1
    offsets = [p.offset for p in answer.placements]
    assert offsets == list(range(offsets[0], offsets[0] + 10))

    quiet = await broker.Produce(produce_request(records, acks=0))
    assert quiet == pb.ProduceResponse()


async def test_minus_one_with_batches_or_sequences_is_refused(
    broker: broker_pb2_grpc.BrokerStub,
) -> None:
    batches = pb.ProduceRequest()
    batches.topics.add(topic=TOPIC).partitions.add(partition=-1, record_batches=b"\0" * 70)
    answer = (await broker.Produce(batches)).topics[0].partitions[0]
    assert answer.error == ErrorCode.INVALID_REQUEST
    assert "plain records only" in answer.error_message

    sequenced = produce_request([pb.Record(key=b"k", value=b"v")])
    sequenced.topics[0].partitions[0].records.producer_id = 7
    answer = (await broker.Produce(sequenced)).topics[0].partitions[0]
    assert answer.error == ErrorCode.INVALID_REQUEST
    assert "sequences are per partition" in answer.error_message
    assert not answer.placements

    unknown = produce_request([pb.Record(key=b"k")])
    unknown.topics[0].topic = "no-such-topic"
    answer = (await broker.Produce(unknown)).topics[0].partitions[0]
    assert answer.error == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
