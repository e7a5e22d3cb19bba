"""A dynamic quorum (KIP-853) in ``RaftServer``: one event loop, real gRPC, real files.

What the driver and its gRPC edge add to the pure core (``test_raft_membership.py``): a
replica started with ``bootstrap_controllers`` learns the voters and follows as an
observer that says who it is; AddRaftVoter and RemoveRaftVoter answer once committed or
with the core's typed refusal; the committed set is kept in ``quorum-voters`` and every
snapshot carries it; DescribeQuorum names directory ids and endpoints.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import shutil
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path

import grpc
import grpc.aio
import pytest
from click.testing import CliRunner
from embedded_servers import free_port
from highwater.cli.main import main
from highwater.cli.quorum import NOT_FORMED_EXIT
from highwater.errors import KafkaStorageError, UnexpectedAppendOffsetError
from highwater.internal.v1 import raft_pb2, raft_pb2_grpc
from highwater.raft.driver import MetadataLogLayout, RaftServer, RaftServerSettings
from highwater.raft.messages import OffsetAndEpoch
from highwater.raft.partition_raft_log import metadata_log_config
from highwater.raft.state_machine import SnapshotReader
from highwater.raft.voter_files import CommittedVotersFile, unwrap_snapshot, wrap_snapshot
from highwater.raft.voter_set import DIRECTORY_ID_FILE, Voter, VoterSet
from highwater.records import RecordBatch
from highwater.rpc import tls
from highwater.rpc.channels import open_channel
from highwater.security.certificate_authority import CertificateAuthority
from highwater.v1.common_pb2 import ErrorCode
from raft_timing import FAST

pytestmark = pytest.mark.timeout(90)

SETTINGS = RaftServerSettings(
    raft=FAST,
    log_config=metadata_log_config(segment_bytes=2048),
    metadata_log_max_record_bytes_between_snapshots=4096,
    discovery_timeout_ms=10_000,
)


class Values:
    """Keeps every committed value; snapshots are the JSON list of them."""

    def __init__(self) -> None:
        self.values: list[str] = []
        self.loaded = 0

    def apply(self, batches: Sequence[RecordBatch], high_watermark: int) -> None:
        for batch in batches:
            for record in batch.records():
                assert record.value is not None
                self.values.append(record.value.decode())

    def load_snapshot(self, reader: SnapshotReader) -> None:
        self.values = json.loads(reader.read())  # the voters section is not handed on
        self.loaded += 1

    def snapshot(self, snapshot_id: OffsetAndEpoch) -> bytes:
        return json.dumps(self.values).encode()


class Cluster:
    """Node 1 bootstraps a dynamic quorum alone; others join through its address."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.servers: dict[int, RaftServer] = {}
        self.machines: dict[int, Values] = {}
        self.first = Voter(1, uuid.uuid4(), "127.0.0.1:0")

    def address(self, node_id: int) -> str:
        return f"127.0.0.1:{self.servers[node_id].port}"

    async def start(
        self,
        node_id: int,
        *,
        listen: str = "127.0.0.1:0",
        advertised: str | None = None,
        settings: RaftServerSettings = SETTINGS,
    ) -> RaftServer:
        machine = self.machines.setdefault(node_id, Values())
        if node_id == 1:
            quorum: dict[str, object] = {"initial_voters": VoterSet.of([self.first])}
            listen = self.first.endpoint
        else:
            quorum = {"bootstrap_controllers": [self.address(1)]}
        server = RaftServer(
            node_id=node_id,
            listen=listen,
            data_dir=self.root / f"node-{node_id}",
            state_machine=machine,
            settings=settings,
            advertised=advertised,
            **quorum,  # type: ignore[arg-type]
        )
        await server.start()
        self.servers[node_id] = server
        return server

    async def stop(self, node_id: int) -> None:
        await self.servers.pop(node_id).stop()


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    cluster = Cluster(tmp_path)
    # A fixed port for node 1: its endpoint is in the bootstrap set every replica learns.
    cluster.first = Voter(1, uuid.uuid4(), f"127.0.0.1:{free_port()}")
    try:
        yield cluster
    finally:
        for node_id in list(cluster.servers):
            await cluster.stop(node_id)


async def until(condition: object, timeout_s: float = 15) -> None:
    async with asyncio.timeout(timeout_s):
        while not condition():  # type: ignore[operator]
            await asyncio.sleep(0.02)


