"""The etcd-mode controller's failed pushes are seen, over a real etcd and a real gRPC node.

A controller whose image has one broker with a listener: an in-process gRPC server with
the ``BrokerMetadata`` servicer over an image that refuses pushes while told to (a broker
that cannot apply them). Every round pushes it again; the failure streak is logged once at
WARNING naming the node, its address and the error, each failed push is counted in
``highwater.controller.push_failures`` and the node in ``push_failing_nodes``; once a push
is taken, that ends the streak, and a later refusal starts (and logs) a new one. The active
candidate also exports the controller gauges a KRaft voter does (active, brokers, partitions).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Iterable, Iterator
from typing import Any

import grpc
import pytest
from etcd_processes import EtcdServer, etcd_member, wait_for
from highwater.controller import metrics as controller_metrics
from highwater.controller.config import ControllerConfig
from highwater.controller.etcd_controller import EtcdController, EtcdControllerSettings
from highwater.controller_api import codec
from highwater.controller_api.messages import CreatableTopic, CreateTopicsRequest
from highwater.etcd_metadata.connection import EtcdConnection, Put
from highwater.etcd_metadata.endpoints import parse_metadata_store
from highwater.etcd_metadata.keys import KeySpace, image_keys, partition_state_value
from highwater.etcd_metadata.pushed import PushedMetadata, add_pushed_metadata_servicer
from highwater.etcd_metadata.session import EtcdSession
from highwater.metadata import MetadataImage, replay
from highwater.metadata.records import BrokerEndpoint, RegisterBrokerRecord, UnfenceBrokerRecord
from highwater.v1.common_pb2 import ErrorCode
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

pytestmark = pytest.mark.timeout(120)

REFUSAL = "no room left to apply the image"


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    with etcd_member(tmp_path_factory.mktemp("etcd")) as server:
        yield server


class RefusingImage(PushedMetadata):
    """A node's pushed image that refuses every push while ``refusing``."""

    def __init__(self) -> None:
        super().__init__()
        self.refusing = True
        self.refused = 0

    def accept(self, **push: Any) -> tuple[int, str]:
        if self.refusing:
            self.refused += 1
            return ErrorCode.INVALID_REQUEST, REFUSAL
        return super().accept(**push)

    def accept_delta(self, **push: Any) -> tuple[int, str, bool]:
        if self.refusing:
            self.refused += 1
            return ErrorCode.INVALID_REQUEST, REFUSAL, False
        return super().accept_delta(**push)


@contextlib.asynccontextmanager
async def pushed_node(image: RefusingImage) -> AsyncIterator[int]:
    """A gRPC server on loopback serving ``BrokerMetadata`` over ``image``; its port."""
    server = grpc.aio.server()
    add_pushed_metadata_servicer(server, image)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield port
    finally:
        await server.stop(0)


def one_broker_at(port: int) -> MetadataImage:
    endpoint = BrokerEndpoint("PLAINTEXT", "127.0.0.1", port)
    records = [RegisterBrokerRecord(1, "inc-1", 1, (endpoint,)), UnfenceBrokerRecord(1, 1)]
    return replay(records, len(records) - 1, 1)


def points(reader: InMemoryMetricReader, name: str) -> list[tuple[int | float, dict[str, Any]]]:
    data = reader.get_metrics_data()
    if data is None:
        return []
    return [
        (point.value, dict(point.attributes or {}))
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
        if metric.name == name
        for point in metric.data.data_points
    ]


def warnings_naming(records: Iterable[logging.LogRecord], address: str) -> list[str]:
    return [
        r.getMessage()
        for r in records
        if r.levelno == logging.WARNING and address in r.getMessage()
    ]


async def test_a_node_that_keeps_refusing_pushes_is_logged_once_per_streak_and_counted(
    etcd: EtcdServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    monkeypatch.setattr(controller_metrics, "meter", lambda name: provider.get_meter(name))
    caplog.set_level(logging.INFO, logger="highwater.controller.etcd_controller")
    node = RefusingImage()
    address = parse_metadata_store(f"etcd://{etcd.endpoint}/refused")
    space = KeySpace(address.prefix)
    connection = EtcdConnection(address)
    session = EtcdSession(EtcdConnection(address), ttl_s=30)
    async with pushed_node(node) as port:
        image = one_broker_at(port)
        keys = {
            k: partition_state_value(v, 0) if "/partitions/" in k else v
            for k, v in image_keys(image, space).items()
        }
        await connection.txn((), [Put(k, v) for k, v in keys.items()])
        await connection.txn((), [Put(space.metadata_offset, str(image.offset).encode())])
        await session.start()
        await connection.txn((), [Put(space.broker_id(1), b'{"listeners": []}', session.lease_id)])
        controller = EtcdController(
            node_id=9,
            address="127.0.0.1:1",
            connection=connection,
            space=space,
            session=session,
            cluster_id="refused",
            settings=EtcdControllerSettings(
                controller=ControllerConfig(
                    broker_session_timeout_ms=3_600_000, offsets_topic_replication_factor=1
                ),
                seed=1,
            ),
        )
        pushed_to = f"127.0.0.1:{port}"
        try:
            await controller.start()
            await controller.wait_active(30)
            # The controller gauges a KRaft voter exports, from the etcd-mode candidate.
            assert points(reader, "highwater.controller.active") == [(1, {})]
            assert points(reader, "highwater.controller.registered_brokers") == [(1, {})]
            assert points(reader, "highwater.controller.partitions") == [(0, {})]

            async def refused_several() -> bool:
                return node.refused >= 4

            await wait_for(refused_several, timeout_s=30)
            (warning,) = warnings_naming(caplog.records, pushed_to)
            assert "node 1" in warning and REFUSAL in warning and "INVALID_REQUEST" in warning
            failures = points(reader, "highwater.controller.push_failures")
            assert [attributes for _, attributes in failures] == [
                {"server.address": pushed_to, "highwater.node.id": 1}
            ]
            assert failures[0][0] >= 3  # the last refusal's answer may be on its way
            assert points(reader, "highwater.controller.push_failing_nodes") == [(1, {})]

            node.refusing = False

            async def taken() -> bool:
                return node.image.offset == controller.image.offset

            await wait_for(taken, timeout_s=30)
            assert points(reader, "highwater.controller.push_failing_nodes") == [(0, {})]
            assert len(warnings_naming(caplog.records, pushed_to)) == 1

            node.refusing = True
            request = CreateTopicsRequest((CreatableTopic("later", 1, 1),))
            reply = await controller.call(codec.CREATE_TOPICS, request)
            assert reply.topics[0].error == ErrorCode.NONE
            assert points(reader, "highwater.controller.partitions") == [(1, {})]
            assert points(reader, "highwater.controller.offline_partitions") == [(0, {})]
            refused_before = node.refused

            async def refused_again() -> bool:
                return node.refused > refused_before + 2

            await wait_for(refused_again, timeout_s=30)
            assert len(warnings_naming(caplog.records, pushed_to)) == 2
        finally:
            await controller.stop()
            await session.stop()
            await connection.close()
            provider.shutdown()
