"""``highwater server``: the embedded default — a controller and a broker in one process.

Clients bootstrap from ``--listen``: the Broker, Controller and Raft services all answer
there (:class:`~highwater.embedded.EmbeddedServer`). ``--demo`` first shows the data path
once: it creates the topic ``demo`` (if it is not there), produces a few records with
acks=all, and reads them back from the partition leader up to the high watermark. The
server then runs until SIGTERM or SIGINT.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import click

from highwater.broker.service import BrokerSettings
from highwater.cli.server_config import (
    LISTENER_FLAGS,
    controller_config,
    listener_options,
    load_role_config,
    log_dirs_flag,
    role_listeners,
    server_config_options,
)
from highwater.cli.serving import (
    check_kafka_listener,
    kafka_listener_options,
    listen_option,
    run_until_signalled,
    telemetry_option,
    tls_options,
)
from highwater.controller.service import ControllerSettings
from highwater.controller_api import messages as m
from highwater.controller_api.client import ControllerClient
from highwater.coordinator.core import GroupCoordinatorSettings
from highwater.coordinator.service import CoordinatorSettings
from highwater.embedded import EmbeddedServer
from highwater.errors import HighwaterError
from highwater.raft.driver import RaftServerSettings
from highwater.records import iter_batches
from highwater.rpc.channels import open_channel
from highwater.v1 import broker_pb2 as pb
from highwater.v1 import broker_pb2_grpc
from highwater.v1.common_pb2 import ErrorCode

DEMO_TOPIC = "demo"
DEMO_LINES = ("the first record", "the second record", "and a third, with a key")


class _DemoServer(EmbeddedServer):
    """The embedded server that runs the demo once it is up."""

    async def start(self) -> None:
        await super().start()
        await self.broker.wait_unfenced()
        await run_demo(self.listen)


async def run_demo(address: str) -> None:
    """Create the demo topic, produce to it with acks=all, and read it back."""
    echo = click.echo
    async with ControllerClient([address]) as admin:
        created = await admin.create_topics(
            m.CreateTopicsRequest((m.CreatableTopic(DEMO_TOPIC, 1, 1),))
        )
    (result,) = created.topics
    if result.error not in (ErrorCode.NONE, ErrorCode.TOPIC_ALREADY_EXISTS):
        raise click.ClickException(f"could not create the demo topic: {result.error_message}")
    echo(f"demo: topic {DEMO_TOPIC!r} with 1 partition on {address}")
    async with open_channel(address) as channel:
        broker = broker_pb2_grpc.BrokerStub(channel)
        await _wait_for_leader(broker)
        request = pb.ProduceRequest(acks=-1, timeout_ms=10_000)
        plain = request.topics.add(topic=DEMO_TOPIC).partitions.add(partition=0).records
        for number, line in enumerate(DEMO_LINES):
            produced_record = plain.records.add(value=line.encode())
            if number == len(DEMO_LINES) - 1:
                produced_record.key = b"demo-key"
        produced = await _produce_once_leading(broker, request)
        if produced.error != ErrorCode.NONE:
            raise click.ClickException(f"produce failed: {produced.error_message}")
        echo(
            f"demo: produced {len(DEMO_LINES)} records at offset {produced.base_offset} (acks=all)"
        )
        fetch = pb.FetchRequest(max_wait_ms=1000, min_bytes=1, max_bytes=1 << 20)
        fetch.topics.add(topic=DEMO_TOPIC).partitions.add(
            partition=0,
            current_leader_epoch=-1,
            fetch_offset=produced.base_offset,
            partition_max_bytes=1 << 20,
        )
        answer = (await broker.Fetch(fetch)).topics[0].partitions[0]
        for batch in iter_batches(answer.records):
            for record in batch.records():
                key = record.key.decode() if record.key is not None else "-"
                value = record.value.decode() if record.value is not None else "-"
                echo(f"demo: consumed offset {record.offset} key={key} value={value!r}")
        echo(f"demo: high watermark {answer.high_watermark}; serving on {address} (Ctrl-C stops)")


async def _produce_once_leading(
    broker: broker_pb2_grpc.BrokerStub, request: pb.ProduceRequest, timeout_s: float = 10
) -> pb.ProducePartitionResponse:
    """Produce ``request``, again while the leader is still taking its role (it makes the
    new partition's log after the metadata names it: NOT_LEADER_OR_FOLLOWER, retriable),
    as a Kafka client retries."""
    deadline = time.monotonic() + timeout_s
    while True:
        produced = (await broker.Produce(request)).topics[0].partitions[0]
        if produced.error != ErrorCode.NOT_LEADER_OR_FOLLOWER or time.monotonic() > deadline:
            return produced
        await asyncio.sleep(0.05)


async def _wait_for_leader(broker: broker_pb2_grpc.BrokerStub, timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        reply = await broker.Metadata(pb.MetadataRequest(topics=[DEMO_TOPIC]))
        partitions = reply.topics[0].partitions if reply.topics else []
        if partitions and all(p.error == ErrorCode.NONE for p in partitions):
            return
        await asyncio.sleep(0.05)
    raise click.ClickException(f"the topic {DEMO_TOPIC!r} got no leader")


@click.command("server")
@telemetry_option
@tls_options
@listen_option(
    required=False,
    default="127.0.0.1:9092",
    help="Address clients bootstrap from (every service answers there).",
)
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    required=True,
    help="Where the metadata log and the partition logs live.",
)
@click.option(
    "--log-dirs",
    default=None,
    metavar="DIR[,DIR...]",
    callback=log_dirs_flag,
    help="The partition logs' directories, comma-separated, one per disk (Kafka's log.dirs); "
    "default: DATA_DIR/broker.",
)
@click.option("--demo", is_flag=True, help="Produce and consume a few records once started.")
@kafka_listener_options
@listener_options
@server_config_options
def server(
    listen: str,
    data_dir: Path,
    log_dirs: tuple[str, ...] | None,
    demo: bool,
    kafka_listen: str | None,
    kafka_advertised_listener: str | None,
    listeners: str | None,
    advertised_listeners: str | None,
    inter_broker_listener_name: str | None,
    config_file: Path | None,
    overrides: tuple[str, ...],
) -> None:
    """Run the embedded server: a single-voter controller and a broker in one process.

    --config FILE and --override KEY=VALUE take Kafka's server keys: the cluster defaults
    (num.partitions, min.insync.replicas, log.retention.hours...) go into the metadata;
    __consumer_offsets has one replica whatever offsets.topic.replication.factor says,
    and group.initial.rebalance.delay.ms is 0 unless set, as in Kafka's development
    configuration.
    """
    check_kafka_listener(kafka_listen)
    config = load_role_config(config_file, overrides, {"log_dirs": "log.dirs", **LISTENER_FLAGS})
    named = role_listeners(config, listen)
    delay = (
        config.get("group.initial.rebalance.delay.ms")
        if config.is_given("group.initial.rebalance.delay.ms")
        else 0
    )
    try:
        embedded = (_DemoServer if demo else EmbeddedServer)(
            listen=named.inter_broker.address,
            listeners=named,
            data_dir=data_dir,
            controller_settings=ControllerSettings(
                raft=RaftServerSettings(
                    metadata_log_max_record_bytes_between_snapshots=config.get(
                        "metadata.log.max.record.bytes.between.snapshots"
                    )
                ),
                controller=controller_config(config),
            ),
            broker_settings=BrokerSettings(
                heartbeat_interval_ms=config.get("broker.heartbeat.interval.ms"),
                rack=config.get("broker.rack") or None,
                replica_lag_time_max_ms=config.get("replica.lag.time.max.ms"),
                initial_registration_timeout_ms=config.get(
                    "initial.broker.registration.timeout.ms"
                ),
                quota_window_num=config.get("quota.window.num"),
                quota_window_size_seconds=config.get("quota.window.size.seconds"),
                connections_max_idle_ms=config.get("connections.max.idle.ms"),
                max_request_partition_size_limit=config.get("max.request.partition.size.limit"),
            ),
            coordinator_settings=CoordinatorSettings(
                group=GroupCoordinatorSettings(group_initial_rebalance_delay_ms=delay),
                heartbeat_interval_ms=config.get("coordinator.heartbeat.interval.ms"),
                session_timeout_ms=config.get("coordinator.session.timeout.ms"),
                initial_registration_timeout_ms=config.get(
                    "initial.broker.registration.timeout.ms"
                ),
            ),
            log_dirs=[Path(d) for d in config.get("log.dirs") or ()],
            kafka_listen=kafka_listen,
            kafka_advertised=kafka_advertised_listener,
        )
    except HighwaterError as e:  # a data or log directory that cannot be used
        raise click.ClickException(str(e)) from None
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--listen") from None
    run_until_signalled(embedded, "server")
