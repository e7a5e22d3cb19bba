"""``highwater brokers``: list the cluster's brokers, check that some may be removed, remove one.

* ``list``: the live brokers (id, address, rack) and the partitions each holds;
* ``check-removal --ids-from N`` (or ``--ids 103,104``): exit 0 if no registered broker
  among those holds a replica; else one line per such broker naming its partitions and
  exit 1. The Helm chart runs it before a release's broker count goes down, so that a
  scale-down that would take replicas with it is refused until they are reassigned
  (``highwater partitions reassign``);
* ``unregister --id N``: remove a stopped broker from the cluster for good; the
  controller refuses while it still holds replicas.

All take ``--bootstrap-server``.
"""

from __future__ import annotations

import click

from highwater.cli.tables import Column, format_option, print_table
from highwater.cli.topics import Connection, connection_options, run_admin
from highwater.client.admin import AdminClient

__all__ = ["brokers"]

BROKER_COLUMNS = (Column("ID"), Column("ADDRESS"), Column("RACK"), Column("REPLICAS"))


async def _holdings(admin: AdminClient) -> dict[int, list[str]]:
    """Broker id -> the partitions (``topic-p``) it holds a replica of."""
    listings = await admin.list_topics(include_internal=True)
    descriptions = await admin.describe_topics([t.name for t in listings])
    held: dict[int, list[str]] = {}
    for name, description in sorted(descriptions.items()):
        for partition in description.partitions:
            for broker in partition.replicas:
                held.setdefault(broker, []).append(f"{name}-{partition.partition}")
    return held


def _ids(_ctx: click.Context, _param: click.Parameter, value: str | None) -> list[int] | None:
    if value is None:
        return None
    try:
        return [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a comma-separated list of ids") from None


@click.group("brokers")
def brokers() -> None:
    """Inspect and remove brokers."""


@brokers.command("list")
@connection_options
@format_option
def list_brokers(conn: Connection, output_format: str) -> None:
    """The live brokers and how many partition replicas each holds."""

    async def work(
        admin: AdminClient,
    ) -> tuple[list[tuple[int, str, str | None]], dict[int, list[str]]]:
        cluster = await admin.describe_cluster()
        nodes = [(n.node_id, n.address, n.rack) for n in cluster.nodes]
        return nodes, await _holdings(admin)

    nodes, held = run_admin(conn, work)
    rows = [
        (node_id, address, rack, len(held.get(node_id, []))) for node_id, address, rack in nodes
    ]
    print_table(BROKER_COLUMNS, rows, output_format)


@brokers.command("check-removal")
@connection_options
@click.option("--ids", callback=_ids, default=None, help="The brokers to remove (103,104,...).")
@click.option(
    "--ids-from",
    type=click.IntRange(min=0),
    default=None,
    help="Every registered broker with this id or a higher one.",
)
def check_removal(conn: Connection, ids: list[int] | None, ids_from: int | None) -> None:
    """Exit 0 if the brokers to remove hold no replicas (else list them and exit 1)."""
    if (ids is None) == (ids_from is None):
        raise click.UsageError("give one of --ids and --ids-from")

    async def work(admin: AdminClient) -> tuple[list[int], dict[int, list[str]]]:
        held = await _holdings(admin)
        if ids is not None:
            return sorted(ids), held
        assert ids_from is not None
        registered = {n.node_id for n in (await admin.describe_cluster()).nodes} | set(held)
        return sorted(b for b in registered if b >= ids_from), held

    removed, held = run_admin(conn, work)
    blocking = {b: held[b] for b in removed if held.get(b)}
    for broker, partitions in blocking.items():
        shown = ", ".join(partitions[:10]) + (", ..." if len(partitions) > 10 else "")
        click.echo(
            f"Error: broker {broker} still holds replicas of {len(partitions)} partition(s) "
            f"({shown}): reassign them first (highwater partitions reassign)",
            err=True,
        )
    if blocking:
        raise SystemExit(1)
    click.echo(f"Brokers {removed or 'none'} hold no replicas: they may be removed.")


@brokers.command("unregister")
@connection_options
@click.option("--id", "broker_id", type=click.IntRange(min=0), required=True)
def unregister(conn: Connection, broker_id: int) -> None:
    """Remove a stopped broker from the cluster (refused while it holds replicas)."""

    async def work(admin: AdminClient) -> None:
        await admin.unregister_broker(broker_id)

    run_admin(conn, work)
    click.echo(f"Unregistered broker {broker_id}.")
