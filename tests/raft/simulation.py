"""Test drivers for the pure Raft core: a one-node transcript harness, a seeded cluster simulation.

:class:`NodeHarness` drives a single :class:`~highwater.raft.node.RaftNode` by hand, with
a manual clock, and renders what it sends as one line per message
(``1->2 Vote epoch=1 last=(0, 0) pre_vote``), so that unit tests read like the protocol.

:class:`Simulation` runs voters and observers over a simulated clock and network — loss,
delay, reordering, duplication, partitions that heal — with crash-restarts that keep or
lose unflushed entries (the persisted election state always survives), a client
proposing values and, optionally, state machines that snapshot and clean their logs. A
dynamic quorum's schedules also change the voters and wipe data directories (a replica
back empty under a new directory id).
Everything random comes from one seed. After every event it checks the safety
properties; after the faults stop it checks liveness. A failing schedule raises
:class:`SimulationFailure` naming its seed, and reproduces with::

    python -m tests.raft.simulation --seed N [--voters 5] [--snapshots] [--trace]
"""

from __future__ import annotations

import argparse
import heapq
import json
import random
import sys
import time
import uuid
from collections import Counter, deque
from collections.abc import Iterable, Sequence
from dataclasses import MISSING, dataclass, field, fields, replace
from typing import Any, NoReturn

from highwater.raft.log import InMemoryRaftLog
from highwater.raft.messages import (
    NO_LEADER,
    BeginQuorumEpochRequest,
    BeginQuorumEpochResponse,
    EndQuorumEpochRequest,
    FetchRequest,
    FetchResponse,
    OffsetAndEpoch,
    RaftMessage,
    VoteRequest,
    VoteResponse,
    is_request,
)
from highwater.raft.node import JoinRequest, NotLeaderError, RaftConfig, RaftNode, Ready
from highwater.raft.snapshot import InMemorySnapshotStore
from highwater.raft.state import ElectionState
from highwater.raft.voter_set import (
    MembershipChangeError,
    Voter,
    VoterSet,
    decode_voters_record,
    encode_voters_record,
    is_voters_record,
)
from highwater.records import iter_batches
from highwater.v1.common_pb2 import ErrorCode

CLUSTER_ID = "sim-cluster"

# --- Rendering messages as transcript lines ------------------------------------------------

_SKIPPED = {"source", "destination", "cluster_id"}
_NAMES = {
    "VoteRequest": "Vote",
    "BeginQuorumEpochRequest": "BeginQuorumEpoch",
    "EndQuorumEpochRequest": "EndQuorumEpoch",
    "FetchRequest": "Fetch",
    "FetchSnapshotRequest": "FetchSnapshot",
}


def render(message: RaftMessage) -> str:
    """One line per message: ``src->dst Type field=value ...`` (fields at their default
    are left out; records are shown as the offsets they span)."""
    parts = [
        f"{message.source}->{message.destination}",
        _NAMES.get(type(message).__name__, type(message).__name__),
    ]
    for f in fields(message):
        if f.name in _SKIPPED:
            continue
        value = getattr(message, f.name)
        if f.default is not MISSING and f.default == value:
            continue
        if f.name == "error":
            if value != ErrorCode.NONE:
                parts.append(ErrorCode.Name(value))
            continue
        if isinstance(value, bool):
            if value:
                parts.append(f.name)
            continue
        if f.name in ("records", "chunk"):
            parts.append(f"{f.name}={_describe_bytes(f.name, value)}")
            continue
        if isinstance(value, OffsetAndEpoch):
            value = (value.offset, value.epoch)
        if f.name == "leader_id" and value == NO_LEADER:
            value = "none"
        parts.append(f"{f.name}={value}")
    return " ".join(parts)


def _describe_bytes(name: str, data: bytes) -> str:
    if name == "chunk":
        return f"{len(data)}B"
    batches = list(iter_batches(data))
    if not batches:
        return "[]"
    return f"[{batches[0].base_offset}..{batches[-1].last_offset}]"


# --- Messages, tersely (for transcripts) ----------------------------------------------------

Position = tuple[int, int]
"""(offset, epoch)."""


def vote_request(
    source: int,
    candidate_epoch: int,
    last: Position = (0, 0),
    *,
    pre_vote: bool = False,
    to: int = 1,
) -> VoteRequest:
    return VoteRequest(source, to, CLUSTER_ID, candidate_epoch, last[1], last[0], pre_vote)


def vote_response(
    source: int,
    epoch: int,
    granted: bool,
    *,
    leader: int = NO_LEADER,
    pre_vote: bool = False,
    error: int = ErrorCode.NONE,
    to: int = 1,
) -> VoteResponse:
    return VoteResponse(source, to, error, leader, epoch, granted, pre_vote)


def begin_epoch(source: int, epoch: int, *, to: int = 1) -> BeginQuorumEpochRequest:
    return BeginQuorumEpochRequest(source, to, CLUSTER_ID, epoch)


def begin_epoch_response(
    source: int, epoch: int, *, leader: int = 1, to: int = 1
) -> BeginQuorumEpochResponse:
    return BeginQuorumEpochResponse(source, to, ErrorCode.NONE, leader, epoch)


def end_epoch(
    source: int, epoch: int, successors: Sequence[int] = (), *, to: int = 1
) -> EndQuorumEpochRequest:
    return EndQuorumEpochRequest(source, to, CLUSTER_ID, epoch, tuple(successors))


def fetch_request(
    source: int,
    epoch: int,
    position: Position = (0, 0),
    *,
    max_wait_ms: int = 500,
    to: int = 1,
    directory: uuid.UUID | None = None,
    endpoint: str | None = None,
) -> FetchRequest:
    """A fetch; one with a ``directory`` (a dynamic quorum's) announces a controller
    endpoint unless ``endpoint`` says otherwise (``""``: a broker's metadata replica)."""
    if endpoint is None:
        endpoint = "" if directory is None else f"node-{source}"
    return FetchRequest(
        source,
        to,
        CLUSTER_ID,
        epoch,
        position[0],
        position[1],
        max_wait_ms,
        replica_directory_id=directory,
        replica_endpoint=endpoint,
    )


def fetch_response(
    source: int,
    epoch: int,
    position: Position,
    *,
    records: bytes = b"",
    high_watermark: int = -1,
    diverging: Position | None = None,
    snapshot: Position | None = None,
    error: int = ErrorCode.NONE,
    leader: int | None = None,
    log_start_offset: int = 0,
    to: int = 1,
) -> FetchResponse:
    """The answer of leader ``source`` to a fetch from ``position``."""
    return FetchResponse(
        source,
        to,
        error,
        source if leader is None else leader,
        epoch,
        high_watermark=high_watermark,
        log_start_offset=log_start_offset,
        diverging_epoch=None if diverging is None else OffsetAndEpoch(*diverging),
        snapshot_id=None if snapshot is None else OffsetAndEpoch(*snapshot),
        records=records,
        fetch_offset=position[0],
        last_fetched_epoch=position[1],
    )


# --- One node by hand ---------------------------------------------------------------------


