"""A dynamic quorum's controllers (KIP-853) and the metadata observers that follow them, in
one event loop over loopback gRPC.

A broker's (or coordinator's, or ``highwater observer``'s) metadata replica is a
``MetadataObserver`` started with what DescribeQuorum named: for a dynamic quorum that is
only where it starts, it follows the ``voters`` records it replicates. Here the only
controller is replaced by one on another address and then stopped: the observer finds
the new one through the voter set in its log, and keeps applying what it commits. An
observer that was down through such a replacement takes the set its next DescribeQuorum
names, which is newer than the one it kept.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner
from embedded_servers import free_port
from highwater.cli.main import main
from highwater.controller.service import ControllerServer, ControllerSettings
from highwater.controller_api import messages as m
from highwater.controller_api.client import ControllerClient
from highwater.internal.v1 import raft_pb2, raft_pb2_grpc
from highwater.metadata.observer import DescribedQuorum, MetadataObserver, discover_quorum
from highwater.raft.driver import RaftServerSettings
from highwater.raft.voter_files import CommittedVotersFile
from highwater.raft.voter_set import NotCaughtUpError, Voter, VoterSet
from highwater.rpc.channels import open_channel
from highwater.v1.common_pb2 import ErrorCode
from raft_timing import FAST

pytestmark = pytest.mark.timeout(60)

RAFT = RaftServerSettings(raft=FAST, discovery_timeout_ms=10_000)


async def until(condition: Callable[[], object], timeout_s: float = 20) -> None:
    async with asyncio.timeout(timeout_s):
        while not condition():
            await asyncio.sleep(0.02)


async def register(address: str, broker_id: int) -> None:
    async with ControllerClient([address], timeout_s=15) as client:
        answer = await client.register_broker(
            m.RegisterBrokerRequest(broker_id, f"incarnation-{broker_id}")
        )
    assert answer.error == ErrorCode.NONE, answer


async def test_an_observer_follows_the_voters_to_a_controller_on_a_new_address(
    tmp_path: Path,
) -> None:
    settings = ControllerSettings(raft=RAFT)
    first_voter = Voter(1, uuid.uuid4(), f"127.0.0.1:{free_port()}")
    first = ControllerServer(
        node_id=1,
        listen=first_voter.endpoint,
        initial_voters=VoterSet.of([first_voter]),
        data_dir=tmp_path / "c1",
        settings=settings,
    )
    second: ControllerServer | None = None
    observer: MetadataObserver | None = None
    await first.start()
    try:
        await until(lambda: first.raft.is_leader)
        quorum = await discover_quorum([first_voter.endpoint])
        assert quorum.voters == VoterSet.of([first_voter]), "a dynamic quorum: the voter set"
        observer = MetadataObserver(
            node_id=100, voters=quorum.voters, data_dir=tmp_path / "observer", settings=RAFT
        )
        await observer.start()
        assert observer.raft.cluster_id == quorum.cluster_id
        await register(first_voter.endpoint, 10)
        await until(lambda: observer.image.broker(10) is not None)  # type: ignore[union-attr]

        # Controller 2 joins on another address and replaces controller 1.
        second = joining_controller(first_voter, tmp_path)
        await replace(first, first_voter, second)

        # Nothing is left at the address the observer started with: it asks the voter
        # its log names and applies what controller 2 commits.
        await register(second.raft.endpoint, 11)
        await until(lambda: observer.image.broker(11) is not None)  # type: ignore[union-attr]
        assert observer.raft.voters == {2: second.raft.endpoint}
        assert observer.raft.voter_set().ids == {2}
    finally:
        for server in (observer, second, first):
            if server is not None:
                await server.stop()


def joining_controller(first_voter: Voter, tmp_path: Path) -> ControllerServer:
    """Controller 2, to join the quorum through ``first_voter`` on an address of its own."""
    return ControllerServer(
        node_id=2,
        listen=f"127.0.0.1:{free_port()}",
        bootstrap_controllers=[first_voter.endpoint],
        data_dir=tmp_path / "c2",
        settings=ControllerSettings(raft=RAFT),
    )


async def replace(first: ControllerServer, first_voter: Voter, second: ControllerServer) -> None:
    """``second`` starts, catches up and is added; controller 1 is removed and stopped:
    nothing is left at ``first_voter``'s address."""
    await second.start()
    joined = Voter(2, second.raft.directory_id, second.raft.endpoint)  # type: ignore[arg-type]
    async with asyncio.timeout(20):
        while True:
            try:
                await first.raft.add_voter(joined)
                break
            except NotCaughtUpError:
                await asyncio.sleep(0.05)
    await first.raft.remove_voter(1, first_voter.directory_id)
    await until(lambda: second.raft.is_leader)
    await first.stop()


