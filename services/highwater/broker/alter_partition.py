"""The AlterPartition sender: a leader's ISR changes, batched, sent to the controller, retried.

Kafka's ``AlterPartitionManager``. A partition leader's
:class:`~highwater.broker.replication.LeaderReplicationState` makes the proposals (a
follower back in sync, followers that fell behind); this sends them. The changes queued
while a request is in flight go together in the next one, one item per partition (the
latest proposal for it), so a broker coming back into the ISRs of a thousand partitions
sends a few requests, not a thousand. The committed change comes back through the
metadata and is applied to the partition then; an answer only matters when it is an
error: the leader state decides (``on_alter_partition_error``) whether the proposal is
dropped, waits for the metadata, or is sent again after
``alter_partition_retry_backoff_ms``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Protocol

from highwater.broker.partitions import Partition
from highwater.broker.replication import AlterPartitionProposal
from highwater.controller_api import messages as m
from highwater.errors import HighwaterError
from highwater.storage.topic_partition import TopicPartition
from highwater.v1.common_pb2 import ErrorCode

__all__ = ["AlterPartitionClient", "AlterPartitionManager"]

log = logging.getLogger(__name__)


class AlterPartitionClient(Protocol):
    """Where the requests go: the active controller
    (:class:`~highwater.controller_api.client.ControllerClient`)."""

    async def alter_partition(
        self, request: m.AlterPartitionRequest
    ) -> m.AlterPartitionResponse: ...


class AlterPartitionManager:
    """Sends the ISR changes of the partitions broker ``broker_id`` leads (see the module
    docstring). ``on_proposed`` is told of each proposal queued (the telemetry counts them)."""

    def __init__(
        self,
        controller: AlterPartitionClient,
        *,
        broker_id: int,
        broker_epoch: Callable[[], int],
        retry_backoff_ms: int,
        on_proposed: Callable[[Partition, AlterPartitionProposal], None] | None = None,
        on_dropped: Callable[[Partition], None] | None = None,
    ) -> None:
        """``on_dropped``: told, after the retry backoff, of each partition whose proposal
        the controller refused for good (the leader state dropped it): a follower that
        may join the ISR is proposed again at its next fetch, which a fetch session must
        then make (it would not read a caught-up follower's partition otherwise)."""
        self._controller = controller
        self._on_dropped = on_dropped
        self._broker_id = broker_id
        self._broker_epoch = broker_epoch
        self._retry_backoff_s = retry_backoff_ms / 1000
        self._on_proposed = on_proposed
        self._queue: dict[TopicPartition, tuple[Partition, AlterPartitionProposal]] = {}
        self._wake = asyncio.Event()
        self._sender: asyncio.Task[None] | None = None
        self._closed = False

    @property
    def pending(self) -> int:
        """How many partitions' changes wait for the next request."""
        return len(self._queue)

    def propose(self, partition: Partition, proposal: AlterPartitionProposal) -> None:
        """Queue ``proposal`` for ``partition`` (replacing one queued before for it) and make
        sure the sender runs. Nothing is queued once the manager is closed."""
        if self._closed:
            return
        self._queue[partition.topic_partition] = (partition, proposal)
        if self._on_proposed is not None:
            self._on_proposed(partition, proposal)
        self._wake.set()
        if self._sender is None or self._sender.done():
            self._sender = asyncio.create_task(self._send_forever())

    async def close(self) -> None:
        """Stop sending; retries scheduled for later are dropped."""
        self._closed = True
        if self._sender is not None:
            self._sender.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sender
            self._sender = None

    async def _send_forever(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            batch, self._queue = self._queue, {}
            if batch:
                await self.send(list(batch.values()))

    async def send(self, batch: list[tuple[Partition, AlterPartitionProposal]]) -> None:
        """One AlterPartition request for ``batch``; the refused changes go to their leader
        states, and those to send again are queued after the retry backoff."""
        items = tuple(
            m.AlterPartitionItem(
                partition.topic_id,
                partition.topic_partition.partition,
                proposal.leader_epoch,
                proposal.partition_epoch,
                tuple(proposal.new_isr),
            )
            for partition, proposal in batch
        )
        errors: dict[tuple[str, int], int] = {}
        try:
            reply = await self._controller.alter_partition(
                m.AlterPartitionRequest(self._broker_id, self._broker_epoch(), items)
            )
        except HighwaterError as e:
            log.warning("broker %d: AlterPartition failed: %s", self._broker_id, e)
            whole: int = ErrorCode.REQUEST_TIMED_OUT
        else:
            whole = reply.error
            errors = {(r.topic_id, r.partition_id): r.error for r in reply.partitions}
        for partition, proposal in batch:
            key = (partition.topic_id, partition.topic_partition.partition)
            error = whole or errors.get(key, ErrorCode.NONE)
            if error == ErrorCode.NONE or partition.leader_state is None:
                continue
            again = partition.leader_state.on_alter_partition_error(proposal, error)
            log.info(
                "broker %d: %s: ISR change %s refused (error %d)",
                self._broker_id,
                partition.topic_partition,
                list(proposal.new_isr),
                error,
            )
            if again is not None:
                asyncio.get_running_loop().call_later(
                    self._retry_backoff_s, self.propose, partition, again
                )
            elif self._on_dropped is not None and partition.leader_state.pending_proposal is None:
                asyncio.get_running_loop().call_later(
                    self._retry_backoff_s, self._on_dropped, partition
                )
