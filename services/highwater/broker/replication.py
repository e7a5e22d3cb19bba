"""The replication state of one partition, pure: log end offsets, high watermark, ISR, epochs.

Events in, decisions out: no I/O, no asyncio, no clock (time comes in as ``now_ms``). The
broker drives it from its produce, fetch and metadata paths and carries out what it
returns (answer a produce, send an ``AlterPartition``, truncate the log). The rules are
Kafka's (``Partition.scala``, ``Replica.scala``, ``AbstractFetcherThread.scala``):

Leader (:class:`LeaderReplicationState`)

* Each follower's progress is what its fetches say: a fetch from offset ``o`` means the
  follower's log ends at ``o`` (its LEO). ``last_caught_up_time_ms`` follows Kafka's
  ``Replica.updateFetchStateOrThrow``: a fetch at or past the leader's LEO (as of that
  read) makes the follower caught up *now*; a fetch that reached the leader's LEO as of
  the follower's *previous* fetch makes it caught up *at the previous fetch's time*;
  otherwise the time stays. A follower is caught up (``ReplicaState.isCaughtUp``) when
  its LEO equals the leader's or it was caught up within ``replica.lag.time.max.ms``.
* The high watermark (``maybeIncrementLeaderHW``) is the smallest LEO among the leader,
  the members of the *maximal* ISR, and the followers outside it that are caught up and
  eligible to join it (so that a follower catching up is not outrun by the HW forever).
  A follower whose LEO is unknown (no fetch in this leadership yet) holds it where it
  is. It only moves forward, and (KIP-966's strict min ISR, Kafka 3.7+) not at all while
  the committed ISR is smaller than the effective ``min.insync.replicas``
  (``min(min.insync.replicas, replication factor)``). It is recomputed on the events
  Kafka's is (an append, a follower fetch that can move it, a committed ISR change, a
  leadership change), and also when eligibility or ``min.insync.replicas`` changes
  (:meth:`LeaderReplicationState.update_min_insync_replicas` says why).
* ISR changes are proposals (:class:`AlterPartitionProposal`) to the controller; only the
  committed change (:meth:`LeaderReplicationState.apply_partition_change`, from the
  AlterPartition answer or the metadata log) changes the ISR. One proposal at a time
  (KIP-497): while one is pending no other is made, and the *maximal ISR* is

  - pending expansion: committed ISR + the joining follower (``PendingExpandIsr``): the
    HW already waits for it, which is safe whatever the controller decides;
  - pending shrink: the committed ISR itself (``PendingShrinkIsr``): the HW keeps
    waiting for the leaving followers until the controller confirms.

  The maximal ISR is what the HW and the acks=all completion check use; the check
  *before* an acks=all append (``NOT_ENOUGH_REPLICAS``) uses the committed ISR, as in
  ``Partition.appendRecordsToLeader``.
* Shrink (``getOutOfSyncReplicas``): the committed ISR members other than the leader that
  are not caught up (or have no progress at all). The leader is never removed.
* Expand (``isFollowerInSync``): a follower outside the committed ISR, eligible (not
  fenced or shutting down, see :meth:`LeaderReplicationState.update_ineligible_replicas`),
  whose LEO reached the high watermark *and* the start offset of the current leader epoch.
* acks=all (``checkEnoughReplicasReachOffset``): a produce waiting for ``required_offset``
  (the LEO right after its append) completes once the HW reached it, with
  ``NOT_ENOUGH_REPLICAS_AFTER_APPEND`` when the maximal ISR is by then smaller than the
  effective min ISR.
* A new leader epoch while still leader resets the followers' timers (``resetReplicaState``)
  and moves the epoch start offset to the current LEO. A change with an older partition
  epoch (or leader epoch) is stale and ignored.

Follower (:class:`FollowerReplicationState`)

* HW = min(local LEO, leader's HW). Deviation from Kafka: Kafka's follower takes the
  leader's HW as it comes (bounded by its LEO), so it can go down when a new leader's HW
  still lags; here it only goes down when the log is truncated below it. Every offset
  below a HW some leader announced was committed, and committed records survive leader
  changes (clean elections, epoch truncation), so keeping the larger value is safe.
* Truncation after a leader change never uses the HW (the first story of the seed: a
  restarted follower cutting its log at its stale HW loses an acknowledged record). It
  uses the leader's answer for the follower's latest epoch (``OffsetsForLeaderEpoch``,
  KIP-101/KIP-279) or the diverging epoch of a fetch answer (KIP-320); see
  :func:`truncation_offset` and :func:`find_diverging_epoch`.

Errors: fetch validation raises typed exceptions (:class:`FencedLeaderEpochError`,
:class:`UnknownLeaderEpochError`, :class:`UnknownReplicaError`, defined here because
``highwater.errors`` has none for them, and ``OffsetOutOfRangeError``); the produce checks
return ``ErrorCode`` values, which go straight into per-partition replies. A call that
breaks the caller's own contract (a leader LEO going backwards...) raises ``ValueError``.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Final, NamedTuple

from highwater.errors import HighwaterError, OffsetOutOfRangeError
from highwater.storage.leader_epoch import UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
from highwater.v1.common_pb2 import ErrorCode

__all__ = [
    "DEFAULT_MIN_INSYNC_REPLICAS",
    "DEFAULT_REPLICA_LAG_TIME_MAX_MS",
    "AlterPartitionProposal",
    "EpochEndOffset",
    "EpochEndOffsetLookup",
    "FencedLeaderEpochError",
    "FollowerFetchOutcome",
    "FollowerReplicationState",
    "IsrChange",
    "LeaderReplicationState",
    "PartitionChangeOutcome",
    "ProduceCompletion",
    "ReplicaProgress",
    "TruncationDecision",
    "UnknownLeaderEpochError",
    "UnknownReplicaError",
    "find_diverging_epoch",
    "truncation_offset",
]

DEFAULT_REPLICA_LAG_TIME_MAX_MS: Final = 30_000
"""Kafka's default ``replica.lag.time.max.ms``."""
DEFAULT_MIN_INSYNC_REPLICAS: Final = 1
"""Kafka's default ``min.insync.replicas``."""

