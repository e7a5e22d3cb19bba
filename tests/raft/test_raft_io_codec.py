"""The gRPC edge's conversions: every Raft message survives protobuf and back."""

from __future__ import annotations

import uuid

import pytest
from highwater.errors import InvalidRequestError
from highwater.internal.v1 import raft_pb2 as pb
from highwater.raft.codec import (
    RESPONSE_FOR,
    RaftRequest,
    RaftResponse,
    describe_quorum_from_proto,
    describe_quorum_to_proto,
    request_from_proto,
    request_to_proto,
    response_from_proto,
    response_to_proto,
)
from highwater.raft.messages import (
    BeginQuorumEpochRequest,
    BeginQuorumEpochResponse,
    EndQuorumEpochRequest,
    EndQuorumEpochResponse,
    FetchRequest,
    FetchResponse,
    FetchSnapshotRequest,
    FetchSnapshotResponse,
    OffsetAndEpoch,
    QuorumDescription,
    ReplicaProgress,
    VoteRequest,
    VoteResponse,
)
from highwater.v1.common_pb2 import ErrorCode

REQUESTS: list[RaftRequest] = [
    VoteRequest(1, 2, "c", candidate_epoch=5, last_offset_epoch=4, last_offset=99),
    VoteRequest(1, 3, "c", candidate_epoch=5, last_offset_epoch=4, last_offset=99, pre_vote=True),
    BeginQuorumEpochRequest(1, 2, "c", leader_epoch=5),
    EndQuorumEpochRequest(1, 3, "c", leader_epoch=5, preferred_successors=(3, 2)),
    FetchRequest(
        2,
        1,
        "c",
        current_leader_epoch=5,
        fetch_offset=120,
        last_fetched_epoch=4,
        max_wait_ms=500,
        max_bytes=4096,
    ),
    FetchSnapshotRequest(
        2, 1, "c", current_leader_epoch=5, snapshot_id=OffsetAndEpoch(100, 3), position=2048
    ),
    VoteRequest(1, 2, "c", 5, 4, 99, voter_directory_id=uuid.UUID(int=7)),  # KIP-853's key
    FetchRequest(2, 1, "c", 5, 120, 4, replica_directory_id=uuid.UUID(int=8)),  # the fetcher's
    FetchSnapshotRequest(
        2, 1, "c", 5, OffsetAndEpoch(100, 3), 0, replica_directory_id=uuid.UUID(int=8)
    ),
]

RESPONSES: list[tuple[RaftResponse, RaftRequest]] = [
    (
        VoteResponse(2, 1, ErrorCode.NONE, leader_id=-1, leader_epoch=5, vote_granted=True),
        REQUESTS[0],
    ),
    (
        VoteResponse(
            3, 1, ErrorCode.NONE, leader_id=3, leader_epoch=5, vote_granted=False, pre_vote=True
        ),
        REQUESTS[1],
    ),
    (
        BeginQuorumEpochResponse(2, 1, ErrorCode.FENCED_LEADER_EPOCH, leader_id=3, leader_epoch=6),
        REQUESTS[2],
    ),
    (EndQuorumEpochResponse(3, 1, ErrorCode.NONE, leader_id=1, leader_epoch=5), REQUESTS[3]),
    (
        FetchResponse(
            1,
            2,
            ErrorCode.NONE,
            leader_id=1,
            leader_epoch=5,
            high_watermark=118,
            log_start_offset=100,
            records=b"\x00batches",
            fetch_offset=120,
            last_fetched_epoch=4,
        ),
        REQUESTS[4],
    ),
    (
        FetchResponse(
            1,
            2,
            ErrorCode.NONE,
            leader_id=1,
            leader_epoch=5,
            high_watermark=118,
            diverging_epoch=OffsetAndEpoch(110, 4),
            fetch_offset=120,
            last_fetched_epoch=4,
        ),
        REQUESTS[4],
    ),
    (
        FetchResponse(
            1,
            2,
            ErrorCode.NONE,
            leader_id=1,
            leader_epoch=5,
            snapshot_id=OffsetAndEpoch(100, 3),
            fetch_offset=120,
            last_fetched_epoch=4,
        ),
        REQUESTS[4],
    ),
    (
        FetchResponse(
            1,
            2,
            ErrorCode.NOT_LEADER_OR_FOLLOWER,
            leader_id=3,
            leader_epoch=6,
            fetch_offset=120,
            last_fetched_epoch=4,
        ),
        REQUESTS[4],
    ),
    (
        FetchSnapshotResponse(
            1,
            2,
            ErrorCode.NONE,
            leader_id=1,
            leader_epoch=5,
            snapshot_id=OffsetAndEpoch(100, 3),
            size=10_000,
            position=2048,
            chunk=b"chunk",
        ),
        REQUESTS[5],
    ),
    (
        FetchSnapshotResponse(1, 2, ErrorCode.SNAPSHOT_NOT_FOUND, leader_id=1, leader_epoch=5),
        REQUESTS[5],
    ),
]


