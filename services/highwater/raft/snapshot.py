"""Snapshots of the replicated state machine: the ``SnapshotStore`` protocol and an in-memory store.

A snapshot is named by the end offset and epoch of the log prefix it replaces
(:class:`~highwater.raft.messages.OffsetAndEpoch`), as in KIP-630. The state machine
writes its own snapshots (:meth:`SnapshotStore.write`); a follower too far behind the
leader's log start receives the leader's latest one in chunks (``FetchSnapshot``):
``begin_receive``, ``receive_chunk`` for each chunk in order, ``finish_receive``. A
snapshot is durable, and visible to readers, only once written or finished.
"""

from __future__ import annotations

from typing import Protocol

from highwater.errors import HighwaterError
from highwater.raft.messages import OffsetAndEpoch
from highwater.v1.common_pb2 import ErrorCode

__all__ = [
    "InMemorySnapshotStore",
    "PositionOutOfRangeError",
    "SnapshotNotFoundError",
    "SnapshotStore",
]


class SnapshotNotFoundError(HighwaterError):
    """No snapshot with that id (it was never taken, or a newer one replaced it)."""

    code = ErrorCode.SNAPSHOT_NOT_FOUND


class PositionOutOfRangeError(HighwaterError):
    """A chunk position outside the snapshot, or not where the received bytes end."""

    code = ErrorCode.POSITION_OUT_OF_RANGE


class SnapshotStore(Protocol):
    """Where a replica keeps its snapshots; the storage engine implements the same."""

    def latest(self) -> OffsetAndEpoch | None:
        """The id of the newest snapshot (the largest end offset), if any."""
        ...

    def read_chunk(
        self, snapshot_id: OffsetAndEpoch, position: int, max_bytes: int
    ) -> tuple[bytes, int]:
        """Up to ``max_bytes`` of the snapshot from ``position``, and its total size.

        Raises :class:`SnapshotNotFoundError` or :class:`PositionOutOfRangeError`.
        """
        ...

    def write(self, snapshot_id: OffsetAndEpoch, data: bytes) -> None:
        """Store the state machine's snapshot of the log up to ``snapshot_id``, durably."""
        ...

    def begin_receive(self, snapshot_id: OffsetAndEpoch) -> None:
        """Start receiving a snapshot from the leader (dropping any partial one)."""
        ...

    def receive_chunk(self, position: int, data: bytes) -> None:
        """Add the chunk at ``position``, which must be where the received bytes end."""
        ...

    def finish_receive(self) -> OffsetAndEpoch:
        """Make the received snapshot durable and visible; its id."""
        ...

    def snapshots(self) -> list[OffsetAndEpoch]:
        """The ids of the stored snapshots, oldest first."""
        ...

    def delete_before(self, snapshot_id: OffsetAndEpoch) -> None:
        """Delete the snapshots older than ``snapshot_id`` (which is kept)."""
        ...


class InMemorySnapshotStore:
    """A :class:`SnapshotStore` in memory, for unit tests and the simulation.

    Everything stored survives a simulated crash; a partial receive does not
    (:meth:`crash`).
    """

    def __init__(self) -> None:
        self._snapshots: dict[OffsetAndEpoch, bytes] = {}
        self._receiving: tuple[OffsetAndEpoch, bytearray] | None = None

    def latest(self) -> OffsetAndEpoch | None:
        if not self._snapshots:
            return None
        return max(self._snapshots, key=_order)

    def read_chunk(
        self, snapshot_id: OffsetAndEpoch, position: int, max_bytes: int
    ) -> tuple[bytes, int]:
        data = self._snapshots.get(snapshot_id)
        if data is None:
            raise SnapshotNotFoundError(f"no snapshot {snapshot_id}")
        if not 0 <= position <= len(data):
            raise PositionOutOfRangeError(
                f"position {position} is outside snapshot {snapshot_id} of {len(data)} bytes"
            )
        return data[position : position + max_bytes], len(data)

    def read(self, snapshot_id: OffsetAndEpoch) -> bytes:
        """The whole snapshot (what the state machine loads)."""
        data = self._snapshots.get(snapshot_id)
        if data is None:
            raise SnapshotNotFoundError(f"no snapshot {snapshot_id}")
        return data

    def write(self, snapshot_id: OffsetAndEpoch, data: bytes) -> None:
        self._snapshots[snapshot_id] = bytes(data)

    def begin_receive(self, snapshot_id: OffsetAndEpoch) -> None:
        self._receiving = (snapshot_id, bytearray())

    def receive_chunk(self, position: int, data: bytes) -> None:
        if self._receiving is None:
            raise RuntimeError("no snapshot is being received")
        snapshot_id, received = self._receiving
        if position != len(received):
            raise PositionOutOfRangeError(
                f"chunk at {position} of snapshot {snapshot_id}, {len(received)} bytes received"
            )
        received += data

    def finish_receive(self) -> OffsetAndEpoch:
        if self._receiving is None:
            raise RuntimeError("no snapshot is being received")
        snapshot_id, received = self._receiving
        self._receiving = None
        self._snapshots[snapshot_id] = bytes(received)
        return snapshot_id

    def snapshots(self) -> list[OffsetAndEpoch]:
        return sorted(self._snapshots, key=_order)

    def delete_before(self, snapshot_id: OffsetAndEpoch) -> None:
        for old in [s for s in self._snapshots if _order(s) < _order(snapshot_id)]:
            del self._snapshots[old]

    def crash(self) -> None:
        """Simulate a crash: a snapshot being received is lost, stored ones are not."""
        self._receiving = None


def _order(snapshot_id: OffsetAndEpoch) -> tuple[int, int]:
    return snapshot_id.offset, snapshot_id.epoch