async def call(address: str, method: str, request: object) -> object:
    async with open_channel(address) as channel:
        return await getattr(raft_pb2_grpc.RaftStub(channel), method)(request, timeout=10)


async def add(address: str, node_id: int, directory_id: str, endpoint: str, **more: str) -> object:
    request = raft_pb2.AddRaftVoterRequest(
        voter_id=node_id, voter_directory_id=directory_id, endpoint=endpoint, **more
    )
    return await call(address, "AddRaftVoter", request)


async def remove(address: str, node_id: int, directory_id: str = "") -> object:
    request = raft_pb2.RemoveRaftVoterRequest(voter_id=node_id, voter_directory_id=directory_id)
    return await call(address, "RemoveRaftVoter", request)


async def test_an_observer_is_added_removed_and_every_refusal_is_typed(cluster: Cluster) -> None:
    first = await cluster.start(1)
    await until(lambda: first.is_leader)
    for i in range(5):
        await first.propose([f"v{i}".encode()])
    joiner = await cluster.start(2)
    assert joiner.voter_set().ids == {1}, "it learned the voters from node 1"
    assert joiner.cluster_id == first.cluster_id
    directory_id = str(joiner.directory_id)
    assert (cluster.root / "node-2" / DIRECTORY_ID_FILE).read_text().strip() == directory_id
    await until(lambda: cluster.machines[2].values == cluster.machines[1].values)

    described = first.describe_quorum_response()
    observer = next(r for r in described.observers if r.replica_id == 2)
    assert observer.replica_directory_id == directory_id
    assert observer.endpoint == cluster.address(2)
    assert [n.directory_id for n in described.nodes] == [str(cluster.first.directory_id)]

    leader = cluster.address(1)
    # Refusals, each typed: a node that never fetched, a bad directory id, another
    # cluster, a follower asked, a static quorum further down.
    never = await add(leader, 3, str(uuid.uuid4()), "127.0.0.1:9")
    assert never.error == ErrorCode.REQUEST_TIMED_OUT, never  # type: ignore[attr-defined]
    assert "not a caught-up observer" in never.error_message  # type: ignore[attr-defined]
    # Node 2 caught up, but under another directory id than its fetches carry.
    mismatched = await add(leader, 2, str(uuid.uuid4()), cluster.address(2))
    assert mismatched.error == ErrorCode.REQUEST_TIMED_OUT  # type: ignore[attr-defined]
    assert f"fetches with directory {directory_id}" in mismatched.error_message  # type: ignore[attr-defined]
    bad = await add(leader, 2, "not-a-uuid", cluster.address(2))
    assert bad.error == ErrorCode.INVALID_REQUEST  # type: ignore[attr-defined]
    other = await add(leader, 2, directory_id, cluster.address(2), cluster_id="other")
    assert other.error == ErrorCode.INCONSISTENT_CLUSTER_ID  # type: ignore[attr-defined]
    last = await remove(leader, 1, str(cluster.first.directory_id))
    assert last.error == ErrorCode.INVALID_REQUEST  # type: ignore[attr-defined]
    assert "last voter" in last.error_message  # type: ignore[attr-defined]

    added = await add(leader, 2, directory_id, cluster.address(2))
    assert added.error == ErrorCode.NONE, added  # type: ignore[attr-defined]
    assert first.voter_set().ids == {1, 2}
    await until(lambda: joiner.voter_set().ids == {1, 2})
    kept = CommittedVotersFile(MetadataLogLayout(cluster.root / "node-1").committed_voters_path)
    # Kept once the driver handles the Ready that commits it: the answer may come first.
    await until(lambda: kept.read()[1].ids == {1, 2})  # type: ignore[index]
    await until(lambda: first.describe_quorum_response().current_voters[-1].replica_id == 2)
    voters = first.describe_quorum_response().current_voters
    assert [(v.replica_id, v.replica_directory_id) for v in voters] == [
        (1, str(cluster.first.directory_id)),
        (2, directory_id),
    ]

    again = await add(leader, 2, str(uuid.uuid4()), cluster.address(2))
    assert again.error == ErrorCode.INVALID_REQUEST  # type: ignore[attr-defined]
    assert "new incarnation" in again.error_message  # type: ignore[attr-defined]
    asked_follower = await remove(cluster.address(2), 2)
    assert asked_follower.error == ErrorCode.NOT_LEADER_OR_FOLLOWER  # type: ignore[attr-defined]
    assert asked_follower.leader_id == 1  # type: ignore[attr-defined]
    assert asked_follower.leader_endpoint == leader  # type: ignore[attr-defined]
    wrong_directory = await remove(leader, 2, str(uuid.uuid4()))
    assert wrong_directory.error == ErrorCode.INVALID_REQUEST  # type: ignore[attr-defined]
    # Without a directory id a request names the nil one, which no voter has (KIP-853):
    # a late removal of a replaced controller cannot remove its new incarnation.
    no_directory = await remove(leader, 2)
    assert no_directory.error == ErrorCode.INVALID_REQUEST  # type: ignore[attr-defined]
    assert "without a directory id" in no_directory.error_message  # type: ignore[attr-defined]
    assert first.voter_set().ids == {1, 2}

    removed = await remove(leader, 2, directory_id)
    assert removed.error == ErrorCode.NONE, removed  # type: ignore[attr-defined]
    assert first.voter_set().ids == {1}
    await until(lambda: joiner.voter_set().ids == {1})
    await first.propose([b"after"])
    await until(lambda: cluster.machines[2].values[-1:] == ["after"])

    # Both restart from what they kept: node 2, an observer again, knows the set.
    await cluster.stop(2)
    await cluster.stop(1)
    first = await cluster.start(1)
    joiner = await cluster.start(2)
    assert first.voter_set().ids == joiner.voter_set().ids == {1}
    await until(lambda: first.is_leader)
    await first.propose([b"restarted"])
    await until(lambda: cluster.machines[2].values[-1:] == ["restarted"])


