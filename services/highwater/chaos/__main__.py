"""The chaos harness's command line: ``run`` one seeded run, ``check`` a history file,
``campaign`` several runs and a report."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from highwater.chaos.checker import check
from highwater.chaos.cluster import QUORUM_MODES, ClusterStartError
from highwater.chaos.history import read_history
from highwater.chaos.report import campaign_totals, markdown_report
from highwater.chaos.run import (
    RunOptions,
    Terminated,
    excerpt,
    raise_terminated,
    run,
    summarize,
)
from highwater.chaos.schedule import parse_faults, parse_seeds


def _faults(_ctx: click.Context, _param: click.Parameter, value: str) -> tuple[str, ...]:
    try:
        return parse_faults(value)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None


def _seeds(_ctx: click.Context, _param: click.Parameter, value: str) -> list[int]:
    try:
        return parse_seeds(value)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None


F = TypeVar("F", bound=Callable[..., Any])


def _quorum_option(default: str) -> Callable[[F], F]:
    """``--quorum``, for ``run`` and ``campaign`` (which differ in its default)."""
    return click.option(
        "--quorum",
        type=click.Choice(QUORUM_MODES),
        default=default,
        show_default=True,
        help="The controllers' quorum: static (--voters) or dynamic (KIP-853, as the Helm "
        "chart runs it); the wipe fault hits controllers only in a dynamic quorum of three "
        "or more.",
    )


def _echo(text: str) -> None:
    click.echo(text, err=True)


CLUSTER_NOT_STARTED = 3
"""The exit status of a ``run`` whose cluster did not come up (nothing was checked)."""


@click.group()
def main() -> None:
    """Jepsen-style fault tests of a local Highwater cluster (docs/chaos.md)."""


def entry() -> None:
    """:func:`main`, with SIGTERM ending a run cleanly (every process it started stopped)."""
    try:
        main()
    except Terminated:
        _echo("terminated: every process the run started is stopped")
        sys.exit(143)


@main.command("run")
@click.option("--seed", type=int, required=True, help="The schedule's seed.")
@click.option("--duration", type=click.FloatRange(min=5), default=60, show_default=True, help="s")
@click.option(
    "--faults",
    default="kill,pause",
    show_default=True,
    callback=_faults,
    help="Comma-separated: kill, pause, partition, disk, wipe.",
)
@click.option("--controllers", type=click.IntRange(1, 5), default=1, show_default=True)
@_quorum_option(default="static")
@click.option("--brokers", type=click.IntRange(3, 5), default=3, show_default=True)
@click.option("--coordinators", type=click.IntRange(1, 3), default=1, show_default=True)
@click.option(
    "--fuzz",
    "fuzz_rate",
    type=click.FloatRange(min=0),
    default=0,
    show_default=True,
    help="Fuzzed requests per second to every gRPC endpoint during the run (0: none).",
)
@click.option(
    "--secure",
    is_flag=True,
    help="Run the cluster secured: mutual TLS from a throwaway CA, ACLs on, SASL offered "
    "(the harness, its workload and its fuzzer speak as the super user User:admin).",
)
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where the history, logs, summary and timeline go (default: a new temporary directory).",
)
def run_command(
    seed: int,
    duration: float,
    faults: tuple[str, ...],
    controllers: int,
    quorum: str,
    brokers: int,
    coordinators: int,
    fuzz_rate: float,
    secure: bool,
    out: Path | None,
) -> None:
    """One seeded run; the last line printed is its JSON summary."""
    out_dir = out or Path(tempfile.mkdtemp(prefix=f"highwater-chaos-{seed}-"))
    try:
        summary = run(
            RunOptions(
                seed,
                duration,
                faults,
                out_dir,
                controllers,
                brokers,
                coordinators,
                fuzz_rate,
                secure=secure,
                quorum=quorum,
            ),
            echo=_echo,
        )
    except ClusterStartError as e:  # every process it started is stopped already
        _echo(f"seed {seed}: the cluster did not start: {e}")
        sys.exit(CLUSTER_NOT_STARTED)
    _echo(f"history: {out_dir / 'history.jsonl'}")
    click.echo(json.dumps(summary))
    sys.exit(1 if summary["anomalies"] else 0)


@main.command("check")
@click.argument("history", type=click.Path(exists=True, dir_okay=False, path_type=Path))
def check_command(history: Path) -> None:
    """Check a history file again; the last line is the JSON summary."""
    ops = read_history(history)
    result = check(ops)
    for line in excerpt(ops, result):
        _echo(line)
    faults = sum(1 for op in ops if op.get("kind") == "fault")
    setup = next((op for op in ops if "seed" in op), {})
    seed = int(setup.get("seed", -1))
    duration = float(setup.get("duration_s", max((float(op["t"]) for op in ops), default=0.0)))
    click.echo(json.dumps(summarize(seed, duration, faults, result)))
    sys.exit(1 if result.anomalies else 0)


@main.command("campaign")
@click.option(
    "--seeds",
    default="1,2,3",
    show_default=True,
    callback=_seeds,
    help="Comma-separated seeds and ranges (1-200).",
)
@click.option("--duration", type=click.FloatRange(min=5), default=180, show_default=True)
@click.option(
    "--faults", default="kill,pause,partition,disk,wipe", show_default=True, callback=_faults
)
@click.option("--controllers", type=click.IntRange(1, 5), default=3, show_default=True)
@_quorum_option(default="dynamic")
@click.option("--brokers", type=click.IntRange(3, 5), default=3, show_default=True)
@click.option("--coordinators", type=click.IntRange(1, 3), default=2, show_default=True)
@click.option("--fuzz", "fuzz_rate", type=click.FloatRange(min=0), default=5, show_default=True)
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), required=True)
def campaign_command(
    seeds: list[int],
    duration: float,
    faults: tuple[str, ...],
    controllers: int,
    quorum: str,
    brokers: int,
    coordinators: int,
    fuzz_rate: float,
    out: Path,
) -> None:
    """Several seeded runs, one after the other, and ``report.md``: the totals, and each
    run's summary with its timeline plot (rewritten after every run).

    Each run is a ``run`` command of its own process: a run moves its process into its
    network namespaces, and threads that gRPC started in an earlier run of the same
    process stay in that run's (deleted) namespace, so a third run in one process could
    not reach its own cluster."""
    out.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, raise_terminated)  # entry() reports it
    runs: list[tuple[dict[str, Any], str]] = []
    not_started: list[int] = []
    for seed in seeds:
        summary = _run_in_process(
            seed,
            [
                *("--duration", str(duration), "--faults", ",".join(faults)),
                *("--controllers", str(controllers), "--quorum", quorum),
                *("--brokers", str(brokers)),
                *("--coordinators", str(coordinators), "--fuzz", str(fuzz_rate)),
                *("--out", str(out / f"seed-{seed}")),
            ],
        )
        if summary is None:
            _echo(f"seed {seed}: not run")
            not_started.append(seed)
            (out / "report.md").write_text(markdown_report(runs, not_started=not_started))
            continue
        click.echo(json.dumps(summary))
        runs.append((summary, f"seed-{seed}/timeline.svg"))
        (out / "report.md").write_text(markdown_report(runs, not_started=not_started))
    _echo(f"report: {out / 'report.md'}")
    sys.exit(1 if any(s["anomalies"] for s, _ in runs) else 0)


def _run_in_process(seed: int, args: list[str]) -> dict[str, Any] | None:
    """``run --seed SEED ARGS`` in a child process; its summary, or None when it ended
    without one (its cluster did not start, or it failed). SIGTERM to the campaign ends
    the child cleanly first."""
    child = subprocess.Popen(
        [sys.executable, "-m", "highwater.chaos", "run", "--seed", str(seed), *args],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        output, _ = child.communicate()
    except BaseException:  # Terminated, KeyboardInterrupt: stop the run's processes too
        child.terminate()
        child.wait()
        raise
    lines = output.strip().splitlines()
    if child.returncode not in (0, 1) or not lines:
        return None
    try:
        summary: dict[str, Any] = json.loads(lines[-1])
    except json.JSONDecodeError:
        return None
    return summary


@main.command("report")
@click.argument("out", type=click.Path(exists=True, file_okay=False, path_type=Path))
def report_command(out: Path) -> None:
    """Check the history of every run of a campaign directory again (``seed-N/``) and
    write its ``report.md``: for a campaign stopped part-way, or checked by a newer
    checker. The last line is the totals as JSON."""
    runs: list[tuple[dict[str, Any], str]] = []
    not_finished: list[int] = []
    for history in sorted(
        out.glob("seed-*/history.jsonl"), key=lambda p: int(p.parent.name.split("-")[1])
    ):
        ops = read_history(history)
        if not any(op.get("kind") in ("final", "replica") for op in ops):
            _echo(f"{history}: the run did not finish; left out")
            not_finished.append(int(history.parent.name.split("-")[1]))
            continue
        setup = next((op for op in ops if "seed" in op), {})
        faults = sum(1 for op in ops if op.get("kind") == "fault")
        summary = summarize(
            int(setup.get("seed", history.parent.name.split("-")[1])),
            float(setup.get("duration_s", 0.0)),
            faults,
            check(ops),
        )
        runs.append((summary, f"{history.parent.name}/timeline.svg"))
    (out / "report.md").write_text(markdown_report(runs, not_started=not_finished))
    _echo(f"report: {out / 'report.md'}")
    click.echo(json.dumps({**campaign_totals([s for s, _ in runs]), "not_finished": not_finished}))
    sys.exit(1 if any(s["anomalies"] for s, _ in runs) else 0)


if __name__ == "__main__":
    entry()
