"""The migration's etcd transactions on a real etcd: the KRaft controller takes the controller
key over from an active etcd-mode controller, and its dual writes are fenced by its epoch."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator

import pytest
from etcd_processes import EtcdServer, etcd_member
from highwater.etcd_metadata.connection import EtcdConnection, Put
from highwater.etcd_metadata.endpoints import parse_metadata_store
from highwater.etcd_metadata.keys import KeySpace
from highwater.etcd_metadata.migration import ClaimEtcdController, WriteEtcdState
from highwater.etcd_metadata.migration_store import MigrationStore

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    with etcd_member(tmp_path_factory.mktemp("etcd")) as server:
        yield server


@pytest.fixture
async def connection(etcd: EtcdServer) -> AsyncIterator[EtcdConnection]:
    connection = EtcdConnection(parse_metadata_store(f"etcd://{etcd.endpoint}/migrating"))
    yield connection
    await connection.close()


async def test_the_claim_takes_over_from_an_etcd_controller_and_fences_writes(
    connection: EtcdConnection,
) -> None:
    space = KeySpace(connection.address.prefix)
    etcd_lease = await connection.grant_lease(10)
    etcd_claim = json.dumps({"broker_id": 1, "address": "h:1", "epoch": 3}).encode()
    await connection.txn(
        [],
        [
            Put(space.cluster_id, b"c-1"),
            Put(space.controller, etcd_claim, etcd_lease),
            Put(space.controller_epoch, b"3"),
        ],
    )
    store = MigrationStore(connection, space, node_id=3000, address="h:3000")
    before = await store.read()
    assert before.controller_epoch(space) == 3 and before.cluster_id(space) == "c-1"

    lease = await connection.grant_lease(10)
    # A claim over an epoch that moved on fails and changes nothing.
    assert not await store.claim(ClaimEtcdController(expected=2, epoch=3), lease)
    assert await store.claim(ClaimEtcdController(expected=3, epoch=4), lease)
    after = await store.read()
    assert after.controller_epoch(space) == 4
    assert json.loads(after.keys[space.controller])["broker_id"] == 3000

    state_key = space.partition_state("orders", 0)
    state = b'{"isr":[1,2],"leader":1,"leader_epoch":5,"partition_epoch":6}'
    assert await store.write_state(WriteEtcdState(4, {state_key: state}, frozenset()))
    written = json.loads((await store.read()).keys[state_key])
    assert (written["leader_epoch"], written["controller_epoch"]) == (5, 4)
    # The deposed etcd controller's epoch is fenced.
    assert not await store.write_state(
        WriteEtcdState(3, {state_key: state.replace(b'"leader":1', b'"leader":2')}, frozenset())
    )
    assert json.loads((await store.read()).keys[state_key])["leader"] == 1
    assert await store.write_state(
        WriteEtcdState(4, {}, frozenset({state_key})), metadata_offset=99
    )
    final = await store.read()
    assert state_key not in final.keys and final.metadata_offset(space) == 99