class NodeHarness:
    """One :class:`RaftNode` with an in-memory log, snapshot store and election-state store,
    a manual clock, and the effects of each :meth:`ready` kept for inspection."""

    def __init__(
        self,
        node_id: int = 1,
        voters: Iterable[int] | VoterSet = (1, 2, 3),
        *,
        election_state: ElectionState | None = None,
        log: InMemoryRaftLog | None = None,
        snapshots: InMemorySnapshotStore | None = None,
        config: RaftConfig | None = None,
        seed: int = 0,
        now_ms: int = 0,
        directory_id: uuid.UUID | None = None,
        endpoint: str = "",
    ) -> None:
        """``directory_id``, ``endpoint``: the node's incarnation and announced controller
        endpoint in a dynamic quorum (see :class:`RaftNode`)."""
        self.node_id = node_id
        self.directory_id = directory_id
        self.endpoint = endpoint
        # A VoterSet makes the quorum dynamic (KIP-853); ids alone, static.
        self.bootstrap: frozenset[int] | VoterSet = (
            voters if isinstance(voters, VoterSet) else frozenset(voters)
        )
        self.voters = frozenset(voters.ids if isinstance(voters, VoterSet) else voters)
        self.config = config or RaftConfig()
        self.log = log if log is not None else InMemoryRaftLog()
        self.snapshots = snapshots if snapshots is not None else InMemorySnapshotStore()
        self.persisted = election_state
        self.now_ms = now_ms
        self.seed = seed
        self.node = self._new_node()
        self.readies: list[Ready] = []

    def _new_node(self) -> RaftNode:
        return RaftNode(
            self.node_id,
            self.bootstrap,
            self.log,
            self.snapshots,
            cluster_id=CLUSTER_ID,
            election_state=self.persisted,
            random=random.Random(self.seed),
            config=self.config,
            now_ms=self.now_ms,
            directory_id=self.directory_id,
            endpoint=self.endpoint,
        )

    # --- Events ----------------------------------------------------------------------

    def advance(self, ms: int) -> None:
        """Let ``ms`` pass, then tick."""
        self.now_ms += ms
        self.node.tick(self.now_ms)

    def step(self, *messages: RaftMessage) -> None:
        for message in messages:
            self.node.step(message, self.now_ms)

    def flush(self) -> None:
        """The driver's fsync: everything appended so far is durable."""
        self.log.mark_flushed(self.log.end_offset)
        self.node.on_flushed(self.log.end_offset, self.now_ms)

    def restart(self, *, lose_unflushed: bool = False) -> None:
        """Crash and restart: the persisted election state survives, the rest is rebuilt."""
        self.log.crash(lose_unflushed)
        self.snapshots.crash()
        self.node = self._new_node()

    # --- Effects ---------------------------------------------------------------------

    def ready(self) -> Ready:
        """Take the node's effects, persisting its election state as a driver would."""
        ready = self.node.ready()
        if ready.election_state is not None:
            self.persisted = ready.election_state
        self.readies.append(ready)
        return ready

    def sent(self) -> list[str]:
        """The messages of the next :meth:`ready`, rendered (see :func:`render`)."""
        return [render(m) for m in self.ready().messages]

    def sent_messages(self) -> list[RaftMessage]:
        return list(self.ready().messages)


# --- The cluster simulation ---------------------------------------------------------------


class SimulationFailure(AssertionError):
    """A safety or liveness property broke: names the seed and the last events."""

    def __init__(self, seed: int, reason: str, trace: Sequence[str]) -> None:
        self.seed = seed
        self.reason = reason
        tail = "\n".join(trace[-40:])
        super().__init__(
            f"seed {seed}: {reason}\n"
            f"reproduce: python -m tests.raft.simulation --seed {seed} --trace\n"
            f"last events:\n{tail}"
        )


@dataclass(frozen=True)
class Scenario:
    """What one schedule exercises; :meth:`from_seed` picks it from the seed."""

    voters: int = 3
    observers: int = 1
    snapshots: bool = False
    snapshot_every: int = 8
    late_observer_ms: int = 0
    chaos_ms: int = 1500
    liveness_ms: int = 3000
    catch_up_ms: int = 5000
    max_events: int = 200_000
    drop_rate: float = 0.05
    duplicate_rate: float = 0.05
    max_delay_ms: int = 20
    max_flush_delay_ms: int = 8
    crashes: int = 2
    outages: int = 0
    partitions: int = 2
    resigns: int = 1
    crash_after_vote_rate: float = 0.0
    proposal_interval_ms: int = 40
    fetch_max_bytes: int = 600
    snapshot_chunk_bytes: int = 128
    membership_changes: int = 0
    """Voter changes (KIP-853) asked of the leader during the faults: each adds a
    replica that is not a voter or removes a voter (perhaps the leader itself). Nonzero
    makes the quorum dynamic (voters as records in the log)."""
    dynamic: bool = False
    """A dynamic quorum even without random changes (for planned ones)."""
    wipes: int = 0
    """Replicas whose data directory is wiped during the faults (a dynamic quorum's): each
    comes back empty under a new directory id, learns the voters as
    ``--bootstrap-controllers`` does (from a replica that answers) and, while the set
    still names its former incarnation, must neither vote nor be counted as it. Once the
    faults stop the operator removes the former incarnation's key."""
    broker_observers: int = 0
    """Metadata replicas of brokers (ids from 200, a dynamic quorum's): they fetch as
    observers under a directory id and announce no controller endpoint, and the random
    membership changes ask to add them too; the leader must refuse each
    (``NotAControllerError``), and none may ever be in a voter set."""
    auto_join: bool = False
    """Controllers run with ``controller.quorum.auto.join.enable``: a wiped replica asks the
    leader to remove its former incarnation, then to add it, and a controller that never
    was a voter asks to be added; no operator removes anything. Once the faults stop,
    every controller that has not been in a committed voter set since it last started
    must join one, and no broker's replica may ask."""

    @classmethod
    def from_seed(cls, seed: int, **overrides: Any) -> Scenario:
        rng = random.Random(f"scenario-{seed}")
        snapshots = rng.random() < 0.5
        scenario = cls(
            voters=rng.choice((3, 3, 5)),
            snapshots=snapshots,
            snapshot_every=rng.randint(3, 12),
            late_observer_ms=rng.choice((0, 0, rng.randint(200, 1400))),
            drop_rate=rng.choice((0.0, 0.02, 0.1, 0.25)),
            duplicate_rate=rng.choice((0.0, 0.05, 0.2)),
            max_delay_ms=rng.choice((2, 10, 30, 60)),
            max_flush_delay_ms=rng.choice((1, 8, 40, 100)),
            crashes=rng.randint(0, 4),
            outages=rng.choice((0, 0, 1, 2)),
            partitions=rng.randint(0, 3),
            resigns=rng.randint(0, 2),
            crash_after_vote_rate=rng.choice((0.0, 0.0, 0.3)),
            proposal_interval_ms=rng.choice((10, 30, 80)),
            fetch_max_bytes=rng.choice((600, 1 << 20)),
            snapshot_chunk_bytes=rng.choice((64, 256, 1 << 20)),
            membership_changes=rng.choice((0, 0, 2, 6)),
        )
        # Drawn last, so that the fields above stay what each seed always gave.
        wipes = rng.choice((0, 1, 2)) if scenario.membership_changes else 0
        brokers = rng.choice((0, 0, 1)) if scenario.membership_changes else 0
        auto_join = rng.random() < 0.5 if scenario.membership_changes else False
        drawn = {"wipes": wipes, "broker_observers": brokers, "auto_join": auto_join}
        return cls(**{**scenario.__dict__, **drawn, **overrides})