async def test_an_append_at_a_base_offset_goes_after_the_voters_records_there(
    cluster: Cluster,
) -> None:
    """``append(base_offset=B)`` (the active controller's group commit): a membership
    change's ``voters`` record the leader appended at B is skipped over, and the offset
    returned says where the batch went; a data record at B is not."""
    first = await cluster.start(1)
    await until(lambda: first.is_leader)
    await first.propose([b"a"])
    joiner = await cluster.start(2)
    await until(lambda: cluster.machines[2].values == ["a"])
    epoch = first.describe().leader_epoch
    base = first.applied_offset
    added = await add(cluster.address(1), 2, str(joiner.directory_id), cluster.address(2))
    assert added.error == ErrorCode.NONE, added  # type: ignore[attr-defined]
    assert first.voter_set().ids == {1, 2}  # its voters record took offset B

    last, committed = first.append([b"b", b"c"], epoch=epoch, base_offset=base)
    assert last == OffsetAndEpoch(base + 2, epoch)
    assert await committed == base + 2
    await until(lambda: cluster.machines[2].values == ["a", "b", "c"])
    with pytest.raises(UnexpectedAppendOffsetError, match="nor after voter-set records alone"):
        first.append([b"d"], epoch=epoch, base_offset=base)
    with pytest.raises(UnexpectedAppendOffsetError, match=f"ends at offset {base + 3}"):
        first.append([b"d"], epoch=epoch, base_offset=base + 4)
    assert cluster.machines[1].values == ["a", "b", "c"]


async def test_a_voter_announces_its_advertised_endpoint_and_its_move(cluster: Cluster) -> None:
    first = await cluster.start(1)
    await until(lambda: first.is_leader)
    port = free_port()
    advertised = f"127.0.0.1:{port}"
    joiner = await cluster.start(2, listen=f"0.0.0.0:{port}", advertised=advertised)
    assert joiner.endpoint == advertised
    await until(lambda: joiner.applied_offset >= first.high_watermark > 0)
    # The bootstrap set came into the log as its first voters record: the joiner keeps
    # it with that record's offset, not as a set learned at start (-1).
    kept = CommittedVotersFile(MetadataLogLayout(cluster.root / "node-2").committed_voters_path)
    await until(lambda: (kept.read() or (-1, None))[0] >= 0)
    observer = next(r for r in first.describe_quorum_response().observers if r.replica_id == 2)
    assert observer.endpoint == advertised, "its fetches announce the advertised endpoint"
    added = await add(cluster.address(1), 2, str(joiner.directory_id), observer.endpoint)
    assert added.error == ErrorCode.NONE, added  # type: ignore[attr-defined]
    assert first.voter_set().get(2) == Voter(2, joiner.directory_id, advertised)  # type: ignore[arg-type]

    # It restarts on another address: it sends UpdateRaftVoter itself, and the leader's
    # transport follows the committed set.
    await cluster.stop(2)
    moved = f"127.0.0.1:{free_port()}"
    joiner = await cluster.start(2, listen=moved)
    await until(lambda: first.voter_set().get(2).endpoint == moved)  # type: ignore[union-attr]
    await until(lambda: joiner.voter_set().get(2).endpoint == moved)  # type: ignore[union-attr]
    assert first.voters[2] == moved
    await first.propose([b"after the move"])  # committed by both voters
    await until(lambda: cluster.machines[2].values[-1:] == ["after the move"])


