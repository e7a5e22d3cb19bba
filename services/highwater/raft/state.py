"""The Raft election states as types, and ``QuorumState``: the one place where they change.

As in Kafka's ``raft/`` package, each state a replica can be in during an epoch is a
class with the data and timers of that state only:

* :class:`UnattachedState` — knows the epoch but not its leader; may have voted in it.
* :class:`ProspectiveState` — asks for pre-votes (KIP-996) without bumping the epoch.
* :class:`CandidateState` — has bumped the epoch, voted for itself, asks for votes.
* :class:`LeaderState` — won the epoch; tracks every replica's progress, the high watermark.
* :class:`FollowerState` — knows the epoch's leader and fetches from it.
* :class:`ResignedState` — led the epoch and stepped down (a soft state: never persisted).

:class:`QuorumState` checks each transition's preconditions (raising
:class:`IllegalTransitionError`) and records the :class:`ElectionState` that must be made
durable before the node sends anything: the driver persists it first (``Ready``).

The transitions, for voters::

    Unattached  -> Unattached (higher epoch, or a vote granted), Prospective, Follower
    Prospective -> Unattached (higher epoch, or lost without a known leader),
                   Candidate (majority of pre-votes), Follower (a leader is known)
    Candidate   -> Unattached (higher epoch), Prospective (after the election backoff),
                   Leader (majority of votes), Follower (another won the epoch)
    Leader      -> Unattached (higher epoch), Resigned (graceful or lost the quorum)
    Follower    -> Unattached (higher epoch), Prospective (fetch timeout),
                   Follower (leader of a higher epoch)
    Resigned    -> Unattached (higher epoch), Prospective (election timeout),
                   Follower (leader of a higher epoch)

Observers only move between Unattached and Follower (also within an epoch, when the
leader they fetched from goes quiet).
"""

from __future__ import annotations

import enum
import random
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import ClassVar

from highwater.raft.messages import OffsetAndEpoch, ReplicaProgress

__all__ = [
    "CandidateState",
    "ElectionState",
    "EpochState",
    "FollowerState",
    "IllegalTransitionError",
    "LeaderState",
    "ProspectiveState",
    "QuorumState",
    "ReplicaState",
    "RequestTracker",
    "ResignedState",
    "Role",
    "SnapshotFetch",
    "UnattachedState",
    "VoteTally",
]

OBSERVER_SESSION_TIMEOUT_MS = 300_000
"""A leader forgets an observer that has not fetched for this long (Kafka's value)."""


class IllegalTransitionError(RuntimeError):
    """A transition whose preconditions do not hold: a bug in the caller, never input."""


class Role(enum.Enum):
    UNATTACHED = "unattached"
    PROSPECTIVE = "prospective"
    CANDIDATE = "candidate"
    LEADER = "leader"
    FOLLOWER = "follower"
    RESIGNED = "resigned"


@dataclass(frozen=True, slots=True)
class ElectionState:
    """What a voter must persist (Kafka's ``quorum-state``): its epoch, its vote, the leader."""

    epoch: int
    voted_id: int | None = None
    leader_id: int | None = None


class RequestTracker:
    """Per destination, whether a request may be sent now.

    A request is in flight until its response arrives or ``request_timeout_ms`` passes;
    after a failed response the destination waits ``retry_backoff_ms``.
    """

    __slots__ = ("_backoff_until", "_in_flight_until", "request_timeout_ms", "retry_backoff_ms")

    def __init__(self, request_timeout_ms: int, retry_backoff_ms: int) -> None:
        self.request_timeout_ms = request_timeout_ms
        self.retry_backoff_ms = retry_backoff_ms
        self._in_flight_until: dict[int, int] = {}
        self._backoff_until: dict[int, int] = {}

    def is_ready(self, destination: int, now_ms: int) -> bool:
        if self._in_flight_until.get(destination, now_ms) > now_ms:
            return False
        return self._backoff_until.get(destination, now_ms) <= now_ms

    def is_in_flight(self, destination: int, now_ms: int) -> bool:
        return self._in_flight_until.get(destination, now_ms) > now_ms

    def ready_at(self, destination: int) -> int:
        """When a request to ``destination`` may be sent (0: at any time)."""
        return max(
            self._in_flight_until.get(destination, 0), self._backoff_until.get(destination, 0)
        )

    def on_sent(self, destination: int, now_ms: int) -> None:
        self._in_flight_until[destination] = now_ms + self.request_timeout_ms
        self._backoff_until.pop(destination, None)

    def on_response(self, destination: int, now_ms: int, *, failed: bool = False) -> None:
        self._in_flight_until.pop(destination, None)
        if failed:
            self._backoff_until[destination] = now_ms + self.retry_backoff_ms


