"""The Raft protocol's messages as plain values, what the pure core consumes and produces.

They mirror ``protos/highwater/internal/v1/raft.proto`` field for field; the gRPC edge converts.
Every message names its ``source`` and ``destination`` node ids so that the core, a
simulated network and the real transport route them the same way. Responses carry the
error code of the request they answer (``ErrorCode`` values from ``common.proto``).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from highwater.v1.common_pb2 import ErrorCode

NO_LEADER = -1
NONE = ErrorCode.NONE


@dataclass(frozen=True, slots=True)
class OffsetAndEpoch:
    """The end of a log prefix and the epoch of its last entry (also a snapshot's id)."""

    offset: int
    epoch: int


@dataclass(frozen=True, slots=True)
class VoteRequest:
    source: int
    destination: int
    cluster_id: str
    candidate_epoch: int
    last_offset_epoch: int
    last_offset: int
    pre_vote: bool = False
    voter_directory_id: uuid.UUID | None = None
    """The directory id the candidate's voter set gives the voter asked (KIP-853's voter
    key); ``None`` in a static quorum."""


@dataclass(frozen=True, slots=True)
class VoteResponse:
    source: int
    destination: int
    error: int
    leader_id: int
    leader_epoch: int
    vote_granted: bool
    pre_vote: bool = False


@dataclass(frozen=True, slots=True)
class BeginQuorumEpochRequest:
    source: int
    destination: int
    cluster_id: str
    leader_epoch: int


@dataclass(frozen=True, slots=True)
class BeginQuorumEpochResponse:
    source: int
    destination: int
    error: int
    leader_id: int
    leader_epoch: int


@dataclass(frozen=True, slots=True)
class EndQuorumEpochRequest:
    source: int
    destination: int
    cluster_id: str
    leader_epoch: int
    preferred_successors: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class EndQuorumEpochResponse:
    source: int
    destination: int
    error: int
    leader_id: int
    leader_epoch: int


@dataclass(frozen=True, slots=True)
class FetchRequest:
    source: int  # the replica fetching: a voter or an observer
    destination: int
    cluster_id: str
    current_leader_epoch: int
    fetch_offset: int
    last_fetched_epoch: int
    max_wait_ms: int = 500
    max_bytes: int = 1 << 20
    replica_directory_id: uuid.UUID | None = None
    """The fetching replica's directory id (KIP-853's replica key with ``source``); None in
    a static quorum. The leader counts a fetch as a voter's only from the incarnation the
    voter set names, and adds an observer as a voter only under the id it fetches with."""
    replica_endpoint: str = ""
    """The controller endpoint the fetching replica announces in a dynamic quorum: a
    controller's listener; empty for a broker's or a coordinator's metadata replica (and in
    a static quorum). The leader adds as a voter only an observer that announced one."""


@dataclass(frozen=True, slots=True)
class FetchResponse:
    source: int
    destination: int
    error: int
    leader_id: int
    leader_epoch: int
    high_watermark: int = -1
    log_start_offset: int = 0
    diverging_epoch: OffsetAndEpoch | None = None
    snapshot_id: OffsetAndEpoch | None = None
    records: bytes = b""
    # The position of the request this answers, echoed so that a follower can tell a
    # late or duplicated answer to an older fetch from the answer to its latest one
    # (-1: not echoed; the follower then relies on the transport's correlation).
    fetch_offset: int = -1
    last_fetched_epoch: int = -1


@dataclass(frozen=True, slots=True)
class FetchSnapshotRequest:
    source: int
    destination: int
    cluster_id: str
    current_leader_epoch: int
    snapshot_id: OffsetAndEpoch
    position: int
    max_bytes: int = 1 << 20
    replica_directory_id: uuid.UUID | None = None
    """The fetching replica's directory id, as :class:`FetchRequest` carries it: the leader
    counts a snapshot fetch as a voter's contact only from the incarnation the voter set
    names."""


@dataclass(frozen=True, slots=True)
class FetchSnapshotResponse:
    source: int
    destination: int
    error: int
    leader_id: int
    leader_epoch: int
    snapshot_id: OffsetAndEpoch | None = None
    size: int = 0
    position: int = 0
    chunk: bytes = b""


@dataclass(frozen=True, slots=True)
class ReplicaProgress:
    """One replica's state as the leader sees it (DescribeQuorum)."""

    replica_id: int
    log_end_offset: int = -1
    last_fetch_ms: int = -1
    last_caught_up_ms: int = -1
    directory_id: uuid.UUID | None = None
    """The directory id its fetches carry (None: a static quorum's, or not heard from)."""
    endpoint: str = ""
    """The controller endpoint its fetches announce (empty: none)."""


@dataclass(frozen=True, slots=True)
class QuorumDescription:
    leader_id: int
    leader_epoch: int
    high_watermark: int
    voters: tuple[ReplicaProgress, ...] = field(default_factory=tuple)
    observers: tuple[ReplicaProgress, ...] = field(default_factory=tuple)


RaftMessage = (
    VoteRequest
    | VoteResponse
    | BeginQuorumEpochRequest
    | BeginQuorumEpochResponse
    | EndQuorumEpochRequest
    | EndQuorumEpochResponse
    | FetchRequest
    | FetchResponse
    | FetchSnapshotRequest
    | FetchSnapshotResponse
)

REQUEST_TYPES: tuple[type, ...] = (
    VoteRequest,
    BeginQuorumEpochRequest,
    EndQuorumEpochRequest,
    FetchRequest,
    FetchSnapshotRequest,
)


def is_request(message: RaftMessage) -> bool:
    """Whether ``message`` asks for an answer (the rest are the answers)."""
    return isinstance(message, REQUEST_TYPES)
