"""Traces across processes: a record produced by one process and consumed by another is one
trace, exported over OTLP to a receiver as a collector would receive it; a client call made
in a span continues that trace in the server.

One ``highwater server``, ``highwater produce`` and ``highwater consume`` run as processes
with ``OTEL_EXPORTER_OTLP_ENDPOINT`` pointing at :mod:`otlp_receiver` in the test.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from embedded_servers import free_port
from grpc_health.v1 import health_pb2, health_pb2_grpc
from otlp_receiver import OtlpReceiver, otlp_receiver

pytestmark = pytest.mark.timeout(120)

TOPIC = "traced"
RECORDS = ["first", "second", "third"]
SERVER_SPAN, PRODUCER_SPAN, CONSUMER_SPAN, CLIENT_SPAN = 2, 4, 5, 3  # OTLP's Span.SpanKind


def highwater(*args: str) -> list[str]:
    return [sys.executable, "-m", "highwater", *args]


@pytest.fixture
def traced(tmp_path: Path) -> Iterator[tuple[OtlpReceiver, dict[str, str], str]]:
    """The receiver, the environment that exports to it, and a running server's address."""
    with otlp_receiver() as (receiver, endpoint):
        env = dict(
            os.environ,
            OTEL_EXPORTER_OTLP_ENDPOINT=endpoint,
            OTEL_EXPORTER_OTLP_INSECURE="true",
            OTEL_METRICS_EXPORTER="none",
            OTEL_BSP_SCHEDULE_DELAY="100",
        )
        address = f"127.0.0.1:{free_port()}"
        log = open(tmp_path / "server.log", "wb")  # noqa: SIM115 - closed below
        server = subprocess.Popen(
            highwater("server", "--listen", address, "--data-dir", str(tmp_path / "data")),
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            with grpc.insecure_channel(address) as channel:
                health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(), timeout=30, wait_for_ready=True
                )
            yield receiver, env, address
        finally:
            server.terminate()
            try:
                server.wait(30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
            log.close()


def run(env: dict[str, str], *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        highwater(*args), env=env, input=stdin, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done


def test_a_record_is_one_trace_from_producer_to_consumer(
    traced: tuple[OtlpReceiver, dict[str, str], str],
) -> None:
    receiver, env, address = traced
    bootstrap = ("--bootstrap-server", address)
    run(env, "topics", "create", *bootstrap, "--topic", TOPIC, "--partitions", "2")
    run(env, "produce", *bootstrap, "--topic", TOPIC, stdin="\n".join(RECORDS) + "\n")
    consumed = run(
        env, "consume", *bootstrap, "--topic", TOPIC, "--from-beginning", "--max-messages", "3"
    )
    assert sorted(consumed.stdout.split()) == sorted(RECORDS)

    receiver.wait_for(
        lambda r: (
            len(r.of("highwater-produce", "send ")) == 3
            and len(r.of("highwater-consume", "process ")) == 3
        ),
        "three send and three process spans",
    )
    sends = {s.span_id: s for s in receiver.of("highwater-produce", "send ")}
    for send in sends.values():
        assert send.name == f"send {TOPIC}" and send.kind == PRODUCER_SPAN
        assert send.attributes["messaging.system"] == "highwater"
        assert send.attributes["messaging.operation.type"] == "send"
        assert send.attributes["messaging.destination.name"] == TOPIC
        assert send.attributes["messaging.destination.partition.id"] in ("0", "1")
        assert send.parent_span_id == ""  # the console producer starts each record's trace
    processes = receiver.of("highwater-consume", "process ")
    for process in processes:
        parent = sends[process.parent_span_id]  # a child of the record's send span
        assert process.trace_id == parent.trace_id
        assert process.kind == CONSUMER_SPAN
        assert process.attributes["messaging.operation.type"] == "process"
        assert (
            process.attributes["messaging.destination.partition.id"]
            == parent.attributes["messaging.destination.partition.id"]
        )
    assert len({p.trace_id for p in processes}) == 3  # one trace per record
    receives = receiver.of("highwater-consume", "receive")
    assert receives and all(r.kind == CLIENT_SPAN for r in receives)
    assert sum(r.attributes["messaging.batch.message_count"] for r in receives) == 3
    linked = {span_id for r in receives for _trace, span_id in r.links}
    assert linked == set(sends)
    # The server traced the calls it served, as SERVER spans with the RPC's attributes.
    receiver.wait_for(
        lambda r: any(
            s.attributes.get("rpc.method") == "Produce" for s in r.of("highwater-server")
        ),
        "the server's Produce span",
    )
    produce = next(
        s for s in receiver.of("highwater-server") if s.attributes.get("rpc.method") == "Produce"
    )
    assert produce.kind == SERVER_SPAN and produce.name == "highwater.v1.Broker/Produce"
    assert produce.attributes["rpc.system"] == "grpc"
    assert produce.attributes["rpc.grpc.status_code"] == 0


def test_a_call_made_in_a_span_continues_its_trace_in_the_server(
    traced: tuple[OtlpReceiver, dict[str, str], str],
) -> None:
    receiver, env, address = traced
    script = Path(__file__).with_name("traced_admin.py")
    done = subprocess.run(
        [sys.executable, str(script), address],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    trace_id, span_id = done.stdout.split()

    def metadata_span_of_task(r: OtlpReceiver) -> bool:
        return any(
            s.trace_id == trace_id and s.parent_span_id == span_id
            for s in r.of("highwater-server", "highwater.v1.Broker/Metadata")
        )

    receiver.wait_for(metadata_span_of_task, "the server's Metadata span under operator-task")
    [task] = [s for s in receiver.of("traced-admin") if s.name == "operator-task"]
    assert (task.trace_id, task.span_id) == (trace_id, span_id)


def test_a_producer_that_samples_a_record_out_makes_its_consumers_drop_it_too(
    traced: tuple[OtlpReceiver, dict[str, str], str],
) -> None:
    receiver, env, address = traced
    bootstrap = ("--bootstrap-server", address)
    run(env, "topics", "create", *bootstrap, "--topic", TOPIC)
    never = {**env, "OTEL_TRACES_SAMPLER": "always_off"}
    run(never, "produce", *bootstrap, "--topic", TOPIC, stdin="\n".join(RECORDS) + "\n")
    run(env, "consume", *bootstrap, "--topic", TOPIC, "--from-beginning", "--max-messages", "3")
    receiver.wait_for(
        lambda r: (
            sum(
                s.attributes["messaging.batch.message_count"]
                for s in r.of("highwater-consume", "receive")
            )
            == 3
        ),
        "the consumer's receive spans",
    )
    # The records carried unsampled contexts: the consumer's process spans follow them.
    assert receiver.of("highwater-produce") == []
    assert receiver.of("highwater-consume", "process ") == []
    linked_traces = {t for s in receiver.of("highwater-consume", "receive") for t, _ in s.links}
    assert len(linked_traces) == 3  # each record still names its own trace
