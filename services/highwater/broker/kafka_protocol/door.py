"""``KafkaDoor``: a broker's Kafka listener assembled over the broker's own parts.

The broker's :class:`~highwater.broker.request_handler.RequestHandler` and controller client
answer the Kafka requests through :class:`~highwater.broker.kafka_protocol.apis.KafkaApis`;
the group calls go to the coordinators through a
:class:`~highwater.broker.kafka_protocol.listener.GroupCoordinatorRelay`. The listener is
registered with the controller as the broker's listener ``KAFKA`` (its advertised address,
else the address it is bound to), which Metadata and FindCoordinator answers name.

The listener's security protocol is declared with its address, as Kafka declares a
listener (``--kafka-listen SASL_SSL://0.0.0.0:9093``, :mod:`.sasl`): ``SSL`` and
``SASL_SSL`` serve TLS with the process's ``--tls-*`` files (``SSL`` asks for client
certificates as ``--tls-client-auth`` says, ``SASL_SSL`` asks for none, as Kafka's
default ``ssl.client.auth=none`` for a SASL listener), and ``SASL_*`` need
``--sasl-enabled-mechanisms``. :func:`kafka_listener_security` checks this at start, so a
listener that cannot work stops the role before anything is bound.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from highwater.broker.kafka_protocol.apis import KAFKA_LISTENER_NAME, KafkaApis
from highwater.broker.kafka_protocol.listener import GroupCoordinatorRelay, KafkaListener
from highwater.broker.kafka_protocol.sasl import KafkaListenerAddress, parse_kafka_listener
from highwater.errors import InvalidConfigError
from highwater.metadata.image import MetadataImage
from highwater.metadata.records import BrokerEndpoint
from highwater.rpc.auth import server_security
from highwater.rpc.tls import ClientAuth, SocketTls, TlsConfigError, server_tls

if TYPE_CHECKING:
    from highwater.broker.service import BrokerServer

__all__ = ["KafkaDoor", "kafka_listener_security"]


def kafka_listener_security(listen: str) -> tuple[KafkaListenerAddress, SocketTls | None]:
    """The listener ``listen`` declares and its TLS, with the process's security settings;
    :class:`InvalidConfigError` naming what is missing."""
    try:
        address = parse_kafka_listener(listen)
    except ValueError as e:
        raise InvalidConfigError(f"--kafka-listen {e}") from None
    protocol = address.protocol
    if protocol.uses_sasl and not server_security().authentication.enabled_mechanisms:
        raise InvalidConfigError(
            f"--kafka-listen {protocol.value}:// needs --sasl-enabled-mechanisms"
        )
    if not protocol.uses_tls:
        return address, None
    server = server_tls()
    if server is None:
        raise InvalidConfigError(
            f"--kafka-listen {protocol.value}:// needs --tls-cert-file and --tls-key-file"
        )
    client_auth = server.client_auth if not protocol.uses_sasl else ClientAuth.NONE
    try:
        return address, SocketTls(server, client_auth)
    except TlsConfigError as e:
        raise InvalidConfigError(f"--kafka-listen {protocol.value}://: {e}") from None


class KafkaDoor:
    """Broker ``broker``'s Kafka listener on ``listen`` (``[PROTOCOL://]HOST:PORT``; port
    0 picks one)."""

    def __init__(self, broker: BrokerServer, *, listen: str, advertised: str | None) -> None:
        address, tls = kafka_listener_security(listen)
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
            cluster_id=broker.known_cluster_id,
            clock=broker.partitions.clock,
        )
        broker.telemetry.fetch_sessions.watch(self.apis.fetch_sessions, replica=False)
        self.listener = KafkaListener(
            self.apis,
            host=address.host,
            port=address.port,
            protocol=address.protocol,
            tls=tls,
            connections_max_idle_ms=broker.settings.connections_max_idle_ms,
        )

    @property
    def endpoint(self) -> BrokerEndpoint:
        """Where Kafka clients connect, as registered with the controller."""
        if self._advertised is not None:
            advertised = parse_kafka_listener(self._advertised)
            host, port = advertised.host, advertised.port
        else:
            host, port = self.listener.host, self.listener.port
        return BrokerEndpoint(KAFKA_LISTENER_NAME, host, port)

    async def start(self) -> None:
        await self.listener.start()

    async def stop(self) -> None:
        await self.listener.stop()
        await self.relay.close()
