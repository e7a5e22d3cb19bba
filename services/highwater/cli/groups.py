"""``highwater groups``: list, describe, reset the offsets of and delete consumer groups.

Like kafka-consumer-groups, through :class:`~highwater.client.admin.AdminClient`. Every
subcommand takes ``--bootstrap-server HOST:PORT[,HOST:PORT...]`` (else the environment or
the profile, :mod:`highwater.cli.bootstrap`), ``--timeout SECONDS`` and, where it prints
a table, ``--format text|json`` (:mod:`highwater.cli.tables`: aligned columns with ``-``
where a value is unknown, or an array of objects). ``describe``, ``reset-offsets`` and
``delete`` take ``--group G`` (repeatable) or ``--all-groups``:

- ``list``: the group ids, one per line; with ``--state S`` only the groups in those states,
  as ``GROUP STATE`` rows.
- ``describe --group G``: ``GROUP TOPIC PARTITION CURRENT-OFFSET LOG-END-OFFSET LAG
  CONSUMER-ID HOST CLIENT-ID``, one row per partition with a committed offset or assigned
  to a member (plus a row for each member without partitions); the log end offset is
  ListOffsets' latest, ``LAG`` is it minus the committed offset. ``--members`` prints
  ``GROUP CONSUMER-ID HOST CLIENT-ID #PARTITIONS`` (``--verbose``: and ``ASSIGNMENT``),
  ``--state`` prints ``GROUP COORDINATOR (ID) ASSIGNMENT-STRATEGY STATE #MEMBERS``.
- ``reset-offsets --group G --topic T[:P,...]`` (or ``--all-topics``) with one scenario:
  ``--to-earliest``, ``--to-latest``, ``--to-current``, ``--to-offset``, ``--shift-by``,
  ``--to-datetime``, ``--by-duration PnDTnHnMnS`` or ``--from-file`` (the CSV
  ``--export`` prints: ``topic,partition,offset``, or ``group,topic,partition,offset``
  for several groups); the new offsets as ``GROUP TOPIC PARTITION NEW-OFFSET`` rows, only
  a dry run unless ``--execute`` is given. A group with active members is refused (their
  positions would overwrite the reset).
- ``delete-offsets --group G --topic T[:P,...]``: removes committed offsets (Kafka's
  OffsetDelete), refused per partition for topics the group's members subscribe to;
  ``TOPIC PARTITION STATUS`` rows.
- ``delete --group G``: deletes empty groups and their offsets.

A failure (an unknown group or topic, a group with members, no server reachable) is one
``Error: ...`` line on stderr and exit code 1; malformed options are usage errors (exit 2).
"""

from __future__ import annotations

import asyncio
import csv
import functools
import io
import re
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Final, TypeVar

import click
import grpc.aio

from highwater.cli.bootstrap import bootstrap_server_option
from highwater.cli.tables import Column, format_option, print_table
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

__all__ = ["groups", "parse_duration", "parse_offsets_csv", "parse_topic_spec"]

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
    return bootstrap_server_option()(with_timeout)


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


