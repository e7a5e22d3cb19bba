"""Starting the Spark tests' streaming queries past Spark's fixed 10 s connect-back.

A streaming query with a Python data source starts a Python process for the source's
driver-side calls (``python_streaming_source_runner``), and Spark 4.3 gives it a hard-coded
10 s to connect back to the JVM (``PythonWorkerFactory.createSimpleWorker``, no setting).
The process connects after importing PySpark and pyarrow, before it imports the data source,
so nothing in ``pyspark_highwater`` shortens that wait; on a machine loaded enough (load 20
and more on 2 CPUs) the query fails as it starts, before it reads anything.

:func:`started` starts such a query again, only when it failed with exactly that error
before its first progress report (no offsets planned, nothing read or written), at most
:data:`ATTEMPTS` times in all, and warns each time, so a retried start shows in the test
report. Every other failure, and that one after the last attempt, reaches the test.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from typing import Any, Final

#: How many times a query is started in all.
ATTEMPTS: Final = 3
#: Spark's messages for the miss (``PYTHON_WORKER_FAILED_TO_CONNECT_BACK`` and the
#: ``createSimpleWorker`` timeout in Spark 4.3).
CONNECT_BACK_ERRORS: Final = (
    "Python worker failed to connect back",
    "Timed out while waiting for the Python worker to connect back",
)


class ConnectBackRetried(UserWarning):
    """A query's source process missed Spark's connect-back and the query was started
    again."""


def missed_connect_back(query: Any) -> bool:
    """Whether ``query`` ended with Spark's connect-back error before any progress."""
    error = query.exception()
    if error is None or query.lastProgress is not None:
        return False
    text = str(error)
    return any(message in text for message in CONNECT_BACK_ERRORS)


def started(start: Callable[[], Any], timeout_s: float = 120) -> Any:
    """A query from ``start()`` that has passed its first trigger (its first progress
    report) or ended: the source's Python process connected back. A query that ended with
    the connect-back error before its first progress is started again (see the module)."""
    for attempt in range(1, ATTEMPTS + 1):
        query = start()
        deadline = time.monotonic() + timeout_s
        while query.isActive and query.lastProgress is None:
            assert time.monotonic() < deadline, f"the query made no progress in {timeout_s} s"
            time.sleep(0.05)
        if attempt == ATTEMPTS or not missed_connect_back(query):
            return query
        warnings.warn(
            f"attempt {attempt} of {ATTEMPTS}: the streaming query's source process missed "
            f"Spark's 10 s connect-back ({str(query.exception()).splitlines()[0][:200]}); "
            "started again",
            ConnectBackRetried,
            stacklevel=2,
        )
    raise AssertionError("unreachable")
