"""``highwater rolling``: the gates of a broker's rolling restart, for Kubernetes probes and hooks.

``highwater rolling ready --node-id N`` exits 0 when broker N is registered, unfenced and
in the ISR of every partition it replicates (what the broker itself reports to the readiness
probe on ``grpc.health.v1`` as ``highwater.broker.ready``, asked from outside), and
``highwater rolling pre-stop --node-id N`` waits until no partition of the cluster is
under-replicated before it exits 0 (the preStop hook: SIGTERM and the broker's
controlled shutdown follow). Either prints why not on stderr and exits 1 otherwise. The
rules are :mod:`highwater.broker.rolling`'s; both ask ``--bootstrap-server``, by default
the broker on this host.
"""

from __future__ import annotations

import asyncio

import click
import grpc.aio

from highwater.broker.rolling import Decision, may_stop, observe_cluster, readiness
from highwater.broker.rolling import wait_until_may_stop as _wait_until_may_stop
from highwater.cli.addresses import address_list
from highwater.client.admin import AdminClient
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


async def _ready(bootstrap_server: str, node_id: int, timeout: float) -> Decision:
    async with AdminClient(bootstrap_server, request_timeout_s=timeout) as admin:
        try:
            return readiness(await observe_cluster(admin), node_id)
        except (HighwaterError, grpc.aio.AioRpcError) as e:
            return Decision(False, (f"cannot describe the cluster: {e}",))


async def _pre_stop(bootstrap_server: str, node_id: int, timeout: float, poll: float) -> Decision:
    async with AdminClient(bootstrap_server, request_timeout_s=_request_timeout(timeout)) as admin:
        return await _wait_until_may_stop(admin, node_id, timeout_s=timeout, poll_interval_s=poll)


async def _may_stop_now(bootstrap_server: str, node_id: int, timeout: float) -> Decision:
    async with AdminClient(bootstrap_server, request_timeout_s=timeout) as admin:
        return may_stop(await observe_cluster(admin), node_id)


def _common(function: click.decorators.FC) -> click.decorators.FC:
    function = click.option(
        "--bootstrap-server",
        default=DEFAULT_BOOTSTRAP,
        show_default=True,
        callback=address_list,
        metavar="HOST:PORT,...",
        help="Brokers to ask for the cluster's metadata.",
    )(function)
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
