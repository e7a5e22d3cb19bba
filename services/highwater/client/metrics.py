"""The client library's metrics: records sent and consumed (OpenTelemetry's messaging
client metrics) and each consumer's lag per partition (Kafka's ``records-lag``)."""

from __future__ import annotations

import functools
import weakref
from collections.abc import Iterable
from typing import Final, Protocol

from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.semconv._incubating.attributes import messaging_attributes as messaging
from opentelemetry.semconv._incubating.metrics import messaging_metrics

from highwater.telemetry.instruments import meter
from highwater.telemetry.messaging import MESSAGING_SYSTEM

__all__ = ["CLIENT_METRICS", "ClientMetrics", "PartitionLag"]

PartitionLag = tuple[str, int, int]
"""``(topic, partition, lag)``: records between a consumer's position and the high watermark."""


class LagSource(Protocol):
    """A consumer as the lag gauge reads it."""

    @property
    def group_id(self) -> str: ...

    def partition_lags(self) -> Iterable[PartitionLag]: ...


_SYSTEM: Final = {messaging.MESSAGING_SYSTEM: MESSAGING_SYSTEM}


class ClientMetrics:
    """Instruments shared by producers and consumers (global meter; no-op until set)."""

    def __init__(self) -> None:
        client_meter = meter("client")
        self._sent = client_meter.create_counter(
            messaging_metrics.MESSAGING_CLIENT_SENT_MESSAGES,
            unit="{message}",
            description="Records the producer had acknowledged",
        )
        self._consumed = client_meter.create_counter(
            messaging_metrics.MESSAGING_CLIENT_CONSUMED_MESSAGES,
            unit="{message}",
            description="Records handed to the application by poll and consume",
        )
        self._consumed_attributes: dict[str, dict[str, str]] = {}
        self._consumers: weakref.WeakSet[LagSource] = weakref.WeakSet()
        client_meter.create_observable_gauge(
            "highwater.consumer.lag",
            [self._read_lags],
            unit="{message}",
            description="Records between a consumer's position and the high watermark",
        )

    def sent(self, topic: str, count: int) -> None:
        # Called per acknowledged batch: the attributes of each topic are made once.
        self._sent.add(count, _sent_attributes(topic))

    def consumed(self, group_id: str, count: int) -> None:
        # Called per poll(): the attributes of each group are made once.
        attributes = self._consumed_attributes.get(group_id)
        if attributes is None:
            attributes = dict(_SYSTEM)
            if group_id:
                attributes[messaging.MESSAGING_CONSUMER_GROUP_NAME] = group_id
            self._consumed_attributes[group_id] = attributes
        self._consumed.add(count, attributes)

    def observe_lag(self, consumer: LagSource) -> None:
        """Report ``consumer``'s lag as ``highwater.consumer.lag`` while it lives."""
        self._consumers.add(consumer)

    def _read_lags(self, _options: CallbackOptions) -> Iterable[Observation]:
        observations = []
        for consumer in list(self._consumers):
            base = dict(_SYSTEM)
            if consumer.group_id:
                base[messaging.MESSAGING_CONSUMER_GROUP_NAME] = consumer.group_id
            for topic, partition, lag in consumer.partition_lags():
                attributes = {
                    **base,
                    messaging.MESSAGING_DESTINATION_NAME: topic,
                    messaging.MESSAGING_DESTINATION_PARTITION_ID: str(partition),
                }
                observations.append(Observation(lag, attributes))
        return observations


@functools.lru_cache(maxsize=1024)
def _sent_attributes(topic: str) -> dict[str, str]:
    """A topic's attributes for ``messaging.client.sent.messages``, made once and shared
    (a meter does not change the attributes it is given), as the broker's are."""
    return {**_SYSTEM, messaging.MESSAGING_DESTINATION_NAME: topic}


CLIENT_METRICS: Final = ClientMetrics()
"""The instruments every producer and consumer of this process reports to."""
