"""The migrating KRaft controller's pushes to the brokers still in etcd mode, over gRPC: a
claim of a newer controller epoch (after an etcd-mode candidate claimed in a gap of the
KRaft controller's lease, and pushed its own image) pushes the log's image again with it,
even when the log did not move."""

from __future__ import annotations

import asyncio

import grpc.aio
import pytest
from highwater.controller.etcd_migration import EtcdMigration
from highwater.etcd_metadata.endpoints import parse_metadata_store
from highwater.etcd_metadata.pushed import PushedMetadata, add_pushed_metadata_servicer
from highwater.metadata import MetadataImage, replay
from highwater.metadata.records import (
    BrokerEndpoint,
    MigrationStateRecord,
    RegisterBrokerRecord,
    TopicRecord,
)
from highwater.metadata.snapshot import load_snapshot, snapshot_values

pytestmark = pytest.mark.timeout(60)


async def test_a_new_claims_epoch_is_pushed_again_though_the_log_did_not_move() -> None:
    pushed = PushedMetadata()
    server = grpc.aio.server()
    add_pushed_metadata_servicer(server, pushed)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    broker = RegisterBrokerRecord(1, "inc-1", 1, (BrokerEndpoint("PLAINTEXT", "127.0.0.1", port),))
    image: MetadataImage = replay(
        [
            broker,
            TopicRecord("t", "T" * 22),
            MigrationStateRecord(MigrationStateRecord.MIGRATING, 40),
        ],
        2,
    )
    migration = EtcdMigration(
        store=parse_metadata_store("etcd://127.0.0.1:1/unused"),
        node_id=3000,
        address="127.0.0.1:3000",
        committed_image=lambda: image,
        is_active=lambda: True,
        propose=lambda records: asyncio.sleep(0, True),
    )

    async def push(epoch: int) -> None:
        migration.driver.controller_epoch = epoch
        migration._push_to = frozenset({1})
        migration._push_all()
        await asyncio.gather(*migration._push_tasks.values())

    try:
        await push(5)
        assert (pushed.controller_epoch, pushed.image.offset) == (5, 40 + 1 + 2)
        # An etcd-mode candidate claimed epoch 6 in a gap of the KRaft controller's lease
        # and pushed the image it read from etcd.
        etcd_image = load_snapshot([broker], 43, 6)
        pushed.accept(
            controller_id=1, controller_epoch=6, offset=43, values=snapshot_values(etcd_image)
        )
        assert pushed.image == etcd_image
        # The KRaft controller claims again, above it: the log's image goes out with it.
        await push(7)
        assert pushed.controller_epoch == 7
        assert pushed.image.epoch == 7
        assert "t" in pushed.image.topics.by_name
    finally:
        await migration.stop()
        await server.stop(0)
