"""Assignment of ``__consumer_offsets`` partitions to group coordinators: balanced and sticky.

Each partition of ``__consumer_offsets`` is owned by one registered coordinator, which
serves the groups that hash to it. :func:`assign_coordinators` keeps every partition
where it is as long as its owner is registered and not over its share, moves the rest
to the least-loaded coordinators, and so keeps owners' counts within one of each other.
Every new owner, and every new incarnation of an owner, gets the partition with its
``coordinator_epoch`` one higher, so the previous owner's writes can be fenced.

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
) -> list[CoordinatorAssignmentRecord]:
    """The assignment records that balance partitions ``0..num_partitions-1`` over
    ``coordinators``, given the ``current`` assignments.

    ``restarted`` coordinators are new incarnations: the partitions they keep get a new
    epoch too. With no coordinator, assigned partitions become unassigned (owner -1), and
    so do assigned partitions at or past ``num_partitions`` (the topic has fewer).
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
        elif assignment.coordinator_id != owner or owner in restarted:
            records.append(
                CoordinatorAssignmentRecord(partition_id, owner, assignment.coordinator_epoch + 1)
            )
    for partition_id, assignment in sorted(current.items()):
        if partition_id >= num_partitions and assignment.coordinator_id != NO_LEADER:
            records.append(
                CoordinatorAssignmentRecord(
                    partition_id, NO_LEADER, assignment.coordinator_epoch + 1
                )
            )
    return records


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
