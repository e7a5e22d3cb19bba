"""``highwater quotas alter|describe``: client quotas per user and/or client id (kafka-configs).

Shaped like ``kafka-configs.sh`` with ``--entity-type users|clients``::

    highwater quotas alter --bootstrap-server B --entity-type users --entity-name alice \\
        --add-config producer_byte_rate=1048576,consumer_byte_rate=2097152
    highwater quotas alter --bootstrap-server B --entity-type clients --entity-default \\
        --add-config request_percentage=50 --delete-config producer_byte_rate
    highwater quotas alter --bootstrap-server B --entity-type users --entity-name alice \\
        --entity-type clients --entity-name app --add-config producer_byte_rate=1024
    highwater quotas describe --bootstrap-server B [--entity-type users [--entity-name alice]]

An entity is a user, a client id, or both: one ``--entity-type`` with ``--entity-name N``
or ``--entity-default``, or both types with a name each (in the types' order) or both
defaulted; a user and the default client id (or the reverse) is written with Kafka's
``--user N``/``--user-defaults`` and ``--client N``/``--client-defaults``. The keys are
``producer_byte_rate``, ``consumer_byte_rate`` (bytes per second) and
``request_percentage``; an unknown key or a value that is not positive is refused by the
controller, naming the key. ``describe`` without a name lists every entity of the type
(without ``--entity-type``: every entity), printing Kafka's lines::

    Quota configs for user-principal 'alice', client-id 'app' are producer_byte_rate=1024.0

``highwater configs --entity-type users|clients`` does the same with ``--describe`` and
``--alter`` (:func:`run_quota_command`). docs/security.md says how quotas are enforced.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import click

from highwater.cli.topics import Connection, connection_options, run_admin
from highwater.client.admin import AdminClient
from highwater.controller_api import messages as m
from highwater.metadata.client_quotas import CLIENT_ID, DEFAULT_ENTITY, USER, ClientQuotaEntity

__all__ = [
    "QUOTA_ENTITY_TYPES",
    "EntitySelection",
    "format_quota_entity",
    "parse_quota_changes",
    "quota_entity_options",
    "quotas",
    "run_quota_command",
    "select_entities",
]

QUOTA_ENTITY_TYPES = {"users": USER, "clients": CLIENT_ID}
"""kafka-configs' quota entity types, and the entity types of the quota API."""


@dataclass(frozen=True, slots=True)
class EntitySelection:
    """What the options name: ``named`` by entity type (``None``: the type's default),
    and the types given without a name (``describe``: every entity of the type)."""

    named: dict[str, str | None]
    any_of: tuple[str, ...] = ()


def quota_entity_options(command: Callable[..., None]) -> Callable[..., None]:
    """Kafka's ``--user``/``--user-defaults`` and ``--client``/``--client-defaults``."""
    for decorator in (
        click.option("--user", default=None, help="The user (its principal's name)."),
        click.option("--user-defaults", is_flag=True, help="The default user."),
        click.option("--client", default=None, help="The client id."),
        click.option("--client-defaults", is_flag=True, help="The default client id."),
    ):
        command = decorator(command)
    return command


def select_entities(
    entity_types: tuple[str, ...],
    entity_names: tuple[str, ...],
    entity_default: int,
    *,
    user: str | None = None,
    user_defaults: bool = False,
    client: str | None = None,
    client_defaults: bool = False,
) -> EntitySelection:
    """The entity (or, for ``describe``, entities) the options select; ``UsageError`` if
    they do not pair up. ``--entity-type`` (``users``/``clients``, each once) pairs with
    the ``--entity-name`` values in order, or every one with ``--entity-default``."""
    named: dict[str, str | None] = {}
    for given, default, entity_type in (
        (user, user_defaults, USER),
        (client, client_defaults, CLIENT_ID),
    ):
        if given is not None and default:
            raise click.UsageError(f"give a {entity_type} or its defaults, not both")
        if given is not None or default:
            named[entity_type] = given
    types = [QUOTA_ENTITY_TYPES[t] for t in entity_types]
    if len(set(types)) != len(types) or set(types) & set(named):
        raise click.UsageError("each entity type may be named once")
    if entity_default and entity_names:
        raise click.UsageError(
            "a named entity with a default one is written --user N --client-defaults "
            "or --user-defaults --client N"
        )
    if entity_default and entity_default != len(types):
        raise click.UsageError("give --entity-default once for each --entity-type")
    if len(entity_names) > len(types):
        raise click.UsageError("each --entity-name needs its --entity-type")
    for index, entity_type in enumerate(types):
        if entity_default:
            named[entity_type] = None
        elif index < len(entity_names):
            named[entity_type] = entity_names[index]
    return EntitySelection(named, tuple(t for t in types if t not in named))


def format_quota_entity(entity: ClientQuotaEntity) -> str:
    """The entity as kafka-configs names it: ``user-principal 'alice', client-id 'app'``."""
    parts = []
    for label, name in (("user-principal", entity.user), ("client-id", entity.client_id)):
        if name == DEFAULT_ENTITY:
            parts.append(f"the default {label}")
        elif name is not None:
            parts.append(f"{label} '{name}'")
    return ", ".join(parts)


