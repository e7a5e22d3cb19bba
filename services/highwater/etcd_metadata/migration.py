"""The migration of a cluster from etcd mode to KRaft: the active KRaft controller's driver (pure).

Kafka's KIP-866 moves a ZooKeeper cluster to KRaft with a controller quorum started in
migration mode; this is the same idea over the etcd key layout of :mod:`.keys`. The driver is
a state machine, events in and effects out; the controller service runs its effects (etcd
transactions, Raft proposals, UpdateMetadata pushes) and feeds back their outcome::

    WAITING_FOR_LEADER   this controller is not the quorum's leader: nothing to do
        | became leader
    WAITING_FOR_BROKERS  read etcd; wait until every broker registered there is alive
        | every registered etcd broker has a live brokers/ids key
    CLAIMING             ClaimEtcdController(epoch + 1): a compare-and-swap on controller_epoch
        | claimed                   (lost: read etcd again and retry with the newer epoch)
    COPYING              ProposeMigrationBatch: the state keys as one batch of records
        | batch committed
    DUAL_WRITE           every committed image: WriteEtcdState (fenced by the claimed epoch) and
                         PushImage to the brokers still in etcd mode
        | the last etcd broker registered with the quorum
    ENDING               ProposeMigrationEnd; the record marks the migration over
        | end committed
    ENDED                etcd is never written again

The claim comes before the copy (KIP-866's "the KRaft controller becomes the ZooKeeper
controller" first): once the epoch is raised no etcd-mode candidate can write a state key
(their writes compare the epoch), so the keys the copy reads cannot change under it. The
cluster id is the one under ``cluster_id`` in etcd, never a new one. A loss of leadership at
any point returns to WAITING_FOR_LEADER; the next leader starts over from the log (a
committed batch is not copied twice: :meth:`MigrationDriver.log_replayed`).
"""

from __future__ import annotations

import dataclasses
import enum
import json
from collections.abc import Mapping
from dataclasses import dataclass

from highwater.errors import HighwaterError
from highwater.etcd_metadata.keys import KeySpace, StateKeys, image_keys, records_from_keys
from highwater.metadata.image import MetadataImage, MigrationImage
from highwater.metadata.records import MetadataRecord, MigrationStateRecord
from highwater.v1.common_pb2 import ErrorCode

__all__ = [
    "ClaimEtcdController",
    "EtcdSnapshot",
    "MigrationDriver",
    "MigrationEffect",
    "MigrationError",
    "MigrationState",
    "ProposeMigrationBatch",
    "ProposeMigrationEnd",
    "PushImage",
    "WriteEtcdState",
]


class MigrationError(HighwaterError):
    """The etcd cluster cannot be migrated as it is (no cluster id, a broken key)."""

    code = ErrorCode.INVALID_REQUEST


class MigrationState(enum.Enum):
    WAITING_FOR_LEADER = "waiting-for-leader"
    WAITING_FOR_BROKERS = "waiting-for-brokers"
    CLAIMING = "claiming"
    COPYING = "copying"
    DUAL_WRITE = "dual-write"
    ENDING = "ending"
    ENDED = "ended"


@dataclass(frozen=True, slots=True)
class EtcdSnapshot:
    """One consistent read of the cluster's keys (a range read at one etcd revision)."""

    keys: Mapping[str, bytes]
    revision: int

    def cluster_id(self, space: KeySpace) -> str | None:
        value = self.keys.get(space.cluster_id)
        return value.decode() if value else None

    def controller_epoch(self, space: KeySpace) -> int:
        value = self.keys.get(space.controller_epoch)
        return int(value) if value else 0

    def metadata_offset(self, space: KeySpace) -> int:
        """etcd mode's image offset (its ``metadata_offset`` counter); -1 if none."""
        value = self.keys.get(space.metadata_offset)
        return int(value) if value else -1

    def registered_brokers(self, space: KeySpace) -> frozenset[int]:
        """Brokers with a registration record: the ones the migration waits for."""
        prefix = space.prefix + "brokers/registrations/"
        return frozenset(
            int(key[len(prefix) :])
            for key in self.keys
            if key.startswith(prefix) and key[len(prefix) :].isdigit()
        )

    def live_brokers(self, space: KeySpace) -> frozenset[int]:
        """Brokers whose leased ``brokers/ids`` key exists: alive now."""
        ids = (space.broker_id_of(key) for key in self.keys)
        return frozenset(b for b in ids if b is not None)


