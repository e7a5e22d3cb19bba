"""``highwater delete-records``: drop partitions' records below offsets (kafka-delete-records).

Shaped like ``kafka-delete-records.sh``::

    highwater delete-records --bootstrap-server B --offset-json-file F

``F`` is Kafka's JSON: ``{"partitions": [{"topic": "t", "partition": 0, "offset": 10}],
"version": 1}``; an offset of ``-1`` means the partition's high watermark (everything
readable goes). Each partition's leader moves its log start offset (low watermark) up to
the offset and drops the segments wholly below it (the DeleteRecords call). It prints, as
Kafka's tool does::

    Executing records delete operation
    Records delete operation completed:
    partition: t-0	low_watermark: 10
    partition: t-1	error: <reason>

A malformed file is an error before anything is deleted; a partition that fails (unknown,
an offset above its high watermark) makes the exit code 1, the others are still done.
With ``--format json``: ``[{"topic", "partition", "low_watermark", "error"}]``.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import click

from highwater.cli.tables import Column, format_option, print_table
from highwater.cli.topics import Connection, connection_options, run_admin
from highwater.client.admin import AdminClient
from highwater.errors import HighwaterError

__all__ = ["delete_records", "parse_offset_json"]

TopicPartition = tuple[str, int]
COLUMNS = (Column("TOPIC"), Column("PARTITION"), Column("LOW-WATERMARK"), Column("ERROR"))


def parse_offset_json(text: str) -> dict[TopicPartition, int]:
    """Kafka's delete-records JSON as ``{(topic, partition): offset}``; ValueError naming
    what is wrong (a partition listed twice included)."""
    try:
        document = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"not JSON: {e}") from None
    if not isinstance(document, dict) or not isinstance(document.get("partitions"), list):
        raise ValueError(
            'expected {"partitions": [{"topic": ..., "partition": ..., "offset": ...}], '
            '"version": 1}'
        )
    version = document.get("version", 1)
    if version != 1:
        raise ValueError(f"version {version!r} is not supported (only 1)")
    offsets: dict[TopicPartition, int] = {}
    for index, entry in enumerate(document["partitions"]):
        if not isinstance(entry, dict):
            raise ValueError(f"partitions[{index}] is not an object")
        topic, partition, offset = entry.get("topic"), entry.get("partition"), entry.get("offset")
        if not isinstance(topic, str) or not topic:
            raise ValueError(f"partitions[{index}] has no topic name")
        if not isinstance(partition, int) or isinstance(partition, bool) or partition < 0:
            raise ValueError(f"partitions[{index}] has no partition number >= 0")
        if not isinstance(offset, int) or isinstance(offset, bool) or offset < -1:
            raise ValueError(f"partitions[{index}] has no offset (>= 0, or -1: the high watermark)")
        if (topic, partition) in offsets:
            raise ValueError(f"{topic}-{partition} is listed twice")
        offsets[(topic, partition)] = offset
    if not offsets:
        raise ValueError("the file lists no partitions")
    return offsets


@click.command("delete-records")
@connection_options
@click.option(
    "--offset-json-file",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    help='The partitions and offsets: {"partitions": [{"topic": "t", "partition": 0, '
    '"offset": 10}], "version": 1}.',
)
@format_option
def delete_records(conn: Connection, offset_json_file: Path, output_format: str) -> None:
    """Delete records below the given offsets (like kafka-delete-records)."""
    try:
        offsets = parse_offset_json(offset_json_file.read_text())
    except OSError as e:
        raise click.ClickException(f"{offset_json_file}: {e.strerror or e}") from None
    except ValueError as e:
        raise click.ClickException(f"{offset_json_file}: {e}") from None

    async def one(admin: AdminClient, tp: TopicPartition) -> int | str:
        try:
            return (await admin.delete_records({tp: offsets[tp]}))[tp]
        except HighwaterError as e:
            return " ".join((str(e) or e.code_name).split())

    async def work(admin: AdminClient) -> dict[TopicPartition, int | str]:
        found = await asyncio.gather(*(one(admin, tp) for tp in offsets))
        return dict(zip(offsets, found, strict=True))

    if output_format == "text":
        click.echo("Executing records delete operation")
    results = run_admin(conn, work)
    rows = [
        (t, p, None if isinstance(r, str) else r, r if isinstance(r, str) else None)
        for (t, p), r in sorted(results.items())
    ]
    if output_format == "json":
        print_table(COLUMNS, rows, output_format)
    else:
        click.echo("Records delete operation completed:")
        for topic, partition, low_watermark, error in rows:
            outcome = f"error: {error}" if error is not None else f"low_watermark: {low_watermark}"
            click.echo(f"partition: {topic}-{partition}\t{outcome}")
    if any(error is not None for *_, error in rows):
        raise SystemExit(1)
