"""The gRPC edge of KIP-853's membership changes: AddRaftVoter, RemoveRaftVoter,
UpdateRaftVoter, and a joining replica's discovery of the quorum it joins.

:class:`MembershipRaftServicer` is the ``highwater.internal.v1.Raft`` servicer with the three
membership RPCs added: each request is checked at the edge (the cluster id, a directory id
that parses, an endpoint that is ``HOST:PORT``), turned into the leader event of the core
(:meth:`~highwater.raft.driver.RaftServer.add_voter` and its siblings, which wait until the
new voter set is committed) and answered with the core's typed refusal when there is one:
NOT_LEADER_OR_FOLLOWER with the leader's id and endpoint, REQUEST_TIMED_OUT for a node
that is not caught up (or fetches under another directory id than the one asked) or a
change still in progress, INVALID_REQUEST for a duplicate
voter, an unknown voter or the last voter, UNSUPPORTED_VERSION for a static quorum.

:func:`send_voter_change` is a replica's request for itself: a voter's UpdateRaftVoter, sent
when the voter set names it at another endpoint than the one it serves on (it restarted on
a new address), and an auto-joining controller's RemoveRaftVoter (its former incarnation)
and AddRaftVoter (itself).
:func:`discover_quorum` is what ``--bootstrap-controllers`` does at a replica's first
start: it knows only addresses, asks them for DescribeQuorum and takes the cluster id and
the voters (ids, directory ids, endpoints) of the first answer that names them.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Literal, Protocol, TypeVar

import grpc
import grpc.aio

from highwater.errors import HighwaterError
from highwater.internal.v1 import raft_pb2, raft_pb2_grpc
from highwater.raft.messages import NO_LEADER
from highwater.raft.node import NotLeaderError
from highwater.raft.transport import RaftRequestHandler, RaftServicer
from highwater.raft.voter_set import (
    NO_DIRECTORY_ID,
    InvalidVoterError,
    MembershipChangeError,
    Voter,
    VoterSet,
)
from highwater.rpc.channels import open_channel
from highwater.rpc.endpoints import parse_endpoint
from highwater.v1.common_pb2 import ErrorCode

__all__ = [
    "MembershipRaftServicer",
    "QuorumDiscoveryError",
    "VoterChange",
    "discover_quorum",
    "send_voter_change",
]

_Response = TypeVar(
    "_Response",
    raft_pb2.AddRaftVoterResponse,
    raft_pb2.RemoveRaftVoterResponse,
    raft_pb2.UpdateRaftVoterResponse,
)


class QuorumDiscoveryError(HighwaterError):
    """``--bootstrap-controllers`` found no dynamic quorum to join."""

    code = ErrorCode.BROKER_NOT_AVAILABLE


class MembershipHandler(RaftRequestHandler, Protocol):
    """What the servicer turns membership requests into (the driver)."""

    @property
    def cluster_id(self) -> str: ...

    @property
    def leader_id(self) -> int | None: ...

    voters: dict[int, str]

    async def add_voter(self, voter: Voter) -> int: ...

    async def remove_voter(self, node_id: int, directory_id: uuid.UUID | None) -> int: ...

    async def update_voter(self, voter: Voter) -> int: ...


class MembershipRaftServicer(RaftServicer):
    """``highwater.internal.v1.Raft`` with AddRaftVoter, RemoveRaftVoter and UpdateRaftVoter."""

    def __init__(self, server: MembershipHandler) -> None:
        super().__init__(server)
        self._membership = server

    async def AddRaftVoter(
        self, request: raft_pb2.AddRaftVoterRequest, context: grpc.aio.ServicerContext
    ) -> raft_pb2.AddRaftVoterResponse:
        return await self._answer(
            request.cluster_id,
            raft_pb2.AddRaftVoterResponse,
            lambda: self._membership.add_voter(
                _voter(request.voter_id, request.voter_directory_id, request.endpoint)
            ),
        )

    async def RemoveRaftVoter(
        self, request: raft_pb2.RemoveRaftVoterRequest, context: grpc.aio.ServicerContext
    ) -> raft_pb2.RemoveRaftVoterResponse:
        def remove() -> Awaitable[int]:
            # A voter is named by its key, id and directory id: without a directory id the
            # request names the nil one, which no voter of a dynamic quorum has (KIP-853's
            # ZERO_UUID), so a retried or late removal of a controller replaced meanwhile
            # cannot remove its new incarnation.
            directory_id = (
                _directory_id(request.voter_directory_id)
                if request.voter_directory_id
                else NO_DIRECTORY_ID
            )
            return self._membership.remove_voter(_node_id(request.voter_id), directory_id)

        return await self._answer(request.cluster_id, raft_pb2.RemoveRaftVoterResponse, remove)

    async def UpdateRaftVoter(
        self, request: raft_pb2.UpdateRaftVoterRequest, context: grpc.aio.ServicerContext
    ) -> raft_pb2.UpdateRaftVoterResponse:
        return await self._answer(
            request.cluster_id,
            raft_pb2.UpdateRaftVoterResponse,
            lambda: self._membership.update_voter(
                _voter(request.voter_id, request.voter_directory_id, request.endpoint)
            ),
        )

    async def _answer(
        self,
        cluster_id: str,
        response_type: type[_Response],
        change: Callable[[], Awaitable[int]],
    ) -> _Response:
        server = self._membership
        try:
            if cluster_id and cluster_id != server.cluster_id:
                return response_type(
                    error=ErrorCode.INCONSISTENT_CLUSTER_ID,
                    error_message=f"this quorum is cluster {server.cluster_id!r}, not "
                    f"{cluster_id!r}",
                    leader_id=_or_no_leader(server.leader_id),
                )
            await change()
        except NotLeaderError as e:
            leader_id = e.leader_id if e.leader_id is not None else server.leader_id
            return response_type(
                error=ErrorCode.NOT_LEADER_OR_FOLLOWER,
                error_message=str(e),
                leader_id=_or_no_leader(leader_id),
                leader_endpoint=server.voters.get(leader_id, "") if leader_id is not None else "",
            )
        except MembershipChangeError as e:
            return response_type(
                error=e.code,
                error_message=str(e),
                leader_id=_or_no_leader(server.leader_id),
            )
        leader_id = server.leader_id
        return response_type(error=ErrorCode.NONE, leader_id=_or_no_leader(leader_id))


def _or_no_leader(leader_id: int | None) -> int:
    return NO_LEADER if leader_id is None else leader_id


def _node_id(value: int) -> int:
    if value < 0:
        raise InvalidVoterError(f"voter id {value} is negative")
    return value


def _directory_id(text: str) -> uuid.UUID:
    try:
        return uuid.UUID(text)
    except ValueError:
        raise InvalidVoterError(f"directory id {text!r} is not a uuid") from None


def _voter(node_id: int, directory_id: str, endpoint: str) -> Voter:
    try:
        host, port = parse_endpoint(endpoint)
    except ValueError as e:
        raise InvalidVoterError(f"voter endpoint: {e}") from None
    del host, port
    return Voter(_node_id(node_id), _directory_id(directory_id), endpoint)


VoterChange = Literal["add", "remove", "update"]


async def send_voter_change(
    leader: str, cluster_id: str, change: VoterChange, voter: Voter, *, timeout_s: float
) -> str | None:
    """Send AddRaftVoter, RemoveRaftVoter or UpdateRaftVoter for ``voter`` to the leader at
    ``leader``, as a replica asks for itself (its own endpoint now, or its auto-join);
    ``None`` once the leader answered that the new set is committed, else what went
    wrong (the caller asks again later)."""
    voter_id, directory_id = voter.node_id, str(voter.directory_id)
    try:
        async with open_channel(leader) as channel:
            stub = raft_pb2_grpc.RaftStub(channel)
            response: (
                raft_pb2.AddRaftVoterResponse
                | raft_pb2.RemoveRaftVoterResponse
                | raft_pb2.UpdateRaftVoterResponse
            )
            if change == "add":
                response = await stub.AddRaftVoter(
                    raft_pb2.AddRaftVoterRequest(
                        cluster_id=cluster_id,
                        voter_id=voter_id,
                        voter_directory_id=directory_id,
                        endpoint=voter.endpoint,
                    ),
                    timeout=timeout_s,
                )
            elif change == "remove":
                response = await stub.RemoveRaftVoter(
                    raft_pb2.RemoveRaftVoterRequest(
                        cluster_id=cluster_id, voter_id=voter_id, voter_directory_id=directory_id
                    ),
                    timeout=timeout_s,
                )
            else:
                response = await stub.UpdateRaftVoter(
                    raft_pb2.UpdateRaftVoterRequest(
                        cluster_id=cluster_id,
                        voter_id=voter_id,
                        voter_directory_id=directory_id,
                        endpoint=voter.endpoint,
                    ),
                    timeout=timeout_s,
                )
    except grpc.aio.AioRpcError as e:
        return f"{leader}: {e.code().name}"
    if response.error != ErrorCode.NONE:
        return f"{leader}: {ErrorCode.Name(response.error)}: {response.error_message}"
    return None


# --- discovery ---------------------------------------------------------------------------


async def _describe(address: str, timeout_s: float, max_message_bytes: int) -> object:
    try:
        async with open_channel(address, max_message_bytes=max_message_bytes) as channel:
            stub = raft_pb2_grpc.RaftStub(channel)
            return await stub.DescribeQuorum(raft_pb2.DescribeQuorumRequest(), timeout=timeout_s)
    except grpc.aio.AioRpcError as e:
        return f"{address}: {e.code().name}"


def voters_of(response: raft_pb2.DescribeQuorumResponse) -> VoterSet | None:
    """The voter set a DescribeQuorum answer names (``None`` if it names no directory ids:
    a static quorum's, or a replica that is not running)."""
    if not response.nodes or any(not node.directory_id for node in response.nodes):
        return None
    return VoterSet.of(
        Voter(node.node_id, uuid.UUID(node.directory_id), node.address) for node in response.nodes
    )


async def discover_quorum(
    addresses: Sequence[str], *, timeout_s: float, max_message_bytes: int | None = None
) -> tuple[str, VoterSet]:
    """The cluster id and voters of the dynamic quorum at ``addresses``, asking again until
    one answers within ``timeout_s``; raises :class:`QuorumDiscoveryError` otherwise."""
    deadline = time.monotonic() + timeout_s
    problems: list[str] = []
    while True:
        answers = await asyncio.gather(
            *(_describe(a, 2.0, max_message_bytes or 4 << 20) for a in addresses)
        )
        problems = []
        for address, answer in zip(addresses, answers, strict=True):
            if isinstance(answer, str):
                problems.append(answer)
                continue
            assert isinstance(answer, raft_pb2.DescribeQuorumResponse)
            if answer.nodes and not answer.nodes[0].directory_id:
                raise QuorumDiscoveryError(
                    f"the quorum at {address} is static (--voters): only a quorum started "
                    "with --initial-controllers takes new controllers"
                )
            voters = voters_of(answer)
            if voters is not None and answer.cluster_id:
                return answer.cluster_id, voters
            problems.append(f"{address}: {ErrorCode.Name(answer.error)}")
        if time.monotonic() >= deadline:
            raise QuorumDiscoveryError(
                "no controller of --bootstrap-controllers described its quorum: "
                + "; ".join(problems)
            )
        await asyncio.sleep(0.2)
