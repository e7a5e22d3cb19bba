"""The per-broker indexes an image derives from its parent against the same indexes rebuilt
from scratch.

A Hypothesis state machine applies random batches of records (leader and ISR changes,
reassignments, new and removed topics, partitions added) to random earlier images whose
indexes were built, and checks that each new image's derived indexes equal
:func:`build_broker_index` over its topics, and that no earlier image's index changed (the
copy-on-write contract readers rely on). The topics span more than one group of
:data:`~highwater.metadata.persistent.SET_SPAN` partitions, so group sharing is exercised.
"""

from __future__ import annotations

import hypothesis.strategies as st
from highwater.metadata import (
    IndexKind,
    MetadataImage,
    MetadataRecord,
    PartitionChangeRecord,
    PartitionRecord,
    RegisterBrokerRecord,
    RemoveTopicRecord,
    TopicRecord,
    UnfenceBrokerRecord,
    build_broker_index,
    replay,
)
from highwater.metadata.persistent import SET_SPAN
from highwater.metadata.records import NO_LEADER
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

BROKERS = 5
SIZES = (3, SET_SPAN + 40)
"""Partitions of the starting topics: a small one, and one of two groups."""


def replicas_for(partition_id: int, shift: int = 0) -> tuple[int, ...]:
    first = (partition_id + shift) % BROKERS
    return tuple((first + i) % BROKERS for i in range(3))


def start_records() -> list[MetadataRecord]:
    records: list[MetadataRecord] = []
    for broker_id in range(BROKERS):
        records.append(RegisterBrokerRecord(broker_id, f"inc-{broker_id}", broker_id))
        records.append(UnfenceBrokerRecord(broker_id, broker_id))
    for number, size in enumerate(SIZES):
        records.append(TopicRecord(f"t{number}", f"id-{number}"))
        for p in range(size):
            replicas = replicas_for(p)
            records.append(PartitionRecord(f"id-{number}", p, replicas, replicas, replicas[0]))
    return records


def rebuilt(image: MetadataImage, kind: IndexKind) -> dict[int, frozenset[object]]:
    return {
        broker: frozenset(keys)
        for broker, keys in build_broker_index(image.topics.by_id.values(), kind).items()
    }


def as_sets(image: MetadataImage, kind: IndexKind) -> dict[int, frozenset[object]]:
    return {broker: frozenset(keys) for broker, keys in image.topics.broker_index(kind).items()}


CHANGE = st.tuples(
    st.integers(0, 10_000),  # which partition (modulo the topic's size)
    st.integers(-1, BROKERS - 1),  # the new leader (-1: none; NO_LEADER)
    st.integers(0, 4),  # 0: ISR only, 1: leader and ISR, 2: reassignment, 3: leaderless,
    # 4: the ISR down to its first replica, the others eligible (or the ELR emptied)
)


class DerivedIndexes(RuleBasedStateMachine):
    """Images made from random earlier ones; each one's indexes against a rebuild."""

    def __init__(self) -> None:
        super().__init__()
        self.images: list[tuple[MetadataImage, dict[IndexKind, dict[int, frozenset[object]]]]] = []
        self.topics = 0

    def keep(self, image: MetadataImage) -> None:
        if self.images:  # derived from a parent that had all three, not built afresh
            assert set(image.topics.built_indexes()) == set(IndexKind)
        for kind in IndexKind:
            image.topics.broker_index(kind)
        self.images.append((image, {kind: as_sets(image, kind) for kind in IndexKind}))

    @initialize()
    def start(self) -> None:
        records = start_records()
        self.topics = len(SIZES)
        self.keep(replay(records, len(records) - 1, 1))

    @rule(pick=st.integers(0, 1_000), changes=st.lists(CHANGE, min_size=1, max_size=40))
    def change_partitions(self, pick: int, changes: list[tuple[int, int, int]]) -> None:
        base = self.images[pick % len(self.images)][0]
        topics = sorted(base.topics.by_id.values(), key=lambda t: t.topic_id)
        if not topics:
            return
        records: list[MetadataRecord] = []
        for n, (which, leader, how) in enumerate(changes):
            topic = topics[which % len(topics)]
            if not len(topic.partitions):
                continue
            p = which % len(topic.partitions)
            if how == 2:
                replicas = replicas_for(p, which)
                records.append(
                    PartitionChangeRecord(
                        topic.topic_id, p, replicas=replicas, isr=replicas, leader=replicas[0]
                    )
                )
            elif how == 3:
                records.append(PartitionChangeRecord(topic.topic_id, p, leader=NO_LEADER))
            elif how == 4:
                current = topic.partitions[p]
                first, *others = current.replicas
                elr = () if current.elr else tuple(others[: 1 + n % 2])
                records.append(
                    PartitionChangeRecord(
                        topic.topic_id,
                        p,
                        isr=(first,) if elr else current.replicas,
                        leader=first,
                        eligible_leader_replicas=elr,
                    )
                )
            else:
                current = topic.partitions[p]
                isr = tuple(b for b in current.replicas if (b + n) % 2 == 0) or current.replicas
                new_leader = leader if leader in isr else isr[0]
                keeps_leader = how == 0 and current.leader in isr
                records.append(
                    PartitionChangeRecord(
                        topic.topic_id, p, isr=isr, leader=None if keeps_leader else new_leader
                    )
                )
        if records:
            self.keep(replay(records, base.offset + len(records), image=base))

    @rule(pick=st.integers(0, 1_000), size=st.integers(1, 20), drop=st.booleans())
    def create_or_remove_topic(self, pick: int, size: int, drop: bool) -> None:
        base = self.images[pick % len(self.images)][0]
        if drop and base.topics.by_id:
            gone = sorted(base.topics.by_id)[pick % len(base.topics.by_id)]
            self.keep(replay([RemoveTopicRecord(gone)], base.offset + 1, image=base))
            return
        number = self.topics
        self.topics += 1
        records: list[MetadataRecord] = [TopicRecord(f"t{number}", f"id-{number}")]
        for p in range(size):
            replicas = replicas_for(p, number)
            records.append(PartitionRecord(f"id-{number}", p, replicas, replicas, replicas[0]))
        self.keep(replay(records, base.offset + len(records), image=base))

    @rule(pick=st.integers(0, 1_000), more=st.integers(1, 30))
    def add_partitions(self, pick: int, more: int) -> None:
        base = self.images[pick % len(self.images)][0]
        if not base.topics.by_id:
            return
        topic = base.topics.by_id[sorted(base.topics.by_id)[pick % len(base.topics.by_id)]]
        records: list[MetadataRecord] = []
        for p in range(len(topic.partitions), len(topic.partitions) + more):
            replicas = replicas_for(p, 1)
            records.append(PartitionRecord(topic.topic_id, p, replicas, replicas, replicas[0]))
        self.keep(replay(records, base.offset + len(records), image=base))

    @invariant()
    def the_newest_indexes_equal_a_rebuild(self) -> None:
        if self.images:
            newest = self.images[-1][0]
            for kind in IndexKind:
                assert as_sets(newest, kind) == rebuilt(newest, kind)

    def teardown(self) -> None:
        for image, seen in self.images:
            for kind in IndexKind:
                assert as_sets(image, kind) == seen[kind]


TestDerivedIndexes = DerivedIndexes.TestCase
TestDerivedIndexes.settings = settings(max_examples=15, stateful_step_count=8, deadline=None)
