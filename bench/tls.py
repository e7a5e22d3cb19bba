"""TLS benchmark: producer, consumer and end-to-end latency with mutual TLS on and off.

The same deployment twice in one run: one ``highwater controller`` and one ``highwater
broker`` on loopback, plaintext, and another with ``--tls-cert-file/--tls-key-file/--tls-ca-file``
(certificates from a throwaway CA, ECDSA P-256: mutual TLS between the broker and the
controller and towards the client). The client library in this process speaks TLS with a
client certificate of the same CA (``highwater.rpc.tls.configure``) for the TLS runs. The
workloads are the broker suite's (bench/broker.py): ``AsyncProducer`` with 100-byte
records (acks=1), ``AsyncConsumer`` from offset 0, and end-to-end latency at a paced rate
(acks=all). Both deployments run side by side and each throughput phase runs three times on
each, alternating between them, so that other work on the machine weighs on both alike; the
median trial counts. Target: TLS costs at most 15% of the throughput.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from bench._highwater_cluster import highwater_cluster
from bench._jetstream_peer import Counted
from bench.broker import (
    LATENCY_TOPIC,
    TOPIC,
    TRIALS,
    Sizes,
    Workloads,
    _guarded,
    consume_with_client,
    create_topic,
    latencies_with_client,
    produce_with_client,
)
from bench.report import Report, Row, SuiteSection, at_most, percentile, ratio_at_least

LATENCY_RATE = 5_000.0
TLS_COST_LIMIT = 0.15


@dataclass
class Deployment:
    """One deployment (plaintext, or TLS with ``pki``), its address and its figures."""

    name: str
    pki: Pki | None
    bootstrap: str = ""
    workloads: Workloads = field(default_factory=Workloads)


@dataclass(frozen=True)
class Pki:
    """The CA and the certificate files of one run."""

    root: Path

    @property
    def ca_file(self) -> Path:
        return self.root / "ca.crt"

    def files(self, name: str) -> tuple[Path, Path]:
        return self.root / f"{name}.crt", self.root / f"{name}.key"


def make_pki(root: Path) -> Pki:
    from highwater.security.certificate_authority import CertificateAuthority

    root.mkdir(parents=True, exist_ok=True)
    ca = CertificateAuthority("bench CA")
    pki = Pki(root)
    pki.ca_file.write_bytes(ca.certificate_pem)
    for name in ("controller", "broker"):
        ca.issue(name, hosts=["127.0.0.1", "localhost"]).write(*pki.files(name))
    ca.issue("bench-client", server=False).write(*pki.files("client"))
    return pki


def _server_tls_args(pki: Pki, process_name: str) -> list[str]:
    cert, key = pki.files("controller" if process_name.startswith("controller") else "broker")
    return [
        "--tls-cert-file",
        str(cert),
        "--tls-key-file",
        str(key),
        "--tls-ca-file",
        str(pki.ca_file),
    ]


@contextlib.contextmanager
def client_tls(pki: Pki | None) -> Iterator[None]:
    """This process's channels speak mutual TLS as ``bench-client`` while the block runs."""
    from highwater.rpc import tls

    if pki is None:
        yield
        return
    cert, key = pki.files("client")
    tls.configure(server=None, client=tls.ClientTls(pki.ca_file, cert, key))
    try:
        yield
    finally:
        tls.configure(server=None, client=None)


