"""``highwater topics``: create, list, describe, alter and delete topics (kafka-topics).

Every subcommand takes ``--bootstrap-server HOST:PORT[,HOST:PORT...]`` (required),
``--controllers HOST:PORT[,...]`` and ``--timeout SECONDS`` and works through
:class:`~highwater.client.admin.AdminClient`: changes and configs go to the Controller
API at the ``--controllers`` addresses, by default the bootstrap ones (brokers forward
admin calls to the active controller; ``highwater server`` serves the Controller API on
its one port), and descriptions come from a broker's ``Metadata``.
``describe`` prints what kafka-topics prints: per topic a header line

    Topic: T<TAB>TopicId: ID<TAB>PartitionCount: n<TAB>ReplicationFactor: r<TAB>Configs: k=v,...

(``Configs`` lists the values that are not defaults) and then one line per partition

    <TAB>Topic: T<TAB>Partition: p<TAB>Leader: l<TAB>Replicas: 1,2,3<TAB>Isr: 1,2

with ``Leader: none`` for a partition without a leader and ``<TAB>Offline: 3`` appended
when replicas are offline. A failure (unknown topic, invalid name or config, too high a
replication factor, no server reachable) is one ``Error: ...`` line on stderr and exit
code 1.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import click
import grpc.aio

from highwater.cli.addresses import address_list
from highwater.client.admin import (
    AdminClient,
    AdminError,
    ConfigEntry,
    NewTopic,
    TopicDescription,
    TopicExistsError,
    UnknownTopicOrPartitionError,
)
from highwater.errors import HighwaterError

__all__ = [
    "Connection",
    "connection_options",
    "format_description",
    "parse_config_pairs",
    "run_admin",
    "topics",
]

T = TypeVar("T")


# --- Option parsing --------------------------------------------------------------------


def parse_config_pairs(pairs: Iterable[str]) -> dict[str, str]:
    """``["k=v", ...]`` as a dict (a value may itself hold ``=``); BadParameter if malformed."""
    configs: dict[str, str] = {}
    for pair in pairs:
        key, equals, value = pair.partition("=")
        if not equals or not key.strip():
            raise click.BadParameter(f"{pair!r} is not KEY=VALUE", param_hint="'--config'")
        configs[key.strip()] = value
    return configs


def _parse_controllers(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    return None if value is None else address_list(ctx, param, value)


@dataclass(frozen=True, slots=True)
class Connection:
    """Where a command's admin client connects, and how long it waits."""

    bootstrap_server: str
    controllers: str | None
    timeout: float

    def client(self) -> AdminClient:
        """A new admin client for these addresses."""
        return AdminClient(
            self.bootstrap_server, controllers=self.controllers, request_timeout_s=self.timeout
        )


def connection_options(command: Callable[..., None]) -> Callable[..., None]:
    """Add ``--bootstrap-server``, ``--controllers`` and ``--timeout``, passed as ``conn``."""

    @functools.wraps(command)
    def wrapper(
        bootstrap_server: str, controllers: str | None, timeout: float, **kwargs: Any
    ) -> None:
        command(conn=Connection(bootstrap_server, controllers, timeout), **kwargs)

    with_timeout = click.option(
        "--timeout",
        type=click.FloatRange(min=0.1),
        default=30.0,
        show_default=True,
        help="Seconds to wait for the cluster to answer, retries included.",
    )(wrapper)
    with_controllers = click.option(
        "--controllers",
        "controllers",
        default=None,
        callback=_parse_controllers,
        metavar="HOST:PORT[,HOST:PORT...]",
        help="Controllers for changes and configs (default: --bootstrap-server, whose "
        "brokers forward them to the active controller).",
    )(with_timeout)
    return click.option(
        "--bootstrap-server",
        "bootstrap_server",
        required=True,
        callback=address_list,
        metavar="HOST:PORT[,HOST:PORT...]",
        help="Brokers to connect to (in `highwater server`, its one port).",
    )(with_controllers)


