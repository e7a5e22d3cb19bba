"""``PrefixView``: the keys under the etcd prefix as of a revision, kept current by watch events.

A controller candidate woken by its watch used to read the whole prefix to learn what
changed; with this view it applies the changed keys the watch carries instead (pure: no
I/O). The view is trusted only while it is *current*: loaded from a whole read at revision
``R`` and fed by a watch that started at or before ``R + 1``, so every change after ``R``
reaches it. Events at or below the view's revision are skipped (the read already holds
them); events that arrive while a whole read is in flight, newer than the revision that
read returns, are kept and applied again on top of it (:meth:`PrefixView.load`). A watch
that breaks makes the view not current until the watch is made again and a whole read
loads it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from highwater.etcd_metadata.connection import KeyVersion

__all__ = ["KeyChange", "PrefixView"]

MAX_RECENT_CHANGES = 100_000
"""Changes kept for a whole read in flight; past it the next read does not make the view
current (a second one does)."""


@dataclass(frozen=True, slots=True)
class KeyChange:
    """One watch event: ``key`` now holds ``version``, or was deleted (``None``) at
    ``revision``."""

    key: str
    revision: int
    version: KeyVersion | None


class PrefixView:
    """The keys under a prefix as of :attr:`revision` (see the module docstring)."""

    def __init__(self) -> None:
        self.keys: dict[str, KeyVersion] = {}
        self.revision = -1
        """The revision the view is as of (-1: never loaded)."""
        self._loaded = False
        self._watch_start: int | None = None
        self._recent: list[KeyChange] = []
        self._overflowed = False
        self._changed: set[str] | None = None

    @property
    def current(self) -> bool:
        """Whether every change after :attr:`revision` reaches the view."""
        return (
            self._loaded
            and self._watch_start is not None
            and self._watch_start <= self.revision + 1
        )

    def watching_from(self, start_revision: int) -> None:
        """A watch now delivers every change from ``start_revision`` on."""
        self._watch_start = start_revision
        self._recent = [c for c in self._recent if c.revision >= start_revision]

    def watch_broken(self) -> None:
        self._watch_start = None
        self._recent.clear()

    def load(self, revision: int, keys: Mapping[str, KeyVersion]) -> None:
        """A whole read at ``revision``; changes already seen that are newer are kept."""
        self.keys = dict(keys)
        self._changed = None
        self.revision = revision
        self._loaded = not self._overflowed  # changes newer than the read may be lost
        self._overflowed = False
        newer = [c for c in self._recent if c.revision > revision]
        self._recent = []
        self.apply(newer)

    def apply(self, changes: Iterable[KeyChange]) -> bool:
        """Apply watch events (in revision order; one transaction's several events share
        its revision, and etcd sends them in one response); whether any was newer than the
        view."""
        changed = False
        held = self.revision
        for change in changes:
            if self._watch_start is not None:
                self._recent.append(change)
            if change.revision <= held:
                continue
            if change.version is None:
                self.keys.pop(change.key, None)
            else:
                self.keys[change.key] = change.version
            if self._changed is not None:
                self._changed.add(change.key)
            self.revision = change.revision
            changed = True
        if len(self._recent) > MAX_RECENT_CHANGES:
            self._recent.clear()
            self._overflowed = True
        return changed

    def keep_changes(self, keys: Iterable[str]) -> None:
        """Keys a reader took but could not judge yet (its view was behind what it knows):
        the next :meth:`take_changes` gives them again."""
        if self._changed is not None:
            self._changed.update(keys)

    def take_changes(self) -> set[str] | None:
        """The keys changed since the last call (None: the view was loaded since, so any
        key may have): what a reader of the view looks at instead of every key."""
        changed, self._changed = self._changed, set()
        return changed
