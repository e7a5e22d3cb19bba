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

from highwater.cli.server_config import load_role_config, server_config_options
from highwater.cli.serving import (
    controllers_option,
    listen_option,
    run_until_signalled,
    telemetry_option,
    tls_options,
)
from highwater.coordinator.core import GroupCoordinatorSettings
from highwater.coordinator.service import CoordinatorSettings
from highwater.coordinator.standalone import StandaloneCoordinator
from highwater.rpc.endpoints import parse_endpoint


@click.command("coordinator")
@telemetry_option
@tls_options
@click.option("--node-id", type=click.IntRange(min=0, max=2**31 - 1), required=True)
@listen_option(required=True, help="Address to serve the GroupCoordinator API on.")
@controllers_option
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
@server_config_options
def coordinator(
    node_id: int,
    listen: str,
    controllers: list[str],
    data_dir: Path | None,
    group_initial_rebalance_delay_ms: int,
    config_file: Path | None,
    overrides: tuple[str, ...],
) -> None:
    """Run a group coordinator: consumer groups, rebalances and committed offsets.

    Of its --config file and --override keys it uses group.initial.rebalance.delay.ms.
    """
    config = load_role_config(
        config_file,
        overrides,
        {"group_initial_rebalance_delay_ms": "group.initial.rebalance.delay.ms"},
    )
    _, port = parse_endpoint(listen)
    if port == 0:
        raise click.BadParameter("a coordinator needs a real port, not 0", param_hint="--listen")
    settings = CoordinatorSettings(
        group=GroupCoordinatorSettings(
            group_initial_rebalance_delay_ms=config.get("group.initial.rebalance.delay.ms")
        )
    )
    server = StandaloneCoordinator(
        node_id=node_id,
        listen=listen,
        controllers=controllers,
        data_dir=data_dir,
        settings=settings,
    )
    run_until_signalled(server, "coordinator")