EpochEndOffsetLookup = Callable[[int], tuple[int, int]]
"""``epoch -> (epoch, end offset)`` over a local log, as ``LeaderEpochCache.end_offset_for``
with the log end offset bound: the largest epoch ``<=`` the one asked for and where it
ends, ``(UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET)`` when there is none."""

# AlterPartition errors after which the proposal is dropped: the controller says it did
# not apply it and the partition epoch we hold is current (Kafka's OPERATION_NOT_ATTEMPTED
# has no code in common.proto).
_NONE: Final = ErrorCode.NONE  # an enum attribute is a method call: looked up once
_ALTER_PARTITION_REJECTED: Final = frozenset({ErrorCode.INELIGIBLE_REPLICA})
# AlterPartition errors after which the proposal stays pending until the metadata log
# brings the partition's state (handleAlterPartitionError: no retry, no reset).
_ALTER_PARTITION_AWAIT_METADATA: Final = frozenset(
    {
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ErrorCode.UNKNOWN_TOPIC_ID,
        ErrorCode.FENCED_LEADER_EPOCH,
        ErrorCode.INVALID_UPDATE_VERSION,
        ErrorCode.INVALID_REQUEST,
        ErrorCode.NEW_LEADER_ELECTED,
    }
)


# --- Errors ----------------------------------------------------------------------------


class FencedLeaderEpochError(HighwaterError):
    """A request naming a leader epoch older than this replica's: the requester is behind."""

    code = ErrorCode.FENCED_LEADER_EPOCH


class UnknownLeaderEpochError(HighwaterError):
    """A request naming a leader epoch newer than this replica's: this replica is behind."""

    code = ErrorCode.UNKNOWN_LEADER_EPOCH


class UnknownReplicaError(HighwaterError):
    """A follower fetch from a broker that is not a follower of the partition.

    Answered with ``UNKNOWN_LEADER_EPOCH``, as Kafka (``Partition.followerReplicaOrThrow``):
    the pair (replica, epoch) is not known yet (a reassignment adding it may not have
    reached this leader), so the fetcher retries rather than giving up.
    """

    code = ErrorCode.UNKNOWN_LEADER_EPOCH


# --- Values ----------------------------------------------------------------------------


class IsrChange(enum.Enum):
    """The direction of a pending ISR change."""

    EXPAND = "expand"
    SHRINK = "shrink"


@dataclass(frozen=True, slots=True)
class AlterPartitionProposal:
    """An ISR change the leader asks the controller for: one ``AlterPartition`` item.

    ``leader_epoch`` and ``partition_epoch`` are the ones the change is based on (the
    controller refuses it if either is stale); ``replicas_changed`` are the followers
    joining (``EXPAND``) or leaving (``SHRINK``) the ISR.
    """

    change: IsrChange
    new_isr: tuple[int, ...]
    leader_epoch: int
    partition_epoch: int
    replicas_changed: frozenset[int]


@dataclass(frozen=True, slots=True)
class ReplicaProgress:
    """What the leader knows of one follower, from its fetches (Kafka's ``ReplicaState``).

    ``None`` is "unknown": no fetch yet in this leadership (Kafka's -1 and 0 sentinels).
    """

    replica_id: int
    log_end_offset: int | None = None
    last_fetch_time_ms: int | None = None
    last_fetch_leader_log_end_offset: int | None = None
    last_caught_up_time_ms: int | None = None

    def is_caught_up(
        self, leader_log_end_offset: int, now_ms: int, replica_lag_time_max_ms: int
    ) -> bool:
        """Whether the follower has the leader's whole log, or had it within the lag time."""
        if self.log_end_offset == leader_log_end_offset:
            return True
        return (
            self.last_caught_up_time_ms is not None
            and now_ms - self.last_caught_up_time_ms <= replica_lag_time_max_ms
        )

    def after_fetch(
        self, fetch_offset: int, now_ms: int, leader_log_end_offset: int
    ) -> ReplicaProgress:
        """The progress after a fetch from ``fetch_offset`` while the leader's log ended at
        ``leader_log_end_offset``: Kafka's last-caught-up-time rule."""
        caught_up = self.last_caught_up_time_ms
        if fetch_offset >= leader_log_end_offset:
            caught_up = now_ms if caught_up is None else max(caught_up, now_ms)
        elif (
            self.last_fetch_leader_log_end_offset is not None
            and self.last_fetch_time_ms is not None
            and fetch_offset >= self.last_fetch_leader_log_end_offset
        ):
            # It now has what the leader had when it last fetched: it was caught up then.
            previous = self.last_fetch_time_ms
            caught_up = previous if caught_up is None else max(caught_up, previous)
        previous_leader_end = self.last_fetch_leader_log_end_offset
        return ReplicaProgress(
            replica_id=self.replica_id,
            log_end_offset=fetch_offset,
            last_fetch_time_ms=now_ms,
            last_fetch_leader_log_end_offset=(
                leader_log_end_offset
                if previous_leader_end is None
                else max(leader_log_end_offset, previous_leader_end)
            ),
            last_caught_up_time_ms=caught_up,
        )


