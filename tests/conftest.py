"""Hypothesis profiles, and the process-wide security settings put back after every test.

``make test`` runs each property with a fixed seed, ``make explore`` with fresh random
examples (and more of them) to look for new failing cases. A fixed seed makes a run's
verdict depend on the code alone; a failing example found while exploring is kept in the
example database and becomes an explicit test. A property that costs seconds takes its
example count from the profile (100 in ``make test``, 1,000 exploring) instead of setting
a larger one of its own: the suite's time budget is shared, and exploring is where the
count is spent. Neither a deadline per example nor the health check on slow generation
applies with the fixed seed: a loaded machine must not fail a run the code passes.

TLS (``rpc/tls.py``), the server's authentication and authorization (``rpc/auth.py``) and
the channels' SASL credentials (``rpc/client_auth.py``) are set per process, as a role's
flags or a client command's ``--command-config`` set them; a test that sets them in the
test process (a CLI command run in-process, a TLS test) must not leave them to the next.

Run in worker processes (pytest-xdist, ``make test JOBS=2``: ``-n 2 --dist loadscope``),
the tests of one module stay on one worker, so that a module-scoped process cluster starts
once; so do the tests of a directory whose fixtures are session-scoped (one SparkSession,
the deployment tools' renders and scans). Each worker has its own temporary directories,
and process tests take free ports from the kernel (``highwater.rpc.endpoints.free_loopback_ports``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from highwater.rpc import auth, client_auth, tls
from hypothesis import HealthCheck, settings

settings.register_profile(
    "deterministic",
    derandomize=True,
    database=None,
    # The verdict depends on the code, not the machine's speed: no per-example deadline and
    # no health check on slow generation (a loaded CI machine tripped both).
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("explore", max_examples=1_000)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "deterministic"))


SESSION_SHARED_DIRS = ("tests/spark/", "tests/deploy/")
"""Directories whose conftest holds session-scoped fixtures: run on one worker together."""


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """Under ``--dist loadscope``: one unit of work per module, or per directory of
    :data:`SESSION_SHARED_DIRS` (xdist's own ``loadgroup`` marks are lost on pytest 9,
    whose node ids cannot be renamed)."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ModuleScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return next((d for d in SESSION_SHARED_DIRS if module.startswith(d)), module)

    return ModuleScheduling(config, log)


@pytest.fixture(autouse=True)
def _process_security_put_back() -> Iterator[None]:
    """Put the process's TLS, server security and client SASL back as they were."""
    server_tls, client_tls = tls.server_tls(), tls.client_tls()
    security, sasl = auth.server_security(), client_auth.client_sasl()
    yield
    tls.configure(server=server_tls, client=client_tls)
    auth.configure(security)
    client_auth.configure_client_sasl(sasl)
