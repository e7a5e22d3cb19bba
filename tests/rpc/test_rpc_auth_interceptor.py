"""The server's AuthInterceptor keeps one admitting handler per method, and still checks
every call: an unauthorised caller is refused at each call, and an ACL added or removed in
the image applies from the next call on, and from the next message of a stream checked
whole."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import grpc.aio
import pytest
from highwater.internal.v1 import (
    controller_pb2_grpc,
    raft_pb2,
    raft_pb2_grpc,
    replication_pb2_grpc,
)
from highwater.internal.v1 import replication_pb2 as rpb
from highwater.metadata.image import AclsImage, MetadataImage
from highwater.rpc import auth
from highwater.rpc.server import bind, new_server
from highwater.security.acl import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
)
from highwater.v1 import admin_pb2 as admin
from highwater.v1.common_pb2 import ErrorCode

DESCRIBE_ACLS = "/highwater.internal.v1.Controller/DescribeAcls"
ANONYMOUS_MAY_DESCRIBE = AclBinding(
    ResourceType.CLUSTER,
    "kafka-cluster",
    PatternType.LITERAL,
    "User:ANONYMOUS",
    "*",
    AclOperation.DESCRIBE,
    AclPermissionType.ALLOW,
)


class Controller(controller_pb2_grpc.ControllerServicer):
    """Answers DescribeAcls, counting the calls that reached it."""

    def __init__(self) -> None:
        self.served = 0
        self.principals: list[str] = []

    async def DescribeAcls(
        self, request: admin.DescribeAclsRequest, context: grpc.aio.ServicerContext
    ) -> admin.DescribeAclsResponse:
        self.served += 1
        self.principals.append(auth.principal_of(context).principal)
        return admin.DescribeAclsResponse()


@dataclass
class Served:
    controller: Controller
    address: str
    image: MetadataImage

    def with_acls(self, *acls: AclBinding) -> None:
        self.image = dataclasses.replace(
            self.image, acls=AclsImage({f"acl-{i}": acl for i, acl in enumerate(acls)})
        )

    async def describe_acls(self) -> admin.DescribeAclsResponse:
        async with grpc.aio.insecure_channel(self.address) as channel:
            reply: admin.DescribeAclsResponse = await controller_pb2_grpc.ControllerStub(
                channel
            ).DescribeAcls(admin.DescribeAclsRequest(), timeout=10)
        return reply


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    auth.configure(auth.ServerSecurity(authorizer="acl"))
    controller = Controller()
    server = new_server(max_message_bytes=1 << 20)
    controller_pb2_grpc.add_ControllerServicer_to_server(controller, server)
    port = bind(server, "127.0.0.1:0")
    await server.start()
    state = Served(controller, f"127.0.0.1:{port}", MetadataImage.empty())
    auth.follow_image(lambda: state.image)
    try:
        yield state
    finally:
        await server.stop(0)


async def test_an_unauthorised_caller_is_refused_at_every_call(served: Served) -> None:
    for _ in range(3):
        reply = await served.describe_acls()
        assert reply.error == ErrorCode.CLUSTER_AUTHORIZATION_FAILED
        assert "User:ANONYMOUS may not DESCRIBE on the cluster" in reply.error_message
    assert served.controller.served == 0


async def test_an_acl_change_applies_from_the_next_call(served: Served) -> None:
    assert (await served.describe_acls()).error == ErrorCode.CLUSTER_AUTHORIZATION_FAILED

    served.with_acls(ANONYMOUS_MAY_DESCRIBE)
    for _ in range(2):
        assert (await served.describe_acls()).error == ErrorCode.NONE
    assert served.controller.served == 2

    served.with_acls()
    assert (await served.describe_acls()).error == ErrorCode.CLUSTER_AUTHORIZATION_FAILED
    assert served.controller.served == 2


async def test_an_unknown_method_stays_unimplemented(served: Served) -> None:
    async with grpc.aio.insecure_channel(served.address) as channel:
        call = channel.unary_unary(
            "/highwater.internal.v1.Controller/NoSuchMethod",
            request_serializer=admin.DescribeAclsRequest.SerializeToString,
            response_deserializer=admin.DescribeAclsResponse.FromString,
        )
        for _ in range(2):
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                await call(admin.DescribeAclsRequest(), timeout=10)
            assert raised.value.code() == grpc.StatusCode.UNIMPLEMENTED


@pytest.mark.parametrize("principal", ["User:jösé", "User:ops\tteam", "User:plain"])
async def test_a_forwarded_principal_of_any_name_reaches_the_controller(
    served: Served, principal: str
) -> None:
    """A broker forwards its caller's principal whatever its name: a SCRAM user's or a
    token's subject may be any Unicode, which gRPC's text metadata cannot carry."""
    served.with_acls(
        dataclasses.replace(ANONYMOUS_MAY_DESCRIBE, operation=AclOperation.CLUSTER_ACTION),
        dataclasses.replace(ANONYMOUS_MAY_DESCRIBE, principal=principal),
    )

    async def forward() -> admin.DescribeAclsResponse:
        auth.serve_as(auth.CallPrincipal(principal, "10.0.0.9", "SCRAM-SHA-256"))
        async with grpc.aio.insecure_channel(served.address) as channel:
            reply: admin.DescribeAclsResponse = await controller_pb2_grpc.ControllerStub(
                channel
            ).DescribeAcls(
                admin.DescribeAclsRequest(),
                metadata=auth.forwarded_principal_metadata(None),
                timeout=10,
            )
        return reply

    reply = await asyncio.create_task(forward())  # its own context: serve_as stays there
    assert reply.error == ErrorCode.NONE, reply
    assert served.controller.principals == [principal]


async def test_allow_everyone_does_not_let_a_caller_forward_as_another(served: Served) -> None:
    """With ``allow.everyone.if.no.acl.found`` and no ACL on the cluster, every caller is
    allowed CLUSTER_ACTION; taking a forwarded principal on that alone would let any
    client call as a super user. Forwarding needs a super user or an ACL granting
    CLUSTER_ACTION; the call itself is still served as its own caller's."""
    auth.configure(
        auth.ServerSecurity(
            authorizer="acl",
            super_users=frozenset({"User:admin"}),
            allow_everyone_if_no_acl_found=True,
        )
    )

    async def call(metadata: Any) -> admin.DescribeAclsResponse:
        async with grpc.aio.insecure_channel(served.address) as channel:
            reply: admin.DescribeAclsResponse = await controller_pb2_grpc.ControllerStub(
                channel
            ).DescribeAcls(admin.DescribeAclsRequest(), metadata=metadata, timeout=10)
        return reply

    forging = ((auth.FORWARDED_PRINCIPAL_KEY, "127.0.0.1|User:admin"),)
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await call(forging)
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "User:ANONYMOUS may not forward calls" in (refused.value.details() or "")
    assert served.controller.principals == []
    assert (await call(())).error == ErrorCode.NONE  # allowed as itself, by allow-everyone

    # An ACL granting CLUSTER_ACTION makes the caller a forwarder.
    served.with_acls(
        dataclasses.replace(ANONYMOUS_MAY_DESCRIBE, operation=AclOperation.CLUSTER_ACTION)
    )
    assert (await call(forging)).error == ErrorCode.NONE
    assert served.controller.principals == ["User:ANONYMOUS", "User:admin"]


