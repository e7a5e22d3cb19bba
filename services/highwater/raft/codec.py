"""Converts the Raft core's message values to and from ``highwater.v1`` protobuf messages.

The wire messages carry fewer routing fields than the core's values: a request names its
sender (``candidate_id``, ``leader_id``, ``replica_id``) but not always its destination,
and a response names neither end reliably. So a request is decoded with the id of the node
that received it, and a response with the request it answers (which also gives back the
``pre_vote`` flag that a ``VoteResponse`` does not carry on the wire).
"""

from __future__ import annotations

import uuid
from typing import Any, TypeAlias

from highwater.errors import InvalidRequestError
from highwater.internal.v1 import raft_pb2 as pb
from highwater.raft.messages import (
    NO_LEADER,
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

RaftRequest: TypeAlias = (
    VoteRequest
    | BeginQuorumEpochRequest
    | EndQuorumEpochRequest
    | FetchRequest
    | FetchSnapshotRequest
)
RaftResponse: TypeAlias = (
    VoteResponse
    | BeginQuorumEpochResponse
    | EndQuorumEpochResponse
    | FetchResponse
    | FetchSnapshotResponse
)
ProtoRequest: TypeAlias = (
    pb.VoteRequest
    | pb.BeginQuorumEpochRequest
    | pb.EndQuorumEpochRequest
    | pb.RaftFetchRequest
    | pb.FetchSnapshotRequest
)
ProtoResponse: TypeAlias = (
    pb.VoteResponse
    | pb.BeginQuorumEpochResponse
    | pb.EndQuorumEpochResponse
    | pb.RaftFetchResponse
    | pb.FetchSnapshotResponse
)

RESPONSE_FOR: dict[type, type] = {
    VoteRequest: VoteResponse,
    BeginQuorumEpochRequest: BeginQuorumEpochResponse,
    EndQuorumEpochRequest: EndQuorumEpochResponse,
    FetchRequest: FetchResponse,
    FetchSnapshotRequest: FetchSnapshotResponse,
}
"""The response type that answers each request type."""


# -- OffsetAndEpoch -------------------------------------------------------------------------


def _directory_id(text: str) -> uuid.UUID | None:
    """A request's directory id (empty: none given); one that is not a uuid is refused."""
    if not text:
        return None
    try:
        return uuid.UUID(text)
    except ValueError:
        raise InvalidRequestError(f"directory id {text!r} is not a uuid") from None


def _offset_and_epoch_to_proto(value: OffsetAndEpoch) -> pb.OffsetAndEpoch:
    return pb.OffsetAndEpoch(offset=value.offset, epoch=value.epoch)


def _offset_and_epoch_from_proto(value: pb.OffsetAndEpoch) -> OffsetAndEpoch:
    return OffsetAndEpoch(offset=value.offset, epoch=value.epoch)


def _optional_offset_and_epoch(message: Any, field: str) -> OffsetAndEpoch | None:
    """An ``OffsetAndEpoch`` field of ``message``, or None when it is not set."""
    if not message.HasField(field):
        return None
    return _offset_and_epoch_from_proto(getattr(message, field))


# -- requests -------------------------------------------------------------------------------


def request_to_proto(request: RaftRequest) -> ProtoRequest:
    """The wire form of a request the core wants sent."""
    match request:
        case VoteRequest():
            return pb.VoteRequest(
                cluster_id=request.cluster_id,
                candidate_id=request.source,
                candidate_epoch=request.candidate_epoch,
                voter_id=request.destination,
                last_offset_epoch=request.last_offset_epoch,
                last_offset=request.last_offset,
                pre_vote=request.pre_vote,
                voter_directory_id=(
                    "" if request.voter_directory_id is None else str(request.voter_directory_id)
                ),
            )
        case BeginQuorumEpochRequest():
            return pb.BeginQuorumEpochRequest(
                cluster_id=request.cluster_id,
                leader_id=request.source,
                leader_epoch=request.leader_epoch,
                voter_id=request.destination,
            )
        case EndQuorumEpochRequest():
            return pb.EndQuorumEpochRequest(
                cluster_id=request.cluster_id,
                leader_id=request.source,
                leader_epoch=request.leader_epoch,
                voter_id=request.destination,
                preferred_successors=list(request.preferred_successors),
            )
        case FetchRequest():
            return pb.RaftFetchRequest(
                cluster_id=request.cluster_id,
                replica_id=request.source,
                current_leader_epoch=request.current_leader_epoch,
                fetch_offset=request.fetch_offset,
                last_fetched_epoch=request.last_fetched_epoch,
                max_wait_ms=request.max_wait_ms,
                max_bytes=request.max_bytes,
                leader_id=request.destination,
                replica_directory_id=(
                    ""
                    if request.replica_directory_id is None
                    else str(request.replica_directory_id)
                ),
                replica_endpoint=request.replica_endpoint,
            )
        case FetchSnapshotRequest():
            return pb.FetchSnapshotRequest(
                cluster_id=request.cluster_id,
                replica_id=request.source,
                current_leader_epoch=request.current_leader_epoch,
                snapshot_id=_offset_and_epoch_to_proto(request.snapshot_id),
                position=request.position,
                max_bytes=request.max_bytes,
                replica_directory_id=(
                    ""
                    if request.replica_directory_id is None
                    else str(request.replica_directory_id)
                ),
            )
    raise TypeError(f"not a Raft request: {request!r}")


def request_from_proto(request: ProtoRequest, *, destination: int) -> RaftRequest:
    """The core's value for a request received by node ``destination``."""
    match request:
        case pb.VoteRequest():
            return VoteRequest(
                source=request.candidate_id,
                destination=destination,
                cluster_id=request.cluster_id,
                candidate_epoch=request.candidate_epoch,
                last_offset_epoch=request.last_offset_epoch,
                last_offset=request.last_offset,
                pre_vote=request.pre_vote,
                voter_directory_id=_directory_id(request.voter_directory_id),
            )
        case pb.BeginQuorumEpochRequest():
            return BeginQuorumEpochRequest(
                source=request.leader_id,
                destination=destination,
                cluster_id=request.cluster_id,
                leader_epoch=request.leader_epoch,
            )
        case pb.EndQuorumEpochRequest():
            return EndQuorumEpochRequest(
                source=request.leader_id,
                destination=destination,
                cluster_id=request.cluster_id,
                leader_epoch=request.leader_epoch,
                preferred_successors=tuple(request.preferred_successors),
            )
        case pb.RaftFetchRequest():
            return FetchRequest(
                source=request.replica_id,
                destination=destination,
                cluster_id=request.cluster_id,
                current_leader_epoch=request.current_leader_epoch,
                fetch_offset=request.fetch_offset,
                last_fetched_epoch=request.last_fetched_epoch,
                max_wait_ms=request.max_wait_ms,
                max_bytes=request.max_bytes,
                replica_directory_id=_directory_id(request.replica_directory_id),
                replica_endpoint=request.replica_endpoint,
            )
        case pb.FetchSnapshotRequest():
            return FetchSnapshotRequest(
                source=request.replica_id,
                destination=destination,
                cluster_id=request.cluster_id,
                current_leader_epoch=request.current_leader_epoch,
                snapshot_id=_offset_and_epoch_from_proto(request.snapshot_id),
                position=request.position,
                max_bytes=request.max_bytes,
                replica_directory_id=_directory_id(request.replica_directory_id),
            )
    raise TypeError(f"not a Raft request: {request!r}")


# -- responses ------------------------------------------------------------------------------


def response_to_proto(response: RaftResponse) -> ProtoResponse:
    """The wire form of a response the core emitted."""
    match response:
        case VoteResponse():
            return pb.VoteResponse(
                error=response.error,  # type: ignore[arg-type]
                leader_id=response.leader_id,
                leader_epoch=response.leader_epoch,
                vote_granted=response.vote_granted,
                voter_id=response.source,
            )
        case BeginQuorumEpochResponse():
            return pb.BeginQuorumEpochResponse(
                error=response.error,  # type: ignore[arg-type]
                leader_id=response.leader_id,
                leader_epoch=response.leader_epoch,
                voter_id=response.source,
            )
        case EndQuorumEpochResponse():
            return pb.EndQuorumEpochResponse(
                error=response.error,  # type: ignore[arg-type]
                leader_id=response.leader_id,
                leader_epoch=response.leader_epoch,
                voter_id=response.source,
            )
        case FetchResponse():
            fetch = pb.RaftFetchResponse(
                error=response.error,  # type: ignore[arg-type]
                leader_id=response.leader_id,
                leader_epoch=response.leader_epoch,
                high_watermark=response.high_watermark,
                log_start_offset=response.log_start_offset,
                records=response.records,
                replica_id=response.destination,
                fetch_offset=response.fetch_offset,
                last_fetched_epoch=response.last_fetched_epoch,
            )
            if response.diverging_epoch is not None:
                fetch.diverging_epoch.CopyFrom(_offset_and_epoch_to_proto(response.diverging_epoch))
            if response.snapshot_id is not None:
                fetch.snapshot_id.CopyFrom(_offset_and_epoch_to_proto(response.snapshot_id))
            return fetch
        case FetchSnapshotResponse():
            snapshot = pb.FetchSnapshotResponse(
                error=response.error,  # type: ignore[arg-type]
                leader_id=response.leader_id,
                leader_epoch=response.leader_epoch,
                size=response.size,
                position=response.position,
                unaligned_records=response.chunk,
                replica_id=response.destination,
            )
            if response.snapshot_id is not None:
                snapshot.snapshot_id.CopyFrom(_offset_and_epoch_to_proto(response.snapshot_id))
            return snapshot
    raise TypeError(f"not a Raft response: {response!r}")


def response_from_proto(response: ProtoResponse, request: RaftRequest) -> RaftResponse:
    """The core's value for ``response``, the answer to ``request`` (which the caller sent)."""
    source, destination = request.destination, request.source
    match response:
        case pb.VoteResponse():
            return VoteResponse(
                source=source,
                destination=destination,
                error=response.error,
                leader_id=response.leader_id,
                leader_epoch=response.leader_epoch,
                vote_granted=response.vote_granted,
                pre_vote=isinstance(request, VoteRequest) and request.pre_vote,
            )
        case pb.BeginQuorumEpochResponse():
            return BeginQuorumEpochResponse(
                source=source,
                destination=destination,
                error=response.error,
                leader_id=response.leader_id,
                leader_epoch=response.leader_epoch,
            )
        case pb.EndQuorumEpochResponse():
            return EndQuorumEpochResponse(
                source=source,
                destination=destination,
                error=response.error,
                leader_id=response.leader_id,
                leader_epoch=response.leader_epoch,
            )
        case pb.RaftFetchResponse():
            return FetchResponse(
                source=source,
                destination=destination,
                error=response.error,
                leader_id=response.leader_id,
                leader_epoch=response.leader_epoch,
                high_watermark=response.high_watermark,
                log_start_offset=response.log_start_offset,
                diverging_epoch=_optional_offset_and_epoch(response, "diverging_epoch"),
                snapshot_id=_optional_offset_and_epoch(response, "snapshot_id"),
                records=response.records,
                fetch_offset=response.fetch_offset,
                last_fetched_epoch=response.last_fetched_epoch,
            )
        case pb.FetchSnapshotResponse():
            return FetchSnapshotResponse(
                source=source,
                destination=destination,
                error=response.error,
                leader_id=response.leader_id,
                leader_epoch=response.leader_epoch,
                snapshot_id=_optional_offset_and_epoch(response, "snapshot_id"),
                size=response.size,
                position=response.position,
                chunk=response.unaligned_records,
            )
    raise TypeError(f"not a Raft response: {response!r}")


# -- DescribeQuorum -------------------------------------------------------------------------


def _replica_to_proto(replica: ReplicaProgress) -> pb.ReplicaState:
    return pb.ReplicaState(
        replica_id=replica.replica_id,
        log_end_offset=replica.log_end_offset,
        last_fetch_timestamp=replica.last_fetch_ms,
        last_caught_up_timestamp=replica.last_caught_up_ms,
        replica_directory_id="" if replica.directory_id is None else str(replica.directory_id),
        endpoint=replica.endpoint,
    )


def _replica_from_proto(replica: pb.ReplicaState) -> ReplicaProgress:
    return ReplicaProgress(
        replica_id=replica.replica_id,
        log_end_offset=replica.log_end_offset,
        last_fetch_ms=replica.last_fetch_timestamp,
        last_caught_up_ms=replica.last_caught_up_timestamp,
        directory_id=_directory_id(replica.replica_directory_id),
        endpoint=replica.endpoint,
    )


def describe_quorum_to_proto(
    description: QuorumDescription, *, cluster_id: str, error: int = 0
) -> pb.DescribeQuorumResponse:
    return pb.DescribeQuorumResponse(
        error=error,  # type: ignore[arg-type]
        cluster_id=cluster_id,
        leader_id=description.leader_id,
        leader_epoch=description.leader_epoch,
        high_watermark=description.high_watermark,
        current_voters=[_replica_to_proto(r) for r in description.voters],
        observers=[_replica_to_proto(r) for r in description.observers],
    )


def describe_quorum_from_proto(response: pb.DescribeQuorumResponse) -> QuorumDescription:
    return QuorumDescription(
        leader_id=response.leader_id if response.leader_id >= 0 else NO_LEADER,
        leader_epoch=response.leader_epoch,
        high_watermark=response.high_watermark,
        voters=tuple(_replica_from_proto(r) for r in response.current_voters),
        observers=tuple(_replica_from_proto(r) for r in response.observers),
    )
