"""The Kafka listener's benchmarks: librdkafka (confluent-kafka) against ``--kafka-listen``.

Highwater runs as real processes on loopback (``bench/_highwater_cluster.py``), every broker
with a Kafka listener: one controller and one broker (acks=1), then one controller and
three brokers (replication factor 3, acks=all, ``min.insync.replicas=2``). From this
process, confluent-kafka's ``Producer`` (librdkafka, a C client: batching and compression
in its own threads) produces 100-byte records to one partition, and its ``Consumer`` reads
them back from offset 0; beside them, in the same run, the project's Python client over
gRPC does the same (``bench.broker``'s workloads), so the two doors are compared on the
same cluster. Each phase runs three times and the median trial is reported.

Beside them, two C clients: kcat (Debian's package; it reads its records as lines of a
file and prints each record it consumes) and ``bench/kafka_perf/perf_client.c``, a load
generator in the manner of Kafka's ``kafka-producer-perf-test`` and librdkafka's
``rdkafka_performance`` (one pre-built 100-byte payload handed to librdkafka uncopied, in
slices of 10,000 records per ``rd_kafka_produce_batch``; records counted, not looked at,
as they are consumed), built here with gcc against Debian's ``librdkafka-dev``
(``make bench-deps``). Its cost per record is librdkafka's alone, so the broker is what it
measures; the CPU-seconds of the leader broker and of the client are noted per phase.

Where the broker's time goes: the one-broker phase is run again against a broker under
cProfile (producing and consuming with the C load generator, else confluent-kafka), and the
functions with the most own time are shown.
"""

from __future__ import annotations

import asyncio
import os
import pstats
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bench._highwater_cluster import free_port, highwater_cluster
from bench._jetstream_peer import Counted
from bench.broker import (
    PAYLOAD,
    TRIALS,
    consume_with_client,
    create_topic,
    leader_address,
    produce_with_client,
    wait_full_isr,
)
from bench.report import REPO_ROOT, Report, Row, at_least, profile_entry_name

TOPIC = "kafka-bench"
GRPC_TOPIC = "kafka-bench-grpc"
KCAT_TOPIC = "kafka-bench-kcat"
PERF_TOPIC = "kafka-bench-c"
SPREAD_TOPIC = "kafka-bench-c-spread"
SPREAD_PARTITIONS = 2
"""The partitioned consume: partitions of one topic on the one leader, one consumer each."""
PERF_CLIENT_SOURCE = Path(__file__).parent / "kafka_perf" / "perf_client.c"
PRODUCE_TARGET = 1_000_000.0
CONSUME_TARGET = 1_500_000.0
PRODUCER_CONFIG = {
    "linger.ms": 5,
    "batch.size": 1_000_000,
    "batch.num.messages": 100_000,
    "queue.buffering.max.messages": 2_000_000,
    "queue.buffering.max.kbytes": 1_048_576,
    "compression.type": "none",
    # A delivery report per record is a Python callback per record, in this process: only
    # the failures are reported, so the producer's cost is librdkafka's, not the callbacks'.
    "delivery.report.only.error": True,
}