class VoteTally:
    """The votes (or pre-votes) of one election: granted, rejected, the majority."""

    __slots__ = ("granted", "rejected", "voters")

    def __init__(self, voters: frozenset[int], local_id: int) -> None:
        self.voters = voters
        self.granted: set[int] = {local_id}
        self.rejected: set[int] = set()

    @property
    def majority(self) -> int:
        return len(self.voters) // 2 + 1

    def record(self, voter_id: int, granted: bool) -> None:
        if voter_id not in self.voters or voter_id in self.granted or voter_id in self.rejected:
            return
        (self.granted if granted else self.rejected).add(voter_id)

    @property
    def is_granted(self) -> bool:
        return len(self.granted) >= self.majority

    @property
    def is_rejected(self) -> bool:
        """Enough voters said no that a majority is out of reach."""
        return len(self.rejected) > len(self.voters) - self.majority

    def unanswered(self) -> list[int]:
        return sorted(self.voters - self.granted - self.rejected)


@dataclass(slots=True)
class SnapshotFetch:
    """A follower's transfer of the leader's snapshot: which one, how far it got."""

    snapshot_id: OffsetAndEpoch
    position: int = 0
    # The position asked for by the FetchSnapshot in flight, if one is.
    requested_position: int | None = None
    requested_until_ms: int = 0


@dataclass(slots=True)
class ReplicaState:
    """The leader's view of one replica: what it has fetched up to, and when."""

    replica_id: int
    # The directory id its fetches carry (KIP-853's replica key with the id; None: static,
    # or not heard from yet).
    directory_id: uuid.UUID | None = None
    # The controller endpoint its fetches announce (empty: none, a broker's or a
    # coordinator's metadata replica; only an observer that announced one may be added).
    endpoint: str = ""
    end_offset: int | None = None
    last_fetch_ms: int | None = None
    last_caught_up_ms: int | None = None
    # The leader's log end offset when this replica last fetched (Kafka's caught-up rule).
    leader_end_at_last_fetch: int | None = None
    # The high watermark in the last answer sent to it: a fetch is not parked while the
    # replica has yet to learn the current one.
    high_watermark_sent: int | None = None

    def progress(self) -> ReplicaProgress:
        return ReplicaProgress(
            replica_id=self.replica_id,
            log_end_offset=-1 if self.end_offset is None else self.end_offset,
            last_fetch_ms=-1 if self.last_fetch_ms is None else self.last_fetch_ms,
            last_caught_up_ms=-1 if self.last_caught_up_ms is None else self.last_caught_up_ms,
            directory_id=self.directory_id,
            endpoint=self.endpoint,
        )


# --- The states ------------------------------------------------------------------------


class EpochState:
    """What every state has: an epoch, the requests it sends, the election to persist.

    A plain base class, not an ``abc.ABC``: the driver asks ``isinstance(state,
    LeaderState)`` and the like on every event, and under ``ABCMeta`` each such check that
    does not match the exact class goes through ``__instancecheck__`` (about four times
    the cost of a plain class's). Every concrete state overrides :meth:`can_grant_vote`.
    """

    role: ClassVar[Role]

    def __init__(self, epoch: int, requests: RequestTracker) -> None:
        self.epoch = epoch
        self.requests = requests

    @property
    def leader_id(self) -> int | None:
        return None

    @property
    def voted_id(self) -> int | None:
        return None

    def election(self) -> ElectionState:
        return ElectionState(self.epoch, self.voted_id, self.leader_id)

    def can_grant_vote(
        self, candidate_id: int, log_up_to_date: bool, pre_vote: bool, now_ms: int
    ) -> bool:
        """Whether this state lets the replica grant a (pre-)vote in its own epoch."""
        raise NotImplementedError(f"{type(self).__name__} does not say whether it grants votes")

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(epoch={self.epoch}, leader={self.leader_id}, "
            f"voted={self.voted_id})"
        )