OFFSET_COLUMNS: Final = tuple(
    Column(h)
    for h in (
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
)
MEMBER_COLUMNS: Final = tuple(
    Column(h) for h in ("GROUP", "CONSUMER-ID", "HOST", "CLIENT-ID", "#PARTITIONS")
)
STATE_COLUMNS: Final = (
    Column("GROUP"),
    Column("COORDINATOR (ID)", "coordinator"),
    Column("ASSIGNMENT-STRATEGY"),
    Column("STATE"),
    Column("#MEMBERS", "members"),
)
LIST_COLUMNS: Final = (Column("GROUP"), Column("STATE"))
DELETE_OFFSETS_COLUMNS: Final = (Column("TOPIC"), Column("PARTITION"), Column("STATUS"))
RESET_COLUMNS: Final = (Column("GROUP"), Column("TOPIC"), Column("PARTITION"), Column("NEW-OFFSET"))


def _assignment_text(partitions: Sequence[TopicPartitionKey]) -> str:
    """``t1(0,1), t2(0)``, as kafka-consumer-groups prints an assignment."""
    by_topic: dict[str, list[int]] = {}
    for topic, partition in partitions:
        by_topic.setdefault(topic, []).append(partition)
    return ", ".join(f"{t}({','.join(map(str, ps))})" for t, ps in sorted(by_topic.items()))


_DURATION = re.compile(
    r"P(?:(?P<days>\d+)D)?(?:T(?:(?P<hours>\d+)H)?(?:(?P<minutes>\d+)M)?"
    r"(?:(?P<seconds>\d+(?:\.\d+)?)S)?)?",
    re.IGNORECASE,
)


def parse_duration(text: str) -> timedelta:
    """An ISO-8601 duration ``PnDTnHnMnS`` (kafka-consumer-groups' ``--by-duration``, as
    Java's ``Duration.parse``: ``P7D``, ``PT1H30M``, ``P1DT0.5S``); ValueError if malformed."""
    match = _DURATION.fullmatch(text.strip())
    if match is None or not any(match.groups()) or text.strip().upper().endswith("T"):
        raise ValueError(f"{text!r} is not a duration PnDTnHnMnS (e.g. P1DT2H, PT30M)")
    return timedelta(
        days=int(match["days"] or 0),
        hours=int(match["hours"] or 0),
        minutes=int(match["minutes"] or 0),
        seconds=float(match["seconds"] or 0),
    )


def parse_offsets_csv(text: str) -> dict[str | None, dict[TopicPartitionKey, int]]:
    """``--export``'s CSV: ``topic,partition,offset`` rows (group None: the one given), or
    ``group,topic,partition,offset`` rows; ValueError naming the bad line."""
    found: dict[str | None, dict[TopicPartitionKey, int]] = {}
    for number, row in enumerate(csv.reader(io.StringIO(text)), start=1):
        if not row or not "".join(row).strip():
            continue
        cells = [cell.strip() for cell in row]
        if len(cells) not in (3, 4):
            raise ValueError(f"line {number}: expected topic,partition,offset or "
                             "group,topic,partition,offset")  # fmt: skip
        group: str | None = cells[0] if len(cells) == 4 else None
        topic, partition, offset = cells[-3:]
        if not topic or not partition.isdigit() or not offset.isdigit():
            raise ValueError(f"line {number}: {','.join(cells)!r} is not topic,partition,offset")
        found.setdefault(group, {})[(topic, int(partition))] = int(offset)
    if not found:
        raise ValueError("no offsets in the file")
    return found


#: A group's description and the rows a ``describe`` view prints of it.
_View = tuple[ConsumerGroupDescription, list[list[object]]]


# --- Commands --------------------------------------------------------------------------


@click.group("groups")
def groups() -> None:
    """List, describe, reset the offsets of and delete consumer groups (like
    kafka-consumer-groups)."""


def _group_selection(command: Callable[..., None]) -> Callable[..., None]:
    """``--group`` (repeatable) and ``--all-groups``, passed as ``group_ids`` and
    ``all_groups``."""
    with_all = click.option(
        "--all-groups", is_flag=True, help="Every consumer group in the cluster."
    )(command)
    return click.option(
        "--group", "group_ids", multiple=True, help="A consumer group (repeatable)."
    )(with_all)


def _check_selection(group_ids: tuple[str, ...], all_groups: bool) -> None:
    if bool(group_ids) == all_groups:
        raise click.UsageError("give --group (repeatable) or --all-groups")


async def _selected(client: AdminClient, group_ids: tuple[str, ...], all_groups: bool) -> list[str]:
    if not all_groups:
        return list(dict.fromkeys(group_ids))
    return [g.group_id for g in await client.list_consumer_groups()]


@groups.command("list")
@_connection_options
@click.option(
    "--state",
    "states",
    multiple=True,
    type=click.Choice(GROUP_STATES, case_sensitive=False),
    help="Only groups in this state (repeatable); prints each group's state too.",
)
@format_option
def list_(admin: AdminFactory, states: tuple[str, ...], output_format: str) -> None:
    """List consumer groups, one per line."""

    async def work(client: AdminClient) -> list[tuple[str, str]]:
        listed = await client.list_consumer_groups(states or None)
        return [(g.group_id, g.state) for g in listed]

    listed = _run(admin, work)
    if output_format == "json" or states:
        print_table(LIST_COLUMNS, listed, output_format, header_when_empty=False)
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
) -> list[list[object]]:
    owners = {tp: m for m in description.members for tp in m.assignment}
    rows: list[list[object]] = []
    for tp in sorted({*committed, *owners}):
        current, end = committed.get(tp), ends.get(tp)
        lag = None if current is None or end is None else max(end - current, 0)
        owner = owners.get(tp)
        rows.append(
            [
                group_id,
                tp[0],
                tp[1],
                current,
                end,
                lag,
                owner and owner.member_id,
                owner and owner.host,
                owner and owner.client_id,
            ]
        )
    for member in sorted(description.members, key=lambda m: m.member_id):
        if not member.assignment:
            rows.append(
                [group_id, None, None, None, None, None, member.member_id, member.host,
                 member.client_id]
            )  # fmt: skip
    return rows


