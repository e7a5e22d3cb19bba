"""The AdminClient against a real in-process EmbeddedServer: topics, partitions, configs, errors.

Each test starts an :class:`EmbeddedServer` (a single-voter controller and one broker on
one free loopback port) and administers it over gRPC, as an application would.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from embedded_servers import free_port
from highwater.client.admin import (
    AdminClient,
    BrokerUnavailableError,
    ConfigSource,
    CreateTopicResult,
    ElectionNotNeededError,
    ElectionType,
    InvalidConfigurationError,
    InvalidPartitionsError,
    InvalidReplicaAssignmentError,
    InvalidReplicationFactorError,
    InvalidTopicNameError,
    NewTopic,
    TopicExistsError,
    UnknownTopicOrPartitionError,
)
from highwater.embedded import EMBEDDED_NODE_ID, EmbeddedServer
from highwater.errors import InvalidTopicError
from highwater.raft.driver import RaftServerSettings
from highwater.rpc.channels import MAX_MESSAGE_BYTES
from highwater.v1.common_pb2 import ErrorCode

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[EmbeddedServer]:
    """A running embedded server whose broker is unfenced."""
    embedded = EmbeddedServer(listen=f"127.0.0.1:{free_port()}", data_dir=tmp_path)
    await embedded.start()
    try:
        await embedded.broker.wait_unfenced()
        yield embedded
    finally:
        await embedded.stop()


@pytest.fixture
async def admin(server: EmbeddedServer) -> AsyncIterator[AdminClient]:
    """An admin client bootstrapped from the server's one address."""
    async with AdminClient(server.listen, request_timeout_s=10.0) as client:
        yield client


async def test_created_topics_are_listed_and_described(admin: AdminClient) -> None:
    results = await admin.create_topics(
        [NewTopic("orders", 3, 1), NewTopic("payments", 1, 1, config={"retention.ms": "60000"})]
    )
    assert set(results) == {"orders", "payments"}
    orders = results["orders"]
    assert isinstance(orders, CreateTopicResult)
    assert orders.succeeded and orders.error is None
    assert (orders.num_partitions, orders.replication_factor) == (3, 1)
    assert orders.topic_id

    assert [t.name for t in await admin.list_topics()] == ["orders", "payments"]
    described = await admin.describe_topics(["orders"])
    description = described["orders"]
    assert description.topic_id == orders.topic_id
    assert not description.is_internal
    assert description.replication_factor == 1
    assert [p.partition for p in description.partitions] == [0, 1, 2]
    for p in description.partitions:
        assert p.leader == EMBEDDED_NODE_ID
        assert p.leader_epoch >= 0
        assert p.replicas == (EMBEDDED_NODE_ID,)
        assert p.isr == (EMBEDDED_NODE_ID,)
        assert p.offline_replicas == ()


async def test_validate_only_creates_nothing(admin: AdminClient) -> None:
    results = await admin.create_topics([NewTopic("dry-run", 2, 1)], validate_only=True)
    assert results["dry-run"].succeeded
    assert await admin.list_topics() == []


async def test_default_partitions_and_an_explicit_assignment(admin: AdminClient) -> None:
    results = await admin.create_topics(
        [
            NewTopic("defaults"),
            NewTopic("placed", replica_assignment={0: [EMBEDDED_NODE_ID], 1: [EMBEDDED_NODE_ID]}),
            NewTopic("nowhere", replica_assignment={0: [7]}),
        ]
    )
    assert results["defaults"].succeeded
    assert results["defaults"].num_partitions >= 1
    assert results["placed"].num_partitions == 2
    assert isinstance(results["nowhere"].error, InvalidReplicaAssignmentError)
    with pytest.raises(InvalidReplicaAssignmentError, match=r"partitions 0\.\.0"):
        await admin.create_topics([NewTopic("gap", replica_assignment={1: [1]})])


