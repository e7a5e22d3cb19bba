"""Every write of the storage engine goes through a seam the simulated disks fault.

The simulation's disk faults (``sim_disk.py``) act on the storage engine's system calls:
segment writes through ``segment._write_fully`` (a full disk tears them, a failed directory
fails them) and ``os.fsync``/``os.pread`` (a failed directory fails them). A new write
path that calls ``os.writev`` or opens a file for writing somewhere else would escape
every fault without a word, and the schedules would test less than they claim. This test
reads the storage engine's source and fails on any write it does not know, naming the seam
that should cover it. (The indexes are written through a memory mapping, no system call;
a crash may lose them and recovery rebuilds them from the segments.)
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import sim_disk
from highwater.storage import segment

STORAGE = Path(segment.__file__).parent

WRITE_CALLS = frozenset(
    {
        "os.write",
        "os.writev",
        "os.pwrite",
        "os.pwritev",
        "os.sendfile",
        "os.copy_file_range",
        "os.splice",
        "shutil.copyfile",
        "shutil.copy",
        "shutil.copy2",
        "shutil.copyfileobj",
    }
)
"""The system calls (and their wrappers) that put bytes in a file."""

KNOWN_WRITES: dict[tuple[str, str], str] = {
    (
        "segment.py",
        "_write_fully",
    ): "the seam itself: a full disk tears it, a failed directory fails it",
    ("checkpoint.py", "write_atomically"): "its os.fsync: a failed directory fails it",
    ("log_manager.py", "_probe"): "its os.fsync: a failed directory fails it",
}
"""(file, function) -> how the simulated disks fault the writes made there."""


def _dotted(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


def _opens_for_writing(call: ast.Call) -> bool:
    """``open(path, "w…"/"a…"/"x…"/"…+…")`` or ``Path.open`` / ``write_bytes`` / ``write_text``."""
    name = _dotted(call.func)
    if name.endswith(("write_bytes", "write_text")):
        return True
    if name not in ("open", "io.open") and not name.endswith(".open"):
        return False
    mode = call.args[1] if len(call.args) > 1 else None
    for keyword in call.keywords:
        if keyword.arg == "mode":
            mode = keyword.value
    if name == "os.open":
        return False  # a descriptor: what counts is the write call on it (WRITE_CALLS)
    return (
        isinstance(mode, ast.Constant)
        and isinstance(mode.value, str)
        and any(c in mode.value for c in "wax+")
    )


class _Writes(ast.NodeVisitor):
    """The writes of one module, each under its innermost enclosing function."""

    def __init__(self, file: str) -> None:
        self.file = file
        self.functions: list[str] = ["<module>"]
        self.found: dict[tuple[str, str], list[str]] = {}

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.functions.append(node.name)
        self.generic_visit(node)
        self.functions.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Call(self, node: ast.Call) -> None:
        name = _dotted(node.func)
        if name in WRITE_CALLS or _opens_for_writing(node):
            where = (self.file, self.functions[-1])
            self.found.setdefault(where, []).append(f"{name} (line {node.lineno})")
        self.generic_visit(node)


@functools.cache
def storage_writes() -> dict[tuple[str, str], list[str]]:
    """(file, innermost enclosing function) -> the writes found there, in storage/."""
    found: dict[tuple[str, str], list[str]] = {}
    for path in sorted(STORAGE.glob("*.py")):
        writes = _Writes(path.name)
        writes.visit(ast.parse(path.read_text(), str(path)))
        found.update(writes.found)
    return found


def test_every_storage_write_goes_through_a_faulted_seam() -> None:
    unknown = {
        f"{file}:{function}: {', '.join(calls)}"
        for (file, function), calls in storage_writes().items()
        if (file, function) not in KNOWN_WRITES
    }
    assert not unknown, (
        "storage writes the simulated disks do not fault (route them through "
        "segment._write_fully or checkpoint.write_atomically, or teach sim_disk.DiskFaults "
        f"to fault them and list them in KNOWN_WRITES): {sorted(unknown)}"
    )


def test_the_known_writes_are_still_there() -> None:
    """A listed write that moved away leaves a stale entry (and maybe a new unknown path)."""
    assert set(storage_writes()) >= set(KNOWN_WRITES)


def test_segment_writes_are_looked_up_where_the_seam_patches_them() -> None:
    """``intercept_segment_writes`` replaces the module attribute ``segment._write_fully``;
    a copy of it imported elsewhere (``from ...segment import _write_fully``) would keep
    the real one and skip the faults."""
    assert sim_disk._REAL_WRITE is segment._write_fully
    for path in sorted(STORAGE.glob("*.py")):
        if path.name == "segment.py":
            continue
        source = path.read_text()
        assert "_write_fully" not in source, f"{path.name} holds its own reference to _write_fully"
