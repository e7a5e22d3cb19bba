"""The processes of the etcd metadata mode: a broker with its controller candidate, a coordinator.

``highwater broker --metadata-store etcd://...`` runs an :class:`EtcdBroker`: one gRPC
port serving the Broker API, the Controller API of the process's controller candidate
(:class:`~highwater.controller.etcd_controller.EtcdController`: it answers while it is
the active controller and redirects to the one that is otherwise) and the
``BrokerMetadata`` push service, whose :class:`~highwater.etcd_metadata.pushed.PushedMetadata`
is the broker's image source. At start, in order: the etcd session (a wrong endpoint
fails here, naming it), the cluster id (created by the first process; a data directory of
another cluster is refused, naming the key), the broker's leased ``brokers/ids/<id>`` key
(waiting for an old session's key to go), then the candidate and the broker, whose
controller calls go to its own port and from there to the active controller.

``highwater coordinator --metadata-store ...`` runs an :class:`EtcdCoordinator`: the
coordinator with a ``PushedMetadata`` image, calling the controller through the brokers
registered in etcd. It follows those registrations for as long as it runs (a watch on the
``brokers/ids`` keys; while etcd cannot be read, the addresses it last saw): its
controller calls go to the brokers registered now, so a rolling replacement of every
broker, the controller's too, at new addresses does not leave it asking addresses where
nothing serves.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from highwater.broker.service import BROKER_SERVICE_NAME, BrokerServer, BrokerSettings
from highwater.config.listeners import Listeners
from highwater.controller.etcd_controller import EtcdController, EtcdControllerSettings
from highwater.controller_api.codec import CONTROLLER_HEALTH_ALIASES, CONTROLLER_SERVICE_NAME
from highwater.coordinator.service import (
    COORDINATOR_SERVICE_NAME,
    CoordinatorServer,
    CoordinatorSettings,
)
from highwater.errors import HighwaterError
from highwater.etcd_metadata.connection import EtcdConnection, EtcdUnavailableError, KeyVersion
from highwater.etcd_metadata.endpoints import EtcdStoreAddress
from highwater.etcd_metadata.keys import KeySpace
from highwater.etcd_metadata.pushed import (
    BROKER_METADATA_SERVICE_NAME,
    PushedMetadata,
    add_pushed_metadata_servicer,
)
from highwater.etcd_metadata.registration import (
    BrokerPresence,
    broker_key_value,
    claim_cluster_id,
)
from highwater.etcd_metadata.session import EtcdSession
from highwater.metadata.records import registered_endpoints
from highwater.raft.driver import RaftServerSettings
from highwater.rpc.server import GrpcHost, GrpcService
from highwater.storage.log_manager import read_meta_properties

__all__ = ["EtcdBroker", "EtcdCoordinator"]

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = RaftServerSettings().max_message_bytes


def _stored_cluster_id(log_dirs: Sequence[Path]) -> str | None:
    """The cluster id the data directories already belong to, if any."""
    for directory in log_dirs:
        with contextlib.suppress(OSError, HighwaterError):
            cluster_id = read_meta_properties(directory).get("cluster.id")
            if cluster_id:
                return cluster_id
    return None


def _first_listeners(values: Iterable[bytes | KeyVersion]) -> list[str]:
    """The first listener's address of each ``brokers/ids`` value that names one, sorted."""
    addresses = []
    for value in values:
        raw = value.value if isinstance(value, KeyVersion) else value
        with contextlib.suppress(ValueError, KeyError, TypeError, IndexError):
            first = json.loads(raw)["listeners"][0]
            addresses.append(f"{first['host']}:{first['port']}")
    return sorted(addresses)


