"""``highwater configs``: describe and alter dynamic configs of topics and brokers (kafka-configs).

Shaped like ``kafka-configs.sh``::

    highwater configs --bootstrap-server B --entity-type topics --entity-name T --describe [--all]
    highwater configs --bootstrap-server B --entity-type brokers --entity-default \\
        --alter --add-config num.partitions=3,min.insync.replicas=2 --delete-config k

``--entity-type brokers`` with ``--entity-default`` is the cluster-wide default broker
resource: the cluster defaults (``num.partitions``, ``default.replication.factor``,
``min.insync.replicas``, ``log.retention.hours``...), which beat the controllers' config
files. ``--entity-name`` names a topic or a broker id. ``--describe`` prints the dynamic
configs; with ``--all`` every config, with the source of its value (Kafka's
``DYNAMIC_TOPIC_CONFIG``, ``DYNAMIC_BROKER_CONFIG``, ``DYNAMIC_DEFAULT_BROKER_CONFIG``,
``STATIC_BROKER_CONFIG``, ``DEFAULT_CONFIG``). ``--add-config`` takes ``k=v`` pairs
separated by commas, a list value in brackets (``cleanup.policy=[compact,delete]``).
``clients`` and ``users`` are Kafka's quota entities, described and altered as
``highwater quotas`` does (:mod:`highwater.cli.quotas`): ``--entity-type users
--entity-name alice --entity-type clients --entity-name app`` names a user and client id,
Kafka's ``--user``/``--client``/``--user-defaults``/``--client-defaults`` work too.
"""

from __future__ import annotations

import click

from highwater.cli.quotas import (
    QUOTA_ENTITY_TYPES,
    parse_quota_changes,
    quota_entity_options,
    run_quota_command,
    select_entities,
)
from highwater.cli.tables import Column, format_option, print_table
from highwater.cli.topics import Connection, connection_options, run_admin
from highwater.client.admin import AdminClient, ConfigEntry
from highwater.controller_api.messages import ConfigSource
from highwater.metadata.records import ConfigResourceType

__all__ = ["configs", "parse_add_config"]

CONFIG_COLUMNS = (
    Column("NAME"),
    Column("VALUE"),
    Column("SOURCE"),
    Column("SENSITIVE"),
    Column("READ-ONLY"),
)
_ENTITY_TYPES = ("topics", "brokers", "clients", "users")
_DYNAMIC_SOURCES = frozenset(
    {
        ConfigSource.DYNAMIC_TOPIC_CONFIG,
        ConfigSource.DYNAMIC_BROKER_CONFIG,
        ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG,
    }
)


def parse_add_config(text: str) -> dict[str, str]:
    """``k=v,k2=[a,b]`` as a dict (kafka-configs' ``--add-config``); BadParameter if
    malformed."""
    pairs: dict[str, str] = {}
    index = 0
    while index < len(text):
        equals = text.find("=", index)
        if equals < 0:
            raise click.BadParameter(
                f"{text[index:]!r} is not KEY=VALUE", param_hint="--add-config"
            )
        key = text[index:equals].strip()
        if not key:
            raise click.BadParameter(f"an empty key in {text!r}", param_hint="--add-config")
        if text.startswith("[", equals + 1):
            close = text.find("]", equals + 1)
            if close < 0:
                raise click.BadParameter(f"an unclosed '[' in {text!r}", param_hint="--add-config")
            value, index = text[equals + 2 : close], close + 1
            if index < len(text) and text[index] != ",":
                raise click.BadParameter(
                    f"',' expected after ']' in {text!r}", param_hint="--add-config"
                )
            index += 1
        else:
            comma = text.find(",", equals + 1)
            end = len(text) if comma < 0 else comma
            value, index = text[equals + 1 : end], end + 1
        pairs[key] = value.strip()
    return pairs


def _resource(entity_type: str, name: str | None, default: bool) -> tuple[ConfigResourceType, str]:
    if entity_type == "topics":
        if default:
            raise click.UsageError(
                "topics have no --entity-default: their defaults are the "
                "brokers' (--entity-type brokers --entity-default)"
            )
        if name is None:
            raise click.UsageError("--entity-type topics needs --entity-name")
        return ConfigResourceType.TOPIC, name
    if default == (name is not None):
        raise click.UsageError("--entity-type brokers needs --entity-name ID or --entity-default")
    if name is not None and not name.isdigit():
        raise click.UsageError(f"--entity-name of a broker is its id, not {name!r}")
    return ConfigResourceType.BROKER, name or ""


def _dynamic_source(resource_type: ConfigResourceType, name: str) -> ConfigSource:
    """The source of the overrides set on this very entity: what ``--delete-config`` can
    remove (a broker's value from the cluster default is the default resource's)."""
    if resource_type == ConfigResourceType.TOPIC:
        return ConfigSource.DYNAMIC_TOPIC_CONFIG
    return (
        ConfigSource.DYNAMIC_BROKER_CONFIG if name else ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG
    )


async def _require_broker(admin: AdminClient, name: str) -> None:
    """Refuse a broker id that is not a live broker of the cluster: the controller would
    describe any id with the cluster's defaults, as if it were one. (Kafka's admin client
    sends a broker's DescribeConfigs to that broker, and fails for an unknown one.)"""
    live = {node.node_id for node in (await admin.describe_cluster()).nodes}
    if int(name) not in live:
        shown = ", ".join(str(n) for n in sorted(live)) or "none"
        raise click.ClickException(
            f"broker {name} is not in the cluster (its live brokers: {shown})"
        )


