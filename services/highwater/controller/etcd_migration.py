"""The etcd → KRaft migration on the active KRaft controller: the driver's effects, run.

``highwater controller ... --migration-from etcd://H:P[/CLUSTER]`` gives the controller
process an :class:`EtcdMigration`. It runs the pure
:class:`~highwater.etcd_metadata.migration.MigrationDriver` on whichever voter is the
active controller, in rounds (every ``poll_interval_s``):

* **leadership**: only the active controller acts; a voter that becomes active starts from
  what the committed log says (``MetadataImage.migration``: nothing copied yet, copied and
  dual writing, or ended), so a failover resumes the migration instead of copying twice.
* **etcd**: reads of the cluster's prefix, the claim of the ``controller`` key (leased
  by this process's :class:`~highwater.etcd_metadata.session.EtcdSession`) and the dual
  writes, through :class:`~highwater.etcd_metadata.migration_store.MigrationStore`. A
  write fenced by a newer controller epoch, or a read showing the claim is no longer ours
  (a newer epoch, or the ``controller`` key gone with our lease though the epoch stayed),
  starts the migration over from the claim, on a new lease, at the next round.
* **the log**: the copy is one batch appended through the controller's worker
  (``propose``: the same queue and group commit as every request), closed by the MIGRATING
  :class:`~highwater.metadata.records.MigrationStateRecord`; the end is the ENDED one.
* **pushes**: while dual writing, every committed image goes to the brokers (and
  coordinators) still in etcd mode as ``BrokerMetadata.UpdateMetadata`` with the claimed
  controller epoch, as etcd mode's controller pushes them
  (:mod:`highwater.etcd_metadata.pushed`). Their image offsets continue etcd's: the push
  of KRaft offset ``o`` says ``etcd_metadata_offset + 1 + o``, so a broker's pushed image
  only moves forward.

Brokers in etcd mode need nothing new: their controller calls (heartbeats, the liveness
stream, AlterPartition, controlled shutdown) go to their own process's etcd controller
candidate, which answers NOT_CONTROLLER naming the holder of the ``controller`` key —
after the claim, this controller — so they reach the KRaft controller (KIP-866 routes
AlterPartition the same way once brokers know the KRaft controller). Until the copy is
committed the controller answers them NOT_CONTROLLER (:meth:`holds_requests`): it has no
state to answer with.

A broker **moved** once its ``brokers/ids`` key is gone from etcd and its registration in
the log is newer than the copy and active: it was restarted with ``--controllers``. When
every broker registered in etcd moved, the ENDED record is appended; from then on etcd is
never written again, and the claim's lease is revoked (the ``controller`` key goes with
it; no other key changes).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable, Sequence

from highwater.errors import HighwaterError
from highwater.etcd_metadata.connection import EtcdConnection, EtcdUnavailableError
from highwater.etcd_metadata.endpoints import EtcdStoreAddress
from highwater.etcd_metadata.keys import KeySpace
from highwater.etcd_metadata.migration import (
    ClaimEtcdController,
    EtcdSnapshot,
    MigrationDriver,
    MigrationEffect,
    MigrationError,
    MigrationState,
    ProposeMigrationBatch,
    ProposeMigrationEnd,
    PushImage,
    WriteEtcdState,
)
from highwater.etcd_metadata.migration_store import MigrationStore
from highwater.etcd_metadata.pushed import MetadataPushChannels, push_addresses
from highwater.etcd_metadata.session import EtcdSession
from highwater.internal.v1 import broker_metadata_pb2
from highwater.metadata.image import MetadataImage
from highwater.metadata.records import MetadataRecord, MigrationStateRecord
from highwater.metadata.snapshot import snapshot_values
from highwater.v1.common_pb2 import ErrorCode

__all__ = ["EtcdMigration", "etcd_cluster_id"]

log = logging.getLogger(__name__)


async def etcd_cluster_id(store: EtcdStoreAddress, expected: str | None) -> str:
    """The cluster id of the etcd-mode cluster at ``store``, read before anything is written:
    :class:`EtcdUnavailableError` naming the endpoint if etcd does not answer,
    :class:`MigrationError` if the prefix holds no cluster or ``expected`` (the quorum's
    ``--cluster-id``) differs from it."""
    space = KeySpace(store.prefix)
    connection = EtcdConnection(store)
    try:
        _, value = await connection.get(space.cluster_id)
    finally:
        await connection.close()
    if value is None or not value.value:
        raise MigrationError(
            f"etcd at {store} has no {space.cluster_id}: not an etcd-mode cluster to migrate"
        )
    cluster_id = value.value.decode()
    if expected and expected != cluster_id:
        raise MigrationError(
            f"the quorum's cluster id {expected!r} differs from {cluster_id!r} in "
            f"{space.cluster_id} at {store}: a migration keeps etcd's cluster id"
        )
    return cluster_id


class EtcdMigration:
    """The migration from the etcd-mode cluster at ``store``, run by controller ``node_id``
    (reachable at ``address``) while ``is_active()`` (see the module docstring)."""

    def __init__(
        self,
        *,
        store: EtcdStoreAddress,
        node_id: int,
        address: str,
        committed_image: Callable[[], MetadataImage],
        is_active: Callable[[], bool],
        propose: Callable[[Sequence[MetadataRecord]], Awaitable[bool]],
        poll_interval_s: float = 0.1,
        session_ttl_s: int = 6,
        push_timeout_s: float = 5.0,
    ) -> None:
        self.store_address = store
        self.space = space = KeySpace(store.prefix)
        self.node_id = node_id
        self.address = address
        self.driver = MigrationDriver(space)
        self._committed_image = committed_image
        self._is_active = is_active
        self._propose = propose
        self.poll_interval_s = poll_interval_s
        self.session_ttl_s = session_ttl_s
        self.push_timeout_s = push_timeout_s
        self.failure: HighwaterError | None = None
        """The last error that stops the migration from going on (until it clears)."""
        self._store = MigrationStore(EtcdConnection(store), space, node_id, address)
        self._session: EtcdSession | None = None
        self._leading = False
        self._fed_offset = -1
        self._push_to: frozenset[int] = frozenset()
        self._pushed: dict[str, tuple[int, int]] = {}
        """Each node's last answered push: its claimed controller epoch and log offset. A
        new claim's epoch pushes again though the log did not move: the node may hold an
        image an etcd-mode candidate pushed in between."""
        self._push_tasks: dict[str, asyncio.Task[None]] = {}
        self._push_channels = MetadataPushChannels(node_id)
        self._task: asyncio.Task[None] | None = None

    # --- lifecycle -----------------------------------------------------------------------

    @property
    def state(self) -> MigrationState:
        return self.driver.state

    def holds_requests(self) -> bool:
        """Whether the controller must not answer requests yet: the copy of etcd's state
        is not in the committed log (brokers still in etcd mode would find no state)."""
        return self._committed_image().migration.state == 0

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"etcd-migration-{self.node_id}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for task in self._push_tasks.values():
            task.cancel()
        await self._release()
        await self._store.connection.close()
        await self._push_channels.close()

    async def _release(self) -> None:
        """Give up the claim (its lease, and so the ``controller`` key)."""
        session, self._session = self._session, None
        if session is not None:
            with contextlib.suppress(HighwaterError):
                await session.stop()
            await session.connection.close()

    # --- the rounds ----------------------------------------------------------------------

    async def _run(self) -> None:
        while self.driver.state is not MigrationState.ENDED:
            try:
                await self._round()
                self.failure = None
            except (EtcdUnavailableError, MigrationError) as e:
                if str(e) != str(self.failure):
                    log.warning("node %d: the etcd migration waits: %s", self.node_id, e)
                self.failure = e
                self._step_back()
            except Exception:
                log.exception("node %d: a round of the etcd migration failed", self.node_id)
                self._step_back()
            # The brokers still in etcd mode follow the log even while etcd is away.
            self._push_all()
            await asyncio.sleep(self.poll_interval_s)
        self._push_to = frozenset()
        await self._release()
        log.info("node %d: the etcd migration is over; etcd is no longer written", self.node_id)

    def _step_back(self, *, leadership_lost: bool = False) -> None:
        """Start over from the claim (after a lost claim, a fenced write, an error); the
        pushes go on unless this controller is no longer the active one."""
        if self._leading:
            self.driver.leadership_changed(False)
            self._leading = False
        self._fed_offset = -1
        if leadership_lost:
            self._pushed.clear()
            self._push_to = frozenset()

    async def _round(self) -> None:
        image = self._committed_image()
        if image.migration.state == MigrationStateRecord.ENDED:
            self.driver.log_replayed(migrated=True, ended=True)
            return
        if not self._is_active():
            self._step_back(leadership_lost=True)
            return
        driver = self.driver
        if not self._leading:
            driver.log_replayed(migrated=image.migration.state != 0, ended=False)
            driver.leadership_changed(True)
            self._leading = True
        snapshot = await self._store.read()
        if driver.state is MigrationState.WAITING_FOR_BROKERS:
            await self._run_effects(driver.etcd_read(snapshot))
            return
        if driver.state is MigrationState.DUAL_WRITE:
            if snapshot.controller_epoch(self.space) != driver.controller_epoch:
                log.warning(
                    "node %d: etcd's controller epoch is %d, not the claimed %d: claiming again",
                    self.node_id,
                    snapshot.controller_epoch(self.space),
                    driver.controller_epoch,
                )
                self._step_back()
                return
            if not self._holds_claim(snapshot):
                log.warning(
                    "node %d: etcd's controller key is no longer our claim of epoch %d (its "
                    "lease is gone): claiming again",
                    self.node_id,
                    driver.controller_epoch,
                )
                self._step_back()
                await self._release()  # a new lease for the claim, on the next round
                return
            effects: list[MigrationEffect] = []
            image = self._committed_image()
            for broker_id in sorted(driver.etcd_mode_brokers):
                if self._moved(broker_id, image, snapshot):
                    log.info("node %d: broker %d moved to KRaft", self.node_id, broker_id)
                    effects.extend(driver.broker_registered(broker_id))
            if image.offset != self._fed_offset:
                self._fed_offset = image.offset
                effects.extend(driver.image_committed(image))
            await self._run_effects(effects)

    def _holds_claim(self, snapshot: EtcdSnapshot) -> bool:
        """Whether etcd's ``controller`` key is still this controller's claim: it goes with
        the claim's lease (etcd away past the TTL, this process paused) while
        ``controller_epoch`` stays, and until it is claimed again an etcd-mode candidate
        may campaign for it."""
        value = snapshot.keys.get(self.space.controller)
        if value is None:
            return False
        try:
            claim = json.loads(value)
            return bool(
                claim["broker_id"] == self.node_id
                and claim["epoch"] == self.driver.controller_epoch
            )
        except (ValueError, KeyError, TypeError):
            return False

    def _moved(self, broker_id: int, image: MetadataImage, snapshot: EtcdSnapshot) -> bool:
        """Restarted with ``--controllers``: no ``brokers/ids`` key in etcd, and registered
        with the quorum after the copy (or gone from the log)."""
        if broker_id in snapshot.live_brokers(self.space):
            return False
        registration = image.broker(broker_id)
        if registration is None:
            return True
        return registration.broker_epoch > image.migration.copied_offset and registration.is_active

    # --- effects ---------------------------------------------------------------------------

    async def _run_effects(self, effects: list[MigrationEffect]) -> None:
        queue = list(effects)
        while queue:
            effect = queue.pop(0)
            if isinstance(effect, ClaimEtcdController):
                queue.extend(await self._claim(effect))
            elif isinstance(effect, ProposeMigrationBatch):
                queue.extend(await self._copy(effect))
            elif isinstance(effect, WriteEtcdState):
                offset = self._committed_image().migration.etcd_metadata_offset + 1
                if not await self._store.write_state(
                    effect, metadata_offset=offset + self._fed_offset
                ):
                    log.warning(
                        "node %d: a dual write of epoch %d was fenced: claiming again",
                        self.node_id,
                        effect.controller_epoch,
                    )
                    self._step_back()
                    return
            elif isinstance(effect, PushImage):
                self._push_to = effect.brokers
            elif isinstance(effect, ProposeMigrationEnd):
                await self._end()

    async def _claim(self, effect: ClaimEtcdController) -> list[MigrationEffect]:
        session = self._session
        if session is None or session.lease_id is None:
            if session is not None:
                await self._release()
            session = EtcdSession(EtcdConnection(self.store_address), ttl_s=self.session_ttl_s)
            await session.start()
            self._session = session
        assert session.lease_id is not None
        claimed = await self._store.claim(effect, session.lease_id)
        snapshot = await self._store.read()
        if claimed:
            log.info(
                "node %d: claimed etcd's controller key with epoch %d",
                self.node_id,
                effect.epoch,
            )
        return self.driver.claim_result(claimed, snapshot)

    async def _copy(self, effect: ProposeMigrationBatch) -> list[MigrationEffect]:
        log.info(
            "node %d: copying etcd's state of cluster %s: %d records",
            self.node_id,
            effect.cluster_id,
            len(effect.records),
        )
        if not await self._propose(effect.records):
            self._step_back()
            return []
        async with asyncio.timeout(30):
            while (image := self._committed_image()).migration.state == 0:
                await asyncio.sleep(0.01)
        self._fed_offset = image.offset
        return self.driver.batch_committed(image)

    async def _end(self) -> None:
        image = self._committed_image()
        if not await self._propose([MigrationDriver.end_record(image)]):
            self._step_back()
            return
        async with asyncio.timeout(30):
            while self._committed_image().migration.state != MigrationStateRecord.ENDED:
                await asyncio.sleep(0.01)
        self.driver.end_committed()

    # --- pushes to the brokers still in etcd mode ------------------------------------------

    def _push_all(self) -> None:
        image = self._committed_image()
        if (
            not self._push_to
            or not self._is_active()
            or image.migration.state != MigrationStateRecord.MIGRATING
        ):
            return
        pushing = (self.driver.controller_epoch, image.offset)
        for address in push_addresses(image, self._push_to):
            if self._pushed.get(address) == pushing:
                continue
            task = self._push_tasks.get(address)
            if task is not None and not task.done():
                continue  # the next round pushes what this one missed
            self._push_tasks[address] = asyncio.create_task(self._push(address, image))

    async def _push(self, address: str, image: MetadataImage) -> None:
        epoch = self.driver.controller_epoch
        request = broker_metadata_pb2.UpdateMetadataRequest(
            controller_id=self.node_id,
            controller_epoch=epoch,
            offset=image.migration.etcd_metadata_offset + 1 + image.offset,
            records=snapshot_values(image),
            controller_address=self.address,
        )
        reply = await self._push_channels.update_metadata(address, request, self.push_timeout_s)
        if reply is None:
            return
        if reply.error == ErrorCode.NONE:
            self._pushed[address] = (epoch, image.offset)
        else:
            log.warning(
                "node %d: %s refused our push: %s", self.node_id, address, reply.error_message
            )