class _LeaderlessState(EpochState):
    """What unattached and prospective replicas share: no leader to follow, perhaps a vote
    cast in this epoch, and the same rule for granting votes."""

    def __init__(
        self,
        epoch: int,
        requests: RequestTracker,
        *,
        voted_id: int | None,
        leader_id: int | None,
    ) -> None:
        super().__init__(epoch, requests)
        self._voted_id = voted_id
        self._leader_id = leader_id

    @property
    def voted_id(self) -> int | None:
        return self._voted_id

    @property
    def leader_id(self) -> int | None:
        return self._leader_id

    def can_grant_vote(
        self, candidate_id: int, log_up_to_date: bool, pre_vote: bool, now_ms: int
    ) -> bool:
        if pre_vote:
            return log_up_to_date
        if self._voted_id is not None:
            return self._voted_id == candidate_id
        if self._leader_id is not None:
            return False
        return log_up_to_date


class UnattachedState(_LeaderlessState):
    """The epoch is known but no leader to follow; a voter may have voted in it.

    ``leader_id`` is only ever the local replica: a leader that resigned and lost the
    pre-vote of its own epoch remembers that it led it, so that it never leads it again.
    """

    role = Role.UNATTACHED

    def __init__(
        self,
        epoch: int,
        requests: RequestTracker,
        *,
        voted_id: int | None,
        election_deadline_ms: int | None,
        leader_id: int | None = None,
    ) -> None:
        super().__init__(epoch, requests, voted_id=voted_id, leader_id=leader_id)
        # None for observers: they never campaign.
        self.election_deadline_ms = election_deadline_ms


class ProspectiveState(_LeaderlessState):
    """Asks the voters whether they would vote for it, before bumping the epoch (KIP-996)."""

    role = Role.PROSPECTIVE

    def __init__(
        self,
        epoch: int,
        requests: RequestTracker,
        *,
        local_id: int,
        voters: frozenset[int],
        voted_id: int | None,
        leader_id: int | None,
        election_deadline_ms: int,
        retries: int,
    ) -> None:
        # ``leader_id`` is the epoch's last known leader: the one to go back to if the
        # pre-vote fails.
        super().__init__(epoch, requests, voted_id=voted_id, leader_id=leader_id)
        self.election_deadline_ms = election_deadline_ms
        self.retries = retries
        self.pre_votes = VoteTally(voters, local_id)


class CandidateState(EpochState):
    """Bumped the epoch, voted for itself, asks the other voters for their votes."""

    role = Role.CANDIDATE

    def __init__(
        self,
        epoch: int,
        requests: RequestTracker,
        *,
        local_id: int,
        voters: frozenset[int],
        election_deadline_ms: int,
        retries: int,
    ) -> None:
        super().__init__(epoch, requests)
        self.local_id = local_id
        self.election_deadline_ms = election_deadline_ms
        self.retries = retries
        self.votes = VoteTally(voters, local_id)
        # Set once the election is lost or timed out: when to try again (as prospective).
        self.backoff_until_ms: int | None = None

    @property
    def voted_id(self) -> int | None:
        return self.local_id

    @property
    def is_backing_off(self) -> bool:
        return self.backoff_until_ms is not None

    def can_grant_vote(
        self, candidate_id: int, log_up_to_date: bool, pre_vote: bool, now_ms: int
    ) -> bool:
        if pre_vote:
            return log_up_to_date
        return candidate_id == self.local_id