class FollowerFetchOutcome(NamedTuple):
    """What a follower fetch changed: the HW moved; an ISR expansion to send."""

    high_watermark_moved: bool
    proposal: AlterPartitionProposal | None


class PartitionChangeOutcome(NamedTuple):
    """Whether a committed partition change was applied (not stale) and moved the HW."""

    applied: bool
    high_watermark_moved: bool


class ProduceCompletion(NamedTuple):
    """An acks=all produce: ``completed`` when the HW reached its offset; ``error`` is an
    ``ErrorCode`` (``NONE`` or ``NOT_ENOUGH_REPLICAS_AFTER_APPEND``)."""

    completed: bool
    error: int


class EpochEndOffset(NamedTuple):
    """A leader epoch and the offset where it ends (the ``EpochEndOffset`` of the protos)."""

    epoch: int
    end_offset: int


class TruncationDecision(NamedTuple):
    """Where a follower truncates its log. ``completed`` is False when it must ask again
    (KIP-279: the leader named an epoch the follower does not have)."""

    offset: int
    completed: bool


# --- Leader ----------------------------------------------------------------------------


class LeaderReplicationState:
    """The leader's view of one partition: its LEO and HW, the followers' progress, the ISR.

    Built when the local broker becomes leader (a new leader epoch): the followers'
    LEOs are unknown until they fetch, the ISR members count as caught up at ``now_ms``
    (the others never were), and the epoch starts at ``log_end_offset``.
    ``high_watermark`` is the one the log holds (checkpointed, or the follower HW it had);
    it never goes backwards.
    """

    def __init__(
        self,
        local_broker_id: int,
        replicas: Iterable[int],
        isr: Iterable[int],
        leader_epoch: int,
        partition_epoch: int,
        log_end_offset: int,
        high_watermark: int,
        now_ms: int,
        *,
        replica_lag_time_max_ms: int = DEFAULT_REPLICA_LAG_TIME_MAX_MS,
        min_insync_replicas: int = DEFAULT_MIN_INSYNC_REPLICAS,
    ) -> None:
        replicas = tuple(replicas)
        if local_broker_id not in replicas:
            raise ValueError(f"the leader {local_broker_id} is not a replica: {list(replicas)}")
        if len(set(replicas)) != len(replicas):
            raise ValueError(f"duplicate replicas: {list(replicas)}")
        if not 0 <= high_watermark <= log_end_offset:
            raise ValueError(
                f"high watermark {high_watermark} outside [0, log end offset {log_end_offset}]"
            )
        if replica_lag_time_max_ms <= 0:
            raise ValueError(f"replica_lag_time_max_ms must be > 0: {replica_lag_time_max_ms}")
        if min_insync_replicas < 1:
            raise ValueError(f"min_insync_replicas must be >= 1: {min_insync_replicas}")
        self._local_broker_id = local_broker_id
        self._replicas = replicas
        self._isr = self._ordered(isr)
        self._pending: AlterPartitionProposal | None = None
        self._leader_epoch = leader_epoch
        self._partition_epoch = partition_epoch
        self._log_end_offset = log_end_offset
        self._high_watermark = high_watermark
        self._leader_epoch_start_offset = log_end_offset
        self._replica_lag_time_max_ms = replica_lag_time_max_ms
        self._min_insync_replicas = min_insync_replicas
        self._ineligible: frozenset[int] = frozenset()
        self._followers: dict[int, ReplicaProgress] = {
            replica_id: ReplicaProgress(
                replica_id,
                last_caught_up_time_ms=now_ms if replica_id in self._isr else None,
            )
            for replica_id in replicas
            if replica_id != local_broker_id
        }
        self._maybe_increment_high_watermark(now_ms)

    # --- Reads -------------------------------------------------------------------------

    @property
    def local_broker_id(self) -> int:
        """The leader's broker id."""
        return self._local_broker_id

    @property
    def replicas(self) -> tuple[int, ...]:
        """The assigned replicas, the leader included."""
        return self._replicas

    @property
    def isr(self) -> tuple[int, ...]:
        """The committed ISR: the last one the controller accepted."""
        return self._isr

    @property
    def maximal_isr(self) -> tuple[int, ...]:
        """The committed ISR plus a pending expansion's follower (KIP-497): what the HW and
        acks=all wait for. A pending shrink leaves it equal to the committed ISR."""
        pending = self._pending
        if pending is None or pending.change is IsrChange.SHRINK:
            return self._isr
        return self._ordered((*self._isr, *pending.replicas_changed))

    @property
    def pending_proposal(self) -> AlterPartitionProposal | None:
        """The ISR change sent to the controller and not settled yet, if any."""
        return self._pending

    @property
    def leader_epoch(self) -> int:
        """The current leader epoch."""
        return self._leader_epoch

    @property
    def partition_epoch(self) -> int:
        """The partition epoch of the last committed change applied."""
        return self._partition_epoch

    @property
    def leader_epoch_start_offset(self) -> int:
        """Where the current leader epoch starts: the leader's LEO when the epoch began. The
        broker records ``(leader_epoch, leader_epoch_start_offset)`` in its epoch cache."""
        return self._leader_epoch_start_offset

    @property
    def log_end_offset(self) -> int:
        """The leader's log end offset."""
        return self._log_end_offset

    @property
    def high_watermark(self) -> int:
        """The high watermark: consumers read below it; it never goes backwards."""
        return self._high_watermark

    @property
    def replica_lag_time_max_ms(self) -> int:
        """``replica.lag.time.max.ms``."""
        return self._replica_lag_time_max_ms

    @property
    def min_insync_replicas(self) -> int:
        """``min.insync.replicas`` as configured."""
        return self._min_insync_replicas

    @property
    def effective_min_isr(self) -> int:
        """``min(min.insync.replicas, replication factor)``, as Kafka's ``effectiveMinIsr``."""
        return min(self._min_insync_replicas, len(self._replicas))

    @property
    def is_under_min_isr(self) -> bool:
        """Whether the committed ISR is smaller than the effective min ISR."""
        return len(self._isr) < self.effective_min_isr

    @property
    def ineligible_replicas(self) -> frozenset[int]:
        """Followers that may not join the ISR (fenced or shutting down brokers)."""
        return self._ineligible

    @property
    def followers(self) -> Mapping[int, ReplicaProgress]:
        """Every follower's progress, by replica id (a copy)."""
        return dict(self._followers)

    def replica(self, replica_id: int) -> ReplicaProgress:
        """One follower's progress; :class:`UnknownReplicaError` if it is not a follower."""
        progress = self._followers.get(replica_id)
        if progress is None:
            raise UnknownReplicaError(
                f"broker {replica_id} is not a follower of this partition "
                f"(replicas {list(self._replicas)}, leader {self._local_broker_id})"
            )
        return progress

    # --- Events ------------------------------------------------------------------------

    def on_append(self, log_end_offset: int, now_ms: int) -> bool:
        """The leader appended locally and its log now ends at ``log_end_offset``.

        True if the HW moved (with an ISR of the leader alone it follows the LEO).
        ``ValueError`` if the LEO went backwards: a leader never truncates its own log.
        """
        if log_end_offset < self._log_end_offset:
            raise ValueError(
                f"leader log end offset went back from {self._log_end_offset} to {log_end_offset}"
            )
        self._log_end_offset = log_end_offset
        return self._maybe_increment_high_watermark(now_ms)

    def on_follower_fetch(
        self,
        replica_id: int,
        fetch_offset: int,
        now_ms: int,
        leader_log_end_offset: int | None = None,
        *,
        current_leader_epoch: int | None = None,
    ) -> FollowerFetchOutcome:
        """A follower fetched from ``fetch_offset``, which is its log end offset.

        ``leader_log_end_offset`` is the leader's LEO when the fetch read the log (the
        current one by default; Kafka takes it before the read, so that appends racing
        the fetch do not keep a follower from counting as caught up).
        ``current_leader_epoch`` is the epoch the follower names, if any.

        Call it only for fetches that read records: one answered with a diverging epoch
        (:func:`find_diverging_epoch`) does not tell the follower's LEO.

        Raises :class:`FencedLeaderEpochError` / :class:`UnknownLeaderEpochError` for a
        ``current_leader_epoch`` older / newer than the leader's, :class:`UnknownReplicaError`
        for a broker that is not a follower, ``OffsetOutOfRangeError`` for a fetch offset
        past the leader's LEO or negative; nothing changes then.

        Updates the follower's progress, then may propose adding it to the ISR (the
        proposal becomes pending at once, so the HW waits for it from now on), then
        recomputes the HW if the fetch can have moved it: when the follower's LEO changed
        (Kafka's ``Partition.updateFollowerFetchState`` recomputes only then), or whenever
        some assigned replica is outside the committed ISR or an ISR change is pending.
        While the whole assignment is in the ISR, the HW is the minimum of the ISR's LEOs
        and moves only with one of them (this fetch's, an append's), an ISR change or a
        ``min.insync.replicas`` change, each of which recomputes it; a fetch at the same
        LEO (the read that an append wakes, every idle long poll) cannot move it. Outside
        that, time can: a caught-up follower outside the ISR stops holding the HW once it
        has not been caught up for ``replica.lag.time.max.ms``, and a refused expansion
        no longer holds it, so every fetch recomputes, as before.
        """
        self._check_leader_epoch(current_leader_epoch)
        progress = self.replica(replica_id)
        if leader_log_end_offset is None:
            leader_log_end_offset = self._log_end_offset
        elif leader_log_end_offset > self._log_end_offset:
            raise ValueError(
                f"leader log end offset {leader_log_end_offset} is past the one recorded "
                f"({self._log_end_offset}): call on_append first"
            )
        if not 0 <= fetch_offset <= leader_log_end_offset:
            raise OffsetOutOfRangeError(
                f"fetch offset {fetch_offset} of replica {replica_id} outside "
                f"[0, {leader_log_end_offset}]"
            )
        self._followers[replica_id] = progress.after_fetch(
            fetch_offset, now_ms, leader_log_end_offset
        )
        proposal = self._maybe_expand_isr(replica_id)
        if (
            progress.log_end_offset == fetch_offset
            and self._pending is None
            and len(self._isr) == len(self._replicas)
        ):
            return FollowerFetchOutcome(False, proposal)
        moved = self._maybe_increment_high_watermark(now_ms)
        return FollowerFetchOutcome(moved, proposal)

    def on_follower_session_fetch(
        self, replica_id: int, fetch_offset: int, fetched_at_ms: int, leader_log_end_offset: int
    ) -> None:
        """A follower's incremental fetch at ``fetched_at_ms`` left this partition out: it
        still fetches from ``fetch_offset``, as last named, while the leader's log ended at
        ``leader_log_end_offset`` (KIP-227 between brokers).

        Kafka's leader reads every partition of a session at every fetch, so each one
        updates the follower's progress (``updateFollowerFetchState``); here an idle
        partition is not read, and the broker applies the fetches it skipped when the
        partition changes, before the change counts: a follower that had the leader's whole
        log then was caught up at its session's last fetch, not only at the last fetch that
        named the partition (else the first append after a quiet spell longer than
        ``replica.lag.time.max.ms`` would find every follower out of sync). Nothing else
        moves: the follower's LEO is the same, so the HW and the ISR are as they were.
        Unknown followers, another LEO or an older time: no change.
        """
        progress = self._followers.get(replica_id)
        if progress is None or progress.log_end_offset != fetch_offset:
            return
        if progress.last_fetch_time_ms is not None and fetched_at_ms <= progress.last_fetch_time_ms:
            return
        if fetch_offset > leader_log_end_offset:
            return
        self._followers[replica_id] = progress.after_fetch(
            fetch_offset, fetched_at_ms, leader_log_end_offset
        )

    def out_of_sync_replicas(self, now_ms: int) -> frozenset[int]:
        """ISR members that are not caught up (Kafka's ``getOutOfSyncReplicas``).

        Every committed ISR member but the leader that has no progress or is not caught
        up: its LEO is not the leader's and it was last caught up more than
        ``replica.lag.time.max.ms`` ago (stuck or slow). Empty while a proposal is pending.
        """
        if self._pending is not None:
            return frozenset()
        out = set()
        for replica_id in self._isr:
            if replica_id == self._local_broker_id:
                continue
            progress = self._followers.get(replica_id)
            if progress is None or not progress.is_caught_up(
                self._log_end_offset, now_ms, self._replica_lag_time_max_ms
            ):
                out.add(replica_id)
        return frozenset(out)

    def maybe_shrink_isr(self, now_ms: int) -> AlterPartitionProposal | None:
        """Propose removing the out-of-sync followers from the ISR, or None.

        The proposal becomes pending; the ISR itself changes only when the controller's
        answer (or the metadata log) brings it to :meth:`apply_partition_change`. Until
        then the HW keeps waiting for the followers being removed.
        """
        out = self.out_of_sync_replicas(now_ms)
        if not out:
            return None
        self._pending = AlterPartitionProposal(
            IsrChange.SHRINK,
            tuple(r for r in self._isr if r not in out),
            self._leader_epoch,
            self._partition_epoch,
            out,
        )
        return self._pending

    def apply_partition_change(
        self,
        isr: Iterable[int],
        leader_epoch: int,
        partition_epoch: int,
        now_ms: int,
        *,
        replicas: Iterable[int] | None = None,
    ) -> PartitionChangeOutcome:
        """A committed partition state (AlterPartition answer or metadata log) arrives.

        A partition epoch or leader epoch older than the current one is stale: ignored
        (``applied`` False). Otherwise the ISR becomes ``isr`` and a pending proposal is
        settled, whatever it was (Kafka moves to ``CommittedPartitionState``; an answer to
        a proposal arriving after this is stale). A newer leader epoch (the local broker
        re-elected) restarts the epoch at the current LEO and resets the followers' timers
        as Kafka's ``resetReplicaState``: ISR members caught up and last fetched at
        ``now_ms``, the others never. ``replicas``, when given, is the new assignment
        (reassignment): followers added start unknown, those removed are forgotten.

        Only changes that keep the local broker leader belong here: when another broker
        leads, the caller drops this state and builds a :class:`FollowerReplicationState`.
        """
        if partition_epoch < self._partition_epoch or leader_epoch < self._leader_epoch:
            return PartitionChangeOutcome(False, False)
        if replicas is not None:
            new_replicas = tuple(replicas)
            if self._local_broker_id not in new_replicas:
                raise ValueError(
                    f"the leader {self._local_broker_id} is not in the new replicas "
                    f"{list(new_replicas)}"
                )
            self._replicas = new_replicas
            self._followers = {
                r: self._followers.get(r, ReplicaProgress(r))
                for r in new_replicas
                if r != self._local_broker_id
            }
        self._isr = self._ordered(isr)
        self._pending = None
        self._partition_epoch = partition_epoch
        if leader_epoch > self._leader_epoch:
            self._leader_epoch = leader_epoch
            self._leader_epoch_start_offset = self._log_end_offset
            for replica_id, progress in self._followers.items():
                in_sync = replica_id in self._isr
                self._followers[replica_id] = replace(
                    progress,
                    last_fetch_leader_log_end_offset=self._log_end_offset,
                    last_fetch_time_ms=now_ms if in_sync else None,
                    last_caught_up_time_ms=now_ms if in_sync else None,
                )
        return PartitionChangeOutcome(True, self._maybe_increment_high_watermark(now_ms))

    def on_alter_partition_error(
        self, proposal: AlterPartitionProposal, error: int
    ) -> AlterPartitionProposal | None:
        """The controller refused ``proposal`` with ``error``; returns it if it is to be sent
        again (Kafka's ``handleAlterPartitionError``).

        * ``proposal`` is no longer the pending one (settled by a partition change since):
          ignored, None.
        * ``INELIGIBLE_REPLICA``: the controller did not apply it and our partition epoch
          is current, so the proposal is dropped; a later fetch may propose again. None.
        * ``UNKNOWN_TOPIC_OR_PARTITION``, ``UNKNOWN_TOPIC_ID``, ``FENCED_LEADER_EPOCH``,
          ``INVALID_UPDATE_VERSION``, ``INVALID_REQUEST``, ``NEW_LEADER_ELECTED``: our state
          is out of date; the proposal stays pending (no other is made) until the metadata
          log brings the partition's state. None.
        * anything else (``NOT_CONTROLLER``, timeouts...): send it again, the proposal.
        """
        if self._pending is None or self._pending != proposal:
            return None
        if error in _ALTER_PARTITION_REJECTED:
            self._pending = None
            return None
        if error in _ALTER_PARTITION_AWAIT_METADATA:
            return None
        return proposal

    def update_ineligible_replicas(self, replica_ids: Iterable[int], now_ms: int) -> bool:
        """The followers that may not join the ISR now (fenced, in controlled shutdown),
        from the metadata image; True if the HW moved (an ineligible follower outside the
        ISR no longer holds it back)."""
        self._ineligible = frozenset(replica_ids)
        return self._maybe_increment_high_watermark(now_ms)

    def update_min_insync_replicas(self, min_insync_replicas: int, now_ms: int) -> bool:
        """The topic's ``min.insync.replicas`` changed (an image altered the topic or the
        cluster default): it applies from now on, as Kafka's leader reads its log config at
        each check. The next acks=all append is checked against it, and so is a produce
        already waiting when it completes (:meth:`can_complete_produce`).

        The HW is recomputed at once; True if it moved (a HW that the strict min ISR held
        moves under a lower value). Kafka's waits for the next append, follower fetch, ISR
        or leadership change; here a follower's fetch at an unchanged LEO does not
        recompute it (:meth:`on_follower_fetch`), so the change does, lest an idle
        partition's HW wait for the next append. ``ValueError`` below 1."""
        if min_insync_replicas < 1:
            raise ValueError(f"min_insync_replicas must be >= 1: {min_insync_replicas}")
        self._min_insync_replicas = min_insync_replicas
        return self._maybe_increment_high_watermark(now_ms)

    # --- Produce -----------------------------------------------------------------------

    def check_min_isr(self) -> int:
        """Before an acks=all append: ``NOT_ENOUGH_REPLICAS`` if the committed ISR is smaller
        than the effective min ISR (nothing is appended then), else ``NONE``. Produces with
        acks 0 or 1 do not ask."""
        return ErrorCode.NOT_ENOUGH_REPLICAS if self.is_under_min_isr else _NONE

    def can_complete_produce(self, required_offset: int) -> ProduceCompletion:
        """Whether an acks=all produce whose records end before ``required_offset`` (the
        LEO right after its append) can be answered.

        Not before the HW reached ``required_offset``. Then with ``NONE``, or with
        ``NOT_ENOUGH_REPLICAS_AFTER_APPEND`` when the maximal ISR shrank below the effective
        min ISR while the produce waited (the records are in the log but fewer replicas
        than required hold them).
        """
        if self._high_watermark < required_offset:
            return ProduceCompletion(False, _NONE)
        if len(self.maximal_isr) < self.effective_min_isr:
            return ProduceCompletion(True, ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND)
        return ProduceCompletion(True, _NONE)

    # --- Internals ---------------------------------------------------------------------

    def _check_leader_epoch(self, current_leader_epoch: int | None) -> None:
        if current_leader_epoch is None or current_leader_epoch < 0:
            return
        if current_leader_epoch < self._leader_epoch:
            raise FencedLeaderEpochError(
                f"leader epoch {current_leader_epoch} is older than {self._leader_epoch}"
            )
        if current_leader_epoch > self._leader_epoch:
            raise UnknownLeaderEpochError(
                f"leader epoch {current_leader_epoch} is newer than {self._leader_epoch}"
            )

    def _ordered(self, ids: Iterable[int]) -> tuple[int, ...]:
        """``ids`` without duplicates, in assignment order (unknown ids last, by id)."""
        position = {r: i for i, r in enumerate(self._replicas)}
        unique = set(ids)
        return tuple(sorted(unique, key=lambda r: (position.get(r, len(position)), r)))

    def _maybe_expand_isr(self, replica_id: int) -> AlterPartitionProposal | None:
        if self._pending is not None:
            return None
        if replica_id in self._isr or replica_id in self._ineligible:
            return None
        leo = self._followers[replica_id].log_end_offset
        if leo is None or leo < self._high_watermark or leo < self._leader_epoch_start_offset:
            return None
        self._pending = AlterPartitionProposal(
            IsrChange.EXPAND,
            self._ordered((*self._isr, replica_id)),
            self._leader_epoch,
            self._partition_epoch,
            frozenset({replica_id}),
        )
        return self._pending

    def _maybe_increment_high_watermark(self, now_ms: int) -> bool:
        """The HW rule, the one place it lives (Kafka's ``maybeIncrementLeaderHW``): the
        minimum LEO of the leader and of every follower in the maximal ISR or caught up and
        eligible, unless the committed ISR is under the effective min ISR; it only moves
        forward. True if it moved. Every event that can change its inputs calls it: an
        append, a follower fetch that can move it (:meth:`on_follower_fetch`), a partition
        change, an eligibility or ``min.insync.replicas`` change."""
        candidate = self._log_end_offset
        if candidate <= self._high_watermark:
            return False  # at the log end already (every idle follower's fetch): no scan
        if self.is_under_min_isr:
            return False
        maximal = frozenset(self.maximal_isr)
        for replica_id, progress in self._followers.items():
            waits = replica_id in maximal or (
                replica_id not in self._ineligible
                and progress.is_caught_up(
                    self._log_end_offset, now_ms, self._replica_lag_time_max_ms
                )
            )
            if not waits:
                continue
            if progress.log_end_offset is None:
                return False
            candidate = min(candidate, progress.log_end_offset)
        if candidate <= self._high_watermark:
            return False
        self._high_watermark = candidate
        return True


