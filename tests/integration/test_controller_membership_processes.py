"""A dynamic quorum (KIP-853) on processes: replace a controller whose disk was wiped.

Three ``highwater controller --initial-controllers`` processes and a broker (registered
and heartbeating through the Controller API), topic creations going on throughout. One
follower is killed and its data directory wiped; it comes back on another port, listening
on ``0.0.0.0`` with ``--advertised-listener``, with ``--bootstrap-controllers`` (a new
directory id: a new voter that follows as an observer, announcing its new endpoint),
``highwater quorum remove-controller`` removes the old incarnation by its directory id and
``highwater quorum add-controller`` adds the new one, found among the observers.
``quorum describe --status`` then lists the new voter set, and every topic creation that
was acknowledged is in the replaced controller's log. Then the same with auto-join
(``controller.quorum.auto.join.enable``): a wiped follower started with
``--bootstrap-controllers`` removes its former key and adds itself, with no command run.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
from click.testing import CliRunner
from highwater.cli.main import main
from highwater.controller_api import codec
from highwater.controller_api import messages as m
from highwater.controller_api.client import ControllerClient
from highwater.internal.v1 import raft_pb2, raft_pb2_grpc
from highwater.rpc.endpoints import free_loopback_ports
from highwater.v1.common_pb2 import ErrorCode
from quorum_processes import keep_broker_alive, replay_image

pytestmark = pytest.mark.timeout(400)

IDS = (1, 2, 3)


@dataclass
class Node:
    node_id: int
    port: int
    data_dir: Path
    log_path: Path
    process: subprocess.Popen[bytes] | None = field(default=None)
    listen: str | None = None
    """``--listen`` when not ``address`` (which is then ``--advertised-listener``)."""

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, *quorum: str) -> None:
        where = ["--listen", self.address]
        if self.listen is not None:
            where = ["--listen", self.listen, "--advertised-listener", self.address]
        with open(self.log_path, "ab") as stderr:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "highwater",
                    "--log-level",
                    "INFO",
                    "controller",
                    "--node-id",
                    str(self.node_id),
                    *where,
                    "--data-dir",
                    str(self.data_dir),
                    *quorum,
                ],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                env=dict(os.environ, PYTHONUNBUFFERED="1"),
            )

    def stop(self, sig: int = signal.SIGTERM) -> int | None:
        process, self.process = self.process, None
        if process is None:
            return None
        if process.poll() is None:
            process.send_signal(sig)
        try:
            return process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            return process.wait(10)


@dataclass
class Quorum:
    nodes: dict[int, Node]
    directory_ids: dict[int, str]
    created: dict[str, str] = field(default_factory=dict)
    """Acknowledged topic creations: name -> topic id."""

    @property
    def addresses(self) -> list[str]:
        return [n.address for n in self.nodes.values()]

    def describe(self) -> raft_pb2.DescribeQuorumResponse:
        """The leader's DescribeQuorum (waits for one: on a loaded machine a controller's
        start alone can take tens of seconds)."""
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline:
            for node in self.nodes.values():
                with grpc.insecure_channel(node.address) as channel:
                    try:
                        answer = raft_pb2_grpc.RaftStub(channel).DescribeQuorum(
                            raft_pb2.DescribeQuorumRequest(), timeout=2
                        )
                    except grpc.RpcError:
                        continue
                if answer.error == ErrorCode.NONE:
                    return answer
            time.sleep(0.1)
        raise AssertionError("no leader; see the controller-*.log files")

    def assert_kept_track_of_the_log(self) -> None:
        """No active controller found the metadata log somewhere it did not expect: the
        voters records of a membership change are skipped over (they once made the
        active controller drop its uncommitted requests and claim its epoch again, and a
        broker's disconnection it was fencing went unfenced until its session expired)."""
        for node in self.nodes.values():
            log = node.log_path.read_text() if node.log_path.exists() else ""
            assert "lost track of the log" not in log, f"{node.log_path}:\n{log[-3000:]}"


@pytest.fixture(scope="module")
def quorum(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Quorum]:
    root = tmp_path_factory.mktemp("membership")
    ports = free_loopback_ports(len(IDS))
    directory_ids = {n: str(uuid.uuid4()) for n in IDS}
    initial = ",".join(
        f"{n}@127.0.0.1:{p}:{directory_ids[n]}" for n, p in zip(IDS, ports, strict=True)
    )
    nodes = {
        n: Node(n, p, root / f"controller-{n}", root / f"controller-{n}.log")
        for n, p in zip(IDS, ports, strict=True)
    }
    for node in nodes.values():
        node.start("--initial-controllers", initial)
    try:
        yield Quorum(nodes, directory_ids)
    finally:
        for node in nodes.values():
            node.stop(signal.SIGKILL)


def cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


async def create_topics(quorum: Quorum, client: ControllerClient, stop: asyncio.Event) -> int:
    """Create topics one after another until ``stop``; how many creations failed."""
    failed = 0
    number = 0
    while not stop.is_set():
        name = f"topic-{number:05d}"
        number += 1
        try:
            answer = await client.create_topics(
                m.CreateTopicsRequest((m.CreatableTopic(name, 1, 1),))
            )
        except Exception:
            failed += 1
            continue
        (result,) = answer.topics
        if result.error == ErrorCode.NONE:
            quorum.created[name] = result.topic_id
        else:
            failed += 1
    return failed


@contextlib.asynccontextmanager
async def topic_creations(quorum: Quorum) -> AsyncIterator[list[int]]:
    """A registered broker kept alive and topic creations going on from the moment it is
    unfenced; on exit, the list yielded holds how many creations failed."""
    failed: list[int] = []
    async with ControllerClient(quorum.addresses, timeout_s=60) as client:
        heartbeats = asyncio.create_task(keep_broker_alive(client))
        stop = asyncio.Event()
        writer: asyncio.Task[int] | None = None
        try:
            async with asyncio.timeout(30):
                while not quorum.created:  # once the broker is unfenced
                    await create_topics_once(quorum, client)
            writer = asyncio.create_task(create_topics(quorum, client, stop))
            yield failed
        finally:
            stop.set()
            failed.append(await writer if writer is not None else 0)
            heartbeats.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await heartbeats


async def more_creations(quorum: Quorum, count: int = 20) -> None:
    """Wait until ``count`` more topic creations were acknowledged."""
    created = len(quorum.created)
    async with asyncio.timeout(30):
        while len(quorum.created) < created + count:
            await asyncio.sleep(0.05)


async def until_replaced(quorum: Quorum, node_id: int, former: str) -> dict[int, str]:
    """Wait until ``node_id`` is a voter under another directory id than ``former``; the
    voters then (node id -> directory id)."""
    async with asyncio.timeout(90):
        while True:
            described = await asyncio.to_thread(quorum.describe)
            voters = {v.replica_id: v.replica_directory_id for v in described.current_voters}
            if voters.get(node_id) not in (None, former):
                assert not described.observers, described
                return voters
            await asyncio.sleep(0.1)


async def test_replace_a_controller_whose_disk_was_wiped(quorum: Quorum) -> None:
    described = await asyncio.to_thread(quorum.describe)
    assert [(v.replica_id, v.replica_directory_id) for v in described.current_voters] == [
        (n, quorum.directory_ids[n]) for n in IDS
    ]
    controllers = ",".join(quorum.addresses)
    async with topic_creations(quorum) as failed:
        victim = quorum.nodes[next(n for n in IDS if n != described.leader_id)]
        old_directory = quorum.directory_ids[victim.node_id]
        victim.stop(signal.SIGKILL)
        shutil.rmtree(victim.data_dir)
        others = ",".join(n.address for n in quorum.nodes.values() if n is not victim)
        (victim.port,) = free_loopback_ports(1)  # it moves: the others learn where from it
        victim.listen = f"0.0.0.0:{victim.port}"
        victim.start("--bootstrap-controllers", others)

        # Its old incarnation is still a voter: the leader refuses to count the new
        # one's fetches, and add-controller names the voter to remove first.
        code, output = await asyncio.to_thread(
            cli, "quorum", "add-controller", "--controllers", controllers,
            "--node-id", str(victim.node_id),
        )  # fmt: skip
        assert code == 1 and "is a voter already" in output, output
        code, output = await asyncio.to_thread(
            cli, "quorum", "remove-controller", "--controllers", controllers,
            "--node-id", str(victim.node_id), "--directory-id", old_directory,
        )  # fmt: skip
        assert code == 0, output

        # Now it follows as an observer, with a new directory id.
        async with asyncio.timeout(60):
            while True:
                described = await asyncio.to_thread(quorum.describe)
                observer = [r for r in described.observers if r.replica_id == victim.node_id]
                if observer and observer[0].replica_directory_id not in ("", old_directory):
                    break
                await asyncio.sleep(0.1)
        new_directory = observer[0].replica_directory_id
        assert observer[0].endpoint == victim.address
        async with asyncio.timeout(60):
            while True:  # until it is caught up
                code, output = await asyncio.to_thread(
                    cli, "quorum", "add-controller", "--controllers", controllers,
                    "--node-id", str(victim.node_id),
                )  # fmt: skip
                if code == 0:
                    break
                assert "REQUEST_TIMED_OUT" in output or "not an observer" in output, output
                await asyncio.sleep(0.2)
        assert f"Added controller {victim.node_id}" in output
        await more_creations(quorum)

    code, output = await asyncio.to_thread(
        cli, "quorum", "describe", "--controllers", controllers, "--status", "--format", "json"
    )
    assert code == 0, output
    status = json.loads(output)
    assert [(v["id"], v["directoryId"]) for v in status["CurrentVoters"]] == [
        (n, new_directory if n == victim.node_id else quorum.directory_ids[n]) for n in IDS
    ]
    assert status["CurrentObservers"] == []
    moved = [v.get("endpoints") for v in status["CurrentVoters"] if v["id"] == victim.node_id]
    assert moved == [[victim.address]], status  # its advertised endpoint, on the new port

    await assert_every_creation_is_in_the_log_of(quorum, victim)
    assert len(quorum.created) >= 20 and failed[0] < len(quorum.created)
    quorum.assert_kept_track_of_the_log()


async def assert_every_creation_is_in_the_log_of(quorum: Quorum, victim: Node) -> None:
    """Every acknowledged topic creation is in the replaced controller's log, once it has
    caught up (it is stopped to read its files)."""
    high_watermark = (await asyncio.to_thread(quorum.describe)).high_watermark
    async with asyncio.timeout(30):
        while True:
            voters = (await asyncio.to_thread(quorum.describe)).current_voters
            ends = {v.replica_id: v.log_end_offset for v in voters}
            if ends[victim.node_id] >= high_watermark:
                break
            await asyncio.sleep(0.1)
    assert victim.stop() == 0
    image = replay_image(victim.data_dir, high_watermark)
    lost = {
        name: topic_id
        for name, topic_id in quorum.created.items()
        if (topic := image.topic(name)) is None or topic.topic_id != topic_id
    }
    assert not lost, f"acknowledged topic creations lost: {sorted(lost)[:5]}"


async def test_with_auto_join_a_wiped_controller_replaces_itself(quorum: Quorum) -> None:
    """``--override controller.quorum.auto.join.enable=true``: a follower's disk is wiped
    and it comes back with ``--bootstrap-controllers`` only. With no add-controller nor
    remove-controller, it asks the leader to remove its former key, then to add it under
    its new directory id, while topic creations go on."""
    described = await asyncio.to_thread(quorum.describe)
    before = {v.replica_id: v.replica_directory_id for v in described.current_voters}
    assert sorted(before) == list(IDS)
    async with topic_creations(quorum) as failed:
        victim = quorum.nodes[next(n for n in IDS if n != described.leader_id)]
        victim.stop(signal.SIGKILL)
        shutil.rmtree(victim.data_dir)
        others = ",".join(n.address for n in quorum.nodes.values() if n is not victim)
        victim.start(
            "--bootstrap-controllers", others,
            "--override", "controller.quorum.auto.join.enable=true",
        )  # fmt: skip
        voters = await until_replaced(quorum, victim.node_id, before[victim.node_id])
        assert sorted(voters) == list(IDS)
        assert {n: voters[n] for n in IDS if n != victim.node_id} == {
            n: before[n] for n in IDS if n != victim.node_id
        }
        await more_creations(quorum)
    assert failed[0] < len(quorum.created)
    log = victim.log_path.read_text()
    assert "auto-join: the leader removed voter" in log
    assert "auto-join: the leader added voter" in log
    await assert_every_creation_is_in_the_log_of(quorum, victim)
    quorum.assert_kept_track_of_the_log()


async def create_topics_once(quorum: Quorum, client: ControllerClient) -> None:
    name = f"first-{len(quorum.created)}-{time.monotonic_ns()}"
    answer = await client.create_topics(m.CreateTopicsRequest((m.CreatableTopic(name, 1, 1),)))
    if answer.topics[0].error == ErrorCode.NONE:
        quorum.created[name] = answer.topics[0].topic_id
    else:
        await asyncio.sleep(0.1)


async def test_the_charts_dynamic_quorum_forms_itself_and_survives_losing_its_first_volume(
    tmp_path: Path,
) -> None:
    """What deploy/helm/highwater/files/controller.sh runs in a dynamic quorum, with
    loopback addresses for pod names: controllers 1 and 2 start empty with
    ``--bootstrap-controllers`` (every controller) and auto-join; controller 0 asks
    ``quorum formed`` of them, hears that neither knows a quorum and forms one alone
    (``--initial-controllers``); 1 and 2 join it by themselves. Later controller 0's volume
    is lost: ``quorum formed`` now says formed, so it starts as the others did and replaces
    its former voter by itself."""
    ports = free_loopback_ports(len(IDS))
    nodes = {
        n: Node(n, p, tmp_path / f"controller-{n}", tmp_path / f"controller-{n}.log")
        for n, p in zip((0, 1, 2), ports, strict=True)
    }
    every = ",".join(n.address for n in nodes.values())
    joining = (
        "--bootstrap-controllers",
        every,
        "--override",
        "controller.quorum.auto.join.enable=true",
        "--override",
        "controller.quorum.bootstrap.timeout.ms=3600000",
    )
    quorum = Quorum(nodes, {})
    try:
        for n in (1, 2):
            nodes[n].start(*joining)
        others = f"{nodes[1].address},{nodes[2].address}"
        async with asyncio.timeout(60):
            while True:  # until both serve: they answer while they look for a quorum
                answer = await asyncio.to_thread(cli, "quorum", "formed", "--controllers", others)
                if answer[0] != 1:
                    break
                await asyncio.sleep(0.2)
        assert answer[0] == 3, answer
        # Looking for its quorum, a controller answers a Controller call at once: it knows
        # no active controller.
        rpc = codec.CREATE_TOPICS
        request = rpc.request_to_proto(m.CreateTopicsRequest((m.CreatableTopic("early", 1, 1),)))
        with grpc.insecure_channel(nodes[1].address) as channel:
            call = channel.unary_unary(
                "/highwater.internal.v1.Controller/CreateTopics",
                request_serializer=type(request).SerializeToString,
                response_deserializer=rpc.proto_response.FromString,
            )
            reply = rpc.response_from_proto(call(request, timeout=10))
        assert reply.error == ErrorCode.NOT_CONTROLLER, reply
        first_directory = str(uuid.uuid4())
        nodes[0].start("--initial-controllers", f"0@{nodes[0].address}:{first_directory}")
        async with asyncio.timeout(90):
            while True:
                described = await asyncio.to_thread(quorum.describe)
                if sorted(v.replica_id for v in described.current_voters) == [0, 1, 2]:
                    break
                await asyncio.sleep(0.1)
        before = {v.replica_id: v.replica_directory_id for v in described.current_voters}
        assert before[0] == first_directory
        async with topic_creations(quorum) as failed:
            nodes[0].stop(signal.SIGKILL)
            shutil.rmtree(nodes[0].data_dir)
            code, output = await asyncio.to_thread(cli, "quorum", "formed", "--controllers", others)
            assert code == 0 and "formed: " in output, output
            nodes[0].start(*joining)
            voters = await until_replaced(quorum, 0, first_directory)
            assert sorted(voters) == [0, 1, 2]
            assert {n: voters[n] for n in (1, 2)} == {n: before[n] for n in (1, 2)}
            await more_creations(quorum)
        assert failed[0] < len(quorum.created)
        await assert_every_creation_is_in_the_log_of(quorum, nodes[0])
        quorum.assert_kept_track_of_the_log()
    finally:
        for node in nodes.values():
            node.stop(signal.SIGKILL)
