"""``highwater broker``: run one broker of a cluster.

The broker follows the controller quorum named by ``--controllers`` as a metadata
observer (or, with ``--metadata-store etcd://...``, keeps the metadata in etcd and runs a
controller candidate beside it: :mod:`highwater.cli.etcd_mode`), registers and
heartbeats, serves ``highwater.v1.Broker`` on ``--listen`` and replicates the partitions
it follows from their leaders. SIGTERM and SIGINT stop it with a controlled shutdown: the
controller moves its leaderships away first.
"""

from __future__ import annotations

from pathlib import Path

import click

from highwater.broker.service import BrokerSettings
from highwater.broker.standalone import StandaloneBroker
from highwater.cli.server_config import (
    LISTENER_FLAGS,
    listener_options,
    load_role_config,
    log_dirs_flag,
    role_listeners,
    server_config_options,
)
from highwater.cli.serving import (
    check_kafka_listener,
    controllers_option,
    etcd_tls_options,
    kafka_listener_options,
    listen_option,
    metadata_store_option,
    optional_address,
    require_one_metadata_source,
    run_until_signalled,
    telemetry_option,
    tls_options,
)
from highwater.etcd_metadata.endpoints import EtcdStoreAddress
from highwater.rpc.allocator import keep_large_buffers


@click.command("broker")
@telemetry_option
@tls_options
@click.option("--node-id", type=click.IntRange(min=0, max=2**31 - 1), required=True)
@listen_option(
    required=False,
    help="Address to serve the Broker API on (clients and peers): the one listener "
    "PLAINTEXT; or named listeners with --listeners / the listeners key.",
)
@controllers_option
@metadata_store_option
@etcd_tls_options("metadata_store")
@click.option(
    "--etcd-session-timeout-ms",
    type=click.IntRange(min=1000),
    default=6000,
    show_default=True,
    help="With --metadata-store: the TTL of the broker's etcd lease, after which its "
    "ephemeral keys go (ZooKeeper-era Kafka's zookeeper.session.timeout.ms).",
)
@click.option(
    "--etcd-max-txn-ops",
    type=click.IntRange(min=16),
    default=128,
    show_default=True,
    help="With --metadata-store: etcd's --max-txn-ops, the most operations the controller "
    "puts in one transaction (larger changes are split where they can be).",
)
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    required=True,
    help="Where the partition logs and the metadata log live.",
)
@click.option(
    "--log-dirs",
    default=None,
    metavar="DIR[,DIR...]",
    callback=log_dirs_flag,
    help="The partition logs' directories, comma-separated, one per disk (Kafka's log.dirs); "
    "default: DATA_DIR/logs. The metadata log stays in --data-dir.",
)
@click.option("--rack", default=None, help="The broker's rack (Kafka's broker.rack).")
@click.option(
    "--advertised-listener",
    default=None,
    callback=optional_address,
    metavar="HOST:PORT",
    help="Where clients and other brokers connect, if not --listen (a proxy in front).",
)
@listener_options
@click.option(
    "--replica-lag-time-max-ms",
    type=click.IntRange(min=1),
    default=BrokerSettings().replica_lag_time_max_ms,
    show_default=True,
    help="A follower not caught up for this long leaves the ISR (replica.lag.time.max.ms).",
)
@click.option(
    "--broker-heartbeat-interval-ms",
    type=click.IntRange(min=1),
    default=BrokerSettings().heartbeat_interval_ms,
    show_default=True,
    help="How often the broker heartbeats to the active controller once unfenced "
    "(broker.heartbeat.interval.ms; below the controllers' broker.session.timeout.ms).",
)
@kafka_listener_options
@server_config_options
def broker(
    node_id: int,
    listen: str | None,
    controllers: list[str],
    metadata_store: EtcdStoreAddress | None,
    etcd_session_timeout_ms: int,
    etcd_max_txn_ops: int,
    data_dir: Path,
    log_dirs: tuple[str, ...] | None,
    rack: str | None,
    advertised_listener: str | None,
    replica_lag_time_max_ms: int,
    broker_heartbeat_interval_ms: int,
    kafka_listen: str | None,
    kafka_advertised_listener: str | None,
    listeners: str | None,
    advertised_listeners: str | None,
    inter_broker_listener_name: str | None,
    config_file: Path | None,
    overrides: tuple[str, ...],
) -> None:
    """Run a broker: serve partitions, replicate them, follow the metadata.

    Of its --config file and --override keys the broker uses log.dirs, broker.rack,
    replica.lag.time.max.ms, broker.heartbeat.interval.ms,
    initial.broker.registration.timeout.ms, quota.window.num,
    quota.window.size.seconds, connections.max.idle.ms, max.request.partition.size.limit
    and the listeners (listeners, advertised.listeners, inter.broker.listener.name); the
    cluster defaults (num.partitions...) are the controllers', read from the metadata.
    """
    config = load_role_config(
        config_file,
        overrides,
        {
            "rack": "broker.rack",
            "replica_lag_time_max_ms": "replica.lag.time.max.ms",
            "broker_heartbeat_interval_ms": "broker.heartbeat.interval.ms",
            "log_dirs": "log.dirs",
            **LISTENER_FLAGS,
        },
    )
    require_one_metadata_source(controllers, metadata_store)
    check_kafka_listener(kafka_listen)
    keep_large_buffers()  # Fetch answers' MiB-sized buffers: no page faults per answer
    named = role_listeners(config, listen, advertised_listener)
    for listener in named.bound:
        if listener.port == 0:
            raise click.BadParameter(
                f"a broker needs a real port, not 0 ({listener})", param_hint="--listen"
            )
    settings = BrokerSettings(
        heartbeat_interval_ms=config.get("broker.heartbeat.interval.ms"),
        rack=config.get("broker.rack") or None,
        replica_lag_time_max_ms=config.get("replica.lag.time.max.ms"),
        initial_registration_timeout_ms=config.get("initial.broker.registration.timeout.ms"),
        quota_window_num=config.get("quota.window.num"),
        quota_window_size_seconds=config.get("quota.window.size.seconds"),
        connections_max_idle_ms=config.get("connections.max.idle.ms"),
        max_request_partition_size_limit=config.get("max.request.partition.size.limit"),
    )
    if metadata_store is not None:
        # Imported here: the etcd client and controller are only loaded by brokers using them.
        from highwater.cli.etcd_mode import EtcdBroker
        from highwater.controller.etcd_controller import EtcdControllerSettings

        etcd_broker = EtcdBroker(
            node_id=node_id,
            listeners=named,
            store=metadata_store,
            data_dir=data_dir,
            settings=settings,
            log_dirs=[Path(d) for d in config.get("log.dirs") or ()],
            session_ttl_s=-(-etcd_session_timeout_ms // 1000),
            controller_settings=EtcdControllerSettings(max_txn_ops=etcd_max_txn_ops),
            kafka_listen=kafka_listen,
            kafka_advertised=kafka_advertised_listener,
        )
        run_until_signalled(etcd_broker, "broker")
        return
    server = StandaloneBroker(
        node_id=node_id,
        listen=named.inter_broker.address,
        listeners=named,
        controllers=controllers,
        data_dir=data_dir,
        settings=settings,
        log_dirs=[Path(d) for d in config.get("log.dirs") or ()],
        kafka_listen=kafka_listen,
        kafka_advertised=kafka_advertised_listener,
    )
    run_until_signalled(server, "broker")
