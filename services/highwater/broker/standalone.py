"""``StandaloneBroker``: a broker process of its own (``highwater broker``).

It follows the metadata quorum as an observer
(:class:`~highwater.metadata.observer.MetadataObserver`, its metadata log under
``<data dir>/metadata``) and serves ``highwater.v1.Broker`` on the observer's gRPC port,
with its partition logs under ``<data dir>/logs`` (or in the ``log.dirs`` given), and
forwards admin calls to the active controller (:mod:`highwater.broker.forwarding`).
The quorum's voters are learned from the controllers given (DescribeQuorum names every
voter and its address), so a broker needs only their addresses, as Kafka's
``controller.quorum.bootstrap.servers`` does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

from highwater.broker.forwarding import add_forwarding_servicer
from highwater.broker.service import BROKER_SERVICE_NAME, BrokerServer, BrokerSettings
from highwater.config.listeners import Listeners, resolve_listeners
from highwater.controller_api.codec import CONTROLLER_HEALTH_ALIASES, CONTROLLER_SERVICE_NAME
from highwater.metadata.observer import MetadataObserver, discover_quorum_to_register
from highwater.metadata.records import registered_endpoints
from highwater.rpc.server import GrpcService

__all__ = ["StandaloneBroker"]


class StandaloneBroker:
    """A broker with its own metadata observer (see the module docstring)."""

    def __init__(
        self,
        *,
        node_id: int,
        listen: str,
        controllers: Sequence[str],
        data_dir: Path,
        settings: BrokerSettings | None = None,
        advertised: str | None = None,
        log_dirs: Sequence[Path] = (),
        kafka_listen: str | None = None,
        kafka_advertised: str | None = None,
        listeners: Listeners | None = None,
    ) -> None:
        """``log_dirs``: where the partition logs live (Kafka's ``log.dirs``, one or more);
        none: ``<data_dir>/logs``. ``listeners``: named listeners
        (:mod:`highwater.config.listeners`); without them, the one listener ``PLAINTEXT``
        on ``listen``, advertised at ``advertised``."""
        self.node_id = node_id
        self.listeners = listeners or resolve_listeners(
            listen=listen, advertised_listener=advertised
        )
        self.listen = self.listeners.inter_broker.address
        self.advertised = self.listeners.advertised[0].address
        """Where followers connect (the inter-broker listener's advertised address)."""
        self.controllers = list(controllers)
        self.data_dir = Path(data_dir)
        self.log_dirs = [Path(d) for d in log_dirs] or [self.data_dir / "logs"]
        self.settings = settings
        self.kafka_listen = kafka_listen
        self.kafka_advertised = kafka_advertised
        """Kafka's protocol: where it is served (none: not served) and where Kafka clients
        connect (if not there)."""
        self.observer: MetadataObserver | None = None
        self.broker: BrokerServer | None = None

    @property
    def failure(self) -> BaseException | None:
        if self.broker is not None and self.broker.failure is not None:
            return self.broker.failure
        return self.observer.failure if self.observer is not None else None

    async def start(self) -> None:
        quorum = await discover_quorum_to_register(
            self.controllers,
            f"broker {self.node_id}",
            (self.settings or BrokerSettings()).initial_registration_timeout_ms,
        )
        broker_service = GrpcService(
            BROKER_SERVICE_NAME, lambda server: self._require_broker().add_servicer(server)
        )
        admin_service = GrpcService(
            CONTROLLER_SERVICE_NAME,
            lambda server: add_forwarding_servicer(server, self._require_broker().controller),
            health_aliases=CONTROLLER_HEALTH_ALIASES,
        )
        self.observer = observer = MetadataObserver(
            node_id=self.node_id,
            voters=quorum.voters,
            voters_offset=quorum.voters_offset,
            data_dir=self.data_dir / "metadata",
            cluster_id=quorum.cluster_id or None,
            listen=self.listen,
            services=[broker_service, admin_service],
            listener_name=self.listeners.host_listener_name,
            more_listeners=self.listeners.more_bound,
        )
        self.broker = BrokerServer(
            node_id=self.node_id,
            advertised=self.advertised,
            listeners=registered_endpoints(self.listeners),
            data_dir=self.log_dirs,
            controllers=self.controllers,
            metadata=self.observer,
            settings=self.settings,
            report_serving=self._report_serving,
            kafka_listen=self.kafka_listen,
            kafka_advertised=self.kafka_advertised,
            quorum_cluster_id=lambda: observer.raft.cluster_id,
        )
        await self.observer.start()
        try:
            await self.broker.start()
        except BaseException:
            await self.observer.stop()
            raise

    def _report_serving(self, name: str, serving: bool) -> None:
        """The broker's readiness on the observer's health; the forwarded Controller admin
        calls are served exactly while the Broker service is."""
        if self.observer is None:
            return
        self.observer.raft.report_serving(name, serving)
        if name == BROKER_SERVICE_NAME:
            self.observer.raft.report_serving(CONTROLLER_SERVICE_NAME, serving)

    async def stop(self) -> None:
        try:
            if self.broker is not None:
                await self.broker.stop()
        finally:
            if self.observer is not None:
                await self.observer.stop()

    async def wait_stopped(self) -> None:
        """Return once the observer stopped or the broker failed (every log directory)."""
        waits = []
        if self.observer is not None:
            waits.append(asyncio.ensure_future(self.observer.wait_stopped()))
        if self.broker is not None:
            waits.append(asyncio.ensure_future(self.broker.wait_failed()))
        if not waits:
            return
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()

    def _require_broker(self) -> BrokerServer:
        if self.broker is None:
            raise RuntimeError("the broker has not started")
        return self.broker
