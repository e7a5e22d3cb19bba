"""Streams cut in the middle of a gRPC message, through a TCP proxy on loopback
(tests/support/cutting_proxy.py) between a client and a broker (``highwater server`` in
this process).

- A consumer session's connection dies while its ack-and-commit is half sent: the broker
  ends the session as for a crashed member (the other member gets every partition well
  within the session timeout, the group has one member left), the half-sent commit
  commits nothing (the other member resumes from the offset committed before), and the
  other member's session goes on.
- A ProduceStream's connection dies while a produce request is half sent: nothing of it is
  appended, the requests acknowledged before it are all there, and the broker keeps
  serving produce requests (the next one lands right after them, no gap).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import grpc
import grpc.aio
import pytest
import pytest_asyncio
from broker_roles import leads
from cutting_proxy import CuttingProxy
from embedded_servers import free_port
from highwater.controller_api import messages as m
from highwater.controller_api.client import ControllerClient
from highwater.embedded import EmbeddedServer
from highwater.v1 import broker_pb2 as pb
from highwater.v1 import broker_pb2_grpc, coordinator_pb2, coordinator_pb2_grpc
from highwater.v1.common_pb2 import ErrorCode

pytestmark = [pytest.mark.timeout(90), pytest.mark.asyncio(loop_scope="module")]

TOPIC = "cut"
PARTITIONS = 2
RECORDS = 10
SESSION_TIMEOUT_MS = 6000


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def server(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[EmbeddedServer]:
    address = f"127.0.0.1:{free_port()}"
    server = EmbeddedServer(listen=address, data_dir=tmp_path_factory.mktemp("cut"))
    await server.start()
    try:
        await server.broker.wait_unfenced()
        async with ControllerClient([address]) as admin:
            reply = await admin.create_topics(
                m.CreateTopicsRequest((m.CreatableTopic(TOPIC, PARTITIONS, 1),))
            )
        assert reply.topics[0].error == ErrorCode.NONE, reply
        async with asyncio.timeout(30):
            while not all(
                leads(server.broker, TOPIC, partition) for partition in range(PARTITIONS)
            ):
                await asyncio.sleep(0.02)
        async with grpc.aio.insecure_channel(address) as channel:
            stub = broker_pb2_grpc.BrokerStub(channel)
            for partition in range(PARTITIONS):
                answer = await stub.Produce(produce(partition, RECORDS))
                assert answer.topics[0].partitions[0].error == ErrorCode.NONE
        yield server
    finally:
        await server.stop()


def produce(partition: int, count: int, size: int = 10) -> pb.ProduceRequest:
    request = pb.ProduceRequest(acks=1)
    records = [pb.Record(value=b"%d-" % i + b"x" * size) for i in range(count)]
    request.topics.add(topic=TOPIC).partitions.add(
        partition=partition, records=pb.PlainRecords(records=records)
    )
    return request


def start(group: str) -> pb.ConsumerSessionRequest:
    return pb.ConsumerSessionRequest(
        start=pb.SessionStart(
            group_id=group,
            topics=[TOPIC],
            auto_offset_reset=pb.OFFSET_RESET_EARLIEST,
            assignors=["range"],
            session_timeout_ms=SESSION_TIMEOUT_MS,
            heartbeat_interval_ms=200,
        )
    )


def ack(partition: int, offset: int) -> pb.ConsumerSessionRequest:
    offsets = [pb.SessionOffset(topic=TOPIC, partition=partition, offset=offset)]
    return pb.ConsumerSessionRequest(ack=pb.SessionAck(offsets=offsets, commit=True))


class Session:
    """A client's end of a consumer session, its events read into a queue."""

    def __init__(self, stub: broker_pb2_grpc.BrokerStub) -> None:
        self.call = stub.ConsumerSession()
        self.events: asyncio.Queue[pb.ConsumerSessionResponse | None] = asyncio.Queue()
        self.reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        try:
            while (event := await self.call.read()) is not grpc.aio.EOF:
                self.events.put_nowait(event)
        except (grpc.aio.AioRpcError, asyncio.CancelledError):
            pass
        finally:
            self.events.put_nowait(None)

    async def next(self, kind: str, timeout: float = 20) -> pb.ConsumerSessionResponse:
        async with asyncio.timeout(timeout):
            while True:
                event = await self.events.get()
                assert event is not None, "the session ended"
                if event.WhichOneof("event") == kind:
                    return event

    async def assignment(self, size: int) -> set[int]:
        """The partitions of the next assignment that holds ``size`` of them."""
        while True:
            event = (await self.next("assignment")).assignment
            if len(event.partitions) == size and not event.revoked:
                return {p.partition for p in event.partitions}