async def test_snapshots_carry_the_voter_set(cluster: Cluster) -> None:
    first = await cluster.start(1)
    await until(lambda: first.is_leader)
    joiner = await cluster.start(2)
    await until(lambda: joiner.applied_offset >= first.high_watermark > 0)
    added = await add(cluster.address(1), 2, str(joiner.directory_id), cluster.address(2))
    assert added.error == ErrorCode.NONE, added  # type: ignore[attr-defined]
    for i in range(150):
        await first.propose([f"n{i:04d}".encode() + b"y" * 40])
    layout = MetadataLogLayout(cluster.root / "node-1")
    assert not (layout.log_dir / "00000000000000000000.log").exists(), "no snapshot yet"
    # A replica that joins now installs the leader's snapshot and takes its voter set.
    third = await cluster.start(3)
    await until(lambda: third.applied_offset >= first.high_watermark)
    assert cluster.machines[3].loaded and cluster.machines[3].values == cluster.machines[1].values
    assert third.voter_set().ids == {1, 2}
    # It learned {1, 2} at its first start too (offset -1); the kept set now names the
    # offset of the record the snapshot carried.
    kept = CommittedVotersFile(MetadataLogLayout(cluster.root / "node-3").committed_voters_path)
    await until(lambda: (kept.read() or (-1, None))[0] >= 0)
    # Node 1 restarted without its quorum-voters file: the snapshot's set, not the
    # bootstrap's {1}, is the one in force (node 2 then votes it back in).
    await cluster.stop(3)
    await cluster.stop(1)
    layout.committed_voters_path.unlink()
    restarted = await cluster.start(1)
    assert restarted.voter_set().ids == {1, 2}
    await until(lambda: restarted.is_leader or joiner.is_leader)


async def test_a_static_quorum_refuses_changes(tmp_path: Path) -> None:
    server = RaftServer(
        node_id=1,
        listen="127.0.0.1:0",
        voters={1: "127.0.0.1:1"},
        data_dir=tmp_path,
        state_machine=Values(),
        settings=SETTINGS,
    )
    await server.start()
    try:
        await until(lambda: server.is_leader)
        address = f"127.0.0.1:{server.port}"
        answer = await add(address, 2, str(uuid.uuid4()), "127.0.0.1:9")
        assert answer.error == ErrorCode.UNSUPPORTED_VERSION  # type: ignore[attr-defined]
        assert "--initial-controllers" in answer.error_message  # type: ignore[attr-defined]
        assert not (tmp_path / DIRECTORY_ID_FILE).exists()
    finally:
        await server.stop()


def test_the_voters_section_of_a_snapshot() -> None:
    voters = VoterSet.of([Voter(1, uuid.uuid4(), "h:1"), Voter(2, uuid.uuid4(), "h:2")])
    wrapped = wrap_snapshot((7, voters), b"[1,2]")
    assert unwrap_snapshot(wrapped) == ((7, voters), b"[1,2]")
    assert unwrap_snapshot(b"[1,2]") == (None, b"[1,2]")  # a static quorum's snapshot


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


def formed(controllers: str) -> tuple[int, str]:
    return invoke("quorum", "formed", "--controllers", controllers)


