"""``highwater produce`` and ``highwater consume``: console producer and consumer (like Kafka's).

``produce`` reads lines from stdin and writes one record per line with
:class:`~highwater.client.producer.Producer`; with ``--key-separator SEP`` the part of a
line before the first ``SEP`` is the record's key (a line without it fails). At the end it
writes ``N records sent, E failed.`` to stderr (plus an ``Error: ...`` line per distinct
failure) and exits 1 if any record failed. ``--property`` takes kafka-console-producer's
line-reader settings (``parse.key``, ``key.separator``, ``parse.headers``,
``headers.delimiter``, ``headers.separator``, ``headers.key.separator``, ``null.marker``;
:mod:`highwater.cli.console_format`) besides producer configs.

``consume`` assigns every partition of a topic (or the one ``--partition`` names) to a
:class:`~highwater.client.consumer.Consumer`, from the latest offset by default (the
earliest with ``--from-beginning``, N with ``--offset N``, which also takes ``earliest``
and ``latest`` as kafka-console-consumer's does), and prints each value on a
line of its own on stdout: ``[Offset:N<SEP>][KEY<SEP>]VALUE`` (``SEP`` is
``--key-separator``, a tab by default; a null key or value prints as ``null``);
``--property`` chooses the fields as kafka-console-consumer's formatter does
(``print.timestamp``, ``print.partition``, ``print.offset``, ``print.headers``,
``print.key``, ``null.literal``...) and ``--formatter json`` prints one JSON object per
record (:mod:`highwater.cli.console_format`). It stops
after ``--max-messages`` records, when none arrived for ``--timeout-ms``, or on Ctrl-C,
and then writes ``Processed a total of N messages`` to stderr, as kafka-console-consumer
does. Without ``--group`` no group is joined and no offsets are committed.

``consume --group G`` joins consumer group ``G`` instead (subscribe: the group shares the
topic's partitions out among its members) and starts each partition at the group's
committed offset; only a partition without one starts where ``--from-beginning`` says
(``auto.offset.reset`` earliest, else latest), as in kafka-console-consumer. The positions
of the records printed are committed as it goes and when it stops, so the next run
resumes after them. ``--partition`` and ``--offset`` do not go with ``--group``.

Both take ``--bootstrap-server HOST:PORT[,HOST:PORT...]`` (else the environment or the
profile, :mod:`highwater.cli.bootstrap`). An unknown topic or
partition, an unreachable cluster or a bad setting is one ``Error: ...`` line on stderr and
exit code 1. While stderr is a terminal a live counter (rich) shows the progress there.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import Iterator
from typing import Any, TextIO

import click
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from highwater.cli.bootstrap import bootstrap_server_option
from highwater.cli.console_format import LINE_PROPERTIES, LineFormat, RecordFormat, json_record
from highwater.cli.serving import start_telemetry
from highwater.client.cluster import ClusterMetadata, UnknownTopicOrPartitionError
from highwater.client.consumer import OFFSET_BEGINNING, OFFSET_END, Consumer, TopicPartition
from highwater.client.producer import Message, Producer
from highwater.errors import HighwaterError, InvalidConfigError

__all__ = ["consume", "produce"]

#: How often ``consume`` wakes up from a poll with no ``--timeout-ms`` (so Ctrl-C works).
_POLL_INTERVAL_S = 1.0


# --- Shared helpers --------------------------------------------------------------------


def _bootstrap_option() -> Any:
    """The ``--bootstrap-server`` option both commands take (highwater.cli.bootstrap)."""
    return bootstrap_server_option()


def _one_line(text: str) -> str:
    """``text`` with its whitespace runs (newlines included) as single blanks."""
    return " ".join(text.split())


def _topic_partitions(bootstrap_server: str, topic: str) -> list[int]:
    """The partitions of ``topic``, from a broker's Metadata; ClickException if it has none."""

    async def lookup() -> list[int]:
        cluster = ClusterMetadata(bootstrap_server, request_timeout_s=10)
        try:
            await cluster.refresh([topic])
            info = cluster.topic(topic)
            if info is None:
                raise UnknownTopicOrPartitionError(f"Topic '{topic}' does not exist.")
            return [p.partition for p in info.partitions]
        finally:
            await cluster.close()

    try:
        return asyncio.run(lookup())
    except HighwaterError as e:
        raise click.ClickException(_one_line(str(e) or e.code_name)) from None