class LeaderState(EpochState):
    """Leads the epoch: every replica's progress, the high watermark, the check-quorum timer.

    The high watermark is the largest offset a majority of voters have reached (the
    leader counted up to its *flushed* offset), once it lies past the epoch's start
    offset: only an entry of the leader's own epoch commits those before it. It is
    ``None`` until then, and never goes backwards.
    """

    role = Role.LEADER

    def __init__(
        self,
        epoch: int,
        requests: RequestTracker,
        *,
        local_id: int,
        voters: frozenset[int],
        epoch_start_offset: int,
        now_ms: int,
        fetch_timeout_ms: int,
    ) -> None:
        super().__init__(epoch, requests)
        self.local_id = local_id
        self.voters = voters
        self.epoch_start_offset = epoch_start_offset
        self.fetch_timeout_ms = fetch_timeout_ms
        self.high_watermark: int | None = None
        # The leader's own progress, counted among the voters' only while it is one.
        self.local_state = ReplicaState(local_id)
        self.voter_states = {
            voter: self.local_state if voter == local_id else ReplicaState(voter)
            for voter in voters
        }
        self.observer_states: dict[int, ReplicaState] = {}
        # Voters that know of this epoch (acknowledged BeginQuorumEpoch or fetched).
        self.acknowledged: set[int] = {local_id}
        self.check_quorum_deadline_ms = now_ms + fetch_timeout_ms
        self._heard_since_check: set[int] = {local_id} & voters
        self.voters_record_offsets: list[int] = []
        """Where this leader appended ``voters`` records in its epoch (a snapshot may
        absorb one from the voter set history; this list keeps it)."""

    @property
    def leader_id(self) -> int | None:
        return self.local_id

    @property
    def voted_id(self) -> int | None:
        return self.local_id

    def can_grant_vote(
        self, candidate_id: int, log_up_to_date: bool, pre_vote: bool, now_ms: int
    ) -> bool:
        return False

    def unacknowledged_voters(self) -> list[int]:
        return sorted(self.voters - self.acknowledged)

    def set_voters(self, voters: frozenset[int]) -> bool:
        """The voter set in use changed (a ``voters`` record was appended): a new voter's
        progress is taken over from its observer state, a removed one's becomes an
        observer's; True if the high watermark moved (counted with the new set)."""
        for removed in self.voter_states.keys() - voters:
            state = self.voter_states.pop(removed)
            if removed != self.local_id:
                self.observer_states[removed] = state
        for added in voters - self.voter_states.keys():
            if added == self.local_id:
                self.voter_states[added] = self.local_state
            else:
                self.voter_states[added] = self.observer_states.pop(added, ReplicaState(added))
        self.voters = voters
        self._heard_since_check &= voters
        return self._update_high_watermark()

    # --- Progress --------------------------------------------------------------------

    def update_local_state(self, flushed_offset: int, end_offset: int, now_ms: int) -> bool:
        """The leader's own progress; True if the high watermark moved."""
        local = self.local_state
        local.end_offset = flushed_offset
        local.last_fetch_ms = now_ms
        local.last_caught_up_ms = now_ms
        local.leader_end_at_last_fetch = end_offset
        return self._update_high_watermark()

    def update_replica_state(
        self,
        replica_id: int,
        fetch_offset: int,
        leader_end_offset: int,
        now_ms: int,
        *,
        directory_id: uuid.UUID | None = None,
        endpoint: str = "",
    ) -> bool:
        """A replica fetched from ``fetch_offset``; True if the high watermark moved.

        An observer that fetches under another ``directory_id`` than before is another
        incarnation (its disk was wiped): its progress starts anew, as Kafka keys
        observers by id and directory id. ``endpoint``: the controller endpoint the fetch
        announced (empty: none).
        """
        is_voter = replica_id in self.voters
        if is_voter:
            replica = self.voter_states[replica_id]
            self.acknowledged.add(replica_id)
            self.record_contact(replica_id, now_ms)
        else:
            known = self.observer_states.get(replica_id)
            if known is None or known.directory_id != directory_id:
                known = self.observer_states[replica_id] = ReplicaState(replica_id)
            replica = known
        replica.directory_id = directory_id
        replica.endpoint = endpoint
        if fetch_offset >= leader_end_offset:
            replica.last_caught_up_ms = now_ms
        elif (
            replica.leader_end_at_last_fetch is not None
            and fetch_offset >= replica.leader_end_at_last_fetch
            and replica.last_fetch_ms is not None
        ):
            replica.last_caught_up_ms = replica.last_fetch_ms
        replica.end_offset = fetch_offset
        replica.last_fetch_ms = now_ms
        replica.leader_end_at_last_fetch = leader_end_offset
        return is_voter and self._update_high_watermark()

    def replica_state(self, replica_id: int) -> ReplicaState | None:
        return self.voter_states.get(replica_id) or self.observer_states.get(replica_id)

    def _update_high_watermark(self) -> bool:
        offsets = [
            state.end_offset for state in self.voter_states.values() if state.end_offset is not None
        ]
        offsets.sort(reverse=True)
        majority = len(self.voters) // 2 + 1
        if len(offsets) < majority:
            return False
        candidate = offsets[majority - 1]
        if candidate <= self.epoch_start_offset:
            return False
        if self.high_watermark is not None and candidate <= self.high_watermark:
            return False
        self.high_watermark = candidate
        return True

    # --- Check quorum ----------------------------------------------------------------

    def record_contact(self, voter_id: int, now_ms: int) -> None:
        """A voter fetched: once a majority has since the last reset, the timer restarts."""
        if voter_id not in self.voters:
            return
        self._heard_since_check.add(voter_id)
        if len(self._heard_since_check) >= len(self.voters) // 2 + 1:
            self.check_quorum_deadline_ms = now_ms + self.fetch_timeout_ms
            self._heard_since_check = {self.local_id} & self.voters

    def has_lost_quorum(self, now_ms: int) -> bool:
        return now_ms >= self.check_quorum_deadline_ms

    # --- Describe --------------------------------------------------------------------

    def preferred_successors(self) -> tuple[int, ...]:
        """The other voters, most caught up first (ties broken by id)."""
        others = [state for voter, state in self.voter_states.items() if voter != self.local_id]
        others.sort(
            key=lambda s: (-(s.end_offset if s.end_offset is not None else -1), s.replica_id)
        )
        return tuple(state.replica_id for state in others)

    def voter_progress(self) -> tuple[ReplicaProgress, ...]:
        return tuple(self.voter_states[v].progress() for v in sorted(self.voter_states))

    def observer_progress(self, now_ms: int) -> tuple[ReplicaProgress, ...]:
        for observer_id, state in list(self.observer_states.items()):
            if (
                state.last_fetch_ms is not None
                and now_ms - state.last_fetch_ms > OBSERVER_SESSION_TIMEOUT_MS
            ):
                del self.observer_states[observer_id]
        observers = dict(self.observer_states)
        if self.local_id not in self.voter_states:
            # A leader that removed itself leads on, no voter, until the change commits:
            # it is listed as an observer, as Kafka's leader lists itself.
            observers[self.local_id] = self.local_state
        return tuple(observers[o].progress() for o in sorted(observers))


