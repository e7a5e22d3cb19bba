"""The embedded server with two log directories (``log.dirs``): DescribeLogDirs, a failed
directory answering KAFKA_STORAGE_ERROR while the other serves, and the process stopping
once every directory has failed, as Kafka's broker halts."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import grpc.aio
import pytest
from embedded_servers import free_port
from highwater.controller_api import messages as m
from highwater.controller_api.client import ControllerClient
from highwater.embedded import EmbeddedServer
from highwater.errors import KafkaStorageError
from highwater.v1 import broker_pb2 as pb
from highwater.v1 import broker_pb2_grpc
from highwater.v1.common_pb2 import ErrorCode

pytestmark = pytest.mark.timeout(60)


async def produce(stub: broker_pb2_grpc.BrokerStub, partition: int) -> int:
    request = pb.ProduceRequest(acks=1, timeout_ms=5000)
    plain = request.topics.add(topic="t").partitions.add(partition=partition).records
    plain.records.add(value=b"v")
    reply = await stub.Produce(request)
    return int(reply.topics[0].partitions[0].error)


def fail(directory: Path) -> None:
    """The disk under ``directory`` is gone: the path now names a plain file."""
    shutil.rmtree(directory)
    directory.write_text("")


async def test_a_failed_directory_answers_storage_errors_and_the_last_one_stops_the_server(
    tmp_path: Path,
) -> None:
    address = f"127.0.0.1:{free_port()}"
    dirs = [tmp_path / "a", tmp_path / "b"]
    server = EmbeddedServer(listen=address, data_dir=tmp_path / "server", log_dirs=dirs)
    await server.start()
    try:
        await server.broker.wait_unfenced()
        async with (
            grpc.aio.insecure_channel(address) as channel,
            ControllerClient([address]) as admin,
        ):
            stub = broker_pb2_grpc.BrokerStub(channel)
            reply = await admin.create_topics(m.CreateTopicsRequest((m.CreatableTopic("t", 2, 1),)))
            assert reply.topics[0].error == ErrorCode.NONE
            async with asyncio.timeout(10):
                while [await produce(stub, p) for p in (0, 1)] != [ErrorCode.NONE] * 2:
                    await asyncio.sleep(0.02)

            # __consumer_offsets' 50 partitions went 25 and 25; then t-0 to a, t-1 to b.
            everything = await stub.DescribeLogDirs(pb.DescribeLogDirsRequest())
            assert [sum(len(t.partitions) for t in r.topics) for r in everything.results] == [
                26,
                26,
            ]
            described = await stub.DescribeLogDirs(
                pb.DescribeLogDirsRequest(topics=[pb.DescribeLogDirsTopic(topic="t")])
            )
            listed = {
                r.log_dir: [(t.name, p.partition_index) for t in r.topics for p in t.partitions]
                for r in described.results
            }
            assert listed == {str(dirs[0]): [("t", 0)], str(dirs[1]): [("t", 1)]}
            assert all(r.error == ErrorCode.NONE and r.total_bytes > 0 for r in described.results)
            only = await stub.DescribeLogDirs(
                pb.DescribeLogDirsRequest(
                    topics=[pb.DescribeLogDirsTopic(topic="t", partitions=[1])]
                )
            )
            assert [len(r.topics) for r in only.results] == [0, 1]

            fail(dirs[0])
            assert [d.path for d in server.broker.log_manager.probe_dirs()] == [dirs[0]]
            assert await produce(stub, 0) == ErrorCode.KAFKA_STORAGE_ERROR
            assert await produce(stub, 1) == ErrorCode.NONE
            described = await stub.DescribeLogDirs(pb.DescribeLogDirsRequest())
            failed, healthy = described.results
            assert failed.error == ErrorCode.KAFKA_STORAGE_ERROR and not failed.topics
            assert failed.total_bytes == -1 and "was replaced" in failed.error_message
            assert healthy.error == ErrorCode.NONE
            assert sum(len(t.partitions) for t in healthy.topics) == 26
            # The controller heard of it: the only replica cannot lead, the partition is
            # leaderless (its ISR keeps the broker: the records are on the failed disk).
            async with asyncio.timeout(10):
                while True:
                    found = await stub.Metadata(pb.MetadataRequest(topics=["t"]))
                    leaders = {p.partition: p.leader_id for p in found.topics[0].partitions}
                    if leaders == {0: -1, 1: 1}:
                        break
                    await asyncio.sleep(0.02)
            assert server.failure is None

            fail(dirs[1])
            server.broker.log_manager.probe_dirs()
            await asyncio.wait_for(server.wait_stopped(), 10)
            assert isinstance(server.failure, KafkaStorageError)
            assert "every log directory failed" in str(server.failure)
    finally:
        await server.stop()