class _Counter:
    """A live "N <unit>" counter on stderr while it is a terminal; does nothing otherwise."""

    def __init__(self, description: str, unit: str) -> None:
        """Prepare a counter labelled ``description``; :meth:`shown` displays it."""
        self._description = description
        self._unit = unit
        self._progress: Progress | None = None
        self._task: Any = None

    @contextlib.contextmanager
    def shown(self) -> Iterator[_Counter]:
        """Display the counter (when stderr is a terminal) for the ``with`` block."""
        stderr = sys.stderr
        if not stderr.isatty():
            yield self
            return
        progress = Progress(
            SpinnerColumn(),
            TextColumn("[progress.description]{task.description}"),
            TextColumn("{task.completed} " + self._unit),
            TimeElapsedColumn(),
            console=Console(file=stderr),
            transient=True,
        )
        with progress:
            self._progress = progress
            self._task = progress.add_task(self._description, total=None)
            try:
                yield self
            finally:
                self._progress = None

    def advance(self, count: int = 1) -> None:
        """Count ``count`` more."""
        if self._progress is not None:
            self._progress.advance(self._task, count)


# --- produce ---------------------------------------------------------------------------


def _split_properties(pairs: tuple[str, ...]) -> tuple[dict[str, str], dict[str, str]]:
    """``--property k=v`` pairs as (reader properties, producer configs)."""
    reader: dict[str, str] = {}
    configs: dict[str, str] = {}
    for pair in pairs:
        key, equals, value = pair.partition("=")
        key = key.strip()
        if not equals or not key:
            raise click.BadParameter(f"{pair!r} is not KEY=VALUE", param_hint="'--property'")
        (reader if key in LINE_PROPERTIES else configs)[key] = value
    return reader, configs


def _lines(stream: TextIO) -> Iterator[str]:
    """The lines of ``stream`` without their line ends (``\\n`` or ``\\r\\n``)."""
    for line in stream:
        if line.endswith("\n"):
            line = line[:-1]
            if line.endswith("\r"):
                line = line[:-1]
        yield line


@click.command("produce")
@_bootstrap_option()
@click.option("--topic", required=True, help="The topic to write to.")
@click.option(
    "--key-separator",
    default=None,
    help="Read each line as KEY<SEP>VALUE, split at the first SEP (default: no keys).",
)
@click.option(
    "--acks",
    type=click.Choice(["all", "-1", "1", "0"]),
    default="all",
    show_default=True,
    help="Replicas that must have a record before it counts as written.",
)
@click.option(
    "--compression-type",
    type=click.Choice(["none", "gzip", "snappy", "lz4", "zstd"]),
    default="none",
    show_default=True,
    help="The codec record batches are compressed with.",
)
@click.option(
    "--property",
    "properties",
    multiple=True,
    metavar="KEY=VALUE",
    help="A producer setting (repeatable), e.g. --property linger.ms=20; also the line "
    "reader's parse.key, key.separator, parse.headers, headers.delimiter, "
    "headers.separator, headers.key.separator and null.marker, as in kafka-console-producer.",
)
def produce(
    bootstrap_server: str,
    topic: str,
    key_separator: str | None,
    acks: str,
    compression_type: str,
    properties: tuple[str, ...],
) -> None:
    """Write each line of stdin to a topic as one record (like kafka-console-producer)."""
    start_telemetry(click.get_current_context())
    reader, configs = _split_properties(properties)
    if key_separator == "":
        raise click.BadParameter("must not be empty", param_hint="'--key-separator'")
    if key_separator is not None:
        reader.update({"parse.key": "true", "key.separator": key_separator})
    try:
        line_format = LineFormat.from_properties(reader)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="'--property'") from None
    config: dict[str, Any] = {
        "bootstrap.servers": bootstrap_server,
        "acks": acks,
        "compression.type": compression_type,
        **configs,
    }
    _topic_partitions(bootstrap_server, topic)
    try:
        producer = Producer(config)
    except InvalidConfigError as e:
        raise click.ClickException(_one_line(str(e))) from None

    sent = 0
    interrupted = False
    failures: dict[str, int] = {}
    counter = _Counter(f"Producing to {topic}", "records")

    def on_delivery(err: BaseException | None, _msg: Message) -> None:
        nonlocal sent
        if err is None:
            sent += 1
            counter.advance()
        else:
            text = _one_line(str(err) or type(err).__name__)
            failures[text] = failures.get(text, 0) + 1

    stdin = sys.stdin
    try:
        with counter.shown():
            for number, line in enumerate(_lines(stdin), start=1):
                try:
                    headers, key, value = line_format.parse(line, number)
                except ValueError as e:
                    failures[str(e)] = failures.get(str(e), 0) + 1
                    continue
                producer.produce(
                    topic, value, key, headers=headers or None, on_delivery=on_delivery
                )
                producer.poll(0)
            producer.flush()
    except KeyboardInterrupt:
        interrupted = True
    finally:
        producer.close(0)
    failed = sum(failures.values())
    click.echo(f"{sent} records sent, {failed} failed.", err=True)
    for text, count in failures.items():
        click.echo(f"Error: {text}" + (f" ({count} records)" if count > 1 else ""), err=True)
    if interrupted:
        click.echo("Error: interrupted; records not yet written were dropped.", err=True)
    if failed or interrupted:
        sys.exit(1)