def parse_quota_changes(
    add_config: tuple[str, ...], delete_config: tuple[str, ...]
) -> dict[str, float | None]:
    """``--add-config k=v,...`` and ``--delete-config k,...`` as ``{key: value or None}``;
    a value that is not a number is a ``BadParameter`` naming the key (the controller
    checks the keys and ranges)."""
    changes: dict[str, float | None] = {}
    for text in add_config:
        for pair in (p.strip() for p in text.split(",")):
            if not pair:
                continue
            key, equals, raw = (part.strip() for part in pair.partition("="))
            if not equals or not key:
                raise click.BadParameter(f"{pair!r} is not KEY=VALUE", param_hint="--add-config")
            try:
                changes[key] = float(raw)
            except ValueError:
                raise click.BadParameter(
                    f"Invalid value {raw!r} for quota {key}: not a number",
                    param_hint="--add-config",
                ) from None
    for text in delete_config:
        for key in (k.strip() for k in text.split(",")):
            if not key:
                continue
            if key in changes:
                raise click.UsageError(f"{key} is both added and deleted")
            changes[key] = None
    return changes


def run_quota_command(
    conn: Connection,
    selection: EntitySelection,
    *,
    describe: bool,
    changes: dict[str, float | None],
) -> None:
    """Describe the entities ``selection`` covers, or alter the one entity it names."""
    if describe:
        if changes:
            raise click.UsageError("--add-config and --delete-config go with --alter")
        components = [
            m.ClientQuotaFilterComponent(t, m.CLIENT_QUOTA_MATCH_SPECIFIED)
            for t in selection.any_of
        ]
        for entity_type, name in selection.named.items():
            if name is None:
                components.append(
                    m.ClientQuotaFilterComponent(entity_type, m.CLIENT_QUOTA_MATCH_DEFAULT)
                )
            else:
                components.append(
                    m.ClientQuotaFilterComponent(entity_type, m.CLIENT_QUOTA_MATCH_EXACT, name)
                )
        strict = bool(selection.named) and not selection.any_of

        async def described(admin: AdminClient) -> dict[ClientQuotaEntity, dict[str, float]]:
            return await admin.describe_client_quotas(components, strict=strict)

        for entity, values in run_admin(conn, described).items():
            shown = ", ".join(f"{k}={float(v)!r}" for k, v in sorted(values.items()))
            click.echo(f"Quota configs for {format_quota_entity(entity)} are {shown}")
        return
    if not selection.named or selection.any_of:
        raise click.UsageError(
            "--alter names one entity: --entity-name N or --entity-default for each --entity-type"
        )
    if not changes:
        raise click.UsageError("--alter needs --add-config or --delete-config")
    try:
        entity = ClientQuotaEntity.of(selection.named)
    except ValueError as e:
        raise click.UsageError(str(e)) from None

    async def altered(admin: AdminClient) -> None:
        (error,) = await admin.alter_client_quotas([(entity, changes)])
        if error is not None:
            raise error

    run_admin(conn, altered)
    click.echo(f"Completed updating config for {format_quota_entity(entity)}.")


def _entity_options(command: Callable[..., None]) -> Callable[..., None]:
    for decorator in (
        click.option(
            "--entity-type",
            "entity_types",
            type=click.Choice(tuple(QUOTA_ENTITY_TYPES)),
            multiple=True,
            help="users or clients (both for a user and client id).",
        ),
        click.option(
            "--entity-name",
            "entity_names_",
            multiple=True,
            help="The user or client id, one per --entity-type, in order.",
        ),
        click.option(
            "--entity-default",
            count=True,
            help="The default entity of the --entity-type (once per type).",
        ),
    ):
        command = decorator(command)
    return quota_entity_options(command)


def _with_names(command: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(command)
    def wrapper(
        entity_types: tuple[str, ...],
        entity_names_: tuple[str, ...],
        entity_default: int,
        user: str | None,
        user_defaults: bool,
        client: str | None,
        client_defaults: bool,
        **kwargs: Any,
    ) -> None:
        selection = select_entities(
            entity_types,
            entity_names_,
            entity_default,
            user=user,
            user_defaults=user_defaults,
            client=client,
            client_defaults=client_defaults,
        )
        command(selection=selection, **kwargs)

    return wrapper


@click.group("quotas")
def quotas() -> None:
    """Alter and describe client quotas (producer and consumer byte rates, request
    percentage) per user and/or client id."""


@quotas.command("alter")
@connection_options
@_entity_options
@click.option("--add-config", "add_config", multiple=True, metavar="K=V[,K2=V2...]")
@click.option("--delete-config", "delete_config", multiple=True, metavar="K[,K2...]")
@_with_names
def alter(
    conn: Connection,
    selection: EntitySelection,
    add_config: tuple[str, ...],
    delete_config: tuple[str, ...],
) -> None:
    """Set or remove quota keys of one entity."""
    run_quota_command(
        conn, selection, describe=False, changes=parse_quota_changes(add_config, delete_config)
    )


@quotas.command("describe")
@connection_options
@_entity_options
@_with_names
def describe(conn: Connection, selection: EntitySelection) -> None:
    """Print the quotas of the entities named (all of a type without a name; all without
    a type)."""
    run_quota_command(conn, selection, describe=True, changes={})
