"""JBOD across real processes: a broker with two log directories, one of which fails.

Broker 11 runs with ``--log-dirs a,b`` and broker 12 with one directory; topic ``jbod`` has
two partitions replicated on both, led by broker 11, so partition 0 lands in ``a`` and
partition 1 in ``b`` (the directory with the fewest partitions). Directory ``a`` then
fails for real: it is replaced by a plain file, and the next roll of partition 0 meets the
I/O error. Broker 11 takes only ``a`` offline: partition 0 answers KAFKA_STORAGE_ERROR
there, its heartbeat names the directory and the replica, and the controller moves
partition 0's leadership to broker 12 and drops broker 11 from its ISR; partition 1 keeps
being served by broker 11 with its full ISR. Producers carry on (acks=all) and a consumer
reads every acknowledged record of both partitions. ``describe-log-dirs`` shows ``a``
failed and ``b`` with partition 1. Once the disk is back, a restart finds each partition
in the directory that holds it and partition 0 rejoins the ISR.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path

import grpc.aio
import pytest
from broker_processes import create_topic, metadata, process_cluster
from cli_process import highwater_cli
from highwater.client.admin import AdminClient, NewTopic
from highwater.client.consumer import OFFSET_BEGINNING, AsyncConsumer, TopicPartition
from highwater.client.producer import AsyncProducer
from highwater.rpc.channels import open_channel
from highwater.v1 import broker_pb2 as pb
from highwater.v1 import broker_pb2_grpc
from highwater.v1.common_pb2 import ErrorCode

pytestmark = pytest.mark.timeout(180)

TOPIC = "jbod"
JBOD, OTHER = 11, 12
VALUE = b"v" * 300  # a few records fill a 1 KiB segment: partition 0 rolls soon


async def wait_for(
    address: str, check: Callable[[dict[int, pb.PartitionMetadata]], bool], what: str
) -> dict[int, pb.PartitionMetadata]:
    """The topic's partitions as ``address`` sees them, once ``check`` holds."""
    last: dict[int, pb.PartitionMetadata] = {}
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        reply = await metadata(address, TOPIC)
        if reply is not None and reply.topics:
            last = {p.partition: p for p in reply.topics[0].partitions}
            if check(last):
                return last
        await asyncio.sleep(0.1)
    raise AssertionError(f"{what}: not within 60s; last seen {last}")


async def produce(bootstrap: str, partition: int, values: list[bytes]) -> list[int]:
    settings = {
        "bootstrap.servers": bootstrap,
        "acks": "all",
        "request.timeout.ms": 10_000,
        "batch.size": 512,  # one record a batch: each fits a segment
    }
    async with AsyncProducer(settings) as producer:
        sent = [producer.produce(TOPIC, value, partition=partition) for value in values]
        return [m.offset for m in await asyncio.gather(*sent)]


async def consume(bootstrap: str, partition: int) -> list[bytes | None]:
    values: list[bytes | None] = []
    async with AsyncConsumer({"bootstrap.servers": bootstrap}) as consumer:
        tp = TopicPartition(TOPIC, partition)
        _, high_watermark = await consumer.get_watermark_offsets(tp, timeout=30)
        consumer.assign([TopicPartition(TOPIC, partition, OFFSET_BEGINNING)])
        async with asyncio.timeout(30):
            while len(values) < high_watermark:
                message = await consumer.poll(1.0)
                if message is not None:
                    assert message.error() is None, message.error()
                    values.append(message.value())
    return values


async def fetch_error(address: str, partition: int) -> int:
    """The error a consumer's fetch of ``partition`` gets from the broker at ``address``."""
    async with open_channel(address) as channel:
        request = pb.FetchRequest(max_wait_ms=0, min_bytes=1, max_bytes=1 << 20)
        request.topics.add(topic=TOPIC).partitions.add(
            partition=partition, current_leader_epoch=-1, fetch_offset=0, partition_max_bytes=1024
        )
        try:
            reply = await broker_pb2_grpc.BrokerStub(channel).Fetch(request, timeout=5)
        except grpc.aio.AioRpcError as e:
            raise AssertionError(f"the fetch failed as a whole: {e.code().name}") from None
        return int(reply.topics[0].partitions[0].error)


async def describe_log_dirs_cli(bootstrap: str, *args: str) -> dict[str, object]:
    """``highwater describe-log-dirs`` as an operator types it (in a process of its own)."""
    output = await highwater_cli("describe-log-dirs", "--bootstrap-server", bootstrap, *args)
    lines = output.splitlines()
    assert lines[0] == "Querying brokers for log directories information"
    assert lines[1].startswith("Received log directory information from brokers ")
    document: dict[str, object] = json.loads(lines[2])
    return document


