"""Telemetry benchmark: producer throughput with telemetry off, metrics only, and tracing.

Each mode runs a fresh cluster (one controller, one broker, ``bench/_highwater_cluster.py``)
and the broker suite's producer (300,000 100-byte records, acks=1, the client library) in a
process of its own, three times; the best run counts. The modes:

- *before instrumentation*: the servers and the client as they were in the commit before
  ``highwater.telemetry`` was added (``git archive`` of that commit's ``services/`` on
  PYTHONPATH): the peer the others are measured against;
- *telemetry off*: today's code, nothing configured (no exporter, no ``--metrics-listen``);
- *metrics only*: ``--metrics-listen`` on every server (scraped every second, as Prometheus
  would), the producer with an SDK meter provider;
- *tracing, every record*: every process exports spans over OTLP to a sink process (an
  OTLP endpoint that discards), sampler ``always_on``: a ``send`` span per record, server
  spans per call, replication and Raft spans;
- *tracing, 1 % sampled*: the same with ``parentbased_traceidratio`` 0.01.

The target: with telemetry off, at least 95 % of the throughput before instrumentation.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from bench import broker
from bench._etcd_peer import free_port
from bench._highwater_cluster import highwater_cluster
from bench.report import Report, Row, SuiteSection, ratio_at_least

TOPIC = "bench-telemetry"
RUNS = 3
REPO = Path(__file__).resolve().parent.parent
BASELINE_NAME = "before instrumentation"


@dataclass
class Mode:
    name: str
    producer_mode: str
    env: dict[str, str] = field(default_factory=dict)
    metrics: bool = False
    baseline_services: Path | None = None


def _baseline_commit() -> str:
    """The commit before the one that added ``services/highwater/telemetry``."""
    added = subprocess.run(
        [
            "git",
            "log",
            "--diff-filter=A",
            "--format=%H",
            "--",
            "services/highwater/telemetry/__init__.py",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    if not added:
        raise RuntimeError("no commit adds services/highwater/telemetry in this checkout")
    return f"{added[-1]}^"


def _extract_services(commit: str, into: Path) -> Path:
    """``services/`` of ``commit`` under ``into``; the directory to put on PYTHONPATH."""
    archive = subprocess.run(
        ["git", "archive", "--format=tar", commit, "services"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into / "services"


@contextlib.contextmanager
def otlp_sink(root: Path) -> Iterator[str]:
    """The discarding OTLP endpoint as a process; its ``http://127.0.0.1:PORT``."""
    port_file = root / "otlp-sink.port"
    process = subprocess.Popen(
        [sys.executable, "-m", "bench._otlp_sink", str(port_file)],
        cwd=REPO,
        stdin=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while not port_file.exists() or not port_file.read_text():
            if time.monotonic() > deadline or process.poll() is not None:
                raise RuntimeError("the OTLP sink did not start")
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port_file.read_text()}"
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextlib.contextmanager
def scraping(urls: list[str]) -> Iterator[None]:
    """Read every URL once a second in a thread, as a Prometheus server would."""
    stop = threading.Event()

    def scrape() -> None:
        while not stop.wait(1.0):
            for url in urls:
                with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=5) as reply:
                    reply.read()

    thread = threading.Thread(target=scrape, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def _produce(bootstrap: str, records: int, mode: Mode) -> float:
    """One producer process; its records/s."""
    env = {**os.environ, **mode.env}
    if mode.baseline_services is not None:
        env["PYTHONPATH"] = f"{mode.baseline_services}{os.pathsep}{REPO}"
    else:
        env["PYTHONPATH"] = str(REPO)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench._telemetry_producer",
            bootstrap,
            TOPIC,
            str(records),
            mode.producer_mode,
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode != 0:
        raise RuntimeError(f"the producer failed: {done.stderr.strip().splitlines()[-1:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return float(result["records"]) / float(result["seconds"])


def _measure(root: Path, mode: Mode, records: int, report: Report) -> float:
    """The best of :data:`RUNS` producer runs against a fresh cluster in ``mode``."""
    env = dict(mode.env)
    if mode.baseline_services is not None:
        env["PYTHONPATH"] = str(mode.baseline_services)
    metrics_urls: list[str] = []

    def extra_args(_name: str) -> list[str]:
        if not mode.metrics:
            return []
        address = f"127.0.0.1:{free_port()}"
        metrics_urls.append(f"http://{address}/metrics")
        return ["--metrics-listen", address]

    cluster_root = root / mode.name.replace(" ", "-").replace(",", "").replace("%", "pct")
    with highwater_cluster(cluster_root, 1, env=env, extra_args=extra_args) as cluster:
        asyncio.run(broker.create_topic(cluster.bootstrap, TOPIC, replication_factor=1))
        leader = asyncio.run(broker.leader_address(cluster, TOPIC))
        asyncio.run(broker.wait_full_isr(leader, TOPIC, 1, 1))
        best = 0.0
        with scraping(metrics_urls):
            for run in range(RUNS):
                report.progress(f"telemetry: {mode.name}, run {run + 1} of {RUNS}")
                best = max(best, _produce(cluster.bootstrap, records, mode))
    return best


def run(report: Report) -> None:
    records = max(10_000, int(300_000 * report.scale))
    with (
        report.suite("telemetry", "Telemetry (`highwater.telemetry`)") as section,
        report.data_dir("telemetry") as root,
        otlp_sink(root) as endpoint,
    ):
        tracing = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
            "OTEL_EXPORTER_OTLP_INSECURE": "true",
            "OTEL_METRICS_EXPORTER": "none",
        }
        baseline_commit = _baseline_commit()
        modes = [
            Mode(
                BASELINE_NAME,
                "none",
                baseline_services=_extract_services(baseline_commit, root / "baseline"),
            ),
            Mode("telemetry off", "none"),
            Mode("metrics only", "metrics", metrics=True),
            Mode(
                "tracing, every record",
                "tracing",
                env={**tracing, "OTEL_TRACES_SAMPLER": "always_on"},
            ),
            Mode(
                "tracing, 1 % sampled",
                "tracing",
                env={
                    **tracing,
                    "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
                    "OTEL_TRACES_SAMPLER_ARG": "0.01",
                },
            ),
        ]
        rates: dict[str, float | None] = {}
        errors: dict[str, str] = {}
        for mode in modes:
            try:
                rates[mode.name] = _measure(root, mode, records, report)
            except Exception as e:  # a mode that fails is a row that says why
                rates[mode.name], errors[mode.name] = None, str(e) or type(e).__name__
        baseline = rates[BASELINE_NAME]
        for mode in modes:
            value = rates[mode.name]
            is_baseline = mode.name == BASELINE_NAME
            section.add(
                Row(
                    f"producer, 100-byte records, 1 broker, acks=1: {mode.name}",
                    value,
                    "records/s",
                    peer_name="" if is_baseline else f"{BASELINE_NAME} (git {baseline_commit})",
                    peer_value=None if is_baseline else baseline,
                    target=ratio_at_least(0.95, BASELINE_NAME)
                    if mode.name == "telemetry off"
                    else None,
                    extra=f"best of {RUNS} runs of {records:,} records",
                    error=errors.get(mode.name, ""),
                )
            )
        _notes(section, records, baseline_commit)


def _notes(section: SuiteSection, records: int, baseline_commit: str) -> None:
    section.note(
        f"Each row: a fresh `highwater controller` and `highwater broker` (processes on "
        f"loopback), one topic of one partition, and the broker suite's producer "
        f"(`AsyncProducer`, linger.ms 5, batch.size 131,072, {records:,} records with a "
        f"delivery callback each) in a process of its own, {RUNS} times; the best run counts. "
        f"The peer is the same workload on the code of `{baseline_commit}`, the commit before "
        "telemetry was added (servers and client both)."
    )
    section.note(
        "Metrics only: every server with `--metrics-listen`, each endpoint read once a second "
        "during the runs; the producer with an SDK meter provider (in-memory reader). "
        "Tracing: every process with `OTEL_EXPORTER_OTLP_ENDPOINT` pointing at a process that "
        "accepts OTLP and discards it (`bench/_otlp_sink.py`), batch span processors with "
        "their default settings; with `always_on` each record has a `send` span and a "
        "`traceparent` header (55 bytes more per record)."
    )
