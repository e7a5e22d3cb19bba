"""``highwater observer``: follow the metadata quorum without voting, as a broker does.

The process replicates the committed metadata log into ``--data-dir`` (starting from the
leader's latest snapshot when it has none of the log), keeps the
:class:`~highwater.metadata.image.MetadataImage` up to date, and logs a line whenever the
image moves (at most once a second): its offset and epoch, and how many brokers, topics
and partitions the cluster has. The leader lists it among the quorum's observers
(``highwater quorum describe --replication``). SIGTERM and SIGINT stop it.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import click

from highwater.cli.serving import (
    listen_option,
    metadata_replica_options,
    run_until_signalled,
    telemetry_option,
)
from highwater.metadata.image import MetadataImage
from highwater.metadata.observer import MetadataObserver
from highwater.raft.driver import RaftServerSettings

log = logging.getLogger(__name__)

REPORT_INTERVAL_S = 1.0


class _ImageReport:
    """Logs the image's progress, at most once per ``REPORT_INTERVAL_S``."""

    def __init__(self) -> None:
        self._last_s = float("-inf")

    def __call__(self, image: MetadataImage) -> None:
        now = time.monotonic()
        if now - self._last_s < REPORT_INTERVAL_S:
            return
        self._last_s = now
        log.info(
            "metadata image at offset %d (epoch %d): %d brokers, %d topics, %d partitions",
            image.offset,
            image.epoch,
            len(image.cluster.brokers),
            len(image.topics.by_name),
            sum(len(topic.partitions) for topic in image.topics.by_name.values()),
        )


@click.command("observer")
@telemetry_option
@metadata_replica_options
@listen_option(
    required=False,
    default="127.0.0.1:0",
    help="Address to serve DescribeQuorum and health on (port 0: any free port).",
)
def observer(
    node_id: int,
    listen: str,
    voters: dict[int, str],
    data_dir: Path,
    cluster_id: str | None,
    snapshot_bytes: int,
) -> None:
    """Follow the metadata quorum as an observer: replicate the committed metadata log and
    keep the metadata image, as every broker does."""
    if node_id in voters:
        raise click.BadParameter(
            f"node {node_id} is a voter: an observer needs an id of its own",
            param_hint="--node-id",
        )
    server = MetadataObserver(
        node_id=node_id,
        listen=listen,
        voters=voters,
        data_dir=data_dir,
        cluster_id=cluster_id,
        settings=RaftServerSettings(metadata_log_max_record_bytes_between_snapshots=snapshot_bytes),
    )
    server.add_listener(_ImageReport())
    run_until_signalled(server, "observer")
