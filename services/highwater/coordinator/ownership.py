"""Which ``__consumer_offsets`` partitions a coordinator serves, in which coordinator epochs.

The controller assigns each partition to one registered coordinator *incarnation* with a
coordinator epoch; the coordinator appends to it as the idempotent producer of the
partition with producer epoch = coordinator epoch, starting with an epoch marker at
sequence 0 (:mod:`highwater.coordinator.offsets_log`). :class:`PartitionOwnership`
decides, from the metadata image and the session lease, which partitions to take over
and which to stop serving. The service (:mod:`highwater.coordinator.service`) and the
whole-cluster simulation's glue both run it, and only carry its decisions out.

The rule it keeps: **a process takes a partition over at most once in each coordinator
epoch.** A second take-over in the same epoch would restart the producer's sequence at 0
under a producer id and epoch the broker has seen appends from, and the broker refuses
it (OUT_OF_ORDER_SEQUENCE_NUMBER): the partition would stay unserved until the
controller happened to move it. That happens when the coordinator stops serving a
partition that the controller did not take away: its lease lapsed (it could not
heartbeat for the session timeout, but no controller expired its session, for instance
while the quorum had no leader), or taking the partition over or appending to it failed
outright. The image then still assigns the partition to it in the same epoch.

Then the coordinator registers again as a new incarnation (a new incarnation id; the
controller gives every partition a new incarnation keeps the coordinator epoch + 1,
see :mod:`highwater.controller.coordinators`) and takes its partitions over in their new
epochs. The two other ways out are not safe under every fault:

- continuing the old appender's sequence: a batch whose outcome was unknown when the
  partition was dropped may have been appended or not (or still be on its way to the
  broker), so the next sequence is unknown;
- bumping the producer epoch without a new coordinator epoch: the producer epoch *is*
  the coordinator epoch, so the next owner, given epoch + 1 by the controller, would
  append in the same producer epoch as this one and no longer fence it.

A new coordinator epoch fences everything the earlier incarnation may still have in
flight (INVALID_PRODUCER_EPOCH once the new marker is in), exactly as a move to another
coordinator does. It costs a reload of every partition the coordinator keeps, which only
happens after a lapse or a failure.

The controller takes a partition from a live coordinator in two steps (revoked, then
assigned to the next owner: :mod:`highwater.controller.coordinators`), and moves it on only
once this coordinator's heartbeat carries :attr:`PartitionOwnership.applied_offset` at or
past the revocation: the offset of the last image :meth:`~PartitionOwnership.follow` has
acted on, so by then the partition is no longer served here.

Pure: the lease's times are integers of milliseconds the edge passes in, and new
incarnation ids come from the function the edge gives (a random UUID in the service, a
name derived from the seed in the simulation).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from highwater.coordinator.lease import SessionLease
from highwater.metadata.image import MetadataImage


@dataclass(frozen=True, slots=True)
class OwnershipChange:
    """What the edge does after :meth:`PartitionOwnership.follow`: stop serving ``stop``
    (unload), then take over each ``(partition, coordinator epoch)`` of ``take_over``
    (fence, replay, serve)."""

    stop: tuple[int, ...] = ()
    take_over: tuple[tuple[int, int], ...] = ()


class PartitionOwnership:
    """The partitions one coordinator process serves (see the module docstring).

    The edge calls :meth:`follow` with each new image, after :meth:`renew` reports a
    lapsed lease renewed and after :meth:`lost` (it gave a partition up on its own:
    fenced or failed); :meth:`lapse` before serving anything; and it registers
    :attr:`incarnation_id` whenever :attr:`register_again` is set, reporting the answer
    with :meth:`registered`.
    """

    def __init__(
        self,
        coordinator_id: int,
        session_timeout_ms: int,
        new_incarnation_id: Callable[[], str],
    ) -> None:
        self.coordinator_id = coordinator_id
        self.lease = SessionLease(session_timeout_ms)
        self._new_incarnation_id = new_incarnation_id
        self.incarnation_id = new_incarnation_id()
        """The incarnation this process registers, and whose assignments it serves."""
        self.register_again = False
        """A new incarnation id waits to be registered with the controller."""
        self.incarnations = 1
        """How many incarnation ids this process has had."""
        self.serving: dict[int, int] = {}
        """partition -> the coordinator epoch it is taken over (or being taken over) in."""
        self._taken: dict[int, int] = {}
        """partition -> the highest coordinator epoch this process took it over in."""
        self._fenced: dict[int, int] = {}
        """partition -> the highest coordinator epoch a newer owner fenced it in here."""
        self.applied_offset = -1
        """The offset of the last image :meth:`follow` acted on, which the heartbeat
        carries: every partition revoked by then is no longer served."""

    @property
    def lapsed(self) -> bool:
        return self.lease.lapsed

    def follow(self, image: MetadataImage) -> OwnershipChange:
        """Serve what ``image`` assigns to this incarnation, each in its coordinator epoch;
        stop serving the rest. Nothing is taken over while the lease has lapsed, nor in an
        epoch a newer owner fenced (the image has not caught up with the move yet). When
        the image assigns a partition in an epoch it was taken over in before, every
        partition is given up and a new incarnation waits to be registered
        (:attr:`register_again`)."""
        # Whatever the decision below, nothing the image does not assign is served after.
        self.applied_offset = max(self.applied_offset, image.offset)
        if self.lease.lapsed:
            return OwnershipChange()
        wanted = self._assigned(image)
        stop = [p for p, epoch in self.serving.items() if wanted.get(p) != epoch]
        for partition in stop:
            del self.serving[partition]
        for partition, epoch in list(wanted.items()):
            if epoch <= self._fenced.get(partition, -1):
                del wanted[partition]
        again = [
            p
            for p, epoch in wanted.items()
            if p not in self.serving and epoch <= self._taken.get(p, -1)
        ]
        if again:
            stop.extend(self.serving)
            self.serving.clear()
            self.incarnation_id = self._new_incarnation_id()
            self.incarnations += 1
            self.register_again = True
            return OwnershipChange(stop=tuple(stop))
        take_over = tuple(sorted((p, e) for p, e in wanted.items() if p not in self.serving))
        for partition, epoch in take_over:
            self.serving[partition] = epoch
            self._taken[partition] = epoch
        return OwnershipChange(tuple(stop), take_over)

    def lapse(self, now_ms: int) -> tuple[int, ...] | None:
        """Check the lease at ``now_ms``: None while it holds (or had lapsed already);
        when it has just run out, every partition served, to stop serving at once."""
        if not self.lease.lapse(now_ms):
            return None
        stop = tuple(self.serving)
        self.serving.clear()
        return stop

    def renew(self, sent_ms: int) -> bool:
        """A heartbeat or registration sent at ``sent_ms`` was acknowledged. True when the
        lease had lapsed: :meth:`follow` the image again."""
        return self.lease.renew(sent_ms)

    def lost(self, partition: int, epoch: int, *, fenced: bool) -> None:
        """The edge stopped serving ``partition`` in ``epoch`` on its own: a newer owner
        fenced it (``fenced``: the image will move it), or taking it over or appending
        failed (the next :meth:`follow` registers a new incarnation if the image still
        assigns it here in ``epoch``)."""
        if self.serving.get(partition) == epoch:
            del self.serving[partition]
        if fenced:
            self._fenced[partition] = max(epoch, self._fenced.get(partition, -1))

    def registered(self, incarnation_id: str) -> None:
        """The controller acknowledged the registration of ``incarnation_id``."""
        if incarnation_id == self.incarnation_id:
            self.register_again = False

    def _assigned(self, image: MetadataImage) -> dict[int, int]:
        me = image.coordinator(self.coordinator_id)
        if me is None or me.incarnation_id != self.incarnation_id:
            return {}
        return {
            partition: assignment.coordinator_epoch
            for partition, assignment in image.coordinators.assignments.items()
            if assignment.coordinator_id == self.coordinator_id
        }
