"""Fixtures of the Spark tests: an embedded server per module, one local[2] SparkSession.

Spark's Python workers must import Highwater: they run this interpreter (``PYSPARK_PYTHON``),
and Spark binds to loopback (``SPARK_LOCAL_IP``). Topics are made per test with unique names.
"""

from __future__ import annotations

import gc
import os
import sys
import warnings
from collections.abc import Iterator

import pytest
from embedded_servers import ServerThread


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    """An embedded server shared by a module's tests: stopped after them, so that its open
    segment files do not stay open through the rest of the run."""
    thread = ServerThread(tmp_path_factory.mktemp("spark-server"))
    thread.start()
    yield thread
    thread.stop()


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """A local[2] SparkSession; ``format("highwater")`` is found without registering it."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.errors import PySparkRuntimeError
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master("local[2]")
        .appName("highwater-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.sql.warehouse.dir", str(tmp_path_factory.mktemp("warehouse")))
        .config("spark.sql.session.timeZone", "UTC")
    )
    # PySpark starts its JVM with a fork that runs Python before exec (a preexec_fn): in a
    # process where other threads are inside gRPC calls (gRPC then skips its fork handlers)
    # the JVM has once exited at start with nothing said, failing every Spark test of a
    # full run. A second attempt starts it.
    for attempt in range(1, 4):
        try:
            session = builder.getOrCreate()
            break
        except PySparkRuntimeError as e:
            if e.getCondition() != "JAVA_GATEWAY_EXITED" or attempt == 3:
                raise
            failure = e
        # The failed launch leaves the JVM's stdin pipe open in its frames, which the
        # exception's traceback holds: released here, where the ResourceWarning of that
        # pipe says nothing the line below does not (it once failed the fixture's retry).
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            del failure
            gc.collect()
        print(
            f"the Spark JVM exited at start (attempt {attempt}); starting it again",
            file=sys.stderr,
        )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
