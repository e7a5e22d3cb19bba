"""``StandaloneBroker``: a broker process of its own (``highwater broker``).

It follows the metadata quorum as an observer
(:class:`~highwater.metadata.observer.MetadataObserver`, its metadata log under
``<data dir>/metadata``) and serves ``highwater.v1.Broker`` on the observer's gRPC port,
with its partition logs under ``<data dir>/logs``, and forwards admin calls to the active
controller (:mod:`highwater.broker.forwarding`). The quorum's voters are learned from
the controllers given (DescribeQuorum names every voter and its address), so a broker
needs only their addresses, as Kafka's ``controller.quorum.bootstrap.servers`` does.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from highwater.broker.forwarding import add_forwarding_servicer
from highwater.broker.service import BROKER_SERVICE_NAME, BrokerServer, BrokerSettings
from highwater.controller_api.codec import CONTROLLER_HEALTH_ALIASES, CONTROLLER_SERVICE_NAME
from highwater.metadata.observer import MetadataObserver, discover_voters
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
    ) -> None:
        self.node_id = node_id
        self.listen = listen
        self.advertised = advertised or listen
        """Where clients and followers connect (Kafka's ``advertised.listeners``): the listen
        address unless a proxy or a NAT stands in front of the broker."""
        self.controllers = list(controllers)
        self.data_dir = Path(data_dir)
        self.settings = settings
        self.observer: MetadataObserver | None = None
        self.broker: BrokerServer | None = None

    @property
    def failure(self) -> BaseException | None:
        return self.observer.failure if self.observer is not None else None

    async def start(self) -> None:
        voters = await discover_voters(self.controllers)
        broker_service = GrpcService(
            BROKER_SERVICE_NAME, lambda server: self._require_broker().add_servicer(server)
        )
        admin_service = GrpcService(
            CONTROLLER_SERVICE_NAME,
            lambda server: add_forwarding_servicer(server, self._require_broker().controller),
            health_aliases=CONTROLLER_HEALTH_ALIASES,
        )
        self.observer = MetadataObserver(
            node_id=self.node_id,
            voters=voters,
            data_dir=self.data_dir / "metadata",
            listen=self.listen,
            services=[broker_service, admin_service],
        )
        self.broker = BrokerServer(
            node_id=self.node_id,
            advertised=self.advertised,
            data_dir=self.data_dir / "logs",
            controllers=self.controllers,
            metadata=self.observer,
            settings=self.settings,
            report_serving=self._report_serving,
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
        if self.observer is not None:
            await self.observer.wait_stopped()

    def _require_broker(self) -> BrokerServer:
        if self.broker is None:
            raise RuntimeError("the broker has not started")
        return self.broker
