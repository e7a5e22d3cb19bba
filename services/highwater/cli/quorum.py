"""``highwater quorum``: the metadata quorum's leader, progress and voters (kafka-metadata-quorum).

It asks the controllers named by ``--controllers`` for ``DescribeQuorum`` and prints the
answer of the active controller (the Raft leader, the only one that tracks every
replica's progress):

* ``--status``: ClusterId, LeaderId, LeaderEpoch, HighWatermark, MaxFollowerLag,
  MaxFollowerLagTimeMs, CurrentVoters, CurrentObservers;
* ``--replication``: one row per replica with NodeId, LogEndOffset, Lag,
  LastFetchTimestamp, LastCaughtUpTimestamp and Status (Leader, Follower, Observer).

In a dynamic quorum (KIP-853, ``highwater controller --initial-controllers``) CurrentVoters
and CurrentObservers list each replica's id, directory id and endpoint (a broker's or a
coordinator's observer has none: it is no controller), and two commands change the
voters, one at a time, through the leader:

* ``add-controller --node-id N``: the observer N (a controller started with
  ``--bootstrap-controllers``) becomes a voter once caught up; its directory id and
  endpoint are taken from DescribeQuorum's observers, as kafka-metadata-quorum does; an
  observer without an endpoint (a broker, a coordinator) is refused;
* ``remove-controller --node-id N [--directory-id D]``: the voter N stops being one; the
  request names it by the directory id DescribeQuorum lists for it (or D), as KIP-853's
  RemoveRaftVoter does, so it cannot remove a newer incarnation of N instead.

Each waits until the new voter set is committed, or prints the leader's refusal.

``formed`` tells a start script whether a quorum exists among the controllers it names, before
it bootstraps one with ``--initial-controllers`` (docs/kubernetes.md): a controller that is
still looking for its quorum (``--bootstrap-controllers``) answers that it knows none.
``check-removal --ids-from N`` exits 1, naming them, while voters with ids from N up are in
the voter set: the Helm chart runs it before the controller count goes down, since a voter
whose pod is gone still counts towards the majority.
"""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import click
import grpc
import grpc.aio

from highwater.cli.tables import Column, format_option, print_json, print_table
from highwater.internal.v1 import raft_pb2 as pb
from highwater.internal.v1 import raft_pb2_grpc
from highwater.raft.messages import NO_LEADER
from highwater.rpc.channels import open_channel
from highwater.rpc.endpoints import parse_endpoint
from highwater.v1.common_pb2 import ErrorCode


@dataclass(frozen=True, slots=True)
class _Answer:
    endpoint: str
    response: pb.DescribeQuorumResponse | None
    problem: str | None = None


async def _ask(endpoint: str, timeout_s: float) -> _Answer:
    try:
        async with open_channel(endpoint) as channel:
            stub = raft_pb2_grpc.RaftStub(channel)
            response = await stub.DescribeQuorum(pb.DescribeQuorumRequest(), timeout=timeout_s)
            return _Answer(endpoint, response)
    except grpc.aio.AioRpcError as e:
        return _Answer(endpoint, None, f"{e.code().name}: {e.details()}")


async def _ask_all(endpoints: list[str], timeout_s: float) -> list[_Answer]:
    return list(await asyncio.gather(*(_ask(e, timeout_s) for e in endpoints)))


