"""Three real ``highwater controller`` processes on loopback: kill -9 each in turn, lose nothing.

Writes go through the Controller API with :class:`ControllerClient`, which finds the
active controller and follows it through failovers: a broker registers and heartbeats,
and the client keeps creating topics and altering each new topic's config.

The story: a leader is elected; writes are pipelined to it and, while some are still in
flight, one voter is killed with SIGKILL (the leader first, then the others in turn),
writes go on against the two survivors, the voter is restarted and catches up. At the
end every voter has the same log and, replayed through the controller's own state
machine, the same metadata image; every topic whose creation and every config change
that was acknowledged is in it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from highwater.controller_api.client import ControllerClient
from highwater.metadata.snapshot import snapshot_values
from quorum_processes import (
    BROKER,
    VOTERS,
    Cluster,
    keep_broker_alive,
    read_log,
    replay_image,
)

pytestmark = pytest.mark.timeout(240)


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    cluster = Cluster(tmp_path)
    try:
        yield cluster
    finally:
        cluster.kill_all()


async def test_kill_each_voter_in_turn_while_writing(cluster: Cluster) -> None:
    for controller in cluster.controllers.values():
        controller.start()
    first_leader, response = await asyncio.to_thread(cluster.leader)
    assert {r.replica_id for r in response.current_voters} == set(VOTERS)

    killed: list[int] = []
    async with ControllerClient(cluster.addresses, timeout_s=60) as client:
        heartbeats = asyncio.create_task(keep_broker_alive(client))
        try:
            async with asyncio.timeout(30):
                while not cluster.topics:  # once the broker is unfenced, topics can be created
                    await cluster.write(client, 1)
                    await asyncio.sleep(0.1)
            assert await cluster.write(client, 20) == 20

            for round_number in range(len(VOTERS)):
                leader, _ = await asyncio.to_thread(cluster.leader)
                if round_number == 0:
                    victim = leader  # the leader first: in-flight writes, an election
                else:
                    victim = next(
                        c for n, c in sorted(cluster.controllers.items()) if n not in killed
                    )
                killed.append(victim.node_id)
                await cluster.write(client, 30, then=victim.kill)
                assert not victim.alive
                # Two of three voters keep the quorum: writes go on.
                acked = await cluster.write(client, 20)
                assert acked > 0, f"no write committed with node {victim.node_id} down"
                victim.start()
                assert await cluster.write(client, 20) > 0

            await asyncio.to_thread(cluster.wait_caught_up)
            assert await cluster.write(client, 10) == 10
            end_offset = await asyncio.to_thread(cluster.wait_caught_up)
        finally:
            heartbeats.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await heartbeats

    # Graceful stops, the leader last (a follower's stop then starts no election).
    leader, _ = await asyncio.to_thread(cluster.leader)
    for controller in sorted(cluster.controllers.values(), key=lambda c: c is leader):
        status = await asyncio.to_thread(controller.terminate)
        assert status == 0, f"node {controller.node_id} did not stop cleanly"

    logs = {n: read_log(c.data_dir) for n, c in cluster.controllers.items()}
    committed = {n: [e for e in entries if e[0] < end_offset] for n, entries in logs.items()}
    assert committed[1] == committed[2] == committed[3], "the voters' logs diverge"
    for entries in logs.values():
        # Past the committed end, at most a new leader's epoch-start marker.
        assert all(is_control for offset, _, is_control, _ in entries if offset >= end_offset)
    entries = committed[1]
    assert [offset for offset, _, _, _ in entries] == list(range(end_offset))
    epochs = [epoch for _, epoch, _, _ in entries]
    assert epochs == sorted(epochs)
    assert len(set(epochs)) >= 2  # the first leader was killed: at least one more epoch
    assert first_leader.node_id in killed

    images = {n: replay_image(c.data_dir, end_offset) for n, c in cluster.controllers.items()}
    values = {n: snapshot_values(image) for n, image in images.items()}
    assert values[1] == values[2] == values[3], "the voters' images differ"
    image = images[1]
    assert image.offset == max(offset for offset, _, control, _ in entries if not control)
    lost_topics = {
        name: topic_id
        for name, topic_id in cluster.topics.items()
        if (topic := image.topic(name)) is None or topic.topic_id != topic_id
    }
    assert not lost_topics, f"acknowledged topics lost: {lost_topics}"
    lost_configs = {
        name: value
        for name, value in cluster.configs.items()
        if image.topic_config(name).get("retention.ms") != value
    }
    assert not lost_configs, f"acknowledged config changes lost: {lost_configs}"
    assert len(cluster.topics) >= 100
    broker = image.broker(BROKER)
    assert broker is not None and not broker.fenced
