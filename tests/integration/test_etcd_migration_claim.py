"""The migrating KRaft controller's claim of etcd's ``controller`` key, over a real etcd.

Its lease gone (etcd away past the TTL, the process paused) takes the key with it while
``controller_epoch`` stays: the controller claims again as soon as it reads etcd, above
that epoch, instead of leaving the key free for an etcd-mode candidate to campaign for.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import pytest
from etcd_processes import EtcdServer, etcd_member, wait_for
from highwater.controller.etcd_migration import EtcdMigration
from highwater.etcd_metadata.connection import EtcdConnection, Put
from highwater.etcd_metadata.endpoints import parse_metadata_store
from highwater.etcd_metadata.keys import KeySpace, image_keys
from highwater.metadata import MetadataImage, replay
from highwater.metadata.records import (
    MigrationStateRecord,
    RegisterBrokerRecord,
    UnfenceBrokerRecord,
)

pytestmark = pytest.mark.timeout(60)

NODE_ID = 3000


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    with etcd_member(tmp_path_factory.mktemp("etcd")) as server:
        yield server


async def test_a_claim_whose_lease_is_gone_is_made_again_at_once(etcd: EtcdServer) -> None:
    address = parse_metadata_store(f"etcd://{etcd.endpoint}/reclaimed")
    space = KeySpace(address.prefix)
    registered = [RegisterBrokerRecord(1, "inc-1", 1), UnfenceBrokerRecord(1, 1)]
    etcd_image = replay(registered, 1, 0)
    # The log already holds the copy: the controller claims and dual writes.
    image: MetadataImage = replay(
        [*registered, MigrationStateRecord(MigrationStateRecord.MIGRATING, 41)], 2
    )
    connection = EtcdConnection(address)
    broker_lease = await connection.grant_lease(30)
    await connection.txn(
        (),
        [
            *(Put(k, v) for k, v in image_keys(etcd_image, space).items()),
            Put(space.cluster_id, b"c-1"),
            Put(space.controller_epoch, b"3"),
            Put(space.metadata_offset, b"41"),
            Put(space.broker_id(1), b'{"listeners": []}', broker_lease),
        ],
    )
    migration = EtcdMigration(
        store=address,
        node_id=NODE_ID,
        address="127.0.0.1:1",
        committed_image=lambda: image,
        is_active=lambda: True,
        propose=lambda records: asyncio.sleep(0, True),
        poll_interval_s=0.05,
        session_ttl_s=30,
    )

    async def claim() -> dict[str, int] | None:
        _, held = await connection.get(space.controller)
        return json.loads(held.value) if held is not None else None

    async def claimed(epoch: int) -> dict[str, int] | None:
        value = await claim()
        return value if value is not None and value["epoch"] == epoch else None

    try:
        await migration.start()
        first = await wait_for(lambda: claimed(4), timeout_s=20)
        assert first["broker_id"] == NODE_ID
        session = migration._session
        assert session is not None and session.lease_id is not None
        # The lease is gone (as past its TTL): the key with it, the epoch unchanged.
        await connection.revoke_lease(session.lease_id)
        again = await wait_for(lambda: claimed(5), timeout_s=10)
        assert again["broker_id"] == NODE_ID
        _, epoch = await connection.get(space.controller_epoch)
        assert epoch is not None and epoch.value == b"5"
    finally:
        await migration.stop()
        await connection.revoke_lease(broker_lease)
        await connection.close()
