"""The Raft node: a pure, pull-based (KRaft) Raft core that takes events and returns effects.

A :class:`RaftNode` has no sockets, files, clocks, sleeps or threads. The driver feeds it
events — :meth:`~RaftNode.tick` as time passes, :meth:`~RaftNode.step` for each message
received, :meth:`~RaftNode.propose` for new entries, :meth:`~RaftNode.on_flushed` after
an fsync — and takes the effects with :meth:`~RaftNode.ready`, applying them in the
order :class:`Ready` lists them: persist the election state, flush the log, send the
messages, reload the state machine from a snapshot, apply committed entries.

The protocol is Kafka's KRaft (KIP-595, KIP-630, KIP-996):

* **Elections.** A voter whose leader went quiet (no fetch answered for
  ``fetch_timeout_ms``), or that knows no leader for a randomized election timeout,
  becomes *prospective* and asks for pre-votes without bumping its epoch. Voters refuse
  a pre-vote while they still hear from a leader, so a replica that was cut off cannot
  force an election when it comes back. With a majority of pre-votes it becomes
  *candidate*: epoch + 1, a vote for itself, vote requests. A vote is granted when the
  candidate's epoch is at least ours, we have not voted for another in it, and its log
  (last epoch, end offset) is at least as up to date as ours; the vote is persisted
  before the answer leaves. A lost election backs off exponentially, with jitter.
* **Leadership.** The winner appends a control record in its new epoch (only an entry of
  its own epoch can move the high watermark), then announces itself with
  ``BeginQuorumEpoch`` until every voter has answered or fetched. A leader that does
  not hear from a majority within ``fetch_timeout_ms`` resigns; :meth:`RaftNode.resign`
  resigns gracefully, naming the most caught-up voters as preferred successors in
  ``EndQuorumEpoch``.
* **Replication.** Followers and observers pull: ``Fetch(fetch_offset=log end,
  last_fetched_epoch)``. The leader validates the position against its log: a diverging
  log is told where the common prefix ends (``diverging_epoch``) and truncates there in
  one step; a position below the leader's log start is told to load the leader's
  snapshot (``snapshot_id``, then ``FetchSnapshot`` in chunks). A fetch with nothing to
  return is parked until data arrives, the high watermark moves or ``max_wait_ms``
  passes. A voter fetches again only once what it appended is flushed, so its fetch
  offset is durable progress. The high watermark is the largest offset a majority of
  voters has reached (the leader counted at its flushed offset), once that offset is in
  the leader's epoch; it never goes backwards.
"""

from __future__ import annotations

import random as _random
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal, overload

from highwater.errors import HighwaterError
from highwater.raft.log import RaftLog, encode_leader_change
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
    RaftMessage,
    VoteRequest,
    VoteResponse,
)
from highwater.raft.snapshot import (
    PositionOutOfRangeError,
    SnapshotNotFoundError,
    SnapshotStore,
)
from highwater.raft.state import (
    CandidateState,
    ElectionState,
    EpochState,
    FollowerState,
    IllegalTransitionError,
    LeaderState,
    ProspectiveState,
    QuorumState,
    ResignedState,
    Role,
    SnapshotFetch,
    UnattachedState,
)
from highwater.raft.voter_set import (
    NO_DIRECTORY_ID,
    LeaderView,
    MembershipChangeError,
    Voter,
    VoterSet,
    VoterSetHistory,
    check_add_voter,
    check_remove_voter,
    check_update_voter,
    decode_voters_record,
    encode_voters_record,
    is_voters_record,
)
from highwater.records import iter_batches
from highwater.v1.common_pb2 import ErrorCode

__all__ = [
    "NotLeaderError",
    "RaftConfig",
    "RaftNode",
    "Ready",
    "RoleChange",
    "StaticQuorumError",
]

_NONE = ErrorCode.NONE
_FENCED_LEADER_EPOCH = ErrorCode.FENCED_LEADER_EPOCH
_NOT_LEADER_OR_FOLLOWER = ErrorCode.NOT_LEADER_OR_FOLLOWER
_UNKNOWN_LEADER_EPOCH = ErrorCode.UNKNOWN_LEADER_EPOCH
# The request tracker's key for an observer's search for the leader among the voters.
_LEADER_DISCOVERY = -1


