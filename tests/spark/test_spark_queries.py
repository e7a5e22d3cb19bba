"""The Spark tests' query restarts: only Spark's connect-back miss before any progress, at
most :data:`~spark_queries.ATTEMPTS` starts, each restart warned."""

from __future__ import annotations

from typing import Any

import pytest
from spark_queries import ATTEMPTS, ConnectBackRetried, started

MISSED = (
    "[PYTHON_WORKER_FAILED_TO_CONNECT_BACK] Python worker failed to connect back. SQLSTATE: 38000"
)


class EndedQuery:
    """A streaming query as Spark leaves it once it ended (the attributes ``started`` reads)."""

    isActive = False

    def __init__(self, error: str | None, progressed: bool = False) -> None:
        self._error = None if error is None else RuntimeError(error)
        self.lastProgress: dict[str, Any] | None = {"batchId": 0} if progressed else None

    def exception(self) -> BaseException | None:
        return self._error


def starts(*queries: EndedQuery) -> tuple[list[EndedQuery], Any]:
    made: list[EndedQuery] = []
    pending = list(queries)

    def start() -> EndedQuery:
        made.append(pending.pop(0))
        return made[-1]

    return made, start


def test_a_missed_connect_back_before_any_progress_is_started_again() -> None:
    made, start = starts(EndedQuery(MISSED), EndedQuery(None))
    with pytest.warns(ConnectBackRetried, match="attempt 1 of 3"):
        query = started(start)
    assert len(made) == 2 and query is made[1]


def test_other_errors_and_errors_after_progress_reach_the_test() -> None:
    for first in (
        EndedQuery("Python worker exited unexpectedly (crashed)"),
        EndedQuery(MISSED, progressed=True),
    ):
        made, start = starts(first, EndedQuery(None))
        assert started(start) is first and len(made) == 1


def test_the_restarts_are_bounded() -> None:
    made, start = starts(*(EndedQuery(MISSED) for _ in range(ATTEMPTS + 1)))
    with pytest.warns(ConnectBackRetried):
        query = started(start)
    assert len(made) == ATTEMPTS and query.exception() is not None
