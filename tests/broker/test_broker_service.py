"""The broker's data path in the embedded server: produce, fetch, offsets, metadata, bad input.

Each test runs a real :class:`EmbeddedServer` (a single-voter controller and a broker on
one loopback port) and talks to it over gRPC as any client would.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc.aio
import pytest
from broker_roles import leads
from embedded_servers import free_port
from highwater.broker.partitions import PartitionManager
from highwater.broker.service import BrokerSettings
from highwater.config.topic import LogConfig
from highwater.controller_api import messages as m
from highwater.controller_api.client import ControllerClient
from highwater.embedded import EmbeddedServer
from highwater.internal.v1 import replication_pb2, replication_pb2_grpc
from highwater.metadata import MetadataImage
from highwater.records import SimpleRecord, build_batch, iter_batches
from highwater.storage.log_manager import CLEAN_SHUTDOWN_FILE, LogManagerSettings
from highwater.storage.topic_partition import TopicPartition
from highwater.v1 import broker_pb2 as pb
from highwater.v1 import broker_pb2_grpc
from highwater.v1.common_pb2 import ErrorCode

pytestmark = pytest.mark.timeout(60)


@dataclass
class Cluster:
    server: EmbeddedServer
    broker: broker_pb2_grpc.BrokerStub
    admin: ControllerClient

    async def create_topic(self, name: str, partitions: int = 1, **configs: str) -> None:
        reply = await self.admin.create_topics(
            m.CreateTopicsRequest((m.CreatableTopic(name, partitions, 1, configs=dict(configs)),))
        )
        assert reply.topics[0].error == ErrorCode.NONE, reply
        for _ in range(200):
            described = await self.broker.Metadata(pb.MetadataRequest(topics=[name]))
            found = described.topics[0].partitions
            if (
                len(found) == partitions
                and all(p.leader_id == 1 for p in found)
                # ...and the broker applied the image that made it leader.
                and all(leads(self.server.broker, name, p) for p in range(partitions))
            ):
                return
            await asyncio.sleep(0.02)
        raise AssertionError(f"{name} got no leader")

    async def produce(
        self, topic: str, values: list[bytes], *, partition: int = 0, acks: int = -1
    ) -> pb.ProducePartitionResponse:
        request = pb.ProduceRequest(acks=acks, timeout_ms=5000)
        plain = request.topics.add(topic=topic).partitions.add(partition=partition).records
        for value in values:
            plain.records.add(value=value)
        reply = await self.broker.Produce(request)
        return reply.topics[0].partitions[0] if reply.topics else pb.ProducePartitionResponse()

    async def produce_bytes(
        self, topic: str, data: bytes, *, partition: int = 0, acks: int = -1
    ) -> pb.ProducePartitionResponse:
        request = pb.ProduceRequest(acks=acks, timeout_ms=5000)
        request.topics.add(topic=topic).partitions.add(partition=partition, record_batches=data)
        return (await self.broker.Produce(request)).topics[0].partitions[0]

    async def fetch(
        self,
        topic: str,
        offset: int,
        *,
        partition: int = 0,
        max_wait_ms: int = 0,
        epoch: int = -1,
    ) -> pb.FetchPartitionResponse:
        request = pb.FetchRequest(max_wait_ms=max_wait_ms, min_bytes=1, max_bytes=1 << 20)
        request.topics.add(topic=topic).partitions.add(
            partition=partition,
            current_leader_epoch=epoch,
            fetch_offset=offset,
            partition_max_bytes=1 << 20,
        )
        return (await self.broker.Fetch(request)).topics[0].partitions[0]

    async def list_offset(self, topic: str, timestamp: int) -> pb.ListOffsetsPartitionResponse:
        request = pb.ListOffsetsRequest()
        request.topics.add(topic=topic).partitions.add(
            partition=0, current_leader_epoch=-1, timestamp=timestamp
        )
        return (await self.broker.ListOffsets(request)).topics[0].partitions[0]


def values_of(records: bytes) -> list[bytes | None]:
    return [record.value for batch in iter_batches(records) for record in batch.records()]


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    address = f"127.0.0.1:{free_port()}"
    server = EmbeddedServer(listen=address, data_dir=tmp_path)
    await server.start()
    await server.broker.wait_unfenced()
    try:
        async with (
            grpc.aio.insecure_channel(address) as channel,
            ControllerClient([address]) as admin,
        ):
            yield Cluster(server, broker_pb2_grpc.BrokerStub(channel), admin)
    finally:
        await server.stop()


async def test_produced_records_are_fetched_back_up_to_the_high_watermark(
    cluster: Cluster,
) -> None:
    await cluster.create_topic("orders")
    first = await cluster.produce("orders", [b"a", b"b"], acks=1)
    second = await cluster.produce("orders", [b"c"], acks=-1)
    assert (first.error, first.base_offset) == (ErrorCode.NONE, 0)
    assert (second.error, second.base_offset) == (ErrorCode.NONE, 2)
    fetched = await cluster.fetch("orders", 0)
    assert fetched.error == ErrorCode.NONE
    assert fetched.high_watermark == 3
    assert values_of(fetched.records) == [b"a", b"b", b"c"]
    # From the middle: whole batches, starting with the one that holds the offset.
    assert values_of((await cluster.fetch("orders", 2)).records) == [b"c"]
    assert (await cluster.fetch("orders", 3)).records == b""


async def test_a_fetch_can_leave_its_records_aside_for_an_edge_that_writes_them(
    cluster: Cluster,
) -> None:
    """The Kafka listener's fetch: the same read, the batches handed over as read beside
    the answer, whose records fields stay empty."""
    await cluster.create_topic("aside")
    await cluster.produce("aside", [b"a", b"b"], acks=1)
    request = pb.FetchRequest(max_wait_ms=0, min_bytes=1, max_bytes=1 << 20)
    request.topics.add(topic="aside").partitions.add(
        partition=0, fetch_offset=0, partition_max_bytes=1 << 20
    )
    aside: dict[tuple[str, int], bytes] = {}
    answer = await cluster.server.broker.requests.fetch(request, records_aside=aside)
    (partition,) = answer.topics[0].partitions
    assert (partition.error, partition.high_watermark, partition.records) == (0, 2, b"")
    assert values_of(aside[("aside", 0)]) == [b"a", b"b"]


async def test_acks_zero_gets_no_partition_answers_but_the_records_are_written(
    cluster: Cluster,
) -> None:
    await cluster.create_topic("fire-and-forget")
    request = pb.ProduceRequest(acks=0, timeout_ms=1000)
    request.topics.add(topic="fire-and-forget").partitions.add(partition=0).records.records.add(
        value=b"x"
    )
    assert list((await cluster.broker.Produce(request)).topics) == []
    assert values_of((await cluster.fetch("fire-and-forget", 0)).records) == [b"x"]


async def test_a_fetch_at_the_log_end_waits_for_the_next_produce(cluster: Cluster) -> None:
    await cluster.create_topic("waits")
    poll = asyncio.ensure_future(cluster.fetch("waits", 0, max_wait_ms=5000))
    await asyncio.sleep(0.2)
    assert not poll.done(), "a fetch with nothing to return must wait"
    await cluster.produce("waits", [b"wake"])
    woken = await asyncio.wait_for(poll, 5)
    assert values_of(woken.records) == [b"wake"]
    empty = await cluster.fetch("waits", 1, max_wait_ms=100)  # nothing comes: empty answer
    assert empty.error == ErrorCode.NONE and empty.records == b""


async def test_list_offsets_earliest_latest_by_time_and_max_timestamp(cluster: Cluster) -> None:
    await cluster.create_topic("clock")
    now = time.time_ns() // 1_000_000
    for timestamp, value in ((now - 3_000, b"a"), (now - 1_000, b"b"), (now - 2_000, b"c")):
        data = build_batch([SimpleRecord(value=value, timestamp=timestamp)])
        assert (await cluster.produce_bytes("clock", data)).error == ErrorCode.NONE
    earliest = await cluster.list_offset("clock", -2)
    latest = await cluster.list_offset("clock", -1)
    by_time = await cluster.list_offset("clock", now - 2_500)
    newest = await cluster.list_offset("clock", -3)
    assert (earliest.error, earliest.offset) == (ErrorCode.NONE, 0)
    assert latest.offset == 3
    assert (by_time.timestamp, by_time.offset) == (now - 1_000, 1)  # the first at or after
    assert (newest.timestamp, newest.offset) == (now - 1_000, 1)
    assert (await cluster.list_offset("clock", now + 60_000)).offset == -1  # none that late


async def test_bad_input_gets_typed_errors_and_writes_nothing(cluster: Cluster) -> None:
    # A min.insync.replicas that the replication factor cannot meet is refused, naming it.
    strict = await cluster.admin.create_topics(
        m.CreateTopicsRequest(
            (m.CreatableTopic("strict", 1, 1, configs={"min.insync.replicas": "2"}),)
        )
    )
    assert strict.topics[0].error == ErrorCode.INVALID_CONFIG
    assert "min.insync.replicas" in (strict.topics[0].error_message or "")
    await cluster.create_topic("plain")
    # Unknown topic, one partition beyond the topic, bad acks: an error each.
    assert (await cluster.produce("missing", [b"x"])).error == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    beyond = await cluster.produce("plain", [b"x"], partition=7)
    assert beyond.error == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert (await cluster.produce("plain", [b"x"], acks=2)).error == (
        ErrorCode.INVALID_REQUIRED_ACKS
    )
    # A batch whose CRC does not match its bytes.
    batch = bytearray(build_batch([SimpleRecord(value=b"payload")]))
    batch[-1] ^= 0xFF
    assert (await cluster.produce_bytes("plain", bytes(batch))).error == ErrorCode.CORRUPT_MESSAGE
    # Nothing of it was written.
    plain = await cluster.fetch("plain", 0)
    assert plain.high_watermark == 0 and plain.records == b""
    # Fetching out of range or in a future epoch.
    assert (await cluster.fetch("plain", 5)).error == ErrorCode.OFFSET_OUT_OF_RANGE
    assert (await cluster.fetch("plain", 0, epoch=99)).error == ErrorCode.UNKNOWN_LEADER_EPOCH
    # One bad partition does not spoil the others in the same request.
    request = pb.ProduceRequest(acks=1, timeout_ms=1000)
    request.topics.add(topic="missing").partitions.add(partition=0).records.records.add(value=b"1")
    request.topics.add(topic="plain").partitions.add(partition=0).records.records.add(value=b"2")
    reply = await cluster.broker.Produce(request)
    errors = {t.topic: t.partitions[0].error for t in reply.topics}
    assert errors == {"missing": ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "plain": ErrorCode.NONE}


async def test_metadata_names_the_broker_and_the_partitions(cluster: Cluster) -> None:
    await cluster.create_topic("described", partitions=3)
    reply = await cluster.broker.Metadata(pb.MetadataRequest(topics=["described", "nope"]))
    assert [(b.node_id, b.port) for b in reply.brokers] == [
        (1, int(cluster.server.listen.rsplit(":", 1)[1]))
    ]
    described, missing = reply.topics
    assert missing.error == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert [
        (p.partition, p.leader_id, list(p.replicas), list(p.isr)) for p in described.partitions
    ] == [
        (0, 1, [1], [1]),
        (1, 1, [1], [1]),
        (2, 1, [1], [1]),
    ]


async def test_an_idempotent_retry_is_not_written_twice(cluster: Cluster) -> None:
    await cluster.create_topic("once")
    ids = await cluster.broker.InitProducerId(pb.InitProducerIdRequest(producer_id=-1))
    assert ids.error == ErrorCode.NONE and ids.producer_id >= 0
    data = build_batch(
        [SimpleRecord(value=b"only-once")],
        producer_id=ids.producer_id,
        producer_epoch=ids.producer_epoch,
        base_sequence=0,
    )
    first = await cluster.produce_bytes("once", data)
    retry = await cluster.produce_bytes("once", data)  # the reply was lost: sent again
    assert first.error == retry.error == ErrorCode.NONE
    assert first.base_offset == retry.base_offset == 0
    assert values_of((await cluster.fetch("once", 0)).records) == [b"only-once"]
    another = await cluster.broker.InitProducerId(pb.InitProducerIdRequest(producer_id=-1))
    assert another.producer_id != ids.producer_id


async def test_records_survive_a_restart(tmp_path: Path) -> None:
    address = f"127.0.0.1:{free_port()}"
    for round_number in range(2):
        server = EmbeddedServer(listen=address, data_dir=tmp_path)
        await server.start()
        await server.broker.wait_unfenced()
        try:
            async with (
                grpc.aio.insecure_channel(address) as channel,
                ControllerClient([address]) as admin,
            ):
                cluster = Cluster(server, broker_pb2_grpc.BrokerStub(channel), admin)
                if round_number == 0:
                    await cluster.create_topic("kept")
                    await cluster.produce("kept", [b"before", b"restart"])
                else:
                    for _ in range(200):
                        fetched = await cluster.fetch("kept", 0)
                        if fetched.error == ErrorCode.NONE and fetched.records:
                            break
                        await asyncio.sleep(0.02)
                    assert values_of(fetched.records) == [b"before", b"restart"]
                    assert fetched.high_watermark == 2
        finally:
            await server.stop()


def test_highwater_server_demo_runs_and_stops_on_sigterm(tmp_path: Path) -> None:
    address = f"127.0.0.1:{free_port()}"
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "highwater",
            "server",
            "--listen",
            address,
            "--data-dir",
            str(tmp_path),
            "--demo",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert process.stdout is not None
        lines = []
        for line in process.stdout:
            lines.append(line.rstrip())
            if "serving on" in line:
                break
        assert any("consumed offset 2 key=demo-key" in line for line in lines), lines
        process.terminate()
        assert process.wait(20) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        if process.stdout is not None:
            process.stdout.close()


async def test_retention_runs_in_the_background_per_topic_config(tmp_path: Path) -> None:
    address = f"127.0.0.1:{free_port()}"
    settings = BrokerSettings(log=LogManagerSettings(log_retention_check_interval_ms=50))
    server = EmbeddedServer(listen=address, data_dir=tmp_path, broker_settings=settings)
    await server.start()
    await server.broker.wait_unfenced()
    try:
        async with (
            grpc.aio.insecure_channel(address) as channel,
            ControllerClient([address]) as admin,
        ):
            cluster = Cluster(server, broker_pb2_grpc.BrokerStub(channel), admin)
            # Small segments, and at most ~1 KiB kept: old segments must go.
            await cluster.create_topic(
                "short-lived",
                **{"segment.bytes": "512", "retention.bytes": "1024", "file.delete.delay.ms": "0"},
            )
            for number in range(40):
                await cluster.produce("short-lived", [b"x" * 100 + str(number).encode()])
            # Retention may still be deleting segments when ListOffsets answers, so a fetch
            # at that log start can race past it: ask again until the two agree.
            for _ in range(200):
                earliest = await cluster.list_offset("short-lived", -2)
                if earliest.offset > 0:
                    fetched = await cluster.fetch("short-lived", earliest.offset)
                    if fetched.error != ErrorCode.OFFSET_OUT_OF_RANGE:
                        break
                await asyncio.sleep(0.05)
            assert earliest.offset > 0, "retention deleted no segment"
            assert fetched.error == ErrorCode.NONE and fetched.records
            gone = await cluster.fetch("short-lived", 0)
            assert gone.error == ErrorCode.OFFSET_OUT_OF_RANGE
    finally:
        await server.stop()


async def test_producer_state_survives_a_restart_and_still_catches_duplicates(
    tmp_path: Path,
) -> None:
    address = f"127.0.0.1:{free_port()}"
    data = b""
    first_offset = -1
    for round_number in range(2):
        server = EmbeddedServer(listen=address, data_dir=tmp_path)
        await server.start()
        await server.broker.wait_unfenced()
        try:
            async with (
                grpc.aio.insecure_channel(address) as channel,
                ControllerClient([address]) as admin,
            ):
                cluster = Cluster(server, broker_pb2_grpc.BrokerStub(channel), admin)
                if round_number == 0:
                    await cluster.create_topic("dedup")
                    ids = await cluster.broker.InitProducerId(
                        pb.InitProducerIdRequest(producer_id=-1)
                    )
                    data = build_batch(
                        [SimpleRecord(value=b"exactly-once")],
                        producer_id=ids.producer_id,
                        producer_epoch=ids.producer_epoch,
                        base_sequence=0,
                    )
                    first_offset = (await cluster.produce_bytes("dedup", data)).base_offset
                else:
                    for _ in range(200):
                        if leads(server.broker, "dedup", 0):
                            break
                        await asyncio.sleep(0.02)
                    # The reply was lost before the restart: the producer sends it again.
                    retry = await cluster.produce_bytes("dedup", data)
                    assert (retry.error, retry.base_offset) == (ErrorCode.NONE, first_offset)
                    assert values_of((await cluster.fetch("dedup", 0)).records) == [b"exactly-once"]
        finally:
            await server.stop()


async def test_a_restart_that_lost_committed_records_leaves_the_partition_without_a_leader(
    tmp_path: Path,
) -> None:
    """The broker's heartbeat reports a replica whose log came back below its checkpointed
    high watermark: the controller does not elect it, though it is the last ISR member
    (docs/chaos.md, the 98 lost writes). Unclean election is off, so the partition waits."""
    address = f"127.0.0.1:{free_port()}"
    server = EmbeddedServer(listen=address, data_dir=tmp_path)
    await server.start()
    await server.broker.wait_unfenced()
    try:
        async with (
            grpc.aio.insecure_channel(address) as channel,
            ControllerClient([address]) as admin,
        ):
            cluster = Cluster(server, broker_pb2_grpc.BrokerStub(channel), admin)
            await cluster.create_topic("torn")
            for value in (b"a", b"b", b"c"):
                assert (await cluster.produce("torn", [value])).error == ErrorCode.NONE
    finally:
        await server.stop()
    # A crash that tore the last committed batch before it was flushed: recovery cuts it.
    (segment,) = tmp_path.rglob("torn-0/*.log")
    with segment.open("r+b") as segment_file:
        segment_file.truncate(segment.stat().st_size - 10)
    for marker in tmp_path.rglob(CLEAN_SHUTDOWN_FILE):
        marker.unlink()
    for recovery_points in tmp_path.rglob("recovery-point-offset-checkpoint"):
        lines = recovery_points.read_text().splitlines()
        unflushed = [line.replace("torn 0 3", "torn 0 0") for line in lines]
        recovery_points.write_text("\n".join(unflushed) + "\n")

    server = EmbeddedServer(listen=address, data_dir=tmp_path)
    await server.start()
    try:
        await server.broker.wait_unfenced()
        partitions = server.broker.partitions
        for _ in range(500):  # the image that unfenced the broker holds any election too
            if partitions.image.is_active_broker(1):
                break
            await asyncio.sleep(0.01)
        replica = partitions.get("torn", 0)
        assert replica.log.log_end_offset == 2 and replica.log.missing_committed_records
        assert replica.registration.isr == (1,) and replica.registration.leader == -1
    finally:
        await server.stop()


async def test_a_restarted_broker_takes_no_role_before_its_registration_is_in_the_metadata(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A restarting broker replays its previous incarnation's metadata first, in which it
    still leads in the old leader epoch; acting on it would make a log a crash cut short
    the leader its followers truncate to (docs/chaos.md). Every image whose roles it takes
    holds its new registration."""
    address = f"127.0.0.1:{free_port()}"
    server = EmbeddedServer(listen=address, data_dir=tmp_path)
    await server.start()
    await server.broker.wait_unfenced()
    try:
        async with (
            grpc.aio.insecure_channel(address) as channel,
            ControllerClient([address]) as admin,
        ):
            cluster = Cluster(server, broker_pb2_grpc.BrokerStub(channel), admin)
            await cluster.create_topic("roles")
            assert (await cluster.produce("roles", [b"a"])).error == ErrorCode.NONE
        first_epoch = server.broker.broker_epoch
    finally:
        await server.stop()

    applied: list[int | None] = []
    apply_image = PartitionManager.apply_image

    def recording_apply_image(
        self: PartitionManager, image: MetadataImage, *, create_logs: bool = True
    ) -> list[tuple[TopicPartition, LogConfig]]:
        registration = image.broker(self.broker_id)
        applied.append(None if registration is None else registration.broker_epoch)
        return apply_image(self, image, create_logs=create_logs)

    monkeypatch.setattr(PartitionManager, "apply_image", recording_apply_image)
    server = EmbeddedServer(listen=address, data_dir=tmp_path)
    await server.start()
    try:
        await server.broker.wait_unfenced()
        epoch = server.broker.broker_epoch
        assert epoch > first_epoch
        assert applied and set(applied) == {epoch}, applied
        assert server.broker.partitions.get("roles", 0).is_leader
    finally:
        await server.stop()


