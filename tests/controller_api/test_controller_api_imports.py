"""The controller's API package stands apart from the controller's core: importing it (and
the admin client built on it) loads no part of ``highwater.controller``, ``raft`` or
``storage``, checked in a fresh interpreter so that nothing imported earlier hides it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

_LOADED = """
import json, sys
for name in sys.argv[1:]:
    __import__(name)
print(json.dumps(sorted(sys.modules)))
"""


def modules_loaded_by(*names: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", _LOADED, *names], check=True, capture_output=True, text=True
    )
    return set(json.loads(out.stdout))


def under(loaded: set[str], package: str) -> list[str]:
    return sorted(m for m in loaded if m == package or m.startswith(package + "."))


def test_the_controller_api_does_not_import_the_controller_core() -> None:
    loaded = modules_loaded_by(
        "highwater.controller_api.client",
        "highwater.controller_api.codec",
        "highwater.controller_api.messages",
    )
    assert "highwater.controller_api.client" in loaded
    assert under(loaded, "highwater.controller") == []


@pytest.mark.parametrize(
    "forbidden", ["highwater.controller", "highwater.raft", "highwater.storage"]
)
def test_the_clients_load_neither_controller_nor_raft_nor_storage(forbidden: str) -> None:
    loaded = modules_loaded_by(
        "highwater.client.admin", "highwater.client.producer", "highwater.client.consumer"
    )
    assert "highwater.client.admin" in loaded
    assert under(loaded, forbidden) == []