@groups.command("describe")
@_connection_options
@_group_selection
@click.option("--members", "show_members", is_flag=True, help="Describe the members instead.")
@click.option("--state", "show_state", is_flag=True, help="Describe the group's state instead.")
@click.option("--verbose", is_flag=True, help="With --members: each member's partitions too.")
@format_option
def describe(
    admin: AdminFactory,
    group_ids: tuple[str, ...],
    all_groups: bool,
    show_members: bool,
    show_state: bool,
    verbose: bool,
    output_format: str,
) -> None:
    """Describe groups' committed offsets, log end offsets, lag and owners."""
    _check_selection(group_ids, all_groups)
    if show_members and show_state:
        raise click.UsageError("--members and --state exclude each other")
    if verbose and not show_members:
        raise click.UsageError("--verbose goes with --members")

    async def offsets_view(client: AdminClient, group_id: str) -> _View:
        description = await _describe(client, group_id)
        committed = {
            tp: o.offset for tp, o in (await client.list_consumer_group_offsets(group_id)).items()
        }
        assigned = {tp for m in description.members for tp in m.assignment}
        ends = await _log_end_offsets(client, {*committed, *assigned})
        return description, _offset_rows(group_id, description, committed, ends)

    async def members_view(client: AdminClient, group_id: str) -> _View:
        description = await _describe(client, group_id)
        rows: list[list[object]] = []
        for m in sorted(description.members, key=lambda m: m.member_id):
            row: list[object] = [group_id, m.member_id, m.host, m.client_id, len(m.assignment)]
            if verbose:
                row.append(_assignment_text(m.assignment) or None)
            rows.append(row)
        return description, rows

    async def state_view(client: AdminClient, group_id: str) -> _View:
        d = await _describe(client, group_id)
        row: list[object] = [
            group_id,
            f"{d.coordinator.address} ({d.coordinator.node_id})",
            d.partition_assignor or None,
            d.state,
            len(d.members),
        ]
        return d, [row]

    view = state_view if show_state else members_view if show_members else offsets_view

    async def work(client: AdminClient) -> list[_View]:
        return [await view(client, g) for g in await _selected(client, group_ids, all_groups)]

    described = _run(admin, work)
    rows: list[list[object]] = []
    for description, found in described:
        group_id = description.group_id
        if not show_state:
            if not description.members:
                click.echo(f"Consumer group '{group_id}' has no active members.", err=True)
            elif description.state in ("PreparingRebalance", "CompletingRebalance"):
                click.echo(f"Warning: consumer group '{group_id}' is rebalancing.", err=True)
        rows.extend(found)
    columns: Sequence[Column] = OFFSET_COLUMNS
    if show_state:
        columns = STATE_COLUMNS
    elif show_members:
        columns = (*MEMBER_COLUMNS, Column("ASSIGNMENT")) if verbose else MEMBER_COLUMNS
    print_table(columns, rows, output_format, header_when_empty=False)


