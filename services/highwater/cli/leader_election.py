"""``highwater leader-election``: elect partition leaders (kafka-leader-election).

Shaped like ``kafka-leader-election.sh``::

    highwater leader-election --bootstrap-server B --election-type PREFERRED \\
        (--topic T --partition P | --all-topic-partitions | --path-to-json-file F)

``PREFERRED`` moves leadership back to each partition's preferred replica (the first of
its replicas) when that replica is in the ISR; ``UNCLEAN`` gives a partition without a
leader one from outside the ISR (records may be lost). The JSON file is Kafka's:
``{"partitions": [{"topic": "t", "partition": 0}, ...]}``. The election goes to the
controller through the ElectLeaders call; the command then waits (with a progress
display on a terminal) until the bootstrap broker's metadata shows the elected leaders,
and prints, as Kafka's tool does::

    Successfully completed leader election (PREFERRED) for partitions t-0, t-1
    Valid replica already elected for partitions t-2
    Error completing leader election (PREFERRED) for partition: t-3: <reason>

A partition whose election failed (other than not being needed) makes the exit code 1.
With ``--format json`` the outcome is one JSON object: ``{"election_type", "elected":
[{topic, partition}], "not_needed": [...], "failed": [{topic, partition, error}]}``.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import click

from highwater.cli.progress import waiting
from highwater.cli.tables import format_option, print_json
from highwater.cli.topics import Connection, connection_options, run_admin
from highwater.client.admin import AdminClient
from highwater.client.errors import AdminError, ElectionNotNeededError
from highwater.controller_api.messages import ElectionType

__all__ = ["leader_election", "parse_partitions_json"]

TopicPartition = tuple[str, int]
POLL_INTERVAL_S = 0.2


def parse_partitions_json(text: str) -> list[TopicPartition]:
    """Kafka's ``{"partitions": [{"topic": T, "partition": P}, ...]}`` as pairs in file
    order; ValueError naming what is wrong (a duplicate pair included)."""
    try:
        document = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"not JSON: {e}") from None
    entries = document.get("partitions") if isinstance(document, dict) else None
    if not isinstance(entries, list):
        raise ValueError('expected {"partitions": [{"topic": ..., "partition": ...}, ...]}')
    pairs: list[TopicPartition] = []
    for index, entry in enumerate(entries):
        topic = entry.get("topic") if isinstance(entry, dict) else None
        partition = entry.get("partition") if isinstance(entry, dict) else None
        if not isinstance(topic, str) or not topic:
            raise ValueError(f"partitions[{index}] has no topic name")
        if not isinstance(partition, int) or isinstance(partition, bool) or partition < 0:
            raise ValueError(f"partitions[{index}] has no partition number >= 0")
        if (topic, partition) in pairs:
            raise ValueError(f"{topic}-{partition} is listed twice")
        pairs.append((topic, partition))
    if not pairs:
        raise ValueError("the file lists no partitions")
    return pairs


def _names(pairs: list[TopicPartition]) -> str:
    return ", ".join(f"{topic}-{partition}" for topic, partition in sorted(pairs))


async def _await_leaders(
    admin: AdminClient, kind: ElectionType, elected: list[TopicPartition], timeout_s: float
) -> None:
    """Until the bootstrap broker's metadata shows a leader for each elected partition
    (for ``PREFERRED``: its preferred replica), or ``timeout_s`` passes."""
    if not elected:
        return
    deadline = time.monotonic() + timeout_s
    with waiting("Waiting for the new leaders", total=len(elected)) as progress:
        while True:
            described = await admin.describe_topics(sorted({t for t, _ in elected}))
            done = 0
            for topic, partition in elected:
                info = next(
                    (p for p in described[topic].partitions if p.partition == partition), None
                )
                if info is None or info.leader is None:
                    continue
                if kind == ElectionType.PREFERRED and info.replicas[:1] != (info.leader,):
                    continue
                done += 1
            progress.update(completed=done)
            if done == len(elected) or time.monotonic() >= deadline:
                return
            await asyncio.sleep(POLL_INTERVAL_S)


@click.command("leader-election")
@connection_options
@click.option(
    "--election-type",
    type=click.Choice(["PREFERRED", "UNCLEAN"], case_sensitive=False),
    required=True,
    help="PREFERRED: back to the preferred replica; UNCLEAN: a leader from outside the "
    "ISR for a partition without one (records may be lost).",
)
@click.option("--topic", default=None, help="The topic of the partition (with --partition).")
@click.option(
    "--partition", type=click.IntRange(min=0), default=None, help="The partition (with --topic)."
)
@click.option(
    "--all-topic-partitions", is_flag=True, help="Every partition of every topic in the cluster."
)
@click.option(
    "--path-to-json-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help='Partitions in Kafka\'s JSON: {"partitions": [{"topic": "t", "partition": 0}]}.',
)
@format_option
def leader_election(
    conn: Connection,
    election_type: str,
    topic: str | None,
    partition: int | None,
    all_topic_partitions: bool,
    path_to_json_file: Path | None,
    output_format: str,
) -> None:
    """Elect the leaders of partitions (like kafka-leader-election)."""
    chosen = [
        name
        for name, given in (
            ("--topic/--partition", topic is not None or partition is not None),
            ("--all-topic-partitions", all_topic_partitions),
            ("--path-to-json-file", path_to_json_file is not None),
        )
        if given
    ]
    if len(chosen) != 1:
        raise click.UsageError(
            "give exactly one of --topic with --partition, --all-topic-partitions, "
            "--path-to-json-file" + (f" (not {' and '.join(chosen)})" if chosen else "")
        )
    if (topic is None) != (partition is None):
        raise click.UsageError("--topic and --partition go together")
    pairs: list[TopicPartition] | None = None
    if topic is not None and partition is not None:
        pairs = [(topic, partition)]
    elif path_to_json_file is not None:
        try:
            pairs = parse_partitions_json(path_to_json_file.read_text())
        except OSError as e:
            raise click.ClickException(f"{path_to_json_file}: {e.strerror or e}") from None
        except ValueError as e:
            raise click.ClickException(f"{path_to_json_file}: {e}") from None
    kind = ElectionType[election_type.upper()]

    async def work(admin: AdminClient) -> dict[TopicPartition, AdminError | None]:
        results = await admin.elect_leaders(kind, pairs)
        elected = [tp for tp, error in results.items() if error is None]
        await _await_leaders(admin, kind, elected, conn.timeout)
        return results

    results = run_admin(conn, work, topic=topic)
    elected = [tp for tp, error in results.items() if error is None]
    not_needed = [tp for tp, e in results.items() if isinstance(e, ElectionNotNeededError)]
    failed = {
        tp: e
        for tp, e in sorted(results.items())
        if e is not None and not isinstance(e, ElectionNotNeededError)
    }
    name = kind.name
    if output_format == "json":
        print_json(
            {
                "election_type": name,
                "elected": [{"topic": t, "partition": p} for t, p in sorted(elected)],
                "not_needed": [{"topic": t, "partition": p} for t, p in sorted(not_needed)],
                "failed": [
                    {"topic": t, "partition": p, "error": e.message or e.code_name}
                    for (t, p), e in failed.items()
                ],
            }
        )
    else:
        if elected:
            click.echo(f"Successfully completed leader election ({name}) for partitions "
                       f"{_names(elected)}")  # fmt: skip
        if not_needed:
            click.echo(f"Valid replica already elected for partitions {_names(not_needed)}")
        if not results:
            click.echo(f"No partition needed a leader election ({name}).")
    for (t, p), error in failed.items():
        click.echo(
            f"Error completing leader election ({name}) for partition: {t}-{p}: "
            f"{' '.join((error.message or error.code_name).split())}",
            err=True,
        )
    if failed:
        raise SystemExit(1)
