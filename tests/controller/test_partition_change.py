"""The partition change builder's KIP-966 rules, case by case, on one partition of
replicas (1, 2, 3) with ``min.insync.replicas`` 2 (the ELR in use) or 1 (not)."""

from __future__ import annotations

from collections.abc import Iterable

from highwater.controller.partition_change import PartitionChangeBuilder
from highwater.metadata import NO_LEADER, PartitionRegistration


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
