"""``highwater rolling``: the gates of a broker's rolling restart, for Kubernetes probes and hooks.

``highwater rolling ready --node-id N`` exits 0 when broker N is registered, unfenced and
in the ISR of every partition it replicates (what the broker itself reports to the readiness
probe on ``grpc.health.v1`` as ``highwater.broker.ready``, asked from outside), and
``highwater rolling pre-stop --node-id N`` waits until no partition of the cluster is
under-replicated before it exits 0 (the preStop hook: SIGTERM and the broker's
controlled shutdown follow; on a terminal it shows what it waits for). Either prints why
not on stderr and exits 1 otherwise. The rules are :mod:`highwater.broker.rolling`'s,
applied here to a :class:`ClusterView` built from what the admin client describes; both
ask ``--bootstrap-server`` (else ``$HIGHWATER_BOOTSTRAP_SERVERS`` or the profile,
:mod:`highwater.cli.bootstrap`), by default the broker on this host.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Mapping

import click
import grpc.aio

from highwater.broker.rolling import ClusterView, Decision, PartitionState, may_stop, readiness
from highwater.cli.bootstrap import bootstrap_server_option
from highwater.cli.progress import waiting
from highwater.client.admin import AdminClient, TopicDescription
from highwater.errors import HighwaterError

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
#: Bounds of one look at the cluster, whatever ``--timeout`` the wait has (0 included).
REQUEST_TIMEOUT_S = (1.0, 10.0)


def _request_timeout(timeout: float) -> float:
    low, high = REQUEST_TIMEOUT_S
    return min(max(timeout, low), high)


def _report(decision: Decision, what: str) -> None:
    if not decision.allowed:
        raise click.ClickException(f"{what}: {decision}")
    click.echo(f"{what}: yes")


def cluster_view(
    live_brokers: Iterable[int], topics: Mapping[str, TopicDescription]
) -> ClusterView:
    """A view from the admin client's ``describe_cluster`` node ids and ``describe_topics``
    answer."""
    partitions = tuple(
        PartitionState(name, p.partition, p.leader, tuple(p.replicas), tuple(p.isr))
        for name, description in sorted(topics.items())
        for p in description.partitions
    )
    return ClusterView(frozenset(live_brokers), partitions)


async def observe_cluster(admin: AdminClient) -> ClusterView:
    """The live brokers and every partition (internal topics included), as ``admin``'s
    bootstrap broker reports them."""
    cluster = await admin.describe_cluster()
    listings = await admin.list_topics(include_internal=True)
    topics = await admin.describe_topics(listing.name for listing in listings)
    return cluster_view((node.node_id for node in cluster.nodes), topics)


async def wait_until_may_stop(
    admin: AdminClient,
    node_id: int,
    *,
    timeout_s: float,
    poll_interval_s: float = 2.0,
) -> Decision:
    """Poll :func:`may_stop` until it allows the stop or ``timeout_s`` passes; the last
    decision (a failure to ask the cluster counts as a refusal naming the error)."""
    deadline = time.monotonic() + timeout_s
    with waiting(f"broker {node_id}: waiting until it may stop") as progress:
        while True:
            try:
                decision = may_stop(await observe_cluster(admin), node_id)
            except (HighwaterError, grpc.aio.AioRpcError) as e:  # unreachable for a moment
                decision = Decision(False, (f"cannot describe the cluster: {e}",))
            remaining = deadline - time.monotonic()
            if decision.allowed or remaining <= 0:
                return decision
            progress.update(detail=str(decision))
            await asyncio.sleep(min(poll_interval_s, remaining))


async def _ready(bootstrap_server: str, node_id: int, timeout: float) -> Decision:
    async with AdminClient(bootstrap_server, request_timeout_s=timeout) as admin:
        try:
            return readiness(await observe_cluster(admin), node_id)
        except (HighwaterError, grpc.aio.AioRpcError) as e:
            return Decision(False, (f"cannot describe the cluster: {e}",))


async def _pre_stop(bootstrap_server: str, node_id: int, timeout: float, poll: float) -> Decision:
    async with AdminClient(bootstrap_server, request_timeout_s=_request_timeout(timeout)) as admin:
        return await wait_until_may_stop(admin, node_id, timeout_s=timeout, poll_interval_s=poll)


async def _may_stop_now(bootstrap_server: str, node_id: int, timeout: float) -> Decision:
    async with AdminClient(bootstrap_server, request_timeout_s=timeout) as admin:
        return may_stop(await observe_cluster(admin), node_id)


def _common(function: click.decorators.FC) -> click.decorators.FC:
    function = bootstrap_server_option(default=DEFAULT_BOOTSTRAP)(function)
    return click.option(
        "--node-id",
        type=click.IntRange(min=0, max=2**31 - 1),
        required=True,
        help="The broker the question is about.",
    )(function)


@click.group("rolling")
def rolling() -> None:
    """Gates of a rolling restart: may this broker stop, is it ready again."""


@rolling.command("ready")
@_common
@click.option(
    "--timeout",
    type=click.FloatRange(min=0.1),
    default=5.0,
    show_default=True,
    help="Seconds to wait for the metadata.",
)
def ready(node_id: int, bootstrap_server: str, timeout: float) -> None:
    """Exit 0 if the broker is unfenced and in the ISR of all its partitions."""
    _report(asyncio.run(_ready(bootstrap_server, node_id, timeout)), f"broker {node_id} ready")


@rolling.command("pre-stop")
@_common
@click.option(
    "--timeout",
    type=click.FloatRange(min=0),
    default=240.0,
    show_default=True,
    help="Seconds to wait for the under-replicated partitions to catch up; then exit 1.",
)
@click.option(
    "--poll-interval",
    type=click.FloatRange(min=0.1),
    default=2.0,
    show_default=True,
    help="Seconds between two looks at the cluster.",
)
@click.option(
    "--no-wait",
    is_flag=True,
    help="Look once and answer (exit 0 or 1) instead of waiting.",
)
def pre_stop(
    node_id: int, bootstrap_server: str, timeout: float, poll_interval: float, no_wait: bool
) -> None:
    """Wait until no partition is under-replicated, so the broker may stop."""
    what = f"broker {node_id} may stop"
    if no_wait:
        try:
            decision = asyncio.run(
                _may_stop_now(bootstrap_server, node_id, _request_timeout(timeout))
            )
        except (HighwaterError, grpc.aio.AioRpcError) as e:
            decision = Decision(False, (f"cannot describe the cluster: {e}",))
    else:
        decision = asyncio.run(_pre_stop(bootstrap_server, node_id, timeout, poll_interval))
    _report(decision, what)
