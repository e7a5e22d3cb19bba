"""``highwater coordinator``: run one group coordinator of a cluster.

The coordinator follows the controller quorum named by ``--controllers`` as a metadata
observer, registers and heartbeats, and serves ``highwater.v1.GroupCoordinator`` on
``--listen`` for the groups of the ``__consumer_offsets`` partitions the controller
assigns it. SIGTERM and SIGINT stop it gracefully: it gives its partitions back first.
Node ids are unique across the cluster's controllers, brokers and coordinators.
"""

from __future__ import annotations

from pathlib import Path

import click

from highwater.cli.server_config import (
    LISTENER_FLAGS,
    listener_options,
    load_role_config,
    role_listeners,
    server_config_options,
)
from highwater.cli.serving import (
    controllers_option,
    etcd_tls_options,
    listen_option,
    metadata_store_option,
    require_one_metadata_source,
    run_until_signalled,
    telemetry_option,
    tls_options,
)
from highwater.coordinator.core import GroupCoordinatorSettings
from highwater.coordinator.service import CoordinatorSettings
from highwater.coordinator.standalone import StandaloneCoordinator
from highwater.etcd_metadata.endpoints import EtcdStoreAddress


@click.command("coordinator")
@telemetry_option
@tls_options
@click.option("--node-id", type=click.IntRange(min=0, max=2**31 - 1), required=True)
@listen_option(
    required=False,
    help="Address to serve the GroupCoordinator API on: the one listener PLAINTEXT; or "
    "named listeners (the brokers' names) with --listeners / the listeners key.",
)
@controllers_option
@metadata_store_option
@etcd_tls_options("metadata_store")
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where to cache the metadata log (default: a temporary directory).",
)
@click.option(
    "--group-initial-rebalance-delay-ms",
    type=click.IntRange(min=0),
    default=3000,
    show_default=True,
    help="How long the first rebalance of an empty group waits for more members "
    "(group.initial.rebalance.delay.ms).",
)
@listener_options
@server_config_options
def coordinator(
    node_id: int,
    listen: str | None,
    controllers: list[str],
    metadata_store: EtcdStoreAddress | None,
    data_dir: Path | None,
    group_initial_rebalance_delay_ms: int,
    listeners: str | None,
    advertised_listeners: str | None,
    inter_broker_listener_name: str | None,
    config_file: Path | None,
    overrides: tuple[str, ...],
) -> None:
    """Run a group coordinator: consumer groups, rebalances and committed offsets.

    Of its --config file and --override keys it uses group.initial.rebalance.delay.ms,
    coordinator.heartbeat.interval.ms and coordinator.session.timeout.ms (its lease: keep
    it no longer than the controllers'), initial.broker.registration.timeout.ms, and the
    listeners (listeners, advertised.listeners, inter.broker.listener.name).
    """
    require_one_metadata_source(controllers, metadata_store)
    config = load_role_config(
        config_file,
        overrides,
        {"group_initial_rebalance_delay_ms": "group.initial.rebalance.delay.ms", **LISTENER_FLAGS},
    )
    named = role_listeners(config, listen)
    for listener in named.bound:
        if listener.port == 0:
            raise click.BadParameter(
                f"a coordinator needs a real port, not 0 ({listener})", param_hint="--listen"
            )
    settings = CoordinatorSettings(
        group=GroupCoordinatorSettings(
            group_initial_rebalance_delay_ms=config.get("group.initial.rebalance.delay.ms")
        ),
        heartbeat_interval_ms=config.get("coordinator.heartbeat.interval.ms"),
        session_timeout_ms=config.get("coordinator.session.timeout.ms"),
        initial_registration_timeout_ms=config.get("initial.broker.registration.timeout.ms"),
    )
    if metadata_store is not None:
        # Imported here: the etcd client is only loaded by coordinators using it.
        from highwater.cli.etcd_mode import EtcdCoordinator

        run_until_signalled(
            EtcdCoordinator(
                node_id=node_id, listeners=named, store=metadata_store, settings=settings
            ),
            "coordinator",
        )
        return
    server = StandaloneCoordinator(
        node_id=node_id,
        listen=named.inter_broker.address,
        listeners=named,
        controllers=controllers,
        data_dir=data_dir,
        settings=settings,
    )
    run_until_signalled(server, "coordinator")