@pytest.mark.parametrize("request_", REQUESTS, ids=lambda r: type(r).__name__)
def test_request_round_trip(request_: RaftRequest) -> None:
    wire = request_to_proto(request_)
    parsed = type(wire).FromString(wire.SerializeToString())
    assert request_from_proto(parsed, destination=request_.destination) == request_


@pytest.mark.parametrize(
    ("response", "request_"), RESPONSES, ids=lambda r: getattr(type(r), "__name__", "")
)
def test_response_round_trip(response: RaftResponse, request_: RaftRequest) -> None:
    assert type(response) is RESPONSE_FOR[type(request_)]
    wire = response_to_proto(response)
    parsed = type(wire).FromString(wire.SerializeToString())
    assert response_from_proto(parsed, request_) == response


def test_wire_names_the_routing_fields() -> None:
    vote = request_to_proto(REQUESTS[0])
    assert isinstance(vote, pb.VoteRequest)
    assert (vote.candidate_id, vote.voter_id) == (1, 2)
    fetch = request_to_proto(REQUESTS[4])
    assert isinstance(fetch, pb.RaftFetchRequest)
    assert (fetch.replica_id, fetch.leader_id) == (2, 1)
    reply = response_to_proto(RESPONSES[4][0])
    assert isinstance(reply, pb.RaftFetchResponse)
    assert reply.replica_id == 2
    assert (reply.fetch_offset, reply.last_fetched_epoch) == (120, 4)  # the echo
    assert not reply.HasField("diverging_epoch")


def test_a_vote_request_with_a_directory_id_that_is_not_a_uuid_is_refused() -> None:
    wire = pb.VoteRequest(cluster_id="c", candidate_id=1, voter_id=2, voter_directory_id="x")
    with pytest.raises(InvalidRequestError, match="not a uuid"):
        request_from_proto(wire, destination=2)


def test_describe_quorum_round_trip() -> None:
    description = QuorumDescription(
        leader_id=1,
        leader_epoch=5,
        high_watermark=118,
        voters=(
            ReplicaProgress(1, 120, 1_700_000_000_000, 1_700_000_000_000),
            ReplicaProgress(2, 118, 1_700_000_000_000, 1_699_999_999_000),
            ReplicaProgress(3),
        ),
        observers=(ReplicaProgress(1000, 50, 1_700_000_000_000, -1),),
    )
    wire = describe_quorum_to_proto(description, cluster_id="c")
    parsed = pb.DescribeQuorumResponse.FromString(wire.SerializeToString())
    assert parsed.cluster_id == "c"
    assert describe_quorum_from_proto(parsed) == description


def test_unknown_messages_are_refused() -> None:
    with pytest.raises(TypeError):
        request_to_proto(RESPONSES[0][0])  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        request_from_proto(pb.VoteResponse(), destination=1)  # type: ignore[arg-type]


def test_the_fetch_echo_comes_from_the_wire() -> None:
    """A late answer to an older fetch keeps the position it answered: the core drops it."""
    stale = FetchResponse(
        1,
        2,
        ErrorCode.NONE,
        leader_id=1,
        leader_epoch=5,
        records=b"old",
        fetch_offset=100,
        last_fetched_epoch=3,
    )
    wire = response_to_proto(stale)
    assert response_from_proto(wire, REQUESTS[4]) == stale
