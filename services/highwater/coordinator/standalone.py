"""``StandaloneCoordinator``: a group coordinator process of its own (``highwater coordinator``).

It follows the metadata quorum as an observer (the metadata log is a cache: kept under
``--data-dir`` when one is given, else in a temporary directory removed at exit, since a
coordinator owns no state of its own) and serves ``highwater.v1.GroupCoordinator`` on the
observer's gRPC port, with health and reflection.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

from highwater.config.listeners import Listeners, resolve_listeners
from highwater.coordinator.service import (
    COORDINATOR_SERVICE_NAME,
    CoordinatorServer,
    CoordinatorSettings,
)
from highwater.metadata.observer import MetadataObserver, discover_quorum_to_register
from highwater.metadata.records import registered_endpoints
from highwater.rpc.server import GrpcService

__all__ = ["StandaloneCoordinator"]


class StandaloneCoordinator:
    """A coordinator with its own metadata observer (see the module docstring)."""

    def __init__(
        self,
        *,
        node_id: int,
        listen: str,
        controllers: Sequence[str],
        data_dir: Path | None = None,
        settings: CoordinatorSettings | None = None,
        listeners: Listeners | None = None,
    ) -> None:
        """``listeners``: named listeners (:mod:`highwater.config.listeners`), the same
        names as the brokers'; without them, the one listener ``PLAINTEXT`` on ``listen``."""
        self.node_id = node_id
        self.listeners = listeners or resolve_listeners(listen=listen)
        self.listen = self.listeners.inter_broker.address
        self.controllers = list(controllers)
        self.data_dir = data_dir
        self.settings = settings
        self.observer: MetadataObserver | None = None
        self.coordinator: CoordinatorServer | None = None
        self._temporary_dir: Path | None = None

    @property
    def failure(self) -> BaseException | None:
        return self.observer.failure if self.observer is not None else None

    async def start(self) -> None:
        quorum = await discover_quorum_to_register(
            self.controllers,
            f"coordinator {self.node_id}",
            (self.settings or CoordinatorSettings()).initial_registration_timeout_ms,
        )
        if self.data_dir is None:
            self._temporary_dir = Path(
                tempfile.mkdtemp(prefix=f"highwater-coordinator-{self.node_id}-")
            )
        metadata_dir = (self.data_dir or self._temporary_dir or Path()) / "metadata"
        service = GrpcService(
            COORDINATOR_SERVICE_NAME, lambda server: self._require().add_servicer(server)
        )
        self.observer = MetadataObserver(
            node_id=self.node_id,
            voters=quorum.voters,
            voters_offset=quorum.voters_offset,
            data_dir=metadata_dir,
            cluster_id=quorum.cluster_id or None,
            listen=self.listen,
            services=[service],
            listener_name=self.listeners.host_listener_name,
            more_listeners=self.listeners.more_bound,
        )
        self.coordinator = CoordinatorServer(
            node_id=self.node_id,
            advertised=self.listeners.advertised[0].address,
            listeners=registered_endpoints(self.listeners),
            controllers=self.controllers,
            metadata=self.observer,
            settings=self.settings,
            report_serving=self.observer.raft.report_serving,
        )
        await self.observer.start()
        try:
            await self.coordinator.start()
        except BaseException:
            await self.observer.stop()
            raise

    async def stop(self) -> None:
        try:
            if self.coordinator is not None:
                await self.coordinator.stop()
        finally:
            if self.observer is not None:
                await self.observer.stop()
            if self._temporary_dir is not None:
                shutil.rmtree(self._temporary_dir, ignore_errors=True)

    async def wait_stopped(self) -> None:
        if self.observer is not None:
            await self.observer.wait_stopped()

    def _require(self) -> CoordinatorServer:
        if self.coordinator is None:
            raise RuntimeError("the coordinator has not started")
        return self.coordinator