async def test_per_topic_errors_are_typed_and_do_not_fail_the_others(
    admin: AdminClient,
) -> None:
    await admin.create_topics([NewTopic("taken", 1, 1)])
    results = await admin.create_topics(
        [
            NewTopic("fine", 1, 1),
            NewTopic("bad name!", 1, 1),
            NewTopic("taken", 1, 1),
            NewTopic("wide", 1, 3),
            NewTopic("odd-config", 1, 1, config={"no.such.config": "1"}),
            NewTopic("bad-value", 1, 1, config={"retention.ms": "soon"}),
            NewTopic("empty", 0, 1),
        ]
    )
    assert results["fine"].succeeded
    assert isinstance(results["bad name!"].error, InvalidTopicNameError)
    # Also the storage layer's error type, for callers that catch that one.
    assert isinstance(results["bad name!"].error, InvalidTopicError)
    assert "illegal" in str(results["bad name!"].error)
    assert isinstance(results["taken"].error, TopicExistsError)
    wide = results["wide"].error
    assert isinstance(wide, InvalidReplicationFactorError)
    assert wide.code == ErrorCode.INVALID_REPLICATION_FACTOR
    assert wide.code_name == "INVALID_REPLICATION_FACTOR"
    assert "1 broker" in wide.message
    assert isinstance(results["odd-config"].error, InvalidConfigurationError)
    assert "no.such.config" in str(results["odd-config"].error)
    assert isinstance(results["bad-value"].error, InvalidConfigurationError)
    assert isinstance(results["empty"].error, InvalidPartitionsError)
    with pytest.raises(InvalidReplicationFactorError):
        results["wide"].raise_for_error()
    assert [t.name for t in await admin.list_topics()] == ["fine", "taken"]


async def test_delete_topics(admin: AdminClient) -> None:
    await admin.create_topics([NewTopic("doomed", 2, 1), NewTopic("kept", 1, 1)])
    results = await admin.delete_topics(["doomed", "ghost"])
    assert results["doomed"].succeeded
    assert isinstance(results["ghost"].error, UnknownTopicOrPartitionError)
    assert [t.name for t in await admin.list_topics()] == ["kept"]
    with pytest.raises(UnknownTopicOrPartitionError, match="'doomed' does not exist"):
        await admin.describe_topics(["doomed"])


async def test_create_partitions_grows_a_topic_and_never_shrinks_it(admin: AdminClient) -> None:
    await admin.create_topics([NewTopic("growing", 1, 1)])
    assert (await admin.create_partitions({"growing": 4}))["growing"].succeeded
    described = (await admin.describe_topics(["growing"]))["growing"]
    assert [p.partition for p in described.partitions] == [0, 1, 2, 3]
    assert all(p.leader == EMBEDDED_NODE_ID for p in described.partitions)

    results = await admin.create_partitions({"growing": 2, "ghost": 3})
    assert isinstance(results["growing"].error, InvalidPartitionsError)
    assert isinstance(results["ghost"].error, UnknownTopicOrPartitionError)
    same = await admin.create_partitions({"growing": 4})
    assert isinstance(same["growing"].error, InvalidPartitionsError)
    checked = await admin.create_partitions({"growing": 6}, validate_only=True)
    assert checked["growing"].succeeded
    assert len((await admin.describe_topics(["growing"]))["growing"].partitions) == 4


