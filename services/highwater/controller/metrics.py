"""The controller's metrics, as Kafka's KafkaController gauges: whether this controller is
the active one, and (on the active one) offline partitions, fenced and registered brokers;
in the etcd mode (where every broker runs a controller candidate), the same gauges, and the
metadata pushes that failed."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Protocol

from opentelemetry.metrics import Observation

from highwater.metadata.image import MetadataImage
from highwater.telemetry.instruments import meter, observe

if TYPE_CHECKING:
    from highwater.controller.etcd_controller import EtcdController

__all__ = ["ActiveController", "ControllerMetrics", "PushMetrics"]


class ActiveController(Protocol):
    """What the gauges read of a controller: a KRaft voter, or an etcd-mode candidate."""

    @property
    def is_active(self) -> bool: ...

    def committed_image(self) -> MetadataImage: ...


class ControllerMetrics:
    """Gauges of one controller (see :mod:`highwater.telemetry`). Only the active
    controller reports the cluster-wide counts; the others report 0, so that a sum over
    the quorum (in the etcd mode, over the brokers) counts each partition once."""

    def __init__(self, controller: ActiveController) -> None:
        controller_meter = meter("controller")
        observe(
            controller_meter,
            "highwater.controller.active",
            controller,
            lambda c: [Observation(1 if c.is_active else 0)],
            description="1 on the active controller, else 0",
        )
        gauges: tuple[tuple[str, Callable[[MetadataImage], int], str, str], ...] = (
            ("highwater.controller.offline_partitions",
             lambda image: len(image.partitions_without_leader()), "{partition}",
             "Partitions without a leader"),
            ("highwater.controller.fenced_brokers",
             lambda image: sum(1 for b in image.brokers.values() if b.fenced), "{broker}",
             "Registered brokers that are fenced"),
            ("highwater.controller.registered_brokers",
             lambda image: len(image.brokers), "{broker}", "Registered brokers"),
            ("highwater.controller.partitions",
             lambda image: image.partition_count, "{partition}", "Partitions in the cluster"),
        )  # fmt: skip
        for name, count, unit, description in gauges:
            observe(
                controller_meter,
                name,
                controller,
                _on_active(count),
                unit=unit,
                description=description,
            )


def _on_active(
    count: Callable[[MetadataImage], int],
) -> Callable[[ActiveController], Iterable[Observation]]:
    def read(controller: ActiveController) -> Iterable[Observation]:
        return [Observation(count(controller.committed_image()) if controller.is_active else 0)]

    return read


class PushMetrics:
    """The etcd-mode controller's pushes to brokers and coordinators: each failed push
    (refused with an error, or unanswered) counted by the node it went to, and how many
    nodes' latest push failed (on the active controller; 0 on the others)."""

    def __init__(self, controller: EtcdController) -> None:
        controller_meter = meter("controller")
        self._failures = controller_meter.create_counter(
            "highwater.controller.push_failures",
            unit="{push}",
            description="Metadata pushes a node refused or did not answer (etcd mode)",
        )
        observe(
            controller_meter,
            "highwater.controller.push_failing_nodes",
            controller,
            lambda c: [Observation(len(c.failing_pushes) if c.is_active else 0)],
            unit="{node}",
            description="Nodes whose latest metadata push failed (etcd mode)",
        )

    def failed(self, node_id: int | None, address: str) -> None:
        attributes: dict[str, str | int] = {"server.address": address}
        if node_id is not None:
            attributes["highwater.node.id"] = node_id
        self._failures.add(1, attributes)
