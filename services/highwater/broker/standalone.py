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

import asyncio
from collections.abc import Sequence
from pathlib import Path

from highwater.broker.forwarding import add_forwarding_servicer
from highwater.broker.rolling import READY_SERVICE, broker_readiness
from highwater.broker.service import BROKER_SERVICE_NAME, BrokerServer, BrokerSettings
from highwater.controller_api.codec import CONTROLLER_SERVICE_NAME
from highwater.metadata.image import MetadataImage
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
        self._ready = False
        self._readiness_updates: set[asyncio.Task[None]] = set()

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
        )
        await self.observer.start()
        await self.observer.raft.set_serving(READY_SERVICE, False)
        try:
            await self.broker.start()
        except BaseException:
            await self.observer.stop()
            raise
        self.observer.add_listener(self._report_readiness)
        self._report_readiness(self.observer.image)

    def _report_readiness(self, image: MetadataImage) -> None:
        """Keep :data:`READY_SERVICE` in step with :func:`broker_readiness` (the rolling
        restart gate, docs/kubernetes.md)."""
        ready = broker_readiness(image, self.node_id).allowed
        if ready != self._ready and self.observer is not None:
            self._ready = ready
            task = asyncio.get_running_loop().create_task(
                self.observer.raft.set_serving(READY_SERVICE, ready)
            )
            self._readiness_updates.add(task)
            task.add_done_callback(self._readiness_updates.discard)

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
