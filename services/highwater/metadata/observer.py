"""``MetadataObserver``: a replica of ``__cluster_metadata`` that follows the quorum without voting.

This is how brokers and group coordinators keep the cluster's metadata (KIP-500): a
:class:`~highwater.raft.driver.RaftServer` whose node id is not among the voters fetches
the log from the leader (or, when it starts empty or the entries it needs were cleaned
up, the leader's latest snapshot first, through FetchSnapshot), keeps it on disk like a
voter does, and hands what is committed to a
:class:`~highwater.metadata.state_machine.MetadataStateMachine`: :attr:`image` is the
committed :class:`~highwater.metadata.image.MetadataImage`. The leader lists it among the
observers of DescribeQuorum, with its directory id and no endpoint: like a Kafka broker it
has no controller listener to announce, and a leader refuses to make it a voter (it would
lead the quorum with no controller behind it). It never votes and never counts toward the
commit.

A static quorum's voters (``--voters``: ids and addresses) are fixed. A dynamic quorum's
(KIP-853, the voters a DescribeQuorum names with their directory ids) are only where the
observer starts: it follows the ``voters`` records it replicates (and the set a snapshot
carries) as any replica of a dynamic quorum does, asks the voters of the set in use for
the leader, and keeps the latest committed set in its ``quorum-voters`` file, so a
controller replaced on a new address is found without a restart. A DescribeQuorum names
the offset of its set's ``voters`` record (once committed): an observer that was down while
the voters changed (perhaps all of them, each to a new address) takes the described set at
its next start when it is newer than the one it kept.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc.aio

from highwater.errors import HighwaterError, InvalidConfigError
from highwater.internal.v1 import raft_pb2, raft_pb2_grpc
from highwater.metadata.image import MetadataImage
from highwater.metadata.state_machine import ImageListener, MetadataStateMachine
from highwater.raft.driver import RaftServer, RaftServerSettings
from highwater.raft.membership_service import voters_of
from highwater.raft.voter_set import VoterSet
from highwater.rpc.channels import open_channel
from highwater.rpc.server import GrpcService

__all__ = [
    "DescribedQuorum",
    "MetadataObserver",
    "ObserverIsVoterError",
    "QuorumUnreachableError",
    "QuorumVoters",
    "discover_quorum",
    "discover_quorum_to_register",
    "discover_voters",
]

QuorumVoters = Mapping[int, str] | VoterSet
"""A static quorum's voters (id -> ``HOST:PORT``) or a dynamic quorum's voter set."""


class QuorumUnreachableError(HighwaterError):
    """None of the controllers given answered DescribeQuorum with the voters."""


class ObserverIsVoterError(InvalidConfigError, ValueError):
    """An observer (a broker, a coordinator) given the node id of a voter: the two would
    answer to one id in the quorum, so it is refused, as Kafka's ``KafkaConfig`` refuses a
    broker-only node whose id is among ``controller.quorum.voters``."""


@dataclass(frozen=True, slots=True)
class DescribedQuorum:
    """What a controller's DescribeQuorum says of the quorum: its voters (a dynamic quorum's
    :class:`VoterSet` when the answer names directory ids, else the static voters), the
    cluster id (a quorum migrated from etcd mode has etcd's, not the one its voters would
    make), and the offset of the committed ``voters`` record the set comes from (-1: the
    bootstrap set, a static quorum, or a set not committed yet)."""

    voters: QuorumVoters
    cluster_id: str
    voters_offset: int = -1


async def discover_voters(controllers: Sequence[str], timeout_s: float = 30) -> dict[int, str]:
    """The quorum's voters (id -> address), from the first controller that names them."""
    voters = (await discover_quorum(controllers, timeout_s)).voters
    if isinstance(voters, VoterSet):
        return {voter.node_id: voter.endpoint for voter in voters}
    return dict(voters)