async def test_an_observer_down_while_every_voter_was_replaced_takes_the_described_set(
    tmp_path: Path,
) -> None:
    first_voter = Voter(1, uuid.uuid4(), f"127.0.0.1:{free_port()}")
    first = ControllerServer(
        node_id=1,
        listen=first_voter.endpoint,
        initial_voters=VoterSet.of([first_voter]),
        data_dir=tmp_path / "c1",
        settings=ControllerSettings(raft=RAFT),
    )
    second: ControllerServer | None = None
    observer: MetadataObserver | None = None
    await first.start()
    try:
        await until(lambda: first.raft.is_leader)
        await register(first_voter.endpoint, 10)
        await until(lambda: first.raft.voter_set().ids == {1})

        def observe(quorum: DescribedQuorum) -> MetadataObserver:
            return MetadataObserver(
                node_id=100,
                voters=quorum.voters,
                voters_offset=quorum.voters_offset,
                data_dir=tmp_path / "observer",
                settings=RAFT,
            )

        described = await discover_quorum([first_voter.endpoint])
        assert described.voters_offset >= 0, "the bootstrap record is committed"
        observer = observe(described)
        await observer.start()
        await until(lambda: observer.image.broker(10) is not None)  # type: ignore[union-attr]
        await observer.stop()
        kept = CommittedVotersFile(observer.raft.layout.committed_voters_path).read()
        observer = None
        assert kept is not None and kept[1].ids == {1}

        second = joining_controller(first_voter, tmp_path)
        await replace(first, first_voter, second)
        await register(second.raft.endpoint, 11)

        # Restarted, the observer kept a set naming only controller 1, whose address is
        # dead: the set described now is newer, so it is the one followed.
        described = await discover_quorum([second.raft.endpoint])
        assert described.voters_offset > kept[0]
        observer = observe(described)
        await observer.start()
        await until(lambda: observer.image.broker(11) is not None)  # type: ignore[union-attr]
        assert observer.raft.voters == {2: second.raft.endpoint}
    finally:
        for server in (observer, second, first):
            if server is not None:
                await server.stop()


async def test_a_broker_observer_announces_no_endpoint_and_cannot_become_a_voter(
    tmp_path: Path,
) -> None:
    """A broker's metadata replica is an observer only: its fetches name its directory id
    but no endpoint (DescribeQuorum lists it so), and the leader refuses to make it a
    voter, by AddRaftVoter or ``highwater quorum add-controller``, with INVALID_REQUEST."""
    first_voter = Voter(1, uuid.uuid4(), f"127.0.0.1:{free_port()}")
    first = ControllerServer(
        node_id=1,
        listen=first_voter.endpoint,
        initial_voters=VoterSet.of([first_voter]),
        data_dir=tmp_path / "c1",
        settings=ControllerSettings(raft=RAFT),
    )
    observer: MetadataObserver | None = None
    await first.start()
    try:
        await until(lambda: first.raft.is_leader)
        quorum = await discover_quorum([first_voter.endpoint])
        observer = MetadataObserver(
            node_id=100, voters=quorum.voters, data_dir=tmp_path / "observer", settings=RAFT
        )
        await observer.start()
        await register(first_voter.endpoint, 10)
        await until(lambda: observer.image.broker(10) is not None)  # type: ignore[union-attr]

        directory_id = str(observer.raft.directory_id)
        described = first.raft.describe_quorum_response()
        listed = next(r for r in described.observers if r.replica_id == 100)
        assert listed.replica_directory_id == directory_id
        assert listed.endpoint == "", "a broker has no controller endpoint to announce"
        assert [n.node_id for n in described.nodes] == [1], "only voters are nodes"

        # Even with an endpoint made up by the caller, the leader refuses it.
        async with open_channel(first_voter.endpoint) as channel:
            refused = await raft_pb2_grpc.RaftStub(channel).AddRaftVoter(
                raft_pb2.AddRaftVoterRequest(
                    cluster_id=first.raft.cluster_id,
                    voter_id=100,
                    voter_directory_id=directory_id,
                    endpoint=observer.raft.endpoint,
                ),
                timeout=10,
            )
        assert refused.error == ErrorCode.INVALID_REQUEST, refused
        assert "not a controller" in refused.error_message
        assert first.raft.voter_set().ids == {1}

        result = await asyncio.to_thread(
            CliRunner().invoke,
            main,
            ["quorum", "add-controller", "--controllers", first_voter.endpoint, "--node-id", "100"],
        )
        assert result.exit_code != 0
        assert "node 100 is not a controller" in result.output, result.output
        assert first.raft.voter_set().ids == {1}
    finally:
        for server in (observer, first):
            if server is not None:
                await server.stop()
