"""The etcd-mode controller candidates in one process over a real etcd: a woken round reads
only what changed (the watch's events applied to the candidate's view), not the prefix."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from etcd_processes import EtcdServer, etcd_member, wait_for
from highwater.controller.etcd_controller import EtcdController, EtcdControllerSettings
from highwater.etcd_metadata.connection import Delete, EtcdConnection, Put
from highwater.etcd_metadata.endpoints import parse_metadata_store
from highwater.etcd_metadata.keys import KeySpace
from highwater.etcd_metadata.session import EtcdSession

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    with etcd_member(tmp_path_factory.mktemp("etcd")) as server:
        yield server


async def test_woken_rounds_apply_the_watched_changes_without_reading_the_prefix(
    etcd: EtcdServer, tmp_path: Path
) -> None:
    address = parse_metadata_store(f"etcd://{etcd.endpoint}/viewing")
    space = KeySpace(address.prefix)
    settings = EtcdControllerSettings(safety_read_interval_ms=600_000, seed=1)
    sessions = [EtcdSession(EtcdConnection(address), ttl_s=5) for _ in range(2)]
    candidates = [
        EtcdController(
            node_id=n,
            address=f"127.0.0.1:{9000 + n}",
            connection=EtcdConnection(address),
            space=space,
            session=session,
            cluster_id="viewing-cluster",
            settings=settings,
        )
        for n, session in zip((1, 2), sessions, strict=True)
    ]
    writer = EtcdConnection(address)
    try:
        for session in sessions:
            await session.start()
        await candidates[0].start()
        await candidates[0].wait_active(30)
        await candidates[1].start()
        active, standby = candidates
        await wait_for(lambda: asyncio.sleep(0, standby.view.current and standby.watching), 30)
        reads = [c.prefix_reads for c in candidates]

        # A broker's leased key comes and goes: both candidates see it, neither reads etcd.
        broker_key = json.dumps({"listeners": []}).encode()
        await writer.txn([], [Put(space.broker_id(7), broker_key)])
        for candidate in candidates:
            await wait_for(lambda c=candidate: asyncio.sleep(0, 7 in c._live_brokers), 30)
        await writer.txn([], [Delete(space.broker_id(7))])
        for candidate in candidates:
            await wait_for(lambda c=candidate: asyncio.sleep(0, 7 not in c._live_brokers), 30)
        assert [c.prefix_reads for c in candidates] == reads

        # The controller steps down (its key deleted): the standby sees it in its view and
        # claims the next epoch; only the election reads the whole prefix.
        epoch = active.epoch
        assert epoch is not None
        await active.stop()
        await standby.wait_active(30)
        assert standby.epoch == epoch + 1
        assert standby.prefix_reads == reads[1] + 1
        # A view is what a whole read gives.
        _, keys = await writer.get_prefix(space.prefix)
        await wait_for(lambda: asyncio.sleep(0, standby.view.keys == keys), 30)
    finally:
        for candidate in candidates:
            await candidate.stop()
        for session in sessions:
            await session.stop()
        await writer.close()


async def test_a_claim_etcd_applied_under_our_own_lease_is_taken_up(
    etcd: EtcdServer, tmp_path: Path
) -> None:
    """The claim's answer was lost (the call timed out after etcd applied it): the key names
    this candidate under its own lease, so it becomes controller of that epoch instead of
    waiting behind itself until its lease expires."""
    address = parse_metadata_store(f"etcd://{etcd.endpoint}/lost-answer")
    space = KeySpace(address.prefix)
    session = EtcdSession(EtcdConnection(address), ttl_s=5)
    candidate = EtcdController(
        node_id=3,
        address="127.0.0.1:9003",
        connection=EtcdConnection(address),
        space=space,
        session=session,
        cluster_id="lost-answer-cluster",
        settings=EtcdControllerSettings(seed=1),
    )
    writer = EtcdConnection(address)
    try:
        await session.start()
        lease = session.lease_id
        assert lease is not None
        claim = json.dumps({"address": "127.0.0.1:9003", "broker_id": 3, "epoch": 4}).encode()
        await writer.txn(
            [], [Put(space.controller, claim, lease), Put(space.controller_epoch, b"4")]
        )
        await candidate.start()
        await candidate.wait_active(30)
        assert candidate.epoch == 4
    finally:
        await candidate.stop()
        await session.stop()
        await writer.close()