SIM_CONFIG = RaftConfig(
    election_timeout_ms=100,
    election_backoff_max_ms=100,
    fetch_timeout_ms=200,
    fetch_max_wait_ms=40,
    high_watermark_linger_ms=1,
    request_timeout_ms=80,
    retry_backoff_ms=5,
)
"""Kafka's timings scaled down so that schedules are short: the election timeout, its
backoff and the fetch timeout by 10x (1,000, 1,000 and 2,000 ms in Kafka), so their ratios
hold; the fetch's long poll by 12.5x (500 ms), the request timeout by 25x (2,000 ms) and the
retry backoff by 4x (20 ms). The scenario sets fetch and snapshot chunk sizes (small ones
page through logs and snapshots)."""

TICK_MS = 20
"""Unused by the schedules, which tick each node only when its next timer is due
(:meth:`RaftNode.next_deadline_ms`), as the driver does: a timer the core forgot to
report would stall a schedule's elections or fetches, which the liveness checks see."""


@dataclass
class SimNode:
    """One replica: its durable pieces, its (possibly crashed) node, its state machine."""

    node_id: int
    log: InMemoryRaftLog = field(default_factory=InMemoryRaftLog)
    snapshots: InMemorySnapshotStore = field(default_factory=InMemorySnapshotStore)
    persisted: ElectionState | None = None
    node: RaftNode | None = None
    incarnation: int = 0
    flush_pending: bool = False
    # The state machine: the values of the committed entries applied, by offset.
    applied_offset: int = 0
    applied: dict[int, bytes | None] = field(default_factory=dict)
    last_snapshot_offset: int = 0
    # Offsets below this have been checked against the committed log.
    verified_offset: int = 0
    snapshot_loads: int = 0
    max_flush_delay_ms: int = 8
    # The committed voter set the driver keeps beside the election state.
    committed_voters: tuple[int, VoterSet] | None = None
    # When this incarnation's next tick is scheduled (None: none is).
    tick_at: int | None = None
    # Its data directory was wiped: the next start learns the voters from another replica.
    wiped: bool = False
    # This incarnation's key has been in the voter set it took as committed (auto-join
    # asks no more from then on).
    joined: bool = False


@dataclass
class SimulationResult:
    seed: int
    scenario: Scenario
    events: int
    simulated_ms: int
    leaders: dict[int, int]
    committed: int
    acknowledged: int
    messages: Counter[str]
    snapshot_loads: int
    recovery_ms: int
    catch_up_ms: int
    membership_changes: int = 0
    membership_refusals: Counter[str] = field(default_factory=Counter)

    def summary(self) -> str:
        return (
            f"seed {self.seed}: {self.scenario.voters} voters, "
            f"snapshots={self.scenario.snapshots}, "
            f"{self.events} events, {self.simulated_ms} ms simulated, "
            f"{len(self.leaders)} elected epochs, {self.committed} committed entries, "
            f"{self.acknowledged} acknowledged proposals, {self.snapshot_loads} snapshot loads, "
            f"leader and commit {self.recovery_ms} ms after healing, "
            f"every replica caught up after {self.catch_up_ms} ms"
        )