def _one_line(text: str) -> str:
    return " ".join(text.split())


def run_admin(
    conn: Connection,
    work: Callable[[AdminClient], Awaitable[T]],
    *,
    topic: str | None = None,
) -> T:
    """Run ``work`` with an admin client; any failure becomes a one-line ClickException.

    ``topic`` is the topic the command names: an unknown topic is then reported the same
    way whichever call found out.
    """

    async def main() -> T:
        async with conn.client() as admin:
            return await work(admin)

    try:
        return asyncio.run(main())
    except UnknownTopicOrPartitionError as e:
        message = f"Topic '{topic}' does not exist." if topic is not None else e.message
        raise click.ClickException(_one_line(message)) from None
    except AdminError as e:
        raise click.ClickException(_one_line(e.message or e.code_name)) from None
    except HighwaterError as e:
        raise click.ClickException(_one_line(str(e) or e.code_name)) from None
    except grpc.aio.AioRpcError as e:
        raise click.ClickException(_one_line(f"{e.code().name}: {e.details()}")) from None


# --- Output ----------------------------------------------------------------------------


def _ids(values: Iterable[int]) -> str:
    return ",".join(str(v) for v in values)


def format_description(description: TopicDescription, configs: Mapping[str, ConfigEntry]) -> str:
    """A topic as kafka-topics ``--describe`` prints it (see the module docstring)."""
    shown = ",".join(
        f"{name}={entry.value if entry.value is not None else ''}"
        for name, entry in sorted(configs.items())
        if not entry.is_default
    )
    lines = [
        f"Topic: {description.name}\tTopicId: {description.topic_id}\t"
        f"PartitionCount: {len(description.partitions)}\t"
        f"ReplicationFactor: {description.replication_factor}\tConfigs: {shown}"
    ]
    for p in description.partitions:
        line = (
            f"\tTopic: {description.name}\tPartition: {p.partition}\t"
            f"Leader: {p.leader if p.leader is not None else 'none'}\t"
            f"Replicas: {_ids(p.replicas)}\tIsr: {_ids(p.isr)}"
        )
        if p.offline_replicas:
            line += f"\tOffline: {_ids(p.offline_replicas)}"
        lines.append(line)
    return "\n".join(lines)


# --- Commands --------------------------------------------------------------------------


@click.group("topics")
def topics() -> None:
    """Create, list, describe, alter and delete topics (like kafka-topics)."""


@topics.command("create")
@connection_options
@click.option("--topic", required=True, help="The topic to create.")
@click.option(
    "--partitions",
    type=click.IntRange(min=1),
    default=None,
    help="Number of partitions (default: the cluster's num.partitions).",
)
@click.option(
    "--replication-factor",
    type=click.IntRange(min=1),
    default=None,
    help="Replicas of each partition (default: the cluster's default.replication.factor).",
)
@click.option(
    "--config",
    "config_pairs",
    multiple=True,
    metavar="KEY=VALUE",
    help="A topic config override (repeatable), e.g. --config retention.ms=86400000.",
)
@click.option("--if-not-exists", is_flag=True, help="Succeed quietly if the topic exists.")
def create(
    conn: Connection,
    topic: str,
    partitions: int | None,
    replication_factor: int | None,
    config_pairs: tuple[str, ...],
    if_not_exists: bool,
) -> None:
    """Create a topic."""
    configs = parse_config_pairs(config_pairs)
    new_topic = NewTopic(
        topic,
        num_partitions=-1 if partitions is None else partitions,
        replication_factor=-1 if replication_factor is None else replication_factor,
        config=configs,
    )

    async def work(admin: AdminClient) -> bool:
        results = await admin.create_topics([new_topic])
        result = results[topic]
        if isinstance(result.error, TopicExistsError) and if_not_exists:
            return False
        result.raise_for_error()
        return True

    if run_admin(conn, work):
        click.echo(f"Created topic {topic}.")


