"""``EmbeddedServer``: the whole cluster in one process on one port (``highwater server``).

A single-voter controller quorum (node 1), a broker (node 1) and a group coordinator
(node 1) share one gRPC server: ``highwater.internal.v1.Controller``, ``highwater.v1.Broker``,
``highwater.v1.GroupCoordinator`` and ``highwater.internal.v1.Raft``, with health and reflection.
Health reports each service NOT_SERVING, and the server as a whole too, until it can serve
what it promises: the Controller once the quorum has a leader, the Broker once it is
registered and unfenced, the GroupCoordinator once its ``__consumer_offsets`` partitions
are loaded; ``highwater.broker.ready`` is the broker's rolling-restart gate, as on a
standalone broker.
The broker and the coordinator take their metadata straight from the controller's state
machine instead of replicating the metadata log again, and register and heartbeat
through the Controller API like any broker or coordinator. The coordinator's first
rebalance of a group does not wait for more members (``group.initial.rebalance.delay.ms``
0, as in Kafka's development configuration). The data directory holds ``controller/``
(the metadata log, its snapshots, ``quorum-state``) and ``broker/`` (the partition logs
and their checkpoints); the coordinator keeps its state in ``__consumer_offsets``.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence
from pathlib import Path

from highwater.broker.service import BROKER_SERVICE_NAME, BrokerServer, BrokerSettings
from highwater.config.listeners import Listeners, resolve_listeners
from highwater.controller.service import ControllerServer, ControllerSettings
from highwater.coordinator.core import GroupCoordinatorSettings
from highwater.coordinator.service import (
    COORDINATOR_SERVICE_NAME,
    CoordinatorServer,
    CoordinatorSettings,
)
from highwater.metadata.records import registered_endpoints
from highwater.rpc.server import GrpcService

__all__ = ["EMBEDDED_NODE_ID", "EmbeddedServer"]

EMBEDDED_NODE_ID = 1


class EmbeddedServer:
    """A controller and a broker in one process (see the module docstring)."""

    def __init__(
        self,
        *,
        listen: str,
        data_dir: Path,
        controller_settings: ControllerSettings | None = None,
        broker_settings: BrokerSettings | None = None,
        coordinator_settings: CoordinatorSettings | None = None,
        log_dirs: Sequence[Path] = (),
        kafka_listen: str | None = None,
        kafka_advertised: str | None = None,
        listeners: Listeners | None = None,
    ) -> None:
        """``log_dirs``: the broker's log directories (``log.dirs``); none:
        ``<data_dir>/broker``. ``kafka_listen``: where the broker serves Kafka's protocol
        too (none: not served), ``kafka_advertised`` where Kafka clients are told to
        connect, if not there. ``listeners``: named listeners
        (:mod:`highwater.config.listeners`), each serving every service, the broker and
        the coordinator registered on all of them; without them, the one listener
        ``PLAINTEXT`` on ``listen``."""
        self.listeners = listeners or resolve_listeners(listen=listen)
        listen = self.listeners.inter_broker.address
        for listener in self.listeners.bound:
            if listener.port == 0:
                raise ValueError(f"{listener}: the embedded server needs a real port, not 0")
        self.listen = listen
        self.data_dir = Path(data_dir)
        # The broker's service is served by the controller's gRPC server; the broker
        # reads the controller's state machine: each needs the other, so the service is
        # looked up when the server starts.
        # One broker: the offsets topic has one replica (Kafka's development configuration
        # sets offsets.topic.replication.factor=1 for the same reason).
        controller_settings = controller_settings or ControllerSettings()
        controller_settings = dataclasses.replace(
            controller_settings,
            controller=dataclasses.replace(
                controller_settings.controller, offsets_topic_replication_factor=1
            ),
        )
        self.controller = ControllerServer(
            node_id=EMBEDDED_NODE_ID,
            listen=listen,
            voters={EMBEDDED_NODE_ID: listen},
            data_dir=self.data_dir / "controller",
            settings=controller_settings,
            services=[
                GrpcService(BROKER_SERVICE_NAME, lambda server: self.broker.add_servicer(server)),
                GrpcService(
                    COORDINATOR_SERVICE_NAME,
                    lambda server: self.coordinator.add_servicer(server),
                ),
            ],
            listener_name=self.listeners.host_listener_name,
            more_listeners=self.listeners.more_bound,
        )
        endpoints = registered_endpoints(self.listeners)
        self.broker = BrokerServer(
            node_id=EMBEDDED_NODE_ID,
            advertised=listen,
            listeners=endpoints,
            data_dir=[Path(d) for d in log_dirs] or [self.data_dir / "broker"],
            controllers=[listen],
            metadata=self.controller.machine,
            settings=broker_settings,
            report_serving=self.controller.raft.report_serving,
            kafka_listen=kafka_listen,
            kafka_advertised=kafka_advertised,
            quorum_cluster_id=lambda: self.controller.raft.cluster_id,
        )
        self.coordinator = CoordinatorServer(
            node_id=EMBEDDED_NODE_ID,
            advertised=listen,
            listeners=endpoints,
            controllers=[listen],
            metadata=self.controller.machine,
            report_serving=self.controller.raft.report_serving,
            settings=coordinator_settings
            or CoordinatorSettings(
                group=GroupCoordinatorSettings(group_initial_rebalance_delay_ms=0)
            ),
        )

    @property
    def failure(self) -> BaseException | None:
        return self.broker.failure or self.controller.failure

    async def start(self) -> None:
        """Start the controller, then the broker and the coordinator (they register
        through the controller)."""
        await self.controller.start()
        try:
            await self.broker.start()
            await self.coordinator.start()
        except BaseException:
            await self.broker.stop()
            await self.controller.stop()
            raise

    async def stop(self) -> None:
        """Stop the coordinator, then the broker (a controlled shutdown), then the
        controller."""
        try:
            await self.coordinator.stop()
            await self.broker.stop()
        finally:
            await self.controller.stop()

    async def wait_stopped(self) -> None:
        """Return once the controller stopped or the broker failed (every log directory
        failed: the whole process stops, as a combined Kafka server halts)."""
        waits = [
            asyncio.ensure_future(self.controller.wait_stopped()),
            asyncio.ensure_future(self.broker.wait_failed()),
        ]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()
