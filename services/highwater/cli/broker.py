"""``highwater broker``: run one broker of a cluster.

The broker follows the controller quorum named by ``--controllers`` as a metadata
observer, registers and heartbeats, serves ``highwater.v1.Broker`` on ``--listen`` and
replicates the partitions it follows from their leaders. SIGTERM and SIGINT stop it with a
controlled shutdown: the controller moves its leaderships away first.
"""

from __future__ import annotations

from pathlib import Path

import click

from highwater.broker.service import BrokerSettings
from highwater.broker.standalone import StandaloneBroker
from highwater.cli.serving import listen_option, run_until_signalled
from highwater.raft.service import parse_endpoint


def _controllers(_ctx: click.Context, _param: click.Parameter, value: str) -> list[str]:
    addresses = [part.strip() for part in value.split(",") if part.strip()]
    if not addresses:
        raise click.BadParameter("name at least one controller")
    for address in addresses:
        try:
            parse_endpoint(address)
        except ValueError as e:
            raise click.BadParameter(str(e)) from None
    return addresses


@click.command("broker")
@click.option("--node-id", type=click.IntRange(min=0, max=2**31 - 1), required=True)
@listen_option(required=True, help="Address to serve the Broker API on (clients and peers).")
@click.option(
    "--controllers",
    required=True,
    callback=_controllers,
    metavar="HOST:PORT,...",
    help="Controllers of the quorum (any of them; the rest are learned from it).",
)
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    required=True,
    help="Where the partition logs and the metadata log live.",
)
@click.option("--rack", default=None, help="The broker's rack (Kafka's broker.rack).")
def broker(
    node_id: int, listen: str, controllers: list[str], data_dir: Path, rack: str | None
) -> None:
    """Run a broker: serve partitions, replicate them, follow the metadata."""
    _, port = parse_endpoint(listen)
    if port == 0:
        raise click.BadParameter("a broker needs a real port, not 0", param_hint="--listen")
    server = StandaloneBroker(
        node_id=node_id,
        listen=listen,
        controllers=controllers,
        data_dir=data_dir,
        settings=BrokerSettings(rack=rack),
    )
    run_until_signalled(server, "broker")
