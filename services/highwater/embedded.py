"""``EmbeddedServer``: the whole cluster in one process on one port (``highwater server``).

A single-voter controller quorum (node 1) and a broker (node 1) share one gRPC server:
``highwater.v1.Controller``, ``highwater.v1.Broker`` and ``highwater.v1.Raft``, with
health and reflection. The broker takes its metadata straight from the controller's
state machine instead of replicating the metadata log a second time, and registers and
heartbeats through the Controller API like any broker. The data directory holds
``controller/`` (the metadata log, its snapshots, ``quorum-state``) and ``broker/`` (the
partition logs and their checkpoints).
"""

from __future__ import annotations

from pathlib import Path

from highwater.broker.service import BROKER_SERVICE_NAME, BrokerServer, BrokerSettings
from highwater.controller.service import ControllerServer, ControllerSettings
from highwater.raft.service import GrpcService, parse_endpoint

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
    ) -> None:
        _, port = parse_endpoint(listen)
        if port == 0:
            raise ValueError(f"{listen}: the embedded server needs a real port, not 0")
        self.listen = listen
        self.data_dir = Path(data_dir)
        # The broker's service is served by the controller's gRPC server; the broker
        # reads the controller's state machine: each needs the other, so the service is
        # looked up when the server starts.
        self.controller = ControllerServer(
            node_id=EMBEDDED_NODE_ID,
            listen=listen,
            voters={EMBEDDED_NODE_ID: listen},
            data_dir=self.data_dir / "controller",
            settings=controller_settings,
            services=[
                GrpcService(BROKER_SERVICE_NAME, lambda server: self.broker.add_servicer(server))
            ],
        )
        self.broker = BrokerServer(
            node_id=EMBEDDED_NODE_ID,
            advertised=listen,
            data_dir=self.data_dir / "broker",
            controllers=[listen],
            metadata=self.controller.machine,
            settings=broker_settings,
        )

    @property
    def failure(self) -> BaseException | None:
        return self.controller.failure

    async def start(self) -> None:
        """Start the controller, then the broker (it registers through the controller)."""
        await self.controller.start()
        try:
            await self.broker.start()
        except BaseException:
            await self.controller.stop()
            raise

    async def stop(self) -> None:
        """Stop the broker first (a controlled shutdown), then the controller."""
        try:
            await self.broker.stop()
        finally:
            await self.controller.stop()

    async def wait_stopped(self) -> None:
        await self.controller.wait_stopped()