class EtcdBroker:
    """A broker and its controller candidate in etcd mode (see the module docstring)."""

    def __init__(
        self,
        *,
        node_id: int,
        listeners: Listeners,
        store: EtcdStoreAddress,
        data_dir: Path,
        settings: BrokerSettings | None = None,
        log_dirs: Sequence[Path] = (),
        session_ttl_s: int = 6,
        controller_settings: EtcdControllerSettings | None = None,
        kafka_listen: str | None = None,
        kafka_advertised: str | None = None,
    ) -> None:
        """``kafka_listen``, ``kafka_advertised``: the broker's Kafka listener, as in KRaft
        mode (:class:`~highwater.broker.service.BrokerServer`'s)."""
        self.node_id = node_id
        self.listeners = listeners
        self.store = store
        self.space = KeySpace(store.prefix)
        self.data_dir = Path(data_dir)
        self.log_dirs = [Path(d) for d in log_dirs] or [self.data_dir / "logs"]
        self.settings = settings
        self.session_ttl_s = session_ttl_s
        self.controller_settings = controller_settings
        self.kafka_listen = kafka_listen
        self.kafka_advertised = kafka_advertised
        self.advertised = listeners.advertised[0].address
        self.session: EtcdSession | None = None
        self.presence: BrokerPresence | None = None
        self.controller: EtcdController | None = None
        self.broker: BrokerServer | None = None
        self.pushed = PushedMetadata()
        self.cluster_id = ""
        self._host: GrpcHost | None = None

    @property
    def failure(self) -> BaseException | None:
        return self.broker.failure if self.broker is not None else None

    async def start(self) -> None:
        self.session = session = EtcdSession(EtcdConnection(self.store), ttl_s=self.session_ttl_s)
        await session.start()
        try:
            await self._start(session)
        except BaseException:
            await self.stop()
            raise

    async def _start(self, session: EtcdSession) -> None:
        connection = EtcdConnection(self.store)
        self.cluster_id = await claim_cluster_id(
            connection, self.space, _stored_cluster_id(self.log_dirs)
        )
        endpoints = registered_endpoints(self.listeners)
        rack = self.settings.rack if self.settings is not None else None
        self.presence = BrokerPresence(
            connection, self.space, session, self.node_id, broker_key_value(endpoints, rack)
        )
        await self.presence.register()
        self.controller = controller = EtcdController(
            node_id=self.node_id,
            address=self.advertised,
            connection=EtcdConnection(self.store),
            space=self.space,
            session=session,
            cluster_id=self.cluster_id,
            settings=self.controller_settings,
        )
        self._host = host = GrpcHost(
            self.listeners.inter_broker.address,
            [
                GrpcService(
                    BROKER_SERVICE_NAME, lambda server: self._broker().add_servicer(server)
                ),
                GrpcService(
                    CONTROLLER_SERVICE_NAME,
                    controller.add_servicer,
                    serving_at_start=True,
                    health_aliases=CONTROLLER_HEALTH_ALIASES,
                ),
                GrpcService(
                    BROKER_METADATA_SERVICE_NAME,
                    lambda server: add_pushed_metadata_servicer(server, self.pushed),
                    serving_at_start=True,
                ),
            ],
            max_message_bytes=MAX_MESSAGE_BYTES,
            listener_name=self.listeners.host_listener_name,
            more_listeners=self.listeners.more_bound,
        )
        self.broker = broker = BrokerServer(
            node_id=self.node_id,
            advertised=self.advertised,
            listeners=endpoints,
            data_dir=self.log_dirs,
            controllers=[self.advertised],
            metadata=self.pushed,
            settings=self.settings,
            report_serving=host.report_serving,
            cluster_id=self.cluster_id,
            kafka_listen=self.kafka_listen,
            kafka_advertised=self.kafka_advertised,
        )
        broker.requests.control_plane = lambda: (
            self.cluster_id,
            self.pushed.controller_id,
            "etcd",
        )
        await host.start()
        await controller.start()
        await broker.start()

    def _broker(self) -> BrokerServer:
        if self.broker is None:
            raise RuntimeError("the broker has not started")
        return self.broker

    async def stop(self) -> None:
        """Controlled shutdown of the broker (its leaderships move first), then the
        candidate gives up the controller key, then the session's lease is revoked."""
        try:
            if self.broker is not None:
                await self.broker.stop()
        finally:
            if self.controller is not None:
                await self.controller.stop()
            if self.presence is not None:
                await self.presence.stop()
            if self.session is not None:
                await self.session.stop()
            if self._host is not None:
                await self._host.stop(1.0)

    async def wait_stopped(self) -> None:
        if self.broker is not None:
            await self.broker.wait_failed()
        else:
            await asyncio.Event().wait()