# --- consume ---------------------------------------------------------------------------


def _record_format(
    properties: tuple[str, ...], print_key: bool, print_offset: bool, key_separator: str | None
) -> RecordFormat:
    """The printing properties with the --print-* flags and --key-separator folded in."""
    given: dict[str, str] = {}
    for pair in properties:
        key, equals, value = pair.partition("=")
        if not equals or not key.strip():
            raise click.BadParameter(f"{pair!r} is not KEY=VALUE", param_hint="'--property'")
        given[key.strip()] = value
    if print_key:
        given["print.key"] = "true"
    if print_offset:
        given["print.offset"] = "true"
    if key_separator is not None:
        given["key.separator"] = key_separator
    try:
        return RecordFormat.from_properties(given)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="'--property'") from None


class _StartOffset(click.ParamType):
    """``--offset``: a non-negative offset, or ``earliest`` / ``latest`` for the partition's
    first or next offset (kafka-console-consumer's values), as the consumer's sentinels."""

    name = "offset"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        text = str(value).strip().lower()
        if text == "earliest":
            return OFFSET_BEGINNING
        if text == "latest":
            return OFFSET_END
        try:
            offset = int(text)
        except ValueError:
            offset = -1
        if offset < 0:
            self.fail(f"{value!r} is not a non-negative offset, earliest or latest", param, ctx)
        return offset