def describe_leader(endpoints: list[str], timeout_s: float) -> pb.DescribeQuorumResponse:
    """The active controller's ``DescribeQuorum`` answer; ``click.ClickException`` if none.

    A follower that answers names the leader and every voter's address, so one reachable
    controller is enough: the leader is asked next.
    """
    answers = asyncio.run(_ask_all(endpoints, timeout_s))
    for answer in answers:
        if answer.response is not None and answer.response.error == ErrorCode.NONE:
            return answer.response
    leader_addresses = {
        node.address
        for answer in answers
        if answer.response is not None
        for node in answer.response.nodes
        if node.node_id == answer.response.leader_id and node.address not in endpoints
    }
    if leader_addresses:
        for answer in asyncio.run(_ask_all(sorted(leader_addresses), timeout_s)):
            if answer.response is not None and answer.response.error == ErrorCode.NONE:
                return answer.response
    reached = [a for a in answers if a.response is not None]
    if not reached:
        details = "; ".join(f"{a.endpoint}: {a.problem}" for a in answers)
        raise click.ClickException(f"no controller could be reached ({details})")
    known = [
        a.response for a in reached if a.response is not None and a.response.leader_id != NO_LEADER
    ]
    if known:
        latest = max(known, key=lambda r: r.leader_epoch)
        raise click.ClickException(
            f"none of {', '.join(endpoints)} is the active controller; the leader of epoch "
            f"{latest.leader_epoch} is node {latest.leader_id}: add its address to --controllers"
        )
    raise click.ClickException(
        "the quorum has no leader at the moment (an election is under way); try again"
    )


def _sorted(replicas: list[pb.ReplicaState]) -> list[pb.ReplicaState]:
    return sorted(replicas, key=lambda r: r.replica_id)


def _leader_state(response: pb.DescribeQuorumResponse) -> pb.ReplicaState | None:
    """The leader's progress: among the voters, or among the observers while the leader
    has removed itself and the change is not yet committed."""
    for replica in (*response.current_voters, *response.observers):
        if replica.replica_id == response.leader_id:
            return replica
    return None


def _end_offset(replica: pb.ReplicaState) -> int:
    """A replica's log end offset, 0 while the leader has not heard from it (-1 on the wire)."""
    return max(0, replica.log_end_offset)


def status_lines(response: pb.DescribeQuorumResponse) -> list[tuple[str, str]]:
    """The ``--status`` fields, computed as kafka-metadata-quorum computes them.

    MaxFollowerLag is the leader's log end offset less the most lagging voter's;
    MaxFollowerLagTimeMs how much longer ago that voter was last caught up than the leader
    (0 when no voter lags, -1 when it never caught up).
    """
    voters = _sorted(list(response.current_voters))
    observers = _sorted(list(response.observers))
    leader = _leader_state(response)
    max_lag, max_lag_time = 0, 0
    if leader is not None and voters:
        laggard = min(voters, key=lambda r: (_end_offset(r), r.replica_id != leader.replica_id))
        max_lag = max(0, _end_offset(leader) - _end_offset(laggard))
        if max_lag == 0:
            max_lag_time = 0
        elif laggard.last_caught_up_timestamp < 0 or leader.last_caught_up_timestamp < 0:
            max_lag_time = -1
        else:
            max_lag_time = max(
                0, leader.last_caught_up_timestamp - laggard.last_caught_up_timestamp
            )
    return [
        ("ClusterId", response.cluster_id),
        ("LeaderId", str(response.leader_id)),
        ("LeaderEpoch", str(response.leader_epoch)),
        ("HighWatermark", str(response.high_watermark)),
        ("MaxFollowerLag", str(max_lag)),
        ("MaxFollowerLagTimeMs", str(max_lag_time)),
        ("CurrentVoters", _replica_list(voters)),
        ("CurrentObservers", _replica_list(observers)),
    ]


def _is_dynamic(replicas: list[pb.ReplicaState]) -> bool:
    return any(r.replica_directory_id for r in replicas)


def _replica_list(replicas: list[pb.ReplicaState]) -> str:
    """``[1,2,3]`` in a static quorum; in a dynamic one each replica's id, directory id
    and endpoint, as kafka-metadata-quorum prints them."""
    if not _is_dynamic(replicas):
        return "[" + ",".join(str(r.replica_id) for r in replicas) + "]"
    return json.dumps([_replica_json(r) for r in replicas], separators=(", ", ": "))


def _replica_json(replica: pb.ReplicaState) -> dict[str, object]:
    entry: dict[str, object] = {"id": replica.replica_id}
    if replica.replica_directory_id:
        entry["directoryId"] = replica.replica_directory_id
    if replica.endpoint:
        entry["endpoints"] = [replica.endpoint]
    return entry


