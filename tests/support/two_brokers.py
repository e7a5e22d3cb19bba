"""Two brokers in the test's own process: an embedded server (controller, broker 1 and the
group coordinator) and a standalone broker 2 following its quorum.

For what a broker does on a client's behalf with partitions another broker leads (records
placed by key, consumer sessions): topics created here spread their partitions over both.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc.aio
from broker_roles import leads
from embedded_servers import free_port
from highwater.broker.standalone import StandaloneBroker
from highwater.controller_api import messages as m
from highwater.controller_api.client import ControllerClient
from highwater.embedded import EmbeddedServer
from highwater.v1 import broker_pb2 as pb
from highwater.v1 import broker_pb2_grpc
from highwater.v1.common_pb2 import ErrorCode


@dataclass
class TwoBrokers:
    embedded: EmbeddedServer
    standalone: StandaloneBroker

    @property
    def address(self) -> str:
        """Broker 1's (also the controller's and the coordinator's)."""
        return self.embedded.listen

    async def create_topic(self, name: str, partitions: int) -> dict[int, int]:
        """Create ``name`` with one replica per partition; its leader per partition, once
        every partition has one and both brokers know it."""
        async with ControllerClient([self.address]) as admin:
            reply = await admin.create_topics(
                m.CreateTopicsRequest((m.CreatableTopic(name, partitions, 1),))
            )
        assert all(t.error == ErrorCode.NONE for t in reply.topics), reply
        deadline = time.monotonic() + 30
        async with grpc.aio.insecure_channel(self.address) as channel:
            stub = broker_pb2_grpc.BrokerStub(channel)
            while time.monotonic() < deadline:
                answer = await stub.Metadata(pb.MetadataRequest(topics=[name]))
                found = answer.topics[0].partitions
                leaders = {p.partition: p.leader_id for p in found if p.leader_id >= 0}
                if len(leaders) == partitions and self._all_lead(name, leaders):
                    return leaders
                await asyncio.sleep(0.05)
        raise AssertionError(f"{name} got no leaders in time")

    def _all_lead(self, topic: str, leaders: dict[int, int]) -> bool:
        brokers = {1: self.embedded.broker, 2: self.standalone.broker}
        for partition, leader in leaders.items():
            broker = brokers.get(leader)
            if broker is None or not leads(broker, topic, partition):
                return False
        return True


@asynccontextmanager
async def two_brokers(data_dir: Path) -> AsyncIterator[TwoBrokers]:
    address = f"127.0.0.1:{free_port()}"
    embedded = EmbeddedServer(listen=address, data_dir=data_dir / "embedded")
    await embedded.start()
    standalone = StandaloneBroker(
        node_id=2,
        listen=f"127.0.0.1:{free_port()}",
        controllers=[address],
        data_dir=data_dir / "broker-2",
    )
    try:
        await embedded.broker.wait_unfenced()
        await standalone.start()
        assert standalone.broker is not None
        await standalone.broker.wait_unfenced()
        yield TwoBrokers(embedded, standalone)
    finally:
        await standalone.stop()
        await embedded.stop()
