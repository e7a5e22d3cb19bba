"""The etcd side of the etcd → KRaft migration: runs the driver's etcd effects as transactions.

:class:`MigrationStore` reads the cluster's keys into an
:class:`~highwater.etcd_metadata.migration.EtcdSnapshot`, claims the controller key for the
KRaft controller (:class:`~highwater.etcd_metadata.migration.ClaimEtcdController`) and
writes dual-write state (:class:`~highwater.etcd_metadata.migration.WriteEtcdState`).

The claim overwrites the ``controller`` key even while an etcd-mode controller holds it (the
KIP-866 takeover): it compares ``controller_epoch`` with the epoch the driver read, so it wins
only over the controller it saw; the deposed candidate sees a claim that is not its own and
resigns, and no candidate campaigns while the key (leased by the KRaft controller) exists.
Every state write compares ``controller_epoch`` with the claimed one, so a write after a
newer claim fails instead of overwriting it.
"""

from __future__ import annotations

import json

from highwater.etcd_metadata.connection import Compare, Delete, EtcdConnection, Put
from highwater.etcd_metadata.keys import KeySpace, partition_state_value
from highwater.etcd_metadata.migration import ClaimEtcdController, EtcdSnapshot, WriteEtcdState

__all__ = ["MigrationStore"]


class MigrationStore:
    """The migrating KRaft controller's view of etcd, as controller ``node_id`` at
    ``address``; a claim lives as long as the lease it is
    given."""

    def __init__(
        self, connection: EtcdConnection, space: KeySpace, node_id: int, address: str
    ) -> None:
        self.connection = connection
        self.space = space
        self.node_id = node_id
        self.address = address

    async def read(self) -> EtcdSnapshot:
        revision, keys = await self.connection.get_prefix(self.space.prefix)
        return EtcdSnapshot({key: kv.value for key, kv in keys.items()}, revision)

    async def claim(self, effect: ClaimEtcdController, lease_id: int) -> bool:
        claim = {"broker_id": self.node_id, "address": self.address, "epoch": effect.epoch}
        result = await self.connection.txn(
            [Compare(self.space.controller_epoch, "value", str(effect.expected).encode())]
            if effect.expected
            else [Compare(self.space.controller_epoch, "create", 0)],
            [
                Put(self.space.controller, json.dumps(claim).encode(), lease_id),
                Put(self.space.controller_epoch, str(effect.epoch).encode()),
            ],
        )
        return result.succeeded

    async def write_state(self, effect: WriteEtcdState, *, metadata_offset: int = -1) -> bool:
        """False when a newer controller epoch fenced this write (nothing was written).
        ``metadata_offset`` (if not -1) goes to etcd's ``metadata_offset`` counter in the
        same transaction, so that an etcd-mode controller after a rollback numbers its
        images (and broker epochs) after the migrated ones."""
        epoch = effect.controller_epoch
        puts = [
            Put(key, partition_state_value(value, epoch) if key.endswith("/state") else value)
            for key, value in sorted(effect.puts.items())
        ]
        if metadata_offset >= 0:
            puts.append(Put(self.space.metadata_offset, str(metadata_offset).encode()))
        deletes = [Delete(key) for key in sorted(effect.deletes)]
        result = await self.connection.txn(
            [Compare(self.space.controller_epoch, "value", str(epoch).encode())],
            [*puts, *deletes],
        )
        return result.succeeded