REPLICATION_COLUMNS = (
    "NodeId",
    "LogEndOffset",
    "Lag",
    "LastFetchTimestamp",
    "LastCaughtUpTimestamp",
    "Status",
)


def replication_rows(response: pb.DescribeQuorumResponse) -> list[tuple[str, ...]]:
    """The ``--replication`` table: the leader first, then followers, then observers."""
    leader = _leader_state(response)
    leader_end = _end_offset(leader) if leader is not None else response.high_watermark
    ordered: list[tuple[pb.ReplicaState, str]] = []
    if leader is not None:
        ordered.append((leader, "Leader"))
    ordered += [
        (r, "Follower")
        for r in _sorted(list(response.current_voters))
        if r.replica_id != response.leader_id
    ]
    ordered += [
        (r, "Observer")
        for r in _sorted(list(response.observers))
        if r.replica_id != response.leader_id
    ]
    return [
        (
            str(r.replica_id),
            str(r.log_end_offset),
            str(max(0, leader_end - _end_offset(r))),
            str(r.last_fetch_timestamp),
            str(r.last_caught_up_timestamp),
            status,
        )
        for r, status in ordered
    ]


def _snake(name: str) -> str:
    """``LogEndOffset`` as ``log_end_offset``."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def _typed(value: str) -> int | str:
    """A field as JSON carries it: a number as a number."""
    return int(value) if value.lstrip("-").isdigit() else value


def _parse_controllers(_ctx: click.Context, _param: click.Parameter, value: str) -> list[str]:
    endpoints = []
    for part in value.split(","):
        try:
            host, port = parse_endpoint(part.strip())
        except ValueError as e:
            raise click.BadParameter(str(e)) from None
        endpoints.append(f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
    return endpoints


Decorator = Callable[[Callable[..., None]], Callable[..., None]]


def _controllers_option(help_text: str) -> Decorator:
    return click.option(
        "--controllers",
        "controllers",
        required=True,
        callback=_parse_controllers,
        metavar="HOST:PORT[,HOST:PORT...]",
        help=help_text,
    )


def _timeout_option(default: float, help_text: str) -> Decorator:
    return click.option(
        "--timeout",
        type=click.FloatRange(min=0.1),
        default=default,
        show_default=True,
        help=help_text,
    )


_ASKED = "Controllers to ask; the active controller among them answers."
_EACH = "Seconds to wait for each controller."
_CHANGED = "Controllers to ask; the request goes to the active controller."
_COMMITTED = "Seconds to wait for the change to be committed."


@click.group("quorum")
def quorum() -> None:
    """Inspect the metadata quorum (the Raft quorum of controllers)."""


@quorum.command("describe")
@_controllers_option(_ASKED)
@_timeout_option(5.0, _EACH)
@click.option("--status", is_flag=True, help="Print the quorum's status.")
@click.option("--replication", is_flag=True, help="Print every replica's replication progress.")
@format_option
def describe(
    controllers: list[str], status: bool, replication: bool, timeout: float, output_format: str
) -> None:
    """Describe the metadata quorum: --status or --replication (one of them, as
    kafka-metadata-quorum wants)."""
    if status and replication:
        raise click.UsageError(
            "Only one of --status or --replication should be specified with describe sub-command"
        )
    if not status and not replication:
        raise click.UsageError("give one of --status or --replication")
    response = describe_leader(controllers, timeout)
    if status:
        lines = status_lines(response)
        if output_format == "json":
            print_json(
                {
                    name: _current_json(value) if name.startswith("Current") else _typed(value)
                    for name, value in lines
                }
            )
            return
        width = max(len(name) for name, _ in lines) + 2
        for name, value in lines:
            click.echo(f"{name + ':':<{width}}{value}")
        return
    rows = [[_typed(cell) for cell in row] for row in replication_rows(response)]
    columns = [
        Column(name, re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()) for name in REPLICATION_COLUMNS
    ]
    print_table(columns, rows, output_format)


def _current_json(value: str) -> list[object]:
    if value.startswith("[{"):
        return list(json.loads(value))
    return [int(v) for v in value.strip("[]").split(",") if v]


# --- voter changes (KIP-853) ---------------------------------------------------------------

_ChangeResponse = pb.AddRaftVoterResponse | pb.RemoveRaftVoterResponse


def _leader_address(response: pb.DescribeQuorumResponse) -> str:
    for node in response.nodes:
        if node.node_id == response.leader_id:
            return node.address
    raise click.ClickException(f"the leader {response.leader_id} has no known address")


async def _change(
    address: str,
    call: Callable[[raft_pb2_grpc.RaftStub], Awaitable[_ChangeResponse]],
) -> _ChangeResponse:
    """Ask ``address``; once more at the leader it names if it no longer leads."""
    for _ in range(2):
        try:
            async with open_channel(address) as channel:
                response = await call(raft_pb2_grpc.RaftStub(channel))
        except grpc.aio.AioRpcError as e:
            raise click.ClickException(f"{address}: {e.code().name}: {e.details()}") from None
        if response.error != ErrorCode.NOT_LEADER_OR_FOLLOWER or not response.leader_endpoint:
            return response
        address = response.leader_endpoint
    return response


def _check(response: _ChangeResponse, what: str) -> None:
    if response.error != ErrorCode.NONE:
        raise click.ClickException(
            f"{what} refused: {ErrorCode.Name(response.error)}: {response.error_message}"
        )


NOT_FORMED_EXIT = 3
"""``quorum formed``'s exit status when every controller answered that it knows no quorum."""