async def test_the_broker_answers_unclean_recovery_from_its_logs(cluster: Cluster) -> None:
    """KIP-966's GetReplicaLogInfo, as the active controller asks it over gRPC: the last
    batch's leader epoch and the log end offset of each replica named; an error for a
    partition it holds no replica of."""
    await cluster.create_topic("recovered")
    await cluster.produce("recovered", [b"a", b"b", b"c"])
    server = cluster.server
    topic_id = server.broker.partitions.get("recovered", 0).topic_id
    async with grpc.aio.insecure_channel(server.listeners.inter_broker.address) as channel:
        answer = await replication_pb2_grpc.ReplicaFetchServiceStub(channel).GetReplicaLogInfo(
            replication_pb2.GetReplicaLogInfoRequest(
                broker_id=1,
                broker_epoch=server.broker.broker_epoch,
                partitions=[
                    replication_pb2.ReplicaLogInfoPartition(topic_id=topic_id, partition=0),
                    replication_pb2.ReplicaLogInfoPartition(topic_id=topic_id, partition=7),
                ],
            )
        )
    assert (answer.broker_id, answer.broker_epoch) == (1, server.broker.broker_epoch)
    held, missing = answer.partitions
    assert (held.error, held.last_leader_epoch, held.log_end_offset) == (ErrorCode.NONE, 0, 3)
    assert missing.error == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
