"""The ``highwater`` command: one binary for every role and operator tool, as a click group.

Each subcommand lives in its own module under :mod:`highwater.cli` and is registered at
the bottom of this file with one ``main.add_command(...)`` line.
"""

from __future__ import annotations

import logging

import click

from highwater import __version__
from highwater.cli.acls import acls
from highwater.cli.broker import broker
from highwater.cli.brokers import brokers
from highwater.cli.clients import consume, produce
from highwater.cli.cluster import cluster
from highwater.cli.configs import configs
from highwater.cli.controller import controller
from highwater.cli.coordinator import coordinator
from highwater.cli.delete_records import delete_records
from highwater.cli.dev_cluster import dev_cluster
from highwater.cli.dump_log import dump_log
from highwater.cli.get_offsets import get_offsets
from highwater.cli.groups import groups
from highwater.cli.leader_election import leader_election
from highwater.cli.log_dirs import describe_log_dirs
from highwater.cli.observer import observer
from highwater.cli.partitions import partitions
from highwater.cli.quorum import quorum
from highwater.cli.quotas import quotas
from highwater.cli.rolling import rolling
from highwater.cli.server import server
from highwater.cli.serving import add_command_config
from highwater.cli.topics import topics
from highwater.cli.users import users
from highwater.telemetry.logs import (
    GRPC_LOGGERS,
    JsonFormatter,
    TextFormatter,
    TraceContextFilter,
    UndecodableRequestFilter,
)

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


# -- subcommands: one line per module under highwater/cli/ ---------------------------------
main.add_command(dump_log)
main.add_command(controller)
main.add_command(broker)
main.add_command(coordinator)
main.add_command(observer)
main.add_command(quorum)
main.add_command(server)
main.add_command(topics)
main.add_command(partitions)
main.add_command(brokers)
main.add_command(dev_cluster)
main.add_command(produce)
main.add_command(consume)
main.add_command(groups)
main.add_command(rolling)
main.add_command(configs)
main.add_command(cluster)
main.add_command(acls)
main.add_command(users)
main.add_command(describe_log_dirs)
main.add_command(leader_election)
main.add_command(delete_records)
main.add_command(get_offsets)
main.add_command(quotas)
add_command_config(main)