# --- Follower --------------------------------------------------------------------------


class FollowerReplicationState:
    """A follower's view of one partition: its leader and epoch, its LEO and HW.

    ``high_watermark`` is capped at ``log_end_offset`` (a checkpointed HW past a log tail
    lost in a crash, as Kafka's ``updateHighWatermark`` bounds it).
    """

    def __init__(
        self,
        local_broker_id: int,
        leader_id: int,
        leader_epoch: int,
        log_end_offset: int,
        high_watermark: int,
    ) -> None:
        if log_end_offset < 0 or high_watermark < 0:
            raise ValueError(f"negative offsets: LEO {log_end_offset}, HW {high_watermark}")
        if leader_id == local_broker_id:
            raise ValueError(f"broker {local_broker_id} cannot follow itself")
        self._local_broker_id = local_broker_id
        self._leader_id = leader_id
        self._leader_epoch = leader_epoch
        self._log_end_offset = log_end_offset
        self._high_watermark = min(high_watermark, log_end_offset)

    @property
    def local_broker_id(self) -> int:
        """The follower's broker id."""
        return self._local_broker_id

    @property
    def leader_id(self) -> int:
        """The broker this follower fetches from."""
        return self._leader_id

    @property
    def leader_epoch(self) -> int:
        """The leader epoch this follower fetches in."""
        return self._leader_epoch

    @property
    def log_end_offset(self) -> int:
        """The follower's log end offset."""
        return self._log_end_offset

    @property
    def high_watermark(self) -> int:
        """The follower's high watermark: min(its LEO, the leader's HW), never backwards
        but for a truncation below it."""
        return self._high_watermark

    def on_leader_change(self, leader_id: int, leader_epoch: int) -> bool:
        """A new leader or epoch from the metadata log; True if the fetcher must restart
        (the epoch grew). An older epoch is stale and ignored, as is the same epoch again.

        After a restart the follower checks its log against the new leader's before
        fetching on (:meth:`on_diverging_epoch`), never by its HW.
        """
        if leader_epoch <= self._leader_epoch:
            return False
        if leader_id == self._local_broker_id:
            raise ValueError(
                f"broker {leader_id} leads epoch {leader_epoch}: build a LeaderReplicationState"
            )
        self._leader_id = leader_id
        self._leader_epoch = leader_epoch
        return True

    def on_fetch_response(self, leader_high_watermark: int, local_log_end_offset: int) -> bool:
        """A fetch answer was appended: the log now ends at ``local_log_end_offset`` and the
        leader's HW was ``leader_high_watermark``. True if the follower's HW moved.

        HW = min(LEO, leader's HW), kept if that is lower (a new leader whose HW lags).
        ``ValueError`` if the LEO went backwards: truncations go through
        :meth:`on_diverging_epoch` or :meth:`on_truncated`.
        """
        if local_log_end_offset < self._log_end_offset:
            raise ValueError(
                f"log end offset went back from {self._log_end_offset} to "
                f"{local_log_end_offset} without a truncation"
            )
        self._log_end_offset = local_log_end_offset
        candidate = min(local_log_end_offset, leader_high_watermark)
        if candidate <= self._high_watermark:
            return False
        self._high_watermark = candidate
        return True

    def on_diverging_epoch(
        self, leader_epoch_end: EpochEndOffset, local_end_offset_for: EpochEndOffsetLookup
    ) -> TruncationDecision:
        """The leader's end of an epoch arrived: the diverging epoch of a fetch answer
        (KIP-320) or the answer to ``OffsetsForLeaderEpoch`` for the follower's latest epoch.

        Returns :func:`truncation_offset`'s decision, which the broker carries out on the
        log (and on its epoch cache) before fetching from ``decision.offset``; the state's
        LEO becomes that offset, its HW is capped there.
        """
        decision = truncation_offset(leader_epoch_end, self._log_end_offset, local_end_offset_for)
        self.on_truncated(decision.offset)
        return decision

    def on_truncated(self, log_end_offset: int) -> None:
        """The log was truncated to ``log_end_offset`` (for any reason): the LEO becomes it
        and the HW is capped there, the one way the follower's HW goes backwards. A
        ``log_end_offset`` at or past the current LEO changes nothing."""
        if log_end_offset < 0:
            raise ValueError(f"negative truncation offset {log_end_offset}")
        if log_end_offset >= self._log_end_offset:
            return
        self._log_end_offset = log_end_offset
        self._high_watermark = min(self._high_watermark, log_end_offset)