@dataclass(frozen=True, slots=True)
class ClaimEtcdController:
    """Set ``controller_epoch`` to ``epoch`` and the ``controller`` key to this controller if
    and only if ``controller_epoch`` is still ``expected``."""

    expected: int
    epoch: int


@dataclass(frozen=True, slots=True)
class ProposeMigrationBatch:
    """Append ``records`` to the metadata log as one atomic batch (the last is the
    MIGRATING :class:`~highwater.metadata.records.MigrationStateRecord`)."""

    cluster_id: str
    records: tuple[MetadataRecord, ...]


@dataclass(frozen=True, slots=True)
class WriteEtcdState:
    """Put ``puts`` and delete ``deletes`` in one transaction guarded by ``controller_epoch``
    (a partition state is stamped with it: :func:`.keys.partition_state_value`)."""

    controller_epoch: int
    puts: StateKeys
    deletes: frozenset[str]


@dataclass(frozen=True, slots=True)
class PushImage:
    """Send UpdateMetadata with ``image`` to ``brokers`` (those still in etcd mode)."""

    image: MetadataImage
    brokers: frozenset[int]
    controller_epoch: int


@dataclass(frozen=True, slots=True)
class ProposeMigrationEnd:
    """Append the record that marks the migration over (:meth:`MigrationDriver.end_record`)."""


MigrationEffect = (
    ClaimEtcdController | ProposeMigrationBatch | WriteEtcdState | PushImage | ProposeMigrationEnd
)