@quorum.command("formed")
@_controllers_option("Every controller to ask (all but the one that would form the quorum).")
@_timeout_option(5.0, _EACH)
def formed(controllers: list[str], timeout: float) -> None:
    """Whether a quorum is formed among these controllers.

    Exit 0 if one of them names its quorum's voters (a voter or an observer of a formed
    quorum, whatever its election); exit 3 if every one answered and none knows a quorum
    (each is looking for one, with --bootstrap-controllers); exit 1 if some did not answer
    and none names a quorum: then nothing may be concluded.
    """
    answers = asyncio.run(_ask_all(controllers, timeout))
    for answer in answers:
        response = answer.response
        if response is not None and response.nodes:
            voters = ",".join(f"{n.node_id}@{n.address}" for n in response.nodes)
            click.echo(f"formed: {answer.endpoint} names the voters {voters}")
            return
    unreached = [answer for answer in answers if answer.response is None]
    if unreached:
        details = "; ".join(f"{a.endpoint}: {a.problem}" for a in unreached)
        raise click.ClickException(f"not known: no answer from {details}")
    click.echo(f"not formed: {', '.join(controllers)} each answered that it knows no quorum")
    click.get_current_context().exit(NOT_FORMED_EXIT)


@quorum.command("check-removal")
@_controllers_option(_ASKED)
@_timeout_option(5.0, _EACH)
@click.option(
    "--ids-from",
    type=click.IntRange(min=0),
    required=True,
    help="The controllers that would go: every node id from this one up.",
)
def check_removal(controllers: list[str], ids_from: int, timeout: float) -> None:
    """Exit 0 if no voter has a node id of --ids-from or more (else name them, exit 1)."""
    voters = describe_leader(controllers, timeout).current_voters
    going = sorted(v.replica_id for v in voters if v.replica_id >= ids_from)
    if not going:
        click.echo(f"no voter has a node id of {ids_from} or more")
        return
    if not any(v.replica_directory_id for v in voters):
        raise click.ClickException(
            f"voters {going} would go, and a static quorum's voters cannot change: keep "
            "the controller count"
        )
    removals = "; ".join(
        f"highwater quorum remove-controller --controllers {','.join(controllers)} "
        f"--node-id {node_id}"
        for node_id in reversed(going)
    )
    raise click.ClickException(
        f"voters {going} still vote, and a voter whose controller is gone still counts "
        f"towards the majority: remove them first ({removals})"
    )


