"""How commands print what they found: rows as a table for people, or JSON for scripts.

Every command that describes or lists takes ``--format text|json`` (:func:`format_option`,
``text`` by default) and hands its rows to :func:`print_table`; a description that is not
a table in text (kafka-topics' ``--describe`` lines, kafka-configs' entries) prints its own
text and gives :func:`print_json` the same facts for ``--format json``.

* ``text``: a rich table without borders, columns left-aligned and as wide as their widest
  cell, ``-`` for an unknown value. On a terminal rich fits it to the window (bold
  headers); otherwise (a pipe, a file) every row is one line however long, with no
  trailing blanks, so that ``awk``/``grep`` see one row per line.
* ``json``: one JSON document on stdout: a table is an array of objects, one per row,
  keyed by the columns' ``key`` (snake_case) with numbers as numbers and unknowns as
  ``null``; :func:`print_json` prints any JSON value the command builds.

Adopting it in a command: add ``@format_option`` (the value arrives as ``output_format``),
describe the columns once as :class:`Column` values and call
``print_table(COLUMNS, rows, output_format)``.
"""

from __future__ import annotations

import io
import json
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, TypeVar

import click
from rich.console import Console
from rich.table import Table

__all__ = [
    "FORMATS",
    "Column",
    "OutputFormat",
    "format_option",
    "print_json",
    "print_table",
    "render_text",
]

F = TypeVar("F", bound=Callable[..., Any])

OutputFormat = Literal["text", "json"]
FORMATS: Final = ("text", "json")
#: Wide enough that rich never wraps or cuts a row printed to a pipe or a file.
_UNBOUNDED_WIDTH: Final = 1_000_000


@dataclass(frozen=True, slots=True)
class Column:
    """One column: its ``header`` in text (``CURRENT-OFFSET``), its ``key`` in JSON
    (``current_offset``; by default the header in snake_case)."""

    header: str
    key: str = ""

    @property
    def json_key(self) -> str:
        """The key of this column's value in a JSON row."""
        return self.key or self.header.lower().replace("-", "_").replace(" ", "_").strip("#")


def format_option(function: F) -> F:
    """``--format text|json``, passed to the command as ``output_format``."""
    return click.option(
        "--format",
        "output_format",
        type=click.Choice(FORMATS),
        default="text",
        show_default=True,
        help="Print a table (text) or one JSON document for scripts (json).",
    )(function)


def _cell(value: object) -> str:
    return "-" if value is None else str(value)


def _json_value(value: object) -> object:
    if value is None or isinstance(value, bool | int | float | str | list | dict):
        return value
    if isinstance(value, tuple | set | frozenset):
        return list(value)
    return str(value)


def _table(columns: Sequence[Column], rows: Iterable[Sequence[object]]) -> Table:
    table = Table(box=None, pad_edge=False, show_edge=False, highlight=False)
    for column in columns:
        table.add_column(column.header, no_wrap=True, overflow="ignore")
    for row in rows:
        table.add_row(*(_cell(value) for value in row))
    return table


def render_text(columns: Sequence[Column], rows: Iterable[Sequence[object]]) -> str:
    """The table as plain lines (what a pipe receives), without trailing blanks."""
    buffer = io.StringIO()
    console = Console(
        file=buffer,
        width=_UNBOUNDED_WIDTH,
        color_system=None,
        highlight=False,
        markup=False,
        emoji=False,
    )
    console.print(_table(columns, rows))
    return "\n".join(line.rstrip() for line in buffer.getvalue().splitlines())


def print_table(
    columns: Sequence[Column],
    rows: Iterable[Sequence[object]],
    output_format: OutputFormat | str = "text",
    *,
    header_when_empty: bool = True,
) -> None:
    """Print ``rows`` (one value per column; None is unknown) as ``output_format`` says."""
    rows = [list(row) for row in rows]
    if output_format == "json":
        keys = [column.json_key for column in columns]
        print_json([dict(zip(keys, map(_json_value, row), strict=True)) for row in rows])
        return
    if not rows and not header_when_empty:
        return
    stdout = sys.stdout
    if stdout.isatty():
        Console(file=stdout, highlight=False, markup=False, emoji=False).print(
            _table(columns, rows)
        )
    else:
        click.echo(render_text(columns, rows))


def print_json(document: object) -> None:
    """Print one JSON document (tuples as arrays) on stdout."""
    click.echo(json.dumps(document, default=_json_value))
