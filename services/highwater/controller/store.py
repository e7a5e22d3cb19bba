"""The seam between the quorum controller and the store of the metadata log (``MetadataStore``).

The controller's decisions need exactly two things from the store: the image of every
record written so far, and a way to append a batch of records atomically. Brokers need
one: the committed records, in order, which they replay with
:class:`~highwater.metadata.delta.MetadataLoader`. Raft over ``__cluster_metadata`` is
the store Highwater ships (KRaft); anything that offers the same contract could replace
it without touching brokers or the controller's logic. An etcd-backed store, say:

* ``append`` is one etcd transaction that puts the encoded records under consecutive
  keys ``/metadata/<offset>``, guarded by ``mod_revision`` of the last key (so two
  would-be controllers cannot both append) and by the controller's election lease
  (etcd's ``concurrency.Election``); the offsets are the store's, not etcd revisions;
* ``latest_image`` is the image the active controller keeps by replaying what it
  appended (it is the only writer while it holds the lease);
* brokers ``watch`` the ``/metadata/`` prefix from the offset after their image and feed
  each transaction's records to ``MetadataLoader.load_batch``; snapshots are a key
  holding :func:`~highwater.metadata.snapshot.snapshot_values` at an offset, after which
  older keys are compacted away.

The I/O layer around :class:`~highwater.controller.quorum_controller.QuorumController`
runs requests one at a time: ``result = controller.create_topics(...)``, then
``offset = store.append(result.records)`` (which must apply them to ``latest_image``
before the next request runs; the next request does not wait for this one to commit,
and a store may write the records of several requests as one batch), then, once
``store.committed_offset() >= offset``, it answers with ``result.response``. If
appending fails because this node is no longer the active controller, it answers
NOT_CONTROLLER and the store drops the uncommitted records from its latest image (back
to the committed one).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from highwater.errors import HighwaterError
from highwater.metadata.delta import MetadataDelta
from highwater.metadata.image import MetadataImage
from highwater.metadata.records import MetadataRecord
from highwater.v1.common_pb2 import ErrorCode


class NotControllerError(HighwaterError):
    """This node is not the active controller; ``controller_id`` is the one that is, if known."""

    code = ErrorCode.NOT_CONTROLLER

    def __init__(self, controller_id: int = -1, message: str = "") -> None:
        super().__init__(message or f"not the active controller (active: {controller_id})")
        self.controller_id = controller_id


class MetadataStore(Protocol):
    """The metadata log as the active controller sees it."""

    def latest_image(self) -> MetadataImage:
        """The image of every record appended so far, committed or not."""
        ...

    def committed_offset(self) -> int:
        """The offset of the last committed record (-1: none)."""
        ...

    def append(self, records: Sequence[MetadataRecord]) -> int:
        """Append ``records`` atomically, all or none, at consecutive offsets after
        ``latest_image().offset``; returns the offset of the last one.

        Raises :class:`NotControllerError` when this node may not write.
        """
        ...


class InMemoryMetadataStore:
    """A :class:`MetadataStore` in memory that commits what it appends at once.

    For tests and for a single-node setup without durability. Keeps every record, so
    tests can replay the whole log.
    """

    def __init__(self, image: MetadataImage | None = None, epoch: int = 0) -> None:
        self._image = image if image is not None else MetadataImage.empty()
        self.epoch = epoch
        self.records: list[MetadataRecord] = []
        self.batches: list[tuple[int, list[MetadataRecord]]] = []

    def latest_image(self) -> MetadataImage:
        return self._image

    def committed_offset(self) -> int:
        return self._image.offset

    def append(self, records: Sequence[MetadataRecord]) -> int:
        if not records:
            return self._image.offset
        base_offset = self._image.offset + 1
        batch = list(records)
        delta = MetadataDelta(self._image).replay_all(batch)
        self._image = delta.apply(base_offset + len(batch) - 1, self.epoch)
        self.records.extend(batch)
        self.batches.append((base_offset, batch))
        return self._image.offset
