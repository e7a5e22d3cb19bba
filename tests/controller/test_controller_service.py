"""``ControllerServer`` on real ``RaftServer`` voters in one event loop, over loopback gRPC.

One voter: the Controller API end to end (topics, configs, broker lifecycle, ticks),
health and reflection. Three voters: NOT_CONTROLLER from followers, a client that finds
the active controller, failover, and a voter that catches up from a snapshot; at the end
every voter's image is the same.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest
from cutting_proxy import CuttingProxy
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from highwater.controller import ControllerConfig
from highwater.controller.service import ControllerServer, ControllerSettings
from highwater.controller_api import codec
from highwater.controller_api import messages as m
from highwater.controller_api.client import ControllerClient, ControllerUnavailableError
from highwater.internal.v1 import controller_pb2 as pb
from highwater.internal.v1 import controller_pb2_grpc
from highwater.metadata import BrokerEndpoint, ConfigResourceType, MetadataImage
from highwater.metadata.snapshot import snapshot_values
from highwater.raft import driver as raft_driver
from highwater.raft.driver import MetadataLogLayout, RaftServerSettings
from highwater.raft.partition_raft_log import metadata_log_config
from highwater.rpc.endpoints import free_loopback_ports
from highwater.v1.common_pb2 import ErrorCode
from raft_timing import FAST

pytestmark = pytest.mark.timeout(120)

NONE = ErrorCode.NONE
TOPIC = ConfigResourceType.TOPIC


class Quorum:
    """``size`` controller voters on loopback, started and stopped one by one."""

    def __init__(self, root: Path, size: int, settings: ControllerSettings) -> None:
        ports = free_loopback_ports(size)
        self.root = root
        self.voters = {n: f"127.0.0.1:{p}" for n, p in zip(range(1, size + 1), ports, strict=True)}
        self.settings = settings
        self.servers: dict[int, ControllerServer] = {}

    @property
    def addresses(self) -> list[str]:
        return list(self.voters.values())

    async def start(self, node_id: int) -> ControllerServer:
        server = ControllerServer(
            node_id=node_id,
            listen=self.voters[node_id],
            voters=self.voters,
            data_dir=self.root / f"node-{node_id}",
            settings=self.settings,
        )
        await server.start()
        self.servers[node_id] = server
        return server

    async def stop(self, node_id: int) -> None:
        await self.servers.pop(node_id).stop()

    async def stop_all(self) -> None:
        for node_id in list(self.servers):
            await self.stop(node_id)

    async def active(self, timeout_s: float = 20) -> ControllerServer:
        async with asyncio.timeout(timeout_s):
            while True:
                active = [s for s in self.servers.values() if s.is_active]
                if len(active) == 1:
                    return active[0]
                await asyncio.sleep(0.02)

    async def converged(self, timeout_s: float = 20) -> MetadataImage:
        """Wait until every running voter's committed image is the active one's."""
        active = await self.active()
        async with asyncio.timeout(timeout_s):
            while True:
                image = active.machine.image
                images = [s.machine.image for s in self.servers.values()]
                if (
                    all(i.offset == image.offset for i in images)
                    and active.store.pending_batches == 0
                ):
                    values = snapshot_values(image)
                    assert all(snapshot_values(i) == values for i in images)
                    return image
                await asyncio.sleep(0.02)


def settings(**controller: object) -> ControllerSettings:
    return ControllerSettings(
        raft=RaftServerSettings(raft=FAST),
        controller=ControllerConfig(**controller),  # type: ignore[arg-type]
        seed=7,
    )


@pytest.fixture
async def single(tmp_path: Path) -> AsyncIterator[tuple[ControllerServer, ControllerClient]]:
    quorum = Quorum(tmp_path, 1, settings())
    server = await quorum.start(1)
    await server.wait_active()
    client = ControllerClient(quorum.addresses, timeout_s=10)
    try:
        yield server, client
    finally:
        await client.close()
        await quorum.stop_all()


async def register_and_unfence(client: ControllerClient, broker_id: int) -> int:
    registered = await client.register_broker(
        m.RegisterBrokerRequest(broker_id, f"incarnation-{broker_id}")
    )
    assert registered.error == NONE, registered
    epoch = registered.broker_epoch
    beat = await client.broker_heartbeat(m.BrokerHeartbeatRequest(broker_id, epoch, epoch))
    assert beat.error == NONE and not beat.is_fenced
    return epoch


async def heartbeat_forever(client: ControllerClient, broker_id: int, epoch: int) -> None:
    while True:
        await client.broker_heartbeat(m.BrokerHeartbeatRequest(broker_id, epoch, 1 << 40))
        await asyncio.sleep(0.1)


async def lone_voter_with_topic(quorum: Quorum, topic: str) -> ControllerServer:
    """``quorum``'s voter 1 started and active, with broker 1 registered and unfenced and
    ``topic`` (one partition) created."""
    server = await quorum.start(1)
    await server.wait_active()
    async with ControllerClient(quorum.addresses) as client:
        await register_and_unfence(client, 1)
        created = await client.create_topics(
            m.CreateTopicsRequest((m.CreatableTopic(topic, 1, 1),))
        )
        assert created.topics[0].error == NONE
    return server


def slow_fsync(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    """Every ``os.fsync`` takes ``seconds`` more (a slow disk)."""
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        time.sleep(seconds)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)


def alter(topic: str, value: str) -> m.AlterConfigsRequest:
    return m.AlterConfigsRequest(
        (m.AlterConfigsResource(TOPIC, topic, (m.AlterableConfig("retention.ms", value=value),)),)
    )


# --- one voter -----------------------------------------------------------------------------


async def test_create_topics_then_describe_configs(
    single: tuple[ControllerServer, ControllerClient],
) -> None:
    server, client = single
    await register_and_unfence(client, 1)
    created = await client.create_topics(
        m.CreateTopicsRequest(
            (m.CreatableTopic("orders", 3, 1, configs={"retention.ms": "3600000"}),)
        )
    )
    assert created.error == NONE
    (result,) = created.topics
    assert result.error == NONE and result.num_partitions == 3 and result.topic_id
    # Answered once committed: the committed image already has it.
    topic = server.machine.image.topic("orders")
    assert topic is not None and topic.topic_id == result.topic_id and len(topic.partitions) == 3

    described = await client.describe_configs(
        m.DescribeConfigsRequest(
            (m.DescribeConfigsResource(TOPIC, "orders", ("retention.ms", "cleanup.policy")),)
        )
    )
    (resource,) = described.results
    values = {c.name: (c.value, c.source) for c in resource.configs}
    assert values == {
        "retention.ms": ("3600000", m.ConfigSource.DYNAMIC_TOPIC_CONFIG),
        "cleanup.policy": ("delete", m.ConfigSource.DEFAULT_CONFIG),
    }
    again = await client.create_topics(m.CreateTopicsRequest((m.CreatableTopic("orders", 1, 1),)))
    assert again.topics[0].error == ErrorCode.TOPIC_ALREADY_EXISTS
    assert server.store.latest_image() is server.machine.image


async def test_register_then_heartbeat_unfences_the_broker(
    single: tuple[ControllerServer, ControllerClient],
) -> None:
    server, client = single
    registered = await client.register_broker(
        m.RegisterBrokerRequest(
            5, "incarnation-a", (BrokerEndpoint("PLAINTEXT", "b5", 9092),), rack="r1"
        )
    )
    assert registered.error == NONE
    epoch = registered.broker_epoch
    broker = server.machine.image.broker(5)
    assert broker is not None and broker.fenced and broker.broker_epoch == epoch
    # The epoch is the offset of the RegisterBrokerRecord: the image ends there.
    assert server.machine.image.offset == epoch

    behind = await client.broker_heartbeat(m.BrokerHeartbeatRequest(5, epoch, epoch - 1))
    assert behind.error == NONE and behind.is_fenced and not behind.is_caught_up
    caught_up = await client.broker_heartbeat(m.BrokerHeartbeatRequest(5, epoch, epoch))
    assert caught_up.is_caught_up and not caught_up.is_fenced
    broker = server.machine.image.broker(5)
    assert broker is not None and not broker.fenced and broker.rack == "r1"

    # A retry of the registration gets the same epoch and writes nothing.
    offset = server.machine.image.offset
    retry = await client.register_broker(
        m.RegisterBrokerRequest(
            5, "incarnation-a", (BrokerEndpoint("PLAINTEXT", "b5", 9092),), rack="r1"
        )
    )
    assert retry.broker_epoch == epoch and server.machine.image.offset == offset
    stale = await client.broker_heartbeat(m.BrokerHeartbeatRequest(5, epoch + 100, epoch))
    assert stale.error == ErrorCode.STALE_BROKER_EPOCH
    ids = await client.allocate_producer_ids(m.AllocateProducerIdsRequest(5, epoch))
    assert (ids.error, ids.producer_id_start, ids.producer_id_len) == (NONE, 0, 1000)


async def test_health_reflection_and_bad_arguments(
    single: tuple[ControllerServer, ControllerClient],
) -> None:
    server, _ = single
    address = f"127.0.0.1:{server.port}"
    async with grpc.aio.insecure_channel(address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in (
            "",
            "highwater.internal.v1.Controller",
            "highwater.internal.v1.Raft",
            # the names before the services moved, which probes keep asking
            "highwater.v1.Controller",
            "highwater.v1.Raft",
        ):
            answer = await health.Check(health_pb2.HealthCheckRequest(service=service))
            assert answer.status == health_pb2.HealthCheckResponse.SERVING, service

        reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
        replies = reflection.ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")])
        )
        async for reply in replies:
            names = {s.name for s in reply.list_services_response.service}
            assert {"highwater.internal.v1.Controller", "highwater.internal.v1.Raft"} <= names
            break

        stub = controller_pb2_grpc.ControllerStub(channel)
        misnumbered = pb.CreateTopicsRequest(
            topics=[
                pb.CreatableTopic(
                    name="t", assignments=[pb.ReplicaAssignment(partition_id=3, broker_ids=[1])]
                )
            ]
        )
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await stub.CreateTopics(misnumbered)
        assert failed.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "must cover partitions 0..0" in (failed.value.details() or "")


async def test_tick_fences_a_broker_whose_session_expired(tmp_path: Path) -> None:
    quorum = Quorum(tmp_path, 1, settings(broker_session_timeout_ms=400))
    server = await quorum.start(1)
    try:
        await server.wait_active()
        async with ControllerClient(quorum.addresses) as client:
            await register_and_unfence(client, 1)
            epoch = await register_and_unfence(client, 2)
            beating = asyncio.create_task(heartbeat_forever(client, 2, epoch))
            try:
                created = await client.create_topics(
                    m.CreateTopicsRequest((m.CreatableTopic("t", 4, 2),))
                )
                assert created.topics[0].error == NONE
                async with asyncio.timeout(10):
                    while not server.machine.image.broker(1).fenced:  # type: ignore[union-attr]
                        await asyncio.sleep(0.05)
            finally:
                beating.cancel()
        image = server.machine.image
        assert not image.broker(2).fenced  # type: ignore[union-attr]
        assert not image.partitions_led_by(1)
        assert all(p.isr == (2,) for _, p in image.partitions())
    finally:
        await quorum.stop_all()


async def test_requests_behind_a_large_tick_batch_are_served_in_order(tmp_path: Path) -> None:
    quorum = Quorum(tmp_path, 1, settings(broker_session_timeout_ms=2000))
    server = await quorum.start(1)
    try:
        await server.wait_active()
        async with ControllerClient(quorum.addresses) as client:
            first = await register_and_unfence(client, 1)
            second = await register_and_unfence(client, 2)
            beating = asyncio.create_task(heartbeat_forever(client, 2, second))
            # Broker 1 heartbeats until its 1,000 leaderships exist: on a slow machine
            # creating them takes longer than its session.
            beating_first = asyncio.create_task(heartbeat_forever(client, 1, first))
            try:
                topics = tuple(m.CreatableTopic(f"t{i}", 200, 2) for i in range(10))
                created = await client.create_topics(m.CreateTopicsRequest(topics))
                assert all(t.error == NONE for t in created.topics)
                assert len(server.machine.image.partitions_led_by(1)) == 1000
                # Broker 1 stops heartbeating: a tick fences it and starts moving its
                # 1,000 leaderships and 2,000 ISR memberships, 1,000 partitions a batch.
                # Requests keep coming meanwhile, one after the other in a known order;
                # each sets the config to its own number.
                beating_first.cancel()
                answers = []
                async with asyncio.timeout(20):
                    for round_number in range(100):
                        calls = [
                            server.call(
                                codec.ALTER_CONFIGS, alter("t0", str(1000 * round_number + i))
                            )
                            for i in range(10)
                        ]
                        answers.extend(await asyncio.gather(*calls))
                        if server.machine.image.broker(1).fenced:  # type: ignore[union-attr]
                            break
                        await asyncio.sleep(0.02)
            finally:
                beating.cancel()
                beating_first.cancel()
        assert server.machine.image.broker(1).fenced  # type: ignore[union-attr]
        decoded = [codec.ALTER_CONFIGS.response_from_proto(a) for a in answers]
        assert all(a.error == NONE and a.resources[0].error == NONE for a in decoded)
        async with asyncio.timeout(20):  # the next ticks' batches
            while server.machine.image.partitions_with_isr_member(1):
                await asyncio.sleep(0.02)
        assert not server.machine.image.partitions_led_by(1)
        last = 1000 * round_number + 9
        assert server.machine.image.topic_config("t0") == {"retention.ms": str(last)}
    finally:
        await quorum.stop_all()


# --- three voters -----------------------------------------------------------------------


@pytest.fixture
async def quorum3(tmp_path: Path) -> AsyncIterator[Quorum]:
    quorum = Quorum(tmp_path, 3, settings())
    try:
        for node_id in quorum.voters:
            await quorum.start(node_id)
        yield quorum
    finally:
        await quorum.stop_all()


async def test_followers_answer_not_controller_with_the_active_one(quorum3: Quorum) -> None:
    active = await quorum3.active()
    follower = next(n for n in quorum3.voters if n != active.node_id)
    async with grpc.aio.insecure_channel(quorum3.voters[follower]) as channel:
        stub = controller_pb2_grpc.ControllerStub(channel)
        async with asyncio.timeout(10):
            while True:  # the follower learns who leads from the leader's first fetch answer
                answer = await stub.CreateTopics(pb.CreateTopicsRequest())
                if answer.controller_id != -1:
                    break
                await asyncio.sleep(0.05)
        assert answer.error == ErrorCode.NOT_CONTROLLER
        assert answer.controller_id == active.node_id
        assert answer.controller_address == quorum3.voters[active.node_id]
        described = await stub.DescribeConfigs(pb.DescribeConfigsRequest())
        assert described.error == ErrorCode.NOT_CONTROLLER
    # A client that only knows the follower gets there.
    async with ControllerClient([quorum3.voters[follower]]) as client:
        await register_and_unfence(client, 1)
        assert client.active_controller == quorum3.voters[active.node_id]
    image = await quorum3.converged()
    assert not image.broker(1).fenced  # type: ignore[union-attr]


async def test_a_timed_out_attempt_is_retried_at_the_active_controller_not_a_standby(
    quorum3: Quorum,
) -> None:
    active = await quorum3.active()
    first, second = (n for n in quorum3.voters if n != active.node_id)
    async with (
        CuttingProxy(quorum3.voters[active.node_id]) as to_active,
        CuttingProxy(quorum3.voters[first]) as to_first,
        CuttingProxy(quorum3.voters[second]) as to_second,
    ):
        bootstrap = [to_active.address, to_first.address, to_second.address]
        async with ControllerClient(bootstrap, attempt_timeout_s=1.0) as client:
            epoch = await register_and_unfence(client, 1)
            assert client.active_controller == to_active.address
            beat = m.BrokerHeartbeatRequest(1, epoch, epoch)
            # Slow: the first attempt times out, the second goes to the active controller
            # again and is answered once the held frames go through.
            to_active.stall()
            asyncio.get_running_loop().call_later(1.2, to_active.resume)
            assert (await client.broker_heartbeat(beat)).error == NONE
            assert (to_first.accepted, to_second.accepted) == (0, 0)
            assert client.active_controller == to_active.address
            # Hung: a second timeout in a row there, and the next address is asked (a
            # standby, whose NOT_CONTROLLER names the active controller's own address).
            to_active.stall()
            assert (await client.broker_heartbeat(beat)).error == NONE
            assert (to_first.accepted, to_second.accepted) == (1, 0)
            assert client.active_controller == quorum3.voters[active.node_id]


async def test_writes_go_on_through_failovers_and_every_image_agrees(quorum3: Quorum) -> None:
    async with ControllerClient(quorum3.addresses) as client:
        epoch = await register_and_unfence(client, 1)
        beating = asyncio.create_task(heartbeat_forever(client, 1, epoch))
        acked: list[str] = []

        async def create(name: str) -> None:
            answer = await client.create_topics(
                m.CreateTopicsRequest((m.CreatableTopic(name, 1, 1),))
            )
            if answer.topics[0].error == NONE:
                acked.append(name)

        try:
            for round_number in range(2):
                await asyncio.gather(*(create(f"r{round_number}-a{i}") for i in range(10)))
                active = await quorum3.active()
                stopping = asyncio.create_task(quorum3.stop(active.node_id))
                await asyncio.gather(*(create(f"r{round_number}-b{i}") for i in range(10)))
                await stopping
                new_active = await quorum3.active()
                assert new_active.node_id != active.node_id
                await asyncio.gather(*(create(f"r{round_number}-c{i}") for i in range(10)))
                await quorum3.start(active.node_id)
        finally:
            beating.cancel()
    image = await quorum3.converged()
    assert len(acked) >= 40
    missing = [name for name in acked if image.topic(name) is None]
    assert not missing, f"acknowledged topics lost: {missing}"


async def test_requests_arriving_while_a_batch_is_in_flight_share_the_next(
    quorum3: Quorum,
) -> None:
    active = await quorum3.active()
    async with ControllerClient(quorum3.addresses) as client:
        await register_and_unfence(client, 1)
        created = await client.create_topics(m.CreateTopicsRequest((m.CreatableTopic("g", 1, 1),)))
        assert created.topics[0].error == NONE
    store = active.store
    before = store.sealed_batches
    # Each request reaches the worker after it has sealed the group before (a group with
    # nothing in flight is sealed at once): alone, each would be a group of its own; those
    # that arrive while the batch before is not yet committed on a majority wait for it
    # and go to Raft together. Spaced by loop turns, not by time: a commit is an fsync
    # and a round trip, which no number of loop turns outlasts, however fast the disk.
    calls = []
    for i in range(30):
        calls.append(asyncio.ensure_future(active.call(codec.ALTER_CONFIGS, alter("g", str(i)))))
        for _ in range(3):
            await asyncio.sleep(0)
    answers = [codec.ALTER_CONFIGS.response_from_proto(a) for a in await asyncio.gather(*calls)]
    assert all(a.error == NONE and a.resources[0].error == NONE for a in answers)
    sealed = store.sealed_batches - before
    assert 1 < sealed <= 15, sealed
    assert active.machine.image.topic_config("g") == {"retention.ms": "29"}


async def test_a_leader_cut_off_from_the_quorum_fails_its_groups_when_it_resigns(
    tmp_path: Path,
) -> None:
    # The leader resigns 1.5 s after it last heard from a majority: time enough to stop
    # the followers and send both requests first, however loaded the machine.
    patient = dataclasses.replace(FAST, fetch_timeout_ms=1500)
    quorum = Quorum(
        tmp_path, 3, dataclasses.replace(settings(), raft=RaftServerSettings(raft=patient))
    )
    try:
        for node_id in quorum.voters:
            await quorum.start(node_id)
        active = await quorum.active()
        async with ControllerClient(quorum.addresses) as client:
            await register_and_unfence(client, 1)
            created = await client.create_topics(
                m.CreateTopicsRequest((m.CreatableTopic("g", 1, 1),))
            )
            assert created.topics[0].error == NONE
        # The followers gone, the leader's next batch can never commit, and it never
        # hears of a successor that would fail it (Raft fails a proposal when another
        # leader's entry commits over it). It resigns after fetch_timeout_ms with a
        # majority unheard: the request of the sealed batch and the one whose group waits
        # for that batch's commit are answered NOT_CONTROLLER then, as Kafka's controller
        # fails its deferred events when it renounces, not left waiting until their
        # callers give up.
        await asyncio.gather(*(quorum.stop(n) for n in quorum.voters if n != active.node_id))
        sealed = asyncio.ensure_future(active.call(codec.ALTER_CONFIGS, alter("g", "1")))
        async with asyncio.timeout(10):
            while active.store.in_flight() is None:
                await asyncio.sleep(0)
        lingering = asyncio.ensure_future(active.call(codec.ALTER_CONFIGS, alter("g", "2")))
        async with asyncio.timeout(10):
            while active.is_active:
                assert not sealed.done() and not lingering.done()
                await asyncio.sleep(0.02)
        async with asyncio.timeout(2):
            answers = [
                codec.ALTER_CONFIGS.response_from_proto(a)
                for a in await asyncio.gather(sealed, lingering)
            ]
        assert [a.error for a in answers] == [ErrorCode.NOT_CONTROLLER] * 2
    finally:
        await quorum.stop_all()


async def test_a_caller_gone_while_its_group_commits_leaves_the_others_answered(
    single: tuple[ControllerServer, ControllerClient],
) -> None:
    server, client = single
    await register_and_unfence(client, 1)
    created = await client.create_topics(m.CreateTopicsRequest((m.CreatableTopic("g", 1, 1),)))
    assert created.topics[0].error == NONE
    # The whole group is answered by one callback on its batch's commit; a caller that
    # stops waiting (its gRPC call cancelled) must not take the commit, or the other
    # callers' answers, with it.
    calls = [
        asyncio.ensure_future(server.call(codec.ALTER_CONFIGS, alter("g", str(i))))
        for i in range(8)
    ]
    async with asyncio.timeout(10):
        while server.store.in_flight() is None:
            await asyncio.sleep(0)
    calls[0].cancel()
    answers = await asyncio.gather(*calls[1:])
    assert calls[0].cancelled()
    for answer in answers:
        response = codec.ALTER_CONFIGS.response_from_proto(answer)
        assert response.error == NONE and response.resources[0].error == NONE
    assert server.machine.image.topic_config("g") == {"retention.ms": "7"}
    after = await client.alter_configs(alter("g", "8"))
    assert after.resources[0].error == NONE


async def test_a_group_of_alter_configs_is_decided_in_order_on_one_batch(
    single: tuple[ControllerServer, ControllerClient],
) -> None:
    server, client = single
    await register_and_unfence(client, 1)
    created = await client.create_topics(m.CreateTopicsRequest((m.CreatableTopic("g", 1, 1),)))
    assert created.topics[0].error == NONE
    store = server.store
    before = store.sealed_batches

    def change(*configs: m.AlterableConfig, topic: str = "g") -> m.AlterConfigsResource:
        return m.AlterConfigsResource(TOPIC, topic, configs)

    requests = [
        m.AlterConfigsRequest((change(m.AlterableConfig("cleanup.policy", value="compact")),)),
        # Decided on the group's state after the request before it: compact, then delete.
        m.AlterConfigsRequest(
            (change(m.AlterableConfig("cleanup.policy", m.AlterConfigOp.APPEND, "delete")),)
        ),
        # Refused: no records, and the others of the group are not affected.
        m.AlterConfigsRequest(
            (
                change(
                    m.AlterableConfig("retention.ms", value="5"),
                    m.AlterableConfig("segment.bytes", value="forever"),
                ),
            )
        ),
        # Answered per item: the unknown topic refused, the change to g made.
        m.AlterConfigsRequest(
            (
                change(m.AlterableConfig("retention.ms", value="1"), topic="ghost"),
                change(m.AlterableConfig("max.message.bytes", value="2048")),
            )
        ),
        m.AlterConfigsRequest(
            (change(m.AlterableConfig("cleanup.policy", m.AlterConfigOp.APPEND, "compact")),)
        ),
    ]
    # Queued together, before the worker runs: one group, one Raft batch.
    calls = [
        asyncio.ensure_future(server.call(codec.ALTER_CONFIGS, request)) for request in requests
    ]
    answers = [codec.ALTER_CONFIGS.response_from_proto(a) for a in await asyncio.gather(*calls)]
    assert store.sealed_batches - before == 1
    assert [[r.error for r in a.resources] for a in answers] == [
        [NONE],
        [NONE],
        [ErrorCode.INVALID_CONFIG],
        [ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, NONE],
        [NONE],
    ]
    assert server.machine.image.topic_config("g") == {
        "cleanup.policy": "compact,delete",
        "max.message.bytes": "2048",
    }
    assert server.machine.image.topic_config("ghost") == {}


async def test_a_group_behind_a_batch_in_flight_lingers_while_smaller_than_the_one_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    quorum = Quorum(tmp_path, 1, dataclasses.replace(settings(), append_linger_ms=300))
    try:
        server = await lone_voter_with_topic(quorum, "g")
        store = server.store
        loop = asyncio.get_running_loop()
        # Nothing in flight: a lone request is sealed at once, not held for the linger.
        started = loop.time()
        before = store.sealed_batches
        await server.call(codec.ALTER_CONFIGS, alter("g", "1"))
        assert loop.time() - started < 0.25 and store.sealed_batches == before + 1
        # A disk whose fsync takes 20 ms keeps each batch in flight that long (the lone
        # voter commits on its own flush; a fast disk commits a batch before the next
        # request arrives, and nothing would be in flight to linger behind).
        slow_fsync(monkeypatch, 0.02)

        def send(first: int, count: int) -> list[asyncio.Future[Any]]:
            return [
                asyncio.ensure_future(server.call(codec.ALTER_CONFIGS, alter("g", str(i))))
                for i in range(first, first + count)
            ]

        async def answered(calls: list[asyncio.Future[Any]]) -> None:
            answers = [
                codec.ALTER_CONFIGS.response_from_proto(a) for a in await asyncio.gather(*calls)
            ]
            assert all(a.resources[0].error == NONE for a in answers)

        async def until_in_flight() -> None:
            async with asyncio.timeout(10):
                while store.in_flight() is None:
                    await asyncio.sleep(0)

        # Every flush in the flusher thread (not only those after a slow one): each batch
        # stays in flight for 20 ms while the loop goes on.
        monkeypatch.setattr(raft_driver, "_INLINE_FSYNC_MAX_S", -1.0)
        # Six queued together, nothing in flight: one group, sealed at once.
        before = store.sealed_batches
        calls = send(2, 6)
        await until_in_flight()
        assert store.sealed_batches == before + 1
        # Behind it, six more spread over 48 ms: the group they start holds fewer than
        # six when the batch in flight commits (20 ms), so it keeps taking requests in,
        # up to six, long before its 300 ms linger: one batch. Without the linger it is
        # sealed at that commit, and the rest take a batch or more of their own.
        for i in range(8, 14):
            calls += send(i, 1)
            await asyncio.sleep(0.008)
        await answered(calls)
        assert store.sealed_batches - before == 2, store.sealed_batches - before
        # Six queued behind six in flight: as large as the group before at that batch's
        # commit, so sealed then, not held for the linger (a few writers, all of them in
        # the group already, wait for nobody).
        before = store.sealed_batches
        started = loop.time()
        calls = send(14, 6)
        await until_in_flight()
        calls += send(20, 6)
        await answered(calls)
        assert store.sealed_batches - before == 2, store.sealed_batches - before
        assert loop.time() - started < 0.25
        assert server.machine.image.topic_config("g") == {"retention.ms": "25"}
    finally:
        monkeypatch.undo()
        await quorum.stop_all()


async def test_requests_of_a_group_waiting_behind_a_batch_in_flight_fail_when_it_stops(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    quorum = Quorum(tmp_path, 1, settings())
    try:
        server = await lone_voter_with_topic(quorum, "g")
        # Every flush in the flusher thread and 500 ms long: a batch stays in flight (the
        # lone voter commits on its own flush) while the loop goes on.
        slow_fsync(monkeypatch, 0.5)
        monkeypatch.setattr(raft_driver, "_INLINE_FSYNC_MAX_S", -1.0)
        sealed = asyncio.ensure_future(server.call(codec.ALTER_CONFIGS, alter("g", "1")))
        async with asyncio.timeout(10):
            while server.store.in_flight() is None:
                await asyncio.sleep(0)
        waiting = asyncio.ensure_future(server.call(codec.ALTER_CONFIGS, alter("g", "2")))
        for _ in range(5):
            await asyncio.sleep(0)  # the worker runs it and waits for the batch in flight
        assert server.store.staged_records == 1
        # Stopped meanwhile: whatever its batch's fate, each caller gets an answer.
        await quorum.stop(1)
        async with asyncio.timeout(2):
            answers = [
                codec.ALTER_CONFIGS.response_from_proto(a)
                for a in await asyncio.gather(sealed, waiting)
            ]
        assert answers[1].error == ErrorCode.NOT_CONTROLLER
    finally:
        monkeypatch.undo()
        await quorum.stop_all()


async def test_a_pipeline_depth_of_two_seals_a_group_behind_one_batch_in_flight(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    quorum = Quorum(tmp_path, 1, dataclasses.replace(settings(), append_pipeline_depth=2))
    try:
        server = await lone_voter_with_topic(quorum, "g")
        store = server.store
        slow_fsync(monkeypatch, 0.05)
        # One slow flush sends the next ones to the flusher thread: from then on a batch
        # stays in flight (uncommitted: the lone voter commits on its own flush) for 50 ms
        # while the loop goes on.
        await server.call(codec.ALTER_CONFIGS, alter("g", "0"))
        before = store.sealed_batches
        first = asyncio.ensure_future(server.call(codec.ALTER_CONFIGS, alter("g", "1")))
        async with asyncio.timeout(10):
            while store.in_flight() is None:
                await asyncio.sleep(0)
        # With one batch in flight the next group is sealed at once, not at its commit:
        # two batches on their way at the same time, neither answered yet.
        second = asyncio.ensure_future(server.call(codec.ALTER_CONFIGS, alter("g", "2")))
        async with asyncio.timeout(10):
            while store.sealed_batches < before + 2:
                await asyncio.sleep(0)
        assert store.in_flight(2) is not None
        assert not first.done() and not second.done()
        # With two in flight, the next group waits for the older one's commit: the
        # requests arriving meanwhile share one batch.
        rest = [
            asyncio.ensure_future(server.call(codec.ALTER_CONFIGS, alter("g", str(i))))
            for i in range(3, 8)
        ]
        answers = [
            codec.ALTER_CONFIGS.response_from_proto(a)
            for a in await asyncio.gather(first, second, *rest)
        ]
        assert all(a.error == NONE and a.resources[0].error == NONE for a in answers)
        assert store.sealed_batches - before <= 4, store.sealed_batches - before
        assert server.machine.image.topic_config("g") == {"retention.ms": "7"}
        assert store.in_flight() is None
    finally:
        monkeypatch.undo()
        await quorum.stop_all()


async def test_a_voter_behind_the_log_start_catches_up_from_a_snapshot(tmp_path: Path) -> None:
    small = ControllerSettings(
        raft=RaftServerSettings(
            raft=FAST,
            log_config=metadata_log_config(segment_bytes=4096),
            metadata_log_max_record_bytes_between_snapshots=8192,
        ),
        seed=3,
    )
    quorum = Quorum(tmp_path, 3, small)
    try:
        for node_id in quorum.voters:
            await quorum.start(node_id)
        async with ControllerClient(quorum.addresses) as client:
            await register_and_unfence(client, 1)
            active = await quorum.active()
            lagging = next(n for n in quorum.voters if n != active.node_id)
            await quorum.stop(lagging)
            for i in range(150):
                answer = await client.create_topics(
                    m.CreateTopicsRequest((m.CreatableTopic(f"topic-{i:03d}", 2, 1),))
                )
                assert answer.topics[0].error == NONE
            layout = MetadataLogLayout(tmp_path / f"node-{active.node_id}")
            assert not (layout.log_dir / "00000000000000000000.log").exists()
            await quorum.start(lagging)
            altered = await client.alter_configs(alter("topic-000", "1234"))
            assert altered.resources[0].error == NONE
        image = await quorum.converged()
        assert image.topic("topic-149") is not None
        assert image.topic_config("topic-000") == {"retention.ms": "1234"}
        snapshots = list(
            MetadataLogLayout(tmp_path / f"node-{lagging}").snapshot_dir.glob("*.checkpoint")
        )
        assert snapshots, "the lagging voter should have fetched a snapshot"
    finally:
        await quorum.stop_all()


async def test_without_a_quorum_the_client_gives_up(tmp_path: Path) -> None:
    quorum = Quorum(tmp_path, 3, settings())
    try:
        await quorum.start(1)
        async with ControllerClient(quorum.addresses, timeout_s=1.5) as client:
            with pytest.raises(ControllerUnavailableError, match="no active controller"):
                await client.create_topics(m.CreateTopicsRequest((m.CreatableTopic("t"),)))
    finally:
        await quorum.stop_all()