class EtcdCoordinator:
    """A group coordinator in etcd mode (see the module docstring)."""

    def __init__(
        self,
        *,
        node_id: int,
        listeners: Listeners,
        store: EtcdStoreAddress,
        settings: CoordinatorSettings | None = None,
    ) -> None:
        self.node_id = node_id
        self.listeners = listeners
        self.store = store
        self.space = KeySpace(store.prefix)
        self.settings = settings
        self.pushed = PushedMetadata()
        self.coordinator: CoordinatorServer | None = None
        self._host: GrpcHost | None = None
        self._stopped = asyncio.Event()
        self._following: asyncio.Task[None] | None = None

    @property
    def failure(self) -> BaseException | None:
        return None

    async def start(self) -> None:
        connection = EtcdConnection(self.store)
        try:
            await claim_cluster_id(connection, self.space)
            brokers = await self._broker_addresses(connection)
        finally:
            await connection.close()
        self._host = host = GrpcHost(
            self.listeners.inter_broker.address,
            [
                GrpcService(
                    COORDINATOR_SERVICE_NAME,
                    lambda server: self._coordinator().add_servicer(server),
                ),
                GrpcService(
                    BROKER_METADATA_SERVICE_NAME,
                    lambda server: add_pushed_metadata_servicer(server, self.pushed),
                    serving_at_start=True,
                ),
            ],
            max_message_bytes=MAX_MESSAGE_BYTES,
            listener_name=self.listeners.host_listener_name,
            more_listeners=self.listeners.more_bound,
        )
        self.coordinator = CoordinatorServer(
            node_id=self.node_id,
            advertised=self.listeners.advertised[0].address,
            listeners=registered_endpoints(self.listeners),
            controllers=brokers,
            metadata=self.pushed,
            settings=self.settings,
            report_serving=host.report_serving,
        )
        await host.start()
        # Followed from the registration on: a broker may go before the controller answers.
        self._following = asyncio.create_task(self._follow_brokers())
        try:
            await self.coordinator.start()
        except BaseException:
            await self._stop_following()
            await host.stop(0)
            raise

    async def _broker_addresses(self, connection: EtcdConnection) -> list[str]:
        """The brokers registered now (their candidates lead the way to the controller);
        waits for the first one."""
        for _ in range(1200):
            _, keys = await connection.get_prefix(self.space.broker_ids)
            addresses = _first_listeners(keys.values())
            if addresses:
                return addresses
            await asyncio.sleep(0.1)
        raise HighwaterError(f"no broker registered under {self.space.broker_ids} in 120 s")

    async def _follow_brokers(self) -> None:
        """Keep the coordinator's controller calls going to the brokers registered now: a
        read of the ``brokers/ids`` keys, then a watch applying each change; after an etcd
        failure (the watch broken, etcd down), a second later, the same again."""
        connection = EtcdConnection(self.store)
        prefix = self.space.broker_ids
        try:
            while True:
                try:
                    revision, keys = await connection.get_prefix(prefix)
                    registered = {key: kv.value for key, kv in keys.items()}
                    self._take_brokers(registered)
                    async for batch in connection.watch_prefix_changes(prefix, revision + 1):
                        for key, _, version in batch.changes:
                            if version is None:
                                registered.pop(key, None)
                            else:
                                registered[key] = version.value
                        self._take_brokers(registered)
                except EtcdUnavailableError as e:
                    log.info(
                        "coordinator %d: following the registered brokers: %s; again in 1 s",
                        self.node_id,
                        e,
                    )
                except Exception:
                    log.exception("coordinator %d: following the registered brokers", self.node_id)
                await asyncio.sleep(1.0)
        finally:
            await connection.close()

    def _take_brokers(self, registered: Mapping[str, bytes]) -> None:
        addresses = _first_listeners(registered.values())
        if addresses and self.coordinator is not None:
            self.coordinator.controller.replace_bootstrap(addresses)

    def _coordinator(self) -> CoordinatorServer:
        if self.coordinator is None:
            raise RuntimeError("the coordinator has not started")
        return self.coordinator

    async def _stop_following(self) -> None:
        if self._following is not None:
            self._following.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._following
            self._following = None

    async def stop(self) -> None:
        await self._stop_following()
        try:
            if self.coordinator is not None:
                await self.coordinator.stop()
        finally:
            if self._host is not None:
                await self._host.stop(1.0)
            self._stopped.set()

    async def wait_stopped(self) -> None:
        await self._stopped.wait()