@dataclass(frozen=True, slots=True)
class RaftConfig:
    """The quorum's timing and sizes, with Kafka's defaults (``quorum.*`` settings)."""

    election_timeout_ms: int = 1000
    """``quorum.election.timeout.ms``: randomized in ``[t, 2t)``."""
    election_backoff_max_ms: int = 1000
    """``quorum.election.backoff.max.ms``: the cap of the exponential election backoff."""
    fetch_timeout_ms: int = 2000
    """``quorum.fetch.timeout.ms``: silence after which a follower looks for a new leader,
    and a leader that heard from no majority resigns."""
    fetch_max_wait_ms: int = 500
    """How long the leader parks a fetch with nothing to return (the long poll)."""
    high_watermark_linger_ms: int = 10
    """How long the leader holds a voter's parked fetch after the high watermark moved,
    so that the news rides along with the next entries instead of costing the follower a
    round trip of its own (observers hear at once: they serve the committed log)."""
    fetch_max_bytes: int = 1024 * 1024
    """The most a fetch returns (at least one batch). Kafka's KRaft asks for 8 MiB; 1 MiB
    stays well inside gRPC's default 4 MiB message limit."""
    snapshot_chunk_bytes: int = 1024 * 1024
    """The most one ``FetchSnapshot`` answer carries."""
    request_timeout_ms: int = 2000
    """``quorum.request.timeout.ms``: when an unanswered request is sent again."""
    retry_backoff_ms: int = 20
    """``quorum.retry.backoff.ms``: the wait after a failed request, and the unit of the
    election backoff."""
    voter_catch_up_ms: int = 2000
    """How recently an observer must have fetched up to the leader's log end for
    AddRaftVoter to accept it (KIP-853's "caught up")."""
    auto_join: bool = False
    """``controller.quorum.auto.join.enable``: a dynamic quorum's controller that is not a
    voter asks the leader it follows to make it one (:class:`JoinRequest`), first asking
    it to remove the voter its node id had before its disk was wiped. Once this replica
    has been in the committed voter set it asks no more until it restarts, so that an
    operator's ``remove-controller`` stands (Kafka's semantics)."""
    auto_join_backoff_ms: int = 500
    """How long an auto-joining replica waits before asking again (the leader refused,
    the answer was lost, or the change is not committed yet)."""

    def __post_init__(self) -> None:
        for name in (
            "election_timeout_ms",
            "fetch_timeout_ms",
            "fetch_max_bytes",
            "snapshot_chunk_bytes",
            "request_timeout_ms",
            "voter_catch_up_ms",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")
        for name in (
            "election_backoff_max_ms",
            "fetch_max_wait_ms",
            "high_watermark_linger_ms",
            "retry_backoff_ms",
            "auto_join_backoff_ms",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative")
        if self.request_timeout_ms <= self.fetch_max_wait_ms:
            raise ValueError("request_timeout_ms must exceed fetch_max_wait_ms (the long poll)")


class StaticQuorumError(MembershipChangeError):
    """A voter change asked of a quorum whose voters are fixed by ``--voters``."""

    code = ErrorCode.UNSUPPORTED_VERSION


class NotLeaderError(HighwaterError):
    """A proposal to a replica that does not lead the quorum; names who does, if known."""

    code = ErrorCode.NOT_LEADER_OR_FOLLOWER

    def __init__(self, leader_id: int | None, epoch: int) -> None:
        where = f"the leader is {leader_id}" if leader_id is not None else "no leader is known"
        super().__init__(f"not the leader of epoch {epoch}: {where}")
        self.leader_id = leader_id
        self.epoch = epoch


@dataclass(frozen=True, slots=True)
class JoinRequest:
    """What an auto-joining observer asks of the leader it follows (KIP-853): AddRaftVoter
    for ``voter`` (itself) when ``add``, else RemoveRaftVoter for ``voter`` (the voter its
    node id had with another directory: its former incarnation). The leader decides, as
    for an operator's request; a refusal only means asking again later."""

    leader_id: int
    add: bool
    voter: Voter


@dataclass(frozen=True, slots=True)
class RoleChange:
    """The replica's role in the quorum changed: what the controller on top reacts to."""

    role: Role
    epoch: int
    leader_id: int | None


@dataclass(frozen=True, slots=True)
class Ready:
    """The effects of the events since the last :meth:`RaftNode.ready`, in the order the
    driver must apply them."""

    election_state: ElectionState | None = None
    """Persist (and fsync) first, before sending anything."""
    must_flush: bool = False
    """The log holds unflushed entries: fsync it, then call :meth:`RaftNode.on_flushed`."""
    messages: list[RaftMessage] = field(default_factory=list)
    """Send, after persisting the election state."""
    load_snapshot: OffsetAndEpoch | None = None
    """Reload the state machine from this snapshot (the store holds it), before applying
    entries: the log now starts at its end offset."""
    high_watermark: int | None = None
    """The new commit point: apply the committed entries below it to the state machine."""
    role: RoleChange | None = None
    """The replica's role, epoch or known leader changed."""
    voters: VoterSet | None = None
    """The voter set in use changed (a ``voters`` record was appended, fetched or
    truncated away): where the voters listen, for the transport."""
    committed_voters: tuple[int, VoterSet] | None = None
    """The committed voter set changed: its record's offset and the set, to keep beside
    the quorum state (a snapshot may later cut the record out of the log)."""
    join: JoinRequest | None = None
    """Send this membership request to its leader (``RaftConfig.auto_join``), any time:
    its answer needs no event of the node's."""

    @property
    def is_empty(self) -> bool:
        return (
            self.election_state is None
            and not self.must_flush
            and not self.messages
            and self.load_snapshot is None
            and self.high_watermark is None
            and self.role is None
            and self.voters is None
            and self.committed_voters is None
            and self.join is None
        )


_NOTHING_READY = Ready()
"""What :meth:`RaftNode.ready` returns when nothing is new: shared, so a driver reads a
Ready and never changes it (its ``messages`` list above all)."""


class RaftNode:
    """One replica of the quorum: a voter when ``node_id`` is in the voter set in use, else
    an observer.

    ``voters`` is either a fixed set of ids (a static quorum, ``--voters``: no changes)
    or the bootstrap :class:`VoterSet` of a dynamic quorum (KIP-853), in force from
    ``voters_offset`` (-1 for the bootstrap; the offset of the committed ``voters``
    record the driver kept). In a dynamic quorum the voter set in use is that of the
    latest ``voters`` control record in the log, committed or not: appending or fetching
    one changes it at once, a truncation reverts it.

    ``election_state`` is what the driver last persisted (``None`` for a new replica);
    ``random`` drives the randomized timeouts (seed it for reproducible runs); ``now_ms``
    is the driver's clock at construction. A snapshot the store holds is announced in
    the first :class:`Ready` (``load_snapshot``): the state machine starts from it.
    ``directory_id`` is this replica's incarnation in a dynamic quorum: while the set
    lists its node id with another directory id (the voter it was before its disk was
    wiped), it is no voter, grants no votes and campaigns not. ``endpoint`` is the
    controller endpoint its fetches announce in a dynamic quorum: a controller's listener,
    empty for a broker's or a coordinator's metadata replica, which a leader never adds as
    a voter.
    ``snapshot_voters`` reads the voter set a snapshot carries (offset of its record, set),
    if it carries one: a replica that installs the leader's snapshot takes that set.
    """

    def __init__(
        self,
        node_id: int,
        voters: frozenset[int] | VoterSet,
        log: RaftLog,
        snapshots: SnapshotStore,
        *,
        voters_offset: int = -1,
        cluster_id: str,
        election_state: ElectionState | None,
        random: _random.Random,
        config: RaftConfig | None = None,
        now_ms: int = 0,
        snapshot_voters: Callable[[OffsetAndEpoch], tuple[int, VoterSet] | None] | None = None,
        directory_id: uuid.UUID | None = None,
        endpoint: str = "",
    ) -> None:
        if not voters:
            raise ValueError("a quorum needs at least one voter")
        self.node_id = node_id
        self.directory_id = directory_id
        self.endpoint = endpoint
        self.is_static = not isinstance(voters, VoterSet)
        bootstrap = (
            voters
            if isinstance(voters, VoterSet)
            else VoterSet.of(Voter(v, NO_DIRECTORY_ID, "") for v in voters)
        )
        self._history = VoterSetHistory(bootstrap, voters_offset)
        self.voters = self._voter_ids(bootstrap)
        self.cluster_id = cluster_id
        self.config = config or RaftConfig()
        self._log = log
        self._snapshots = snapshots
        self._random = random
        self._now_ms = now_ms
        self._quorum = QuorumState(
            node_id,
            self.voters,
            election_timeout_ms=self.config.election_timeout_ms,
            fetch_timeout_ms=self.config.fetch_timeout_ms,
            request_timeout_ms=self.config.request_timeout_ms,
            retry_backoff_ms=self.config.retry_backoff_ms,
            rng=random,
        )
        self._quorum.observers_vote = not self.is_static
        self._is_only_voter = self.voters == {node_id}
        self._outbox: list[RaftMessage] = []
        self._high_watermark: int | None = None
        self._reported_high_watermark: int | None = None
        self._load_snapshot: OffsetAndEpoch | None = None
        self._reported_role: RoleChange | None = None
        self._reported_state: EpochState | None = None
        # The leader's parked fetches: replica id -> (request, when to answer anyway).
        self._parked: dict[int, tuple[FetchRequest, int]] = {}
        # A leader that removed itself resigns once the record at this offset commits.
        self._resign_after: int | None = None
        self._reported_voters: VoterSet = bootstrap
        self._reported_committed_offset = voters_offset
        self._snapshot_voters = snapshot_voters
        # Auto-join (RaftConfig.auto_join): the request the next Ready carries, when the
        # next may be made, and whether this process may still make any.
        self._join: JoinRequest | None = None
        self._next_join_ms = now_ms
        self._may_auto_join = (
            self.config.auto_join and not self.is_static and directory_id is not None
        )

        latest = snapshots.latest()
        if latest is not None:
            if latest.offset > log.start_offset:
                if self._log_holds(latest):
                    log.delete_before(latest.offset)
                else:
                    # A snapshot received just before a crash, the log not yet reset to it.
                    log.truncate_to_snapshot(latest)
            self._load_snapshot = latest
            self._high_watermark = latest.offset
        if not self.is_static:
            self._scan_voters_records(max(log.start_offset, voters_offset + 1))
            self._voters_changed(now_ms)
        self._quorum.initialize(
            election_state, OffsetAndEpoch(log.end_offset, log.last_epoch), now_ms
        )
        self._note_joined()
        if self._is_only_voter:
            self._poll(now_ms)  # a single voter elects itself at once: nobody else can

    # --- What the node knows -----------------------------------------------------------

    @property
    def role(self) -> Role:
        return self._quorum.state.role

    @property
    def epoch(self) -> int:
        return self._quorum.epoch

    @property
    def leader_id(self) -> int | None:
        """The leader of the current epoch, if known (while leading: this node)."""
        state = self._quorum.state
        if isinstance(state, LeaderState):
            return self.node_id
        if isinstance(state, FollowerState):
            return state.leader_id
        return None

    @property
    def is_leader(self) -> bool:
        return isinstance(self._quorum.state, LeaderState)

    @property
    def is_voter(self) -> bool:
        return self._quorum.is_voter

    @property
    def high_watermark(self) -> int | None:
        return self._high_watermark

    @property
    def voter_set(self) -> VoterSet:
        """The voter set in use: the latest ``voters`` record's, committed or not."""
        return self._history.latest()

    @property
    def voters_offset(self) -> int:
        """The offset of the ``voters`` record of the set in use; -1 for the bootstrap set."""
        return self._history.latest_offset()

    def committed_voter_set(self) -> VoterSet:
        """The voter set of the latest ``voters`` record below the high watermark."""
        return self._history.committed(self._high_watermark or 0)

    def voter_records_between(self, start: int, end: int) -> int:
        """How many ``voters`` records the log holds at offsets ``start`` to ``end - 1``:
        those the voter set history holds, and, on a leader, those it appended in its
        epoch (a snapshot may have absorbed them from the history). A record of an earlier
        epoch that a snapshot absorbed is not counted."""
        offsets = set(self._history.offsets_between(start, end))
        state = self._quorum.state
        if isinstance(state, LeaderState):
            offsets.update(o for o in state.voters_record_offsets if start <= o < end)
        return len(offsets)

    def voters_at(self, offset: int) -> tuple[int, VoterSet]:
        """The voter set in force at ``offset`` (the latest record below it) and its
        record's offset: what a snapshot ending at ``offset`` carries."""
        return self._history.committed_entry(offset)

    @property
    def state(self) -> EpochState:
        """The current election state object (read-only use: tests, diagnostics)."""
        return self._quorum.state

    def describe(self) -> QuorumDescription:
        """Leader, epoch, high watermark; on the leader, every replica's progress."""
        state = self._quorum.state
        if isinstance(state, LeaderState):
            return QuorumDescription(
                leader_id=self.node_id,
                leader_epoch=state.epoch,
                high_watermark=_or_unknown(state.high_watermark),
                voters=state.voter_progress(),
                observers=state.observer_progress(self._now_ms),
            )
        return QuorumDescription(
            leader_id=_or_no_leader(self.leader_id),
            leader_epoch=state.epoch,
            high_watermark=_or_unknown(self._high_watermark),
        )

    # --- Events ------------------------------------------------------------------------

    def tick(self, now_ms: int) -> None:
        """Time passed: fire the timers that are due, send what is due."""
        self._poll(self._advance(now_ms))

    def next_deadline_ms(self) -> int | None:
        """When a :meth:`tick` may next have something to do, if no event comes first
        (None: only an event can give it work). A driver may sleep until then instead
        of ticking on a fixed period: every timer of the state (the election, fetch and
        check-quorum timeouts, a request's retry or backoff, a parked fetch's answer) is
        counted, and any event may bring a deadline forward, so ask again after each.
        Never later than the earliest timer; earlier only costs an idle tick."""
        state = self._quorum.state
        now_ms = self._now_ms
        deadlines: list[int] = []
        if isinstance(state, LeaderState):
            if len(self.voters) > 1 or not self.is_voter:
                deadlines.append(state.check_quorum_deadline_ms)
            deadlines.extend(state.requests.ready_at(v) for v in state.unacknowledged_voters())
            deadlines.extend(deadline_ms for _, deadline_ms in self._parked.values())
        elif isinstance(state, FollowerState):
            deadlines.append(state.fetch_deadline_ms)
            if self._wanted_join(state) is not None:
                deadlines.append(self._next_join_ms)
            snapshot_fetch = state.snapshot_fetch
            if now_ms < state.next_fetch_ms:
                deadlines.append(state.next_fetch_ms)
            elif snapshot_fetch is not None:
                if snapshot_fetch.requested_position is not None:
                    deadlines.append(snapshot_fetch.requested_until_ms)
            elif state.fetch_in_flight is not None:
                deadlines.append(state.fetch_in_flight_until_ms)
            elif not (
                (self._quorum.is_voter or not self.is_static)
                and self._log.flushed_offset < self._log.end_offset
            ):
                # A fetch is due now (a follower a tick made, after a pre-vote lost,
                # whose poll ran before it followed).
                deadlines.append(now_ms)
            # else a fetch waits for ``on_flushed``: an event.
        elif isinstance(state, CandidateState):
            if state.backoff_until_ms is not None:
                deadlines.append(state.backoff_until_ms)
            else:
                deadlines.append(state.election_deadline_ms)
                deadlines.extend(state.requests.ready_at(v) for v in state.votes.unanswered())
        elif isinstance(state, ProspectiveState):
            deadlines.append(state.election_deadline_ms)
            deadlines.extend(state.requests.ready_at(v) for v in state.pre_votes.unanswered())
        elif isinstance(state, UnattachedState):
            if self._quorum.is_voter:
                if state.election_deadline_ms is not None:
                    deadlines.append(state.election_deadline_ms)
            else:
                deadlines.append(state.requests.ready_at(_LEADER_DISCOVERY))
        elif isinstance(state, ResignedState):
            deadlines.append(state.election_deadline_ms)
            deadlines.extend(state.requests.ready_at(v) for v in state.unacknowledged)
        return min(deadlines) if deadlines else None

    def step(self, message: RaftMessage, now_ms: int) -> None:
        """Handle one message addressed to this node."""
        if message.destination != self.node_id:
            raise ValueError(f"message for {message.destination} delivered to {self.node_id}")
        now_ms = self._advance(now_ms)
        match message:  # the fetches first: nearly every message is one
            case FetchRequest():
                self._handle_fetch_request(message, now_ms)
            case FetchResponse():
                self._handle_fetch_response(message, now_ms)
            case VoteRequest():
                self._handle_vote_request(message, now_ms)
            case VoteResponse():
                self._handle_vote_response(message, now_ms)
            case BeginQuorumEpochRequest():
                self._handle_begin_quorum_epoch_request(message, now_ms)
            case BeginQuorumEpochResponse():
                self._handle_begin_quorum_epoch_response(message, now_ms)
            case EndQuorumEpochRequest():
                self._handle_end_quorum_epoch_request(message, now_ms)
            case EndQuorumEpochResponse():
                self._handle_end_quorum_epoch_response(message, now_ms)
            case FetchSnapshotRequest():
                self._handle_fetch_snapshot_request(message, now_ms)
            case FetchSnapshotResponse():
                self._handle_fetch_snapshot_response(message, now_ms)
            case _:
                raise TypeError(f"not a Raft message: {message!r}")
        self._poll(now_ms)

    def propose(self, values: Sequence[bytes], now_ms: int) -> OffsetAndEpoch:
        """Append ``values`` as one batch; the offset and epoch of the last one.

        The entry is committed once the high watermark passes its offset (its epoch then
        still names it). Raises :class:`NotLeaderError` unless this node leads.
        """
        now_ms = self._advance(now_ms)
        state = self._quorum.state
        if not isinstance(state, LeaderState):
            raise NotLeaderError(self.leader_id, state.epoch)
        if not values:
            raise ValueError("nothing to propose")
        appended = self._log.append_as_leader(values, state.epoch)
        state.update_local_state(self._log.flushed_offset, self._log.end_offset, now_ms)
        end_offset = self._log.end_offset
        self._answer_parked(now_ms, lambda request, deadline_ms: request.fetch_offset < end_offset)
        return appended

    # --- Membership changes (KIP-853), on the leader ---------------------------------------

    def add_voter(self, voter: Voter, now_ms: int) -> OffsetAndEpoch:
        """AddRaftVoter: append a ``voters`` record with ``voter`` added; its id.

        The node must be an observer caught up with this leader (it fetched up to the log
        end within ``voter_catch_up_ms``) whose fetches announce a controller endpoint (a
        broker's or a coordinator's metadata replica announces none). The change is
        committed once the high watermark passes the returned offset; until then another
        change is refused. Raises :class:`NotLeaderError` or a
        :class:`MembershipChangeError` naming the refusal.
        """
        now_ms = self._advance(now_ms)
        state, view = self._membership_view()
        observer = state.observer_states.get(voter.node_id)
        new = check_add_voter(
            view,
            voter,
            observer_caught_up_ms=None if observer is None else observer.last_caught_up_ms,
            observer_directory_id=None if observer is None else observer.directory_id,
            observer_endpoint=None if observer is None else observer.endpoint,
            now_ms=now_ms,
            catch_up_ms=self.config.voter_catch_up_ms,
        )
        return self._append_voters(state, new, now_ms)

    def remove_voter(
        self, node_id: int, directory_id: uuid.UUID | None, now_ms: int
    ) -> OffsetAndEpoch:
        """RemoveRaftVoter: append a ``voters`` record without the voter; its id.

        Removing this leader is allowed: it leads on, counting the new set, until the
        record commits, then resigns and stays on as an observer.
        """
        now_ms = self._advance(now_ms)
        state, view = self._membership_view()
        removal = check_remove_voter(view, node_id, directory_id)
        appended = self._append_voters(state, removal.voters, now_ms)
        if removal.leader_resigns:
            self._resign_after = appended.offset
            self._poll(now_ms)
        return appended

    def update_voter(self, voter: Voter, now_ms: int) -> OffsetAndEpoch:
        """UpdateRaftVoter: append a ``voters`` record with the voter's new endpoint."""
        now_ms = self._advance(now_ms)
        state, view = self._membership_view()
        return self._append_voters(state, check_update_voter(view, voter), now_ms)

    def _membership_view(self) -> tuple[LeaderState, LeaderView]:
        state = self._quorum.state
        if not isinstance(state, LeaderState):
            raise NotLeaderError(self.leader_id, state.epoch)
        if self.is_static:
            raise StaticQuorumError(
                "the voters are fixed by --voters (a static quorum); start the quorum with "
                "--initial-controllers to change them"
            )
        high_watermark = state.high_watermark
        view = LeaderView(
            voters=self._history.latest(),
            leader_id=self.node_id,
            log_end_offset=self._log.end_offset,
            pending_change=high_watermark is None or self._history.pending_change(high_watermark),
            committed_in_epoch=high_watermark is not None,
        )
        return state, view

    def _append_voters(self, state: LeaderState, voters: VoterSet, now_ms: int) -> OffsetAndEpoch:
        appended = self._log.append_as_leader(
            [encode_voters_record(voters)], state.epoch, control=True
        )
        self._history.add_at(appended.offset, voters)
        state.voters_record_offsets.append(appended.offset)
        self._voters_changed(now_ms)
        if state.update_local_state(self._log.flushed_offset, self._log.end_offset, now_ms):
            self._on_leader_high_watermark(state, now_ms)
        end_offset = self._log.end_offset
        self._answer_parked(now_ms, lambda request, deadline_ms: request.fetch_offset < end_offset)
        return appended

    def _scan_voters_records(self, start_offset: int) -> None:
        """Record the ``voters`` records of the log from ``start_offset`` (at start-up)."""
        log = self._log
        offset = start_offset
        while offset < log.end_offset:
            data = log.read(offset, self.config.fetch_max_bytes)
            if not data:
                return
            offset = self._note_voters_records(data, start_offset)

    def _note_voters_records(self, batches: bytes, start_offset: int = 0) -> int:
        """Record the ``voters`` records among ``batches``; the offset after them."""
        end = start_offset
        for batch in iter_batches(batches):
            end = batch.next_offset
            if not batch.is_control or batch.base_offset < start_offset:
                continue
            for index, record in enumerate(batch.records()):
                value = record.value
                if value is not None and is_voters_record(value):
                    offset = batch.base_offset + index
                    if offset > self._history.latest_offset():
                        self._history.add_at(offset, decode_voters_record(value))
        return end

    def is_stale_incarnation(self, voters: VoterSet | None = None) -> bool:
        """Whether ``voters`` (by default the set in use) list this node id with another
        directory id than this replica's: the voter is a former incarnation of it."""
        voter = (voters or self._history.latest()).get(self.node_id)
        return (
            self.directory_id is not None
            and voter is not None
            and voter.directory_id != self.directory_id
        )

    def _voter_ids(self, voters: VoterSet) -> frozenset[int]:
        """The ids this replica counts as voters: a former incarnation of itself is not
        counted as itself."""
        if self.is_stale_incarnation(voters):
            return voters.ids - {self.node_id}
        return voters.ids

    def _voters_changed(self, now_ms: int) -> None:
        """Use the latest voter set: the quorum's checks, the leader's counts."""
        voters = self._voter_ids(self._history.latest())
        if voters == self.voters:
            return
        self.voters = voters
        self._quorum.voters = voters
        self._is_only_voter = voters == {self.node_id}
        state = self._quorum.state if self._quorum.initialized else None
        if isinstance(state, LeaderState) and state.set_voters(voters):
            self._on_leader_high_watermark(state, now_ms)

    def _wanted_join(self, state: FollowerState) -> JoinRequest | None:
        """What auto-join would ask of the leader now, time aside: nothing unless this
        replica is a controller outside the voter set in use that follows a leader.

        While its node id is a voter under another directory (the incarnation before its
        disk was wiped), it asks for that voter's removal first (one change at a time):
        knowing the leader is enough, as the removal does not depend on how far this
        replica got (its fetches are answered but count for nothing until then). Its own
        addition waits until the leader has answered a fetch in this epoch, so that the
        leader sees how far it got."""
        if (
            not self._may_auto_join
            or not self.endpoint
            or self._quorum.is_voter
            or self._join is not None
        ):
            return None
        assert self.directory_id is not None
        former = self._history.latest().get(self.node_id)
        if former is not None:
            return JoinRequest(state.leader_id, add=False, voter=former)
        if state.heard_from_leader_ms is None:
            return None
        return JoinRequest(
            state.leader_id, add=True, voter=Voter(self.node_id, self.directory_id, self.endpoint)
        )

    def _note_joined(self) -> None:
        """Auto-join ends for this process once its key is in the committed voter set."""
        if self._may_auto_join and self.committed_voter_set().is_voter(
            self.node_id, self.directory_id
        ):
            self._may_auto_join = False

    def on_flushed(self, offset: int, now_ms: int) -> None:
        """The driver flushed the log up to ``offset`` (the log's ``flushed_offset`` says
        what is durable): the leader counts it, a follower may fetch again."""
        now_ms = self._advance(now_ms)
        state = self._quorum.state
        if isinstance(state, LeaderState) and state.update_local_state(
            self._log.flushed_offset, self._log.end_offset, now_ms
        ):
            self._on_leader_high_watermark(state, now_ms)
        self._poll(now_ms)

    def peer_unreachable(self, peer_id: int, now_ms: int) -> None:
        """A request to ``peer_id`` failed at once: its process is gone (the connection was
        refused or reset), not merely slow.

        A voter that can no longer reach its leader does not wait out the fetch timeout:
        it looks for a new leader after a randomized delay below half the election
        timeout (so that the followers rarely stand at once), and grants pre-votes from
        then on. Its own pre-vote still needs a majority that has lost the leader too, so
        a replica cut off alone cannot disturb a healthy quorum.
        """
        now_ms = self._advance(now_ms)
        state = self._quorum.state
        if (
            isinstance(state, FollowerState)
            and state.leader_id == peer_id
            and self._quorum.is_voter
        ):
            delay_ms = self._random.randrange(self.config.election_timeout_ms // 2 + 1)
            state.leader_unreachable(now_ms, delay_ms)
        self._poll(now_ms)

    def resign(self, now_ms: int) -> None:
        """Step down gracefully (before a shutdown): tell the voters, most caught-up first.

        Does nothing unless this node leads, nor in a single-voter quorum (no successor).
        """
        now_ms = self._advance(now_ms)
        state = self._quorum.state
        if isinstance(state, LeaderState) and not self._is_only_voter:
            self._resign(state, state.preferred_successors(), now_ms)
            self._poll(now_ms)

    def snapshot_written(self, snapshot_id: OffsetAndEpoch) -> None:
        """The state machine stored a snapshot of the committed log up to ``snapshot_id``:
        the log before it, and older snapshots, may go."""
        committed = self._high_watermark if self._high_watermark is not None else 0
        if snapshot_id.offset > committed:
            raise ValueError(
                f"snapshot {snapshot_id} is past the high watermark {self._high_watermark}"
            )
        log = self._log
        if snapshot_id.offset > log.start_offset:
            if not self._log_holds(snapshot_id):
                raise ValueError(f"snapshot {snapshot_id}: the log has another epoch there")
            log.delete_before(snapshot_id.offset)
        self._history.forget_before(snapshot_id.offset)
        self._snapshots.delete_before(snapshot_id)

    def _log_holds(self, snapshot_id: OffsetAndEpoch) -> bool:
        """Whether the log holds the prefix the snapshot replaces: the entry before the
        snapshot's end offset is of the snapshot's epoch."""
        log = self._log
        if snapshot_id.offset > log.end_offset:
            return False
        ends = log.end_offset_for_epoch(snapshot_id.epoch)
        before = log.end_offset_for_epoch(snapshot_id.epoch - 1)
        return (
            ends.epoch == snapshot_id.epoch
            and ends.offset >= snapshot_id.offset
            and before.offset < snapshot_id.offset
        )

    def ready_messages(self) -> list[RaftMessage]:
        """Only the messages of the next :class:`Ready`, taken early — none while an
        election state waits to be persisted (they go after it, with that Ready). Lets a
        driver send at once what an event it just applied produced (a follower's next
        fetch after ``on_flushed``) before it turns to slower work."""
        if self._quorum.has_unpersisted:
            return []
        messages, self._outbox = self._outbox, []
        return messages

    def ready(self) -> Ready:
        """Take the effects accumulated so far (see :class:`Ready` for the order).

        Most calls find nothing new (a tick or an answer that changed nothing): those
        return the one empty :class:`Ready` without building one, after the same
        comparisons the full path makes (each field's would come out empty)."""
        if (
            not self._outbox
            and self._join is None
            and self._load_snapshot is None
            and self._quorum.state is self._reported_state
            and not self._quorum.has_unpersisted
            and self._history.latest() is self._reported_voters
            and (
                self._high_watermark is None
                or (
                    self._reported_high_watermark is not None
                    and self._high_watermark <= self._reported_high_watermark
                    and (
                        self.is_static
                        or self._history.committed_entry(self._high_watermark)[0]
                        <= self._reported_committed_offset
                    )
                )
            )
            and self._log.flushed_offset >= self._log.end_offset
        ):
            return _NOTHING_READY
        messages, self._outbox = self._outbox, []
        high_watermark = None
        if self._high_watermark is not None and (
            self._reported_high_watermark is None
            or self._high_watermark > self._reported_high_watermark
        ):
            high_watermark = self._reported_high_watermark = self._high_watermark
        state = self._quorum.state
        voters = None
        if self._history.latest() != self._reported_voters:
            voters = self._reported_voters = self._history.latest()
        committed_voters = None
        if not self.is_static and self._high_watermark is not None:
            committed = self._history.committed_entry(self._high_watermark)
            if committed[0] > self._reported_committed_offset:
                committed_voters = committed
                self._reported_committed_offset = committed[0]
                self._note_joined()
        role_change = None
        if self._reported_state is not state:
            self._reported_state = state
            role = RoleChange(state.role, state.epoch, self.leader_id)
            if role != self._reported_role:
                role_change = self._reported_role = role
        load_snapshot, self._load_snapshot = self._load_snapshot, None
        join, self._join = self._join, None
        return Ready(
            election_state=self._quorum.take_unpersisted(),
            must_flush=self._log.flushed_offset < self._log.end_offset,
            messages=messages,
            load_snapshot=load_snapshot,
            high_watermark=high_watermark,
            role=role_change,
            voters=voters,
            committed_voters=committed_voters,
            join=join,
        )

    # --- Polling: what each state does as time passes -------------------------------------

    def _advance(self, now_ms: int) -> int:
        if now_ms > self._now_ms:
            self._now_ms = now_ms
        return self._now_ms

    def _poll(self, now_ms: int) -> None:
        state = self._quorum.state
        if isinstance(state, LeaderState):
            self._poll_leader(state, now_ms)
        elif isinstance(state, FollowerState):
            self._poll_follower(state, now_ms)
        elif isinstance(state, CandidateState):
            self._poll_candidate(state, now_ms)
        elif isinstance(state, ProspectiveState):
            self._poll_prospective(state, now_ms)
        elif isinstance(state, UnattachedState):
            self._poll_unattached(state, now_ms)
        elif isinstance(state, ResignedState):
            self._poll_resigned(state, now_ms)

    def _poll_leader(self, state: LeaderState, now_ms: int) -> None:
        if (
            self._resign_after is not None
            and state.high_watermark is not None
            and state.high_watermark > self._resign_after
        ):
            # Our own removal committed: hand over to the remaining voters.
            self._resign(state, state.preferred_successors(), now_ms)
            self._poll(now_ms)
            return
        if (len(self.voters) > 1 or not self.is_voter) and state.has_lost_quorum(now_ms):
            self._resign(state, (), now_ms)
            self._poll(now_ms)
            return
        for voter in state.unacknowledged_voters():
            if state.requests.is_ready(voter, now_ms):
                state.requests.on_sent(voter, now_ms)
                self._send(
                    BeginQuorumEpochRequest(
                        source=self.node_id,
                        destination=voter,
                        cluster_id=self.cluster_id,
                        leader_epoch=state.epoch,
                    )
                )
        self._answer_parked(now_ms, lambda request, deadline_ms: deadline_ms <= now_ms)

    def _poll_follower(self, state: FollowerState, now_ms: int) -> None:
        if state.has_fetch_timed_out(now_ms):
            if self._quorum.is_voter:
                self._become_prospective(now_ms)
            else:
                self._become_unattached(state.epoch, now_ms)  # look for the leader anew
                self._poll(now_ms)
            return
        wanted = self._wanted_join(state)
        if wanted is not None and now_ms >= self._next_join_ms:
            self._join = wanted
            self._next_join_ms = now_ms + self.config.auto_join_backoff_ms
        if now_ms < state.next_fetch_ms:
            return
        snapshot_fetch = state.snapshot_fetch
        if snapshot_fetch is not None:
            if (
                snapshot_fetch.requested_position is None
                or snapshot_fetch.requested_until_ms <= now_ms
            ):
                snapshot_fetch.requested_position = snapshot_fetch.position
                snapshot_fetch.requested_until_ms = now_ms + self.config.request_timeout_ms
                self._send(
                    FetchSnapshotRequest(
                        source=self.node_id,
                        destination=state.leader_id,
                        cluster_id=self.cluster_id,
                        current_leader_epoch=state.epoch,
                        snapshot_id=snapshot_fetch.snapshot_id,
                        position=snapshot_fetch.position,
                        max_bytes=self.config.snapshot_chunk_bytes,
                        replica_directory_id=None if self.is_static else self.directory_id,
                    )
                )
            return
        if state.fetch_in_flight is not None and now_ms < state.fetch_in_flight_until_ms:
            return
        log = self._log
        if (self._quorum.is_voter or not self.is_static) and log.flushed_offset < log.end_offset:
            # Fetch again once what was appended is durable: progress we report. In a
            # dynamic quorum an observer too, since the leader may make it a voter and
            # count the fetch offsets it reported as an observer.
            return
        state.fetch_in_flight = OffsetAndEpoch(log.end_offset, log.last_epoch)
        state.fetch_in_flight_until_ms = now_ms + self.config.request_timeout_ms
        self._send(self._fetch_request(state.leader_id, state.epoch))

    def _poll_candidate(self, state: CandidateState, now_ms: int) -> None:
        if state.backoff_until_ms is not None:
            if now_ms >= state.backoff_until_ms:
                self._become_prospective(now_ms)
            return
        if now_ms >= state.election_deadline_ms:
            state.backoff_until_ms = now_ms + self._election_backoff_ms(state.retries)
            return
        self._send_vote_requests(state, state.votes.unanswered(), pre_vote=False, now_ms=now_ms)

    def _poll_prospective(self, state: ProspectiveState, now_ms: int) -> None:
        if now_ms >= state.election_deadline_ms:
            self._prospective_lost(state, now_ms)
            return
        self._send_vote_requests(state, state.pre_votes.unanswered(), pre_vote=True, now_ms=now_ms)

    def _poll_unattached(self, state: UnattachedState, now_ms: int) -> None:
        if self._quorum.is_voter:
            deadline_ms = state.election_deadline_ms
            if self._is_only_voter or (deadline_ms is not None and now_ms >= deadline_ms):
                self._become_prospective(now_ms)
            return
        # An observer looks for the leader: any voter's answer names it.
        if state.requests.is_ready(_LEADER_DISCOVERY, now_ms):
            state.requests.on_sent(_LEADER_DISCOVERY, now_ms)
            voter = self._random.choice(sorted(self.voters))
            self._send(self._fetch_request(voter, state.epoch))

    def _poll_resigned(self, state: ResignedState, now_ms: int) -> None:
        if not self._quorum.is_voter and (
            not state.unacknowledged or now_ms >= state.election_deadline_ms
        ):
            # A leader that removed itself: from now on an observer looking for the leader.
            self._become_unattached(state.epoch, now_ms)
            self._poll(now_ms)
            return
        if self._is_only_voter or now_ms >= state.election_deadline_ms:
            self._become_prospective(now_ms)
            return
        for voter in sorted(state.unacknowledged):
            if state.requests.is_ready(voter, now_ms):
                state.requests.on_sent(voter, now_ms)
                self._send(
                    EndQuorumEpochRequest(
                        source=self.node_id,
                        destination=voter,
                        cluster_id=self.cluster_id,
                        leader_epoch=state.epoch,
                        preferred_successors=state.preferred_successors,
                    )
                )

    # --- Transitions (through QuorumState) and what follows them -------------------------

    def _become_prospective(self, now_ms: int) -> None:
        state = self._quorum.transition_to_prospective(now_ms)
        self._after_transition(now_ms)
        if state.pre_votes.is_granted:  # a single voter
            self._become_candidate(now_ms)
        else:
            self._poll(now_ms)

    def _become_candidate(self, now_ms: int) -> None:
        state = self._quorum.transition_to_candidate(now_ms)
        self._after_transition(now_ms)
        if state.votes.is_granted:  # a single voter
            self._become_leader(now_ms)
        else:
            self._poll(now_ms)

    def _become_leader(self, now_ms: int) -> None:
        log = self._log
        state = self._quorum.transition_to_leader(log.end_offset, now_ms)
        self._after_transition(now_ms)
        values = [encode_leader_change(self.node_id, sorted(self.voters))]
        # KIP-853: a dynamic quorum's set still in force from the bootstrap (no record in
        # the log yet: ``--initial-controllers``) is written as the first ``voters``
        # record, beside the leader change, so a replica that replicates from offset 0
        # learns it from the log; once committed it is what ``quorum-voters`` keeps.
        from_log = self.is_static or self._history.latest_offset() >= 0
        bootstrap = None if from_log else self._history.latest()
        if bootstrap is not None:
            values.append(encode_voters_record(bootstrap))
        appended = log.append_as_leader(values, state.epoch, control=True)
        if bootstrap is not None:
            self._history.add_at(appended.offset, bootstrap)
            state.voters_record_offsets.append(appended.offset)
        if state.update_local_state(log.flushed_offset, log.end_offset, now_ms):
            self._on_leader_high_watermark(state, now_ms)
        self._poll(now_ms)

    def _become_follower(self, epoch: int, leader_id: int, now_ms: int) -> None:
        self._quorum.transition_to_follower(epoch, leader_id, now_ms)
        self._after_transition(now_ms)

    def _become_unattached(self, epoch: int, now_ms: int) -> None:
        self._quorum.transition_to_unattached(epoch, now_ms)
        self._after_transition(now_ms)

    def _resign(self, state: LeaderState, successors: Sequence[int], now_ms: int) -> None:
        self._quorum.transition_to_resigned(successors, now_ms)
        self._after_transition(now_ms)

    def _prospective_lost(self, state: ProspectiveState, now_ms: int) -> None:
        """No majority of pre-votes: back to the epoch's leader if one is known."""
        leader_id = state.leader_id
        if leader_id is not None and leader_id != self.node_id:
            self._become_follower(state.epoch, leader_id, now_ms)
        else:
            self._become_unattached(state.epoch, now_ms)

    def _after_transition(self, now_ms: int) -> None:
        """A leader that stepped down answers its parked fetches (with an error naming
        the new epoch and leader, if known)."""
        if not self.is_leader:
            self._resign_after = None
        if self._parked and not self.is_leader:
            parked, self._parked = self._parked, {}
            for request, _ in parked.values():
                self._send_fetch_response(self._complete_fetch(request, now_ms)[0])

    def _maybe_transition(self, leader_id: int | None, epoch: int, now_ms: int) -> None:
        """Learn from a request or response naming ``epoch`` and its leader (Kafka's
        ``maybeTransition``): follow a newer epoch, or the leader of ours if we knew none."""
        state = self._quorum.state
        if self.is_static and leader_id is not None and leader_id not in self.voters:
            leader_id = None  # a static quorum's leader is one of its fixed voters
        if epoch < state.epoch:
            return
        if leader_id == self.node_id:
            if not self._quorum.is_voter and epoch == state.epoch:
                return  # we led this epoch until our own removal: old news
            if epoch > state.epoch and not self.is_static and self.directory_id is not None:
                # An epoch this replica never knew, so never led: a former incarnation of
                # this node id did, before its disk was wiped (its election state went with
                # it). Take the epoch; its leader is gone.
                self._become_unattached(epoch, now_ms)
                return
            if epoch != state.epoch or state.leader_id != self.node_id:
                raise IllegalTransitionError(
                    f"told that this node leads epoch {epoch}, but it is {state}"
                )
            return
        if (
            epoch == state.epoch
            and leader_id is not None
            and state.leader_id is not None
            and state.leader_id != leader_id
        ):
            raise IllegalTransitionError(
                f"told that {leader_id} leads epoch {epoch}, but {state.leader_id} does"
            )
        if epoch > state.epoch:
            if leader_id is not None:
                self._become_follower(epoch, leader_id, now_ms)
            else:
                self._become_unattached(epoch, now_ms)
        elif leader_id is not None and state.leader_id is None:
            self._become_follower(epoch, leader_id, now_ms)

    def _handle_common_response(self, error: int, leader_id: int, epoch: int, now_ms: int) -> bool:
        """What every response teaches (Kafka's ``maybeHandleCommonResponse``); True if
        the response needs no further handling."""
        known_leader = None if leader_id == NO_LEADER else leader_id
        if epoch < self._quorum.epoch or error == _UNKNOWN_LEADER_EPOCH:
            return True
        if epoch > self._quorum.epoch or error in (
            _FENCED_LEADER_EPOCH,
            _NOT_LEADER_OR_FOLLOWER,
        ):
            self._maybe_transition(known_leader, epoch, now_ms)
            return True
        if known_leader is not None and self._quorum.leader_id is None:
            self._maybe_transition(known_leader, epoch, now_ms)
            return True
        return False

    # --- Vote -------------------------------------------------------------------------

    def _handle_vote_request(self, request: VoteRequest, now_ms: int) -> None:
        def answer(error: int, granted: bool = False) -> None:
            self._send(
                VoteResponse(
                    source=self.node_id,
                    destination=request.source,
                    error=error,
                    leader_id=_or_no_leader(self._quorum.leader_id),
                    leader_epoch=self._quorum.epoch,
                    vote_granted=granted,
                    pre_vote=request.pre_vote,
                )
            )

        if request.cluster_id != self.cluster_id:
            return answer(ErrorCode.INCONSISTENT_CLUSTER_ID)
        # A candidate has bumped its epoch past its log's; a prospective has not.
        if request.pre_vote:
            illegal_epoch = request.last_offset_epoch > request.candidate_epoch
        else:
            illegal_epoch = request.last_offset_epoch >= request.candidate_epoch
        if request.last_offset < 0 or request.last_offset_epoch < 0 or illegal_epoch:
            return answer(ErrorCode.INVALID_REQUEST)
        if request.candidate_epoch < self._quorum.epoch:
            return answer(ErrorCode.FENCED_LEADER_EPOCH)
        # In a dynamic quorum the candidate may be a voter of a set whose record this
        # replica has not fetched, or has but the candidate has truncated (KIP-853): the
        # candidate counts by its own set, one change apart from ours, so it is not refused.
        # Nor is a replica that is not in its own set: the candidate, which asks only the
        # voters of its set, may count it by a record this replica has not fetched yet.
        if self.is_static and (not self._quorum.is_voter or request.source not in self.voters):
            return answer(ErrorCode.INCONSISTENT_VOTER_SET)
        if self.is_stale_incarnation():
            # The candidate asks the voter with this id, a former incarnation whose votes
            # this replica does not hold: granting one could elect two leaders.
            return answer(ErrorCode.INCONSISTENT_VOTER_SET)
        if (
            request.voter_directory_id is not None
            and self.directory_id is not None
            and request.voter_directory_id != self.directory_id
        ):
            # KIP-853's voter key: the candidate's set names another incarnation of this
            # node id (this one's disk was wiped, and it may not know the set yet).
            return answer(ErrorCode.INCONSISTENT_VOTER_SET)
        if request.candidate_epoch > self._quorum.epoch:
            self._become_unattached(request.candidate_epoch, now_ms)
        state = self._quorum.state
        log_up_to_date = (request.last_offset_epoch, request.last_offset) >= (
            self._log.last_epoch,
            self._log.end_offset,
        )
        granted = state.can_grant_vote(request.source, log_up_to_date, request.pre_vote, now_ms)
        if granted and not request.pre_vote and state.voted_id is None:
            # Persisted (Ready.election_state) before the answer is sent.
            self._quorum.transition_to_unattached_voted(state.epoch, request.source, now_ms)
            self._after_transition(now_ms)
        return answer(_NONE, granted)

    def _handle_vote_response(self, response: VoteResponse, now_ms: int) -> None:
        state = self._quorum.state
        if isinstance(state, CandidateState | ProspectiveState):
            state.requests.on_response(response.source, now_ms, failed=response.error != _NONE)
        if self._handle_common_response(
            response.error, response.leader_id, response.leader_epoch, now_ms
        ):
            return
        if response.error != _NONE or response.leader_epoch != state.epoch:
            return
        if isinstance(state, ProspectiveState) and response.pre_vote:
            state.pre_votes.record(response.source, response.vote_granted)
            if state.pre_votes.is_granted:
                self._become_candidate(now_ms)
            elif state.pre_votes.is_rejected:
                self._prospective_lost(state, now_ms)
        elif (
            isinstance(state, CandidateState) and not response.pre_vote and not state.is_backing_off
        ):
            state.votes.record(response.source, response.vote_granted)
            if state.votes.is_granted:
                self._become_leader(now_ms)
            elif state.votes.is_rejected:
                # Lost: back off at once rather than wait for the election timeout.
                state.backoff_until_ms = now_ms + self._election_backoff_ms(state.retries)

    def _send_vote_requests(
        self,
        state: CandidateState | ProspectiveState,
        voters: Sequence[int],
        *,
        pre_vote: bool,
        now_ms: int,
    ) -> None:
        log = self._log
        for voter in voters:
            if state.requests.is_ready(voter, now_ms):
                state.requests.on_sent(voter, now_ms)
                self._send(
                    VoteRequest(
                        source=self.node_id,
                        destination=voter,
                        cluster_id=self.cluster_id,
                        candidate_epoch=state.epoch,
                        last_offset_epoch=log.last_epoch,
                        last_offset=log.end_offset,
                        pre_vote=pre_vote,
                        voter_directory_id=self._directory_id_of(voter),
                    )
                )

    def _directory_id_of(self, voter_id: int) -> uuid.UUID | None:
        """The directory id the voter set in use gives ``voter_id`` (None: static)."""
        if self.is_static:
            return None
        voter = self._history.latest().get(voter_id)
        return None if voter is None else voter.directory_id

    def _election_backoff_ms(self, retries: int) -> int:
        """Binary exponential backoff with jitter, capped (Kafka's election backoff)."""
        factor = self._random.randrange(2 << min(20, max(retries, 1) - 1))
        return min(self.config.retry_backoff_ms * factor, self.config.election_backoff_max_ms)

    # --- BeginQuorumEpoch / EndQuorumEpoch -------------------------------------------------

    def _handle_begin_quorum_epoch_request(
        self, request: BeginQuorumEpochRequest, now_ms: int
    ) -> None:
        error = self._validate_voter_only_request(
            request.cluster_id, request.source, request.leader_epoch
        )
        if error == _NONE:
            self._maybe_transition(request.source, request.leader_epoch, now_ms)
        self._send(
            BeginQuorumEpochResponse(
                source=self.node_id,
                destination=request.source,
                error=error,
                leader_id=_or_no_leader(self._quorum.leader_id),
                leader_epoch=self._quorum.epoch,
            )
        )

    def _handle_begin_quorum_epoch_response(
        self, response: BeginQuorumEpochResponse, now_ms: int
    ) -> None:
        state = self._quorum.state
        if isinstance(state, LeaderState):
            state.requests.on_response(response.source, now_ms, failed=response.error != _NONE)
        if self._handle_common_response(
            response.error, response.leader_id, response.leader_epoch, now_ms
        ):
            return
        if (
            isinstance(state, LeaderState)
            and response.error == _NONE
            and response.leader_epoch == state.epoch
        ):
            state.acknowledged.add(response.source)

    def _handle_end_quorum_epoch_request(self, request: EndQuorumEpochRequest, now_ms: int) -> None:
        error = self._validate_voter_only_request(
            request.cluster_id, request.source, request.leader_epoch
        )
        if error == _NONE:
            self._maybe_transition(request.source, request.leader_epoch, now_ms)
            state = self._quorum.state
            if (
                isinstance(state, FollowerState)
                and state.epoch == request.leader_epoch
                and state.leader_id == request.source
            ):
                state.leader_ending(
                    now_ms, self._end_epoch_backoff_ms(request.preferred_successors)
                )
        self._send(
            EndQuorumEpochResponse(
                source=self.node_id,
                destination=request.source,
                error=error,
                leader_id=_or_no_leader(self._quorum.leader_id),
                leader_epoch=self._quorum.epoch,
            )
        )

    def _handle_end_quorum_epoch_response(
        self, response: EndQuorumEpochResponse, now_ms: int
    ) -> None:
        state = self._quorum.state
        if isinstance(state, ResignedState):
            state.requests.on_response(response.source, now_ms, failed=response.error != _NONE)
        if self._handle_common_response(
            response.error, response.leader_id, response.leader_epoch, now_ms
        ):
            return
        if (
            isinstance(state, ResignedState)
            and response.error == _NONE
            and response.leader_epoch == state.epoch
        ):
            state.unacknowledged.discard(response.source)

    def _end_epoch_backoff_ms(self, preferred_successors: Sequence[int]) -> int:
        """How long a follower waits before its pre-vote after the leader resigned: the
        first preferred successor at once, the next ones exponentially later (Kafka)."""
        maximum = self.config.election_backoff_max_ms
        if self.node_id not in preferred_successors:
            return maximum
        rank = list(preferred_successors).index(self.node_id)
        if rank == 0:
            return 0
        return min(maximum, maximum >> (len(preferred_successors) - rank))

    def _validate_voter_only_request(self, cluster_id: str, source: int, epoch: int) -> int:
        if cluster_id != self.cluster_id:
            return ErrorCode.INCONSISTENT_CLUSTER_ID
        if epoch < self._quorum.epoch:
            return ErrorCode.FENCED_LEADER_EPOCH
        # In a dynamic quorum the epoch's leader may be a voter this replica has not
        # fetched the record of yet (KIP-853): the epoch, won by a majority, names it.
        if not self._quorum.is_voter or (self.is_static and source not in self.voters):
            return ErrorCode.INCONSISTENT_VOTER_SET
        return _NONE

    # --- Fetch: the leader's side ----------------------------------------------------------

    def _validate_leader_only_request(self, epoch: int) -> int:
        if epoch < self._quorum.epoch:
            return _FENCED_LEADER_EPOCH
        if epoch > self._quorum.epoch:
            return _UNKNOWN_LEADER_EPOCH
        if not self.is_leader:
            return _NOT_LEADER_OR_FOLLOWER
        return _NONE

    def _handle_fetch_request(self, request: FetchRequest, now_ms: int) -> None:
        self._parked.pop(request.source, None)  # a newer fetch supersedes a parked one
        if request.cluster_id != self.cluster_id:
            self._send(self._fetch_error(request, ErrorCode.INCONSISTENT_CLUSTER_ID))
            return
        if (
            request.fetch_offset < 0
            or request.last_fetched_epoch < 0
            or request.last_fetched_epoch > request.current_leader_epoch
            or request.max_wait_ms < 0
        ):
            self._send(self._fetch_error(request, ErrorCode.INVALID_REQUEST))
            return
        response, park_ms = self._complete_fetch(request, now_ms, may_park=True)
        if response is None:
            self._parked[request.source] = (request, now_ms + park_ms)
        else:
            self._send_fetch_response(response)

    @overload
    def _complete_fetch(
        self, request: FetchRequest, now_ms: int, *, may_park: Literal[False] = False
    ) -> tuple[FetchResponse, int]: ...

    @overload
    def _complete_fetch(
        self, request: FetchRequest, now_ms: int, *, may_park: bool
    ) -> tuple[FetchResponse | None, int]: ...

    def _complete_fetch(
        self, request: FetchRequest, now_ms: int, *, may_park: bool = False
    ) -> tuple[FetchResponse | None, int]:
        """The answer to ``request`` now, and how long it may be parked instead: as long as
        the long poll when it tells nothing new, the linger when it tells only a voter's
        new high watermark, not at all otherwise (capped by the request's
        ``max_wait_ms``). With ``may_park``, a fetch that will be parked gets no answer
        built (None): it would be thrown away, and the parked fetch answered later."""
        error = self._validate_leader_only_request(request.current_leader_epoch)
        state = self._quorum.state
        if error != _NONE or not isinstance(state, LeaderState):
            return self._fetch_error(request, error), 0
        # The set may name another incarnation of this node id (its disk was wiped): what
        # this one has fetched is not what the voter acknowledged, nor is its fetch the
        # voter's contact. It is answered as an observer is, so that it catches up and
        # learns the set naming its former key (which it may then ask to remove, as
        # auto-join does), and nothing of it is counted, as Kafka's leader keys replicas
        # by id and directory id.
        counted = not self._is_other_incarnation(request.source, request.replica_directory_id)
        if counted:
            state.record_contact(request.source, now_ms)  # a voter that follows us, in sync or not
        log = self._log
        latest_snapshot = self._snapshots.latest()
        fetch_offset = request.fetch_offset
        if fetch_offset < log.start_offset or (
            fetch_offset == 0 and latest_snapshot is not None and latest_snapshot.offset > 0
        ):
            return self._snapshot_answer(request, state, latest_snapshot), 0
        end = log.end_offset_for_epoch(request.last_fetched_epoch)
        if end.epoch != request.last_fetched_epoch or end.offset < fetch_offset:
            if end.offset <= log.start_offset and log.start_offset > 0:
                # The common prefix ends inside the snapshot: start from the snapshot.
                return self._snapshot_answer(request, state, latest_snapshot), 0
            return self._fetch_answer(request, state, diverging_epoch=end), 0
        # A fetch at the log end (a follower that caught up, reporting its position) has
        # nothing to read: no segment lookup for it, on the path of every commit.
        records = (
            log.read(fetch_offset, min(request.max_bytes, self.config.fetch_max_bytes))
            if fetch_offset < log.end_offset
            else b""
        )
        if counted and state.update_replica_state(
            request.source,
            fetch_offset,
            log.end_offset,
            now_ms,
            directory_id=request.replica_directory_id,
            endpoint=request.replica_endpoint,
        ):
            self._on_leader_high_watermark(state, now_ms, skip=request.source)
        park_ms = 0
        if not records:
            replica = state.replica_state(request.source) if counted else None
            if replica is not None and replica.high_watermark_sent != state.high_watermark:
                park_ms = min(self._high_watermark_linger_ms(request.source), request.max_wait_ms)
            else:
                park_ms = request.max_wait_ms
        if may_park and park_ms > 0:
            return None, park_ms
        return self._fetch_answer(request, state, records=records), park_ms

    def _is_other_incarnation(self, replica_id: int, directory_id: uuid.UUID | None) -> bool:
        """Whether the voter set in use names ``replica_id`` with another directory id than
        the one its request carries (None: not known, a static quorum)."""
        if self.is_static or directory_id is None:
            return False
        voter = self._history.latest().get(replica_id)
        return voter is not None and voter.directory_id != directory_id

    def _high_watermark_linger_ms(self, replica_id: int) -> int:
        return self.config.high_watermark_linger_ms if replica_id in self.voters else 0

    def _fetch_answer(
        self,
        request: FetchRequest,
        state: LeaderState,
        *,
        records: bytes = b"",
        diverging_epoch: OffsetAndEpoch | None = None,
        snapshot_id: OffsetAndEpoch | None = None,
    ) -> FetchResponse:
        return FetchResponse(
            source=self.node_id,
            destination=request.source,
            error=_NONE,
            leader_id=self.node_id,
            leader_epoch=state.epoch,
            high_watermark=_or_unknown(state.high_watermark),
            log_start_offset=self._log.start_offset,
            diverging_epoch=diverging_epoch,
            snapshot_id=snapshot_id,
            records=records,
            fetch_offset=request.fetch_offset,
            last_fetched_epoch=request.last_fetched_epoch,
        )

    def _snapshot_answer(
        self, request: FetchRequest, state: LeaderState, snapshot_id: OffsetAndEpoch | None
    ) -> FetchResponse:
        if snapshot_id is None:  # a log start without a snapshot: nothing to offer
            return self._fetch_error(request, ErrorCode.OFFSET_OUT_OF_RANGE)
        return self._fetch_answer(request, state, snapshot_id=snapshot_id)

    def _fetch_error(self, request: FetchRequest, error: int) -> FetchResponse:
        return FetchResponse(
            source=self.node_id,
            destination=request.source,
            error=error,
            leader_id=_or_no_leader(self._quorum.leader_id),
            leader_epoch=self._quorum.epoch,
            log_start_offset=self._log.start_offset,
            fetch_offset=request.fetch_offset,
            last_fetched_epoch=request.last_fetched_epoch,
        )

    def _send_fetch_response(self, response: FetchResponse) -> None:
        state = self._quorum.state
        if isinstance(state, LeaderState) and response.error == _NONE:
            replica = state.replica_state(response.destination)
            if replica is not None:
                replica.high_watermark_sent = state.high_watermark
        self._send(response)

    def _on_leader_high_watermark(
        self, state: LeaderState, now_ms: int, *, skip: int | None = None
    ) -> None:
        """The leader's high watermark moved: record it, tell the parked fetchers (the
        voters' after the linger, unless entries come first)."""
        if state.high_watermark is not None:
            self._set_high_watermark(state.high_watermark)
        for replica_id, (request, deadline_ms) in self._parked.items():
            linger_until = now_ms + self._high_watermark_linger_ms(replica_id)
            if linger_until < deadline_ms:
                self._parked[replica_id] = (request, linger_until)
        self._answer_parked(
            now_ms,
            lambda request, deadline_ms: request.source != skip and deadline_ms <= now_ms,
        )

    def _answer_parked(self, now_ms: int, due: Callable[[FetchRequest, int], bool]) -> None:
        """Answer the parked fetches that are ``due`` (answering one may answer others)."""
        if not self._parked:
            return
        while True:
            due_ids = [r for r, (req, deadline) in self._parked.items() if due(req, deadline)]
            if not due_ids:
                return
            request, _ = self._parked.pop(due_ids[0])
            self._send_fetch_response(self._complete_fetch(request, now_ms)[0])

    def _handle_fetch_snapshot_request(self, request: FetchSnapshotRequest, now_ms: int) -> None:
        def answer(error: int, chunk: bytes = b"", size: int = 0) -> None:
            self._send(
                FetchSnapshotResponse(
                    source=self.node_id,
                    destination=request.source,
                    error=error,
                    leader_id=_or_no_leader(self._quorum.leader_id),
                    leader_epoch=self._quorum.epoch,
                    snapshot_id=request.snapshot_id,
                    size=size,
                    position=request.position,
                    chunk=chunk,
                )
            )

        if request.cluster_id != self.cluster_id:
            return answer(ErrorCode.INCONSISTENT_CLUSTER_ID)
        error = self._validate_leader_only_request(request.current_leader_epoch)
        state = self._quorum.state
        if error != _NONE or not isinstance(state, LeaderState):
            return answer(error)
        if request.position < 0 or request.max_bytes <= 0:
            return answer(ErrorCode.INVALID_REQUEST)
        if not self._is_other_incarnation(request.source, request.replica_directory_id):
            # Another incarnation of a voter (its disk was wiped) is served, as Kafka's
            # leader serves it, but its snapshot fetch is not the voter's contact.
            state.record_contact(request.source, now_ms)
        try:
            chunk, size = self._snapshots.read_chunk(
                request.snapshot_id,
                request.position,
                min(request.max_bytes, self.config.snapshot_chunk_bytes),
            )
        except SnapshotNotFoundError:
            return answer(ErrorCode.SNAPSHOT_NOT_FOUND)
        except PositionOutOfRangeError:
            return answer(ErrorCode.POSITION_OUT_OF_RANGE)
        return answer(_NONE, chunk, size)

    # --- Fetch: the follower's side --------------------------------------------------------

    def _fetch_request(self, destination: int, epoch: int) -> FetchRequest:
        log = self._log
        return FetchRequest(
            source=self.node_id,
            destination=destination,
            cluster_id=self.cluster_id,
            current_leader_epoch=epoch,
            fetch_offset=log.end_offset,
            last_fetched_epoch=log.last_epoch,
            max_wait_ms=self.config.fetch_max_wait_ms,
            max_bytes=self.config.fetch_max_bytes,
            replica_directory_id=None if self.is_static else self.directory_id,
            replica_endpoint="" if self.is_static else self.endpoint,
        )

    def _handle_fetch_response(self, response: FetchResponse, now_ms: int) -> None:
        state = self._quorum.state
        log = self._log
        position = OffsetAndEpoch(log.end_offset, log.last_epoch)
        echoed = OffsetAndEpoch(response.fetch_offset, response.last_fetched_epoch)
        # An answer for the position we are at: the only one that may change the log.
        current = (
            echoed == position if response.fetch_offset >= 0 else _fetching_at(state, position)
        )
        if isinstance(state, UnattachedState):
            state.requests.on_response(_LEADER_DISCOVERY, now_ms, failed=response.error != _NONE)
        elif isinstance(state, FollowerState) and response.source == state.leader_id and current:
            state.fetch_in_flight = None
            if response.error != _NONE:
                state.next_fetch_ms = now_ms + self.config.retry_backoff_ms
        if self._handle_common_response(
            response.error, response.leader_id, response.leader_epoch, now_ms
        ):
            return
        if (
            not isinstance(state, FollowerState)
            or response.source != state.leader_id
            or response.leader_epoch != state.epoch
            or response.error != _NONE
            or not current
            or state.snapshot_fetch is not None
        ):
            return
        state.heard_from_leader(now_ms)
        if response.diverging_epoch is not None:
            self._truncate_diverging(response.diverging_epoch)
        elif response.snapshot_id is not None:
            self._start_snapshot_fetch(state, response.snapshot_id)
        else:
            if response.records:
                log.append_as_follower(response.records)
                if not self.is_static:
                    self._note_voters_records(response.records)
                    self._voters_changed(now_ms)
            if response.high_watermark >= 0:
                self._set_high_watermark(min(response.high_watermark, log.end_offset))

    def _truncate_diverging(self, diverging: OffsetAndEpoch) -> None:
        """Truncate where the common prefix with the leader's log ends: the entries past it
        are not the leader's, so none of them is committed."""
        log = self._log
        local = log.end_offset_for_epoch(diverging.epoch)
        offset = max(min(diverging.offset, local.offset), log.start_offset)
        if self._high_watermark is not None and offset < self._high_watermark:
            raise IllegalTransitionError(
                f"the leader asks to truncate to {offset}, below the high watermark "
                f"{self._high_watermark}"
            )
        log.truncate_to(offset)
        self._history.truncate_to(offset)
        self._voters_changed(self._now_ms)

    def _start_snapshot_fetch(self, state: FollowerState, snapshot_id: OffsetAndEpoch) -> None:
        if snapshot_id in self._snapshots.snapshots():
            self._install_snapshot(snapshot_id)
            return
        self._snapshots.begin_receive(snapshot_id)
        state.snapshot_fetch = SnapshotFetch(snapshot_id)

    def _install_snapshot(self, snapshot_id: OffsetAndEpoch) -> None:
        self._log.truncate_to_snapshot(snapshot_id)
        self._history.truncate_to(snapshot_id.offset)
        self._history.forget_before(snapshot_id.offset)
        carried = (
            None
            if self.is_static or self._snapshot_voters is None
            else self._snapshot_voters(snapshot_id)
        )
        if carried is not None:
            # The snapshot carries the set committed at its offset (Kafka's VotersRecord
            # in the snapshot): it replaces whatever this replica had below it.
            self._history = VoterSetHistory(carried[1], carried[0])
        self._voters_changed(self._now_ms)
        self._snapshots.delete_before(snapshot_id)
        self._load_snapshot = snapshot_id
        self._set_high_watermark(snapshot_id.offset)

    def _handle_fetch_snapshot_response(self, response: FetchSnapshotResponse, now_ms: int) -> None:
        state = self._quorum.state
        snapshot_fetch = state.snapshot_fetch if isinstance(state, FollowerState) else None
        current = (
            isinstance(state, FollowerState)
            and snapshot_fetch is not None
            and response.source == state.leader_id
            and response.snapshot_id == snapshot_fetch.snapshot_id
            and response.position == snapshot_fetch.position
        )
        if current and isinstance(state, FollowerState) and snapshot_fetch is not None:
            snapshot_fetch.requested_position = None
            if response.error in (ErrorCode.SNAPSHOT_NOT_FOUND, ErrorCode.POSITION_OUT_OF_RANGE):
                # The leader has moved on to a newer snapshot: fetch to learn which.
                state.snapshot_fetch = None
                return
            if response.error != _NONE:
                state.next_fetch_ms = now_ms + self.config.retry_backoff_ms
        if self._handle_common_response(
            response.error, response.leader_id, response.leader_epoch, now_ms
        ):
            return
        if (
            not current
            or not isinstance(state, FollowerState)
            or snapshot_fetch is None
            or response.error != _NONE
            or response.leader_epoch != state.epoch
        ):
            return
        state.heard_from_leader(now_ms)
        if not response.chunk and response.position < response.size:
            state.snapshot_fetch = None  # an empty chunk mid-snapshot: start over
            return
        self._snapshots.receive_chunk(response.position, response.chunk)
        snapshot_fetch.position += len(response.chunk)
        if snapshot_fetch.position >= response.size:
            state.snapshot_fetch = None
            self._install_snapshot(self._snapshots.finish_receive())

    # --- Helpers ---------------------------------------------------------------------------

    def _set_high_watermark(self, offset: int) -> None:
        if self._high_watermark is None or offset > self._high_watermark:
            self._high_watermark = offset

    def _send(self, message: RaftMessage) -> None:
        self._outbox.append(message)

    def __repr__(self) -> str:
        return (
            f"RaftNode(id={self.node_id}, {self._quorum.state}, hw={self._high_watermark}, "
            f"log={self._log!r})"
        )


def _fetching_at(state: EpochState, position: OffsetAndEpoch) -> bool:
    """Without an echoed position: an answer counts if a fetch from here is in flight."""
    return isinstance(state, FollowerState) and state.fetch_in_flight == position


def _or_no_leader(leader_id: int | None) -> int:
    return NO_LEADER if leader_id is None else leader_id


def _or_unknown(offset: int | None) -> int:
    return -1 if offset is None else offset
