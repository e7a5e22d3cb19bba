"""Assignment of ``__consumer_offsets`` partitions to group coordinators: balanced and sticky.

Each partition of ``__consumer_offsets`` is owned by one registered coordinator, which
serves the groups that hash to it. :func:`assign_coordinators` keeps every partition
where it is as long as its owner is registered and not over its share, moves the rest
to the least-loaded coordinators, and so keeps owners' counts within one of each other.
Every new owner, and every new incarnation of an owner, gets the partition with its
``coordinator_epoch`` one higher, so the previous owner's writes can be fenced.

**A partition leaves a live coordinator only once that coordinator has let it go**
(revoke first, assign after, as KIP-848 hands a partition from one consumer to another).
A coordinator's session lease (:mod:`highwater.coordinator.lease`) lets it answer from its
cache until a session timeout after its last acknowledged heartbeat: that is safe against
a move made when its session *expires*, which is never earlier, but not against a move
made while its session is alive (balancing after another coordinator registers). Paused
with a request queued, it would resume and answer an offset its successor has since
moved past, before its image shows the move. So a move off a live coordinator is two
steps: a revocation (owner ``-1``, ``revoked_from`` the old owner, the epoch one higher),
then, once the old owner's heartbeat reports a metadata offset at or past the revocation
(its image has it, so it serves the partition no more) or its registration is gone
(expired, unregistered, replaced by a new incarnation), the assignment to the partition's
next owner. Moves off a coordinator that is gone happen at once, as they always did.

The partitions are those of the topic as it exists in the metadata (none before the
controller created it); :func:`offsets_topic_configs` is what it is created with.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from highwater.controller.config import ControllerConfig
from highwater.metadata.image import CoordinatorAssignment
from highwater.metadata.records import NO_LEADER, CoordinatorAssignmentRecord


def offsets_topic_configs(config: ControllerConfig, replication_factor: int) -> dict[str, str]:
    """The topic configs of ``__consumer_offsets`` (Kafka's ``offsetsTopicConfigs``, plus
    a ``min.insync.replicas`` its replication factor can meet while one replica is down)."""
    return {
        "cleanup.policy": "compact",
        "segment.bytes": str(config.offsets_topic_segment_bytes),
        "min.insync.replicas": str(min(2, replication_factor)),
    }


def assign_coordinators(
    num_partitions: int,
    coordinators: Collection[int],
    current: Mapping[int, CoordinatorAssignment],
    *,
    restarted: Collection[int] = (),
    released: Collection[int] = (),
) -> list[CoordinatorAssignmentRecord]:
    """The assignment records that balance partitions ``0..num_partitions-1`` over
    ``coordinators``, given the ``current`` assignments.

    ``restarted`` coordinators are new incarnations: the partitions they keep get a new
    epoch too, and those they lose go at once (the earlier incarnation serves nothing).
    A partition moving off a live coordinator is revoked first (see the module
    docstring); a revoked partition gets its next owner once ``released`` holds it (its
    old owner's image has the revocation) or its old owner is no longer live. With no
    coordinator, assigned partitions become unassigned (owner -1), and so do assigned
    partitions at or past ``num_partitions`` (the topic has fewer).
    """
    live = sorted(set(coordinators))
    owners: dict[int, int] = {}
    if live:
        owners = _balanced_owners(num_partitions, live, current)
    records = []
    for partition_id in range(num_partitions):
        owner = owners.get(partition_id, NO_LEADER)
        assignment = current.get(partition_id)
        if assignment is None:
            if owner == NO_LEADER:
                continue
            records.append(CoordinatorAssignmentRecord(partition_id, owner, 0))
            continue
        epoch = assignment.coordinator_epoch + 1
        revoked_from = assignment.revoked_from
        if revoked_from is not None:
            # Being taken from ``revoked_from``: nobody owns it until it let it go.
            if owner == NO_LEADER:
                continue
            if (
                owner == revoked_from
                or partition_id in released
                or _leaves_at_once(revoked_from, live, restarted)
            ):
                records.append(CoordinatorAssignmentRecord(partition_id, owner, epoch))
        elif assignment.coordinator_id == owner:
            if owner in restarted:
                records.append(CoordinatorAssignmentRecord(partition_id, owner, epoch))
        elif owner != NO_LEADER and not _leaves_at_once(assignment.coordinator_id, live, restarted):
            records.append(
                CoordinatorAssignmentRecord(
                    partition_id, NO_LEADER, epoch, revoked_from=assignment.coordinator_id
                )
            )
        else:
            records.append(CoordinatorAssignmentRecord(partition_id, owner, epoch))
    for partition_id, assignment in sorted(current.items()):
        if partition_id >= num_partitions and (
            assignment.coordinator_id != NO_LEADER or assignment.revoked_from is not None
        ):
            records.append(
                CoordinatorAssignmentRecord(
                    partition_id, NO_LEADER, assignment.coordinator_epoch + 1
                )
            )
    return records


def revoked_from(
    coordinator_id: int, assignments: Mapping[int, CoordinatorAssignment]
) -> dict[int, int]:
    """The partitions being taken from ``coordinator_id``: partition -> the coordinator
    epoch of the revocation."""
    return {
        partition_id: assignment.coordinator_epoch
        for partition_id, assignment in assignments.items()
        if assignment.revoked_from == coordinator_id
    }


def _leaves_at_once(coordinator_id: int, live: Collection[int], restarted: Collection[int]) -> bool:
    """Whether a partition may go from ``coordinator_id`` straight to another owner: the
    coordinator is gone (its session expired, it unregistered: its lease ran out first),
    or it is a new incarnation (the one that served the partition serves nothing now),
    or the partition has no owner (-1). Otherwise it must be revoked first."""
    return coordinator_id == NO_LEADER or coordinator_id not in live or coordinator_id in restarted


def _balanced_owners(
    num_partitions: int, live: list[int], current: Mapping[int, CoordinatorAssignment]
) -> dict[int, int]:
    base, extra = divmod(num_partitions, len(live))
    kept: dict[int, list[int]] = {c: [] for c in live}
    for partition_id in range(num_partitions):
        assignment = current.get(partition_id)
        if assignment is not None and assignment.coordinator_id in kept:
            kept[assignment.coordinator_id].append(partition_id)
    owners: dict[int, int] = {}
    loads = dict.fromkeys(live, 0)
    # Keep up to the base share of each owner's partitions, then one more for as many
    # owners as the remainder allows (those that hold the most first, to move the least).
    for coordinator in live:
        for partition_id in kept[coordinator][:base]:
            owners[partition_id] = coordinator
            loads[coordinator] += 1
    for coordinator in sorted(live, key=lambda c: (-len(kept[c]), c)):
        if extra == 0:
            break
        if len(kept[coordinator]) > base:
            owners[kept[coordinator][base]] = coordinator
            loads[coordinator] += 1
            extra -= 1
    # The rest go to the least loaded coordinators; ``extra`` of them may reach base + 1.
    for partition_id in range(num_partitions):
        if partition_id in owners:
            continue
        coordinator = min(live, key=lambda c: (loads[c], c))
        owners[partition_id] = coordinator
        loads[coordinator] += 1
    return owners
