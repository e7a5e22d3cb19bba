"""``highwater groups``: list, describe, reset the offsets of and delete consumer groups.

Like kafka-consumer-groups, through :class:`~highwater.client.admin.AdminClient`. Every
subcommand takes ``--bootstrap-server HOST:PORT[,HOST:PORT...]`` (required) and
``--timeout SECONDS``. Tables are printed with left-aligned columns as wide as their
widest cell, ``-`` where a value is unknown:

- ``list``: the group ids, one per line; with ``--state S`` only the groups in those states,
  as ``GROUP STATE`` rows.
- ``describe --group G``: ``GROUP TOPIC PARTITION CURRENT-OFFSET LOG-END-OFFSET LAG
  CONSUMER-ID HOST CLIENT-ID``, one row per partition with a committed offset or assigned
  to a member (plus a row for each member without partitions); the log end offset is
  ListOffsets' latest, ``LAG`` is it minus the committed offset. ``--members`` prints
  ``GROUP CONSUMER-ID HOST CLIENT-ID #PARTITIONS`` (``--verbose``: and ``ASSIGNMENT``),
  ``--state`` prints ``GROUP COORDINATOR (ID) ASSIGNMENT-STRATEGY STATE #MEMBERS``.
- ``reset-offsets --group G --topic T[:P,...]``: the new offsets as ``GROUP TOPIC PARTITION
  NEW-OFFSET`` rows; only a dry run unless ``--execute`` is given. A group with active
  members is refused (their positions would overwrite the reset).
- ``delete --group G``: deletes empty groups and their offsets.

A failure (an unknown group or topic, a group with members, no server reachable) is one
``Error: ...`` line on stderr and exit code 1; malformed options are usage errors (exit 2).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Iterable, Sequence
from datetime import datetime
from typing import Any, Final, TypeVar

import click
import grpc.aio

from highwater.cli.addresses import address_list
from highwater.client.admin import (
    AdminClient,
    AdminError,
    ConsumerGroupDescription,
    GroupIdNotFoundError,
    GroupNotEmptyError,
    OffsetSpec,
    UnknownTopicOrPartitionError,
)
from highwater.errors import HighwaterError
from highwater.group.protocol import TopicPartitionKey

__all__ = ["format_table", "groups", "parse_topic_spec"]

T = TypeVar("T")

#: The group states the coordinator reports, as Kafka names them.
GROUP_STATES: Final = ("Empty", "PreparingRebalance", "CompletingRebalance", "Stable", "Dead")
_INACTIVE_STATES: Final = frozenset({"Empty", "Dead"})


# --- Option parsing --------------------------------------------------------------------


def parse_topic_spec(spec: str) -> tuple[str, tuple[int, ...] | None]:
    """``T`` (every partition, None) or ``T:P[,P...]`` as (topic, partitions); ValueError if
    malformed."""
    topic, colon, rest = spec.partition(":")
    topic = topic.strip()
    if not topic:
        raise ValueError(f"{spec!r} names no topic")
    if not colon:
        return topic, None
    partitions: list[int] = []
    for item in rest.split(","):
        text = item.strip()
        if not text.isdigit():
            raise ValueError(f"{spec!r}: {text!r} is not a partition number (TOPIC:P,P...)")
        partitions.append(int(text))
    return topic, tuple(sorted(set(partitions)))


def _parse_topics(
    _ctx: click.Context, _param: click.Parameter, value: tuple[str, ...]
) -> list[tuple[str, tuple[int, ...] | None]]:
    specs = []
    for spec in value:
        try:
            specs.append(parse_topic_spec(spec))
        except ValueError as e:
            raise click.BadParameter(str(e)) from None
    return specs


def _connection_options(command: Callable[..., None]) -> Callable[..., None]:
    """Add ``--bootstrap-server`` and ``--timeout``, passed on as an ``admin`` factory."""

    @functools.wraps(command)
    def wrapper(bootstrap_server: str, timeout: float, **kwargs: Any) -> None:
        command(admin=lambda: AdminClient(bootstrap_server, request_timeout_s=timeout), **kwargs)

    with_timeout = click.option(
        "--timeout",
        type=click.FloatRange(min=0.1),
        default=30.0,
        show_default=True,
        help="Seconds to wait for the cluster to answer, retries included.",
    )(wrapper)
    return click.option(
        "--bootstrap-server",
        "bootstrap_server",
        required=True,
        callback=address_list,
        metavar="HOST:PORT[,HOST:PORT...]",
        help="Brokers to connect to (in `highwater server`, its one port).",
    )(with_timeout)


AdminFactory = Callable[[], AdminClient]


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _run(admin: AdminFactory, work: Callable[[AdminClient], Awaitable[T]]) -> T:
    """Run ``work`` with an admin client; any failure becomes a one-line ClickException."""

    async def main() -> T:
        async with admin() as client:
            return await work(client)

    try:
        return asyncio.run(main())
    except AdminError as e:
        raise click.ClickException(_one_line(e.message or e.code_name)) from None
    except HighwaterError as e:
        raise click.ClickException(_one_line(str(e) or e.code_name)) from None
    except grpc.aio.AioRpcError as e:
        raise click.ClickException(_one_line(f"{e.code().name}: {e.details()}")) from None


# --- Output ----------------------------------------------------------------------------


def format_table(header: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """Left-aligned columns as wide as their widest cell, one space apart."""
    lines = [list(header), *([str(cell) for cell in row] for row in rows)]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join(
        " ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        for line in lines
    )


def _dash(value: object | None) -> str:
    return "-" if value is None else str(value)


def _assignment_text(partitions: Sequence[TopicPartitionKey]) -> str:
    """``t1(0,1), t2(0)``, as kafka-consumer-groups prints an assignment."""
    by_topic: dict[str, list[int]] = {}
    for topic, partition in partitions:
        by_topic.setdefault(topic, []).append(partition)
    return ", ".join(f"{t}({','.join(map(str, ps))})" for t, ps in sorted(by_topic.items()))


# --- Commands --------------------------------------------------------------------------


@click.group("groups")
def groups() -> None:
    """List, describe, reset the offsets of and delete consumer groups (like
    kafka-consumer-groups)."""


@groups.command("list")
@_connection_options
@click.option(
    "--state",
    "states",
    multiple=True,
    type=click.Choice(GROUP_STATES, case_sensitive=False),
    help="Only groups in this state (repeatable); prints each group's state too.",
)
def list_(admin: AdminFactory, states: tuple[str, ...]) -> None:
    """List consumer groups, one per line."""

    async def work(client: AdminClient) -> list[tuple[str, str]]:
        listed = await client.list_consumer_groups(states or None)
        return [(g.group_id, g.state) for g in listed]

    listed = _run(admin, work)
    if states:
        if listed:
            click.echo(format_table(("GROUP", "STATE"), listed))
        return
    for group_id, _ in listed:
        click.echo(group_id)


async def _describe(client: AdminClient, group_id: str) -> ConsumerGroupDescription:
    return (await client.describe_consumer_groups([group_id]))[group_id]


async def _log_end_offsets(
    client: AdminClient, partitions: Iterable[TopicPartitionKey]
) -> dict[TopicPartitionKey, int]:
    """The latest offset of each partition; those of unknown topics are left out."""
    by_topic: dict[str, list[TopicPartitionKey]] = {}
    for tp in partitions:
        by_topic.setdefault(tp[0], []).append(tp)

    async def of_topic(tps: list[TopicPartitionKey]) -> dict[TopicPartitionKey, int]:
        try:
            found = await client.list_offsets(dict.fromkeys(tps, OffsetSpec.LATEST))
        except UnknownTopicOrPartitionError:
            return {}
        return {tp: info.offset for tp, info in found.items()}

    ends: dict[TopicPartitionKey, int] = {}
    for found in await asyncio.gather(*(of_topic(tps) for tps in by_topic.values())):
        ends.update(found)
    return ends


def _offset_rows(
    group_id: str,
    description: ConsumerGroupDescription,
    committed: dict[TopicPartitionKey, int],
    ends: dict[TopicPartitionKey, int],
) -> list[list[str]]:
    owners = {tp: m for m in description.members for tp in m.assignment}
    rows: list[list[str]] = []
    for tp in sorted({*committed, *owners}):
        current, end = committed.get(tp), ends.get(tp)
        lag = None if current is None or end is None else max(end - current, 0)
        owner = owners.get(tp)
        rows.append(
            [
                group_id,
                tp[0],
                str(tp[1]),
                _dash(current),
                _dash(end),
                _dash(lag),
                _dash(owner and owner.member_id),
                _dash(owner and owner.host),
                _dash(owner and owner.client_id),
            ]
        )
    for member in sorted(description.members, key=lambda m: m.member_id):
        if not member.assignment:
            rows.append(
                [group_id, "-", "-", "-", "-", "-", member.member_id, member.host, member.client_id]
            )
    return rows


@groups.command("describe")
@_connection_options
@click.option("--group", "group_id", required=True, help="The consumer group to describe.")
@click.option("--members", "show_members", is_flag=True, help="Describe the members instead.")
@click.option("--state", "show_state", is_flag=True, help="Describe the group's state instead.")
@click.option("--verbose", is_flag=True, help="With --members: each member's partitions too.")
def describe(
    admin: AdminFactory, group_id: str, show_members: bool, show_state: bool, verbose: bool
) -> None:
    """Describe a group's committed offsets, log end offsets, lag and owners."""
    if show_members and show_state:
        raise click.UsageError("--members and --state exclude each other")
    if verbose and not show_members:
        raise click.UsageError("--verbose goes with --members")

    async def offsets_view(client: AdminClient) -> tuple[ConsumerGroupDescription, str]:
        description = await _describe(client, group_id)
        committed = {
            tp: o.offset for tp, o in (await client.list_consumer_group_offsets(group_id)).items()
        }
        assigned = {tp for m in description.members for tp in m.assignment}
        ends = await _log_end_offsets(client, {*committed, *assigned})
        header = (
            "GROUP",
            "TOPIC",
            "PARTITION",
            "CURRENT-OFFSET",
            "LOG-END-OFFSET",
            "LAG",
            "CONSUMER-ID",
            "HOST",
            "CLIENT-ID",
        )
        rows = _offset_rows(group_id, description, committed, ends)
        return description, format_table(header, rows) if rows else ""

    async def members_view(client: AdminClient) -> tuple[ConsumerGroupDescription, str]:
        description = await _describe(client, group_id)
        header = ["GROUP", "CONSUMER-ID", "HOST", "CLIENT-ID", "#PARTITIONS"]
        if verbose:
            header.append("ASSIGNMENT")
        rows = []
        for m in sorted(description.members, key=lambda m: m.member_id):
            row = [group_id, m.member_id, m.host, m.client_id, str(len(m.assignment))]
            if verbose:
                row.append(_assignment_text(m.assignment) or "-")
            rows.append(row)
        return description, format_table(header, rows) if rows else ""

    async def state_view(client: AdminClient) -> tuple[ConsumerGroupDescription, str]:
        d = await _describe(client, group_id)
        header = ("GROUP", "COORDINATOR (ID)", "ASSIGNMENT-STRATEGY", "STATE", "#MEMBERS")
        row = (
            group_id,
            f"{d.coordinator.address} ({d.coordinator.node_id})",
            d.partition_assignor or "-",
            d.state,
            len(d.members),
        )
        return d, format_table(header, [row])

    view = state_view if show_state else members_view if show_members else offsets_view
    description, table = _run(admin, view)
    if not show_state:
        if not description.members:
            click.echo(f"Consumer group '{group_id}' has no active members.", err=True)
        elif description.state in ("PreparingRebalance", "CompletingRebalance"):
            click.echo(f"Warning: consumer group '{group_id}' is rebalancing.", err=True)
    if table:
        click.echo(table)


