"""One partition's next leader and ISR as a ``PartitionChangeRecord`` (``PartitionChangeBuilder``).

Every path that changes a partition goes through :class:`PartitionChangeBuilder`: a
broker fenced or shutting down, a broker unfenced, an AlterPartition, an election. The
rules it enforces:

* the leader is in the ISR, and the ISR is a subset of the replicas;
* a leader that is not active (fenced, in controlled shutdown, unregistered) or left the
  ISR is replaced by the first replica, in replica order, that is in the ISR and active;
* the ISR never becomes empty: the last member stays, and with no active member the
  partition has no leader (:data:`NO_LEADER`) until one comes back;
* with no active ISR member, an active eligible leader replica (below) is elected and
  becomes the whole ISR: a clean election, nothing committed is lost;
* with no active ISR or ELR member, an unclean election (allowed by the topic's
  ``unclean.leader.election.enable`` or asked for by ElectLeaders) picks an active member
  of the last known ELR, else the first active replica, which becomes the whole ISR:
  records may be lost;
* a preferred election moves leadership to ``replicas[0]`` when it is active and in the ISR.

Eligible leader replicas (KIP-966). A leader advances the high watermark only while its
ISR has at least ``min.insync.replicas`` members
(:class:`~highwater.broker.replication.LeaderReplication`). So a replica that leaves the
ISR when the ISR falls, or stays, below ``min.insync.replicas`` holds every record below
the high watermark from then on (the high watermark was at most its log end offset when
it left, and cannot move while the ISR is that small): it joins the partition's ELR. The
ELR is emptied once the ISR is back at ``min.insync.replicas`` (the high watermark moves
again), and a replica leaves it when it rejoins the ISR, leaves the replica set, or
registers after an unclean shutdown (it may have lost records it had not flushed): then
it moves to the last known ELR, which only an unclean election and unclean recovery look
at (recovery waits for its members' answers, :mod:`.replication_control`). With
``min.insync.replicas`` 1, or ELR turned off (a ``min_isr`` of 1 here), the ELR stays
empty and elections are as before KIP-966. Kafka lets the ISR become empty and moves its
last member into the ELR; here the last member stays in the ISR (as before KIP-966) and
an election skips it while it is inactive, which elects the same leaders.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Container, Sequence
from typing import Final, Literal

from highwater.metadata.image import PartitionRegistration
from highwater.metadata.records import NO_LEADER, PartitionChangeRecord


class Election(enum.Enum):
    """What leader election the change asks for beyond keeping a valid leader."""

    NONE = "none"
    PREFERRED = "preferred"
    UNCLEAN = "unclean"


class PartitionChangeBuilder:
    """Builds the change of one partition towards a target ISR and election.

    ``is_active(broker)`` says whether a broker may lead and be in the ISR.
    ``unclean_allowed`` is the topic's ``unclean.leader.election.enable``.
    """

    def __init__(
        self,
        partition: PartitionRegistration,
        topic_id: str,
        partition_id: int,
        is_active: Callable[[int], bool],
        *,
        unclean_allowed: bool = False,
        min_isr: int = 1,
    ) -> None:
        self.partition = partition
        self.topic_id = topic_id
        self.partition_id = partition_id
        self._is_active = is_active
        self._unclean_allowed = unclean_allowed
        self._target_isr: tuple[int, ...] = partition.isr
        self._replicas: tuple[int, ...] = partition.replicas
        self._adding: tuple[int, ...] = partition.adding_replicas
        self._removing: tuple[int, ...] = partition.removing_replicas
        self._election = Election.NONE
        self._min_isr = min_isr
        self._unclean_shutdown: set[int] = set()
        self._recovered_leader: int | None = None
        self.unclean = False
        """Whether :meth:`build` made an unclean election."""

    def set_target_isr(self, isr: Sequence[int]) -> PartitionChangeBuilder:
        self._target_isr = tuple(isr)
        return self

    def remove_from_isr(self, broker_id: int) -> PartitionChangeBuilder:
        """Drop ``broker_id`` from the ISR. The last member leaves too when the ELR is in
        use (``min_isr`` above 1): the ISR becomes empty and it joins the ELR; without
        the ELR it stays, as before KIP-966."""
        remaining = tuple(b for b in self._target_isr if b != broker_id)
        if remaining or self._min_isr > 1:
            self._target_isr = remaining
        return self

    def set_recovered_leader(self, broker_id: int) -> PartitionChangeBuilder:
        """Unclean recovery chose ``broker_id`` (the longest log among the candidates
        that answered): it leads, and is the whole ISR."""
        self._recovered_leader = broker_id
        return self

    def mark_unclean_shutdown(self, broker_id: int) -> PartitionChangeBuilder:
        """``broker_id`` registered after an unclean shutdown: it leaves the ELR for the
        last known ELR, and is elected (from the ELR) no more."""
        self._unclean_shutdown.add(broker_id)
        return self

    def set_target_replicas(
        self,
        replicas: Sequence[int],
        *,
        adding: Sequence[int] = (),
        removing: Sequence[int] = (),
    ) -> PartitionChangeBuilder:
        """Change the replica set (a reassignment's start, completion or cancellation): the
        ISR keeps only members of ``replicas``, and the leader is chosen among them."""
        self._replicas = tuple(replicas)
        self._adding, self._removing = tuple(adding), tuple(removing)
        return self

    def set_election(self, election: Election) -> PartitionChangeBuilder:
        self._election = election
        return self

    def build(self) -> PartitionChangeRecord | None:
        """The change record, or None when the partition would not change."""
        partition = self.partition
        replicas = self._replicas
        isr = tuple(b for b in self._target_isr if b in replicas)
        if not isr and self._target_isr:
            raise ValueError(f"no ISR member of {self.topic_id}-{self.partition_id} is a replica")
        elr = tuple(
            b
            for b in partition.elr
            if b in replicas and b not in isr and b not in self._unclean_shutdown
        )
        leader = self._choose_leader(isr, elr)
        if leader is None:
            leader = NO_LEADER
        elif leader not in isr:
            # Elected from the ELR (clean), by unclean recovery or uncleanly: the new
            # leader's log is the truth from now on, and it is the whole ISR.
            self.unclean = leader not in elr and leader != self._recovered_leader
            isr = (leader,)
        elr, last_known_elr = self._next_elr(isr, elr)
        new_isr = None if isr == partition.isr else isr
        new_leader = None if leader == partition.leader else leader
        replicas_changed = (replicas, self._adding, self._removing) != (
            partition.replicas,
            partition.adding_replicas,
            partition.removing_replicas,
        )
        new_elr = None if elr == partition.elr else elr
        new_last_known = None if last_known_elr == partition.last_known_elr else last_known_elr
        if (
            new_isr is None
            and new_leader is None
            and not replicas_changed
            and new_elr is None
            and new_last_known is None
        ):
            return None
        return PartitionChangeRecord(
            topic_id=self.topic_id,
            partition_id=self.partition_id,
            isr=new_isr,
            leader=new_leader,
            replicas=replicas if replicas_changed else None,
            adding_replicas=self._adding if replicas_changed else None,
            removing_replicas=self._removing if replicas_changed else None,
            eligible_leader_replicas=new_elr,
            last_known_elr=new_last_known,
        )

    def _next_elr(
        self, isr: tuple[int, ...], elr: tuple[int, ...]
    ) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The ELR and last known ELR once the ISR is ``isr``; ``elr`` is the current ELR
        without the members that left it (back in the ISR, no longer replicas, unclean)."""
        partition = self.partition
        replicas = self._replicas
        if len(isr) >= self._min_isr:
            return (), ()
        left_isr = tuple(
            b
            for b in partition.isr
            if b not in isr and b in replicas and b not in elr and b not in self._unclean_shutdown
        )
        next_elr = tuple(b for b in elr if b not in isr) + left_isr
        # Members that lost the guarantee (an unclean shutdown) while in the ELR or the ISR.
        lost = tuple(
            b
            for b in partition.elr + partition.isr
            if b in self._unclean_shutdown and b in replicas
        )
        last_known = tuple(
            b
            for b in partition.last_known_elr + lost
            if b in replicas and b not in isr and b not in next_elr
        )
        return next_elr, tuple(dict.fromkeys(last_known))

    def _choose_leader(self, isr: tuple[int, ...], elr: tuple[int, ...]) -> int | None:
        partition = self.partition
        replicas = self._replicas
        active = self._is_active
        recovered = self._recovered_leader
        if (
            recovered is not None
            and not isr
            and not any(active(b) for b in elr)
            and recovered in replicas
            and active(recovered)
        ):
            return recovered
        if self._election is Election.PREFERRED and replicas:
            preferred = replicas[0]
            if preferred in isr and active(preferred):
                return preferred
        current = partition.leader
        if current not in replicas:
            current = NO_LEADER
        if current != NO_LEADER and current in isr and active(current):
            return current
        for broker in replicas:
            if broker in isr and active(broker):
                return broker
        for broker in elr:
            if active(broker):
                return broker
        if self._unclean_allowed or self._election is Election.UNCLEAN:
            for broker in partition.last_known_elr:
                if broker in replicas and active(broker):
                    return broker
            for broker in replicas:
                if active(broker):
                    return broker
        return None


class Undecided(enum.Enum):
    """:func:`removal_change` leaves the partition to :class:`PartitionChangeBuilder`."""

    BUILDER = "builder"


_new_change: Final = PartitionChangeRecord


def removal_change(
    partition: PartitionRegistration,
    topic_id: str,
    partition_id: int,
    broker_id: int,
    active: Container[int],
    min_isr: int,
) -> PartitionChangeRecord | Literal[Undecided.BUILDER] | None:
    """The change that takes ``broker_id`` (inactive) out of ``partition``'s ISR and
    leadership, when it is the common one: exactly what ``PartitionChangeBuilder(...)
    .remove_from_isr(broker_id).build()`` returns, decided without the builder.

    A controlled shutdown or a fence decides this for every partition the broker leads
    or follows in sync (a million changes at a million partitions), and in almost all of
    them nothing but the ISR and the leader moves: the partition has no ELR, no last
    known ELR and no reassignment, the ISR left behind still has ``min_isr`` members (so
    no ELR starts), and one of them is ``active`` (so the leader is the current one when
    it stays active and in sync, else the first such replica in replica order, as the
    builder's clean election). Then the change is the new ISR and leader, built here
    directly. Anything else (an ELR to keep, an ISR falling below ``min_isr``, no active
    member left, a replica set being reassigned, an ISR member that is not a replica)
    answers :attr:`Undecided.BUILDER`: the builder decides, as before.
    ``tests/controller/test_partition_change.py`` checks that both agree."""
    replicas, isr, leader = partition.replicas, partition.isr, partition.leader
    if partition.elr or partition.last_known_elr or partition.adding_replicas:
        return Undecided.BUILDER
    if partition.removing_replicas:
        return Undecided.BUILDER
    remaining = tuple(b for b in isr if b != broker_id)
    if not remaining or len(remaining) < min_isr:
        return Undecided.BUILDER
    for b in remaining:
        if b not in replicas:
            return Undecided.BUILDER
    if leader in remaining and leader in replicas and leader in active:
        new_leader = leader
    else:
        for b in replicas:
            if b in remaining and b in active:
                new_leader = b
                break
        else:
            return Undecided.BUILDER
    new_isr = None if remaining == isr else remaining
    if new_leader == leader:
        if new_isr is None:
            return None
        return _new_change(topic_id, partition_id, new_isr)
    return _new_change(topic_id, partition_id, new_isr, new_leader)