async def test_a_replica_looking_for_its_quorum_answers_that_it_knows_none(
    tmp_path: Path,
) -> None:
    """While ``bootstrap_controllers`` discovery goes on, the replica already serves:
    DescribeQuorum says BROKER_NOT_AVAILABLE and names no voter and no cluster (what a
    start script asks before it forms a quorum). Once the quorum it looks for is up, it
    joins it and describes its voters."""
    first = Voter(1, uuid.uuid4(), f"127.0.0.1:{free_port()}")
    joiner_address = f"127.0.0.1:{free_port()}"
    joiner = RaftServer(
        node_id=2,
        listen=joiner_address,
        bootstrap_controllers=[first.endpoint],
        data_dir=tmp_path / "joiner",
        state_machine=Values(),
        settings=SETTINGS,
    )
    starting = asyncio.create_task(joiner.start())
    leader = None
    try:
        async with asyncio.timeout(15):
            while True:
                try:
                    answer = await call(
                        joiner_address, "DescribeQuorum", raft_pb2.DescribeQuorumRequest()
                    )
                    break
                except grpc.aio.AioRpcError:
                    await asyncio.sleep(0.02)
        assert isinstance(answer, raft_pb2.DescribeQuorumResponse)
        assert answer.error == ErrorCode.BROKER_NOT_AVAILABLE
        assert not answer.nodes and not answer.cluster_id
        assert not starting.done()
        # What the chart's first controller asks before it forms a quorum.
        code, output = await asyncio.to_thread(formed, joiner_address)
        assert code == NOT_FORMED_EXIT, output
        assert "each answered that it knows no quorum" in output
        code, output = await asyncio.to_thread(formed, f"{joiner_address},{first.endpoint}")
        assert code == 1 and f"not known: no answer from {first.endpoint}" in output, output
        leader = RaftServer(
            node_id=1,
            listen=first.endpoint,
            initial_voters=VoterSet.of([first]),
            data_dir=tmp_path / "first",
            state_machine=Values(),
            settings=SETTINGS,
        )
        await leader.start()
        await asyncio.wait_for(starting, 15)
        answer = await call(joiner_address, "DescribeQuorum", raft_pb2.DescribeQuorumRequest())
        assert isinstance(answer, raft_pb2.DescribeQuorumResponse)
        assert [(n.node_id, n.directory_id) for n in answer.nodes] == [(1, str(first.directory_id))]
        assert answer.cluster_id == leader.cluster_id
        code, output = await asyncio.to_thread(formed, joiner_address)
        assert code == 0 and f"names the voters 1@{first.endpoint}" in output, output
    finally:
        if not starting.done():
            starting.cancel()
        with contextlib.suppress(BaseException):
            await starting
        if starting.done() and not starting.cancelled() and starting.exception() is None:
            await joiner.stop()
        if leader is not None:
            await leader.stop()


