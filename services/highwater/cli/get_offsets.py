"""``highwater get-offsets``: partitions' earliest, latest or by-time offsets (kafka-get-offsets).

Shaped like ``kafka-get-offsets.sh``::

    highwater get-offsets --bootstrap-server B [--topic REGEX] [--partitions 0,1] \\
        [--time -1|-2|-3|latest|earliest|max-timestamp|<timestamp ms>] [--exclude-internal-topics]

``--topic`` is a regular expression matched against whole topic names (a plain name
matches itself); without it every topic is asked. ``--time``: ``-1``/``latest`` (the
default) is the log end offset, ``-2``/``earliest`` the log start offset, ``-3``/
``max-timestamp`` the offset of the record with the largest timestamp, and a timestamp in
milliseconds the first offset whose record is at or after it. One line per partition,
``topic:partition:offset``, sorted; the offset is left empty when no record is at or
after the time asked for. No partition matching is an error (exit 1).
With ``--format json``: ``[{"topic", "partition", "offset"}]``, ``null`` for no offset.
"""

from __future__ import annotations

import re

import click

from highwater.cli.tables import Column, format_option, print_table
from highwater.cli.topics import Connection, connection_options, run_admin
from highwater.client.admin import AdminClient, OffsetSpec

__all__ = ["get_offsets", "parse_time"]

_NAMED_TIMES = {
    "latest": OffsetSpec.LATEST,
    "earliest": OffsetSpec.EARLIEST,
    "max-timestamp": OffsetSpec.MAX_TIMESTAMP,
}
COLUMNS = (Column("TOPIC"), Column("PARTITION"), Column("OFFSET"))


def parse_time(text: str) -> int:
    """``--time`` as an :class:`OffsetSpec` value; ValueError if it is none of them."""
    named = _NAMED_TIMES.get(text.strip().lower())
    if named is not None:
        return named
    try:
        value = int(text)
    except ValueError:
        raise ValueError(
            f"{text!r} is not -1/latest, -2/earliest, -3/max-timestamp or a timestamp in ms"
        ) from None
    if value < OffsetSpec.MAX_TIMESTAMP:
        raise ValueError(f"{value} is not -1, -2, -3 or a timestamp in ms (>= 0)")
    return value


def _time(_ctx: click.Context, _param: click.Parameter, value: str) -> int:
    try:
        return parse_time(value)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None


def _partitions(_ctx: click.Context, _param: click.Parameter, value: str | None) -> set[int] | None:
    if value is None:
        return None
    try:
        found = {int(v) for v in value.split(",") if v.strip()}
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a comma-separated list of partitions") from None
    if not found or min(found) < 0:
        raise click.BadParameter(f"{value!r} names no partition number >= 0")
    return found


def _topic_pattern(
    _ctx: click.Context, _param: click.Parameter, value: str | None
) -> re.Pattern[str] | None:
    if value is None:
        return None
    try:
        return re.compile(value)
    except re.error as e:
        raise click.BadParameter(f"{value!r} is not a regular expression: {e}") from None


@click.command("get-offsets")
@connection_options
@click.option(
    "--topic",
    "topic_pattern",
    default=None,
    callback=_topic_pattern,
    metavar="REGEX",
    help="The topic, or a regular expression over topic names (default: every topic).",
)
@click.option(
    "--partitions",
    callback=_partitions,
    default=None,
    metavar="P[,P...]",
    help="Only these partitions (default: all).",
)
@click.option(
    "--time",
    "spec",
    default="latest",
    show_default=True,
    callback=_time,
    metavar="-1|-2|-3|latest|earliest|max-timestamp|MS",
    help="Which offset: the latest, the earliest, that of the largest timestamp, or the "
    "first at or after a timestamp in milliseconds.",
)
@click.option("--exclude-internal-topics", is_flag=True, help="Leave out internal topics (__...).")
@format_option
def get_offsets(
    conn: Connection,
    topic_pattern: re.Pattern[str] | None,
    partitions: set[int] | None,
    spec: int,
    exclude_internal_topics: bool,
    output_format: str,
) -> None:
    """Print the offsets of partitions as topic:partition:offset (like kafka-get-offsets)."""

    async def work(admin: AdminClient) -> dict[tuple[str, int], int | None]:
        listed = await admin.list_topics(include_internal=not exclude_internal_topics)
        names = [
            t.name
            for t in listed
            if topic_pattern is None or topic_pattern.fullmatch(t.name) is not None
        ]
        described = await admin.describe_topics(names) if names else {}
        wanted = sorted(
            (name, p.partition)
            for name, description in described.items()
            for p in description.partitions
            if partitions is None or p.partition in partitions
        )
        if not wanted:
            raise click.ClickException(
                "Could not match any topic-partitions with the specified filters"
            )
        found = await admin.list_offsets(dict.fromkeys(wanted, spec))
        return {tp: (info.offset if info.offset >= 0 else None) for tp, info in found.items()}

    offsets = run_admin(conn, work)
    rows = [(topic, partition, offset) for (topic, partition), offset in sorted(offsets.items())]
    if output_format == "json":
        print_table(COLUMNS, rows, output_format)
        return
    for topic, partition, offset in rows:
        click.echo(f"{topic}:{partition}:{'' if offset is None else offset}")
