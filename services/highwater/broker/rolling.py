"""Rolling restarts of brokers: when one may stop, and when a restarted one counts as ready.

A StatefulSet restarts its brokers one pod at a time and moves to the next pod only once
the restarted one is Ready. Two gates, both decided here from what ``describe_topics``
and ``describe_cluster`` report (leader, replicas and ISR of every partition, and the
live brokers), keep that roll from losing availability or durability:

* **may stop** (the pod's preStop hook): a broker is stopped only while no partition of
  the cluster is under-replicated (every replica in its ISR). Stopping a broker while
  another one is still catching up would take the partitions they share one more
  replica below their replication factor, and below ``min.insync.replicas`` where the
  two together were the margin. Once the gate opens, SIGTERM starts the broker's
  controlled shutdown, which the controller completes only after it has moved every
  leadership away from the broker (:meth:`BrokerServer.stop`).
* **ready** (the readiness probe): a broker is ready only once it is registered and
  unfenced and back in the ISR of every partition it replicates. The StatefulSet
  controller does not restart the next pod before this one is ready, and the
  PodDisruptionBudget counts an unready broker as unavailable, so a node drain waits too.

The decisions are pure functions of a :class:`ClusterView`: the broker builds one from
its metadata image (:func:`broker_readiness`), ``highwater rolling``
(:mod:`highwater.cli.rolling`) from what the admin client describes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from highwater.metadata.image import MetadataImage

__all__ = [
    "READY_SERVICE",
    "ClusterView",
    "Decision",
    "PartitionState",
    "broker_readiness",
    "leaderships",
    "may_stop",
    "readiness",
    "under_replicated",
]


READY_SERVICE = "highwater.broker.ready"
"""The ``grpc.health.v1`` service name under which a broker reports :func:`readiness`
(SERVING once ready): what the Kubernetes readiness probe asks, without a process."""


@dataclass(frozen=True, slots=True)
class PartitionState:
    """One partition as the brokers' metadata reports it."""

    topic: str
    partition: int
    leader: int | None
    replicas: tuple[int, ...]
    isr: tuple[int, ...]

    @property
    def name(self) -> str:
        """``topic-partition``, as Kafka's tools print it."""
        return f"{self.topic}-{self.partition}"

    @property
    def is_under_replicated(self) -> bool:
        """Some replica is outside the ISR."""
        return any(replica not in self.isr for replica in self.replicas)


@dataclass(frozen=True, slots=True)
class ClusterView:
    """The live (registered, unfenced) brokers and every partition, internal ones too."""

    live_brokers: frozenset[int]
    partitions: tuple[PartitionState, ...] = ()


@dataclass(frozen=True, slots=True)
class Decision:
    """A gate's answer: open or not, and why not (one line per reason)."""

    allowed: bool
    reasons: tuple[str, ...] = field(default=())

    def __str__(self) -> str:
        return "yes" if self.allowed else "; ".join(self.reasons)


#: At most this many partitions are named in a reason; the rest are counted.
NAMED_PARTITIONS = 5


def _named(partitions: list[PartitionState]) -> str:
    names = ", ".join(p.name for p in partitions[:NAMED_PARTITIONS])
    more = len(partitions) - NAMED_PARTITIONS
    return f"{names} and {more} more" if more > 0 else names


def under_replicated(view: ClusterView) -> list[PartitionState]:
    """The partitions with a replica outside their ISR, in topic and partition order."""
    return [p for p in view.partitions if p.is_under_replicated]


def leaderships(view: ClusterView, node_id: int) -> list[PartitionState]:
    """The partitions ``node_id`` leads."""
    return [p for p in view.partitions if p.leader == node_id]


def may_stop(view: ClusterView, node_id: int) -> Decision:
    """Whether broker ``node_id`` may be stopped now: no partition is under-replicated.

    The broker's own partitions count as much as the others': a partition that lost a
    replica elsewhere and has one on this broker would lose a second. Two exceptions,
    because stopping the broker cannot make them worse: a partition whose only replicas
    outside the ISR are on this broker (it is waiting for this very broker, which may be
    restarted to recover), and a broker that is not live (fenced or not yet registered
    serves nothing).
    """
    if node_id not in view.live_brokers:
        return Decision(True)
    lagging = [
        p
        for p in under_replicated(view)
        if any(replica not in p.isr for replica in p.replicas if replica != node_id)
    ]
    if lagging:
        return Decision(False, (f"{len(lagging)} under-replicated: {_named(lagging)}",))
    return Decision(True)


def readiness(view: ClusterView, node_id: int) -> Decision:
    """Whether broker ``node_id`` is ready: live, and in the ISR of each of its replicas.

    A replica whose partition has no leader cannot catch up and does not hold the broker
    back (that partition waits for another broker, not for this one).
    """
    reasons: list[str] = []
    if node_id not in view.live_brokers:
        reasons.append(f"broker {node_id} is not registered and unfenced")
    behind = [
        p
        for p in view.partitions
        if node_id in p.replicas and node_id not in p.isr and p.leader is not None
    ]
    if behind:
        reasons.append(f"not yet in the ISR of {len(behind)}: {_named(behind)}")
    return Decision(not reasons, tuple(reasons))


def broker_readiness(image: MetadataImage, node_id: int) -> Decision:
    """:func:`readiness` of broker ``node_id`` from a metadata image, as the broker itself
    decides it (only the partitions it holds a replica of and is not in the ISR of are
    looked at).

    The broker asks at every image, so this costs the partitions it is behind on, not
    every partition it holds: the image's per-broker indexes count its replicas and its
    ISR memberships, and an ISR is a subset of the replicas, so equal counts mean it is
    in the ISR of each of its replicas without a look at any of them."""
    live = frozenset(b.broker_id for b in image.active_brokers())
    replicas = image.replicas_of(node_id)
    in_isr = image.partitions_with_isr_member(node_id)
    behind = () if len(in_isr) == len(replicas) else [k for k in replicas if k not in in_isr]
    partitions = []
    for key in sorted(behind):
        registration = image.partition(key)
        name = image.topic_name(key.topic_id)
        if registration is None or name is None:
            continue
        partitions.append(
            PartitionState(
                name,
                key.partition_id,
                registration.leader if registration.has_leader else None,
                registration.replicas,
                registration.isr,
            )
        )
    return readiness(ClusterView(live, tuple(partitions)), node_id)
