"""Replica placement for new partitions: rack-aware, balanced, deterministic given a seed.

The layout follows Kafka's ``AdminUtils.assignReplicasToBrokers``: brokers are arranged
in rack-alternating order (one broker of each rack in turn), a random start index picks
where the first partition's preferred leader sits, and preferred leaders then walk the
arrangement round robin, so every broker leads within one as many partitions as any
other. Followers go to other racks first (no rack holds two replicas of a partition
while some rack holds none), as in Kafka.

Where Kafka shifts followers by a fixed offset per round, this placer picks each
follower greedily: the rack, then the broker in it, with the fewest replicas of the
topic so far; ties go to brokers that already led a partition in the current round,
then to those that lead latest, then Kafka's random shift. That keeps replica counts
within one of each other after every partition, not only after whole rounds, when every
broker has a rack or none does and the racks are the same size (with racks of unequal
size no placement can be both rack-diverse and balanced; rack diversity wins, as in
Kafka).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from highwater.errors import HighwaterError
from highwater.v1.common_pb2 import ErrorCode


class InvalidReplicationFactorError(HighwaterError):
    """More replicas asked for than there are usable brokers, or fewer than one."""

    code = ErrorCode.INVALID_REPLICATION_FACTOR


@dataclass(frozen=True, slots=True)
class PlacementBroker:
    """A broker that may receive replicas: its id and rack (None: no rack)."""

    broker_id: int
    rack: str | None = None


def rack_alternated(brokers: Sequence[PlacementBroker]) -> list[int]:
    """Broker ids in Kafka's rack-alternating order: racks sorted, brokers sorted within
    each rack, then one broker of each rack in turn (``getRackAlternatedBrokerList``)."""
    by_rack: dict[str, list[int]] = {}
    for broker in sorted(brokers, key=lambda b: b.broker_id):
        by_rack.setdefault(broker.rack or "", []).append(broker.broker_id)
    racks = sorted(by_rack)
    cursors = dict.fromkeys(racks, 0)
    arranged: list[int] = []
    rack_index = 0
    while len(arranged) < len(brokers):
        rack = racks[rack_index]
        if cursors[rack] < len(by_rack[rack]):
            arranged.append(by_rack[rack][cursors[rack]])
            cursors[rack] += 1
        rack_index = (rack_index + 1) % len(racks)
    return arranged


def place_replicas(
    brokers: Sequence[PlacementBroker],
    num_partitions: int,
    replication_factor: int,
    rng: random.Random,
    *,
    existing: Sequence[Sequence[int]] = (),
) -> list[tuple[int, ...]]:
    """The replicas (preferred leader first) of ``num_partitions`` new partitions.

    ``existing`` are the replica lists of the topic's current partitions, when growing a
    topic: new partitions continue their round robin and balance against them.
    Raises :class:`InvalidReplicationFactorError` when ``replication_factor`` is below 1
    or above the number of brokers.
    """
    if replication_factor < 1:
        raise InvalidReplicationFactorError("Replication factor must be larger than 0.")
    if replication_factor > len(brokers):
        raise InvalidReplicationFactorError(
            f"Unable to replicate the partition {replication_factor} time(s): The target "
            f"replication factor of {replication_factor} cannot be reached because only "
            f"{len(brokers)} broker(s) are registered."
        )
    if num_partitions <= 0:
        return []
    return _Placer(brokers, rng, existing).place(num_partitions, replication_factor)


class _Placer:
    def __init__(
        self,
        brokers: Sequence[PlacementBroker],
        rng: random.Random,
        existing: Sequence[Sequence[int]],
    ) -> None:
        racked = all(b.rack is not None for b in brokers)
        if racked:
            self.arranged = rack_alternated(brokers)
            self.rack_of = {b.broker_id: str(b.rack) for b in brokers}
        else:
            # Without racks on every broker, each broker counts as its own rack.
            self.arranged = sorted(b.broker_id for b in brokers)
            self.rack_of = {b.broker_id: str(b.broker_id) for b in brokers}
        n = len(self.arranged)
        self.position = {broker: i for i, broker in enumerate(self.arranged)}
        self.racks: list[str] = []
        for broker in self.arranged:
            if self.rack_of[broker] not in self.racks:
                self.racks.append(self.rack_of[broker])
        self.rack_position = {rack: i for i, rack in enumerate(self.racks)}
        self.members = {r: [b for b in self.arranged if self.rack_of[b] == r] for r in self.racks}
        self.counts = dict.fromkeys(self.arranged, 0)
        self.rack_counts = dict.fromkeys(self.racks, 0)
        for replicas in existing:
            for broker in replicas:
                if broker in self.counts:
                    self.counts[broker] += 1
                    self.rack_counts[self.rack_of[broker]] += 1
        first_leader = existing[0][0] if existing and existing[0] else None
        if first_leader is not None and first_leader in self.position:
            self.start = self.position[first_leader]
        else:
            self.start = rng.randrange(n)
        self.shift = rng.randrange(n)
        self.next_partition = len(existing)

    def leader_position(self, partition: int) -> int:
        return (self.start + partition) % len(self.arranged)

    def place(self, num_partitions: int, replication_factor: int) -> list[tuple[int, ...]]:
        return [
            self._place_one(partition, replication_factor)
            for partition in range(self.next_partition, self.next_partition + num_partitions)
        ]

    def _place_one(self, partition: int, replication_factor: int) -> tuple[int, ...]:
        n = len(self.arranged)
        num_racks = len(self.racks)
        lead_pos = self.leader_position(partition)
        leader = self.arranged[lead_pos]
        lead_rack_pos = self.rack_position[self.rack_of[leader]]
        # Brokers (and racks) that already led a partition in this round of the arrangement.
        led = {
            self.arranged[self.leader_position(p)]
            for p in range(partition - partition % n, partition)
        }
        racks_led = {
            self.rack_position[self.rack_of[self.arranged[self.leader_position(p)]]]
            for p in range(partition - partition % num_racks, partition)
        }
        replicas = [leader]
        used_racks: Counter[str] = Counter({self.rack_of[leader]: 1})
        self._count(leader)
        for _ in range(replication_factor - 1):

            def rack_key(rack: str) -> tuple[int, int, int, int]:
                pos = self.rack_position[rack]
                crowded = 1 if used_racks[rack] and len(used_racks) < num_racks else 0
                if pos in racks_led:
                    return (
                        crowded,
                        self.rack_counts[rack],
                        0,
                        (pos - lead_rack_pos - 1 - self.shift) % num_racks,
                    )
                return (crowded, self.rack_counts[rack], 1, (lead_rack_pos - pos) % num_racks)

            def broker_key(broker: int) -> tuple[int, int, int]:
                pos = self.position[broker]
                if broker in led:
                    return (self.counts[broker], 0, (pos - lead_pos - 1 - self.shift) % n)
                return (self.counts[broker], 1, (lead_pos - pos) % n)

            rack = min(
                (r for r in self.racks if used_racks[r] < len(self.members[r])), key=rack_key
            )
            broker = min((b for b in self.members[rack] if b not in replicas), key=broker_key)
            replicas.append(broker)
            used_racks[rack] += 1
            self._count(broker)
        return tuple(replicas)

    def _count(self, broker: int) -> None:
        self.counts[broker] += 1
        self.rack_counts[self.rack_of[broker]] += 1