async def test_a_failed_log_directory_takes_only_its_partitions_offline(tmp_path: Path) -> None:
    dir_a, dir_b = tmp_path / "disk-a", tmp_path / "disk-b"
    cluster = process_cluster(
        tmp_path,
        [JBOD, OTHER],
        broker_args=lambda node: ("--log-dirs", f"{dir_a},{dir_b}") if node == JBOD else (),
    )
    jbod = cluster.brokers[JBOD]
    try:
        cluster.start()
        await create_topic(
            jbod.address,
            NewTopic(
                TOPIC,
                replica_assignment={0: [JBOD, OTHER], 1: [JBOD, OTHER]},
                config={"segment.bytes": "1024", "min.insync.replicas": "1"},
            ),
        )
        both = {JBOD, OTHER}
        await wait_for(
            jbod.address,
            lambda ps: all(p.leader_id == JBOD and set(p.isr) == both for p in ps.values()),
            "both partitions led by the JBOD broker with a full ISR",
        )
        # Metadata names the leader before its worker thread has made the logs: until
        # then the broker answers NOT_LEADER_OR_FOLLOWER.
        async with asyncio.timeout(30):
            while {await fetch_error(jbod.address, p) for p in (0, 1)} != {ErrorCode.NONE}:
                await asyncio.sleep(0.05)
        # Placement: the directory with the fewest partitions, in the order listed.
        assert (dir_a / f"{TOPIC}-0").is_dir() and not (dir_b / f"{TOPIC}-0").exists()
        assert (dir_b / f"{TOPIC}-1").is_dir() and not (dir_a / f"{TOPIC}-1").exists()
        ids = [
            line.split("=", 1)[1]
            for d in (dir_a, dir_b)
            for line in (d / "meta.properties").read_text().splitlines()
            if line.startswith("directory.id=")
        ]
        assert len(set(ids)) == 2

        written = {p: await produce(cluster.bootstrap, p, [VALUE] * 2) for p in (0, 1)}
        assert written == {0: [0, 1], 1: [0, 1]}

        # Disk a fails: its directory is replaced by a file; partition 0's next roll fails.
        dir_a.rename(tmp_path / "disk-a-removed")
        dir_a.write_text("the disk is gone")
        after = await produce(cluster.bootstrap, 0, [VALUE] * 6)  # retried on the new leader
        assert after == list(range(2, 8))
        states = await wait_for(
            jbod.address,
            lambda ps: (
                ps[0].leader_id == OTHER
                and list(ps[0].isr) == [OTHER]
                and ps[1].leader_id == JBOD
                and set(ps[1].isr) == both
            ),
            "partition 0 moved off the failed directory, partition 1 untouched",
        )
        assert states[1].leader_id == JBOD
        assert await fetch_error(jbod.address, 0) == ErrorCode.KAFKA_STORAGE_ERROR
        assert await fetch_error(jbod.address, 1) == ErrorCode.NONE
        assert await produce(cluster.bootstrap, 1, [VALUE] * 3) == [2, 3, 4]
        assert await consume(cluster.bootstrap, 0) == [VALUE] * 8
        assert await consume(cluster.bootstrap, 1) == [VALUE] * 5
        assert jbod.alive

        async with AdminClient(cluster.bootstrap) as admin:
            described = await admin.describe_log_dirs([JBOD, OTHER])
        a, b = described[JBOD][str(dir_a)], described[JBOD][str(dir_b)]
        assert a.error is not None and a.error.code == ErrorCode.KAFKA_STORAGE_ERROR
        assert a.replica_infos == {} and a.total_bytes is None
        assert b.error is None and set(b.replica_infos) == {(TOPIC, 1)}
        assert b.replica_infos[(TOPIC, 1)].size > 0 and not b.replica_infos[(TOPIC, 1)].is_future
        assert b.total_bytes is not None and b.usable_bytes is not None
        assert b.directory_id == ids[1]
        assert set(described[OTHER]) == {str(cluster.brokers[OTHER].data_dir / "logs")}

        document = await describe_log_dirs_cli(
            cluster.bootstrap, "--describe", "--broker-list", str(JBOD), "--topic-list", TOPIC
        )
        assert document["version"] == 1
        [broker] = document["brokers"]  # type: ignore[misc]
        assert broker["broker"] == JBOD
        by_path = {d["logDir"]: d for d in broker["logDirs"]}
        assert by_path[str(dir_a)]["error"] == "KAFKA_STORAGE_ERROR"
        assert by_path[str(dir_a)]["partitions"] == []
        assert by_path[str(dir_b)]["error"] is None
        [entry] = by_path[str(dir_b)]["partitions"]
        assert entry["partition"] == f"{TOPIC}-1" and entry["size"] > 0
        assert entry["offsetLag"] == 0 and entry["isFuture"] is False

        # The disk comes back; the restarted broker finds each partition where it is.
        jbod.terminate()
        dir_a.unlink()
        (tmp_path / "disk-a-removed").rename(dir_a)
        jbod.start()
        await wait_for(
            cluster.brokers[OTHER].address,
            lambda ps: set(ps[0].isr) == both and set(ps[1].isr) == both,
            "partition 0 back in sync from its directory after the restart",
        )
        async with AdminClient(cluster.bootstrap) as admin:
            described = await admin.describe_log_dirs([JBOD], topics=[TOPIC])
        assert {path: set(d.replica_infos) for path, d in described[JBOD].items()} == {
            str(dir_a): {(TOPIC, 0)},
            str(dir_b): {(TOPIC, 1)},
        }
        assert all(d.error is None for d in described[JBOD].values())
    finally:
        cluster.kill()
