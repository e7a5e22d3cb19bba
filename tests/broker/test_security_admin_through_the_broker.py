"""ACLs and SCRAM credentials through the broker's own service on a real embedded server:
created or set, in the broker's image within a second, described and deleted, with
Kafka's codes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import grpc.aio
import pytest
from embedded_servers import free_port
from highwater.embedded import EmbeddedServer
from highwater.security import AclOperation, Decision, ResourceType
from highwater.security.scram import salted_password
from highwater.v1 import admin_pb2, broker_pb2_grpc
from highwater.v1.common_pb2 import ErrorCode

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[EmbeddedServer]:
    server = EmbeddedServer(listen=f"127.0.0.1:{free_port()}", data_dir=tmp_path)
    await server.start()
    await server.broker.wait_unfenced()
    try:
        yield server
    finally:
        await server.stop()


def acl(name: str, operation: int, principal: str = "User:alice") -> admin_pb2.AclEntry:
    return admin_pb2.AclEntry(
        resource_type=2,
        resource_name=name,
        pattern_type=3,
        principal=principal,
        host="*",
        operation=operation,
        permission_type=3,
    )


async def test_acls_are_created_seen_by_the_broker_described_and_deleted(
    server: EmbeddedServer,
) -> None:
    async with grpc.aio.insecure_channel(server.listen) as channel:
        broker = broker_pb2_grpc.BrokerStub(channel)
        created = await broker.CreateAcls(
            admin_pb2.CreateAclsRequest(
                creations=[acl("orders", 4), acl("orders", 3, "User:bob"), acl("x", 99)]
            )
        )
        assert [r.error for r in created.results] == [
            ErrorCode.NONE,
            ErrorCode.NONE,
            ErrorCode.INVALID_REQUEST,
        ]

        def decision() -> Decision:
            authorizer = server.broker.partitions.image.acls.authorizer()
            return authorizer.authorize(
                "User:alice", "127.0.0.1", AclOperation.WRITE, ResourceType.TOPIC, "orders"
            )

        for _ in range(100):
            if decision() is Decision.ALLOWED:
                break
            await asyncio.sleep(0.01)
        assert decision() is Decision.ALLOWED

        described = await broker.DescribeAcls(
            admin_pb2.DescribeAclsRequest(filter=admin_pb2.AclFilter(principal="User:bob"))
        )
        assert [(a.resource_name, a.operation) for a in described.acls] == [("orders", 3)]
        everything = await broker.DescribeAcls(admin_pb2.DescribeAclsRequest())
        assert len(everything.acls) == 2

        deleted = await broker.DeleteAcls(
            admin_pb2.DeleteAclsRequest(filters=[admin_pb2.AclFilter(principal="User:alice")])
        )
        assert [a.principal for a in deleted.results[0].deleted] == ["User:alice"]
        for _ in range(100):
            if decision() is Decision.DENIED:
                break
            await asyncio.sleep(0.01)
        assert decision() is Decision.DENIED

        bad = await broker.DescribeAcls(
            admin_pb2.DescribeAclsRequest(filter=admin_pb2.AclFilter(operation=77))
        )
        assert bad.error == ErrorCode.INVALID_REQUEST


async def test_scram_credentials_are_set_through_the_broker(server: EmbeddedServer) -> None:
    salt = b"0123456789abcdef"
    salted = salted_password("SCRAM-SHA-512", "s3cret", salt, 8192)
    async with grpc.aio.insecure_channel(server.listen) as channel:
        broker = broker_pb2_grpc.BrokerStub(channel)
        altered = await broker.AlterUserScramCredentials(
            admin_pb2.AlterUserScramCredentialsRequest(
                upsertions=[
                    admin_pb2.ScramCredentialUpsertion(
                        name="alice",
                        mechanism=2,
                        iterations=8192,
                        salt=salt,
                        salted_password=salted,
                    )
                ]
            )
        )
        assert [(r.user, r.error) for r in altered.results] == [("alice", ErrorCode.NONE)]
        described = await broker.DescribeUserScramCredentials(
            admin_pb2.DescribeUserScramCredentialsRequest()
        )
        assert [
            (r.user, [(c.mechanism, c.iterations) for c in r.credentials])
            for r in described.results
        ] == [("alice", [(2, 8192)])]
    for _ in range(100):
        if server.broker.partitions.image.scram.credential("alice", "SCRAM-SHA-512"):
            break
        await asyncio.sleep(0.01)
    stored = server.broker.partitions.image.scram.credential("alice", "SCRAM-SHA-512")
    assert stored is not None and stored.iterations == 8192
