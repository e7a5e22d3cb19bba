"""The command lines of the chaos cluster's controllers in each quorum mode (no process is
started): static controllers name the voters; in a dynamic quorum the first forms it alone
and restarts as the others start, with ``--bootstrap-controllers`` and auto-join, TLS flags
kept on every start of a secured cluster."""

from __future__ import annotations

from pathlib import Path

import pytest
from highwater.chaos.cluster import Cluster
from highwater.chaos.network import Network


def flag(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


def test_a_static_quorum_names_its_voters(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, Network(), controllers=3)
    controllers = cluster.by_role("controller")
    voters = flag(controllers[0].args, "--voters")
    assert voters is not None and voters.count("@") == 3
    assert all(flag(c.args, "--voters") == voters for c in controllers)
    assert all(c.restart_args is None for c in controllers)


def test_a_dynamic_quorum_is_formed_by_the_first_controller_and_joined_by_the_rest(
    tmp_path: Path,
) -> None:
    cluster = Cluster(tmp_path, Network(), controllers=3, quorum="dynamic", secure=True)
    first, *others = cluster.by_role("controller")
    every = ",".join(c.address for c in cluster.by_role("controller"))
    initial = flag(first.args, "--initial-controllers")
    assert initial is not None and initial.startswith(f"1@{first.address}:")
    assert "--voters" not in first.args and "--bootstrap-controllers" not in first.args
    for args in (first.restart_args, *(c.args for c in others)):
        assert args is not None
        assert flag(args, "--bootstrap-controllers") == every
        assert "controller.quorum.auto.join.enable=true" in args
        assert "--initial-controllers" not in args and "--voters" not in args
        assert flag(args, "--tls-cert-file") is not None  # secured on every start
    assert flag(first.args, "--tls-cert-file") is not None
    # The brokers find the controllers the same way in both modes.
    assert all(flag(b.args, "--controllers") == every for b in cluster.brokers)


def test_an_unknown_quorum_mode_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="quorum mode 'raft': one of static, dynamic"):
        Cluster(tmp_path, Network(), quorum="raft")