@pytest.fixture(params=["plaintext", "mutual TLS"])
def transport(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """Every server and channel of this process in plaintext, or over mutual TLS with
    certificates of a throwaway CA (as controllers started with ``--tls-*`` flags)."""
    if request.param == "mutual TLS":
        ca = CertificateAuthority()
        root = tmp_path / "pki"
        root.mkdir()
        (root / "ca.crt").write_bytes(ca.certificate_pem)
        ca.issue("controller", hosts=["127.0.0.1"]).write(root / "c.crt", root / "c.key")
        tls.configure(
            server=tls.ServerTls(root / "c.crt", root / "c.key", root / "ca.crt"),
            client=tls.ClientTls(root / "ca.crt", root / "c.crt", root / "c.key"),
        )
    try:
        yield request.param
    finally:
        tls.configure(server=None, client=None)


async def test_auto_join_adds_a_new_controller_and_replaces_a_wiped_one(
    cluster: Cluster, transport: str
) -> None:
    """``controller.quorum.auto.join.enable``: a controller started with
    ``bootstrap_controllers`` asks the leader to add it once it follows; wiped and back
    under a new directory id, it asks to remove its former key, then to add the new one.
    No add-controller or remove-controller is run. The same over mutual TLS."""
    auto = dataclasses.replace(SETTINGS, raft=dataclasses.replace(FAST, auto_join=True))
    leader = await cluster.start(1)
    await until(lambda: leader.is_leader)
    await leader.propose([b"before"])
    if transport == "mutual TLS":  # it is on: a plaintext call does not get through
        async with grpc.aio.insecure_channel(cluster.address(1)) as channel:
            with pytest.raises(grpc.aio.AioRpcError):
                await raft_pb2_grpc.RaftStub(channel).DescribeQuorum(
                    raft_pb2.DescribeQuorumRequest(), timeout=5
                )
    first = await cluster.start(2, settings=auto)
    assert first.directory_id is not None
    await until(lambda: leader.voter_set().is_voter(2, first.directory_id))
    await leader.propose([b"with two voters"])
    # What the chart asks before the controller count goes down.
    code, output = await asyncio.to_thread(
        invoke, "quorum", "check-removal", "--controllers", cluster.address(1), "--ids-from", "2"
    )
    assert code == 1 and "voters [2] still vote" in output, output
    assert f"remove-controller --controllers {cluster.address(1)} --node-id 2" in output
    code, output = await asyncio.to_thread(
        invoke, "quorum", "check-removal", "--controllers", cluster.address(1), "--ids-from", "3"
    )
    assert code == 0 and "no voter has a node id of 3 or more" in output, output
    await cluster.stop(2)
    shutil.rmtree(cluster.root / "node-2")
    again = await cluster.start(2, settings=auto)
    assert again.directory_id not in (None, first.directory_id)
    await until(lambda: leader.voter_set().is_voter(2, again.directory_id), timeout_s=30)
    assert sorted(leader.voter_set().ids) == [1, 2]
    await leader.propose([b"after"])
    await until(lambda: cluster.machines[2].values[-1:] == ["after"])


async def test_bootstrap_controllers_refuse_a_static_quorum(tmp_path: Path) -> None:
    static = RaftServer(
        node_id=1,
        listen="127.0.0.1:0",
        voters={1: "127.0.0.1:1"},
        data_dir=tmp_path / "static",
        state_machine=Values(),
        settings=SETTINGS,
    )
    await static.start()
    try:
        joiner = RaftServer(
            node_id=2,
            listen="127.0.0.1:0",
            bootstrap_controllers=[f"127.0.0.1:{static.port}"],
            data_dir=tmp_path / "joiner",
            state_machine=Values(),
            settings=SETTINGS,
        )
        with pytest.raises(Exception, match="is static"):
            await joiner.start()
    finally:
        await static.stop()


async def test_initial_controllers_refuse_a_directory_of_another_incarnation(
    tmp_path: Path,
) -> None:
    (tmp_path / DIRECTORY_ID_FILE).write_text(f"{uuid.uuid4()}\n")
    server = RaftServer(
        node_id=1,
        listen="127.0.0.1:0",
        initial_voters=VoterSet.of([Voter(1, uuid.uuid4(), "127.0.0.1:1")]),
        data_dir=tmp_path,
        state_machine=Values(),
        settings=SETTINGS,
    )
    with pytest.raises(KafkaStorageError, match="rejoins with --bootstrap-controllers"):
        await server.start()


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


@pytest.mark.parametrize(
    ("quorum", "message"),
    [
        (["--voters", "1@127.0.0.1:9093", "--bootstrap-controllers", "127.0.0.1:9093"], "one way"),
        ([], "give the quorum one way"),
        (["--initial-controllers", "1@127.0.0.1:9093"], "bad --initial-controllers entry"),
        (["--initial-controllers", f"2@127.0.0.1:9093:{uuid.uuid4()}"], "a new controller joins"),
        (["--bootstrap-controllers", "nowhere"], "is not HOST:PORT"),
        (["--voters", "2@127.0.0.1:9093", "--advertised-listener", "nowhere"], "not HOST:PORT"),
    ],
)
def test_controller_quorum_flags_are_checked(
    tmp_path: Path, quorum: list[str], message: str
) -> None:
    code, output = run(
        "controller", "--node-id", "1", "--listen", "127.0.0.1:0", "--data-dir", str(tmp_path),
        *quorum,
    )  # fmt: skip
    assert code == 2 and message in output, output
    assert not list(tmp_path.iterdir())  # nothing was started


@pytest.mark.parametrize(
    ("quorum", "message"),
    [
        ([], "give the quorum one way"),
        (["--voters", "1@127.0.0.1:9093", "--controllers", "127.0.0.1:9093"], "one way"),
        (["--controllers", "nowhere"], "is not HOST:PORT"),
    ],
)
def test_observer_quorum_flags_are_checked(tmp_path: Path, quorum: list[str], message: str) -> None:
    code, output = run("observer", "--node-id", "9", "--data-dir", str(tmp_path), *quorum)
    assert code == 2 and message in output, output
    assert not list(tmp_path.iterdir())


def test_quorum_changes_report_bad_input_and_unreachable_controllers() -> None:
    code, output = run(
        "quorum", "remove-controller", "--controllers", "127.0.0.1:1", "--node-id", "1",
        "--directory-id", "nope",
    )  # fmt: skip
    assert code == 2 and "is not a directory id" in output
    code, output = run(
        "quorum", "add-controller", "--controllers", "127.0.0.1:1", "--node-id", "4",
        "--timeout", "1",
    )  # fmt: skip
    assert code == 1 and "no controller could be reached" in output
