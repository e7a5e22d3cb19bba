"""``highwater observer``: follow the metadata quorum without voting, as a broker does.

The process replicates the committed metadata log into ``--data-dir`` (starting from the
leader's latest snapshot when it has none of the log), keeps the
:class:`~highwater.metadata.image.MetadataImage` up to date, and logs a line whenever the
image moves (at most once a second): its offset and epoch, and how many brokers, topics
and partitions the cluster has. The leader lists it among the quorum's observers
(``highwater quorum describe --replication``). SIGTERM and SIGINT stop it.

The quorum is ``--voters`` (a static quorum's ids and addresses) or ``--controllers``
(any controllers' addresses: the voters are taken from their DescribeQuorum at start, as
a broker does). A dynamic quorum's observer (KIP-853) follows the voter changes it
replicates, so a controller replaced on a new address is found without a restart.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import click

from highwater.cli.addresses import parse_addresses
from highwater.cli.serving import (
    controller_replica_options,
    listen_option,
    run_until_signalled,
    telemetry_option,
)
from highwater.metadata.image import MetadataImage
from highwater.metadata.observer import DescribedQuorum, MetadataObserver, discover_quorum
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


class _ObserverOfControllers:
    """``--controllers``: the observer is made once the controllers described the quorum."""

    def __init__(
        self,
        controllers: Sequence[str],
        make: Callable[[DescribedQuorum], MetadataObserver],
    ) -> None:
        self._controllers = controllers
        self._make = make
        self._observer: MetadataObserver | None = None

    @property
    def failure(self) -> BaseException | None:
        return None if self._observer is None else self._observer.failure

    async def start(self) -> None:
        self._observer = self._make(await discover_quorum(self._controllers))
        await self._observer.start()

    async def stop(self) -> None:
        if self._observer is not None:
            await self._observer.stop()

    async def wait_stopped(self) -> None:
        assert self._observer is not None, "started first"
        await self._observer.wait_stopped()


@click.command("observer")
@telemetry_option
@controller_replica_options
@click.option(
    "--controllers",
    default=None,
    callback=lambda _ctx, _param, value: None if value is None else parse_addresses(value),
    metavar="HOST:PORT,...",
    help="Controllers of the quorum (any of them), instead of --voters: the voters are "
    "taken from their DescribeQuorum, and a dynamic quorum's are followed as they change.",
)
@listen_option(
    required=False,
    default="127.0.0.1:0",
    help="Address to serve DescribeQuorum and health on (port 0: any free port).",
)
def observer(
    node_id: int,
    listen: str,
    voters: dict[int, str] | None,
    controllers: list[str] | None,
    data_dir: Path,
    cluster_id: str | None,
    snapshot_bytes: int,
) -> None:
    """Follow the metadata quorum as an observer: replicate the committed metadata log and
    keep the metadata image, as every broker does."""
    if (voters is None) == (controllers is None):
        raise click.UsageError(
            "give the quorum one way: --voters (a static quorum's) or --controllers"
        )
    if voters is not None and node_id in voters:
        raise click.BadParameter(
            f"node {node_id} is a voter: an observer needs an id of its own",
            param_hint="--node-id",
        )

    def make(quorum: DescribedQuorum) -> MetadataObserver:
        server = MetadataObserver(
            node_id=node_id,
            listen=listen,
            voters=quorum.voters,
            voters_offset=quorum.voters_offset,
            data_dir=data_dir,
            cluster_id=cluster_id or quorum.cluster_id or None,
            settings=RaftServerSettings(
                metadata_log_max_record_bytes_between_snapshots=snapshot_bytes
            ),
        )
        server.add_listener(_ImageReport())
        return server

    if voters is not None:
        run_until_signalled(make(DescribedQuorum(voters, "")), "observer")
    else:
        assert controllers is not None
        run_until_signalled(_ObserverOfControllers(controllers, make), "observer")
