"""Progress on stderr while a command waits on the cluster: a rich spinner or bar.

Commands that wait (``rolling pre-stop`` for under-replicated partitions to catch up,
``partitions reassign --wait`` for moves, ``leader-election`` for the new leaders to show
in the metadata) show what they wait for and how long it has taken, with a bar when the
work has a known size. It is drawn only when stderr is a terminal and appears only once
the wait has lasted :data:`SHOW_AFTER_S` (a wait that ends at once draws nothing); it
disappears when the wait ends, so stdout and logs carry only the results.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator
from typing import Final

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

__all__ = ["SHOW_AFTER_S", "Waiting", "waiting"]

#: How long a wait lasts before its progress is drawn.
SHOW_AFTER_S: Final = 1.0


class Waiting:
    """One wait's progress; :meth:`update` as the wait learns more (a no-op off a terminal)."""

    def __init__(self, description: str, total: int | None, enabled: bool) -> None:
        self._description = description
        self._total = total
        self._completed = 0
        self._started = time.monotonic()
        self._enabled = enabled
        self._progress: Progress | None = None
        self._task: TaskID | None = None

    def update(
        self, *, completed: int | None = None, total: int | None = None, detail: str = ""
    ) -> None:
        """Record how far the wait is (``completed`` of ``total``) and what it waits for."""
        if completed is not None:
            self._completed = completed
        if total is not None:
            self._total = total
        if not self._enabled:
            return
        if self._progress is None and time.monotonic() - self._started >= SHOW_AFTER_S:
            self._start()
        if self._progress is not None and self._task is not None:
            text = f"{self._description}: {detail}" if detail else self._description
            self._progress.update(
                self._task, description=text, completed=self._completed, total=self._total
            )

    def _start(self) -> None:
        columns = [SpinnerColumn(), TextColumn("{task.description}")]
        if self._total is not None:
            columns += [BarColumn(), MofNCompleteColumn()]
        columns.append(TimeElapsedColumn())
        self._progress = Progress(*columns, console=Console(file=sys.stderr), transient=True)
        self._progress.start()
        self._task = self._progress.add_task(
            self._description, total=self._total, completed=self._completed
        )

    def close(self) -> None:
        """Remove the display."""
        if self._progress is not None:
            self._progress.stop()
            self._progress = None


@contextlib.contextmanager
def waiting(description: str, total: int | None = None) -> Iterator[Waiting]:
    """Progress of the wait in the ``with`` block (see the module docstring)."""
    shown = Waiting(description, total, enabled=sys.stderr.isatty())
    try:
        yield shown
    finally:
        shown.close()
