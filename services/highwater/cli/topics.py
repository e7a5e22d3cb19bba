"""``highwater topics``: create, list, describe, alter and delete topics (kafka-topics).

Every subcommand takes ``--bootstrap-server HOST:PORT[,HOST:PORT...]`` (else
``$HIGHWATER_BOOTSTRAP_SERVERS`` or the profile: :mod:`highwater.cli.bootstrap`),
``--controllers HOST:PORT[,...]`` and ``--timeout SECONDS`` and works through
:class:`~highwater.client.admin.AdminClient`: changes and configs go to the Controller
API at the ``--controllers`` addresses, by default the bootstrap ones (brokers forward
admin calls to the active controller; ``highwater server`` serves the Controller API on
its one port), and descriptions come from a broker's ``Metadata``.
``describe`` prints what kafka-topics prints: per topic a header line

    Topic: T<TAB>TopicId: ID<TAB>PartitionCount: n<TAB>ReplicationFactor: r<TAB>Configs: k=v,...

(``Configs`` lists the values that are not defaults) and then one line per partition

    <TAB>Topic: T<TAB>Partition: p<TAB>Leader: l<TAB>Replicas: 1,2,3<TAB>Isr: 1,2

with ``Leader: none`` for a partition without a leader, ``<TAB>Elr: 2<TAB>LastKnownElr: 3``
appended when the partition has eligible leader replicas (KIP-966) or former ones, and
``<TAB>Offline: 3`` when replicas are offline. ``describe --under-replicated-partitions``
(ISR smaller than the replicas), ``--unavailable-partitions`` (no leader, or a leader
that is not a live broker), ``--under-min-isr-partitions`` and ``--at-min-isr-partitions``
(ISR below or at the topic's effective ``min.insync.replicas``) print only the partition
lines they match, as kafka-topics does. ``list`` and ``describe`` take ``--format json``: an array
of topics (``describe``: with their non-default configs and partitions). A failure
(unknown topic, invalid name or config, too high a replication factor, no server
reachable) is one ``Error: ...`` line on stderr and exit code 1.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, TypeVar

import click
import grpc.aio

from highwater.cli.addresses import address_list
from highwater.cli.bootstrap import bootstrap_server_option
from highwater.cli.tables import Column, format_option, print_json, print_table
from highwater.client.admin import (
    AdminClient,
    AdminError,
    ConfigEntry,
    NewTopic,
    PartitionInfo,
    TopicDescription,
    TopicExistsError,
    TopicListing,
    UnknownTopicOrPartitionError,
)
from highwater.errors import HighwaterError

__all__ = [
    "Connection",
    "connection_options",
    "format_description",
    "format_partition",
    "parse_config_pairs",
    "partition_matches",
    "run_admin",
    "topics",
]

T = TypeVar("T")

LIST_COLUMNS: Final = (Column("NAME"), Column("TOPIC-ID"), Column("INTERNAL", "is_internal"))


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
    return bootstrap_server_option()(with_controllers)


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
    lines.extend(format_partition(description.name, p) for p in description.partitions)
    return "\n".join(lines)


def format_partition(topic: str, p: PartitionInfo) -> str:
    """One partition line of kafka-topics ``--describe`` (see the module docstring)."""
    line = (
        f"\tTopic: {topic}\tPartition: {p.partition}\t"
        f"Leader: {p.leader if p.leader is not None else 'none'}\t"
        f"Replicas: {_ids(p.replicas)}\tIsr: {_ids(p.isr)}"
    )
    if p.eligible_leader_replicas or p.last_known_elr:
        line += f"\tElr: {_ids(p.eligible_leader_replicas)}\tLastKnownElr: {_ids(p.last_known_elr)}"
    if p.offline_replicas:
        line += f"\tOffline: {_ids(p.offline_replicas)}"
    return line


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
@format_option
def list_(conn: Connection, exclude_internal: bool, output_format: str) -> None:
    """List topic names, one per line."""

    async def work(admin: AdminClient) -> list[TopicListing]:
        return await admin.list_topics(include_internal=not exclude_internal)

    listed = run_admin(conn, work)
    if output_format == "json":
        print_table(LIST_COLUMNS, [(t.name, t.topic_id, t.is_internal) for t in listed], "json")
        return
    for listing in listed:
        click.echo(listing.name)


#: ``describe``'s partition filters (kafka-topics): the flag, and which partitions it keeps.
PARTITION_FILTERS: Final = ("under-replicated", "unavailable", "under-min-isr", "at-min-isr")


def partition_matches(
    which: str, partition: PartitionInfo, live_brokers: frozenset[int], min_isr: int
) -> bool:
    """Whether ``partition`` is one that ``--<which>-partitions`` reports (Kafka's rules)."""
    if which == "under-replicated":
        return len(partition.isr) < len(partition.replicas)
    if which == "unavailable":
        return partition.leader is None or partition.leader not in live_brokers
    if which == "under-min-isr":
        return len(partition.isr) < min_isr
    return len(partition.isr) == min_isr  # at-min-isr


def _min_isr(configs: Mapping[str, ConfigEntry]) -> int:
    entry = configs.get("min.insync.replicas")
    try:
        return int(entry.value) if entry is not None and entry.value is not None else 1
    except ValueError:
        return 1


def _description_json(
    description: TopicDescription,
    configs: Mapping[str, ConfigEntry],
    partitions: Iterable[PartitionInfo],
) -> dict[str, object]:
    return {
        "name": description.name,
        "topic_id": description.topic_id,
        "is_internal": description.is_internal,
        "partition_count": len(description.partitions),
        "replication_factor": description.replication_factor,
        "configs": {
            name: entry.value for name, entry in sorted(configs.items()) if not entry.is_default
        },
        "partitions": [
            {
                "partition": p.partition,
                "leader": p.leader,
                "leader_epoch": p.leader_epoch,
                "replicas": list(p.replicas),
                "isr": list(p.isr),
                "offline_replicas": list(p.offline_replicas),
                "eligible_leader_replicas": list(p.eligible_leader_replicas),
                "last_known_elr": list(p.last_known_elr),
            }
            for p in partitions
        ],
    }


@topics.command("describe")
@connection_options
@click.option("--topic", default=None, help="The topic to describe (default: every topic).")
@click.option("--exclude-internal", is_flag=True, help="Leave out internal topics (__...).")
@click.option(
    "--under-replicated-partitions",
    "under_replicated",
    is_flag=True,
    help="Only partitions whose ISR is smaller than their replicas.",
)
@click.option(
    "--unavailable-partitions",
    "unavailable",
    is_flag=True,
    help="Only partitions without a leader, or whose leader is not a live broker.",
)
@click.option(
    "--under-min-isr-partitions",
    "under_min_isr",
    is_flag=True,
    help="Only partitions whose ISR is smaller than the topic's min.insync.replicas.",
)
@click.option(
    "--at-min-isr-partitions",
    "at_min_isr",
    is_flag=True,
    help="Only partitions whose ISR is exactly the topic's min.insync.replicas.",
)
@click.option(
    "--if-exists",
    is_flag=True,
    help="With --topic: print nothing and succeed if there is no such topic.",
)
@format_option
def describe(
    conn: Connection,
    topic: str | None,
    exclude_internal: bool,
    under_replicated: bool,
    unavailable: bool,
    under_min_isr: bool,
    at_min_isr: bool,
    if_exists: bool,
    output_format: str,
) -> None:
    """Describe partitions (leader, replicas, ISR) and config overrides of topics; with a
    partition filter, only the partitions it reports (and no topic lines).

    ``--if-exists`` makes a missing ``--topic`` nothing to describe, as kafka-topics'
    ``--describe --if-exists`` does (with ``--format json``: an empty array)."""
    chosen = [
        name
        for name, given in zip(
            PARTITION_FILTERS,
            (under_replicated, unavailable, under_min_isr, at_min_isr),
            strict=True,
        )
        if given
    ]
    if len(chosen) > 1:
        raise click.UsageError(
            " and ".join(f"--{name}-partitions" for name in chosen) + " exclude each other"
        )
    partition_filter = chosen[0] if chosen else None

    async def work(admin: AdminClient) -> list[tuple[TopicDescription, dict[str, ConfigEntry]]]:
        if topic is None:
            listed = await admin.list_topics(include_internal=not exclude_internal)
            names = [t.name for t in listed]
        else:
            names = [topic]
        if not names:
            return []
        try:
            descriptions = await admin.describe_topics(names)
        except UnknownTopicOrPartitionError:
            if if_exists and topic is not None:
                return []
            raise
        found = []
        for name, description in descriptions.items():
            try:
                configs = await admin.describe_configs(name)
            except UnknownTopicOrPartitionError:
                if topic is not None and not if_exists:
                    raise
                continue  # deleted between the listing (or the description) and now
            found.append((description, configs))
        return found

    async def live(admin: AdminClient) -> frozenset[int]:
        return frozenset(node.node_id for node in (await admin.describe_cluster()).nodes)

    described = run_admin(conn, work, topic=topic)
    live_brokers = run_admin(conn, live) if partition_filter == "unavailable" else frozenset()
    documents: list[dict[str, object]] = []
    for description, configs in described:
        partitions = description.partitions
        if partition_filter is not None:
            min_isr = _min_isr(configs)
            partitions = tuple(
                p
                for p in partitions
                if partition_matches(partition_filter, p, live_brokers, min_isr)
            )
            if not partitions:
                continue
        if output_format == "json":
            documents.append(_description_json(description, configs, partitions))
        elif partition_filter is None:
            click.echo(format_description(description, configs))
        else:
            for p in partitions:
                click.echo(format_partition(description.name, p))
    if output_format == "json":
        print_json(documents)


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
@click.option("--if-exists", is_flag=True, help="Succeed quietly if there is no such topic.")
def alter(
    conn: Connection,
    topic: str,
    partitions: int | None,
    config_pairs: tuple[str, ...],
    delete_keys: tuple[str, ...],
    if_exists: bool,
) -> None:
    """Add partitions to a topic, or set and delete its config overrides.

    The changes are two requests (IncrementalAlterConfigs, CreatePartitions), so both are
    first sent with ``validate_only``: a command that would be refused in part changes
    nothing. (kafka-topics refuses ``--config`` with ``--alter`` altogether and leaves
    configs to kafka-configs; here both go in one command, all or nothing.) With
    ``--if-exists`` a missing topic is not an error and nothing is done, as kafka-topics'
    ``--alter --if-exists``."""
    if partitions is None and not config_pairs and not delete_keys:
        raise click.UsageError("give --partitions, --config or --delete-config")
    from highwater.metadata.consumer_offsets import CONSUMER_OFFSETS_TOPIC  # not at --help

    if partitions is not None and topic == CONSUMER_OFFSETS_TOPIC:
        # As Kafka's kafka-topics refuses it: a group's partition is the hash of its id
        # modulo the partition count, so more partitions move groups away from their state.
        raise click.ClickException(
            f"The number of partitions of {CONSUMER_OFFSETS_TOPIC} cannot be changed: each "
            "group's offsets and metadata live in the partition its id hashes to, and with "
            "more partitions most groups would be looked for in another one"
        )
    changes: dict[str, str | None] = dict(parse_config_pairs(config_pairs))
    for key in delete_keys:
        if key in changes:
            raise click.UsageError(f"{key} is both set (--config) and deleted (--delete-config)")
        changes[key] = None

    async def change(admin: AdminClient, *, validate_only: bool) -> None:
        if changes:
            await admin.alter_configs(topic, changes, validate_only=validate_only)
        if partitions is not None:
            results = await admin.create_partitions(
                {topic: partitions}, validate_only=validate_only
            )
            results[topic].raise_for_error()

    async def work(admin: AdminClient) -> list[str]:
        try:
            await change(admin, validate_only=True)
        except UnknownTopicOrPartitionError:
            if if_exists:
                return []
            raise
        done: list[str] = []
        if changes:
            await admin.alter_configs(topic, changes)
            done.append(f"Updated config of topic {topic}.")
        if partitions is not None:
            result = (await admin.create_partitions({topic: partitions}))[topic]
            if result.error is not None and done:
                # Valid a moment ago: the topic changed in between (another client).
                raise click.ClickException(
                    f"{done[0]} The partition count was not changed: "
                    f"{_one_line(result.error.message or result.error.code_name)}"
                )
            result.raise_for_error()
            done.append(f"Increased the partition count of topic {topic} to {partitions}.")
        return done

    for line in run_admin(conn, work, topic=topic):
        click.echo(line)
