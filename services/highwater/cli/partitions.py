"""``highwater partitions reassign``: move partitions between brokers (kafka-reassign-partitions).

One of four modes, all with ``--bootstrap-server``:

* ``--generate --topics T1,T2 --broker-list 101,102,104``: print the topics' current
  assignment and a proposed one that spreads them over the broker list (rack-aware,
  balanced, each topic keeping its replication factor), both as plan files
  (:mod:`highwater.client.reassignment`); nothing changes;
* ``--execute --plan FILE [--wait]``: print the current assignment of the plan's
  partitions (keep it to roll back), then start the moves. The controller adds the new
  replicas, waits until they are in the ISR, moves leadership to a target replica if the
  leader leaves, and drops the old replicas. ``--wait`` follows the moves until they are
  done, with a progress bar;
* ``--verify --plan FILE``: whether each partition's move is done (its replicas are the
  plan's), still in progress, or did not happen; exit code 1 unless all are done;
* ``--cancel --plan FILE``: cancel the plan's moves in progress (back to the original
  replicas).

A bad plan file, an unknown topic or partition or a broker that is not registered is an
``Error: ...`` line and exit code 1; per-partition refusals are listed, one a line.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import click

from highwater.cli.progress import waiting
from highwater.cli.topics import Connection, connection_options, run_admin
from highwater.client.admin import AdminClient, TopicDescription
from highwater.client.reassignment import (
    Assignment,
    ReassignmentPlanError,
    format_plan,
    parse_plan,
    propose_plan,
)
from highwater.metadata.placement import PlacementBroker

__all__ = ["partitions"]

POLL_INTERVAL_S = 0.5


def _read_plan(path: Path) -> Assignment:
    try:
        return parse_plan(path.read_text())
    except (OSError, ReassignmentPlanError) as e:
        raise click.ClickException(f"{path}: {e}") from None


def _int_list(_ctx: click.Context, _param: click.Parameter, value: str | None) -> list[int]:
    if value is None:
        return []
    try:
        return [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a comma-separated list of ids") from None


async def _current(admin: AdminClient, topics: set[str]) -> dict[str, TopicDescription]:
    return await admin.describe_topics(sorted(topics))


def _assignment_of(descriptions: dict[str, TopicDescription]) -> Assignment:
    return {
        (name, p.partition): p.replicas
        for name, description in descriptions.items()
        for p in description.partitions
    }


@click.group("partitions")
def partitions() -> None:
    """Manage where partitions live."""


@partitions.command("reassign")
@connection_options
@click.option("--generate", "mode", flag_value="generate", help="Propose a balanced plan.")
@click.option("--execute", "mode", flag_value="execute", help="Start the plan's moves.")
@click.option("--verify", "mode", flag_value="verify", help="Check the plan's moves are done.")
@click.option("--cancel", "mode", flag_value="cancel", help="Cancel the plan's moves.")
@click.option(
    "--plan",
    type=click.Path(dir_okay=False, path_type=Path),
    help="The plan file (Kafka's reassignment JSON).",
)
@click.option("--topics", default=None, help="--generate: the topics to move (T1,T2,...).")
@click.option(
    "--broker-list",
    callback=_int_list,
    default=None,
    help="--generate: the brokers to spread the topics over (101,102,...).",
)
@click.option("--wait", is_flag=True, help="--execute: follow the moves until they are done.")
def reassign(
    conn: Connection,
    mode: str | None,
    plan: Path | None,
    topics: str | None,
    broker_list: list[int],
    wait: bool,
) -> None:
    """Move partitions to other brokers (like kafka-reassign-partitions)."""
    if mode is None:
        raise click.UsageError("give one of --generate, --execute, --verify, --cancel")
    if mode == "generate":
        if not topics or not broker_list:
            raise click.UsageError("--generate needs --topics and --broker-list")
        _generate(conn, {t.strip() for t in topics.split(",") if t.strip()}, broker_list)
        return
    if plan is None:
        raise click.UsageError(f"--{mode} needs --plan FILE")
    wanted = _read_plan(plan)
    if mode == "execute":
        _execute(conn, wanted, wait)
    elif mode == "verify":
        _verify(conn, wanted)
    else:
        _cancel(conn, wanted)


def _generate(conn: Connection, topics: set[str], broker_list: list[int]) -> None:
    async def work(admin: AdminClient) -> tuple[Assignment, Assignment]:
        current = _assignment_of(await _current(admin, topics))
        cluster = await admin.describe_cluster()
        racks = {node.node_id: node.rack for node in cluster.nodes}
        unknown = [b for b in broker_list if b not in racks]
        if unknown:
            raise click.ClickException(f"brokers {unknown} are not live in the cluster")
        brokers = [PlacementBroker(b, racks[b]) for b in broker_list]
        try:
            return current, propose_plan(current, brokers)
        except ReassignmentPlanError as e:
            raise click.ClickException(str(e)) from None

    current, proposed = run_admin(conn, work)
    click.echo("Current partition replica assignment")
    click.echo(format_plan(current))
    click.echo("")
    click.echo("Proposed partition reassignment configuration")
    click.echo(format_plan(proposed))


def _execute(conn: Connection, wanted: Assignment, wait: bool) -> None:
    async def work(admin: AdminClient) -> tuple[Assignment, dict[tuple[str, int], str]]:
        current = _assignment_of(await _current(admin, {t for t, _ in wanted}))
        missing = sorted(key for key in wanted if key not in current)
        if missing:
            names = ", ".join(f"{t}-{p}" for t, p in missing)
            raise click.ClickException(f"no such partitions: {names}")
        results = await admin.alter_partition_reassignments(dict(wanted))
        refused = {key: error.message for key, error in results.items() if error is not None}
        if wait and len(refused) < len(wanted):
            await _follow(admin, [key for key in wanted if key not in refused])
        return {key: current[key] for key in wanted}, refused

    before, refused = run_admin(conn, work)
    click.echo("Current partition replica assignment")
    click.echo(format_plan(before))
    click.echo("")
    click.echo("Save this to use as the --plan of a rollback")
    for (topic, partition), message in sorted(refused.items()):
        click.echo(f"Error: {topic}-{partition}: {message}", err=True)
    started = len(wanted) - len(refused)
    if wait:
        click.echo(f"Reassigned {started} partition(s).")
    else:
        click.echo(f"Successfully started partition reassignment(s) for {started} partition(s).")
    if refused:
        raise SystemExit(1)


async def _follow(admin: AdminClient, keys: list[tuple[str, int]]) -> None:
    """Until none of ``keys`` is being reassigned, with a progress bar on a terminal."""
    with waiting("moving partitions", total=len(keys)) as progress:
        deadline = time.monotonic() + admin.request_timeout_s * 20
        while True:
            ongoing = await admin.list_partition_reassignments(keys)
            progress.update(completed=len(keys) - len(ongoing))
            if not ongoing:
                return
            if time.monotonic() > deadline:
                names = ", ".join(f"{t}-{p}" for t, p in sorted(ongoing))
                raise click.ClickException(f"still moving after the wait: {names}")
            await asyncio.sleep(POLL_INTERVAL_S)


def _verify(conn: Connection, wanted: Assignment) -> None:
    async def work(admin: AdminClient) -> tuple[Assignment, set[tuple[str, int]]]:
        current = _assignment_of(await _current(admin, {t for t, _ in wanted}))
        ongoing = set(await admin.list_partition_reassignments(list(wanted)))
        return current, ongoing

    current, ongoing = run_admin(conn, work)
    done = True
    for key in sorted(wanted):
        topic, partition = key
        if key in ongoing:
            state, done = "is still in progress.", False
        elif current.get(key) == wanted[key]:
            state = "is completed."
        else:
            state, done = f"did not happen: its replicas are {list(current.get(key, ()))}.", False
        click.echo(f"Reassignment of partition {topic}-{partition} {state}")
    if not done:
        raise SystemExit(1)


def _cancel(conn: Connection, wanted: Assignment) -> None:
    async def work(admin: AdminClient) -> dict[tuple[str, int], str | None]:
        results = await admin.alter_partition_reassignments(dict.fromkeys(wanted))
        return {k: None if e is None else e.message for k, e in results.items()}

    results = run_admin(conn, work)
    for (topic, partition), message in sorted(results.items()):
        if message is None:
            click.echo(f"Cancelled the reassignment of {topic}-{partition}.")
        else:
            click.echo(f"{topic}-{partition}: {message}")
