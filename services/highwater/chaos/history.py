"""The history of a chaos run: every client operation and fault, one JSON object per line.

Each line is an object with at least ``t`` (seconds since the run started, float),
``kind`` and ``process`` (who did it: ``producer-0``, ``consumer-1``, ``observer``,
``final``, ``nemesis``, ``replicas``). The kinds:

``write``
    ``status`` ``invoke`` (``partition``, ``value``), then ``ok`` (``offset``) or
    ``fail`` (``error``): a failed write may or may not be in the log (Jepsen's "info").
``read``
    a record a consumer returned: ``partition``, ``offset``, ``value``; ``process``
    ``final`` marks the reads of the final pass, which reads every partition from its
    beginning to its high watermark once the cluster is healed.
``final``
    the end of the final pass over one ``partition``: ``high_watermark``, ``records``.
``commit``
    a synchronous offset commit by a group member: ``group``, ``partition``, ``offset``,
    ``status`` ``ok`` or ``fail`` (``error``).
``committed``
    a read of a group's committed offset through the admin client: ``group``,
    ``partition``, ``offset``.
``fault`` / ``heal``
    the nemesis: ``fault`` (``kill``, ``pause``, ``partition``, ``disk``), ``target``
    (process names), ``detail``.
``replica``
    after the run: the committed prefix of one replica's segment files (batches below
    the final high watermark): ``broker``, ``partition``, ``digest`` (SHA-256, hex),
    ``bytes``, ``end_offset`` (the offset after its last batch there),
    ``high_watermark``.
``restart``
    a process found not running when a fault was healed, started again: ``target``,
    ``pid``, ``exit_code`` (-9: the nemesis killed it).
``fuzz``
    a fuzzed request (:mod:`highwater.chaos.fuzz`): ``target`` (process name),
    ``method``, ``mode``, ``size``, ``code`` (the gRPC status name of the answer).
``note``
    free text (``text``) that explains the run: setup steps, a fault that could not be
    injected, the network mode.

The values the producers write are unique strings ``<producer>-<sequence>``; the
checker relies on that.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

Op = dict[str, Any]
"""One history entry (see the module docstring for its keys)."""


class HistoryWriter:
    """Appends operations to a JSON-lines file and keeps them in memory; thread-safe."""

    def __init__(self, path: Path, *, start: float | None = None) -> None:
        self.path = path
        self.start = time.monotonic() if start is None else start
        self.ops: list[Op] = []
        self._lock = threading.Lock()
        self._file: IO[str] | None = open(path, "w", encoding="utf-8")  # noqa: SIM115 - closed in close()

    def now(self) -> float:
        return round(time.monotonic() - self.start, 4)

    def record(self, kind: str, process: str, **fields: Any) -> Op:
        op: Op = {"t": self.now(), "kind": kind, "process": process, **fields}
        line = json.dumps(op, separators=(",", ":"))
        with self._lock:
            self.ops.append(op)
            if self._file is not None:
                self._file.write(line + "\n")
        return op

    def flush(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.flush()

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None


def parse_lines(lines: Iterable[str]) -> list[Op]:
    """Operations from JSON lines (blank lines skipped)."""
    ops: list[Op] = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        op = json.loads(line)
        if not isinstance(op, dict) or "kind" not in op:
            raise ValueError(f"line {number}: not a history operation: {line.strip()[:80]}")
        ops.append(op)
    return ops


def read_history(path: Path) -> list[Op]:
    with open(path, encoding="utf-8") as f:
        return parse_lines(f)


def format_ops(ops: Iterable[tuple[int, Op]]) -> Iterator[str]:
    """``line N: {json}`` for each (index, op), line numbers counting from 1."""
    for index, op in ops:
        yield f"line {index + 1}: {json.dumps(op, separators=(',', ':'))}"
