"""What the etcd-mode controller pushes to whom: what changed since a node's image, or all of it.

ZooKeeper-era Kafka's controller sent LeaderAndIsr and UpdateMetadata with only the
partitions that changed, and the whole state only to a broker that had just started. This
is that choice, pure (no I/O): the controller tells :class:`DeltaPushes` each change it made
(:meth:`~DeltaPushes.changed`: the encoded records that took its image from one offset to
the next) and what each node acknowledged holding (:meth:`~DeltaPushes.acknowledged`), and
asks :meth:`~DeltaPushes.plan` what to send a node now:

* nothing, when the node acknowledged the controller's current image;
* a :class:`DeltaPush`, the records made since the node's acknowledged offset, when
  :class:`PushHistory` still holds an unbroken chain of changes from there;
* a :class:`FullPush` otherwise: a node never pushed to in this controller epoch (a new
  controller clears every acknowledgement: :meth:`~DeltaPushes.clear`), a node that
  (re)registered (:meth:`~DeltaPushes.forget`), a node that answered that it could not
  apply a delta (its image was not of the delta's base: a lost push, a restart), a base
  older than the history, or an image the controller loaded from etcd rather than made by
  records (:meth:`~DeltaPushes.reset`: it has no records from the old image to it).

An acknowledgement is only trusted for an image of this controller's epoch: offsets are
etcd's ``metadata_offset`` counter, but two controllers' images of one offset may differ
(a change split over several transactions that failed half-way), so a node's image from
another epoch is replaced whole. The node's side of the contract is
:meth:`~highwater.etcd_metadata.pushed.PushedMetadata.accept_delta`: a delta applies only
to an image of exactly its base offset and controller epoch.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["DeltaPush", "DeltaPushes", "FullPush", "PushHistory"]

DEFAULT_MAX_HISTORY_RECORDS = 100_000
"""How many records of recent changes the controller keeps for deltas: a node further
behind is sent the whole image."""


@dataclass(frozen=True, slots=True)
class FullPush:
    """Send the whole image of ``offset``."""

    offset: int


@dataclass(frozen=True, slots=True)
class DeltaPush:
    """Send ``records``: the encoded records that take an image of ``base_offset`` to
    ``offset``."""

    base_offset: int
    offset: int
    records: tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class _Change:
    offset: int
    records: tuple[bytes, ...]


class PushHistory:
    """The controller's recent changes as a chain: for each base offset, the offset it led
    to and the records that did it; at most ``max_records`` records (oldest dropped)."""

    def __init__(self, offset: int = -1, max_records: int = DEFAULT_MAX_HISTORY_RECORDS) -> None:
        if max_records < 0:
            raise ValueError(f"max_records must be at least 0, not {max_records}")
        self.max_records = max_records
        self._changes: OrderedDict[int, _Change] = OrderedDict()
        self._records = 0
        self.oldest = offset
        """The oldest offset a delta can start from."""
        self.newest = offset
        """The offset of the controller's current image."""

    def __len__(self) -> int:
        """Records held."""
        return self._records

    def reset(self, offset: int) -> None:
        """The controller's image is now of ``offset`` without records from the last one:
        no delta reaches it from an older offset."""
        self._changes.clear()
        self._records = 0
        self.oldest = self.newest = offset

    def append(self, base_offset: int, offset: int, records: Sequence[bytes]) -> None:
        """The image went from ``base_offset`` to ``offset`` by ``records``."""
        if offset <= base_offset:
            raise ValueError(f"a change must advance the offset: {base_offset} to {offset}")
        if base_offset != self.newest:
            self.reset(base_offset)  # not a continuation of the chain: start a new one
        self._changes[base_offset] = _Change(offset, tuple(records))
        self._records += len(records)
        self.newest = offset
        while self._records > self.max_records and self._changes:
            _, dropped = self._changes.popitem(last=False)
            self._records -= len(dropped.records)
            self.oldest = dropped.offset

    def since(self, base_offset: int) -> tuple[bytes, ...] | None:
        """The records from ``base_offset`` to the newest image, or None when the chain
        does not reach back there (an offset it never passed through, or dropped)."""
        if not self.oldest <= base_offset <= self.newest:
            return None
        records: list[bytes] = []
        at = base_offset
        while at != self.newest:
            change = self._changes.get(at)
            if change is None:
                return None
            records.extend(change.records)
            at = change.offset
        return tuple(records)


class DeltaPushes:
    """The per-node acknowledged image and the history of changes: what to push to whom
    (see the module docstring). Nodes are named by the address pushed to."""

    def __init__(self, offset: int = -1, max_records: int = DEFAULT_MAX_HISTORY_RECORDS) -> None:
        self.history = PushHistory(offset, max_records)
        self._acknowledged: dict[str, int] = {}

    @property
    def offset(self) -> int:
        """The offset of the controller's current image."""
        return self.history.newest

    def acknowledged_offset(self, address: str) -> int | None:
        """The offset of the image ``address`` holds from this controller epoch, if known."""
        return self._acknowledged.get(address)

    def changed(self, base_offset: int, offset: int, records: Sequence[bytes]) -> None:
        """The controller's image went from ``base_offset`` to ``offset`` by ``records``."""
        self.history.append(base_offset, offset, records)

    def reset(self, offset: int) -> None:
        """The controller's image of ``offset`` was loaded, not made by records: every node
        is sent the whole image next (its image of an equal offset may differ)."""
        self.history.reset(offset)
        self._acknowledged.clear()

    def clear(self, offset: int) -> None:
        """A new controller epoch, with an image of ``offset``: every node is sent the whole
        image next."""
        self.reset(offset)

    def forget(self, address: str) -> None:
        """``address`` (re)registered: send it the whole image next."""
        self._acknowledged.pop(address, None)

    def acknowledged(
        self, address: str, *, image_offset: int, image_epoch: int, controller_epoch: int
    ) -> None:
        """``address`` answered a push: it holds an image of ``image_offset`` built in
        controller epoch ``image_epoch``; only one of this controller's epoch is a base."""
        if image_epoch == controller_epoch and image_offset >= 0:
            self._acknowledged[address] = image_offset
        else:
            self._acknowledged.pop(address, None)

    def plan(self, address: str) -> FullPush | DeltaPush | None:
        """What to push to ``address`` now (None: it holds the current image)."""
        newest = self.history.newest
        base = self._acknowledged.get(address)
        if base == newest:
            return None
        if base is not None:
            records = self.history.since(base)
            if records is not None:
                return DeltaPush(base, newest, records)
        return FullPush(newest)
