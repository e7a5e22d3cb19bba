"""Which ``__consumer_offsets`` partitions a coordinator serves: never one taken over twice in
the same coordinator epoch (issue 20), a lapsed lease, a fence by a newer owner.

The images are replayed from metadata records; the controller's answer to a new incarnation
is the real :func:`~highwater.controller.assign_coordinators` (a new incarnation gets the
partitions it keeps in new epochs)."""

from __future__ import annotations

import itertools

from highwater.controller import assign_coordinators
from highwater.coordinator.ownership import OwnershipChange, PartitionOwnership
from highwater.metadata import (
    NO_LEADER,
    CoordinatorAssignmentRecord,
    MetadataImage,
    RegisterCoordinatorRecord,
    replay,
)

ME, OTHER = 1, 2
SESSION_MS = 1_500


def ownership() -> PartitionOwnership:
    names = (f"inc-{n}" for n in itertools.count())
    return PartitionOwnership(ME, SESSION_MS, lambda: next(names))


def first_image() -> MetadataImage:
    """Partitions 0 and 1 are ``inc-0``'s in epoch 0, partition 2 the other's."""
    return replay(
        [
            RegisterCoordinatorRecord(ME, "inc-0", 0),
            RegisterCoordinatorRecord(OTHER, "other", 1),
            CoordinatorAssignmentRecord(0, ME, 0),
            CoordinatorAssignmentRecord(1, ME, 0),
            CoordinatorAssignmentRecord(2, OTHER, 0),
        ],
        4,
    )


def registered_again(image: MetadataImage, incarnation_id: str) -> MetadataImage:
    """The controller's answer to a registration of ``incarnation_id``: the record, then
    the assignment records the controller writes with it."""
    records = [
        RegisterCoordinatorRecord(ME, incarnation_id, image.offset + 1),
        *assign_coordinators(3, [ME, OTHER], image.coordinators.assignments, restarted=[ME]),
    ]
    return replay(records, image.offset + len(records), image=image)


def test_serves_what_the_image_assigns_to_its_incarnation_in_each_epoch() -> None:
    owner = ownership()
    image = first_image()
    assert owner.follow(image) == OwnershipChange(take_over=((0, 0), (1, 0)))
    assert owner.follow(image) == OwnershipChange()
    moved = replay([CoordinatorAssignmentRecord(1, OTHER, 1)], 5, image=image)
    assert owner.follow(moved) == OwnershipChange(stop=(1,))
    assert owner.serving == {0: 0}
    assert not owner.register_again


def test_an_image_of_another_incarnation_is_not_followed() -> None:
    owner = ownership()
    image = replay([RegisterCoordinatorRecord(ME, "a-process-before", 0)], 0)
    image = replay([CoordinatorAssignmentRecord(0, ME, 3)], 1, image=image)
    assert owner.follow(image) == OwnershipChange()


def test_after_a_lapsed_lease_the_same_epoch_is_taken_over_only_by_a_new_incarnation() -> None:
    """Issue 20: the lease lapsed but no controller expired the session, so the image still
    assigns the partitions here in epoch 0. Taking them over again would restart the
    producer sequence at 0 in producer epoch 0; a new incarnation gets epoch 1 instead."""
    owner = ownership()
    image = first_image()
    assert owner.renew(10_000) is False
    owner.follow(image)
    assert owner.lapse(10_000 + SESSION_MS - 1) is None
    assert owner.lapse(10_000 + SESSION_MS) == (0, 1)
    assert owner.lapse(10_000 + SESSION_MS + 1) is None  # reported once
    assert owner.follow(image) == OwnershipChange()  # lapsed: nothing taken over
    assert owner.renew(12_000) is True
    assert owner.follow(image) == OwnershipChange()
    assert owner.register_again
    assert owner.incarnation_id == "inc-1"
    assert owner.follow(image) == OwnershipChange()  # still waiting for the registration
    owner.registered("inc-1")
    assert not owner.register_again
    image = registered_again(image, "inc-1")
    assert owner.follow(image) == OwnershipChange(take_over=((0, 1), (1, 1)))


def test_a_failed_take_over_gives_every_partition_up_for_a_new_incarnation() -> None:
    """Taking partition 1 over failed (or a resent batch got an error): the image still
    assigns it here in epoch 0. Partition 0, served fine, is given up too: the controller
    gives a new incarnation every partition it keeps in a new epoch."""
    owner = ownership()
    image = first_image()
    owner.follow(image)
    owner.lost(1, 0, fenced=False)
    assert owner.follow(image) == OwnershipChange(stop=(0,))
    assert owner.register_again and owner.serving == {}
    owner.registered("inc-0")  # a late answer for the old incarnation changes nothing
    assert owner.register_again
    owner.registered("inc-1")
    image = registered_again(image, "inc-1")
    assert owner.follow(image) == OwnershipChange(take_over=((0, 1), (1, 1)))
    assert owner.incarnations == 2


def test_a_partition_fenced_by_a_newer_owner_waits_for_the_image_to_move_it() -> None:
    """The newer owner's marker can reach the broker before this coordinator's image has
    the move: the partition is neither taken over again nor a reason to register again."""
    owner = ownership()
    image = first_image()
    owner.follow(image)
    owner.lost(1, 0, fenced=True)
    assert owner.follow(image) == OwnershipChange()
    assert not owner.register_again and owner.serving == {0: 0}
    moved_back = replay([CoordinatorAssignmentRecord(1, OTHER, 1)], 5, image=image)
    moved_back = replay([CoordinatorAssignmentRecord(1, ME, 2)], 6, image=moved_back)
    assert owner.follow(moved_back) == OwnershipChange(take_over=((1, 2),))


def test_the_offset_its_heartbeat_reports_is_of_an_image_acted_on() -> None:
    """The controller gives a partition revoked from this coordinator to its next owner
    once the heartbeat reports an offset at or past the revocation: by then the
    coordinator has stopped serving it (issue 20, seed 1190)."""
    owner = ownership()
    image = first_image()
    assert owner.applied_offset == -1
    owner.follow(image)
    assert owner.applied_offset == image.offset
    revoked = replay(
        [CoordinatorAssignmentRecord(1, NO_LEADER, 1, revoked_from=ME)], 5, image=image
    )
    assert owner.follow(revoked) == OwnershipChange(stop=(1,))
    assert owner.applied_offset == 5 and owner.serving == {0: 0}
    # Given back to it (the other coordinator left meanwhile), in a new epoch.
    back = replay([CoordinatorAssignmentRecord(1, ME, 2)], 6, image=revoked)
    assert owner.follow(back) == OwnershipChange(take_over=((1, 2),))