async def test_a_session_cut_mid_commit_leaves_the_group_and_commits_nothing_more(
    server: EmbeddedServer,
) -> None:
    group = "cut-session"
    async with (
        CuttingProxy(server.listen) as proxy,
        grpc.aio.insecure_channel(server.listen) as direct,
        grpc.aio.insecure_channel(proxy.address) as cut,
    ):
        staying = Session(broker_pb2_grpc.BrokerStub(direct))
        await staying.call.write(start(group))
        assert await staying.assignment(PARTITIONS) == set(range(PARTITIONS))
        leaving = Session(broker_pb2_grpc.BrokerStub(cut))
        await leaving.call.write(start(group))
        (held,) = await leaving.assignment(1)
        await staying.assignment(1)

        delivered: list[int] = []
        while len(delivered) < RECORDS:
            event = (await leaving.next("records")).records
            assert event.partition == held
            delivered.extend(r.offset for r in event.records)
        assert delivered == list(range(RECORDS))
        await leaving.call.write(ack(held, 3))
        result = (await leaving.next("committed")).committed.partitions
        assert [(r.partition, r.offset, r.error) for r in result] == [(held, 3, ErrorCode.NONE)]

        proxy.cut_next_message()
        await leaving.call.write(ack(held, RECORDS))  # never arrives whole
        await asyncio.wait_for(proxy.cut.wait(), 10)
        cut_at = time.monotonic()
        await leaving.reader
        assert leaving.call.done()

        assert await staying.assignment(PARTITIONS) == set(range(PARTITIONS))
        assert time.monotonic() - cut_at < SESSION_TIMEOUT_MS / 1000
        coordinator = coordinator_pb2_grpc.GroupCoordinatorStub(direct)
        described = await coordinator.DescribeGroups(
            coordinator_pb2.DescribeGroupsRequest(group_ids=[group])
        )
        assert len(described.groups[0].members) == 1
        assert await committed(coordinator, group) == {held: 3, 1 - held: -1}

        # The other member resumes the cut one's partition where its commit left it.
        resumed: list[int] = []
        while len(resumed) < RECORDS - 3:
            event = (await staying.next("records")).records
            if event.partition == held:
                resumed.extend(r.offset for r in event.records)
        assert resumed == list(range(3, RECORDS))
        staying.call.cancel()
        await staying.reader


async def committed(
    coordinator: coordinator_pb2_grpc.GroupCoordinatorStub, group: str
) -> dict[int, int]:
    reply = await coordinator.OffsetFetch(
        coordinator_pb2.OffsetFetchRequest(
            group_id=group,
            topics=[
                coordinator_pb2.OffsetFetchTopic(name=TOPIC, partition_indexes=range(PARTITIONS))
            ],
        )
    )
    return {p.partition_index: p.committed_offset for p in reply.topics[0].partitions}


async def log_end(stub: broker_pb2_grpc.BrokerStub, partition: int) -> int:
    request = pb.ListOffsetsRequest()
    request.topics.add(topic=TOPIC).partitions.add(partition=partition, timestamp=-1)
    return (await stub.ListOffsets(request)).topics[0].partitions[0].offset


async def test_a_produce_stream_cut_mid_request_appends_nothing_of_it(
    server: EmbeddedServer,
) -> None:
    partition = 0
    async with (
        CuttingProxy(server.listen) as proxy,
        grpc.aio.insecure_channel(server.listen) as direct,
        grpc.aio.insecure_channel(proxy.address) as cut,
    ):
        stub = broker_pb2_grpc.BrokerStub(direct)
        before = await log_end(stub, partition)
        stream = broker_pb2_grpc.BrokerStub(cut).ProduceStream()
        for expected in (before, before + 4):
            await stream.write(produce(partition, 4))
            answer = (await stream.read()).topics[0].partitions[0]  # type: ignore[union-attr]
            assert (answer.error, answer.base_offset) == (ErrorCode.NONE, expected)

        proxy.cut_next_message()
        await stream.write(produce(partition, 50, size=100))  # about 6 KB, half of it sent
        await asyncio.wait_for(proxy.cut.wait(), 10)
        with pytest.raises(grpc.aio.AioRpcError) as ended:
            await stream.read()
        assert ended.value.code() == grpc.StatusCode.UNAVAILABLE

        # Nothing of the cut request; the broker serves the next producer right after.
        answer = (await stub.Produce(produce(partition, 1))).topics[0].partitions[0]
        assert (answer.error, answer.base_offset) == (ErrorCode.NONE, before + 8)
        fetch = pb.FetchRequest(record_format=pb.RECORD_FORMAT_PLAIN)
        fetch.topics.add(topic=TOPIC).partitions.add(partition=partition, fetch_offset=before)
        records = (await stub.Fetch(fetch)).topics[0].partitions[0].plain_records
        assert [r.offset for r in records] == list(range(before, before + 9))
        assert [r.value[:2] for r in records] == [b"0-", b"1-", b"2-", b"3-"] * 2 + [b"0-"]