async def test_configs_are_described_altered_and_deleted(admin: AdminClient) -> None:
    await admin.create_topics([NewTopic("conf", 1, 1, config={"retention.ms": "1000"})])
    configs = await admin.describe_configs("conf")
    assert configs["retention.ms"].value == "1000"
    assert configs["retention.ms"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG
    assert not configs["retention.ms"].is_default
    assert configs["cleanup.policy"].is_default
    assert configs["cleanup.policy"].value == "delete"
    assert configs["retention.ms"].type == "long"

    await admin.alter_configs("conf", {"cleanup.policy": "compact", "retention.ms": None})
    configs = await admin.describe_configs("conf")
    assert configs["cleanup.policy"].value == "compact"
    assert configs["cleanup.policy"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG
    assert configs["retention.ms"].is_default  # the override is gone
    overrides = {n: e.value for n, e in configs.items() if not e.is_default}
    assert overrides == {"cleanup.policy": "compact"}

    only = await admin.describe_configs("conf", ["cleanup.policy"])
    assert list(only) == ["cleanup.policy"]

    # validate_only checks without changing anything.
    await admin.alter_configs("conf", {"segment.bytes": "1048576"}, validate_only=True)
    assert (await admin.describe_configs("conf"))["segment.bytes"].is_default


async def test_config_errors_are_raised_and_change_nothing(admin: AdminClient) -> None:
    await admin.create_topics([NewTopic("strict", 1, 1)])
    with pytest.raises(InvalidConfigurationError, match=r"no\.such\.config"):
        await admin.alter_configs("strict", {"retention.ms": "5", "no.such.config": "1"})
    with pytest.raises(InvalidConfigurationError, match=r"retention\.ms"):
        await admin.alter_configs("strict", {"retention.ms": "forever"})
    assert (await admin.describe_configs("strict"))["retention.ms"].is_default
    with pytest.raises(UnknownTopicOrPartitionError):
        await admin.alter_configs("ghost", {"retention.ms": "5"})
    with pytest.raises(UnknownTopicOrPartitionError):
        await admin.describe_configs("ghost")


async def test_describe_cluster_lists_the_broker(
    server: EmbeddedServer, admin: AdminClient
) -> None:
    cluster = await admin.describe_cluster()
    assert [node.node_id for node in cluster.nodes] == [EMBEDDED_NODE_ID]
    assert cluster.nodes[0].address == server.listen
    # The broker's Metadata does not name the controller yet: unknown is None, not -1.
    assert cluster.controller_id is None or cluster.controller_id == EMBEDDED_NODE_ID


async def test_elect_leaders_reports_each_partition(admin: AdminClient) -> None:
    await admin.create_topics([NewTopic("led", 2, 1)])
    results = await admin.elect_leaders("preferred", [("led", 0), ("led", 1), ("ghost", 0)])
    assert isinstance(results[("led", 0)], ElectionNotNeededError)
    assert isinstance(results[("led", 1)], ElectionNotNeededError)
    assert isinstance(results[("ghost", 0)], UnknownTopicOrPartitionError)
    # Every partition: only those that needed an election are reported.
    assert await admin.elect_leaders(ElectionType.UNCLEAN) == {}


async def test_describe_of_an_unknown_topic_raises(admin: AdminClient) -> None:
    await admin.create_topics([NewTopic("known", 1, 1)])
    with pytest.raises(UnknownTopicOrPartitionError, match="'unknown' does not exist"):
        await admin.describe_topics(["known", "unknown"])
    assert await admin.describe_topics([]) == {}


async def test_an_unreachable_cluster_is_a_clear_error(tmp_path: Path) -> None:
    address = f"127.0.0.1:{free_port()}"
    async with AdminClient(address, request_timeout_s=0.5) as admin:
        with pytest.raises(BrokerUnavailableError, match="no bootstrap broker answered"):
            await admin.list_topics()


async def test_bad_bootstrap_addresses_are_refused() -> None:
    with pytest.raises(ValueError, match="HOST:PORT"):
        AdminClient("localhost")
    with pytest.raises(ValueError, match=r"bootstrap\.servers"):
        AdminClient({"client.id": "x"})
    client = AdminClient({"bootstrap.servers": "a:1, b:2"})
    assert client.bootstrap_servers == ("a:1", "b:2")
    assert client.controllers == ("a:1", "b:2")
    await client.close()
    with pytest.raises(RuntimeError, match="closed"):
        await client.list_topics()


async def test_the_admins_channels_take_the_messages_the_servers_send() -> None:
    # One limit for both ends: the servers' (every process's one gRPC server) and the admin
    # client's channels to the brokers and the controllers, from the shared rpc layer.
    server_limit = RaftServerSettings().max_message_bytes
    assert server_limit == MAX_MESSAGE_BYTES
    async with AdminClient("127.0.0.1:1", controllers="127.0.0.1:2") as client:
        assert client.cluster._max_message_bytes == server_limit
        assert client._controller._max_message_bytes == server_limit


def test_the_controller_api_enums_are_still_exported() -> None:
    """``ElectionType`` and ``ConfigSource`` come from the Controller API's messages, which
    the module imports only when they (or a controller call) are first used."""
    from highwater.client import admin
    from highwater.controller_api import messages

    assert admin.ElectionType is messages.ElectionType
    assert admin.ConfigSource is messages.ConfigSource
    assert {"ElectionType", "ConfigSource"} <= set(admin.__all__)
    with pytest.raises(AttributeError, match="no attribute 'Nothing'"):
        admin.Nothing  # noqa: B018