class Simulation:
    """A seeded run of the quorum through faults; :meth:`run` returns or raises
    :class:`SimulationFailure`."""

    def __init__(self, seed: int, scenario: Scenario | None = None, *, trace: bool = False) -> None:
        self.seed = seed
        self.scenario = scenario or Scenario.from_seed(seed)
        self.rng = random.Random(seed)
        self.print_trace = trace
        self.config = replace(
            SIM_CONFIG,
            fetch_max_bytes=self.scenario.fetch_max_bytes,
            snapshot_chunk_bytes=self.scenario.snapshot_chunk_bytes,
            auto_join=self.scenario.auto_join,
            auto_join_backoff_ms=50,
        )
        self.now_ms = 0
        self.voter_ids = frozenset(range(1, self.scenario.voters + 1))
        observer_ids = range(100, 100 + self.scenario.observers)
        self.broker_ids = frozenset(range(200, 200 + self.scenario.broker_observers))
        self.nodes = {
            i: SimNode(i)
            for i in (*sorted(self.voter_ids), *observer_ids, *sorted(self.broker_ids))
        }
        self.directory_ids = {
            i: uuid.UUID(int=random.Random(f"directory-{seed}-{i}").getrandbits(128))
            for i in self.nodes
        }
        self.bootstrap_voters = VoterSet.of(
            Voter(i, self.directory_ids[i], f"node-{i}") for i in sorted(self.voter_ids)
        )
        self.membership_changes = 0
        self.membership_refusals: Counter[str] = Counter()
        self.auto_joins: Counter[str] = Counter()  # the requests auto-join sent, by outcome
        self.adds_in_flight: Counter[int] = Counter()  # auto-join's AddRaftVoter, by sender
        self.wipes = 0
        for sim_node in self.nodes.values():
            # Some disks are slower than others.
            sim_node.max_flush_delay_ms = self.rng.randint(1, self.scenario.max_flush_delay_ms)
        self._queue: list[tuple[int, int, str, Any]] = []
        self._seq = 0
        self.events = 0
        self.trace: deque[str] = deque(maxlen=200)
        self.messages: Counter[str] = Counter()
        # Faults.
        self.blocked: set[tuple[int, int]] = set()
        self.drop_rate = self.scenario.drop_rate
        self.duplicate_rate = self.scenario.duplicate_rate
        self.healed = False
        # What has been observed: the committed log, leaders, acknowledged proposals.
        # The committed log as first seen, by offset: (epoch, value, is_control).
        self.committed: list[tuple[int, bytes | None, bool]] = []
        self.leaders: dict[int, int] = {}
        self.votes: dict[tuple[int, int], int] = {}  # (voter, epoch) -> candidate
        # What each wiped replica held durably when its disk went, by its former voter key:
        # (log start offset, the entries from there), for the durability check of the sets
        # that still name that key.
        self.former: dict[tuple[int, uuid.UUID], tuple[int, list[Any]]] = {}
        self.proposals = 0
        self.pending: dict[bytes, tuple[int, OffsetAndEpoch]] = {}
        self.acknowledged: dict[bytes, OffsetAndEpoch] = {}
        self.final_value: bytes | None = None
        self.final_ack: OffsetAndEpoch | None = None
        self.committed_at: int | None = None
        self.done_at: int | None = None

    # --- Running ---------------------------------------------------------------------

    def run(self) -> SimulationResult:
        scenario = self.scenario
        for node_id in self.nodes:
            start = scenario.late_observer_ms if node_id >= 100 else 0
            self._schedule(start, "start", node_id)
        self._plan_faults()
        self._schedule(scenario.chaos_ms, "heal", None)
        commit_deadline = scenario.chaos_ms + scenario.liveness_ms
        deadline = commit_deadline + scenario.catch_up_ms
        try:
            while self._queue:
                at, _, kind, payload = heapq.heappop(self._queue)
                if at > commit_deadline and self.committed_at is None:
                    self._fail(f"no leader and commit within {scenario.liveness_ms} ms of healing")
                if at > deadline:
                    unjoined = self._not_joined()
                    self._fail(
                        f"replicas not caught up {scenario.catch_up_ms} ms after the commit"
                        + (f" (voters not replaced: {unjoined})" if unjoined else "")
                    )
                self.now_ms = at
                self.events += 1
                if self.events > scenario.max_events:
                    self._fail(f"more than {scenario.max_events} events: a runaway schedule")
                self._dispatch(kind, payload)
                if self.done_at is not None:
                    break
        except SimulationFailure:
            raise
        except Exception as e:  # an invariant the core itself checks, or a crash in it
            self._fail(f"{type(e).__name__}: {e}")
        if self.done_at is None:
            self._fail("the schedule ran out of events before converging")
        return SimulationResult(
            seed=self.seed,
            scenario=scenario,
            events=self.events,
            simulated_ms=self.now_ms,
            leaders=dict(self.leaders),
            committed=len(self.committed),
            acknowledged=len(self.acknowledged),
            messages=self.messages,
            snapshot_loads=sum(n.snapshot_loads for n in self.nodes.values()),
            recovery_ms=(self.committed_at or self.done_at) - scenario.chaos_ms,
            catch_up_ms=self.done_at - scenario.chaos_ms,
            membership_changes=self.membership_changes,
            membership_refusals=self.membership_refusals,
        )

    def _schedule(self, at_ms: int, kind: str, payload: Any) -> None:
        self._seq += 1
        heapq.heappush(self._queue, (at_ms, self._seq, kind, payload))

    def _plan_faults(self) -> None:
        rng, scenario = self.rng, self.scenario
        ids = sorted(self.nodes)
        for _ in range(scenario.crashes):
            at = rng.randrange(scenario.chaos_ms)
            # None: whoever leads at that moment.
            target = rng.choice([None, *ids])
            self._schedule(at, "crash", (target, rng.random() < 0.5))
        for _ in range(scenario.outages):
            # A power outage: every replica crashes at once, each losing what it had not
            # flushed or not, and they come back one by one.
            self._schedule(rng.randrange(scenario.chaos_ms), "outage", None)
        for _ in range(scenario.partitions):
            at = rng.randrange(scenario.chaos_ms)
            self._schedule(at, "partition", None)
        for _ in range(scenario.resigns):
            self._schedule(rng.randrange(scenario.chaos_ms), "resign", None)
        for _ in range(scenario.membership_changes):
            self._schedule(rng.randrange(scenario.chaos_ms), "membership", None)
        for _ in range(scenario.wipes):
            self._schedule(rng.randrange(scenario.chaos_ms), "wipe", None)
        at = rng.randrange(scenario.proposal_interval_ms)
        while at < scenario.chaos_ms:
            self._schedule(at, "propose", None)
            at += rng.randint(1, 2 * scenario.proposal_interval_ms)

    def _dispatch(self, kind: str, payload: Any) -> None:
        if kind == "deliver":
            self._deliver(*payload)
        elif kind == "tick":
            self._tick(payload)
        elif kind == "unreachable":
            self._unreachable(*payload)
        elif kind == "flush":
            self._flush(*payload)
        elif kind == "start":
            self._restart(payload)
        elif kind == "crash":
            self._crash(*payload)
        elif kind == "restart":
            self._restart(payload)
        elif kind == "outage":
            for node_id in sorted(self.nodes):
                self._crash(node_id, self.rng.random() < 0.7)
        elif kind == "partition":
            self._partition(*(payload or ()))
        elif kind == "unpartition":
            self.blocked.difference_update(payload)
            self._note(f"partition healed {sorted(payload)}")
        elif kind == "resign":
            self._resign()
        elif kind == "wipe":
            self._wipe(payload)
        elif kind == "operator":
            self._remove_former_incarnations()
        elif kind == "join":
            self._deliver_join(*payload)
        elif kind == "membership":
            self._change_membership(*(payload or ()))
        elif kind == "propose":
            self._propose()
        elif kind == "heal":
            self._heal()
        else:
            raise ValueError(kind)

    # --- Nodes -----------------------------------------------------------------------

    def _start(self, node_id: int) -> None:
        sim_node = self.nodes[node_id]
        sim_node.incarnation += 1
        sim_node.flush_pending = False
        sim_node.applied_offset = 0
        sim_node.applied = {}
        sim_node.verified_offset = 0
        dynamic = self.is_dynamic
        if sim_node.wiped:
            sim_node.wiped = False
            sim_node.committed_voters = (-1, self._discover_voters(node_id))
        kept = sim_node.committed_voters
        latest = sim_node.snapshots.latest()
        carried = None if latest is None or not dynamic else _snapshot_voters(sim_node, latest)
        if carried is not None and (kept is None or carried[0] > kept[0]):
            kept = carried  # the driver's rule: the latest snapshot's set when it is newer
        sim_node.node = RaftNode(
            node_id,
            (kept[1] if kept else self.bootstrap_voters) if dynamic else self.voter_ids,
            sim_node.log,
            sim_node.snapshots,
            voters_offset=kept[0] if kept else -1,
            cluster_id=CLUSTER_ID,
            election_state=sim_node.persisted,
            random=random.Random(f"{self.seed}-{node_id}-{sim_node.incarnation}"),
            config=self.config,
            now_ms=self.now_ms,
            directory_id=self.directory_ids[node_id] if dynamic else None,
            # A controller's fetches announce its endpoint; a broker's announce none.
            endpoint=f"node-{node_id}" if dynamic and node_id not in self.broker_ids else "",
            snapshot_voters=(
                (lambda snapshot_id: _snapshot_voters(sim_node, snapshot_id)) if dynamic else None
            ),
        )
        self._note(f"start {node_id} with {sim_node.persisted} {sim_node.log!r}")
        sim_node.tick_at = None
        sim_node.joined = self._joined(sim_node, sim_node.node.committed_voter_set())
        self._after(sim_node)

    @property
    def is_dynamic(self) -> bool:
        return self.scenario.membership_changes > 0 or self.scenario.dynamic

    def _tick(self, payload: tuple[int, int, int]) -> None:
        node_id, incarnation, at_ms = payload
        sim_node = self.nodes[node_id]
        if (
            sim_node.node is None
            or sim_node.incarnation != incarnation
            or sim_node.tick_at != at_ms
        ):
            return  # a crashed incarnation's, or replaced by an earlier deadline
        sim_node.tick_at = None
        sim_node.node.tick(self.now_ms)
        self._after(sim_node)

    def _arm_tick(self, sim_node: SimNode) -> None:
        """Schedule the node's next tick at its next deadline, as the driver sleeps."""
        assert sim_node.node is not None
        deadline_ms = sim_node.node.next_deadline_ms()
        if deadline_ms is None:
            return
        at_ms = max(deadline_ms, self.now_ms + 1)
        if sim_node.tick_at is not None and sim_node.tick_at <= at_ms:
            return
        sim_node.tick_at = at_ms
        self._schedule(at_ms, "tick", (sim_node.node_id, sim_node.incarnation, at_ms))

    def _unreachable(self, node_id: int, incarnation: int, peer_id: int) -> None:
        sim_node = self.nodes[node_id]
        if sim_node.node is None or sim_node.incarnation != incarnation:
            return
        if self.print_trace:
            self._note(f"{node_id} cannot reach {peer_id}")
        sim_node.node.peer_unreachable(peer_id, self.now_ms)
        self._after(sim_node)

    def _flush(self, node_id: int, incarnation: int) -> None:
        sim_node = self.nodes[node_id]
        if sim_node.node is None or sim_node.incarnation != incarnation:
            return
        sim_node.flush_pending = False
        sim_node.log.mark_flushed(sim_node.log.end_offset)
        sim_node.node.on_flushed(sim_node.log.end_offset, self.now_ms)
        self._after(sim_node)

    def _crash(self, node_id: int | None, lose_unflushed: bool) -> None:
        if node_id is None:
            leaders = [i for i, n in self.nodes.items() if n.node is not None and n.node.is_leader]
            if not leaders:
                return
            node_id = leaders[0]
        sim_node = self.nodes[node_id]
        if sim_node.node is None:
            return
        self._note(f"crash {node_id} lose_unflushed={lose_unflushed} {sim_node.log!r}")
        sim_node.node = None
        sim_node.incarnation += 1
        sim_node.log.crash(lose_unflushed)
        sim_node.snapshots.crash()
        if not self.healed:
            self._schedule(self.now_ms + self.rng.randint(20, 600), "restart", node_id)

    def wipe(self, at_ms: int, node_id: int = 0) -> None:
        """Plan the wipe of ``node_id``'s data directory at ``at_ms`` (``0``: the leader's)."""
        self._schedule(at_ms, "wipe", node_id)

    def _wipe(self, node_id: int | None = None) -> None:
        """A replica's data directory is lost: it crashes and comes back empty, under a new
        directory id (its log, snapshots, election state and kept voters are gone).
        ``node_id`` None: a random replica that may be; 0: the leader."""
        up = sorted(i for i, n in self.nodes.items() if n.node is not None)
        if node_id == 0:
            up = [i for i in up if self.nodes[i].node.is_leader]  # type: ignore[union-attr]
        elif node_id is not None:
            up = [i for i in up if i == node_id]
        candidates = [i for i in up if self._may_wipe(i)]
        if not candidates:
            self._note("no replica may be wiped without losing the quorum for good")
            return
        node_id = self.rng.choice(candidates)
        self.wipes += 1
        self._crash(node_id, lose_unflushed=True)
        sim_node = self.nodes[node_id]
        log = sim_node.log
        self.former[(node_id, self.directory_ids[node_id])] = (
            log.start_offset,
            [
                (e.offset, (e.epoch, e.value, e.is_control))
                for e in log.entries(log.start_offset, log.end_offset)
            ],
        )
        sim_node.log = InMemoryRaftLog()
        sim_node.snapshots = InMemorySnapshotStore()
        sim_node.persisted = None
        sim_node.committed_voters = None
        sim_node.last_snapshot_offset = 0
        sim_node.wiped = True
        self.directory_ids[node_id] = uuid.UUID(int=self.rng.getrandbits(128))
        self._note(f"wipe {node_id}: new directory {self.directory_ids[node_id]}")

    def _voter_sets(self) -> list[VoterSet]:
        """Every voter set a replica uses, keeps, or would use on restart (its log's)."""
        sets = []
        for sim_node in self.nodes.values():
            if sim_node.node is not None:
                sets.append(sim_node.node.voter_set)
            if sim_node.committed_voters is not None:
                sets.append(sim_node.committed_voters[1])
            log = sim_node.log
            in_log = [
                entry.value
                for entry in log.entries(log.start_offset, log.end_offset)
                if entry.is_control and entry.value is not None and is_voters_record(entry.value)
            ]
            if in_log:
                sets.append(decode_voters_record(in_log[-1]))
        return sets

    def _is_former(self, voter: Voter) -> bool:
        """Whether ``voter`` is the key of a replica's incarnation before a wipe."""
        return voter.directory_id != self.directory_ids[voter.node_id]

    def _may_wipe(self, node_id: int) -> bool:
        """Whether a wipe of ``node_id`` leaves the quorum able to elect a leader once the
        faults stop. A disk loss is no fault Raft tolerates by itself (only stable storage
        makes a vote or an acknowledgement count), so the schedule loses at most what a
        set can spare: one key of a set of at least three, and only while every replica
        uses and keeps the same set. During a change a lost disk can wedge the quorum for
        good: the sole other holder of an uncommitted record that removes a voter is that
        voter, which the record makes an observer (it never campaigns) and whose longer
        log refuses the votes the others need."""
        sets = self._voter_sets()
        if any(voters != sets[0] for voters in sets):
            return False
        voters = sets[0]
        if self.adds_in_flight[node_id]:
            # Its auto-join's AddRaftVoter may still reach the leader and add the key
            # the wipe kills, beside a former incarnation or with no spare voter.
            return False
        if node_id not in voters.ids:
            return True
        return len(voters) >= 3 and not any(self._is_former(v) for v in voters)

    def _discover_voters(self, node_id: int) -> VoterSet:
        """The voters a wiped replica's ``--bootstrap-controllers`` discovery finds: the set
        in use of a replica that answers DescribeQuorum (the newest among them), or what
        one that is down last kept."""
        found: list[tuple[int, VoterSet]] = []
        for other_id, other in sorted(self.nodes.items()):
            if other_id == node_id:
                continue
            if other.node is not None:
                found.append((other.node.voters_offset, other.node.voter_set))
            elif other.committed_voters is not None:
                found.append(other.committed_voters)
        return max(found, key=lambda entry: entry[0])[1] if found else self.bootstrap_voters

    def _remove_former_incarnations(self) -> None:
        """The operator, once the faults stop: remove a voter key whose replica was wiped
        (``quorum remove-controller --directory-id``), until no committed set names one.
        As the command waits for the new set to commit, the operator does not stop at a
        removal that is only appended: a new leader may truncate it (seed 837,580 did,
        and the former key stayed for good)."""
        leaders = [n for n in self.nodes.values() if n.node is not None and n.node.is_leader]
        committed_stale = []
        if leaders:
            node = leaders[0].node
            assert node is not None
            committed_stale = [v for v in node.committed_voter_set() if self._is_former(v)]
            stale = [v for v in node.voter_set if self._is_former(v)]
            if stale:
                try:
                    node.remove_voter(stale[0].node_id, stale[0].directory_id, self.now_ms)
                    self._note(f"operator removes former incarnation {stale[0]}")
                except MembershipChangeError as refusal:
                    self._note(f"operator's removal refused: {refusal}")
                self._after(leaders[0])
        if not leaders or committed_stale:
            self._schedule(self.now_ms + 50, "operator", None)

    def _restart(self, node_id: int) -> None:
        if self.nodes[node_id].node is None:
            self._start(node_id)

    def _resign(self) -> None:
        for sim_node in self.nodes.values():
            if sim_node.node is not None and sim_node.node.is_leader:
                self._note(f"resign {sim_node.node_id}")
                sim_node.node.resign(self.now_ms)
                self._after(sim_node)

    def change_membership(
        self, at_ms: int, *, add: int | None = None, remove: int | None = None
    ) -> None:
        """Plan a voter change at ``at_ms``: add ``add``, remove ``remove`` (``0``: the
        leader itself), or (neither) a random one."""
        self._schedule(at_ms, "membership", (add, remove))

    def _change_membership(self, add: int | None = None, remove: int | None = None) -> None:
        leaders = [n for n in self.nodes.values() if n.node is not None and n.node.is_leader]
        if not leaders:
            return
        leader = leaders[0]
        node = leader.node
        assert node is not None
        voters = node.voter_set
        if add is None and remove is None:
            non_voters = sorted(set(self.nodes) - voters.ids)
            former = [v for v in voters if self.is_dynamic and self._is_former(v)]
            if former and self.scenario.auto_join:
                return  # the wiped replica asks for its former incarnation's removal
            if former:
                remove = former[0].node_id  # the operator replaces a wiped voter first
            elif non_voters and (len(voters) < 3 or self.rng.random() < 0.5):
                add = self.rng.choice(non_voters)
            else:
                remove = self.rng.choice(sorted(voters.ids))
        try:
            if add is not None:
                voter = Voter(add, self.directory_ids[add], f"node-{add}")
                appended = node.add_voter(voter, self.now_ms)
            else:
                target = leader.node_id if remove == 0 else remove
                assert target is not None
                appended = node.remove_voter(target, None, self.now_ms)
        except MembershipChangeError as refusal:
            self.membership_refusals[type(refusal).__name__] += 1
            self._note(f"membership change refused: {refusal}")
            return
        if add in self.broker_ids:
            self._fail(f"leader {leader.node_id} added broker {add}'s metadata replica as a voter")
        self.membership_changes += 1
        self._note(
            f"leader {leader.node_id} appends voters {sorted(node.voter_set.ids)} at {appended}"
        )
        self._after(leader)

    # --- Auto-join -------------------------------------------------------------------

    def _joined(self, sim_node: SimNode, committed: VoterSet) -> bool:
        directory_id = self.directory_ids[sim_node.node_id] if self.is_dynamic else None
        return committed.is_voter(sim_node.node_id, directory_id)

    def _send_join(self, sim_node: SimNode, join: JoinRequest) -> None:
        """An auto-joining replica's AddRaftVoter or RemoveRaftVoter, over the network."""
        if sim_node.node_id in self.broker_ids:
            self._fail(f"broker {sim_node.node_id}'s metadata replica asked to join: {join}")
        if join.add and join.voter.directory_id != self.directory_ids[sim_node.node_id]:
            self._fail(f"node {sim_node.node_id} asked to add another incarnation: {join}")
        self.messages["JoinRequest"] += 1
        if self.rng.random() < self.drop_rate or (sim_node.node_id, join.leader_id) in self.blocked:
            return
        delay = self.rng.randint(1, self.scenario.max_delay_ms)
        self._schedule(self.now_ms + delay, "join", (sim_node.node_id, join))
        if join.add:
            self.adds_in_flight[sim_node.node_id] += 1

    def _deliver_join(self, source: int, join: JoinRequest) -> None:
        if join.add:
            self.adds_in_flight[source] -= 1
        leader = self.nodes[join.leader_id]
        node = leader.node
        if node is None or (source, join.leader_id) in self.blocked:
            return
        try:
            if join.add:
                node.add_voter(join.voter, self.now_ms)
            else:
                node.remove_voter(join.voter.node_id, join.voter.directory_id, self.now_ms)
        except (MembershipChangeError, NotLeaderError) as refusal:
            self.auto_joins[type(refusal).__name__] += 1
            return
        self.auto_joins["added" if join.add else "removed"] += 1
        self.membership_changes += 1
        self._note(
            f"auto-join of {source}: leader {join.leader_id} appends voters "
            f"{sorted(node.voter_set.ids)}"
        )
        self._after(leader)

    def _not_joined(self) -> list[int]:
        """What the schedule still waits for once the faults stopped: the node ids of the
        wiped replicas' former incarnations the operator has yet to remove, or with
        auto-join the controllers it has yet to bring in."""
        if not self.scenario.auto_join:
            leaders = [
                n.node for n in self.nodes.values() if n.node is not None and n.node.is_leader
            ]
            if not self.wipes or not leaders:
                return []
            committed = leaders[0].committed_voter_set()
            return [v.node_id for v in committed if self._is_former(v)]
        return [
            node_id
            for node_id, sim_node in self.nodes.items()
            if node_id not in self.broker_ids and sim_node.node is not None and not sim_node.joined
        ]

    # --- The network -----------------------------------------------------------------

    def _send(self, message: RaftMessage) -> None:
        self.messages[type(message).__name__] += 1
        if self.rng.random() < self.drop_rate:
            return
        copies = 2 if self.rng.random() < self.duplicate_rate else 1
        destination = self.nodes[message.destination]
        for _ in range(copies):
            delay = self.rng.randint(1, self.scenario.max_delay_ms)
            self._schedule(self.now_ms + delay, "deliver", (message, destination.incarnation))

    def _deliver(self, message: RaftMessage, incarnation: int) -> None:
        destination = self.nodes[message.destination]
        if (message.source, message.destination) in self.blocked:
            return
        if destination.node is None or destination.incarnation != incarnation:
            if destination.node is None and is_request(message):
                # A crashed process refuses the connection: the sender hears of it (a
                # partition, above, is silent).
                source = self.nodes[message.source]
                self._schedule(
                    self.now_ms + self.rng.randint(1, self.scenario.max_delay_ms),
                    "unreachable",
                    (message.source, source.incarnation, message.destination),
                )
            return
        if self.print_trace:
            self._note(f"deliver {render(message)}")
        destination.node.step(message, self.now_ms)
        self._after(destination)

    def _partition(
        self, group: Iterable[int] | str | None = None, duration_ms: int | None = None
    ) -> None:
        ids = sorted(self.nodes)
        if group == "leader":
            group = [i for i, n in self.nodes.items() if n.node is not None and n.node.is_leader]
        if group is None or isinstance(group, str):
            group = self.rng.sample(ids, self.rng.randint(1, len(ids) // 2))
        if duration_ms is None:
            duration_ms = self.rng.randint(50, 800)
        members = set(group)
        cut = {(a, b) for a in ids for b in ids if (a in members) != (b in members)}
        self.blocked |= cut
        self._note(f"partition {sorted(members)} from the rest")
        self._schedule(self.now_ms + duration_ms, "unpartition", cut)

    def isolate(self, node_ids: Iterable[int] | str, from_ms: int, to_ms: int) -> None:
        """Plan a partition of ``node_ids`` (or ``"leader"``: whoever leads at ``from_ms``)
        from the others over ``[from_ms, to_ms)``."""
        group = node_ids if isinstance(node_ids, str) else tuple(node_ids)
        self._schedule(from_ms, "partition", (group, to_ms - from_ms))

    def _heal(self) -> None:
        """The faults stop: from now on a leader must be elected and commit, bounded."""
        self._note("heal: restart every node, drop no message, no partitions")
        self.healed = True
        self.blocked.clear()
        self.drop_rate = 0.0
        for node_id, sim_node in self.nodes.items():
            if sim_node.node is None:
                self._start(node_id)
        if self.wipes and not self.scenario.auto_join:
            self._schedule(self.now_ms + 50, "operator", None)

    # --- The client ------------------------------------------------------------------

    def _propose(self) -> None:
        leaders = [n for n in self.nodes.values() if n.node is not None and n.node.is_leader]
        target = self.rng.choice(leaders) if leaders else self.rng.choice(list(self.nodes.values()))
        if target.node is None:
            return
        self.proposals += 1
        value = f"v{self.seed}-{self.proposals}".encode()
        try:
            appended = target.node.propose([value], self.now_ms)
        except NotLeaderError:
            return
        self.pending[value] = (target.node_id, appended)
        self._after(target)

    def _propose_final(self) -> None:
        """After healing: propose a value at the leader (again, if leadership changed)."""
        if self.final_value is not None:
            leader_id, appended = self.pending[self.final_value]
            leader = self.nodes[leader_id].node
            if leader is not None and leader.is_leader and leader.epoch == appended.epoch:
                return  # still on its way
        for sim_node in self.nodes.values():
            if sim_node.node is not None and sim_node.node.is_leader:
                self.proposals += 1
                self.final_value = f"final{self.seed}-{self.proposals}".encode()
                appended = sim_node.node.propose([self.final_value], self.now_ms)
                self.pending[self.final_value] = (sim_node.node_id, appended)
                self._after(sim_node)
                return

    # --- The driver: apply a node's effects, then check --------------------------------

    def _after(self, sim_node: SimNode) -> None:
        node = sim_node.node
        if node is None:
            return
        self._arm_tick(sim_node)
        ready = node.ready()
        if ready.is_empty and not self.healed:
            return  # nothing happened that a check could see
        if ready.election_state is not None:
            sim_node.persisted = ready.election_state
        if ready.committed_voters is not None:
            sim_node.committed_voters = ready.committed_voters
            if self._joined(sim_node, ready.committed_voters[1]):
                sim_node.joined = True
        if ready.join is not None:
            self._send_join(sim_node, ready.join)
        if ready.must_flush and not sim_node.flush_pending:
            sim_node.flush_pending = True
            self._schedule(
                self.now_ms + self.rng.randint(1, sim_node.max_flush_delay_ms),
                "flush",
                (sim_node.node_id, sim_node.incarnation),
            )
        crash_after_sending = False
        for message in ready.messages:
            self._send(message)
            if isinstance(message, VoteResponse) and message.vote_granted and not message.pre_vote:
                # One vote per voter and epoch, across restarts.
                vote = (message.source, message.leader_epoch)
                if self.votes.setdefault(vote, message.destination) != message.destination:
                    self._fail(
                        f"voter {message.source} voted for {self.votes[vote]} and for "
                        f"{message.destination} in epoch {message.leader_epoch}"
                    )
                if not self.healed and self.rng.random() < self.scenario.crash_after_vote_rate:
                    crash_after_sending = True
        if crash_after_sending:
            # The vote is out: only what the driver persisted before sending it survives.
            self._crash(sim_node.node_id, lose_unflushed=True)
            return
        if ready.load_snapshot is not None:
            self._load_snapshot(sim_node, ready.load_snapshot)
        if ready.high_watermark is not None:
            self._on_high_watermark(sim_node, ready.high_watermark)
        if ready.role is not None:
            self._note(
                f"node {sim_node.node_id}: {ready.role.role.value} epoch {ready.role.epoch} "
                f"leader {ready.role.leader_id}"
            )
        self._check_node(sim_node)
        if self.healed and self.done_at is None:
            self._check_liveness()

    def _load_snapshot(self, sim_node: SimNode, snapshot_id: OffsetAndEpoch) -> None:
        data = json.loads(sim_node.snapshots.read(snapshot_id))
        entries = {int(offset): None if v is None else v.encode() for offset, v in data["entries"]}
        if data["offset"] != snapshot_id.offset:
            self._fail(f"snapshot {snapshot_id} holds the state at {data['offset']}")
        for offset in range(snapshot_id.offset):
            self._check_committed_value(sim_node, offset, entries.get(offset, _CONTROL))
        sim_node.applied = entries
        sim_node.applied_offset = snapshot_id.offset
        sim_node.last_snapshot_offset = snapshot_id.offset
        sim_node.verified_offset = max(sim_node.verified_offset, snapshot_id.offset)
        sim_node.snapshot_loads += 1
        self._note(f"node {sim_node.node_id} loads snapshot {snapshot_id}")

    def _on_high_watermark(self, sim_node: SimNode, high_watermark: int) -> None:
        log = sim_node.log
        node = sim_node.node
        assert node is not None
        # Committed entries: identical on every replica that holds them, forever.
        start = max(sim_node.verified_offset, log.start_offset)
        for entry in log.entries(start, high_watermark):
            record = (entry.epoch, entry.value, entry.is_control)
            if entry.offset < len(self.committed):
                if self.committed[entry.offset] != record:
                    self._fail(
                        f"node {sim_node.node_id} has {record} at committed offset {entry.offset}, "
                        f"committed was {self.committed[entry.offset]}"
                    )
            elif entry.offset == len(self.committed):
                self.committed.append(record)
                if node.is_leader:
                    # Counted by the set the leader uses: the latest in its log.
                    self._check_durable_on_majority(entry.offset, record, (node.voter_set,))
            else:
                self._fail(f"committed offset {entry.offset} seen before {len(self.committed)}")
        sim_node.verified_offset = max(sim_node.verified_offset, high_watermark)
        # Apply to the state machine.
        if sim_node.applied_offset < log.start_offset:
            self._fail(
                f"node {sim_node.node_id} applied up to {sim_node.applied_offset}, "
                f"its log starts at {log.start_offset}"
            )
        for entry in log.entries(sim_node.applied_offset, high_watermark):
            if not entry.is_control:
                sim_node.applied[entry.offset] = entry.value
        sim_node.applied_offset = max(sim_node.applied_offset, high_watermark)
        # Acknowledge the proposals this leader now knows committed.
        if node.is_leader:
            for value, (leader_id, appended) in list(self.pending.items()):
                if (
                    leader_id == sim_node.node_id
                    and appended.offset < high_watermark
                    and appended.epoch == node.epoch
                ):
                    del self.pending[value]
                    self.acknowledged[value] = appended
                    if self.committed[appended.offset] != (appended.epoch, value, False):
                        self._fail(
                            f"acknowledged {value!r} at {appended} but "
                            f"{self.committed[appended.offset]} is committed"
                        )
                    if value == self.final_value:
                        self.final_ack = appended
                        self.committed_at = self.now_ms
        # Snapshot now and then.
        if (
            self.scenario.snapshots
            and sim_node.applied_offset - sim_node.last_snapshot_offset
            >= self.scenario.snapshot_every
            and sim_node.applied_offset > log.start_offset
        ):
            offset = sim_node.applied_offset
            snapshot_id = OffsetAndEpoch(offset, log.entry(offset - 1).epoch)
            data: dict[str, Any] = {
                "offset": offset,
                "entries": [
                    [o, None if v is None else v.decode()]
                    for o, v in sorted(sim_node.applied.items())
                ],
            }
            if self.is_dynamic:
                # The driver's voters section: the set in force at the snapshot's offset.
                voters_offset, voters = node.voters_at(offset)
                data["voters"] = [voters_offset, encode_voters_record(voters).decode()]
            sim_node.snapshots.write(snapshot_id, json.dumps(data).encode())
            node.snapshot_written(snapshot_id)
            sim_node.last_snapshot_offset = offset
            self._note(f"node {sim_node.node_id} snapshots at {snapshot_id}")

    def _check_durable_on_majority(
        self,
        offset: int,
        record: tuple[int, bytes | None, bool],
        voter_sets: Iterable[VoterSet],
    ) -> None:
        """A committed entry is durable on a majority of voters (flushed, or in a snapshot)."""
        for voters in voter_sets:
            durable = self._durable_on(offset, record, voters)
            if durable > len(voters) // 2:
                return
        self._fail(f"offset {offset} is committed but durable on only {durable} voters")

    def _durable_on(
        self, offset: int, record: tuple[int, bytes | None, bool], voters: VoterSet
    ) -> int:
        """On how many of ``voters``' keys the entry is durable: a wiped replica's former
        key by what it held when its disk went (its new incarnation is another replica)."""
        durable = 0
        for voter in voters:
            if self.is_dynamic and self._is_former(voter):
                start, entries = self.former.get(voter.key, (0, []))
                durable += offset < start or (offset, record) in entries
                continue
            log = self.nodes[voter.node_id].log
            if offset < log.start_offset:
                durable += 1
            elif offset < log.flushed_offset:
                entry = log.entry(offset)
                durable += (entry.epoch, entry.value, entry.is_control) == record
        return durable

    def _check_committed_value(self, sim_node: SimNode, offset: int, value: Any) -> None:
        if offset >= len(self.committed):
            self._fail(f"node {sim_node.node_id} holds state past the committed log at {offset}")
        _, committed_value, control = self.committed[offset]
        expected = _CONTROL if control else committed_value
        if value != expected:
            self._fail(
                f"node {sim_node.node_id} state at {offset} is {value!r}, committed {expected!r}"
            )

    def _check_node(self, sim_node: SimNode) -> None:
        node = sim_node.node
        assert node is not None
        if self.broker_ids & node.voter_set.ids:
            self._fail(
                f"node {sim_node.node_id}'s voter set {sorted(node.voter_set.ids)} names a "
                "broker's metadata replica"
            )
        if node.is_leader:
            epoch = node.epoch
            leader = self.leaders.setdefault(epoch, sim_node.node_id)
            if leader != sim_node.node_id:
                self._fail(f"two leaders in epoch {epoch}: {leader} and {sim_node.node_id}")
            if getattr(node, "_checked_epoch", None) != epoch:
                # Leader completeness: a new leader holds every committed entry.
                node._checked_epoch = epoch  # type: ignore[attr-defined]
                log = sim_node.log
                if log.end_offset < len(self.committed):
                    self._fail(
                        f"leader {sim_node.node_id} of epoch {epoch} ends at {log.end_offset}, "
                        f"{len(self.committed)} entries are committed"
                    )
                for entry in log.entries(log.start_offset, len(self.committed)):
                    if self.committed[entry.offset] != (entry.epoch, entry.value, entry.is_control):
                        self._fail(
                            f"leader {sim_node.node_id} of epoch {epoch} lacks committed "
                            f"offset {entry.offset}"
                        )
        if sim_node.log.end_offset < sim_node.verified_offset:
            self._fail(
                f"node {sim_node.node_id} lost committed entries: log ends at "
                f"{sim_node.log.end_offset}, verified up to {sim_node.verified_offset}"
            )

    def _check_liveness(self) -> None:
        if self.final_ack is None:
            self._propose_final()
            return
        # Every replica, observers included, must catch up with the final entry, and the
        # wiped replicas' former keys must be gone (and with auto-join every controller
        # must have joined).
        for sim_node in self.nodes.values():
            if sim_node.node is None or sim_node.applied_offset <= self.final_ack.offset:
                return
        if self._not_joined():
            return
        for sim_node in self.nodes.values():
            for value, appended in self.acknowledged.items():
                if sim_node.applied.get(appended.offset) != value:
                    self._fail(
                        f"node {sim_node.node_id} lacks acknowledged {value!r} at {appended}"
                    )
        self.done_at = self.now_ms

    # --- Diagnostics -----------------------------------------------------------------

    def _note(self, text: str) -> None:
        line = f"{self.now_ms:>6} {text}"
        self.trace.append(line)
        if self.print_trace:
            print(line)

    def _fail(self, reason: str) -> NoReturn:
        for sim_node in self.nodes.values():
            self._note(
                f"state of {sim_node.node_id}: {sim_node.node!r} applied {sim_node.applied_offset} "
                f"persisted {sim_node.persisted}"
            )
        self._note(
            f"final value {self.final_value!r} pending {self.pending.get(self.final_value or b'')}"
        )
        raise SimulationFailure(self.seed, reason, list(self.trace))


_CONTROL = object()


def _snapshot_voters(sim_node: SimNode, snapshot_id: OffsetAndEpoch) -> tuple[int, VoterSet] | None:
    """The voter set a snapshot carries (its record's offset, the set), as
    ``voter_files.read_snapshot_voters`` reads the driver's voters section."""
    carried = json.loads(sim_node.snapshots.read(snapshot_id)).get("voters")
    if carried is None:
        return None
    return int(carried[0]), decode_voters_record(carried[1].encode())


def run_schedule(seed: int, *, trace: bool = False, **overrides: Any) -> SimulationResult:
    """Run the schedule of ``seed`` (its scenario adjusted by ``overrides``)."""
    return Simulation(seed, Scenario.from_seed(seed, **overrides), trace=trace).run()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--seed", type=int, help="run this schedule")
    parser.add_argument("--seeds", type=int, default=0, help="run this many schedules")
    parser.add_argument("--first-seed", type=int, default=0, help="the first of --seeds")
    parser.add_argument("--voters", type=int, help="override the number of voters")
    parser.add_argument("--snapshots", action="store_true", help="force snapshots on")
    parser.add_argument("--trace", action="store_true", help="print every event")
    args = parser.parse_args(argv)
    overrides: dict[str, Any] = {}
    if args.voters:
        overrides["voters"] = args.voters
    if args.snapshots:
        overrides["snapshots"] = True
    if args.seed is not None:
        try:
            result = run_schedule(args.seed, trace=args.trace, **overrides)
        except SimulationFailure as e:
            print(e, file=sys.stderr)
            return 1
        print(result.summary())
        return 0
    started = time.perf_counter()
    failures = 0
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        try:
            run_schedule(seed, **overrides)
        except SimulationFailure as e:
            failures += 1
            print(str(e).splitlines()[0], file=sys.stderr)
    elapsed = time.perf_counter() - started
    print(f"{args.seeds} schedules, {failures} failed, {elapsed:.1f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