class FollowerState(EpochState):
    """Knows the epoch's leader and fetches from it; the fetch doubles as a heartbeat."""

    role = Role.FOLLOWER

    def __init__(
        self,
        epoch: int,
        requests: RequestTracker,
        *,
        leader_id: int,
        voted_id: int | None,
        now_ms: int,
        fetch_timeout_ms: int,
    ) -> None:
        super().__init__(epoch, requests)
        self._leader_id = leader_id
        self._voted_id = voted_id
        self.fetch_timeout_ms = fetch_timeout_ms
        self.fetch_deadline_ms = now_ms + fetch_timeout_ms
        # When the leader last answered a fetch of ours; None before the first answer.
        self.heard_from_leader_ms: int | None = None
        # A request to the leader failed at once (its process is gone): see leader_unreachable.
        self.leader_lost = False
        # The (fetch offset, last fetched epoch) of the Fetch in flight, if one is.
        self.fetch_in_flight: OffsetAndEpoch | None = None
        self.fetch_in_flight_until_ms = 0
        self.next_fetch_ms = now_ms
        self.snapshot_fetch: SnapshotFetch | None = None

    @property
    def leader_id(self) -> int:
        return self._leader_id

    @property
    def voted_id(self) -> int | None:
        return self._voted_id

    def can_grant_vote(
        self, candidate_id: int, log_up_to_date: bool, pre_vote: bool, now_ms: int
    ) -> bool:
        # A real vote in an epoch whose leader is known is never granted; a pre-vote only
        # once the leader has gone quiet, so a replica that was cut off and comes back
        # cannot force an election on a healthy quorum.
        if not pre_vote or not log_up_to_date:
            return False
        return (
            self.heard_from_leader_ms is None
            or now_ms - self.heard_from_leader_ms >= self.fetch_timeout_ms
        )

    def heard_from_leader(self, now_ms: int) -> None:
        self.heard_from_leader_ms = now_ms
        self.leader_lost = False
        self.fetch_deadline_ms = now_ms + self.fetch_timeout_ms

    def leader_ending(self, now_ms: int, timeout_ms: int) -> None:
        """The leader resigned: look for a new one after ``timeout_ms``."""
        self.heard_from_leader_ms = None
        self.fetch_deadline_ms = now_ms + timeout_ms

    def leader_unreachable(self, now_ms: int, timeout_ms: int) -> None:
        """The leader's process is gone: stop vouching for it, and look for a new one
        after ``timeout_ms`` (never later than the fetch timeout would). Only the first
        report counts until the leader answers again."""
        if self.leader_lost:
            return
        self.leader_lost = True
        self.heard_from_leader_ms = None
        self.fetch_deadline_ms = min(self.fetch_deadline_ms, now_ms + timeout_ms)

    def has_fetch_timed_out(self, now_ms: int) -> bool:
        return now_ms >= self.fetch_deadline_ms


