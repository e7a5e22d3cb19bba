"""A controller cut off from etcd but not from the brokers, over a real etcd (the failover
article's story): its session expires on its own side and it steps down before etcd lets
another candidate claim the controller key; the new controller's epoch is higher, its push
replaces the image the broker holds, and the deposed controller's push is refused."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator

import grpc.aio
import pytest
from etcd_processes import EtcdServer, etcd_member
from highwater.controller.config import ControllerConfig
from highwater.controller.etcd_controller import EtcdController, EtcdControllerSettings
from highwater.etcd_metadata.connection import EtcdConnection, Put
from highwater.etcd_metadata.endpoints import parse_metadata_store
from highwater.etcd_metadata.keys import KeySpace, image_keys, partition_state_value
from highwater.etcd_metadata.pushed import PushedMetadata, add_pushed_metadata_servicer
from highwater.etcd_metadata.session import EtcdSession
from highwater.internal.v1 import broker_metadata_pb2
from highwater.metadata import replay
from highwater.metadata.records import (
    BrokerEndpoint,
    MetadataRecord,
    PartitionRecord,
    RegisterBrokerRecord,
    TopicRecord,
    UnfenceBrokerRecord,
)
from highwater.v1.common_pb2 import ErrorCode

pytestmark = pytest.mark.timeout(60)

TTL_S = 2


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    with etcd_member(tmp_path_factory.mktemp("etcd")) as server:
        yield server


class Link:
    """A TCP path from a client to etcd that can be cut: once cut, connections are reset
    and new ones refused, as a partition between one host and the store."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.address = ""
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.address = f"127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        host, _, port = self.upstream.rpartition(":")
        up_reader, up_writer = await asyncio.open_connection(host, int(port))
        self._writers |= {writer, up_writer}
        for source, sink in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.create_task(self._copy(source, sink))
            self._tasks.add(task)

    @staticmethod
    async def _copy(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await source.read(65536):
                sink.write(data)
                await sink.drain()
        sink.close()

    async def cut(self) -> None:
        assert self._server is not None
        self._server.close()
        for task in self._tasks:
            task.cancel()
        for writer in self._writers:
            writer.transport.abort()


async def test_a_controller_cut_off_from_etcd_steps_down_before_another_is_elected(
    etcd: EtcdServer,
) -> None:
    # The broker the controllers push to: its pushed image, on a gRPC server of its own.
    pushed = PushedMetadata()
    server = grpc.aio.server()
    add_pushed_metadata_servicer(server, pushed)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    records: list[MetadataRecord] = []
    for broker_id in range(3):
        listeners = (BrokerEndpoint("PLAINTEXT", "127.0.0.1", port),) if broker_id == 0 else ()
        records.append(RegisterBrokerRecord(broker_id, f"inc-{broker_id}", broker_id, listeners))
        records.append(UnfenceBrokerRecord(broker_id, broker_id))
    records.append(TopicRecord("t", "topic-id-t"))
    records.append(PartitionRecord("topic-id-t", 0, (0, 1, 2), (0, 1, 2), 0))
    image = replay(records, len(records) - 1, 1)

    direct = parse_metadata_store(f"etcd://{etcd.endpoint}/cut-off")
    space = KeySpace(direct.prefix)
    link = Link(etcd.endpoint)
    await link.start()
    through_link = parse_metadata_store(f"etcd://{link.address}/cut-off")
    writer = EtcdConnection(direct)
    brokers_session = EtcdSession(EtcdConnection(direct), ttl_s=30)
    sessions = {
        1: EtcdSession(EtcdConnection(through_link, timeout_s=0.5), ttl_s=TTL_S),
        2: EtcdSession(EtcdConnection(direct), ttl_s=TTL_S),
    }
    settings = EtcdControllerSettings(
        controller=ControllerConfig(broker_session_timeout_ms=3_600_000), seed=1
    )
    candidates = {
        n: EtcdController(
            node_id=n,
            address=f"127.0.0.1:{9100 + n}",
            connection=EtcdConnection(
                through_link if n == 1 else direct, timeout_s=0.5 if n == 1 else 2.0
            ),
            space=space,
            session=sessions[n],
            cluster_id="cut-off",
            settings=settings,
        )
        for n in (1, 2)
    }
    try:
        keys = image_keys(image, space)
        await writer.txn(
            (),
            [
                Put(k, partition_state_value(v, 0) if "/partitions/" in k else v)
                for k, v in keys.items()
            ]
            + [Put(space.metadata_offset, str(image.offset).encode())],
        )
        await brokers_session.start()
        assert brokers_session.lease_id is not None
        await writer.txn(
            (),
            [
                Put(space.broker_id(b), b'{"listeners": []}', brokers_session.lease_id)
                for b in range(3)
            ],
        )
        for session in sessions.values():
            await session.start()
        first, second = candidates[1], candidates[2]
        await first.start()
        await first.wait_active(30)
        await second.start()
        epoch = first.epoch
        assert epoch is not None
        async with asyncio.timeout(30):
            while pushed.controller_epoch != epoch:
                await asyncio.sleep(0.02)
        assert pushed.controller_id == 1 and pushed.image.partition_count == 1

        await link.cut()
        cut_at = time.monotonic()
        stepped_down_at = elected_at = 0.0
        async with asyncio.timeout(30):
            while not (stepped_down_at and elected_at):
                now = time.monotonic()
                if not stepped_down_at and not first.is_active:
                    stepped_down_at = now
                if not elected_at and second.is_active:
                    elected_at = now
                await asyncio.sleep(0.01)
        # The cut-off controller resigned on its own, before etcd could let another claim.
        assert stepped_down_at < elected_at
        assert stepped_down_at - cut_at <= TTL_S + 1
        assert second.epoch == epoch + 1
        async with asyncio.timeout(30):
            while pushed.controller_epoch != epoch + 1:
                await asyncio.sleep(0.02)
        assert pushed.controller_id == 2 and pushed.image.partition_count == 1

        # A push of the deposed epoch (as the cut-off controller would send it, had it not
        # noticed yet) is refused by the broker, which keeps the new controller's image.
        stale = broker_metadata_pb2.UpdateMetadataRequest(
            controller_id=1,
            controller_epoch=epoch,
            offset=image.offset + 10,
            controller_address=first.address,
        )
        reply = await first._push_channels.update_metadata(f"127.0.0.1:{port}", stale, 5.0)
        assert reply is not None and reply.error == ErrorCode.STALE_CONTROLLER_EPOCH
        assert pushed.controller_epoch == epoch + 1 and pushed.image.partition_count == 1
    finally:
        for candidate in candidates.values():
            await candidate.stop()
        for session in (*sessions.values(), brokers_session):
            await session.stop()
        await writer.close()
        await server.stop(None)
