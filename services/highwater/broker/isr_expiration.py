"""The ISR-shrink loop: followers that fell behind leave the ISRs this broker leads.

Kafka's ``isr-expiration`` task (``ReplicaManager.maybeShrinkIsr``): every half
``replica.lag.time.max.ms`` each partition this broker leads is asked
(:meth:`~highwater.broker.partitions.Partition.maybe_shrink_isr`, the pure leader state's
rule) and the shrinks it proposes go to the AlterPartition sender.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable

from highwater.broker.partitions import Partition
from highwater.broker.replication import AlterPartitionProposal

__all__ = ["expire_isr_forever", "propose_isr_shrinks"]

Propose = Callable[[Partition, AlterPartitionProposal], None]


def propose_isr_shrinks(partitions: Iterable[Partition], propose: Propose) -> int:
    """One pass: propose each shrink the partitions' leader states want; how many."""
    proposed = 0
    for partition in partitions:
        proposal = partition.maybe_shrink_isr()
        if proposal is not None:
            propose(partition, proposal)
            proposed += 1
    return proposed


async def expire_isr_forever(
    partitions: Iterable[Partition], propose: Propose, *, replica_lag_time_max_ms: int
) -> None:
    """:func:`propose_isr_shrinks` every half ``replica_lag_time_max_ms``, until cancelled."""
    interval_s = replica_lag_time_max_ms / 2000
    while True:
        await asyncio.sleep(interval_s)
        propose_isr_shrinks(partitions, propose)