class ResignedState(EpochState):
    """Led the epoch and stepped down; tells the voters (EndQuorumEpoch) until they answer.

    Never persisted: a leader that restarts comes back resigned in its epoch, so it can
    neither vote in it nor append to it again.
    """

    role = Role.RESIGNED

    def __init__(
        self,
        epoch: int,
        requests: RequestTracker,
        *,
        local_id: int,
        voters: frozenset[int],
        preferred_successors: tuple[int, ...],
        election_deadline_ms: int,
    ) -> None:
        super().__init__(epoch, requests)
        self.local_id = local_id
        self.preferred_successors = preferred_successors
        self.election_deadline_ms = election_deadline_ms
        self.unacknowledged: set[int] = set(voters) - {local_id}

    @property
    def leader_id(self) -> int | None:
        return self.local_id

    @property
    def voted_id(self) -> int | None:
        return self.local_id

    def can_grant_vote(
        self, candidate_id: int, log_up_to_date: bool, pre_vote: bool, now_ms: int
    ) -> bool:
        # It stepped down so that another can lead: it helps a successor's pre-vote, but
        # never votes in the epoch it led.
        return pre_vote and log_up_to_date


# --- The one place transitions happen --------------------------------------------------


class QuorumState:
    """The replica's current :class:`EpochState`, changed only by the ``transition_to_*``
    methods, each of which checks its preconditions and records the election state to
    persist (taken with :meth:`take_unpersisted`)."""

    def __init__(
        self,
        local_id: int,
        voters: frozenset[int],
        *,
        election_timeout_ms: int,
        fetch_timeout_ms: int,
        request_timeout_ms: int,
        retry_backoff_ms: int,
        rng: random.Random,
    ) -> None:
        self.local_id = local_id
        self.voters = voters
        # A dynamic quorum (KIP-853): a replica outside its own voter set may be a voter
        # of the candidate's newer set it has not fetched yet, so it votes when asked.
        self.observers_vote = False
        self.election_timeout_ms = election_timeout_ms
        self.fetch_timeout_ms = fetch_timeout_ms
        self.request_timeout_ms = request_timeout_ms
        self.retry_backoff_ms = retry_backoff_ms
        self.random = rng
        self._state: EpochState | None = None
        self._persisted: ElectionState | None = None
        self._unpersisted: ElectionState | None = None

    # --- Reading ---------------------------------------------------------------------

    @property
    def state(self) -> EpochState:
        if self._state is None:
            raise IllegalTransitionError("the quorum state is not initialized")
        return self._state

    @property
    def epoch(self) -> int:
        return self.state.epoch

    @property
    def leader_id(self) -> int | None:
        return self.state.leader_id

    @property
    def initialized(self) -> bool:
        return self._state is not None

    @property
    def is_voter(self) -> bool:
        return self.local_id in self.voters

    @property
    def is_observer(self) -> bool:
        return self.local_id not in self.voters

    @property
    def majority(self) -> int:
        return len(self.voters) // 2 + 1

    @property
    def has_unpersisted(self) -> bool:
        return self._unpersisted is not None

    def take_unpersisted(self) -> ElectionState | None:
        """The election state to persist before sending anything, once."""
        election, self._unpersisted = self._unpersisted, None
        return election

    def random_election_timeout_ms(self) -> int:
        """Kafka's randomized election timeout: uniform in ``[t, 2t)``."""
        timeout = self.election_timeout_ms
        return timeout + self.random.randrange(timeout) if timeout > 0 else 0

    # --- Initialization --------------------------------------------------------------

    def initialize(
        self, election: ElectionState | None, log_end: OffsetAndEpoch, now_ms: int
    ) -> None:
        """Start in the state the persisted election describes (Kafka's rules).

        A leader comes back resigned in its epoch; a candidate as candidate; a voter that
        voted as unattached with that vote; a follower as follower. A log that has seen a
        later epoch than the election state wins: unattached in the log's epoch.
        """
        self._persisted = election
        if election is None:
            election = ElectionState(0)
        local = self.local_id
        state: EpochState
        if election.epoch < log_end.epoch:
            state = self._unattached(log_end.epoch, None, now_ms)
        elif election.leader_id == local and self.is_voter:
            state = ResignedState(
                election.epoch,
                self._tracker(),
                local_id=local,
                voters=self.voters,
                preferred_successors=(),
                election_deadline_ms=now_ms + self.random_election_timeout_ms(),
            )
        elif election.voted_id == local and election.leader_id is None and self.is_voter:
            state = CandidateState(
                election.epoch,
                self._tracker(),
                local_id=local,
                voters=self.voters,
                election_deadline_ms=now_ms + self.random_election_timeout_ms(),
                retries=1,
            )
        elif (
            election.leader_id is not None
            and (election.leader_id in self.voters or self.observers_vote)
            and election.leader_id != local
        ):
            state = FollowerState(
                election.epoch,
                self._tracker(),
                leader_id=election.leader_id,
                voted_id=election.voted_id if self.is_voter or self.observers_vote else None,
                now_ms=now_ms,
                fetch_timeout_ms=self.fetch_timeout_ms,
            )
        else:
            voted = election.voted_id if self.is_voter or self.observers_vote else None
            state = self._unattached(election.epoch, voted, now_ms)
        self._durable_transition(state)

    # --- Transitions -----------------------------------------------------------------

    def transition_to_unattached(self, epoch: int, now_ms: int) -> UnattachedState:
        """A higher epoch without a known leader; or, within the epoch, a lost pre-vote
        (prospective) or, for an observer, a leader that went quiet."""
        current = self.state
        same_epoch_allowed = isinstance(current, ProspectiveState) or (
            self.is_observer
            and isinstance(current, FollowerState | UnattachedState | ResignedState)
        )
        if epoch < current.epoch or (epoch == current.epoch and not same_epoch_allowed):
            raise IllegalTransitionError(
                f"cannot become unattached in epoch {epoch} from {current}"
            )
        voted_id = leader_id = None
        if epoch == current.epoch and self.is_voter:
            # A lost pre-vote: keep the vote, and the memory of having led the epoch.
            voted_id = current.voted_id
            leader_id = current.leader_id if current.leader_id == self.local_id else None
        deadline = self._keep_election_deadline(current, now_ms)
        state = UnattachedState(
            epoch,
            self._tracker(),
            voted_id=voted_id,
            election_deadline_ms=None if self.is_observer else deadline,
            leader_id=leader_id,
        )
        self._durable_transition(state)
        return state

    def transition_to_unattached_voted(
        self, epoch: int, candidate_id: int, now_ms: int
    ) -> UnattachedState:
        """Grant a vote: the vote is persisted before the response leaves."""
        current = self.state
        self._check_can_vote(epoch, candidate_id)
        if epoch < current.epoch:
            raise IllegalTransitionError(f"cannot vote in epoch {epoch} from {current}")
        if epoch == current.epoch and not (
            isinstance(current, UnattachedState | ProspectiveState)
            and current.voted_id is None
            and current.leader_id is None
        ):
            raise IllegalTransitionError(
                f"cannot vote for {candidate_id} in epoch {epoch} from {current}"
            )
        state = UnattachedState(
            epoch,
            self._tracker(),
            voted_id=candidate_id,
            # The candidate has at least our chances: give it a full election timeout.
            election_deadline_ms=now_ms + self.random_election_timeout_ms(),
        )
        self._durable_transition(state)
        return state

    def transition_to_prospective(self, now_ms: int) -> ProspectiveState:
        """Start a pre-vote in the current epoch."""
        current = self.state
        if self.is_observer:
            raise IllegalTransitionError(f"observer {self.local_id} cannot become prospective")
        if isinstance(current, LeaderState | ProspectiveState):
            raise IllegalTransitionError(f"cannot become prospective from {current}")
        if isinstance(current, CandidateState) and not current.is_backing_off:
            raise IllegalTransitionError(f"cannot become prospective from {current} before backoff")
        retries = current.retries if isinstance(current, CandidateState) else 0
        # The epoch's leader, if known (ourselves when we led it): where to go back to.
        leader_id = current.leader_id
        state = ProspectiveState(
            current.epoch,
            self._tracker(),
            local_id=self.local_id,
            voters=self.voters,
            voted_id=current.voted_id,
            leader_id=leader_id,
            election_deadline_ms=now_ms + self.random_election_timeout_ms(),
            retries=retries,
        )
        self._durable_transition(state)
        return state

    def transition_to_candidate(self, now_ms: int) -> CandidateState:
        """A majority granted the pre-vote: bump the epoch and vote for ourselves."""
        current = self.state
        if not isinstance(current, ProspectiveState):
            raise IllegalTransitionError(f"cannot become candidate from {current}")
        if not current.pre_votes.is_granted:
            raise IllegalTransitionError("cannot become candidate without a majority of pre-votes")
        state = CandidateState(
            current.epoch + 1,
            self._tracker(),
            local_id=self.local_id,
            voters=self.voters,
            election_deadline_ms=now_ms + self.random_election_timeout_ms(),
            retries=current.retries + 1,
        )
        self._durable_transition(state)
        return state

    def transition_to_leader(self, epoch_start_offset: int, now_ms: int) -> LeaderState:
        """A majority voted for us. The high watermark starts unknown: it is only exposed
        again once a majority reaches the new epoch, so it never goes backwards."""
        current = self.state
        if not isinstance(current, CandidateState):
            raise IllegalTransitionError(f"cannot become leader from {current}")
        if not current.votes.is_granted:
            raise IllegalTransitionError("cannot become leader without a majority of votes")
        state = LeaderState(
            current.epoch,
            self._tracker(),
            local_id=self.local_id,
            voters=self.voters,
            epoch_start_offset=epoch_start_offset,
            now_ms=now_ms,
            fetch_timeout_ms=self.fetch_timeout_ms,
        )
        self._durable_transition(state)
        return state

    def transition_to_follower(self, epoch: int, leader_id: int, now_ms: int) -> FollowerState:
        """The leader of ``epoch`` is known: fetch from it."""
        current = self.state
        if leader_id == self.local_id:
            raise IllegalTransitionError(f"cannot follow ourselves in epoch {epoch}")
        if epoch < current.epoch:
            raise IllegalTransitionError(
                f"cannot follow {leader_id} in epoch {epoch} from {current}"
            )
        if epoch == current.epoch and (
            isinstance(current, LeaderState | ResignedState | FollowerState)
            or current.leader_id == self.local_id
        ):
            raise IllegalTransitionError(
                f"cannot follow {leader_id} in epoch {epoch} from {current}"
            )
        voted_id = current.voted_id if epoch == current.epoch and self.is_voter else None
        state = FollowerState(
            epoch,
            self._tracker(),
            leader_id=leader_id,
            voted_id=voted_id,
            now_ms=now_ms,
            fetch_timeout_ms=self.fetch_timeout_ms,
        )
        self._durable_transition(state)
        return state

    def transition_to_resigned(
        self, preferred_successors: Iterable[int], now_ms: int
    ) -> ResignedState:
        """Step down from leading the epoch (soft: nothing new to persist)."""
        current = self.state
        if not isinstance(current, LeaderState):
            raise IllegalTransitionError(f"cannot resign from {current}")
        self._state = ResignedState(
            current.epoch,
            self._tracker(),
            local_id=self.local_id,
            voters=self.voters,
            preferred_successors=tuple(preferred_successors),
            election_deadline_ms=now_ms + self.random_election_timeout_ms(),
        )
        return self._state

    # --- Internals -------------------------------------------------------------------

    def _tracker(self) -> RequestTracker:
        return RequestTracker(self.request_timeout_ms, self.retry_backoff_ms)

    def _unattached(self, epoch: int, voted_id: int | None, now_ms: int) -> UnattachedState:
        deadline = None if self.is_observer else now_ms + self.random_election_timeout_ms()
        return UnattachedState(
            epoch, self._tracker(), voted_id=voted_id, election_deadline_ms=deadline
        )

    def _keep_election_deadline(self, current: EpochState, now_ms: int) -> int:
        """A replica already waiting for an election keeps its timer; others start one."""
        if isinstance(current, UnattachedState | ProspectiveState) and current.election_deadline_ms:
            return current.election_deadline_ms
        if isinstance(current, CandidateState) and not current.is_backing_off:
            return current.election_deadline_ms
        return now_ms + self.random_election_timeout_ms()

    def _check_can_vote(self, epoch: int, candidate_id: int) -> None:
        if self.is_observer and not self.observers_vote:
            raise IllegalTransitionError(f"observer {self.local_id} cannot vote")
        if candidate_id == self.local_id:
            raise IllegalTransitionError("a vote for ourselves is a candidacy")

    def _durable_transition(self, state: EpochState) -> None:
        election = state.election()
        if self.is_observer and not self.observers_vote:
            election = ElectionState(election.epoch, None, election.leader_id)
        if election != self._persisted:
            self._persisted = election
            self._unpersisted = election
        self._state = state