async def discover_quorum(controllers: Sequence[str], timeout_s: float = 30) -> DescribedQuorum:
    """The quorum as the first controller that names its voters describes it."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    problems: list[str] = []
    while True:
        for address in controllers:
            try:
                async with open_channel(address) as channel:
                    reply = await raft_pb2_grpc.RaftStub(channel).DescribeQuorum(
                        raft_pb2.DescribeQuorumRequest(), timeout=2
                    )
            except grpc.aio.AioRpcError as e:
                problems.append(f"{address}: {e.code().name}")
                continue
            if reply.nodes:
                voter_set = voters_of(reply)
                if voter_set is not None:
                    offset = reply.voters_offset if reply.HasField("voters_offset") else -1
                    return DescribedQuorum(voter_set, reply.cluster_id, offset)
                static = {node.node_id: node.address for node in reply.nodes}
                return DescribedQuorum(static, reply.cluster_id)
            problems.append(f"{address}: no voters named")
        if asyncio.get_running_loop().time() >= deadline:
            raise QuorumUnreachableError(
                f"no controller named the quorum's voters ({'; '.join(problems[-3:])})"
            )
        await asyncio.sleep(0.2)


async def discover_quorum_to_register(
    controllers: Sequence[str], who: str, timeout_ms: int
) -> DescribedQuorum:
    """:func:`discover_quorum` for a starting broker or coordinator (``who``): tried for
    its ``initial.broker.registration.timeout.ms``, the error naming that setting."""
    try:
        return await discover_quorum(controllers, timeout_ms / 1000)
    except QuorumUnreachableError as e:
        raise QuorumUnreachableError(
            f"{who} could not register with the controllers in {timeout_ms} ms "
            f"(initial.broker.registration.timeout.ms): {e}"
        ) from e


class MetadataObserver:
    """Follows the metadata quorum ``voters`` as observer ``node_id``, keeping the log and
    its snapshots in ``data_dir``. ``listen`` serves DescribeQuorum and health (port 0:
    any free port). ``voters``: a static quorum's addresses, or the voter set of a
    dynamic quorum, followed as it changes (see the module docstring); ``voters_offset``:
    the offset of that set's committed ``voters`` record, as :func:`discover_quorum`
    found it (-1: unknown or the bootstrap set)."""

    def __init__(
        self,
        *,
        node_id: int,
        voters: QuorumVoters,
        data_dir: Path,
        listen: str = "127.0.0.1:0",
        cluster_id: str | None = None,
        settings: RaftServerSettings | None = None,
        services: Sequence[GrpcService] = (),
        listener_name: str | None = None,
        more_listeners: Sequence[tuple[str, str]] = (),
        voters_offset: int = -1,
    ) -> None:
        """``services``: more gRPC services to serve on ``listen`` (a broker's);
        ``listener_name`` names that listener, ``more_listeners`` (name, ``HOST:PORT``) are
        the process's other listeners, serving the same."""
        dynamic, static = (voters, None) if isinstance(voters, VoterSet) else (None, voters)
        voter_ids = dynamic.ids if dynamic is not None else frozenset(static or {})
        if node_id in voter_ids:
            raise ObserverIsVoterError(
                f"the node id {node_id} must not be included in the set of voters "
                f"{','.join(str(v) for v in sorted(voter_ids))}: an observer (a broker, a "
                "coordinator) needs an id of its own"
            )
        self._machine = MetadataStateMachine()
        self._machine.add_listener(self._on_image)
        self._waiters: list[tuple[int, asyncio.Future[MetadataImage]]] = []
        self.raft = RaftServer(
            node_id=node_id,
            listen=listen,
            voters=static,
            initial_voters=dynamic,
            initial_voters_offset=voters_offset if dynamic is not None else -1,
            data_dir=data_dir,
            state_machine=self._machine,
            cluster_id=cluster_id,
            settings=settings,
            services=services,
            listener_name=listener_name,
            more_listeners=more_listeners,
            controller=False,
        )

    @property
    def node_id(self) -> int:
        return self.raft.node_id

    @property
    def image(self) -> MetadataImage:
        """Every committed record applied so far."""
        return self._machine.image

    @property
    def failure(self) -> BaseException | None:
        return self.raft.failure

    def add_listener(self, listener: ImageListener) -> None:
        """Call ``listener`` with each new committed image."""
        self._machine.add_listener(listener)

    async def start(self) -> None:
        await self.raft.start()

    async def stop(self) -> None:
        await self.raft.stop()
        for _, waiter in self._waiters:
            if not waiter.done():
                waiter.cancel()
        self._waiters.clear()

    async def wait_stopped(self) -> None:
        await self.raft.wait_stopped()

    async def wait_for_offset(self, offset: int) -> MetadataImage:
        """The first committed image that holds every record up to ``offset``."""
        if self.image.offset >= offset:
            return self.image
        waiter: asyncio.Future[MetadataImage] = asyncio.get_running_loop().create_future()
        self._waiters.append((offset, waiter))
        return await waiter

    def _on_image(self, image: MetadataImage) -> None:
        waiting = []
        for offset, waiter in self._waiters:
            if waiter.done():
                continue
            if image.offset >= offset:
                waiter.set_result(image)
            else:
                waiting.append((offset, waiter))
        self._waiters = waiting