async def _trials(
    deployments: list[Deployment],
    phase: str,
    action: Callable[[str], Awaitable[Counted]],
    report: Report,
) -> None:
    """Run ``action(bootstrap)`` :data:`TRIALS` times on each deployment, alternating
    between them (so that the machine's other work weighs on both alike); each keeps its
    median trial as the phase's figure and every trial's rate."""
    trials: dict[str, list[Counted]] = {d.name: [] for d in deployments}
    for index in range(TRIALS):
        for deployment in deployments:
            if deployment.workloads.errors.get(phase):
                continue
            report.progress(f"tls: {deployment.name}: {phase} {index + 1}/{TRIALS}")
            with client_tls(deployment.pki):
                counted = await _guarded(
                    deployment.workloads.errors, phase, lambda d=deployment: action(d.bootstrap)
                )
            if counted is not None:
                trials[deployment.name].append(counted)
    for deployment in deployments:
        done = trials[deployment.name]
        deployment.workloads.trial_rates[phase] = [t.per_second for t in done]
        if len(done) == TRIALS:
            median = sorted(done, key=lambda t: t.per_second)[TRIALS // 2]
            setattr(deployment.workloads, _ATTRIBUTES[phase], median)


_ATTRIBUTES = {"produce": "produced", "consume": "consumed"}


async def measure(deployments: list[Deployment], sizes: Sizes, report: Report) -> None:
    """Producer, consumer and latency on every deployment."""
    for deployment in deployments:
        with client_tls(deployment.pki):
            for topic in (TOPIC, LATENCY_TOPIC):
                await create_topic(deployment.bootstrap, topic)
    await _trials(
        deployments,
        "produce",
        lambda bootstrap: produce_with_client(bootstrap, TOPIC, "1", sizes.records),
        report,
    )
    total = TRIALS * (sizes.records + 1)  # every trial's records and warm-up record
    await _trials(
        deployments,
        "consume",
        lambda bootstrap: consume_with_client(bootstrap, TOPIC, total),
        report,
    )
    for deployment in deployments:
        report.progress(f"tls: {deployment.name}: end-to-end latency")
        with client_tls(deployment.pki):
            latencies = await _guarded(
                deployment.workloads.errors,
                "latency",
                lambda d=deployment: latencies_with_client(
                    d.bootstrap,
                    LATENCY_TOPIC,
                    rate=LATENCY_RATE,
                    duration_s=sizes.latency_s,
                    warmup_s=sizes.warmup_s,
                ),
            )
        deployment.workloads.latencies_ms = sorted(latencies or [])


def run(report: Report) -> None:
    sizes = Sizes.for_scale(report.scale)
    with (
        report.suite("tls", "TLS on and off (`highwater.rpc.tls`)") as section,
        report.data_dir("tls", need_bytes=1024**3) as root,
        contextlib.ExitStack() as clusters,
    ):
        pki = make_pki(root / "pki")
        os.sync()
        report.progress("tls: one controller and one broker plaintext, and the same with TLS")
        plain = Deployment("plaintext", None)
        secured = Deployment("mutual TLS", pki)
        for deployment in (plain, secured):
            extra = None
            if deployment.pki is not None:
                extra = functools.partial(_server_tls_args, deployment.pki)
            with client_tls(deployment.pki):  # the cluster's readiness checks use it
                cluster = clusters.enter_context(
                    highwater_cluster(root / deployment.name.replace(" ", "-"), 1, extra_args=extra)
                )
            deployment.bootstrap = cluster.bootstrap
        asyncio.run(measure([plain, secured], sizes, report))
        _rows(section, plain.workloads, secured.workloads)
        _notes(section, sizes, plain.workloads, secured.workloads)


def _rate(counted: Counted | None) -> float | None:
    return counted.per_second if counted is not None else None


def _rows(section: SuiteSection, plain: Workloads, secured: Workloads) -> None:
    floor = ratio_at_least(1 - TLS_COST_LIMIT, "plaintext")
    for phase, label, attribute in (
        ("produce", "producer, client library, 100-byte records, 1 broker, acks=1", "produced"),
        ("consume", "consumer, client library, from offset 0, 1 broker", "consumed"),
    ):
        ours: Counted | None = getattr(secured, attribute)
        theirs: Counted | None = getattr(plain, attribute)
        section.add(
            Row(
                f"{label}: mutual TLS",
                _rate(ours),
                "records/s",
                peer_name="the same, plaintext",
                peer_value=_rate(theirs),
                target=floor,
                extra=secured.trials_text(phase),
                error=secured.errors.get(phase) or secured.errors.get("all", "did not run"),
                peer_extra=plain.trials_text(phase),
            )
        )
    for name in ("p50", "p99"):
        p = float(name[1:])
        mine, theirs_ms = secured.latencies_ms, plain.latencies_ms
        section.add(
            Row(
                f"end-to-end latency {name}, produce() to consumer receipt, "
                f"{LATENCY_RATE:,.0f} records/s, 1 broker, acks=all: mutual TLS",
                percentile(mine, p) if mine else None,
                "ms",
                peer_name="the same, plaintext",
                peer_value=percentile(theirs_ms, p) if theirs_ms else None,
                target=at_most(15.0 if name == "p99" else 3.0, "ms"),
                extra=f"{len(mine):,} records" if mine else "",
                error=secured.errors.get("latency") or secured.errors.get("all", "did not run"),
            )
        )


def _notes(section: SuiteSection, sizes: Sizes, plain: Workloads, secured: Workloads) -> None:
    section.note(
        "Two deployments side by side, each one `highwater controller` and one "
        "`highwater broker` on loopback: one plaintext, one with "
        "`--tls-cert-file/--tls-key-file/--tls-ca-file` (ECDSA P-256 certificates "
        "of a throwaway CA, client certificates required: the broker's registration and "
        "heartbeats to the controller and every client call are mutual TLS). The client "
        "library runs in the benchmark's process with a client certificate of the same CA. "
        f"Producer: {sizes.records:,} records per trial, the broker suite's settings; "
        f"consumer: every record the trials wrote, from offset 0; each throughput phase "
        f"{TRIALS} times on each deployment, alternating, the median trial counts. "
        f"Latency: {LATENCY_RATE:,.0f} records/s "
        f"for {sizes.latency_s:.0f} s after {sizes.warmup_s:.0f} s of warm-up, acks=all. "
        f"Target: TLS costs at most {TLS_COST_LIMIT:.0%} of the throughput; "
        "the latency targets are the broker suite's."
    )
    section.note(
        "Run alone with `.venv/bin/python -m bench tls` (`make bench` runs it with the other "
        "suites). The load average above is the whole machine's: other work running beside "
        "the benchmark weighs on both deployments alike, since their trials alternate."
    )
    for name, workloads in (("plaintext", plain), ("mutual TLS", secured)):
        for what, error in workloads.errors.items():
            section.note(f"{name}: {what} failed: `{error}`.")
