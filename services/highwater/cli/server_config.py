"""``--config FILE`` and ``--override KEY=VALUE`` for the server commands (server.properties).

Every role (``server``, ``controller``, ``broker``, ``coordinator``) takes both; the file
and the overrides are read by :func:`~highwater.config.server.load_server_config`
(an override beats the file, the file beats the defaults). A command-line flag that
stands for a key (``--rack`` for ``broker.rack``) keeps working and, when given, beats
both. An unknown key or a bad value stops the command before it starts: one
``Error: ...`` line naming the key, exit code 1.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import click
from click.core import ParameterSource

from highwater.config.listeners import (
    ADVERTISED_LISTENERS,
    INTER_BROKER_LISTENER_NAME,
    LISTENERS,
    Listeners,
    resolve_listeners,
)
from highwater.config.server import (
    BROKER_DYNAMIC_CONFIG_DEF,
    SERVER_CONFIG_DEF,
    ServerConfig,
    load_server_config,
)
from highwater.controller.config import CONTROLLER_CONFIG_DEF, ControllerConfig
from highwater.errors import InvalidConfigError

__all__ = [
    "LISTENER_FLAGS",
    "controller_config",
    "listener_options",
    "load_role_config",
    "log_dirs_flag",
    "role_listeners",
    "server_config_options",
]

F = TypeVar("F", bound=Callable[..., Any])

_EXPLICIT = (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)


def server_config_options(function: F) -> F:
    """Add ``--config FILE`` and ``--override KEY=VALUE`` (repeatable), passed as
    ``config_file`` and ``overrides``."""
    with_overrides = click.option(
        "--override",
        "overrides",
        multiple=True,
        metavar="KEY=VALUE",
        help="Set a server config key (Kafka's names), over the --config file (repeatable).",
    )(function)
    return click.option(
        "--config",
        "config_file",
        type=click.Path(dir_okay=False, path_type=Path),
        default=None,
        metavar="FILE",
        help="A Java-properties file of server config keys (Kafka's names: num.partitions, "
        "default.replication.factor, min.insync.replicas, log.retention.hours...).",
    )(with_overrides)


def log_dirs_flag(
    _ctx: click.Context, _param: click.Parameter, value: str | None
) -> tuple[str, ...] | None:
    """``--log-dirs DIR[,DIR...]`` parsed and checked as the ``log.dirs`` key is, and
    refused if two entries are one directory spelled two ways (``logs,./logs/``): the
    broker would open it twice."""
    if value is None:
        return None
    try:
        parsed: tuple[str, ...] = SERVER_CONFIG_DEF["log.dirs"].parse(value)
    except InvalidConfigError as e:
        raise click.BadParameter(str(e)) from None
    seen: dict[Path, str] = {}
    for entry in parsed:
        resolved = Path(entry).expanduser().resolve()
        if resolved in seen:
            raise click.BadParameter(
                f"{seen[resolved]!r} and {entry!r} are the same directory ({resolved})"
            )
        seen[resolved] = entry
    return parsed


LISTENER_FLAGS: dict[str, str] = {
    "listeners": LISTENERS,
    "advertised_listeners": ADVERTISED_LISTENERS,
    "inter_broker_listener_name": INTER_BROKER_LISTENER_NAME,
}
"""The listener flags (:func:`listener_options`) -> their config keys, for
:func:`load_role_config`."""


def listener_options(function: F) -> F:
    """Add ``--listeners``, ``--advertised-listeners`` and ``--inter-broker-listener-name``,
    the flags of the config keys of the same names (docs/configuration.md)."""
    for flag, metavar, text in reversed(
        (
            ("--listeners", "NAME://HOST:PORT,...", "Named listeners (listeners), not --listen."),
            (
                "--advertised-listeners",
                "NAME://HOST:PORT,...",
                "Where clients reach each listener (advertised.listeners).",
            ),
            (
                "--inter-broker-listener-name",
                "NAME",
                "The listener peers use (inter.broker.listener.name; default: the first).",
            ),
        )
    ):
        function = click.option(flag, default=None, metavar=metavar, help=text)(function)
    return function


def role_listeners(
    config: ServerConfig, listen: str | None, advertised_listener: str | None = None
) -> Listeners:
    """The command's listeners from its config and its ``--listen`` (taken only when
    given on the command line if ``listeners`` is set) and ``--advertised-listener``.

    Raises :class:`click.ClickException` naming the key at fault.
    """
    ctx = click.get_current_context()
    if config.get(LISTENERS) and ctx.get_parameter_source("listen") not in _EXPLICIT:
        listen = None
    try:
        return resolve_listeners(
            listeners=config.get(LISTENERS),
            advertised_listeners=config.get(ADVERTISED_LISTENERS),
            inter_broker_listener_name=config.get(INTER_BROKER_LISTENER_NAME),
            listen=listen,
            advertised_listener=advertised_listener,
        )
    except InvalidConfigError as e:
        raise click.ClickException(str(e)) from None


def load_role_config(
    config_file: Path | None,
    overrides: tuple[str, ...],
    flags: Mapping[str, str] | None = None,
) -> ServerConfig:
    """The command's server config: the file, the overrides, then each flag of ``flags``
    (parameter name -> config key) that was given explicitly.

    Raises :class:`click.ClickException` naming the first unknown key or bad value.
    """
    ctx = click.get_current_context()
    try:
        config = load_server_config(config_file, overrides)
        explicit = {
            key: ctx.params[param]
            for param, key in (flags or {}).items()
            if ctx.get_parameter_source(param) in _EXPLICIT and ctx.params[param] is not None
        }
        return config.with_values(explicit) if explicit else config
    except InvalidConfigError as e:
        raise click.ClickException(str(e)) from None


def controller_config(config: ServerConfig) -> ControllerConfig:
    """The quorum controller's settings from a server config: its keys, the cluster
    defaults it keeps in the metadata, and the dynamic broker configs it accepts."""
    base = ControllerConfig.from_properties(
        config.subset(CONTROLLER_CONFIG_DEF.names()),
        broker_config_definition=BROKER_DYNAMIC_CONFIG_DEF,
    )
    return dataclasses.replace(base, cluster_defaults=config.cluster_defaults())
