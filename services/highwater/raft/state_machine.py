"""The seam between the replicated log and what it replicates: the state machine's protocol.

The driver (:class:`~highwater.raft.driver.RaftServer`) hands a :class:`StateMachine` the
committed data batches in offset order, loads a snapshot into it when the replica starts
from one or falls behind the leader's log start, and asks it for a snapshot of its state
every ``metadata.log.max.record.bytes.between.snapshots`` bytes applied (Kafka's
``RaftClient.Listener``). Role listeners hear of each change of role, epoch or leader.
Nothing here knows what the entries mean: the metadata image is one state machine
(:mod:`highwater.metadata.state_machine`), a test's list of entries another.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from highwater.raft.messages import OffsetAndEpoch
from highwater.raft.node import RoleChange
from highwater.records import RecordBatch

__all__ = ["RoleListener", "SnapshotReader", "StateMachine"]


@dataclass(frozen=True, slots=True)
class SnapshotReader:
    """A snapshot handed to :meth:`StateMachine.load_snapshot`: its id and its bytes."""

    snapshot_id: OffsetAndEpoch
    data: bytes

    def read(self) -> bytes:
        return self.data


class StateMachine(Protocol):
    """What the driver hands committed entries to (Kafka's ``RaftClient.Listener``)."""

    def apply(self, batches: Sequence[RecordBatch], high_watermark: int) -> None:
        """Committed data batches, in offset order (control batches are left out)."""
        ...

    def load_snapshot(self, reader: SnapshotReader) -> None:
        """Replace the whole state with a snapshot's; batches after it follow."""
        ...

    def snapshot(self, snapshot_id: OffsetAndEpoch) -> bytes:
        """The state as of ``snapshot_id.offset`` (everything applied so far), as bytes."""
        ...


RoleListener = Callable[[RoleChange], None]
"""Told of every change of role, epoch or leader the node reports, in order."""
