"""``MetadataStateMachine``: what every replica of ``__cluster_metadata`` runs on its log.

Controllers and observers alike (brokers, group coordinators, ``highwater observer``) hand
the committed batches of the metadata log to it: it decodes each record and replays it
through a :class:`~highwater.metadata.delta.MetadataLoader`, so the committed
:class:`~highwater.metadata.image.MetadataImage` is the same on every replica. It writes
and loads snapshots: the image's :func:`~highwater.metadata.snapshot.snapshot_values`, as
RecordBatch v2 batches. On the active controller a :class:`Speculation` (its store) hands
over the images it built at append time, so its own batches are not decoded twice.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Final, Protocol

from highwater.errors import CorruptRecordError
from highwater.metadata.delta import MetadataLoader
from highwater.metadata.heap import ImageHeapFreezer
from highwater.metadata.image import MetadataImage
from highwater.metadata.records import decode_record
from highwater.metadata.snapshot import load_snapshot_values, snapshot_values
from highwater.raft.messages import OffsetAndEpoch
from highwater.raft.state_machine import SnapshotReader
from highwater.records import RecordBatch, SimpleRecord, build_batch, iter_batches

__all__ = [
    "ImageListener",
    "MetadataStateMachine",
    "Speculation",
    "decode_snapshot",
    "encode_snapshot",
]

log = logging.getLogger(__name__)

SNAPSHOT_BATCH_RECORDS: Final = 1000
"""Records per RecordBatch in a snapshot file."""


# --- snapshots ------------------------------------------------------------------------------


def encode_snapshot(image: MetadataImage) -> bytes:
    """The snapshot of ``image``: its :func:`snapshot_values` as RecordBatch v2 batches."""
    values = snapshot_values(image)
    out = bytearray()
    for start in range(0, len(values), SNAPSHOT_BATCH_RECORDS):
        chunk = values[start : start + SNAPSHOT_BATCH_RECORDS]
        out += build_batch(
            [SimpleRecord(value=value, timestamp=0) for value in chunk],
            base_offset=start,
            partition_leader_epoch=max(image.epoch, 0),
        )
    return bytes(out)


def decode_snapshot(data: bytes, snapshot_id: OffsetAndEpoch) -> MetadataImage:
    """The image a snapshot holds: as of the entry before ``snapshot_id.offset`` (a
    snapshot id names the end offset it covers)."""
    return load_snapshot_values(
        _values(iter_batches(data)), snapshot_id.offset - 1, snapshot_id.epoch
    )


def _values(batches: Iterable[RecordBatch]) -> list[bytes]:
    """The record values of ``batches``, in order (a metadata record always has one)."""
    values = []
    for batch in batches:
        for record in batch.records():
            if record.value is None:
                raise CorruptRecordError(f"metadata record at offset {record.offset} has no value")
            values.append(record.value)
    return values


# --- the state machine -------------------------------------------------------------------


class Speculation(Protocol):
    """What the state machine asks the active controller's store about committed batches."""

    def image_for_batch(self, batch: RecordBatch, parent: MetadataImage) -> MetadataImage | None:
        """The image ``batch`` makes of ``parent``, if this store built it already."""
        ...

    def on_committed(self, image: MetadataImage) -> None:
        """The committed image moved to ``image``."""
        ...


ImageListener = Callable[[MetadataImage], None]


class MetadataStateMachine:
    """Raft's state machine for ``__cluster_metadata``: committed batches in, images out.

    ``image`` is the image of every committed record applied so far. Listeners added
    with :meth:`add_listener` get each new image (after a batch list or a snapshot).
    """

    def __init__(self, image: MetadataImage | None = None) -> None:
        self._loader = MetadataLoader(image)
        self.speculation: Speculation | None = None
        self._listeners: list[ImageListener] = []
        self._heap = ImageHeapFreezer()

    @property
    def image(self) -> MetadataImage:
        return self._loader.image

    def add_listener(self, listener: ImageListener) -> None:
        self._listeners.append(listener)

    def apply(self, batches: Sequence[RecordBatch], high_watermark: int) -> None:
        """Replay committed data batches (which may leave gaps: control batches take
        offsets too); a batch this replica's store appended takes the image it built."""
        loader = self._loader
        speculation = self.speculation
        for batch in batches:
            known = (
                speculation.image_for_batch(batch, loader.image)
                if speculation is not None
                else None
            )
            if known is not None:
                loader.image = known
                continue
            records = [decode_record(value) for value in _values((batch,))]
            loader.load_batch(batch.base_offset, batch.partition_leader_epoch, records)
        self._published(loader.image)

    def load_snapshot(self, reader: SnapshotReader) -> None:
        """Replace the image by the snapshot's."""
        image = decode_snapshot(reader.read(), reader.snapshot_id)
        self._loader = MetadataLoader(image)
        log.info("loaded the metadata snapshot %s", reader.snapshot_id)
        self._published(image)

    def snapshot(self, snapshot_id: OffsetAndEpoch) -> bytes:
        """The committed image, as the records that recreate it."""
        return encode_snapshot(self._loader.image)

    def _published(self, image: MetadataImage) -> None:
        self._heap.after_publish(image)
        if self.speculation is not None:
            self.speculation.on_committed(image)
        for listener in self._listeners:
            try:
                listener(image)
            except Exception:
                log.exception("a metadata image listener failed")