@groups.command("reset-offsets")
@_connection_options
@click.option("--group", "group_id", required=True, help="The consumer group to reset.")
@click.option(
    "--topic",
    "topic_specs",
    multiple=True,
    callback=_parse_topics,
    metavar="TOPIC[:P,P...]",
    help="A topic, or some of its partitions, to reset (repeatable).",
)
@click.option("--all-topics", is_flag=True, help="Every topic the group has offsets for.")
@click.option("--to-earliest", is_flag=True, help="Reset to the earliest offset.")
@click.option("--to-latest", is_flag=True, help="Reset to the latest offset (the end).")
@click.option("--to-offset", type=click.IntRange(min=0), default=None, help="Reset to N.")
@click.option(
    "--shift-by", type=int, default=None, help="Move the committed offsets by N (+ or -)."
)
@click.option(
    "--to-datetime",
    default=None,
    metavar="ISO-8601",
    help="Reset to the first record at or after this time, e.g. 2024-05-01T12:00:00 "
    "(local time unless an offset such as +00:00 is given).",
)
@click.option("--dry-run", is_flag=True, help="Only print the new offsets (the default).")
@click.option("--execute", is_flag=True, help="Commit the new offsets.")
def reset_offsets(
    admin: AdminFactory,
    group_id: str,
    topic_specs: list[tuple[str, tuple[int, ...] | None]],
    all_topics: bool,
    to_earliest: bool,
    to_latest: bool,
    to_offset: int | None,
    shift_by: int | None,
    to_datetime: str | None,
    dry_run: bool,
    execute: bool,
) -> None:
    """Reset a group's committed offsets (the group must have no active members)."""
    scenarios = [
        name
        for name, given in (
            ("--to-earliest", to_earliest),
            ("--to-latest", to_latest),
            ("--to-offset", to_offset is not None),
            ("--shift-by", shift_by is not None),
            ("--to-datetime", to_datetime is not None),
        )
        if given
    ]
    if len(scenarios) != 1:
        raise click.UsageError(
            "give exactly one of --to-earliest, --to-latest, --to-offset, --shift-by, "
            "--to-datetime" + (f" (not {' and '.join(scenarios)})" if scenarios else "")
        )
    if dry_run and execute:
        raise click.UsageError("--dry-run and --execute exclude each other")
    if bool(topic_specs) == all_topics:
        raise click.UsageError("give --topic (repeatable) or --all-topics")
    timestamp_ms: int | None = None
    if to_datetime is not None:
        try:
            timestamp_ms = OffsetSpec.for_timestamp(datetime.fromisoformat(to_datetime))
        except ValueError as e:
            raise click.BadParameter(str(e), param_hint="'--to-datetime'") from None

    async def partitions_to_reset(client: AdminClient) -> list[TopicPartitionKey]:
        if all_topics:
            return sorted(await client.list_consumer_group_offsets(group_id))
        whole = [topic for topic, ps in topic_specs if ps is None]
        described = await client.describe_topics(whole) if whole else {}
        wanted: set[TopicPartitionKey] = set()
        for topic, ps in topic_specs:
            if ps is None:
                wanted.update((topic, p.partition) for p in described[topic].partitions)
            else:
                wanted.update((topic, p) for p in ps)
        return sorted(wanted)

    async def work(client: AdminClient) -> dict[TopicPartitionKey, int]:
        try:
            description = await _describe(client, group_id)
            state = description.state
        except GroupIdNotFoundError:
            state = "Dead"  # no group yet: the reset creates its offsets
        if state not in _INACTIVE_STATES:
            raise click.ClickException(
                f"Assignments can only be reset if the group '{group_id}' is inactive "
                f"(no active members), but the current state is {state}."
            )
        partitions = await partitions_to_reset(client)
        if not partitions:
            return {}
        earliest = await client.list_offsets(dict.fromkeys(partitions, OffsetSpec.EARLIEST))
        latest = await client.list_offsets(dict.fromkeys(partitions, OffsetSpec.LATEST))
        committed = await client.list_consumer_group_offsets(group_id, partitions)
        by_time = (
            await client.list_offsets(dict.fromkeys(partitions, timestamp_ms))
            if timestamp_ms is not None
            else {}
        )
        new: dict[TopicPartitionKey, int] = {}
        for tp in partitions:
            low, high = earliest[tp].offset, latest[tp].offset
            if to_earliest:
                target = low
            elif to_latest:
                target = high
            elif to_offset is not None:
                target = to_offset
            elif shift_by is not None:
                current = committed.get(tp)
                if current is None:
                    raise click.ClickException(
                        f"Cannot shift the offset of {tp[0]}-{tp[1]}: the group has no "
                        "committed offset for it."
                    )
                target = current.offset + shift_by
            else:
                found = by_time[tp].offset
                target = high if found < 0 else found
            new[tp] = min(max(target, low), high)
        if execute:
            try:
                await client.alter_consumer_group_offsets(group_id, new)
            except GroupNotEmptyError:
                raise click.ClickException(
                    f"Assignments can only be reset if the group '{group_id}' is inactive, "
                    "but it has active members."
                ) from None
        return new

    new = _run(admin, work)
    if not execute:
        click.echo(
            "WARN: No action was performed as the --execute option is missing. "
            "Add --execute to commit the new offsets.",
            err=True,
        )
    rows = [(group_id, topic, partition, offset) for (topic, partition), offset in new.items()]
    click.echo(format_table(("GROUP", "TOPIC", "PARTITION", "NEW-OFFSET"), rows))


@groups.command("delete")
@_connection_options
@click.option(
    "--group", "group_ids", required=True, multiple=True, help="A group to delete (repeatable)."
)
def delete(admin: AdminFactory, group_ids: tuple[str, ...]) -> None:
    """Delete consumer groups that have no active members, with their offsets."""

    async def work(client: AdminClient) -> list[tuple[str, AdminError | None]]:
        results = await client.delete_consumer_groups(group_ids)
        return [(g, r.error) for g, r in results.items()]

    failed = []
    deleted = []
    for group_id, error in _run(admin, work):
        if error is None:
            deleted.append(group_id)
        elif isinstance(error, GroupNotEmptyError):
            failed.append(f"Cannot delete group '{group_id}': it has active members.")
        elif isinstance(error, GroupIdNotFoundError):
            failed.append(f"Cannot delete group '{group_id}': it does not exist.")
        else:
            failed.append(f"Cannot delete group '{group_id}': {_one_line(error.message)}")
    if deleted:
        names = ", ".join(f"'{g}'" for g in deleted)
        click.echo(f"Deletion of requested consumer groups ({names}) was successful.")
    for line in failed:
        click.echo(f"Error: {line}", err=True)
    if failed:
        raise SystemExit(1)