# --- Epoch-based truncation ------------------------------------------------------------


def truncation_offset(
    leader_epoch_end: EpochEndOffset,
    local_log_end_offset: int,
    local_end_offset_for: EpochEndOffsetLookup,
) -> TruncationDecision:
    """Where a follower truncates, given the leader's ``(epoch, end offset)`` for the
    follower's last epoch (Kafka's ``AbstractFetcherThread.getOffsetTruncationState``).

    * The leader knows no end (``UNDEFINED_EPOCH_OFFSET``): no truncation here. Kafka
      truncates to the fetch offset, which with truncation on fetch is the LEO; a leader
      whose log is shorter answers the next fetch with OFFSET_OUT_OF_RANGE.
    * The leader names no epoch (``UNDEFINED_EPOCH``, pre-epoch protocol): its offset.
    * The follower has the leader's epoch: min(leader's end, follower's end) of that epoch.
    * The follower lacks it (KIP-279): the end of the follower's largest epoch below it,
      and ask again (``completed`` False).
    * The follower has no epoch at or below it: the leader's end offset.

    Always bounded by ``local_log_end_offset``; never the high watermark.
    """
    if leader_epoch_end.end_offset == UNDEFINED_EPOCH_OFFSET:
        return TruncationDecision(local_log_end_offset, True)
    if leader_epoch_end.epoch == UNDEFINED_EPOCH:
        return TruncationDecision(min(leader_epoch_end.end_offset, local_log_end_offset), True)
    local_epoch, local_end = local_end_offset_for(leader_epoch_end.epoch)
    if local_end == UNDEFINED_EPOCH_OFFSET:
        return TruncationDecision(min(leader_epoch_end.end_offset, local_log_end_offset), True)
    if local_epoch != leader_epoch_end.epoch:
        return TruncationDecision(min(local_end, local_log_end_offset), False)
    return TruncationDecision(
        min(leader_epoch_end.end_offset, local_end, local_log_end_offset), True
    )


