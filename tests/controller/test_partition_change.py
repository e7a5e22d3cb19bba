"""The partition change builder's KIP-966 rules, case by case, on one partition of
replicas (1, 2, 3) with ``min.insync.replicas`` 2 (the ELR in use) or 1 (not)."""

from __future__ import annotations

import random
from collections.abc import Iterable

from highwater.controller.partition_change import (
    PartitionChangeBuilder,
    Undecided,
    removal_change,
)
from highwater.metadata import NO_LEADER, PartitionChangeRecord, PartitionRegistration


def partition(
    isr: tuple[int, ...],
    leader: int,
    elr: tuple[int, ...] = (),
    last_known_elr: tuple[int, ...] = (),
) -> PartitionRegistration:
    return PartitionRegistration(
        replicas=(1, 2, 3),
        isr=isr,
        leader=leader,
        leader_epoch=5,
        partition_epoch=9,
        elr=elr,
        last_known_elr=last_known_elr,
    )


def builder(
    registration: PartitionRegistration, active: Iterable[int], *, min_isr: int = 2
) -> PartitionChangeBuilder:
    alive = set(active)
    return PartitionChangeBuilder(registration, "topic", 0, alive.__contains__, min_isr=min_isr)


def after(
    registration: PartitionRegistration, change: PartitionChangeBuilder
) -> PartitionRegistration:
    record = change.build()
    assert record is not None
    return registration.merge(record)


def test_the_last_isr_member_leaves_the_isr_for_the_elr() -> None:
    before = partition((1,), 1, elr=(2,))
    now = after(before, builder(before, []).remove_from_isr(1))
    assert (now.isr, now.leader, now.elr, now.last_known_elr) == ((), NO_LEADER, (2, 1), ())


def test_without_the_elr_the_last_isr_member_stays() -> None:
    before = partition((1,), 1)
    now = after(before, builder(before, [], min_isr=1).remove_from_isr(1))
    assert (now.isr, now.leader, now.elr) == ((1,), NO_LEADER, ())


def test_an_unclean_shutdown_moves_a_member_to_the_last_known_elr() -> None:
    before = partition((), NO_LEADER, elr=(2, 1))
    now = after(before, builder(before, [1]).mark_unclean_shutdown(1))
    assert (now.isr, now.leader, now.elr, now.last_known_elr) == ((), NO_LEADER, (2,), (1,))
    # The last ISR member registering uncleanly before its fence is seen: the same.
    before = partition((1,), NO_LEADER)
    now = after(before, builder(before, [1]).remove_from_isr(1).mark_unclean_shutdown(1))
    assert (now.isr, now.leader, now.elr, now.last_known_elr) == ((), NO_LEADER, (), (1,))


def test_an_active_elr_member_is_elected_cleanly_with_an_empty_isr() -> None:
    before = partition((), NO_LEADER, elr=(2, 1), last_known_elr=(3,))
    change = builder(before, [1, 3])
    now = after(before, change)
    assert (now.isr, now.leader, now.elr) == ((1,), 1, (2,)) and not change.unclean
    assert now.leader_epoch == before.leader_epoch + 1


def test_with_neither_isr_nor_elr_the_last_known_elr_waits_for_recovery() -> None:
    before = partition((), NO_LEADER, last_known_elr=(1, 2))
    assert builder(before, [1, 2, 3]).build() is None


def test_unclean_recovery_elects_its_choice_once_active() -> None:
    before = partition((), NO_LEADER, last_known_elr=(1, 2))
    assert builder(before, [1]).set_recovered_leader(2).build() is None
    change = builder(before, [1, 2]).set_recovered_leader(2)
    now = after(before, change)
    assert (now.isr, now.leader, now.elr, now.last_known_elr) == ((2,), 2, (), (1,))
    assert not change.unclean
    # An active ELR member (clean) comes before recovery's choice.
    before = partition((), NO_LEADER, elr=(3,), last_known_elr=(1, 2))
    now = after(before, builder(before, [2, 3]).set_recovered_leader(2))
    assert now.leader == 3


def test_the_isr_back_at_min_isr_clears_both_lists() -> None:
    before = partition((2,), 2, elr=(3,), last_known_elr=(1,))
    now = after(before, builder(before, [1, 2, 3]).set_target_isr((2, 1)))
    assert (now.isr, now.elr, now.last_known_elr) == ((2, 1), (), ())


def test_removal_change_decides_as_the_builder_does() -> None:
    """:func:`removal_change` (a fence's or a shutdown's fast path) gives the builder's
    record wherever it decides, over random partitions, ISRs, ELRs, reassignments, active
    brokers and ``min.insync.replicas``; and it does decide the common case itself."""
    rng = random.Random(22)
    decided = 0
    for _ in range(10_000):
        replicas = tuple(rng.sample(range(6), rng.randint(1, 4)))
        isr = tuple(b for b in replicas if rng.random() < 0.7)
        leader = rng.choice((*isr, NO_LEADER, rng.choice(replicas))) if isr else NO_LEADER
        elr = tuple(b for b in replicas if b not in isr and rng.random() < 0.2)
        last_known = tuple(b for b in replicas if b not in isr + elr and rng.random() < 0.1)
        reassigning = rng.random() < 0.1
        registration = PartitionRegistration(
            replicas=replicas,
            isr=isr,
            leader=leader,
            leader_epoch=3,
            partition_epoch=7,
            adding_replicas=replicas[-1:] if reassigning else (),
            elr=elr,
            last_known_elr=last_known,
        )
        broker = rng.choice((*isr, leader) if isr else replicas)
        active = {b for b in range(6) if b != broker and rng.random() < 0.75}
        min_isr = rng.randint(1, 3)
        fast = removal_change(registration, "topic", 4, broker, active, min_isr)
        if fast is Undecided.BUILDER:
            continue
        decided += 1
        for unclean_allowed in (False, True):
            expected = (
                PartitionChangeBuilder(
                    registration,
                    "topic",
                    4,
                    active.__contains__,
                    unclean_allowed=unclean_allowed,
                    min_isr=min_isr,
                )
                .remove_from_isr(broker)
                .build()
            )
            assert fast == expected, (registration, broker, active, min_isr)
    assert decided > 1_500


def test_removal_change_moves_the_leadership_of_a_broker_shutting_down() -> None:
    # Replicas (1, 2, 3), all in sync, 1 leading and shutting down: 2 leads, 1 leaves.
    fast = removal_change(partition((1, 2, 3), 1), "topic", 0, 1, {2, 3}, 2)
    assert fast == PartitionChangeRecord("topic", 0, isr=(2, 3), leader=2)
    # Below min.insync.replicas the ELR rules apply: the builder decides.
    assert removal_change(partition((1, 2), 1), "topic", 0, 1, {2, 3}, 2) is Undecided.BUILDER
