"""Random and mutated Produce, Fetch and ReplicaFetch requests against a live broker.

Whatever the bytes, each partition's answer is a Kafka error code or a success; the broker
keeps serving; records produced before stay exactly as they were; and whatever a fuzzed
produce did append is whole, checked batches.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import grpc.aio
import pytest
from broker_roles import leads
from embedded_servers import free_port
from highwater.controller_api import messages as m
from highwater.controller_api.client import ControllerClient
from highwater.embedded import EmbeddedServer
from highwater.internal.v1 import replication_pb2 as rpb
from highwater.internal.v1 import replication_pb2_grpc
from highwater.records import SimpleRecord, build_batch, iter_batches
from highwater.v1 import broker_pb2 as pb
from highwater.v1 import broker_pb2_grpc
from highwater.v1.common_pb2 import ErrorCode

pytestmark = pytest.mark.timeout(120)

TOPIC = "fuzzed"
KNOWN_CODES = frozenset(ErrorCode.values()) - {ErrorCode.UNKNOWN_SERVER_ERROR}


def mutate(data: bytes, rng: random.Random) -> bytes:
    """One of: flipped bytes, a cut, bytes inserted, two batches spliced, pure noise."""
    choice = rng.randrange(5)
    buffer = bytearray(data)
    if choice == 0:
        for _ in range(rng.randint(1, 4)):
            buffer[rng.randrange(len(buffer))] ^= 1 << rng.randrange(8)
    elif choice == 1:
        del buffer[rng.randrange(len(buffer)) :]
    elif choice == 2:
        position = rng.randrange(len(buffer))
        buffer[position:position] = rng.randbytes(rng.randint(1, 16))
    elif choice == 3:
        buffer += data[rng.randrange(len(data)) :]
    else:
        buffer = bytearray(rng.randbytes(rng.randint(0, 200)))
    return bytes(buffer)


async def read_everything(stub: broker_pb2_grpc.BrokerStub) -> list[tuple[int, bytes | None]]:
    request = pb.FetchRequest(max_wait_ms=0, min_bytes=1, max_bytes=1 << 24)
    request.topics.add(topic=TOPIC).partitions.add(
        partition=0, current_leader_epoch=-1, fetch_offset=0, partition_max_bytes=1 << 24
    )
    answer = (await stub.Fetch(request)).topics[0].partitions[0]
    assert answer.error == ErrorCode.NONE
    return [(r.offset, r.value) for b in iter_batches(answer.records) for r in b.records()]


async def test_fuzzed_produce_and_fetch_requests_get_typed_answers(tmp_path: Path) -> None:
    address = f"127.0.0.1:{free_port()}"
    server = EmbeddedServer(listen=address, data_dir=tmp_path)
    await server.start()
    await server.broker.wait_unfenced()
    rng = random.Random(20261122)
    try:
        async with ControllerClient([address]) as admin:
            created = await admin.create_topics(
                m.CreateTopicsRequest((m.CreatableTopic(TOPIC, 1, 1),))
            )
            assert created.topics[0].error == ErrorCode.NONE
        for _ in range(200):
            if leads(server.broker, TOPIC, 0):
                break
            await asyncio.sleep(0.02)
        async with grpc.aio.insecure_channel(address) as channel:
            stub = broker_pb2_grpc.BrokerStub(channel)
            replica_fetches = replication_pb2_grpc.ReplicaFetchServiceStub(channel).ReplicaFetch()
            valid = build_batch([SimpleRecord(key=b"k%d" % i, value=b"v%d" % i) for i in range(5)])
            base = pb.ProduceRequest(acks=1, timeout_ms=1000)
            base.topics.add(topic=TOPIC).partitions.add(partition=0, record_batches=valid)
            assert (await stub.Produce(base)).topics[0].partitions[0].error == ErrorCode.NONE
            before = await read_everything(stub)

            for _ in range(300):
                request = pb.ProduceRequest(acks=rng.choice([-1, 0, 1, 2, -7]), timeout_ms=500)
                item = request.topics.add(
                    topic=rng.choice([TOPIC, TOPIC, "", "missing", "bad/name"])
                ).partitions.add(partition=rng.choice([0, 0, 0, 1, -1]))
                item.record_batches = mutate(valid, rng)
                reply = await stub.Produce(request)
                for topic in reply.topics:
                    for answer in topic.partitions:
                        assert answer.error in KNOWN_CODES
                fetch = pb.FetchRequest(
                    max_wait_ms=0,
                    min_bytes=rng.randint(0, 10),
                    max_bytes=rng.choice([0, 1, 100, 1 << 20]),
                )
                fetch.topics.add(topic=rng.choice([TOPIC, "missing"])).partitions.add(
                    partition=rng.choice([0, 3]),
                    current_leader_epoch=rng.choice([-1, 0, 5]),
                    fetch_offset=rng.choice([-5, 0, 3, 10**6]),
                    partition_max_bytes=rng.choice([0, 10, 1 << 20]),
                )
                fetched = await stub.Fetch(fetch)
                for topic in fetched.topics:
                    for answer in topic.partitions:
                        assert answer.error in KNOWN_CODES
                # A follower's fetch from someone who is no registered broker (or with a
                # wrong epoch): refused for every partition, and nothing moves.
                forged = rpb.ReplicaFetchRequest(
                    replica_id=rng.choice([-1, 99, server.broker.node_id]),
                    replica_epoch=rng.choice([-1, server.broker.broker_epoch + 1, 10**9]),
                    max_wait_ms=0,
                )
                forged.topics.add(topic=rng.choice([TOPIC, "missing"])).partitions.add(
                    partition=rng.choice([0, 3]),
                    fetch_offset=rng.choice([-5, 0, 3, 10**6]),
                    last_fetched_epoch=rng.choice([-1, 0, 9]),
                )
                await replica_fetches.write(forged)
                reply = await replica_fetches.read()
                assert isinstance(reply, rpb.ReplicaFetchResponse)
                for topic in reply.topics:
                    for answer in topic.partitions:
                        assert answer.error == ErrorCode.STALE_BROKER_EPOCH
                        assert not answer.records
            replica_fetches.cancel()

            # Still serving; what was there is untouched; what was added is whole batches.
            after = await read_everything(stub)
            assert after[: len(before)] == before
            offsets = [offset for offset, _ in after]
            assert offsets == sorted(set(offsets))
    finally:
        await server.stop()
