"""``highwater dev-cluster``: real processes come up, serve, and all stop on Ctrl-C."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import grpc
import pytest
from dev_cluster import dev_cluster
from highwater.client.admin import (
    AdminClient,
    NewTopic,
    OffsetAndMetadata,
    UnknownTopicOrPartitionError,
)
from highwater.client.errors import TopicAuthorizationFailedError
from highwater.config.server import read_properties
from highwater.v1 import broker_pb2, broker_pb2_grpc

pytestmark = pytest.mark.timeout(120)


def test_a_dev_cluster_serves_and_stops_every_process_it_started(tmp_path: Path) -> None:
    with dev_cluster(tmp_path, "--controllers", "1", "--brokers", "2") as cluster:
        bootstrap = cluster.bootstrap
        # 1 controller, 2 brokers, 2 coordinators.
        assert len(cluster.children) == 5, cluster.printed

        async def create_and_describe() -> list[int]:
            async with AdminClient(bootstrap) as admin:
                results = await admin.create_topics([NewTopic("dev", 2, 2)])
                assert results["dev"].error is None
                for _ in range(100):
                    # Brokers learn of the topic by replicating the metadata log: soon.
                    with contextlib.suppress(UnknownTopicOrPartitionError):
                        described = (await admin.describe_topics(["dev"]))["dev"]
                        if all(p.leader is not None for p in described.partitions):
                            return sorted(len(p.isr) for p in described.partitions)
                    await asyncio.sleep(0.1)
            raise AssertionError("no leaders")

        assert asyncio.run(create_and_describe()) == [2, 2]

        async def commit_and_read_group_offsets() -> dict[tuple[str, int], int]:
            async with AdminClient(bootstrap) as admin:
                await admin.alter_consumer_group_offsets(
                    "dev-group",
                    {("dev", 0): OffsetAndMetadata(7), ("dev", 1): OffsetAndMetadata(9)},
                )
                offsets = await admin.list_consumer_group_offsets("dev-group")
                offsets_topic = await admin.describe_topics(["__consumer_offsets"])
            assert offsets_topic["__consumer_offsets"].replication_factor == 2
            return {tp: o.offset for tp, o in offsets.items()}

        # The coordinators serve groups, their state on __consumer_offsets (2 replicas).
        assert asyncio.run(commit_and_read_group_offsets()) == {("dev", 0): 7, ("dev", 1): 9}
        cluster.stop()


def test_a_secure_dev_cluster_needs_its_certificates_and_acls(tmp_path: Path) -> None:
    """--secure: mutual TLS between every process, the ACLs on, and the admin's client
    properties printed; the admin creates a topic and uses a group, a client without a
    certificate gets nothing, and a SCRAM user without ACLs is refused."""
    with dev_cluster(
        tmp_path,
        *("--secure", "--controllers", "1", "--brokers", "1", "--coordinators", "1"),
        up="client properties",
    ) as cluster:
        bootstrap = cluster.bootstrap
        properties = cluster.fields["client properties"].split(" ")[0]
        admin_config = {"bootstrap.servers": bootstrap, **read_properties(Path(properties))}

        async def as_admin() -> dict[tuple[str, int], int]:
            async with AdminClient(admin_config) as admin:
                results = await admin.create_topics([NewTopic("dev", 1, 1)])
                assert results["dev"].error is None
                assert await admin.alter_user_scram_credentials(
                    [("mallory", "SCRAM-SHA-256", "mallory-pw")]
                ) == {"mallory": None}
                await admin.alter_consumer_group_offsets(
                    "dev-group", {("dev", 0): OffsetAndMetadata(0)}
                )
                offsets = await admin.list_consumer_group_offsets("dev-group")
            return {tp: o.offset for tp, o in offsets.items()}

        assert asyncio.run(as_admin()) == {("dev", 0): 0}

        # A client without the CA's certificate: refused in the handshake.
        with (
            grpc.insecure_channel(bootstrap.split(",")[0]) as channel,
            pytest.raises(grpc.RpcError) as refused,
        ):
            broker_pb2_grpc.BrokerStub(channel).Metadata(broker_pb2.MetadataRequest(), timeout=2)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE  # type: ignore[attr-defined]

        async def without_acls() -> list[str]:
            config = {
                **admin_config,
                "security.protocol": "SASL_SSL",
                "sasl.mechanism": "SCRAM-SHA-256",
                "sasl.username": "mallory",
                "sasl.password": "mallory-pw",
            }
            async with AdminClient(config) as mallory:
                created = await mallory.create_topics([NewTopic("mallory", 1, 1)])
                assert isinstance(created["mallory"].error, TopicAuthorizationFailedError)
                return [t.name for t in await mallory.list_topics()]

        assert asyncio.run(without_acls()) == []  # nothing it may describe
        cluster.stop()