def _what(resource_type: ConfigResourceType, name: str) -> str:
    if resource_type == ConfigResourceType.TOPIC:
        return f"topic {name}"
    return f"broker {name}" if name else "the default broker resource (the whole cluster)"


def format_entry(entry: ConfigEntry) -> str:
    """One config as kafka-configs prints it, with the source of its value."""
    value = "" if entry.value is None else entry.value
    shown = "null" if entry.value is None else value
    return (
        f"  {entry.name}={shown} sensitive={str(entry.sensitive).lower()} "
        f"synonyms={{{entry.source.name}:{entry.name}={value}}}"
    )


@click.command("configs")
@connection_options
@click.option(
    "--entity-type",
    "entity_types",
    type=click.Choice(_ENTITY_TYPES),
    multiple=True,
    help="What to configure: topics, brokers, or the quota entities users and clients "
    "(both for a user and client id).",
)
@click.option(
    "--entity-name",
    "entity_names",
    multiple=True,
    help="The topic name, the broker id, the user or the client id (one per --entity-type).",
)
@click.option(
    "--entity-default",
    count=True,
    help="The cluster-wide default broker resource (with --entity-type brokers), or the "
    "default user or client id.",
)
@quota_entity_options
@click.option("--describe", "describe", is_flag=True, help="Print the configs.")
@click.option("--alter", "alter", is_flag=True, help="Change the configs.")
@click.option(
    "--all", "show_all", is_flag=True, help="With --describe: every config, defaults included."
)
@click.option(
    "--add-config",
    "add_config",
    multiple=True,
    metavar="K=V[,K2=V2...]",
    help="With --alter: set these (a list value in brackets: k=[a,b]).",
)
@click.option(
    "--delete-config",
    "delete_config",
    multiple=True,
    metavar="K[,K2...]",
    help="With --alter: remove these, back to their defaults.",
)
@format_option
def configs(
    conn: Connection,
    entity_types: tuple[str, ...],
    entity_names: tuple[str, ...],
    entity_default: int,
    user: str | None,
    user_defaults: bool,
    client: str | None,
    client_defaults: bool,
    describe: bool,
    alter: bool,
    show_all: bool,
    add_config: tuple[str, ...],
    delete_config: tuple[str, ...],
    output_format: str,
) -> None:
    """Describe or alter the dynamic configs of a topic, a broker or the cluster default,
    or the quotas of a user and/or client id."""
    if describe == alter:
        raise click.UsageError("give exactly one of --describe and --alter")
    quota_options = (user, client) != (None, None) or user_defaults or client_defaults
    if quota_options or (entity_types and set(entity_types) <= set(QUOTA_ENTITY_TYPES)):
        if show_all:
            raise click.UsageError("--all describes topics and brokers, not quotas")
        selection = select_entities(
            entity_types,
            entity_names,
            entity_default,
            user=user,
            user_defaults=user_defaults,
            client=client,
            client_defaults=client_defaults,
        )
        quota_changes = parse_quota_changes(add_config, delete_config)
        run_quota_command(conn, selection, describe=describe, changes=quota_changes)
        return
    if len(entity_types) != 1:
        raise click.UsageError("give one --entity-type (users and clients may be given together)")
    if len(entity_names) > 1 or entity_default > 1:
        raise click.UsageError("give one --entity-name or --entity-default")
    entity_type = entity_types[0]
    entity_name = entity_names[0] if entity_names else None
    resource_type, name = _resource(entity_type, entity_name, bool(entity_default))
    topic = name if resource_type == ConfigResourceType.TOPIC else None
    if describe:
        if add_config or delete_config:
            raise click.UsageError("--add-config and --delete-config go with --alter")

        async def described(admin: AdminClient) -> dict[str, ConfigEntry]:
            if resource_type == ConfigResourceType.BROKER and name:
                await _require_broker(admin, name)
            return await admin.describe_configs(name, resource_type=resource_type)

        entries = run_admin(conn, described, topic=topic)
        shown = [
            entry
            for _, entry in sorted(entries.items())
            if show_all or entry.source in _DYNAMIC_SOURCES
        ]
        if output_format == "json":
            rows = [(e.name, e.value, e.source.name, e.sensitive, e.read_only) for e in shown]
            print_table(CONFIG_COLUMNS, rows, "json")
            return
        kind = "All" if show_all else "Dynamic"
        click.echo(f"{kind} configs for {_what(resource_type, name)} are:")
        for entry in shown:
            click.echo(format_entry(entry))
        return
    if show_all:
        raise click.UsageError("--all goes with --describe")
    changes: dict[str, str | None] = {}
    for text in add_config:
        changes.update(parse_add_config(text))
    for text in delete_config:
        for key in (k.strip() for k in text.split(",")):
            if not key:
                continue
            if key in changes:
                raise click.UsageError(f"{key} is both added and deleted")
            changes[key] = None
    if not changes:
        raise click.UsageError("--alter needs --add-config or --delete-config")

    deleted = [key for key, value in changes.items() if value is None]

    async def altered(admin: AdminClient) -> None:
        if deleted:
            # As kafka-configs: a key to delete must be an override of this entity now,
            # else the command fails naming the keys and changes nothing.
            current = await admin.describe_configs(name, resource_type=resource_type)
            source = _dynamic_source(resource_type, name)
            missing = [
                key for key in deleted if key not in current or current[key].source != source
            ]
            if missing:
                raise click.ClickException(
                    f"Invalid config(s): {','.join(missing)}: not an override of "
                    f"{_what(resource_type, name)}"
                )
        await admin.alter_configs(name, changes, resource_type=resource_type)

    run_admin(conn, altered, topic=topic)
    click.echo(f"Completed updating config for {_what(resource_type, name)}.")
