"""The etcd metadata mode on real processes and a real etcd: the failover article's stories.

One etcd and three ``highwater broker --metadata-store etcd://...`` processes (2 s
sessions) serve the whole module; the tests run in order and each leaves the cluster
working: data flows and ``cluster describe`` names the controller and the mode; the
``topics``, ``produce`` and ``consume`` commands work against any broker; a deposed
controller's push is refused by its epoch; hand-edited impossible keys stop the
controller, with errors naming the key, until they are fixed, and the brokers keep serving
the last consistent image; with etcd stopped the
brokers keep serving what they lead and admin calls fail clearly, and all recovers when
etcd returns; etcd paused past the session TTL makes the controller step down and the
brokers register again with new leases; killing the controller's broker makes another
broker controller with a higher epoch, and its fence (more partition states than one etcd
transaction takes) is written in several; a topic too large for one transaction is
refused naming etcd's limit. Bad start-up input (a wrong endpoint, a data
directory of another cluster on the prefix) fails with an error naming the endpoint or key.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from aetcd import rpc as aetcd_rpc
from broker_processes import consume_all, metadata
from cli_process import highwater_cli
from click.testing import CliRunner
from etcd_processes import (
    EtcdBrokerProcess,
    EtcdServer,
    etcd_member,
    put_key,
    read_prefix,
    wait_for,
)
from highwater.cli.main import main
from highwater.client.admin import AdminClient, AdminError, NewTopic
from highwater.client.errors import InvalidRequestError
from highwater.client.producer import AsyncProducer
from highwater.etcd_metadata.connection import (
    Delete,
    EtcdConnection,
    EtcdWatchBrokenError,
    Put,
)
from highwater.etcd_metadata.endpoints import parse_metadata_store
from highwater.etcd_metadata.prefix_view import KeyChange, PrefixView
from highwater.internal.v1 import (
    broker_metadata_pb2,
    broker_metadata_pb2_grpc,
    controller_pb2,
    controller_pb2_grpc,
)
from highwater.rpc.channels import open_channel
from highwater.rpc.endpoints import free_loopback_ports
from highwater.v1.common_pb2 import ErrorCode

# A hang fails its test instead of the whole run.
pytestmark = pytest.mark.timeout(300)

CLUSTER = "stories"


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    with etcd_member(tmp_path_factory.mktemp("etcd")) as server:
        yield server


@pytest.fixture(scope="module")
def store(etcd: EtcdServer) -> str:
    return f"etcd://{etcd.endpoint}/{CLUSTER}"


@pytest.fixture(scope="module")
def cluster(
    store: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[EtcdBrokerProcess]]:
    """Three brokers and, last, a group coordinator (node 200)."""
    root = tmp_path_factory.mktemp("brokers")
    ports = free_loopback_ports(4)
    processes = [
        EtcdBrokerProcess(node_id, port, store, root / f"b{node_id}")
        for node_id, port in zip((1, 2, 3), ports, strict=False)
    ]
    processes.append(EtcdBrokerProcess(200, ports[3], store, root / "c200", role="coordinator"))
    try:
        for process in processes:
            process.start()
        # Every test starts on a formed cluster, whichever runs first (or alone).
        asyncio.run(wait_cluster_ready([p for p in processes if p.role == "broker"]))
        yield processes
    finally:
        for process in reversed(processes):
            process.terminate(timeout_s=15)


@pytest.fixture(scope="module")
def brokers(cluster: list[EtcdBrokerProcess]) -> list[EtcdBrokerProcess]:
    return [p for p in cluster if p.role == "broker"]


def bootstrap(brokers: list[EtcdBrokerProcess]) -> str:
    return ",".join(b.address for b in brokers if b.process is not None)


async def controller_claim(store: str) -> dict[str, int | str] | None:
    keys = await read_prefix(store)
    claim = keys.get(f"/highwater/{CLUSTER}/controller")
    return json.loads(claim.value) if claim is not None else None


async def active_claim(store: str) -> dict[str, int | str]:
    """The ``controller`` key once a candidate has claimed it: a test that runs first on
    freshly started brokers may ask before the election is over."""
    claim: dict[str, int | str] = await wait_for(lambda: controller_claim(store))
    return claim


async def create(
    bootstrap_servers: str, name: str, timeout_s: float = 60, replication_factor: int = 3
) -> None:
    """Create a topic and wait until every bootstrap broker was pushed it, with leaders."""
    async with AdminClient(bootstrap_servers, request_timeout_s=timeout_s) as admin:
        results = await admin.create_topics([NewTopic(name, 3, replication_factor)])
        results[name].raise_for_error()

    async def everywhere() -> bool:
        for address in bootstrap_servers.split(","):
            reply = await metadata(address, name)
            if reply is None or not reply.topics or reply.topics[0].error != ErrorCode.NONE:
                return False
            if any(p.leader_id < 0 for p in reply.topics[0].partitions):
                return False
        return True

    await wait_for(everywhere, timeout_s=timeout_s)


async def try_create(bootstrap_servers: str, name: str) -> AdminError | None:
    try:
        await create(bootstrap_servers, name, timeout_s=10)
    except AdminError as e:
        return e
    return None


_attempts = iter(range(10**6))


async def refusal(brokers: list[EtcdBrokerProcess], key: str) -> AdminError | None:
    """A topic creation's error once it names ``key`` (the controller reads etcd every
    tick, so the first attempts after an edit may still succeed)."""
    error = await try_create(bootstrap(brokers), f"attempt-{next(_attempts)}")
    return error if error is not None and key in str(error) else None


async def accepted(brokers: list[EtcdBrokerProcess]) -> bool:
    """Whether a topic creation succeeds (once the controller read a fixed key again)."""
    return await try_create(bootstrap(brokers), f"attempt-{next(_attempts)}") is None


async def produce(bootstrap_servers: str, topic: str, values: list[bytes]) -> None:
    """Write ``values`` to partition 0 with acks=all."""
    async with AsyncProducer({"bootstrap.servers": bootstrap_servers, "acks": "all"}) as producer:
        for value in values:
            await producer.send(topic, value, partition=0)


async def wait_cluster_ready(brokers: list[EtcdBrokerProcess]) -> None:
    """Every broker registered and pushed an image naming all three as live."""

    async def ready() -> bool:
        async with AdminClient(bootstrap(brokers), request_timeout_s=5) as admin:
            try:
                description = await admin.describe_cluster()
            except AdminError:
                return False
        return len(description.nodes) == 3 and description.controller_id is not None

    await wait_for(ready, timeout_s=90, interval_s=0.25)


@pytest.fixture(scope="module")
def orders(brokers: list[EtcdBrokerProcess]) -> None:
    """The topic the stories share, with ``a``, ``b``, ``c`` in partition 0: the first
    story writes it; a later one that runs first (or alone) finds it written here."""

    async def ensure() -> None:
        async with AdminClient(bootstrap(brokers)) as admin:
            if "orders" in [t.name for t in await admin.list_topics()]:
                return
        await create(bootstrap(brokers), "orders")
        await produce(bootstrap(brokers), "orders", [b"a", b"b", b"c"])

    asyncio.run(ensure())


async def describe(bootstrap_server: str) -> str:
    return await highwater_cli("cluster", "describe", "--bootstrap-server", bootstrap_server)


async def test_data_flows_and_describe_names_the_controller_and_the_mode(
    brokers: list[EtcdBrokerProcess], store: str
) -> None:
    await wait_cluster_ready(brokers)
    await create(bootstrap(brokers), "orders")
    keys = await read_prefix(store)
    state = json.loads(keys[f"/highwater/{CLUSTER}/brokers/topics/orders/partitions/0/state"].value)
    assert sorted(state["isr"]) == [1, 2, 3] and state["leader"] in state["isr"]
    assert state["controller_epoch"] >= 1
    await produce(bootstrap(brokers), "orders", [b"a", b"b", b"c"])
    assert await consume_all(bootstrap(brokers), "orders") == [b"a", b"b", b"c"]
    claim = await active_claim(store)
    output = await describe(brokers[0].address)
    assert f"ControllerId: {claim['broker_id']}" in output
    assert "MetadataMode: etcd" in output


async def test_the_liveness_stream_names_the_controller_and_fences_nothing(
    brokers: list[EtcdBrokerProcess], store: str
) -> None:
    """Brokers open a BrokerLiveness stream to the controller in both modes; here the
    active candidate answers it and holds it open, the others name the active one, and a
    stream's end fences nothing (the lease is the broker's liveness)."""
    claim = await active_claim(store)
    request = controller_pb2.BrokerLivenessRequest(broker_id=7, broker_epoch=1)
    for broker in brokers:
        async with open_channel(broker.address) as channel:
            call = controller_pb2_grpc.ControllerStub(channel).BrokerLiveness()
            await call.write(request)
            reply = await call.read()
            if broker.node_id == claim["broker_id"]:
                assert reply.error == ErrorCode.NONE
            else:
                assert reply.error == ErrorCode.NOT_CONTROLLER
                assert (reply.controller_id, reply.controller_address) == (
                    claim["broker_id"],
                    claim["address"],
                )
            call.cancel()
    for broker in brokers:
        assert "broker_liveness" not in broker.log_text()
    await wait_cluster_ready(brokers)  # nobody fenced


@pytest.mark.usefixtures("orders")
async def test_a_coordinator_in_the_etcd_mode_serves_a_consumer_group(
    brokers: list[EtcdBrokerProcess], cluster: list[EtcdBrokerProcess]
) -> None:
    async def coordinator_registered() -> bool:
        reply = await metadata(brokers[0].address, "orders")
        return reply is not None and [c.node_id for c in reply.coordinators] == [200]

    await wait_for(coordinator_registered, timeout_s=90, interval_s=0.25)
    args = [
        "consume",
        "--topic",
        "orders",
        "--group",
        "readers",
        "--from-beginning",
        "--max-messages",
        "3",
        "--timeout-ms",
        "60000",
        "--bootstrap-server",
        bootstrap(brokers),
    ]
    output = await highwater_cli(*args)
    assert [line for line in output.splitlines() if len(line) == 1] == ["a", "b", "c"]
    async with AdminClient(bootstrap(brokers)) as admin:
        offsets = await admin.list_consumer_group_offsets("readers")
    assert offsets[("orders", 0)].offset == 3


async def test_the_usual_topics_produce_and_consume_commands_work_against_any_broker(
    brokers: list[EtcdBrokerProcess],
) -> None:
    """The issue's interface: ``highwater topics``, ``produce`` and ``consume`` as in the
    KRaft mode, each against another broker of the etcd-mode cluster."""
    first, second, third = (b.address for b in brokers)
    common = ("--bootstrap-server",)
    await highwater_cli(
        "topics", "create", "--topic", "cli", "--partitions", "1",
        "--replication-factor", "3", *common, first,
    )  # fmt: skip

    async def described() -> str | None:
        output = await highwater_cli("topics", "describe", "--topic", "cli", *common, second)
        return output if "Leader: -1" not in output and "Leader:" in output else None

    output = await wait_for(described, timeout_s=30)
    assert "ReplicationFactor: 3" in output, output
    assert "cli" in (await highwater_cli("topics", "list", *common, third)).splitlines()
    await highwater_cli("produce", "--topic", "cli", *common, second, stdin=b"x\ny\nz\n")
    output = await highwater_cli(
        "consume", "--topic", "cli", "--from-beginning", "--max-messages", "3",
        "--timeout-ms", "30000", *common, third,
    )  # fmt: skip
    assert [line for line in output.splitlines() if len(line) == 1] == ["x", "y", "z"]


@pytest.mark.usefixtures("orders")
async def test_a_deposed_controllers_push_is_refused_by_its_epoch(
    brokers: list[EtcdBrokerProcess], store: str
) -> None:
    claim = await active_claim(store)
    stale = broker_metadata_pb2.UpdateMetadataRequest(
        controller_id=99, controller_epoch=int(claim["epoch"]) - 1, offset=10**9, records=[]
    )
    async with open_channel(brokers[0].address) as channel:
        reply = await broker_metadata_pb2_grpc.BrokerMetadataStub(channel).UpdateMetadata(stale)
    assert reply.error == ErrorCode.STALE_CONTROLLER_EPOCH
    async with AdminClient(brokers[0].address) as admin:
        assert "orders" in [t.name for t in await admin.list_topics()]  # no empty image


@pytest.mark.usefixtures("orders")
async def test_hand_edited_impossible_keys_are_refused_naming_the_key(
    brokers: list[EtcdBrokerProcess], store: str
) -> None:
    prefix = f"/highwater/{CLUSTER}/brokers/topics/orders"
    keys = await read_prefix(store)
    state_key = f"{prefix}/partitions/0/state"
    original_state = keys[state_key].value
    original_topic = keys[prefix].value

    state = json.loads(original_state)
    state["leader"] = next(b for b in (1, 2, 3) if b not in state["isr"][:1])
    state["isr"] = [b for b in state["isr"] if b != state["leader"]]
    await put_key(store, state_key, json.dumps(state).encode())

    error = await wait_for(lambda: refusal(brokers, state_key), timeout_s=30)
    assert "is not in the ISR" in str(error)
    for broker in brokers:  # nothing served from the impossible state: the last good one
        reply = await metadata(broker.address, "orders")
        assert reply is not None
        (served,) = [p for p in reply.topics[0].partitions if p.partition == 0]
        assert served.leader_id in served.isr and state["leader"] in served.isr
    await put_key(store, state_key, original_state)
    await wait_for(lambda: accepted(brokers), timeout_s=30)

    topic = json.loads(original_topic)
    topic["partitions"]["1"] = [1, 2, 42]
    await put_key(store, prefix, json.dumps(topic).encode())
    error = await wait_for(lambda: refusal(brokers, prefix + ":"), timeout_s=30)
    assert "broker 42, which never registered" in str(error)
    await put_key(store, prefix, original_topic)
    await wait_for(lambda: accepted(brokers), timeout_s=30)


@pytest.mark.usefixtures("orders")
async def test_with_etcd_stopped_brokers_serve_admin_calls_fail_clearly_and_all_recovers(
    brokers: list[EtcdBrokerProcess], store: str, etcd: EtcdServer
) -> None:
    before = await active_claim(store)
    controller = next(b for b in brokers if b.node_id == before["broker_id"])
    etcd.stop()
    try:
        await produce(bootstrap(brokers), "orders", [b"while-etcd-is-down"])
        error = await wait_for(lambda: try_create(bootstrap(brokers), "no-store"), timeout_s=30)
        assert "metadata store" in str(error) and "unreachable" in str(error)

        async def stepped_down() -> bool:  # its session expired: no controller now
            return "the etcd session expired" in controller.log_text()

        await wait_for(stepped_down, timeout_s=30)
        error = await try_create(bootstrap(brokers), "still-no-store")
        assert error is not None and "no controller" in str(error), error
    finally:
        etcd.start()
    await wait_for(lambda: accepted(brokers), timeout_s=60)
    after = await controller_claim(store)
    assert after is not None and int(after["epoch"]) > int(before["epoch"])
    assert (await consume_all(bootstrap(brokers), "orders"))[-1] == b"while-etcd-is-down"


@pytest.mark.usefixtures("orders")
async def test_etcd_paused_past_the_session_ttl_makes_the_controller_step_down(
    brokers: list[EtcdBrokerProcess], store: str, etcd: EtcdServer
) -> None:
    keys = await read_prefix(store)
    leases = {k: v.lease for k, v in keys.items() if "/brokers/ids/" in k}
    assert len(leases) == 3
    before = await active_claim(store)
    old_controller = next(b for b in brokers if b.node_id == before["broker_id"])
    etcd.pause()
    try:
        await asyncio.sleep(3.5)  # past the brokers' 2 s session TTL
    finally:
        etcd.resume()

    async def reregistered() -> bool:
        now = await read_prefix(store)
        renewed = {k: v.lease for k, v in now.items() if "/brokers/ids/" in k}
        claim = now.get(f"/highwater/{CLUSTER}/controller")
        return (
            renewed.keys() == leases.keys()
            and all(renewed[k] != leases[k] for k in leases)
            and claim is not None
            and json.loads(claim.value)["epoch"] > before["epoch"]
        )

    await wait_for(reregistered, timeout_s=60)
    assert "no longer the controller" in old_controller.log_text()
    # A broker whose key was gone a moment was fenced; its heartbeats unfence it.
    await wait_for(lambda: accepted(brokers), timeout_s=60)


async def test_a_topic_too_large_for_one_etcd_transaction_is_refused_naming_the_limit(
    brokers: list[EtcdBrokerProcess], store: str
) -> None:
    """A new topic's keys are written in one transaction (the assignment and each
    partition's state are valid only together); etcd takes 128 operations in one by
    default, so 200 partitions are refused with what to change, and nothing is written."""
    async with AdminClient(bootstrap(brokers), request_timeout_s=30) as admin:
        with pytest.raises(InvalidRequestError, match="--max-txn-ops"):
            await admin.create_topics([NewTopic("too-wide", 200, 3)])
    keys = await read_prefix(store)
    assert not [k for k in keys if "/topics/too-wide" in k]


async def test_killing_the_controllers_broker_elects_another_with_a_higher_epoch(
    brokers: list[EtcdBrokerProcess], store: str
) -> None:
    """The new controller fences the dead broker: it leaves the ISR of 200 partitions,
    more partition states than one etcd transaction holds (written in several)."""
    wide = ["wide-a", "wide-b"]
    async with AdminClient(bootstrap(brokers), request_timeout_s=60) as admin:
        for name in wide:  # one at a time: a request's topics are one transaction
            (await admin.create_topics([NewTopic(name, 100, 3)]))[name].raise_for_error()
    before = await active_claim(store)
    victim = next(b for b in brokers if b.node_id == before["broker_id"])
    victim.kill()

    async def new_controller() -> dict[str, int | str] | None:
        claim = await controller_claim(store)
        return claim if claim is not None and claim["broker_id"] != victim.node_id else None

    after = await wait_for(new_controller, timeout_s=30)
    assert int(after["epoch"]) > int(before["epoch"])
    survivor = next(b for b in brokers if b.process is not None)
    await create(survivor.address, "after-the-kill", replication_factor=2)
    output = await describe(survivor.address)
    assert f"ControllerId: {after['broker_id']}" in output

    async def fenced_out_of_every_isr() -> bool:
        keys = await read_prefix(store)
        states = [
            json.loads(v.value)
            for k, v in keys.items()
            if any(f"/topics/{name}/partitions/" in k for name in wide)
        ]
        return len(states) == 200 and all(
            victim.node_id not in s["isr"] and s["leader"] != victim.node_id for s in states
        )

    await wait_for(fenced_out_of_every_isr, timeout_s=60)


async def test_a_watch_streams_each_change_and_breaks_clearly_on_compaction(
    etcd: EtcdServer,
) -> None:
    """The controller's wake-up: a hand write under the prefix arrives as its revision; a
    watch from a compacted revision ends with the typed error (read in full, re-watch)."""
    connection = EtcdConnection(parse_metadata_store(f"etcd://{etcd.endpoint}/watched"))
    try:
        first = await connection.txn([], [Put("watched/a", b"1")])
        changes = connection.watch_prefix("watched/", first.revision)
        assert await asyncio.wait_for(anext(changes), 10) == first.revision
        second = await connection.txn([], [Put("watched/b", b"2"), Put("other/c", b"3")])
        assert await asyncio.wait_for(anext(changes), 10) == second.revision
        await changes.aclose()

        kv, _ = connection._stubs()
        await kv.Compact(aetcd_rpc.CompactionRequest(revision=second.revision))
        stale = connection.watch_prefix("watched/", first.revision)
        with pytest.raises(EtcdWatchBrokenError, match="compacted"):
            await asyncio.wait_for(anext(stale), 10)
    finally:
        await connection.close()


async def test_watched_changes_carry_keys_and_values_and_keep_a_view_equal_to_a_read(
    etcd: EtcdServer,
) -> None:
    """A woken candidate's read of only what changed: the events of puts and deletes,
    applied to a view loaded once, give what a whole read of the prefix gives."""
    connection = EtcdConnection(parse_metadata_store(f"etcd://{etcd.endpoint}/viewed"))
    try:
        await connection.txn([], [Put("viewed/a", b"1"), Put("viewed/b", b"2")])
        revision, keys = await connection.get_prefix("viewed/")
        view = PrefixView()
        view.watching_from(revision + 1)
        view.load(revision, keys)
        changes = connection.watch_prefix_changes("viewed/", revision + 1)
        put = await connection.txn([], [Put("viewed/a", b"3"), Put("other/x", b"4")])
        gone = await connection.txn([], [Delete("viewed/b"), Put("viewed/c", b"5")])
        while view.revision < gone.revision:
            response = await asyncio.wait_for(anext(changes), 10)
            assert response.revision in (put.revision, gone.revision)
            view.apply(KeyChange(*change) for change in response.changes)
        await changes.aclose()
        assert view.keys == (await connection.get_prefix("viewed/"))[1]
        assert {k: v.value for k, v in view.keys.items()} == {"viewed/a": b"3", "viewed/c": b"5"}
    finally:
        await connection.close()


@pytest.mark.parametrize("role", ["broker", "coordinator"])
def test_a_wrong_etcd_endpoint_fails_naming_it(role: str, tmp_path: Path) -> None:
    [port] = free_loopback_ports(1)
    data_dir = ["--data-dir", str(tmp_path)] if role == "broker" else []
    result = CliRunner().invoke(
        main,
        [
            role,
            "--node-id",
            "7",
            "--listen",
            f"127.0.0.1:{free_loopback_ports(1)[0]}",
            *data_dir,
            "--metadata-store",
            f"etcd://127.0.0.1:{port}",
        ],
    )
    assert result.exit_code == 1
    assert f"etcd at 127.0.0.1:{port} did not answer" in result.output


def test_a_data_directory_of_another_cluster_is_refused_naming_the_key(
    store: str, tmp_path: Path, brokers: list[EtcdBrokerProcess]
) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "meta.properties").write_text("version=1\ncluster.id=another-cluster\nnode.id=8\n")
    result = CliRunner().invoke(
        main,
        [
            "broker",
            "--node-id",
            "8",
            "--listen",
            f"127.0.0.1:{free_loopback_ports(1)[0]}",
            "--data-dir",
            str(tmp_path),
            "--metadata-store",
            store,
        ],
    )
    assert result.exit_code == 1
    assert f"etcd key /highwater/{CLUSTER}/cluster_id" in result.output
    assert "another-cluster" in result.output