def find_diverging_epoch(
    fetch_offset: int, last_fetched_epoch: int, leader_end_offset_for: EpochEndOffsetLookup
) -> EpochEndOffset | None:
    """The leader's check of a follower fetch (KIP-320, ``Partition.readRecords``).

    ``last_fetched_epoch`` is the epoch of the follower's last batch (negative: none, no
    check). ``leader_end_offset_for`` looks it up in the leader's log. When the leader's
    log ends that epoch before ``fetch_offset``, or knows it only as an older one, the
    logs diverge: the answer carries that ``(epoch, end offset)`` instead of records, and
    the follower truncates (:meth:`FollowerReplicationState.on_diverging_epoch`). None
    when the logs agree. ``OffsetOutOfRangeError`` when the leader cannot place the epoch
    (it is newer than every epoch the leader has, or the leader has none).
    """
    if last_fetched_epoch < 0:
        return None
    epoch, end_offset = leader_end_offset_for(last_fetched_epoch)
    if epoch == UNDEFINED_EPOCH or end_offset == UNDEFINED_EPOCH_OFFSET:
        raise OffsetOutOfRangeError(
            f"cannot find the end offset of the last fetched epoch {last_fetched_epoch}"
        )
    if epoch < last_fetched_epoch or end_offset < fetch_offset:
        return EpochEndOffset(epoch, end_offset)
    return None
