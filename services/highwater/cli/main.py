"""The ``highwater`` command: one binary for every role and operator tool, as a click group.

Each subcommand lives in its own module under :mod:`highwater.cli` and is registered in
:data:`COMMANDS` below with one line: its name and where it is defined. A command's module
is imported only when that command runs (or help lists it), so starting one role does not
pay for every other command's imports (the broker, the controller, the admin client, the
Kafka protocol, etcd...): a process starts in about half the time.
"""

from __future__ import annotations

import importlib
import logging

import click

from highwater import __version__
from highwater.telemetry.logs import (
    GRPC_LOGGERS,
    JsonFormatter,
    TextFormatter,
    TraceContextFilter,
    UndecodableRequestFilter,
)

COMMANDS: dict[str, str] = {
    "dump-log": "highwater.cli.dump_log:dump_log",
    "controller": "highwater.cli.controller:controller",
    "broker": "highwater.cli.broker:broker",
    "coordinator": "highwater.cli.coordinator:coordinator",
    "observer": "highwater.cli.observer:observer",
    "quorum": "highwater.cli.quorum:quorum",
    "server": "highwater.cli.server:server",
    "topics": "highwater.cli.topics:topics",
    "partitions": "highwater.cli.partitions:partitions",
    "brokers": "highwater.cli.brokers:brokers",
    "dev-cluster": "highwater.cli.dev_cluster:dev_cluster",
    "produce": "highwater.cli.clients:produce",
    "consume": "highwater.cli.clients:consume",
    "groups": "highwater.cli.groups:groups",
    "rolling": "highwater.cli.rolling:rolling",
    "configs": "highwater.cli.configs:configs",
    "cluster": "highwater.cli.cluster:cluster",
    "acls": "highwater.cli.acls:acls",
    "users": "highwater.cli.users:users",
    "describe-log-dirs": "highwater.cli.log_dirs:describe_log_dirs",
    "leader-election": "highwater.cli.leader_election:leader_election",
    "delete-records": "highwater.cli.delete_records:delete_records",
    "get-offsets": "highwater.cli.get_offsets:get_offsets",
    "quotas": "highwater.cli.quotas:quotas",
}
"""Each subcommand's name and its ``module:attribute``, imported when the command is used."""


class LazyGroup(click.Group):
    """A click group whose subcommands named in ``lazy_commands`` are imported on first use
    (click's lazy-loading group pattern), then kept in :attr:`commands` as added ones are.

    ``commands`` holds only the loaded ones; ``get_command`` (or :meth:`command_named`)
    finds any.
    """

    def __init__(self, *args: object, lazy_commands: dict[str, str], **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.lazy_commands = lazy_commands

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.commands, *self.lazy_commands})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in self.lazy_commands:
            self.add_command(self._load(cmd_name), cmd_name)
        return self.commands.get(cmd_name)

    def command_named(self, cmd_name: str) -> click.Command:
        """The subcommand ``cmd_name``, imported if it was not yet; KeyError if there is none."""
        command = self.get_command(click.Context(self), cmd_name)
        if command is None:
            raise KeyError(cmd_name)
        return command

    def _load(self, cmd_name: str) -> click.Command:
        module_name, _, attribute = self.lazy_commands[cmd_name].partition(":")
        command = getattr(importlib.import_module(module_name), attribute)
        if not isinstance(command, click.Command):
            raise TypeError(f"{self.lazy_commands[cmd_name]} is not a click command")
        from highwater.cli.serving import add_command_config

        holder = click.Group(commands={cmd_name: command})
        add_command_config(holder)
        return command


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class _StderrHandler(logging.Handler):
    """Writes log records to the ``sys.stderr`` of the moment (click's test runner swaps it)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            click.echo(self.format(record), err=True)
        except Exception:
            self.handleError(record)


def configure_logging(level: str, log_format: str = "text") -> None:
    """Send log records at ``level`` and above to stderr, as text lines or JSON objects,
    with the trace and span ids of the span they were written in; safe to call again."""
    root = logging.getLogger()
    root.setLevel(level.upper())
    handler = next((h for h in root.handlers if isinstance(h, _StderrHandler)), None)
    if handler is None:
        handler = _StderrHandler()
        handler.addFilter(TraceContextFilter())
        root.addHandler(handler)
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter(LOG_FORMAT))
    for name in GRPC_LOGGERS:
        grpc_logger = logging.getLogger(name)
        if not any(isinstance(f, UndecodableRequestFilter) for f in grpc_logger.filters):
            grpc_logger.addFilter(UndecodableRequestFilter())


@click.group(
    cls=LazyGroup,
    lazy_commands=COMMANDS,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.version_option(
    __version__, "-V", "--version", prog_name="highwater", message="%(prog)s %(version)s"
)
@click.option(
    "--log-level",
    type=click.Choice(LOG_LEVELS, case_sensitive=False),
    default="WARNING",
    show_default=True,
    envvar="HIGHWATER_LOG_LEVEL",
    help="Least severe log messages to write to stderr (also $HIGHWATER_LOG_LEVEL).",
)
@click.option(
    "--log-format",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    envvar="HIGHWATER_LOG_FORMAT",
    help="Log lines as text or as one JSON object each (also $HIGHWATER_LOG_FORMAT); "
    "both carry the trace and span ids of the span a line was written in.",
)
def main(log_level: str, log_format: str) -> None:
    """Highwater: a distributed, replicated commit log, built on Kafka's design.

    Topics are split into partitions; each partition is an append-only log of record
    batches (Kafka's RecordBatch v2 format) kept in segment files and replicated from a
    leader broker to followers, with a high watermark that consumers never read past.
    A Raft (KRaft) quorum of controllers owns the cluster metadata and coordinators
    run consumer groups. Every service speaks gRPC.

    This one binary starts each role and carries the operator tools: run
    `highwater COMMAND --help` for the details of a command.
    """
    configure_logging(log_level, log_format)
