"""A ``highwater observer`` process joins a running quorum and catches up from a snapshot.

Three voters write a snapshot every 16 KiB of committed metadata; once they have, an
observer starts with an empty data directory. The leader answers its first fetch with its
latest snapshot (FetchSnapshot, in chunks), then the log after it; the leader lists the
observer in DescribeQuorum, never among the voters. Writes go on while it follows. At
the end its data directory holds the leader's snapshot and only the log after it, and
the image it replays to is the voters'.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from highwater.controller_api.client import ControllerClient
from highwater.metadata.snapshot import snapshot_values
from highwater.raft.driver import MetadataLogLayout
from highwater.raft.messages import OffsetAndEpoch
from highwater.raft.partition_raft_log import PartitionRaftLog
from highwater.raft.snapshot_files import parse_snapshot_file_name
from highwater.rpc.endpoints import free_loopback_ports
from quorum_processes import (
    VOTERS,
    Cluster,
    Controller,
    keep_broker_alive,
    replay_image,
)

pytestmark = pytest.mark.timeout(240)

OBSERVER = 100
SNAPSHOT_BYTES = 16 * 1024


def snapshots_of(data_dir: Path) -> list[OffsetAndEpoch]:
    """The snapshots a controller has finished, in order, read from the file names only.

    Not through a ``FileSnapshotStore``: opening one removes the ``.part`` files it finds
    (an interrupted write's leftovers, for the store's owner), and on a live controller's
    directory that is the snapshot it is writing. Its rename then failed, and the
    controller stopped on the storage error: this test's own probe stopped a voter."""
    directory = MetadataLogLayout(data_dir).snapshot_dir
    found = (parse_snapshot_file_name(path.name) for path in directory.iterdir())
    return sorted(snapshot_id for snapshot_id in found if snapshot_id is not None)


def log_start_offset(data_dir: Path) -> int:
    layout = MetadataLogLayout(data_dir)
    raft_log = PartitionRaftLog.open(layout.log_dir, snapshots=snapshots_of(data_dir))
    try:
        return raft_log.start_offset
    finally:
        raft_log.close()


def observer_end_offset(cluster: Cluster) -> int:
    """The observer's log end offset as the leader last saw it (-1: not listed)."""
    _, response = cluster.leader()
    assert OBSERVER not in {r.replica_id for r in response.current_voters}
    ends = {r.replica_id: r.log_end_offset for r in response.observers}
    return ends.get(OBSERVER, -1)


async def wait_observer_reaches(cluster: Cluster, offset: int, timeout_s: float = 60) -> None:
    async with asyncio.timeout(timeout_s):
        while await asyncio.to_thread(observer_end_offset, cluster) < offset:
            await asyncio.sleep(0.1)


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    cluster = Cluster(
        tmp_path, "--metadata-log-max-record-bytes-between-snapshots", str(SNAPSHOT_BYTES)
    )
    try:
        yield cluster
    finally:
        cluster.kill_all()


async def test_an_observer_catches_up_from_the_leaders_snapshot(
    cluster: Cluster, tmp_path: Path
) -> None:
    for controller in cluster.controllers.values():
        controller.start()
    await asyncio.to_thread(cluster.leader)
    (port,) = free_loopback_ports(1)
    observer = Controller(
        OBSERVER,
        port,
        cluster.voters,
        tmp_path / "observer",
        tmp_path / "observer.log",
        role="observer",
    )
    try:
        async with ControllerClient(cluster.addresses, timeout_s=60) as client:
            heartbeats = asyncio.create_task(keep_broker_alive(client))
            try:
                async with asyncio.timeout(60):
                    while not all(snapshots_of(c.data_dir) for c in cluster.controllers.values()):
                        await cluster.write(client, 20)
                assert await cluster.write(client, 10) == 10  # log past the snapshot too
                end_offset = await asyncio.to_thread(cluster.wait_caught_up)

                observer.start()
                await wait_observer_reaches(cluster, end_offset)
                # It keeps following while the voters go on writing.
                assert await cluster.write(client, 20) == 20
                end_offset = await asyncio.to_thread(cluster.wait_caught_up)
                await wait_observer_reaches(cluster, end_offset)
            finally:
                heartbeats.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await heartbeats

        assert await asyncio.to_thread(observer.terminate) == 0
        leader, _ = await asyncio.to_thread(cluster.leader)
        for controller in sorted(cluster.controllers.values(), key=lambda c: c is leader):
            assert await asyncio.to_thread(controller.terminate) == 0
    finally:
        observer.reap()

    # The observer's history starts at a snapshot it was sent, not at offset 0.
    received = snapshots_of(observer.data_dir)
    assert received, "the observer holds no snapshot"
    first = received[0]
    assert first.offset > 0
    assert any(first in snapshots_of(c.data_dir) for c in cluster.controllers.values())
    assert log_start_offset(observer.data_dir) >= first.offset
    # And it replays to the very image the voters hold.
    observed = snapshot_values(replay_image(observer.data_dir, end_offset))
    for voter in VOTERS:
        voter_image = replay_image(cluster.controllers[voter].data_dir, end_offset)
        assert snapshot_values(voter_image) == observed
    assert len(cluster.topics) >= 30