@groups.command("reset-offsets")
@_connection_options
@_group_selection
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
@click.option("--to-current", is_flag=True, help="Reset to the committed offset (else the latest).")
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
@click.option(
    "--by-duration",
    default=None,
    metavar="PnDTnHnMnS",
    help="Reset to the first record at or after this long ago, e.g. P1DT2H or PT30M.",
)
@click.option(
    "--from-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Reset to the offsets of a CSV file as --export writes it.",
)
@click.option("--dry-run", is_flag=True, help="Only print the new offsets (the default).")
@click.option("--execute", is_flag=True, help="Commit the new offsets.")
@click.option(
    "--export",
    is_flag=True,
    help="Print the new offsets as CSV (topic,partition,offset; with several groups "
    "group,topic,partition,offset), for --from-file.",
)
@format_option
def reset_offsets(
    admin: AdminFactory,
    group_ids: tuple[str, ...],
    all_groups: bool,
    topic_specs: list[tuple[str, tuple[int, ...] | None]],
    all_topics: bool,
    to_earliest: bool,
    to_latest: bool,
    to_current: bool,
    to_offset: int | None,
    shift_by: int | None,
    to_datetime: str | None,
    by_duration: str | None,
    from_file: Path | None,
    dry_run: bool,
    execute: bool,
    export: bool,
    output_format: str,
) -> None:
    """Reset groups' committed offsets (a group must have no active members)."""
    _check_selection(group_ids, all_groups)
    scenarios = [
        name
        for name, given in (
            ("--to-earliest", to_earliest),
            ("--to-latest", to_latest),
            ("--to-current", to_current),
            ("--to-offset", to_offset is not None),
            ("--shift-by", shift_by is not None),
            ("--to-datetime", to_datetime is not None),
            ("--by-duration", by_duration is not None),
            ("--from-file", from_file is not None),
        )
        if given
    ]
    if len(scenarios) != 1:
        raise click.UsageError(
            "give exactly one of --to-earliest, --to-latest, --to-current, --to-offset, "
            "--shift-by, --to-datetime, --by-duration, --from-file"
            + (f" (not {' and '.join(scenarios)})" if scenarios else "")
        )
    if dry_run and execute:
        raise click.UsageError("--dry-run and --execute exclude each other")
    if export and output_format == "json":
        raise click.UsageError("--export prints CSV: it does not go with --format json")
    from_csv: dict[str | None, dict[TopicPartitionKey, int]] = {}
    if from_file is not None:
        if topic_specs or all_topics:
            raise click.UsageError("--from-file names its partitions: no --topic or --all-topics")
        try:
            from_csv = parse_offsets_csv(from_file.read_text())
        except OSError as e:
            raise click.ClickException(f"{from_file}: {e.strerror or e}") from None
        except ValueError as e:
            raise click.ClickException(f"{from_file}: {e}") from None
        if None in from_csv and (all_groups or len(group_ids) != 1):
            raise click.UsageError(
                "a topic,partition,offset file is for one --group; name each row's group "
                "(group,topic,partition,offset) for several"
            )
    elif bool(topic_specs) == all_topics:
        raise click.UsageError("give --topic (repeatable) or --all-topics")
    timestamp_ms: int | None = None
    if to_datetime is not None:
        try:
            timestamp_ms = OffsetSpec.for_timestamp(datetime.fromisoformat(to_datetime))
        except ValueError as e:
            raise click.BadParameter(str(e), param_hint="'--to-datetime'") from None
    if by_duration is not None:
        try:
            ago = parse_duration(by_duration)
        except ValueError as e:
            raise click.BadParameter(str(e), param_hint="'--by-duration'") from None
        timestamp_ms = max(int((time.time() - ago.total_seconds()) * 1000), 0)

    async def partitions_to_reset(client: AdminClient, group_id: str) -> list[TopicPartitionKey]:
        if from_file is not None:
            return sorted(from_csv.get(None, from_csv.get(group_id, {})))
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

    async def reset_group(client: AdminClient, group_id: str) -> dict[TopicPartitionKey, int]:
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
        partitions = await partitions_to_reset(client, group_id)
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
        wanted_from_file = from_csv.get(None, from_csv.get(group_id, {}))
        new: dict[TopicPartitionKey, int] = {}
        for tp in partitions:
            low, high = earliest[tp].offset, latest[tp].offset
            current = committed.get(tp)
            if to_earliest:
                target = low
            elif to_latest:
                target = high
            elif to_current:
                target = high if current is None else current.offset
            elif to_offset is not None:
                target = to_offset
            elif from_file is not None:
                target = wanted_from_file[tp]
            elif shift_by is not None:
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

    async def work(client: AdminClient) -> dict[str, dict[TopicPartitionKey, int]]:
        selected = await _selected(client, group_ids, all_groups)
        if from_file is not None and None not in from_csv:
            selected = [g for g in selected if g in from_csv]
        return {group_id: await reset_group(client, group_id) for group_id in selected}

    reset = _run(admin, work)
    if not execute and not dry_run:  # as kafka-consumer-groups: --dry-run asked for this
        click.echo(
            "WARN: No action was performed as the --execute option is missing. "
            "Add --execute to commit the new offsets.",
            err=True,
        )
    rows = [
        (group_id, topic, partition, offset)
        for group_id, new in reset.items()
        for (topic, partition), offset in new.items()
    ]
    if export:
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerows(row if len(reset) > 1 else row[1:] for row in rows)
        click.echo(out.getvalue(), nl=False)
        return
    print_table(RESET_COLUMNS, rows, output_format)