@click.command("consume")
@_bootstrap_option()
@click.option("--topic", required=True, help="The topic to read.")
@click.option(
    "--partition",
    type=click.IntRange(min=0),
    default=None,
    help="Read only this partition (default: every partition of the topic).",
)
@click.option(
    "--from-beginning",
    is_flag=True,
    help="Start at the earliest offset instead of the latest.",
)
@click.option(
    "--offset",
    type=_StartOffset(),
    default=None,
    metavar="N|earliest|latest",
    help="Start at this offset, or at the earliest or latest one (needs --partition).",
)
@click.option(
    "--max-messages",
    type=click.IntRange(min=1),
    default=None,
    help="Stop after this many records (default: no limit).",
)
@click.option(
    "--timeout-ms",
    type=click.IntRange(min=1),
    default=None,
    help="Stop when no record arrived for this long (default: wait forever).",
)
@click.option(
    "--group",
    "group_id",
    default=None,
    help="Consume as a member of this consumer group, from its committed offsets, and "
    "commit the positions reached.",
)
@click.option("--print-key", is_flag=True, help="Print each key before the value.")
@click.option("--print-offset", is_flag=True, help="Print Offset:N before each record.")
@click.option(
    "--key-separator",
    default=None,
    help="What separates the printed fields (a tab unless --property key.separator=...).",
)
@click.option(
    "--property",
    "properties",
    multiple=True,
    metavar="KEY=VALUE",
    help="A printing setting (repeatable), as kafka-console-consumer's: print.timestamp, "
    "print.partition, print.offset, print.headers, print.key, print.value (true/false), "
    "key.separator, line.separator, headers.separator, null.literal.",
)
@click.option(
    "--formatter",
    type=click.Choice(["default", "json"]),
    default="default",
    show_default=True,
    help="default: the fields --property chooses; json: one JSON object per record.",
)
def consume(
    bootstrap_server: str,
    topic: str,
    partition: int | None,
    from_beginning: bool,
    offset: int | None,
    max_messages: int | None,
    timeout_ms: int | None,
    group_id: str | None,
    print_key: bool,
    print_offset: bool,
    key_separator: str | None,
    properties: tuple[str, ...],
    formatter: str,
) -> None:
    """Print the records of a topic to stdout (like kafka-console-consumer)."""
    start_telemetry(click.get_current_context())
    if formatter == "json" and (properties or print_key or print_offset or key_separator):
        raise click.UsageError(
            "--formatter json prints every field: --property, --print-key, --print-offset "
            "and --key-separator go with --formatter default"
        )
    record_format = _record_format(properties, print_key, print_offset, key_separator)
    if group_id is not None:
        if not group_id:
            raise click.BadParameter("must not be empty", param_hint="'--group'")
        if partition is not None:
            raise click.UsageError("--partition does not go with --group")
        if offset is not None:
            raise click.UsageError("--offset does not go with --group")
    if offset is not None and partition is None:
        raise click.UsageError("--offset needs --partition")
    if offset is not None and from_beginning:
        raise click.UsageError("--offset and --from-beginning exclude each other")
    partitions = _topic_partitions(bootstrap_server, topic)
    if partition is not None:
        if partition not in partitions:
            raise click.ClickException(
                f"Topic '{topic}' has no partition {partition} (it has {len(partitions)})."
            )
        partitions = [partition]
    start = OFFSET_BEGINNING if from_beginning else OFFSET_END
    if offset is not None:
        start = offset
    config: dict[str, Any] = {
        "bootstrap.servers": bootstrap_server,
        "auto.offset.reset": "earliest" if from_beginning else "latest",
    }
    if group_id is not None:
        config.update({"group.id": group_id, "client.id": "console-consumer"})
    consumer = Consumer(config)
    processed = 0
    error: str | None = None
    idle_s = None if timeout_ms is None else timeout_ms / 1000
    stdout = sys.stdout
    try:
        if group_id is None:
            consumer.assign([TopicPartition(topic, p, start) for p in partitions])
        else:
            consumer.subscribe([topic])
        last = time.monotonic()
        with _Counter(f"Consuming {topic}", "messages").shown() as counter:
            while max_messages is None or processed < max_messages:
                if idle_s is None:
                    wait = _POLL_INTERVAL_S
                else:
                    wait = idle_s - (time.monotonic() - last)
                    if wait <= 0:
                        break
                message = consumer.poll(wait)
                if message is None:
                    continue
                failure = message.error()
                if failure is not None:
                    error = _one_line(str(failure) or type(failure).__name__)
                    break
                if formatter == "json":
                    stdout.write(json_record(message) + "\n")
                else:
                    stdout.write(record_format.format(message))
                stdout.flush()
                processed += 1
                counter.advance()
                last = time.monotonic()
    except KeyboardInterrupt:
        pass
    except BrokenPipeError:
        pass  # stdout was closed (`| head`): stop quietly
    except HighwaterError as e:  # the group refused this consumer (GroupError...)
        error = _one_line(str(e) or e.code_name)
    finally:
        consumer.close()
    click.echo(f"Processed a total of {processed} messages", err=True)
    if error is not None:
        raise click.ClickException(error)
