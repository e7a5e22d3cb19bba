"""``highwater acls add|remove|list``: ACLs, with kafka-acls' flags and output.

Shaped like ``kafka-acls.sh``::

    highwater acls add --bootstrap-server B --allow-principal User:alice --operation Write \\
        --topic orders [--resource-pattern-type prefixed]
    highwater acls list --bootstrap-server B [--topic orders] [--principal User:alice]
    highwater acls remove --bootstrap-server B --allow-principal User:alice --topic orders

Resources: ``--topic`` and ``--group`` (each repeatable), ``--transactional-id``,
``--cluster``; ``--resource-pattern-type`` ``literal`` (the default) or ``prefixed`` for
``add``, and also ``match`` (every pattern covering the name) or ``any`` for ``list`` and
``remove``. Principals ``--allow-principal`` / ``--deny-principal`` (``User:NAME``,
``User:*``), hosts ``--allow-host`` / ``--deny-host`` (``*`` unless given), operations
``--operation`` with Kafka's names (Read, Write, Create, Delete, Alter, Describe,
ClusterAction, DescribeConfigs, AlterConfigs, IdempotentWrite, All); ``add`` refuses an
operation the resource type does not support, as kafka-acls does. ``remove`` without a
principal or operation removes every ACL of the resources named.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from typing import Any

import click

from highwater.cli.tables import Column, format_option, print_table
from highwater.cli.topics import Connection, connection_options, run_admin
from highwater.client.admin import AdminClient
from highwater.controller_api.messages import ACL_PATTERN_MATCH, AclFilter
from highwater.security import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
)

__all__ = ["acls"]

CLUSTER_NAME = "kafka-cluster"
_OPERATIONS = {op.name.replace("_", "").lower(): op for op in AclOperation}
_PATTERNS = {"literal": PatternType.LITERAL, "prefixed": PatternType.PREFIXED}
ACL_COLUMNS = tuple(
    Column(h)
    for h in (
        "RESOURCE-TYPE",
        "RESOURCE-NAME",
        "PATTERN-TYPE",
        "PRINCIPAL",
        "HOST",
        "OPERATION",
        "PERMISSION-TYPE",
    )
)


_VALID_OPERATIONS: dict[ResourceType, tuple[AclOperation, ...]] = {
    ResourceType.TOPIC: (
        AclOperation.READ,
        AclOperation.WRITE,
        AclOperation.CREATE,
        AclOperation.DESCRIBE,
        AclOperation.DELETE,
        AclOperation.ALTER,
        AclOperation.DESCRIBE_CONFIGS,
        AclOperation.ALTER_CONFIGS,
    ),
    ResourceType.GROUP: (
        AclOperation.READ,
        AclOperation.DESCRIBE,
        AclOperation.DELETE,
        AclOperation.DESCRIBE_CONFIGS,
        AclOperation.ALTER_CONFIGS,
    ),
    ResourceType.CLUSTER: (
        AclOperation.CREATE,
        AclOperation.CLUSTER_ACTION,
        AclOperation.DESCRIBE_CONFIGS,
        AclOperation.ALTER_CONFIGS,
        AclOperation.IDEMPOTENT_WRITE,
        AclOperation.ALTER,
        AclOperation.DESCRIBE,
    ),
    ResourceType.TRANSACTIONAL_ID: (AclOperation.DESCRIBE, AclOperation.WRITE),
}
"""The operations an ACL on each resource type may name, ALL besides (Kafka's
``AclCommand.ResourceTypeToValidOperations``): an ACL no request ever checks is refused
rather than kept, since it would grant or deny nothing."""


def _operation_name(op: AclOperation) -> str:
    return op.name.title().replace("_", "")


def _check_operations(
    resources: Iterable[tuple[ResourceType, str]], operations: Iterable[AclOperation]
) -> None:
    """UsageError for an operation a resource type does not support, in kafka-acls'
    words ("ResourceType GROUP only supports operations Read, ...")."""
    for resource_type in dict.fromkeys(t for t, _ in resources):
        valid = (*_VALID_OPERATIONS[resource_type], AclOperation.ALL)
        unsupported = [op for op in operations if op not in valid]
        if unsupported:
            raise click.UsageError(
                f"ResourceType {resource_type.name} only supports operations "
                f"{', '.join(_operation_name(op) for op in valid)}, not "
                f"{', '.join(_operation_name(op) for op in unsupported)}"
            )


def _operation(
    _ctx: click.Context, _param: click.Parameter, values: tuple[str, ...]
) -> list[AclOperation]:
    found = []
    for value in values:
        op = _OPERATIONS.get(value.replace("_", "").replace("-", "").lower())
        if op is None:
            names = ", ".join(sorted(_operation_name(o) for o in AclOperation))
            raise click.BadParameter(f"{value!r} is not one of {names}", param_hint="--operation")
        found.append(op)
    return found


def _resource_options(*, pattern_types: tuple[str, ...]) -> Any:
    def decorate(command: Any) -> Any:
        for option in reversed(
            (
                click.option("--topic", "topics", multiple=True, help="A topic (repeatable)."),
                click.option("--group", "groups", multiple=True, help="A group (repeatable)."),
                click.option(
                    "--transactional-id", "transactional_ids", multiple=True, help="A txn id."
                ),
                click.option("--cluster", is_flag=True, help="The cluster resource."),
                click.option(
                    "--resource-pattern-type",
                    type=click.Choice(pattern_types, case_sensitive=False),
                    default="literal",
                    show_default=True,
                    help="How the resource names match.",
                ),
            )
        ):
            command = option(command)
        return command

    return decorate


def _resources(
    topics: Iterable[str], groups: Iterable[str], transactional_ids: Iterable[str], cluster: bool
) -> list[tuple[ResourceType, str]]:
    resources = [(ResourceType.TOPIC, t) for t in topics]
    resources += [(ResourceType.GROUP, g) for g in groups]
    resources += [(ResourceType.TRANSACTIONAL_ID, t) for t in transactional_ids]
    if cluster:
        resources.append((ResourceType.CLUSTER, CLUSTER_NAME))
    return resources


def _principal_options(command: Any) -> Any:
    for option in reversed(
        (
            click.option("--allow-principal", "allow_principals", multiple=True),
            click.option("--deny-principal", "deny_principals", multiple=True),
            click.option("--allow-host", "allow_hosts", multiple=True),
            click.option("--deny-host", "deny_hosts", multiple=True),
            click.option(
                "--operation", "operations", multiple=True, callback=_operation, help="Repeatable."
            ),
        )
    ):
        command = option(command)
    return command


def _pattern_filter(pattern_type: str) -> int | None:
    return {"literal": int(PatternType.LITERAL), "prefixed": int(PatternType.PREFIXED)}.get(
        pattern_type.lower(), ACL_PATTERN_MATCH if pattern_type.lower() == "match" else None
    )


def _describe(acl: AclBinding) -> str:
    return (
        f"\t(principal={acl.principal}, host={acl.host}, operation={acl.operation.name}, "
        f"permissionType={acl.permission.name})"
    )


def _print_by_resource(found: Iterable[AclBinding], heading: str) -> None:
    def resource(acl: AclBinding) -> tuple[int, str, int]:
        return (acl.resource_type, acl.resource_name, acl.pattern_type)

    for (resource_type, name, pattern), group in itertools.groupby(
        sorted(found, key=lambda a: (*resource(a), a.principal, a.host, a.operation)), resource
    ):
        click.echo(
            f"{heading} `ResourcePattern(resourceType={ResourceType(resource_type).name}, "
            f"name={name}, patternType={PatternType(pattern).name})`:"
        )
        for acl in group:
            click.echo(_describe(acl))
        click.echo()


@click.group("acls")
def acls() -> None:
    """Add, remove and list ACLs (kafka-acls)."""


@acls.command("add")
@connection_options
@_resource_options(pattern_types=("literal", "prefixed"))
@_principal_options
def add(
    conn: Connection,
    topics: tuple[str, ...],
    groups: tuple[str, ...],
    transactional_ids: tuple[str, ...],
    cluster: bool,
    resource_pattern_type: str,
    allow_principals: tuple[str, ...],
    deny_principals: tuple[str, ...],
    allow_hosts: tuple[str, ...],
    deny_hosts: tuple[str, ...],
    operations: list[AclOperation],
) -> None:
    """Add the ACLs: each principal, from each host, may (or may not) do each operation
    to each resource."""
    resources = _resources(topics, groups, transactional_ids, cluster)
    if not resources:
        raise click.UsageError("name a resource: --topic, --group, --transactional-id or --cluster")
    if not allow_principals and not deny_principals:
        raise click.UsageError("name a principal: --allow-principal or --deny-principal")
    if not operations:
        raise click.UsageError("name an operation: --operation")
    _check_operations(resources, operations)
    pattern = _PATTERNS[resource_pattern_type.lower()]
    try:
        bindings = [
            AclBinding(resource_type, name, pattern, principal, host, op, permission)
            for resource_type, name in resources
            for principals, hosts, permission in (
                (allow_principals, allow_hosts or ("*",), AclPermissionType.ALLOW),
                (deny_principals, deny_hosts or ("*",), AclPermissionType.DENY),
            )
            for principal in principals
            for host in hosts
            for op in operations
        ]
    except ValueError as e:
        raise click.UsageError(str(e)) from None

    async def work(admin: AdminClient) -> list[Any]:
        return await admin.create_acls(bindings)

    outcomes = run_admin(conn, work)
    failed = [(b, e) for b, e in zip(bindings, outcomes, strict=True) if e is not None]
    _print_by_resource(
        [b for b, e in zip(bindings, outcomes, strict=True) if e is None],
        "Adding ACLs for resource",
    )
    for binding, error in failed:
        click.echo(f"Error: {_describe(binding).strip()}: {error}", err=True)
    if failed:
        raise SystemExit(1)


def _filters(
    resources: list[tuple[ResourceType, str]],
    pattern_type: str,
    principals: Iterable[tuple[str | None, int | None, str | None]],
    operations: list[AclOperation],
) -> list[AclFilter]:
    pattern = _pattern_filter(pattern_type)
    targets: list[tuple[int | None, str | None]] = [(int(t), n) for t, n in resources] or [
        (None, None)
    ]
    ops: list[int | None] = [int(op) for op in operations] or [None]
    return [
        AclFilter(
            resource_type=resource_type,
            resource_name=name,
            pattern_type=pattern,
            principal=principal,
            host=host,
            operation=op,
            permission_type=permission,
        )
        for resource_type, name in targets
        for principal, permission, host in principals
        for op in ops
    ]


def _principal_filters(
    allow_principals: tuple[str, ...],
    deny_principals: tuple[str, ...],
    allow_hosts: tuple[str, ...],
    deny_hosts: tuple[str, ...],
) -> list[tuple[str | None, int | None, str | None]]:
    chosen: list[tuple[str | None, int | None, str | None]] = []
    for principals, hosts, permission in (
        (allow_principals, allow_hosts, int(AclPermissionType.ALLOW)),
        (deny_principals, deny_hosts, int(AclPermissionType.DENY)),
    ):
        for principal in principals:
            chosen += [(principal, permission, host) for host in hosts] or [
                (principal, permission, None)
            ]
    return chosen or [(None, None, None)]


@acls.command("remove")
@connection_options
@_resource_options(pattern_types=("literal", "prefixed", "match", "any"))
@_principal_options
def remove(
    conn: Connection,
    topics: tuple[str, ...],
    groups: tuple[str, ...],
    transactional_ids: tuple[str, ...],
    cluster: bool,
    resource_pattern_type: str,
    allow_principals: tuple[str, ...],
    deny_principals: tuple[str, ...],
    allow_hosts: tuple[str, ...],
    deny_hosts: tuple[str, ...],
    operations: list[AclOperation],
) -> None:
    """Remove the ACLs that match: of the resources named, for the principals, hosts and
    operations named (all of them where none is named)."""
    resources = _resources(topics, groups, transactional_ids, cluster)
    if not resources:
        raise click.UsageError("name a resource: --topic, --group, --transactional-id or --cluster")
    filters = _filters(
        resources,
        resource_pattern_type,
        _principal_filters(allow_principals, deny_principals, allow_hosts, deny_hosts),
        operations,
    )

    async def work(admin: AdminClient) -> list[list[AclBinding]]:
        return await admin.delete_acls(filters)

    removed = [acl for found in run_admin(conn, work) for acl in found]
    _print_by_resource(removed, "Removed ACLs for resource")
    if not removed:
        click.echo("No ACLs matched.")


@acls.command("list")
@connection_options
@_resource_options(pattern_types=("literal", "prefixed", "match", "any"))
@click.option("--principal", default=None, help="Only the ACLs of this principal.")
@format_option
def list_(
    conn: Connection,
    topics: tuple[str, ...],
    groups: tuple[str, ...],
    transactional_ids: tuple[str, ...],
    cluster: bool,
    resource_pattern_type: str,
    principal: str | None,
    output_format: str,
) -> None:
    """List the ACLs (of the resources named, else all)."""
    resources = _resources(topics, groups, transactional_ids, cluster)
    pattern_type = resource_pattern_type if resources else "any"
    filters = _filters(resources, pattern_type, [(principal, None, None)], [])

    async def work(admin: AdminClient) -> list[AclBinding]:
        found: dict[AclBinding, None] = {}
        for acl_filter in filters:
            for acl in await admin.describe_acls(acl_filter):
                found[acl] = None
        return list(found)

    found = run_admin(conn, work)
    if output_format == "json":
        rows = [
            (
                ResourceType(a.resource_type).name,
                a.resource_name,
                PatternType(a.pattern_type).name,
                a.principal,
                a.host,
                a.operation.name,
                a.permission.name,
            )
            for a in found
        ]
        print_table(ACL_COLUMNS, sorted(rows), "json")
        return
    _print_by_resource(found, "Current ACLs for resource")