@groups.command("delete-offsets")
@_connection_options
@click.option("--group", "group_id", required=True, help="The consumer group.")
@click.option(
    "--topic",
    "topic_specs",
    multiple=True,
    required=True,
    callback=_parse_topics,
    metavar="TOPIC[:P,P...]",
    help="A topic, or some of its partitions, whose offsets go (repeatable).",
)
@format_option
def delete_offsets(
    admin: AdminFactory,
    group_id: str,
    topic_specs: list[tuple[str, tuple[int, ...] | None]],
    output_format: str,
) -> None:
    """Delete some committed offsets of a group (not of topics its members subscribe to)."""

    async def work(client: AdminClient) -> dict[TopicPartitionKey, AdminError | None]:
        whole = [topic for topic, ps in topic_specs if ps is None]
        described = await client.describe_topics(whole) if whole else {}
        wanted: set[TopicPartitionKey] = set()
        for topic, ps in topic_specs:
            if ps is None:
                wanted.update((topic, p.partition) for p in described[topic].partitions)
            else:
                wanted.update((topic, p) for p in ps)
        return await client.delete_consumer_group_offsets(group_id, sorted(wanted))

    results = _run(admin, work)
    rows = [
        (topic, partition, "Successful" if error is None else f"Error: {_one_line(error.message)}")
        for (topic, partition), error in sorted(results.items())
    ]
    failed = any(error is not None for error in results.values())
    if output_format == "text":
        outcome = "failed" if failed else "succeed"
        topics = ",".join(sorted({topic for topic, _ in results}))
        click.echo(f"Request {outcome} for deleting offsets with topic {topics} group {group_id}")
        click.echo()
    print_table(DELETE_OFFSETS_COLUMNS, rows, output_format)
    if failed:
        raise SystemExit(1)


@groups.command("delete")
@_connection_options
@_group_selection
def delete(admin: AdminFactory, group_ids: tuple[str, ...], all_groups: bool) -> None:
    """Delete consumer groups that have no active members, with their offsets."""
    _check_selection(group_ids, all_groups)

    async def work(client: AdminClient) -> list[tuple[str, AdminError | None]]:
        selected = await _selected(client, group_ids, all_groups)
        if not selected:
            return []
        results = await client.delete_consumer_groups(selected)
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