@quorum.command("add-controller")
@_controllers_option(_CHANGED)
@click.option("--node-id", type=click.IntRange(min=0, max=2**31 - 1), required=True)
@_timeout_option(30.0, _COMMITTED)
def add_controller(controllers: list[str], node_id: int, timeout: float) -> None:
    """Make the observer NODE-ID a voter (it must follow the quorum, caught up)."""
    described = describe_leader(controllers, min(timeout, 5.0))
    if described.nodes and not any(node.directory_id for node in described.nodes):
        raise click.ClickException(
            "the quorum is static (its controllers were started with --voters): its voters "
            "cannot change; a quorum started with --initial-controllers takes new controllers"
        )
    observer = next((r for r in described.observers if r.replica_id == node_id), None)
    if any(r.replica_id == node_id for r in described.current_voters):
        raise click.ClickException(
            f"node {node_id} is a voter already; a controller whose disk was replaced is "
            "removed first (remove-controller), then added again"
        )
    if observer is not None and observer.replica_directory_id and not observer.endpoint:
        raise click.ClickException(
            f"node {node_id} is not a controller: it follows the metadata quorum as an "
            "observer only (a broker or a coordinator) and announces no controller endpoint; "
            "only a controller started with highwater controller --bootstrap-controllers can "
            "become a voter"
        )
    if observer is None or not observer.replica_directory_id:
        raise click.ClickException(
            f"node {node_id} is not an observer of the quorum that says who it is: start it "
            "with highwater controller --bootstrap-controllers and retry"
        )
    request = pb.AddRaftVoterRequest(
        cluster_id=described.cluster_id,
        voter_id=node_id,
        voter_directory_id=observer.replica_directory_id,
        endpoint=observer.endpoint,
    )
    response = asyncio.run(
        _change(
            _leader_address(described), lambda stub: stub.AddRaftVoter(request, timeout=timeout)
        )
    )
    _check(response, f"adding node {node_id}")
    click.echo(
        f"Added controller {node_id} (directory {observer.replica_directory_id}, "
        f"endpoint {observer.endpoint}) as a voter"
    )


def _parse_directory_id(
    _ctx: click.Context, _param: click.Parameter, value: str | None
) -> str | None:
    if value is None:
        return None
    try:
        return str(uuid.UUID(value))
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a directory id (a uuid)") from None


@quorum.command("remove-controller")
@_controllers_option(_CHANGED)
@click.option("--node-id", type=click.IntRange(min=0, max=2**31 - 1), required=True)
@click.option(
    "--directory-id",
    default=None,
    callback=_parse_directory_id,
    help="Remove the voter only if it has this directory id (by default: the one the "
    "leader's DescribeQuorum lists for it).",
)
@_timeout_option(30.0, _COMMITTED)
def remove_controller(
    controllers: list[str], node_id: int, directory_id: str | None, timeout: float
) -> None:
    """Remove the voter NODE-ID from the quorum (the last voter cannot be removed).

    The request names the voter by its key, as KIP-853 wants: its id and the directory id
    the leader lists for it now (or ``--directory-id``). If that controller is replaced
    before the request arrives, the new incarnation is not removed in its place."""
    described = describe_leader(controllers, min(timeout, 5.0))
    voter = next((v for v in described.current_voters if v.replica_id == node_id), None)
    if directory_id is None and voter is not None:
        directory_id = voter.replica_directory_id or None
    request = pb.RemoveRaftVoterRequest(
        cluster_id=described.cluster_id, voter_id=node_id, voter_directory_id=directory_id or ""
    )
    response = asyncio.run(
        _change(
            _leader_address(described), lambda stub: stub.RemoveRaftVoter(request, timeout=timeout)
        )
    )
    _check(response, f"removing node {node_id}")
    click.echo(f"Removed controller {node_id} from the voters")
