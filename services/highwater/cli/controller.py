"""``highwater controller``: run one voter of the metadata quorum (a KRaft controller).

The quorum is given one of three ways: ``--voters`` (a static quorum, fixed for good),
``--initial-controllers ID@HOST:PORT:DIRECTORY-ID,...`` (a dynamic quorum, KIP-853,
bootstrapped with these voters; each controller's data directory takes the directory id
given for it) or ``--bootstrap-controllers HOST:PORT,...`` (join a running dynamic quorum:
the controller follows as an observer until ``highwater quorum add-controller`` makes it
a voter; a controller whose disk was wiped rejoins this way, with a new directory id).
With ``controller.quorum.auto.join.enable=true`` (``--override``, or the ``--config`` file)
such a controller asks the leader itself, once it follows: it removes the voter its node id
had before its disk was wiped, then adds itself, as Kafka's controllers do.
``--advertised-listener HOST:PORT`` is the endpoint it announces to the quorum, when the
others cannot reach it at ``--listen``; a voter that finds the voter set naming it at
another endpoint (it restarted on a new address) sends UpdateRaftVoter itself.

The process serves ``highwater.internal.v1.Raft`` and ``highwater.internal.v1.Controller``
(plus gRPC health and reflection) on ``--listen`` and keeps the metadata log, its snapshots and
``quorum-state`` under ``--data-dir``. The voter that Raft elects leader becomes the
active controller (:class:`~highwater.controller.service.ControllerServer`); the others
answer Controller calls with NOT_CONTROLLER and the active controller's address.

SIGTERM and SIGINT stop the voter gracefully: a leader resigns first (EndQuorumEpoch),
so the others elect a successor without waiting for a timeout.

``--migration-from etcd://...`` starts the quorum in migration mode
(:mod:`highwater.controller.etcd_migration`): etcd is read first, and a store that does not
answer, holds no cluster or holds another cluster than ``--cluster-id`` stops the command
before anything is written.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import click

from highwater.cli.addresses import parse_addresses
from highwater.cli.server_config import (
    controller_config,
    load_role_config,
    server_config_options,
)
from highwater.cli.serving import (
    controller_replica_options,
    etcd_store_option,
    etcd_tls_options,
    listen_option,
    optional_address,
    run_until_signalled,
    telemetry_option,
    tls_options,
)
from highwater.controller.etcd_migration import etcd_cluster_id
from highwater.controller.service import (
    DEFAULT_APPEND_LINGER_MS,
    DEFAULT_APPEND_PIPELINE_DEPTH,
    ControllerServer,
    ControllerSettings,
)
from highwater.errors import HighwaterError
from highwater.etcd_metadata.endpoints import EtcdStoreAddress
from highwater.raft.driver import RaftServerSettings
from highwater.raft.node import RaftConfig
from highwater.raft.voter_set import MembershipChangeError, VoterSet, parse_initial_controllers


def _initial_controllers(
    _ctx: click.Context, _param: click.Parameter, value: str | None
) -> VoterSet | None:
    if value is None:
        return None
    try:
        return parse_initial_controllers(value)
    except MembershipChangeError as e:
        raise click.BadParameter(str(e)) from None


def _bootstrap_controllers(
    _ctx: click.Context, _param: click.Parameter, value: str | None
) -> list[str] | None:
    return None if value is None else parse_addresses(value)


@click.command("controller")
@telemetry_option
@tls_options
@controller_replica_options
@click.option(
    "--initial-controllers",
    default=None,
    callback=_initial_controllers,
    metavar="ID@HOST:PORT:DIRECTORY-ID,...",
    help="Bootstrap a dynamic quorum (KIP-853) with these voters; the same list on each. "
    "Voters then change with highwater quorum add-controller / remove-controller.",
)
@click.option(
    "--bootstrap-controllers",
    default=None,
    callback=_bootstrap_controllers,
    metavar="HOST:PORT,...",
    help="Join the running dynamic quorum these controllers serve, as an observer, until "
    "highwater quorum add-controller makes this controller a voter.",
)
@listen_option(required=True, help="Address to serve the Raft protocol and the Controller API on.")
@click.option(
    "--advertised-listener",
    default=None,
    callback=optional_address,
    metavar="HOST:PORT",
    help="Where the other controllers and observers reach this one, if not --listen (a "
    "controller listening on 0.0.0.0, or behind a proxy): the endpoint a dynamic quorum's "
    "voter announces. A voter whose endpoint changed sends UpdateRaftVoter itself at start.",
)
@click.option(
    "--offsets-topic-replication-factor",
    type=click.IntRange(1, 32767),
    default=3,
    show_default=True,
    help="Replicas of __consumer_offsets; it is created once this many brokers are up "
    "(offsets.topic.replication.factor).",
)
@click.option(
    "--migration-from",
    default=None,
    callback=etcd_store_option,
    metavar="etcd://HOST:PORT[,HOST:PORT...][/CLUSTER]",
    help="Migrate the etcd-mode cluster kept there to this quorum (KIP-866's migration, "
    "docs/etcd-mode.md): the active controller copies its metadata, dual writes to etcd and "
    "serves its brokers until every broker was restarted with --controllers. The quorum "
    "takes etcd's cluster id (a different --cluster-id is refused).",
)
@click.option(
    "--append-linger-ms",
    type=click.IntRange(0, 1000),
    default=DEFAULT_APPEND_LINGER_MS,
    show_default=True,
    help="How long a group of Controller requests that started while the one before is "
    "being committed keeps taking requests in before it goes to Raft as one batch "
    "(controller.quorum.append.linger.ms), while it holds fewer requests than the group "
    "before it. A lone request is never held.",
)
@click.option(
    "--append-pipeline-depth",
    type=click.IntRange(1, 64),
    default=DEFAULT_APPEND_PIPELINE_DEPTH,
    show_default=True,
    help="How many batches of Controller requests may be on their way to a majority at "
    "once; a group of requests started while that many are keeps taking requests in until "
    "the oldest commits.",
)
@etcd_tls_options("migration_from")
@server_config_options
def controller(
    node_id: int,
    listen: str,
    advertised_listener: str | None,
    voters: dict[int, str] | None,
    initial_controllers: VoterSet | None,
    bootstrap_controllers: list[str] | None,
    data_dir: Path,
    cluster_id: str | None,
    snapshot_bytes: int,
    offsets_topic_replication_factor: int,
    migration_from: EtcdStoreAddress | None,
    append_linger_ms: int,
    append_pipeline_depth: int,
    config_file: Path | None,
    overrides: tuple[str, ...],
) -> None:
    """Run a voter of the metadata quorum (a KRaft controller).

    The cluster defaults of its --config file and --override keys (num.partitions,
    default.replication.factor, min.insync.replicas, log.retention.hours...) go into the
    metadata once it is the active controller.
    """
    config = load_role_config(
        config_file,
        overrides,
        {
            "offsets_topic_replication_factor": "offsets.topic.replication.factor",
            "snapshot_bytes": "metadata.log.max.record.bytes.between.snapshots",
        },
    )
    given = [
        name
        for name, value in (
            ("--voters", voters),
            ("--initial-controllers", initial_controllers),
            ("--bootstrap-controllers", bootstrap_controllers),
        )
        if value is not None
    ]
    if len(given) != 1:
        raise click.UsageError(
            "give the quorum one way: --voters (static), --initial-controllers or "
            "--bootstrap-controllers (dynamic)" + (f", not {' and '.join(given)}" if given else "")
        )
    if voters is not None and node_id not in voters:
        raise click.BadParameter(
            f"node {node_id} is not among the voters {sorted(voters)}", param_hint="--node-id"
        )
    if initial_controllers is not None:
        mine = initial_controllers.get(node_id)
        if mine is None:
            raise click.BadParameter(
                f"node {node_id} is not among the initial controllers "
                f"{sorted(initial_controllers.ids)}: a new controller joins with "
                "--bootstrap-controllers",
                param_hint="--node-id",
            )
    if migration_from is not None and voters is None:
        raise click.UsageError("--migration-from needs a static quorum (--voters)")
    if migration_from is not None:
        # Before anything is written: etcd answers, and its cluster is this quorum's.
        try:
            cluster_id = asyncio.run(etcd_cluster_id(migration_from, cluster_id))
        except HighwaterError as e:
            raise click.ClickException(f"--migration-from {migration_from}: {e}") from None
    settings = ControllerSettings(
        append_linger_ms=append_linger_ms,
        append_pipeline_depth=append_pipeline_depth,
        migration_from=migration_from,
        raft=RaftServerSettings(
            raft=RaftConfig(auto_join=config.get("controller.quorum.auto.join.enable")),
            metadata_log_max_record_bytes_between_snapshots=config.get(
                "metadata.log.max.record.bytes.between.snapshots"
            ),
            discovery_timeout_ms=config.get("controller.quorum.bootstrap.timeout.ms"),
        ),
        controller=controller_config(config),
    )
    server = ControllerServer(
        node_id=node_id,
        listen=listen,
        voters=voters,
        initial_voters=initial_controllers,
        bootstrap_controllers=bootstrap_controllers or (),
        data_dir=data_dir,
        cluster_id=cluster_id,
        settings=settings,
        advertised=advertised_listener,
    )
    run_until_signalled(server, "controller")