@topics.command("list")
@connection_options
@click.option("--exclude-internal", is_flag=True, help="Leave out internal topics (__...).")
def list_(conn: Connection, exclude_internal: bool) -> None:
    """List topic names, one per line."""

    async def work(admin: AdminClient) -> list[str]:
        listed = await admin.list_topics(include_internal=not exclude_internal)
        return [t.name for t in listed]

    for name in run_admin(conn, work):
        click.echo(name)


@topics.command("describe")
@connection_options
@click.option("--topic", default=None, help="The topic to describe (default: every topic).")
@click.option("--exclude-internal", is_flag=True, help="Leave out internal topics (__...).")
def describe(conn: Connection, topic: str | None, exclude_internal: bool) -> None:
    """Describe partitions (leader, replicas, ISR) and config overrides of topics."""

    async def work(admin: AdminClient) -> list[str]:
        if topic is None:
            listed = await admin.list_topics(include_internal=not exclude_internal)
            names = [t.name for t in listed]
        else:
            names = [topic]
        if not names:
            return []
        descriptions = await admin.describe_topics(names)
        blocks = []
        for name, description in descriptions.items():
            try:
                configs = await admin.describe_configs(name)
            except UnknownTopicOrPartitionError:
                if topic is not None:
                    raise
                continue  # deleted between the listing and now
            blocks.append(format_description(description, configs))
        return blocks

    for block in run_admin(conn, work, topic=topic):
        click.echo(block)


@topics.command("delete")
@connection_options
@click.option("--topic", required=True, help="The topic to delete.")
@click.option("--if-exists", is_flag=True, help="Succeed quietly if there is no such topic.")
def delete(conn: Connection, topic: str, if_exists: bool) -> None:
    """Delete a topic and all its data."""

    async def work(admin: AdminClient) -> bool:
        result = (await admin.delete_topics([topic]))[topic]
        if isinstance(result.error, UnknownTopicOrPartitionError) and if_exists:
            return False
        result.raise_for_error()
        return True

    if run_admin(conn, work, topic=topic):
        click.echo(f"Deleted topic {topic}.")


@topics.command("alter")
@connection_options
@click.option("--topic", required=True, help="The topic to alter.")
@click.option(
    "--partitions",
    type=click.IntRange(min=1),
    default=None,
    help="The new total number of partitions (it can only grow).",
)
@click.option(
    "--config",
    "config_pairs",
    multiple=True,
    metavar="KEY=VALUE",
    help="Set a config override (repeatable).",
)
@click.option(
    "--delete-config",
    "delete_keys",
    multiple=True,
    metavar="KEY",
    help="Remove a config override, back to the default (repeatable).",
)
def alter(
    conn: Connection,
    topic: str,
    partitions: int | None,
    config_pairs: tuple[str, ...],
    delete_keys: tuple[str, ...],
) -> None:
    """Add partitions to a topic, or set and delete its config overrides."""
    if partitions is None and not config_pairs and not delete_keys:
        raise click.UsageError("give --partitions, --config or --delete-config")
    changes: dict[str, str | None] = dict(parse_config_pairs(config_pairs))
    for key in delete_keys:
        if key in changes:
            raise click.UsageError(f"{key} is both set (--config) and deleted (--delete-config)")
        changes[key] = None

    async def work(admin: AdminClient) -> list[str]:
        done: list[str] = []
        if changes:
            # Configs first: they are checked as a whole, so a bad one changes nothing.
            await admin.alter_configs(topic, changes)
            done.append(f"Updated config of topic {topic}.")
        if partitions is not None:
            result = (await admin.create_partitions({topic: partitions}))[topic]
            result.raise_for_error()
            done.append(f"Increased the partition count of topic {topic} to {partitions}.")
        return done

    for line in run_admin(conn, work, topic=topic):
        click.echo(line)