class Quorum(raft_pb2_grpc.RaftServicer):
    async def DescribeQuorum(
        self, request: raft_pb2.DescribeQuorumRequest, context: grpc.aio.ServicerContext
    ) -> raft_pb2.DescribeQuorumResponse:
        return raft_pb2.DescribeQuorumResponse(cluster_id="c")


async def test_describe_quorum_is_an_operators_and_the_services_own(served: Served) -> None:
    """DescribeQuorum needs DESCRIBE on the cluster (Kafka's rule, an operator's) or
    CLUSTER_ACTION: a broker or coordinator process asks it at its start to find the
    voters, and the services may be granted CLUSTER_ACTION alone rather than be super
    users (docs/security.md)."""
    server = new_server(max_message_bytes=1 << 20)
    raft_pb2_grpc.add_RaftServicer_to_server(Quorum(), server)
    port = bind(server, "127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = raft_pb2_grpc.RaftStub(channel)
            for operation in (AclOperation.CLUSTER_ACTION, AclOperation.DESCRIBE):
                served.with_acls(dataclasses.replace(ANONYMOUS_MAY_DESCRIBE, operation=operation))
                reply = await stub.DescribeQuorum(raft_pb2.DescribeQuorumRequest(), timeout=10)
                assert reply.cluster_id == "c"
            idempotent = AclOperation.IDEMPOTENT_WRITE  # implies no DESCRIBE (READ would)
            served.with_acls(dataclasses.replace(ANONYMOUS_MAY_DESCRIBE, operation=idempotent))
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.DescribeQuorum(raft_pb2.DescribeQuorumRequest(), timeout=10)
            assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert "may not DESCRIBE on the cluster" in (refused.value.details() or "")
    finally:
        await server.stop(0)


class Replicas(replication_pb2_grpc.ReplicaFetchServiceServicer):
    """Answers each ReplicaFetch request of a stream, counting them."""

    def __init__(self) -> None:
        self.served = 0

    async def ReplicaFetch(
        self,
        request_iterator: AsyncIterator[rpb.ReplicaFetchRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[rpb.ReplicaFetchResponse]:
        async for _request in request_iterator:
            self.served += 1
            yield rpb.ReplicaFetchResponse()


async def test_a_stream_checked_whole_ends_at_its_next_message_once_its_acl_is_removed(
    served: Served,
) -> None:
    """Kafka checks CLUSTER_ACTION on every follower fetch: a follower stream (or a Raft
    fetch stream, a broker's liveness stream) whose ACL is removed while it is open is
    refused at its next message, not served on until it reconnects."""
    anonymous_may_act = dataclasses.replace(
        ANONYMOUS_MAY_DESCRIBE, operation=AclOperation.CLUSTER_ACTION
    )
    served.with_acls(anonymous_may_act)
    replicas = Replicas()
    server = new_server(max_message_bytes=1 << 20)
    replication_pb2_grpc.add_ReplicaFetchServiceServicer_to_server(replicas, server)
    port = bind(server, "127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = replication_pb2_grpc.ReplicaFetchServiceStub(channel).ReplicaFetch(timeout=10)
            for _ in range(2):
                await call.write(rpb.ReplicaFetchRequest(replica_id=2))
                assert (await call.read()).error == ErrorCode.NONE
            served.with_acls()
            await call.write(rpb.ReplicaFetchRequest(replica_id=2))
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await call.read()
            assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert "CLUSTER_AUTHORIZATION_FAILED: User:ANONYMOUS may not CLUSTER_ACTION" in (
                refused.value.details() or ""
            )
        assert replicas.served == 2
    finally:
        await server.stop(0)


@dataclass(frozen=True)
class CallDetails:
    """What the server hands an interceptor about a call: its method and metadata."""

    method: str
    invocation_metadata: Sequence[tuple[str, str]] = ()


async def test_each_method_s_handler_is_looked_up_and_wrapped_once() -> None:
    interceptor = auth.AuthInterceptor()
    looked_up: list[str] = []

    async def behaviour(request: Any, context: Any) -> Any:
        return request

    async def continuation(details: CallDetails) -> grpc.RpcMethodHandler | None:
        looked_up.append(details.method)
        if details.method != DESCRIBE_ACLS:
            return None
        return grpc.unary_unary_rpc_method_handler(behaviour)

    first = await interceptor.intercept_service(continuation, CallDetails(DESCRIBE_ACLS))
    again = await interceptor.intercept_service(continuation, CallDetails(DESCRIBE_ACLS))
    assert first is again and first.unary_unary is not behaviour
    assert await interceptor.intercept_service(continuation, CallDetails("/x.Y/Z")) is None
    assert await interceptor.intercept_service(continuation, CallDetails("/x.Y/Z")) is None
    assert looked_up == [DESCRIBE_ACLS, "/x.Y/Z"]
