"""The group coordinator's metrics: rebalances and their durations, groups by state."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import TYPE_CHECKING

from opentelemetry.metrics import Observation

from highwater.coordinator.core import RebalanceCompleted
from highwater.telemetry.instruments import duration_histogram, meter, observe

if TYPE_CHECKING:
    from highwater.coordinator.core import GroupCoordinatorCore

__all__ = ["CoordinatorMetrics"]


class CoordinatorMetrics:
    """Reports what the coordinator's core does and holds (see :mod:`highwater.telemetry`)."""

    def __init__(self, core: GroupCoordinatorCore) -> None:
        group_meter = meter("coordinator")
        self._rebalances = group_meter.create_counter(
            "highwater.coordinator.rebalances",
            unit="{rebalance}",
            description="Rebalances that ended with a stable generation",
        )
        self._rebalance_duration = duration_histogram(
            group_meter,
            "highwater.coordinator.rebalance.duration",
            "From a rebalance's join phase to the delivery of its assignment",
        )
        observe(
            group_meter,
            "highwater.coordinator.groups",
            core,
            _groups_by_state,
            unit="{group}",
            description="Groups this coordinator serves, by state",
        )

    def rebalance_completed(self, event: RebalanceCompleted) -> None:
        attributes = {"messaging.consumer.group.name": event.group_id}
        self._rebalances.add(1, attributes)
        self._rebalance_duration.record(event.duration_ms / 1000, attributes)


def _groups_by_state(core: GroupCoordinatorCore) -> Iterable[Observation]:
    counts = Counter(group.state.value for group in core.groups.values())
    return [Observation(n, {"highwater.group.state": state}) for state, n in counts.items()]
