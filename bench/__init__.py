"""Highwater's benchmark harness: one module per suite, results written to docs/benchmarks.md.

A suite is a module ``bench/<suite>.py`` (``_`` in its name spelled ``-`` on the command
line) exposing ``run(report: bench.report.Report) -> None``.
``python -m bench [SUITE...]`` (``make bench``) runs the named suites, all of them by default,
and merges their sections into ``docs/benchmarks.md``. Benchmark data lives under
``bench-data/`` (git-ignored) and is deleted at the end of each suite.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from types import ModuleType

# The order suites run in (and appear in, for a new file); others follow alphabetically.
SUITE_ORDER = ("storage", "raft", "broker", "replication", "coordinator", "controller", "client")
_NOT_SUITES = {"report"}


def available_suites() -> list[str]:
    """The suite modules present in this package, in running order."""
    names = {
        info.name.replace("_", "-")
        for info in pkgutil.iter_modules(__path__)
        if not info.name.startswith("_") and info.name not in _NOT_SUITES
    }
    known = [name for name in SUITE_ORDER if name in names]
    return known + sorted(names - set(known))


def load_suite(name: str) -> Callable[..., None]:
    """The ``run`` function of suite ``name`` (``control-plane``: ``bench/control_plane.py``)."""
    module: ModuleType = importlib.import_module(f"{__name__}.{name.replace('-', '_')}")
    run = getattr(module, "run", None)
    if not callable(run):
        raise TypeError(f"bench/{name}.py has no run(report) function")
    return run  # type: ignore[no-any-return]
