"""The metadata quorum's telemetry: commit latency (a histogram and, with tracing on, a span
per batch), elections, and gauges of a replica's state."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

from opentelemetry.metrics import Observation
from opentelemetry.trace import Status, StatusCode

from highwater.raft.messages import OffsetAndEpoch
from highwater.raft.node import RoleChange
from highwater.raft.state import Role
from highwater.telemetry.instruments import duration_histogram, meter, observe, tracer

if TYPE_CHECKING:
    from highwater.raft.driver import RaftServer

__all__ = ["RaftTelemetry"]


class RaftTelemetry:
    """Instruments of one replica of ``__cluster_metadata`` (see :mod:`highwater.telemetry`)."""

    def __init__(self, server: RaftServer) -> None:
        self._tracer = tracer("raft")
        raft_meter = meter("raft")
        self._commit_duration = duration_histogram(
            raft_meter,
            "highwater.raft.commit.duration",
            "From a leader's append of a batch to its commit on a majority",
        )
        self._elections = raft_meter.create_counter(
            "highwater.raft.elections",
            unit="{election}",
            description="Elections this replica stood in as a candidate",
        )
        self._leaderships = raft_meter.create_counter(
            "highwater.raft.leaderships",
            unit="{epoch}",
            description="Epochs this replica became leader of",
        )
        observe(
            raft_meter,
            "highwater.raft.high_watermark",
            server,
            lambda s: [Observation(s.high_watermark)],
            unit="{offset}",
            description="The committed offset this replica knows of",
        )
        observe(
            raft_meter,
            "highwater.raft.leader",
            server,
            _is_leader,
            description="1 while this replica leads the quorum, else 0",
        )

    def appended(self, committed: asyncio.Future[int], last: OffsetAndEpoch, count: int) -> None:
        """Time the batch of ``count`` entries ending at ``last`` until ``committed``
        reports its commit (a ``raft commit`` span too, with tracing on)."""
        started = time.perf_counter()
        span = None
        if self._tracer is not None:
            span = self._tracer.start_span(
                "raft commit",
                attributes={
                    "highwater.raft.epoch": last.epoch,
                    "highwater.raft.offset": last.offset,
                    "highwater.raft.batch.entries": count,
                },
            )

        def done(future: asyncio.Future[int]) -> None:
            failed = future.cancelled() or future.exception() is not None
            if not failed:
                self._commit_duration.record(time.perf_counter() - started)
            if span is not None:
                if failed:
                    span.set_status(Status(StatusCode.ERROR, "not committed"))
                span.end()

        committed.add_done_callback(done)

    def role_changed(self, change: RoleChange) -> None:
        if change.role is Role.CANDIDATE:
            self._elections.add(1)
        elif change.role is Role.LEADER:
            self._leaderships.add(1)


def _is_leader(server: RaftServer) -> Iterable[Observation]:
    role = server.role
    return [Observation(1 if role is not None and role.role is Role.LEADER else 0)]
