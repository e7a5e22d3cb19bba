"""One partition's next leader and ISR as a ``PartitionChangeRecord`` (``PartitionChangeBuilder``).

Every path that changes a partition goes through :class:`PartitionChangeBuilder`: a
broker fenced or shutting down, a broker unfenced, an AlterPartition, an election. The
rules it enforces:

* the leader is in the ISR, and the ISR is a subset of the replicas;
* a leader that is not active (fenced, in controlled shutdown, unregistered) or left the
  ISR is replaced by the first replica, in replica order, that is in the ISR and active;
* the ISR never becomes empty: the last member stays, and with no active member the
  partition has no leader (:data:`NO_LEADER`) until one comes back;
* with no active ISR member, an unclean election (allowed by the topic's
  ``unclean.leader.election.enable`` or asked for by ElectLeaders) picks the first
  active replica, which becomes the whole ISR: records may be lost;
* a preferred election moves leadership to ``replicas[0]`` when it is active and in the ISR.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence

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
        self.unclean = False
        """Whether :meth:`build` made an unclean election."""

    def set_target_isr(self, isr: Sequence[int]) -> PartitionChangeBuilder:
        self._target_isr = tuple(isr)
        return self

    def remove_from_isr(self, broker_id: int) -> PartitionChangeBuilder:
        """Drop ``broker_id`` from the ISR, unless it is the last member."""
        remaining = tuple(b for b in self._target_isr if b != broker_id)
        if remaining:
            self._target_isr = remaining
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
        isr = self._target_isr if self._target_isr else partition.isr
        isr = tuple(b for b in isr if b in replicas)
        if not isr:
            raise ValueError(f"no ISR member of {self.topic_id}-{self.partition_id} is a replica")
        leader = self._choose_leader(isr)
        if leader is None:
            leader = NO_LEADER
        elif leader not in isr:
            # An unclean election: the new leader's log is the truth from now on.
            isr = (leader,)
            self.unclean = True
        new_isr = None if isr == partition.isr else isr
        new_leader = None if leader == partition.leader else leader
        replicas_changed = (replicas, self._adding, self._removing) != (
            partition.replicas,
            partition.adding_replicas,
            partition.removing_replicas,
        )
        if new_isr is None and new_leader is None and not replicas_changed:
            return None
        return PartitionChangeRecord(
            topic_id=self.topic_id,
            partition_id=self.partition_id,
            isr=new_isr,
            leader=new_leader,
            replicas=replicas if replicas_changed else None,
            adding_replicas=self._adding if replicas_changed else None,
            removing_replicas=self._removing if replicas_changed else None,
        )

    def _choose_leader(self, isr: tuple[int, ...]) -> int | None:
        partition = self.partition
        replicas = self._replicas
        active = self._is_active
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
        if self._unclean_allowed or self._election is Election.UNCLEAN:
            for broker in replicas:
                if active(broker):
                    return broker
        return None