class MigrationDriver:
    """The migration as seen by one KRaft controller; every method returns the effects to run."""

    def __init__(self, space: KeySpace) -> None:
        self.space = space
        self.state = MigrationState.WAITING_FOR_LEADER
        self.controller_epoch = 0
        self.cluster_id: str | None = None
        self._migrated_in_log = False
        self._ended_in_log = False
        self._etcd_brokers: frozenset[int] = frozenset()
        self._kraft_brokers: frozenset[int] = frozenset()
        self._written: StateKeys = {}
        self._snapshot: EtcdSnapshot | None = None

    # --- The log and leadership ----------------------------------------------------------

    def log_replayed(self, migrated: bool, ended: bool) -> None:
        """What the committed log already says: the batch copied, the migration ended."""
        self._migrated_in_log = migrated or ended
        self._ended_in_log = ended
        if ended:
            self.state = MigrationState.ENDED

    def leadership_changed(self, is_leader: bool) -> list[MigrationEffect]:
        if self.state is MigrationState.ENDED:
            return []
        if not is_leader:
            self.state = MigrationState.WAITING_FOR_LEADER
            self._written = {}
            return []
        if self.state is MigrationState.WAITING_FOR_LEADER:
            self.state = MigrationState.WAITING_FOR_BROKERS
        return []

    # --- etcd ----------------------------------------------------------------------------

    def etcd_read(self, snapshot: EtcdSnapshot) -> list[MigrationEffect]:
        """A fresh read of etcd: while waiting, claim once every registered broker is alive
        (before the copy: none is left behind unseen; once the log holds the copy, at once,
        since a broker that moved to the quorum is never alive in etcd again); while
        claiming, copy once the read shows our claim."""
        space = self.space
        if self.state is MigrationState.WAITING_FOR_BROKERS:
            cluster_id = snapshot.cluster_id(space)
            if cluster_id is None:
                raise MigrationError(f"etcd has no {space.cluster_id}: not an etcd-mode cluster")
            self.cluster_id = cluster_id
            self._etcd_brokers = snapshot.registered_brokers(space)
            all_alive = self._etcd_brokers and self._etcd_brokers <= snapshot.live_brokers(space)
            if not self._migrated_in_log and not all_alive:
                return []
            expected = snapshot.controller_epoch(space)
            self.state = MigrationState.CLAIMING
            return [ClaimEtcdController(expected=expected, epoch=expected + 1)]
        return []

    def claim_result(self, claimed: bool, snapshot: EtcdSnapshot) -> list[MigrationEffect]:
        """The outcome of :class:`ClaimEtcdController`, with etcd read after it."""
        if self.state is not MigrationState.CLAIMING:
            return []
        if not claimed:
            # An etcd-mode controller moved the epoch in between: wait and claim again.
            self.state = MigrationState.WAITING_FOR_BROKERS
            return self.etcd_read(snapshot)
        self.controller_epoch = snapshot.controller_epoch(self.space)
        self._snapshot = snapshot
        if self._migrated_in_log:
            # A previous leader copied already: straight to dual write, writing only the
            # keys that differ from what etcd holds.
            self.state = MigrationState.DUAL_WRITE
            self._written = {k: v for k, v in snapshot.keys.items() if self.space.is_state(k)}
            return []
        try:
            records = records_from_keys(snapshot.keys, self.space)
        except HighwaterError as e:
            raise MigrationError(f"etcd cannot be copied: {e}") from e
        self.state = MigrationState.COPYING
        assert self.cluster_id is not None
        marker = MigrationStateRecord(
            MigrationStateRecord.MIGRATING, max(snapshot.metadata_offset(self.space), 0)
        )
        return [ProposeMigrationBatch(self.cluster_id, (*records, marker))]

    # --- The metadata log ----------------------------------------------------------------

    def batch_committed(self, image: MetadataImage) -> list[MigrationEffect]:
        """The migration batch is committed; ``image`` is the log's image after it."""
        self._migrated_in_log = True
        if self.state is not MigrationState.COPYING:
            return []
        self.state = MigrationState.DUAL_WRITE
        assert self._snapshot is not None
        self._written = {
            key: value for key, value in self._snapshot.keys.items() if self.space.is_state(key)
        }
        return self.image_committed(image) + self._end_if_all_moved()

    def image_committed(self, image: MetadataImage) -> list[MigrationEffect]:
        """A newer committed image: in dual write, mirror it to etcd and to etcd brokers."""
        if self.state is not MigrationState.DUAL_WRITE:
            return []
        effects: list[MigrationEffect] = []
        # etcd mode has no key for the migration's own state.
        keys = image_keys(dataclasses.replace(image, migration=MigrationImage()), self.space)
        puts = {k: v for k, v in keys.items() if self._written_value(k) != v}
        deletes = frozenset(self._written) - frozenset(keys)
        if puts or deletes:
            effects.append(WriteEtcdState(self.controller_epoch, puts, deletes))
            self._written = dict(keys)
        remaining = self.etcd_mode_brokers
        if remaining:
            effects.append(PushImage(image, remaining, self.controller_epoch))
        return effects

    def _written_value(self, key: str) -> bytes | None:
        value = self._written.get(key)
        if value is None or "/partitions/" not in key:
            return value
        # Partition states in etcd carry the writer's controller epoch; compare without it.
        fields = json.loads(value)
        fields.pop("controller_epoch", None)
        return json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()

    def broker_registered(self, broker_id: int) -> list[MigrationEffect]:
        """A broker registered with the quorum (restarted with ``--controllers``)."""
        self._kraft_brokers = self._kraft_brokers | {broker_id}
        return self._end_if_all_moved()

    def _end_if_all_moved(self) -> list[MigrationEffect]:
        if self.state is MigrationState.DUAL_WRITE and not self.etcd_mode_brokers:
            self.state = MigrationState.ENDING
            return [ProposeMigrationEnd()]
        return []

    @staticmethod
    def end_record(image: MetadataImage) -> MigrationStateRecord:
        """The record :class:`ProposeMigrationEnd` appends, on the committed ``image``."""
        migration = image.migration
        return MigrationStateRecord(
            MigrationStateRecord.ENDED, migration.etcd_metadata_offset, migration.copied_offset
        )

    def end_committed(self) -> list[MigrationEffect]:
        self._ended_in_log = True
        self.state = MigrationState.ENDED
        self._written = {}
        return []

    @property
    def etcd_mode_brokers(self) -> frozenset[int]:
        """Brokers registered in etcd that have not yet registered with the quorum."""
        return self._etcd_brokers - self._kraft_brokers

    @property
    def writes_etcd(self) -> bool:
        return self.state is MigrationState.DUAL_WRITE
