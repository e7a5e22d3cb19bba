"""Partition reassignment (Kafka's KIP-455): moving a partition's replicas to other brokers.

A partition with replicas ``R`` reassigned to target replicas ``T`` goes through two
metadata changes:

1. **start**: the replicas become ``T`` followed by the members of ``R`` not in ``T``, with
   ``adding_replicas`` = ``T - R`` and ``removing_replicas`` = ``R - T``; the ISR and the
   leader stay. The brokers being added open the replica when the record reaches them and
   fetch from the leader, which expands the ISR (AlterPartition) as each catches up.
2. **completion**, as soon as every replica of ``T`` is in the ISR (at once when none is
   being added): the replicas become ``T``, the ISR keeps its members in ``T``, the two
   lists are cleared, and a leader outside ``T`` hands over to the first replica of ``T``
   in the ISR (a new leader epoch). The removed brokers delete their replica.

A new reassignment of a partition that is being moved is planned from its original
replicas (``R`` without those being added); a cancelled one goes back to them, keeping the
ISR members among them. The functions here are pure: the controller turns their answers
into partition change records with
:class:`~highwater.controller.partition_change.PartitionChangeBuilder`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from highwater.metadata.image import PartitionRegistration

__all__ = [
    "ReassignmentStart",
    "is_reassigning",
    "original_replicas",
    "plan_start",
    "ready_to_complete",
    "target_replicas",
]


@dataclass(frozen=True, slots=True)
class ReassignmentStart:
    """The replica lists of a partition while it moves to ``target``."""

    replicas: tuple[int, ...]
    adding: tuple[int, ...]
    removing: tuple[int, ...]


def is_reassigning(partition: PartitionRegistration) -> bool:
    return bool(partition.adding_replicas or partition.removing_replicas)


def original_replicas(partition: PartitionRegistration) -> tuple[int, ...]:
    """The replicas before the reassignment in progress (all of them when none is)."""
    adding = partition.adding_replicas
    return tuple(r for r in partition.replicas if r not in adding)


def target_replicas(partition: PartitionRegistration) -> tuple[int, ...]:
    """The replicas the reassignment in progress ends with (all of them when none is)."""
    removing = partition.removing_replicas
    return tuple(r for r in partition.replicas if r not in removing)


def plan_start(partition: PartitionRegistration, target: Sequence[int]) -> ReassignmentStart:
    """The replica lists that start moving ``partition`` to ``target``."""
    target = tuple(target)
    original = original_replicas(partition)
    return ReassignmentStart(
        replicas=target + tuple(r for r in original if r not in target),
        adding=tuple(r for r in target if r not in original),
        removing=tuple(r for r in original if r not in target),
    )


def ready_to_complete(partition: PartitionRegistration) -> bool:
    """Whether a reassignment is in progress and every target replica is in the ISR."""
    if not is_reassigning(partition):
        return False
    isr = partition.isr
    return all(r in isr for r in target_replicas(partition))
