"""``highwater controller``: run one voter of the metadata quorum (a KRaft controller).

The process serves ``highwater.v1.Raft`` and ``highwater.v1.Controller`` (plus gRPC
health and reflection) on ``--listen`` and keeps the metadata log, its snapshots and
``quorum-state`` under ``--data-dir``. The voter that Raft elects leader becomes the
active controller (:class:`~highwater.controller.service.ControllerServer`); the others
answer Controller calls with NOT_CONTROLLER and the active controller's address.

SIGTERM and SIGINT stop the voter gracefully: a leader resigns first (EndQuorumEpoch),
so the others elect a successor without waiting for a timeout.
"""

from __future__ import annotations

from pathlib import Path

import click

from highwater.cli.serving import (
    listen_option,
    metadata_replica_options,
    run_until_signalled,
    telemetry_option,
)
from highwater.controller.config import ControllerConfig
from highwater.controller.service import ControllerServer, ControllerSettings
from highwater.raft.driver import RaftServerSettings


@click.command("controller")
@telemetry_option
@metadata_replica_options
@listen_option(required=True, help="Address to serve the Raft protocol and the Controller API on.")
@click.option(
    "--offsets-topic-replication-factor",
    type=click.IntRange(1, 32767),
    default=3,
    show_default=True,
    help="Replicas of __consumer_offsets; it is created once this many brokers are up.",
)
def controller(
    node_id: int,
    listen: str,
    voters: dict[int, str],
    data_dir: Path,
    cluster_id: str | None,
    snapshot_bytes: int,
    offsets_topic_replication_factor: int,
) -> None:
    """Run a voter of the metadata quorum (a KRaft controller)."""
    if node_id not in voters:
        raise click.BadParameter(
            f"node {node_id} is not among the voters {sorted(voters)}", param_hint="--node-id"
        )
    settings = ControllerSettings(
        raft=RaftServerSettings(metadata_log_max_record_bytes_between_snapshots=snapshot_bytes),
        controller=ControllerConfig(
            offsets_topic_replication_factor=offsets_topic_replication_factor
        ),
    )
    server = ControllerServer(
        node_id=node_id,
        listen=listen,
        voters=voters,
        data_dir=data_dir,
        cluster_id=cluster_id,
        settings=settings,
    )
    run_until_signalled(server, "controller")
