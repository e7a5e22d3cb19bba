"""The layering of the ``highwater`` package, held by its imports: which package may import which.

Every module under ``services/highwater`` is parsed (``ast``, nothing is imported) and each
``import highwater.x...`` or ``from highwater.x... import`` in it (relative ones resolved,
those inside functions and ``TYPE_CHECKING`` blocks included) is checked against
:data:`MAY_IMPORT`. A package may always import its own modules.

The services sit side by side and never import one another: ``broker``, ``controller``,
``coordinator``, ``client``. ``cli`` launches them all, and so may import every package;
``embedded`` runs a controller, a broker and a coordinator in one process; ``chaos`` is a
test harness that drives a cluster through the client. Below them the shared layers, each
with its own order: ``controller_api`` (the controller's API client and messages) over
``metadata`` over ``raft`` (a generic replicated log: no metadata, no controller) over
``storage`` (which knows no protocol: no rpc, raft, metadata, nor the wire contract),
``records`` (the RecordBatch codec and the default partitioner: only errors and config),
``group`` (a group member's protocol, assignors and membership, for the client and the
broker's consumer sessions: over rpc), and beside them ``rpc``
(over ``security``: ACLs, SASL mechanisms, certificate principals, pure),
``config``, ``errors``, ``telemetry`` and ``v1`` (the generated wire contract with
clients), and ``internal`` (the generated contract among the services: Raft, the
controller's RPCs, the metadata records), which the client does not import.

The same table is docs/architecture.md's, and a test below checks that the two agree, so
that a change to the layering is a change to both.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_DIR = ROOT / "services" / "highwater"
ARCHITECTURE_DOC = ROOT / "docs" / "architecture.md"

_BASE = frozenset({"config", "errors", "telemetry", "v1"})
_SHARED = _BASE | {
    "records",
    "rpc",
    "security",
    "storage",
    "raft",
    "metadata",
    "controller_api",
    "etcd_metadata",
    "group",
    "internal",
}
_SERVICES = frozenset({"broker", "controller", "coordinator", "client"})

MAY_IMPORT: Mapping[str, frozenset[str]] = {
    # the package itself, and ``python -m highwater``
    "__init__": frozenset(),
    "__main__": frozenset({"cli"}),
    # launchers and harnesses
    "cli": _SHARED | _SERVICES | {"embedded", "chaos"},
    "embedded": _SHARED | {"broker", "controller", "coordinator"},
    "chaos": _SHARED | {"client"},
    # services, side by side
    "broker": _SHARED,
    "controller": _SHARED,
    "coordinator": _SHARED,
    "client": _SHARED - {"storage", "raft", "internal", "etcd_metadata"},
    # shared layers, each over those it names
    "controller_api": _BASE | {"records", "rpc", "security", "metadata", "internal"},
    "etcd_metadata": _BASE | {"records", "rpc", "security", "metadata", "internal"},
    "group": _BASE | {"rpc"},
    "metadata": _BASE | {"records", "rpc", "security", "storage", "raft", "internal"},
    "raft": _BASE | {"records", "rpc", "storage", "internal"},
    "storage": frozenset({"config", "errors", "telemetry", "records"}),
    "records": frozenset({"config", "errors"}),
    "rpc": _BASE | {"security"},
    "security": frozenset({"config", "errors"}),
    "telemetry": frozenset({"config", "errors", "v1"}),
    "config": frozenset({"errors", "v1"}),
    "errors": frozenset({"v1"}),
    "internal": frozenset({"v1"}),
    "v1": frozenset(),
}


# --- the checker ------------------------------------------------------------------------------


def module_name(path: Path, root: Path) -> str:
    """``highwater.storage.log`` for ``<root>/storage/log.py`` (``root`` is the package)."""
    parts = [root.name, *path.relative_to(root).with_suffix("").parts]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def package_of(module: str) -> str:
    """The top-level package (or module) of ``highwater`` that ``module`` belongs to."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def imported_modules(path: Path, module: str) -> Iterator[tuple[int, str]]:
    """``(line, module)`` for every module of any package that ``path`` imports."""
    is_package = path.name == "__init__.py"
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                here = module.split(".") if is_package else module.split(".")[:-1]
                base = here[: len(here) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            yield node.lineno, target
            # ``from highwater import errors`` imports the package ``highwater.errors``
            for alias in node.names:
                yield node.lineno, f"{target}.{alias.name}"


def violations(root: Path, may_import: Mapping[str, frozenset[str]]) -> list[str]:
    """Every import under ``root`` (a ``highwater`` package directory) that the table does not
    allow, and every package the table does not place, as ``path:line: message``."""
    found: list[str] = []
    top = root.name
    for path in sorted(root.rglob("*.py")):
        module = module_name(path, root)
        package = package_of(module)
        allowed = may_import.get(package)
        if allowed is None:
            found.append(f"{path}: package {package!r} has no row in the layering table")
            continue
        reported: set[tuple[int, str]] = set()
        for line, target in imported_modules(path, module):
            parts = target.split(".")
            if parts[0] != top or len(parts) < 2:
                continue
            imported = parts[1]
            if imported == package or imported in allowed:
                continue
            is_module = (root / imported).is_dir() or (root / f"{imported}.py").is_file()
            if imported not in may_import and not is_module:
                continue  # a name from ``highwater/__init__.py`` (``from highwater import y``)
            if (line, imported) not in reported:  # one report per statement and package
                reported.add((line, imported))
                found.append(f"{path}:{line}: {package} may not import {imported} ({target})")
    return found


# --- the package -------------------------------------------------------------------------------


def test_every_import_in_highwater_follows_the_layering() -> None:
    assert violations(PACKAGE_DIR, MAY_IMPORT) == []


def test_every_package_of_highwater_has_a_row() -> None:
    modules = {p.stem for p in PACKAGE_DIR.glob("*.py")}
    packages = {p.parent.name for p in PACKAGE_DIR.glob("*/__init__.py")}
    assert modules | packages == set(MAY_IMPORT)


def test_the_table_allows_only_packages_it_places() -> None:
    for package, allowed in MAY_IMPORT.items():
        assert allowed <= set(MAY_IMPORT), package
        assert package not in allowed, package


def test_the_services_never_import_one_another() -> None:
    for service in _SERVICES:
        assert not MAY_IMPORT[service] & _SERVICES, service


# Third-party libraries that belong to one part of the package, and that part.
CONFINED_LIBRARIES: Mapping[str, str] = {
    # Kafka's wire protocol (kafka-python's schema-generated codec) is the broker's Kafka
    # listener's business: no other service or layer speaks it.
    "kafka": "highwater.broker.kafka_protocol",
}


def test_confined_libraries_are_imported_only_where_they_belong() -> None:
    found = []
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        module = module_name(path, PACKAGE_DIR)
        for line, target in imported_modules(path, module):
            home = CONFINED_LIBRARIES.get(target.split(".")[0])
            if home is not None and not (module == home or module.startswith(home + ".")):
                found.append(f"{path}:{line}: {target}")
    assert found == []


def test_the_architecture_doc_shows_the_same_table() -> None:
    rows = re.findall(r"^\| `([\w_]+)` \| (.*) \|$", ARCHITECTURE_DOC.read_text(), re.M)
    documented = {package: frozenset(re.findall(r"`([\w_]+)`", cell)) for package, cell in rows}
    assert documented == dict(MAY_IMPORT)


# --- the checker, on a package made up for it --------------------------------------------------


def write(root: Path, files: Mapping[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


SMALL_TABLE: Mapping[str, frozenset[str]] = {
    "__init__": frozenset(),
    "errors": frozenset(),
    "storage": frozenset({"errors"}),
    "rpc": frozenset({"errors"}),
    "client": frozenset({"rpc", "errors"}),
}
SMALL_PACKAGE = {
    "__init__.py": "",
    "errors.py": "class StorageError(Exception): ...\n",
    "storage/__init__.py": "from highwater.errors import StorageError\n",
    "storage/log.py": "from .segment import Segment\nfrom . import segment\n",
    "storage/segment.py": "from highwater import errors\nclass Segment: ...\n",
    "rpc/__init__.py": "",
    "rpc/channels.py": "import grpc\nfrom highwater.errors import StorageError\n",
    "client/__init__.py": "",
    "client/cluster.py": "from highwater.rpc.channels import open_channel\n",
}


@pytest.fixture
def package(tmp_path: Path) -> Path:
    root = tmp_path / "highwater"
    write(root, SMALL_PACKAGE)
    return root


def test_the_checker_passes_a_package_that_keeps_the_table(package: Path) -> None:
    assert violations(package, SMALL_TABLE) == []


@pytest.mark.parametrize(
    ("module", "line", "forbidden"),
    [
        ("storage/log.py", "from highwater.rpc.channels import open_channel", "rpc"),
        ("storage/log.py", "import highwater.client.cluster", "client"),
        ("storage/log.py", "from highwater import rpc", "rpc"),
        ("storage/log.py", "from ..rpc import channels", "rpc"),
        ("storage/__init__.py", "from ..client.cluster import Cluster", "client"),
        ("rpc/channels.py", "from highwater.storage.log import Log", "storage"),
        (
            "client/cluster.py",
            "from typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n    from highwater.storage import log\n",
            "storage",
        ),
        (
            "client/cluster.py",
            "def open_log() -> None:\n    from highwater.storage.log import Log\n",
            "storage",
        ),
    ],
)
def test_the_checker_finds_a_forbidden_import(
    package: Path, module: str, line: str, forbidden: str
) -> None:
    path = package / module
    path.write_text(path.read_text() + line + "\n")
    found = violations(package, SMALL_TABLE)
    assert len(found) == 1, found
    assert found[0].startswith(f"{path}:")
    assert f"may not import {forbidden}" in found[0]


def test_the_checker_names_a_package_missing_from_the_table(package: Path) -> None:
    write(package, {"broker/__init__.py": "from highwater.rpc import channels\n"})
    (found,) = violations(package, SMALL_TABLE)
    assert "package 'broker' has no row" in found
