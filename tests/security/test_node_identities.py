"""A node id's principal is in the metadata: after a controller failover, on a controller
whose process knows nothing of earlier calls, another principal claiming the node id is
refused (CLUSTER_AUTHORIZATION_FAILED naming it), and the principal that registered the
node goes on speaking for it.

Three controller voters in this process with the ACL checks on. The callers are
``User:broker-a`` and ``User:rogue``, each with a session token of the process (as a SASL
login gives), neither a super user, both allowed CLUSTER_ACTION (no ACL covers the
cluster and ``allow.everyone.if.no.acl.found`` is on), so only the node-id rule tells
them apart. The process's security state is made anew at the failover
(``auth.configure``), as a controller process that restarts or takes office has it: no
principal in memory. A principal that may forward admin calls cannot speak for another's
node by forwarding a broker's call in its name.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc.aio
import pytest
from embedded_servers import free_port
from highwater.controller.service import ControllerServer, ControllerSettings
from highwater.internal.v1 import controller_pb2 as pb
from highwater.internal.v1 import controller_pb2_grpc
from highwater.metadata import MetadataImage
from highwater.raft.driver import RaftServerSettings
from highwater.rpc import auth
from highwater.security.authentication import SESSION_METADATA_KEY
from highwater.v1.common_pb2 import ErrorCode
from raft_timing import FAST

pytestmark = pytest.mark.timeout(60)


class Quorum:
    """Three controller voters on loopback in this process."""

    def __init__(self, root: Path) -> None:
        self.voters = {n: f"127.0.0.1:{free_port()}" for n in (1, 2, 3)}
        self.servers = {
            n: ControllerServer(
                node_id=n,
                listen=address,
                voters=self.voters,
                data_dir=root / f"node-{n}",
                settings=ControllerSettings(raft=RaftServerSettings(raft=FAST), seed=7),
            )
            for n, address in self.voters.items()
        }

    async def active(self) -> ControllerServer:
        async with asyncio.timeout(20):
            while True:
                active = [s for s in self.servers.values() if s.is_active]
                if len(active) == 1:
                    return active[0]
                await asyncio.sleep(0.02)

    async def converged(self) -> MetadataImage:
        """The active controller's image, once every running voter has it."""
        active = await self.active()
        async with asyncio.timeout(20):
            while True:
                image = active.machine.image
                if active.store.pending_batches == 0 and all(
                    s.machine.image.offset == image.offset for s in self.servers.values()
                ):
                    return image
                await asyncio.sleep(0.02)

    async def stop(self, node_id: int) -> None:
        await self.servers.pop(node_id).stop()


SECURITY = auth.ServerSecurity(
    authorizer="acl",
    super_users=frozenset({"User:ANONYMOUS"}),
    allow_everyone_if_no_acl_found=True,
)
NODE = 7


def speaking_as(principal: str, *, forwarding: str | None = None) -> tuple[tuple[str, str], ...]:
    """A call as ``principal`` (its session token here), forwarding ``forwarding``'s."""
    token = auth.authenticator().tokens.issue(principal, "SCRAM-SHA-256", time.time() + 60)
    metadata = [(SESSION_METADATA_KEY, token)]
    if forwarding is not None:
        metadata.append((auth.FORWARDED_PRINCIPAL_KEY, f"127.0.0.1|{forwarding}"))
    return tuple(metadata)


@pytest.fixture
async def quorum(tmp_path: Path) -> AsyncIterator[Quorum]:
    auth.configure(SECURITY)
    quorum = Quorum(tmp_path)
    try:
        for server in quorum.servers.values():
            await server.start()
        yield quorum
    finally:
        for node_id in list(quorum.servers):
            await quorum.stop(node_id)


async def register(
    address: str, principal: str, incarnation: str, previous_epoch: int = -1
) -> pb.RegisterBrokerResponse:
    async with grpc.aio.insecure_channel(address) as channel:
        reply: pb.RegisterBrokerResponse = await controller_pb2_grpc.ControllerStub(
            channel
        ).RegisterBroker(
            pb.RegisterBrokerRequest(
                broker_id=NODE, incarnation_id=incarnation, previous_broker_epoch=previous_epoch
            ),
            metadata=speaking_as(principal),
            timeout=10,
        )
    return reply


async def heartbeat(
    address: str, principal: str, epoch: int, *, forwarding: str | None = None
) -> pb.BrokerHeartbeatResponse:
    async with grpc.aio.insecure_channel(address) as channel:
        reply: pb.BrokerHeartbeatResponse = await controller_pb2_grpc.ControllerStub(
            channel
        ).BrokerHeartbeat(
            pb.BrokerHeartbeatRequest(
                broker_id=NODE, broker_epoch=epoch, current_metadata_offset=epoch
            ),
            metadata=speaking_as(principal, forwarding=forwarding),
            timeout=10,
        )
    return reply


async def test_a_forged_node_id_is_refused_after_a_failover(quorum: Quorum) -> None:
    active = await quorum.active()
    address = quorum.voters[active.node_id]
    registered = await register(address, "User:broker-a", "first")
    assert registered.error == ErrorCode.NONE, registered
    image = await quorum.converged()
    registration = image.broker(NODE)
    assert registration is not None and registration.principal == "User:broker-a"

    # The active controller fails; the process state the rule used to live in is gone.
    await quorum.stop(active.node_id)
    auth.configure(SECURITY)
    successor = await quorum.active()
    address = quorum.voters[successor.node_id]

    forged = await register(address, "User:rogue", "forged")
    assert forged.error == ErrorCode.CLUSTER_AUTHORIZATION_FAILED, forged
    assert f"node {NODE}" in forged.error_message and "User:rogue" in forged.error_message
    beat = await heartbeat(address, "User:rogue", registered.broker_epoch)
    assert beat.error == ErrorCode.CLUSTER_AUTHORIZATION_FAILED, beat
    assert (await quorum.converged()).broker(NODE) == registration  # nothing changed

    # The node's own principal is not refused, and its new incarnation keeps the owner.
    beat = await heartbeat(address, "User:broker-a", registered.broker_epoch)
    assert beat.error == ErrorCode.NONE, beat
    again = await register(address, "User:broker-a", "second", registered.broker_epoch)
    assert again.error == ErrorCode.NONE, again
    renewed = (await quorum.converged()).broker(NODE)
    assert renewed is not None and renewed.principal == "User:broker-a"
    assert renewed.incarnation_id == "second"


async def test_a_broker_call_forwarded_in_another_principal_s_name_is_refused(
    quorum: Quorum,
) -> None:
    """Only admin calls are forwarded (KIP-590's forwardable APIs): a principal allowed
    CLUSTER_ACTION, so allowed to forward, that sends a heartbeat for another's node in
    that node's principal's name is refused, and the node's registration is untouched."""
    active = await quorum.active()
    address = quorum.voters[active.node_id]
    registered = await register(address, "User:broker-a", "first")
    assert registered.error == ErrorCode.NONE, registered
    registration = (await quorum.converged()).broker(NODE)

    beat = await heartbeat(
        address, "User:rogue", registered.broker_epoch, forwarding="User:broker-a"
    )
    assert beat.error == ErrorCode.CLUSTER_AUTHORIZATION_FAILED, beat
    assert "BrokerHeartbeat" in beat.error_message
    assert (await quorum.converged()).broker(NODE) == registration
