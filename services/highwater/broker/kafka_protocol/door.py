"""``KafkaDoor``: a broker's Kafka listener assembled over the broker's own parts.

The broker's :class:`~highwater.broker.request_handler.RequestHandler` and controller client
answer the Kafka requests through :class:`~highwater.broker.kafka_protocol.apis.KafkaApis`;
the group calls go to the coordinators through a
:class:`~highwater.broker.kafka_protocol.listener.GroupCoordinatorRelay`. The listener is
registered with the controller as the broker's listener ``KAFKA`` (its advertised address,
else the address it is bound to), which Metadata and FindCoordinator answers name.

The listener authenticates no one (no SaslHandshake/SaslAuthenticate yet, no TLS), so it
cannot run where the ACL checks are on: every Kafka client would be served as if no
authorizer existed. A broker asked for both refuses to start, naming the conflict.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from highwater.broker.kafka_protocol.apis import KAFKA_LISTENER_NAME, KafkaApis
from highwater.broker.kafka_protocol.listener import GroupCoordinatorRelay, KafkaListener
from highwater.errors import InvalidConfigError
from highwater.metadata.image import MetadataImage
from highwater.metadata.records import BrokerEndpoint
from highwater.rpc.auth import authorizer_enabled
from highwater.rpc.endpoints import parse_endpoint

if TYPE_CHECKING:
    from highwater.broker.service import BrokerServer

__all__ = ["KafkaDoor"]


class KafkaDoor:
    """Broker ``broker``'s Kafka listener on ``listen`` (``HOST:PORT``; port 0 picks one)."""

    def __init__(self, broker: BrokerServer, *, listen: str, advertised: str | None) -> None:
        if authorizer_enabled():
            raise InvalidConfigError(
                "--kafka-listen cannot be used with the ACL authorizer on: the Kafka "
                "listener does not authenticate its clients yet (docs/kafka-protocol.md)"
            )
        host, port = parse_endpoint(listen)
        self._advertised = advertised

        def image() -> MetadataImage:
            return broker.partitions.image

        self.relay = GroupCoordinatorRelay(broker.requests, image)
        self.apis = KafkaApis(
            node_id=broker.node_id,
            requests=broker.requests,
            controller=broker.controller,
            groups=self.relay,
            image=image,
        )
        self.listener = KafkaListener(self.apis, host=host, port=port)

    @property
    def endpoint(self) -> BrokerEndpoint:
        """Where Kafka clients connect, as registered with the controller."""
        if self._advertised is not None:
            host, port = parse_endpoint(self._advertised)
        else:
            host, port = self.listener.host, self.listener.port
        return BrokerEndpoint(KAFKA_LISTENER_NAME, host, port)

    async def start(self) -> None:
        await self.listener.start()

    async def stop(self) -> None:
        await self.listener.stop()
        await self.relay.close()
