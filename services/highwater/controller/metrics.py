"""The controller's metrics, as Kafka's KafkaController gauges: whether this voter is the
active controller, and (on the active one) offline partitions, fenced and registered brokers;
in the etcd mode, the metadata pushes that failed."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from opentelemetry.metrics import Observation

from highwater.metadata.image import MetadataImage
from highwater.telemetry.instruments import meter, observe

if TYPE_CHECKING:
    from highwater.controller.etcd_controller import EtcdController
    from highwater.controller.service import ControllerServer

__all__ = ["ControllerMetrics", "PushMetrics"]


class ControllerMetrics:
    """Gauges of one controller (see :mod:`highwater.telemetry`). Only the active
    controller reports the cluster-wide counts; the others report 0, so that a sum over
    the quorum counts each partition once."""

    def __init__(self, server: ControllerServer) -> None:
        controller_meter = meter("controller")
        observe(
            controller_meter,
            "highwater.controller.active",
            server,
            lambda s: [Observation(1 if s.is_active else 0)],
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
                server,
                _on_active(count),
                unit=unit,
                description=description,
            )


def _on_active(
    count: Callable[[MetadataImage], int],
) -> Callable[[ControllerServer], Iterable[Observation]]:
    def read(server: ControllerServer) -> Iterable[Observation]:
        return [Observation(count(server.store.committed_image()) if server.is_active else 0)]

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