def process_cpu_s(pid: int) -> float:
    """User and system CPU seconds process ``pid`` has used (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def own_cpu_s() -> float:
    """This process's CPU seconds and its reaped children's (the client: Python and
    librdkafka's threads, or the kcat processes a phase ran and waited for)."""
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


@dataclass
class Phases:
    """What one cluster measured: phase name to the median trial, every trial's rate, and
    the CPU seconds the leader broker and the client spent over all trials of a phase."""

    leader_pid: int = 0
    counted: dict[str, Counted] = field(default_factory=dict)
    rates: dict[str, list[float]] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    records: dict[str, int] = field(default_factory=dict)
    """phase -> records moved over all its trials."""
    cpu: dict[str, tuple[float, float, float]] = field(default_factory=dict)
    """phase -> (leader broker CPU s, client CPU s, wall s), all trials together."""

    def run(self, name: str, action: Callable[[], Counted]) -> None:
        broker_before, client_before = process_cpu_s(self.leader_pid), own_cpu_s()
        started = time.perf_counter()
        try:
            trials = [action() for _ in range(TRIALS)]
        except Exception as error:  # one failed phase must not hide the others
            self.errors[name] = f"{type(error).__name__}: {error}"[:200]
            return
        self.cpu[name] = (
            process_cpu_s(self.leader_pid) - broker_before,
            own_cpu_s() - client_before,
            time.perf_counter() - started,
        )
        self.rates[name] = [t.per_second for t in trials]
        self.records[name] = sum(t.records for t in trials)
        self.counted[name] = sorted(trials, key=lambda t: t.per_second)[len(trials) // 2]

    def broker_cpu_per_million(self, name: str) -> str:
        """The leader broker's CPU seconds per million records of phase ``name``: what the
        rate means on a shared machine (the records/s a core would give is 1e6 / this)."""
        if name not in self.cpu:
            return ""
        broker, client, _wall = self.cpu[name]
        per_million = 1_000_000 / max(1, self.records[name])
        return (
            f"<br>leader broker {broker * per_million:.2f} CPU-s per million records, "
            f"client {client * per_million:.2f}"
        )

    def cpu_text(self, name: str) -> str:
        if name not in self.cpu:
            return ""
        broker, client, wall = self.cpu[name]
        return (
            f"{name}: leader broker {broker:.1f} s CPU, client {client:.1f} s CPU, in {wall:.1f} s"
        )


def produce_librdkafka(bootstrap: str, topic: str, acks: str, records: int) -> Counted:
    """``records`` 100-byte records by confluent-kafka's Producer; every report checked."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "acks": acks, **PRODUCER_CONFIG})
    failures: list[object] = []

    def delivered(error: object, _message: object) -> None:
        if error is not None:
            failures.append(error)

    producer.produce(topic, PAYLOAD, on_delivery=delivered)  # metadata, not timed
    producer.flush(30)
    produce = producer.produce
    started = time.perf_counter()
    for _ in range(records):
        try:
            produce(topic, PAYLOAD, on_delivery=delivered)
        except BufferError:
            producer.poll(0.005)
            produce(topic, PAYLOAD, on_delivery=delivered)
    left = producer.flush(120)
    elapsed = time.perf_counter() - started
    if failures or left:
        raise RuntimeError(f"{len(failures)} records failed, {left} undelivered: {failures[:1]}")
    return Counted(records, elapsed)


KCAT_LINE = bytes(48 + i % 64 for i in range(100)) + b"\n"
"""One 100-byte printable record per line: kcat -l produces each line (newline dropped)."""


def produce_kcat(root: Path, bootstrap: str, topic: str, acks: str, records: int) -> Counted:
    """``records`` 100-byte records by kcat (librdkafka in C, no Python in the loop)."""
    lines = root / f"kcat-{records}.txt"
    if not lines.exists():
        lines.write_bytes(KCAT_LINE * records)
    settings = [f"{k}={v}" for k, v in PRODUCER_CONFIG.items() if k != "delivery.report.only.error"]
    command = ["kcat", "-P", "-b", bootstrap, "-t", topic, "-p", "0", "-X", f"acks={acks}"]
    for setting in settings:
        command += ["-X", setting]
    started = time.perf_counter()
    done = subprocess.run([*command, "-l", str(lines)], capture_output=True, timeout=300)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"kcat -P exited {done.returncode}: {done.stderr[-300:]!r}")
    return Counted(records, elapsed)


def consume_kcat(bootstrap: str, topic: str, records: int) -> Counted:
    """Read ``records`` records of partition 0 from offset 0 by kcat, output discarded."""
    command = ["kcat", "-C", "-b", bootstrap, "-t", topic, "-p", "0", "-o", "beginning",
               "-c", str(records), "-e", "-q", "-X", "fetch.max.bytes=52428800",
               "-X", "max.partition.fetch.bytes=10485760",
               "-X", "queued.min.messages=1000000"]  # fmt: skip
    started = time.perf_counter()
    done = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=300)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"kcat -C exited {done.returncode}: {done.stderr[-300:]!r}")
    return Counted(records, elapsed)


def build_perf_client(root: Path) -> Path:
    """``perf_client.c`` compiled into ``root`` (gcc, librdkafka's headers and library).

    :raises RuntimeError: no compiler, no ``librdkafka-dev`` (``make bench-deps``)."""
    compiler = shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        raise RuntimeError("no C compiler (make bench-deps installs gcc)")
    root.mkdir(parents=True, exist_ok=True)
    binary = root / "perf_client"
    done = subprocess.run(
        [compiler, "-O2", "-Wall", "-o", str(binary), str(PERF_CLIENT_SOURCE), "-lrdkafka"],
        capture_output=True,
        timeout=120,
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"building perf_client failed (librdkafka-dev, make bench-deps): {done.stderr[-300:]!r}"
        )
    return binary


def _perf_client(command: list[str]) -> Counted:
    """Run the C load generator; its timed part as it measured it."""
    done = subprocess.run(command, capture_output=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"perf_client exited {done.returncode}: {done.stderr[-300:]!r}")
    fields = dict(item.split("=", 1) for item in done.stdout.decode().split())
    return Counted(int(fields["records"]), float(fields["seconds"]))


def produce_perf_client(
    binary: Path, bootstrap: str, topic: str, acks: str, records: int
) -> Counted:
    """``records`` 100-byte records by the C load generator, every delivery report checked."""
    settings = [f"{k}={v}" for k, v in PRODUCER_CONFIG.items() if k != "delivery.report.only.error"]
    return _perf_client(
        [str(binary), "produce", bootstrap, topic, str(records), f"acks={acks}", *settings]
    )


def consume_perf_client(
    binary: Path, bootstrap: str, topic: str, records: int, partitions: int = 1
) -> Counted:
    """Read ``records`` records from the first offsets of partitions ``0..partitions-1``
    by the C load generator, one consumer (librdkafka instance, its own connection) per
    partition (the timed part includes finding the leader and the first fetch)."""
    spread = [f"perf.partitions={partitions}", f"perf.consumers={partitions}"]
    return _perf_client(
        [str(binary), "consume", bootstrap, topic, str(records), *CONSUMER_FETCH_CONFIG,
         *(spread if partitions > 1 else [])]
    )  # fmt: skip


def fill_partitions(
    binary: Path, bootstrap: str, topic: str, acks: str, records: int, partitions: int
) -> None:
    """``records`` 100-byte records into each of partitions ``0..partitions-1`` by the C
    load generator (not timed: what the partitioned consume reads)."""
    settings = [f"{k}={v}" for k, v in PRODUCER_CONFIG.items() if k != "delivery.report.only.error"]
    for partition in range(partitions):
        _perf_client(
            [str(binary), "produce", bootstrap, topic, str(records), f"acks={acks}",
             f"perf.partition={partition}", *settings]
        )  # fmt: skip


CONSUMER_FETCH_CONFIG = [
    "fetch.max.bytes=52428800",
    "max.partition.fetch.bytes=10485760",
    "queued.min.messages=1000000",
    "fetch.wait.max.ms=100",
]
"""The C consumer's settings: the fetch sizes confluent-kafka's consumer here asks for."""


def consume_librdkafka(bootstrap: str, topic: str, records: int) -> Counted:
    """Read ``records`` records of partition 0 from offset 0 by confluent-kafka's Consumer."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "kafka-bench",
            "enable.auto.commit": False,
            "fetch.max.bytes": 52_428_800,
            "max.partition.fetch.bytes": 10_485_760,
            "queued.min.messages": 1_000_000,
            "fetch.wait.max.ms": 100,
        }
    )
    seen = 0
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        started = time.perf_counter()
        deadline = started + 120
        while seen < records and time.perf_counter() < deadline:
            batch = consumer.consume(10_000, 1.0)
            for message in batch:
                if message.error() is not None:
                    raise RuntimeError(f"consumer error: {message.error()}")
            seen += len(batch)
        elapsed = time.perf_counter() - started
    finally:
        consumer.close()
    if seen < records:
        raise RuntimeError(f"read {seen} of {records} records in 120 s")
    return Counted(seen, elapsed)


def measure(
    root: Path, brokers: int, records: int, report: Report, perf_client: Path | None
) -> Phases:
    kafka_ports: dict[str, int] = {}

    def extra(name: str) -> list[str]:
        if not name.startswith("broker"):
            return []
        kafka_ports[name] = free_port()
        return ["--kafka-listen", f"127.0.0.1:{kafka_ports[name]}"]

    phases = Phases()
    acks, grpc_acks = ("all", "all") if brokers > 1 else ("1", "1")
    config = {"min.insync.replicas": "2"} if brokers > 1 else None
    with highwater_cluster(root, brokers, extra_args=extra) as cluster:
        bootstrap = ",".join(f"127.0.0.1:{p}" for p in kafka_ports.values())

        # Every topic led by the same broker (the first of its replicas), so that one
        # process's CPU is each phase's leader's.
        replicas = sorted(cluster.broker_addresses)

        async def prepare() -> None:
            for topic in (TOPIC, GRPC_TOPIC, KCAT_TOPIC, PERF_TOPIC, SPREAD_TOPIC):
                partitions = SPREAD_PARTITIONS if topic == SPREAD_TOPIC else 1
                await create_topic(
                    cluster.bootstrap,
                    topic,
                    assignment={p: replicas for p in range(partitions)},
                    config=config,
                )
                leader = await leader_address(cluster, topic)
                await wait_full_isr(leader, topic, partitions, brokers)

        asyncio.run(prepare())
        led = [(t, 0) for t in (TOPIC, GRPC_TOPIC, KCAT_TOPIC, PERF_TOPIC)]
        led += [(SPREAD_TOPIC, p) for p in range(SPREAD_PARTITIONS)]
        for topic, partition in led:
            leader = asyncio.run(leader_address(cluster, topic, partition))
            (leader_id,) = [n for n, a in cluster.broker_addresses.items() if a == leader]
            if phases.leader_pid and cluster.brokers[leader_id].pid != phases.leader_pid:
                raise RuntimeError(
                    f"{topic} [{partition}] is led by broker {leader_id}, not the others' leader"
                )
            phases.leader_pid = cluster.brokers[leader_id].pid
        if shutil.which("kcat"):
            report.progress(f"kafka: {brokers} broker(s): kcat producer (acks={acks})")
            phases.run(
                "kcat produce", lambda: produce_kcat(root, bootstrap, KCAT_TOPIC, acks, records)
            )
            report.progress(f"kafka: {brokers} broker(s): kcat consumer")
            kcat_total = records * TRIALS
            phases.run("kcat consume", lambda: consume_kcat(bootstrap, KCAT_TOPIC, kcat_total))
        if perf_client is not None:
            binary = perf_client
            report.progress(f"kafka: {brokers} broker(s): C load generator (acks={acks})")
            phases.run(
                "c produce",
                lambda: produce_perf_client(binary, bootstrap, PERF_TOPIC, acks, records),
            )
            report.progress(f"kafka: {brokers} broker(s): C load generator consuming")
            c_total = records * TRIALS
            phases.run(
                "c consume", lambda: consume_perf_client(binary, bootstrap, PERF_TOPIC, c_total)
            )
            report.progress(
                f"kafka: {brokers} broker(s): C load generator consuming {SPREAD_PARTITIONS} "
                "partitions with as many consumers"
            )
            fill_partitions(
                binary, bootstrap, SPREAD_TOPIC, acks, c_total // SPREAD_PARTITIONS,
                SPREAD_PARTITIONS,
            )  # fmt: skip
            spread_total = c_total // SPREAD_PARTITIONS * SPREAD_PARTITIONS
            phases.run(
                "c consume spread",
                lambda: consume_perf_client(
                    binary, bootstrap, SPREAD_TOPIC, spread_total, SPREAD_PARTITIONS
                ),
            )
        report.progress(f"kafka: {brokers} broker(s): librdkafka producer (acks={acks})")
        phases.run("produce", lambda: produce_librdkafka(bootstrap, TOPIC, acks, records))
        report.progress(f"kafka: {brokers} broker(s): librdkafka consumer")
        total = records * TRIALS + 1
        phases.run("consume", lambda: consume_librdkafka(bootstrap, TOPIC, total))
        report.progress(f"kafka: {brokers} broker(s): Python client over gRPC, beside")
        phases.run(
            "grpc produce",
            lambda: asyncio.run(
                produce_with_client(cluster.bootstrap, GRPC_TOPIC, grpc_acks, records)
            ),
        )
        phases.run(
            "grpc consume",
            lambda: asyncio.run(
                consume_with_client(cluster.bootstrap, GRPC_TOPIC, records * TRIALS + 1)
            ),
        )
    return phases


def profile_broker(root: Path, records: int, perf_client: Path | None) -> dict[str, str]:
    """The one-broker produce and consume against ``highwater server`` under cProfile (by
    the C load generator if it was built, else by confluent-kafka), each profiled alone
    (``bench/_profiled_server.py``: from just before the clients start to just after they
    end): per phase, the functions with the most own time in the broker's event loop."""
    address, kafka = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    root.mkdir(parents=True, exist_ok=True)
    out = root / "broker.prof"
    log = open(root / "profiled-server.log", "wb")  # noqa: SIM115 - closed below
    process = subprocess.Popen(
        [sys.executable, "-m", "bench._profiled_server", str(out),
         "server", "--listen", address, "--data-dir", str(root / "profiled"),
         "--kafka-listen", kafka],
        stdout=log, stderr=subprocess.STDOUT, cwd=REPO_ROOT,
    )  # fmt: skip
    produce: Callable[[], object]
    consume: Callable[[], object]
    if perf_client is not None:
        binary = perf_client
        produce = lambda: produce_perf_client(binary, kafka, TOPIC, "1", records)  # noqa: E731
        consume = lambda: consume_perf_client(binary, kafka, TOPIC, records)  # noqa: E731
    else:
        produce = lambda: produce_librdkafka(kafka, TOPIC, "1", records)  # noqa: E731
        consume = lambda: consume_librdkafka(kafka, TOPIC, records + 1)  # noqa: E731
    profiles: dict[str, str] = {}
    try:
        asyncio.run(create_topic(address, TOPIC))
        for window, (phase, action) in enumerate((("produce", produce), ("consume", consume))):
            process.send_signal(signal.SIGUSR1)
            action()
            process.send_signal(signal.SIGUSR2)
            done = out.with_name(f"{out.name}.{window}.done")
            deadline = time.monotonic() + 60
            while not done.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            profiles[phase] = _top_functions(out.with_name(f"{out.name}.{window}"))
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(60)
        log.close()
    return profiles


def _top_functions(path: Path) -> str:
    stats = pstats.Stats(str(path))
    raw = stats.stats  # type: ignore[attr-defined]
    total = sum(entry[2] for entry in raw.values()) or 1.0
    ranked = sorted(raw.items(), key=lambda item: item[1][2], reverse=True)[:16]
    lines = [f"{'own s':>8} {'own %':>6} {'cum s':>8} {'calls':>10}  function"]
    for (filename, line, function), (_cc, calls, own, cumulative, _callers) in ranked:
        name = profile_entry_name((filename, line, function))
        lines.append(f"{own:8.3f} {own / total:6.1%} {cumulative:8.3f} {calls:10d}  {name}")
    return "\n".join(lines)


def run(report: Report) -> None:
    records = max(20_000, int(500_000 * report.scale))
    with (
        report.suite("kafka", "Kafka listener (`highwater.broker.kafka_protocol`)") as section,
        report.data_dir("kafka", need_bytes=2 * 1024**3) as root,
    ):
        perf_client: Path | None = None
        try:
            perf_client = build_perf_client(root / "perf_client")
        except (RuntimeError, OSError, subprocess.SubprocessError) as error:
            section.note(f"The C load generator was not built: {error}")
        results: dict[int, Phases] = {}
        for brokers in (1, 3):
            os.sync()
            report.progress(f"kafka: highwater, {brokers} broker(s) with Kafka listeners")
            results[brokers] = measure(
                root / f"cluster-{brokers}", brokers, records, report, perf_client
            )
        labels = {1: "1 broker, acks=1", 3: "3 brokers, RF 3, acks=all, min.insync.replicas=2"}
        fetching = ", ".join(CONSUMER_FETCH_CONFIG)
        for brokers, label in labels.items():
            phases = results[brokers]
            for phase, what, target in (
                ("c produce", "C load generator (librdkafka) producing", PRODUCE_TARGET),
                (
                    "c consume",
                    f"C load generator (librdkafka) consuming 1 partition, 1 consumer ({fetching})",
                    CONSUME_TARGET,
                ),
                (
                    "c consume spread",
                    f"C load generator (librdkafka) consuming {SPREAD_PARTITIONS} partitions, "
                    f"{SPREAD_PARTITIONS} consumers (one connection each; {fetching})",
                    CONSUME_TARGET,
                ),
                ("kcat produce", "kcat producer (C)", PRODUCE_TARGET),
                ("kcat consume", "kcat consumer (C)", CONSUME_TARGET),
                ("produce", "confluent-kafka producer", PRODUCE_TARGET),
                ("consume", "confluent-kafka consumer", CONSUME_TARGET),
            ):
                if phase not in phases.cpu and phase not in phases.errors:
                    continue
                grpc = phases.counted.get("grpc consume" if "consume" in phase else "grpc produce")
                mine = phases.counted.get(phase)
                rates = phases.rates.get(phase, [])
                section.add(
                    Row(
                        f"{what} over the Kafka listener, {label}, 100-byte records",
                        None if mine is None else mine.per_second,
                        "records/s",
                        peer_name="Python client over gRPC",
                        peer_value=None if grpc is None else grpc.per_second,
                        target=at_least(target, "records/s"),
                        extra="runs: "
                        + " · ".join(f"{r:,.0f}" for r in rates)
                        + phases.broker_cpu_per_million(phase),
                        error=phases.errors.get(phase, ""),
                    )
                )
        for brokers, label in labels.items():
            phases = results[brokers]
            spent = [phases.cpu_text(p) for p in ("c produce", "c consume", "c consume spread",
                                                   "kcat produce",
                                                   "kcat consume", "produce", "consume",
                                                   "grpc produce", "grpc consume")
                     if p in phases.cpu]  # fmt: skip
            if spent:
                section.note(f"CPU, {label} (3 trials each): " + "; ".join(spent) + ".")
        report.progress("kafka: the one-broker run again, the broker under cProfile")
        try:
            profiles = profile_broker(root / "profile", records, perf_client)
            client = "the C load generator" if perf_client is not None else "confluent-kafka"
            for phase, profile in profiles.items():
                section.add_profile(
                    f"Where the broker's time goes: {client} {phase.removesuffix('e')}ing "
                    f"{records:,} records, one broker, acks=1 (cProfile of the broker's "
                    "event loop over that phase alone, own CPU time)",
                    profile,
                )
        except Exception as error:
            section.note(f"The profile did not run: {type(error).__name__}: {error}")
        section.note(
            f"{records:,} records of 100 bytes per trial, one partition, no compression; "
            "librdkafka with linger.ms=5 and batches of up to 1 MB; the consumer reads all "
            "trials' records back from offset 0. The gRPC column is the project's Python "
            "client (AsyncProducer/AsyncConsumer) on the same cluster in the same run."
        )
