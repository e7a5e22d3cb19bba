"""``highwater describe-log-dirs``: the brokers' log directories, as ``kafka-log-dirs --describe``.

Asks every broker (or those of ``--broker-list``) for its log directories (DescribeLogDirs)
and prints, after two progress lines, one JSON document in Kafka's shape, with the
directory's id and disk usage added::

    Querying brokers for log directories information
    Received log directory information from brokers 0,1
    {"version":1,"brokers":[{"broker":0,"logDirs":[{"logDir":"/data/a","error":null,
      "directoryId":"...","totalBytes":...,"usableBytes":...,
      "partitions":[{"partition":"orders-0","size":1234,"offsetLag":0,"isFuture":false}]}]}]}

A failed directory's ``error`` is ``KAFKA_STORAGE_ERROR`` and it lists no partitions.
``--topic-list`` keeps only those topics' partitions.
"""

from __future__ import annotations

import json

import click

from highwater.cli.topics import Connection, connection_options, run_admin
from highwater.client.admin import AdminClient, LogDirDescription

__all__ = ["describe_log_dirs", "log_dirs_json"]


def _id_list(_ctx: click.Context, _param: click.Parameter, value: str | None) -> list[int] | None:
    if value is None:
        return None
    try:
        ids = [int(item) for item in value.split(",") if item.strip()]
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a comma-separated list of broker ids") from None
    if not ids:
        raise click.BadParameter("no broker id given")
    return ids


def _name_list(_ctx: click.Context, _param: click.Parameter, value: str | None) -> list[str] | None:
    if value is None:
        return None
    names = [item.strip() for item in value.split(",") if item.strip()]
    if not names:
        raise click.BadParameter("no topic given")
    return names


def log_dirs_json(described: dict[int, dict[str, LogDirDescription]]) -> dict[str, object]:
    """The document ``kafka-log-dirs.sh --describe`` prints (version 1), by broker id."""
    brokers = []
    for broker_id, dirs in sorted(described.items()):
        log_dirs = []
        for path, info in sorted(dirs.items()):
            log_dirs.append(
                {
                    "logDir": path,
                    "error": None if info.error is None else info.error.code_name,
                    "directoryId": info.directory_id,
                    "totalBytes": info.total_bytes,
                    "usableBytes": info.usable_bytes,
                    "partitions": [
                        {
                            "partition": f"{topic}-{partition}",
                            "size": replica.size,
                            "offsetLag": replica.offset_lag,
                            "isFuture": replica.is_future,
                        }
                        for (topic, partition), replica in sorted(info.replica_infos.items())
                    ],
                }
            )
        brokers.append({"broker": broker_id, "logDirs": log_dirs})
    return {"version": 1, "brokers": brokers}


@click.command("describe-log-dirs")
@connection_options
@click.option(
    "--describe",
    is_flag=True,
    help="Describe the log directories (the only action; accepted as kafka-log-dirs takes it).",
)
@click.option(
    "--broker-list",
    default=None,
    callback=_id_list,
    metavar="ID[,ID...]",
    help="The brokers to ask (default: every broker).",
)
@click.option(
    "--topic-list",
    default=None,
    callback=_name_list,
    metavar="TOPIC[,TOPIC...]",
    help="List only these topics' partitions (default: every topic).",
)
def describe_log_dirs(
    conn: Connection,
    describe: bool,
    broker_list: list[int] | None,
    topic_list: list[str] | None,
) -> None:
    """Print each broker's log directories as JSON: health, disk usage and partition sizes
    (kafka-log-dirs --describe)."""
    click.echo("Querying brokers for log directories information")

    async def work(admin: AdminClient) -> dict[int, dict[str, LogDirDescription]]:
        return await admin.describe_log_dirs(broker_list, topics=topic_list)

    described = run_admin(conn, work)
    click.echo(
        "Received log directory information from brokers "
        + ",".join(str(b) for b in sorted(described))
    )
    click.echo(json.dumps(log_dirs_json(described), separators=(",", ":")))
