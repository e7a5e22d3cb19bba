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

import asyncio
import contextlib
import signal
from pathlib import Path

import click
import uvloop

from highwater.controller.service import ControllerServer
from highwater.errors import HighwaterError
from highwater.raft.service import parse_endpoint, parse_quorum_voters


def _voters(_ctx: click.Context, _param: click.Parameter, value: str) -> dict[int, str]:
    try:
        return parse_quorum_voters(value)
    except ValueError as e:
        raise click.BadParameter(f"{e} (expected ID@HOST:PORT,ID@HOST:PORT,...)") from None


def _listen(_ctx: click.Context, _param: click.Parameter, value: str) -> str:
    try:
        parse_endpoint(value)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None
    return value


@click.command("controller")
@click.option("--node-id", type=click.IntRange(min=0, max=2**31 - 1), required=True)
@click.option(
    "--listen",
    required=True,
    callback=_listen,
    metavar="HOST:PORT",
    help="Address to serve the Raft protocol and the Controller API on.",
)
@click.option(
    "--voters",
    required=True,
    callback=_voters,
    metavar="ID@HOST:PORT,...",
    help="The quorum's voters (Kafka's controller.quorum.voters), this node included.",
)
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    required=True,
    help="Where the metadata log, its snapshots and quorum-state live.",
)
@click.option(
    "--cluster-id",
    default=None,
    help="The cluster's id; by default the one stored in --data-dir, else one derived "
    "from --voters (the same on every voter).",
)
def controller(
    node_id: int,
    listen: str,
    voters: dict[int, str],
    data_dir: Path,
    cluster_id: str | None,
) -> None:
    """Run a voter of the metadata quorum (a KRaft controller)."""
    if node_id not in voters:
        raise click.BadParameter(
            f"node {node_id} is not among the voters {sorted(voters)}", param_hint="--node-id"
        )
    if cluster_id is not None and not cluster_id.strip():
        raise click.BadParameter("must not be empty", param_hint="--cluster-id")
    server = ControllerServer(
        node_id=node_id,
        listen=listen,
        voters=voters,
        data_dir=data_dir,
        cluster_id=cluster_id,
    )
    try:
        failure = uvloop.run(_run(server))  # libuv's loop: less overhead per gRPC message
    except HighwaterError as e:
        raise click.ClickException(str(e)) from None
    except OSError as e:
        raise click.ClickException(str(e)) from None
    if failure is not None:
        raise click.ClickException(f"the controller stopped: {failure}")


async def _run(server: ControllerServer) -> BaseException | None:
    await server.start()
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    tasks = [
        asyncio.create_task(stop.wait()),
        asyncio.create_task(server.wait_stopped()),
    ]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await server.stop()
    return server.failure
