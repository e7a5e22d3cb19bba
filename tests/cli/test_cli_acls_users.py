"""``highwater acls`` and ``highwater users`` against a real embedded server: kafka-acls'
flags and output, SCRAM credentials set without sending the password, and bad input
refused before anything is sent."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from embedded_servers import ServerThread
from highwater.cli.main import main

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    server = ServerThread(tmp_path_factory.mktemp("acls"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


def run(server: ServerThread, *args: str) -> tuple[int, str]:
    group, command, *rest = args
    result = CliRunner().invoke(main, [group, command, "--bootstrap-server", server.address, *rest])
    return result.exit_code, result.output


def test_acls_add_list_and_remove_like_kafka_acls(server: ServerThread) -> None:
    code, out = run(
        server, "acls", "add", "--allow-principal", "User:alice", "--operation", "Write",
        "--operation", "Read", "--topic", "orders",
    )  # fmt: skip
    assert code == 0, out
    assert "resourceType=TOPIC, name=orders, patternType=LITERAL" in out
    code, out = run(
        server, "acls", "add", "--deny-principal", "User:bob", "--operation", "All",
        "--topic", "logs-", "--resource-pattern-type", "prefixed",
    )  # fmt: skip
    assert code == 0, out

    code, out = run(server, "acls", "list")
    assert "(principal=User:alice, host=*, operation=READ, permissionType=ALLOW)" in out
    assert "(principal=User:bob, host=*, operation=ALL, permissionType=DENY)" in out
    # MATCH: every pattern that covers the name.
    code, out = run(
        server, "acls", "list", "--topic", "logs-nginx", "--resource-pattern-type", "match"
    )
    assert "User:bob" in out and "User:alice" not in out

    code, out = run(server, "acls", "remove", "--topic", "orders", "--operation", "Read")
    assert code == 0 and "operation=READ" in out
    code, out = run(server, "acls", "list", "--principal", "User:alice")
    assert "operation=WRITE" in out and "operation=READ" not in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--allow-principal", "alice", "--operation", "Read", "--topic", "t"], "TYPE:NAME"),
        (["--allow-principal", "User:a", "--operation", "Fly", "--topic", "t"], "'Fly' is not"),
        (["--allow-principal", "User:a", "--operation", "Read"], "name a resource"),
        (["--operation", "Read", "--topic", "t"], "name a principal"),
    ],
)
def test_bad_acls_are_refused_before_sending(
    server: ServerThread, args: list[str], message: str
) -> None:
    code, out = run(server, "acls", "add", *args)
    assert code == 2 and message in out


def test_users_create_list_and_delete(server: ServerThread, tmp_path: Path) -> None:
    secret = tmp_path / "password"
    secret.write_text("s3cret\n")
    code, out = run(
        server, "users", "create", "--user", "carol", "--password-file", str(secret),
        "--mechanism", "SCRAM-SHA-512", "--iterations", "8192",
    )  # fmt: skip
    assert code == 0 and "Set the SCRAM-SHA-512 credential of carol." in out, out
    code, out = run(server, "users", "create", "--user", "carol", "--password", "other")
    assert code == 0, out
    code, out = run(server, "users", "list", "--user", "carol")
    assert out.strip() == (
        "carol: SCRAM-SHA-256 (iterations=4096), SCRAM-SHA-512 (iterations=8192)"
    )
    code, out = run(server, "users", "delete", "--user", "carol")
    assert code == 0, out
    code, out = run(server, "users", "delete", "--user", "carol", "--mechanism", "SCRAM-SHA-256")
    assert code == 1 and "has no SCRAM-SHA-256 credential" in out
    code, out = run(
        server, "users", "create", "--user", "d", "--password", "x", "--iterations", "10"
    )
    assert code == 2


@pytest.mark.parametrize(
    ("resource", "operation", "message"),
    [
        (
            ["--group", "g1"],
            "Write",
            "ResourceType GROUP only supports operations Read, Describe, Delete, "
            "DescribeConfigs, AlterConfigs, All, not Write",
        ),
        (["--cluster"], "Read", "ResourceType CLUSTER only supports operations Create, "),
        (
            ["--transactional-id", "tx"],
            "Read",
            "ResourceType TRANSACTIONAL_ID only supports operations Describe, Write, All, not Read",
        ),
        (["--topic", "t"], "IdempotentWrite", "ResourceType TOPIC only supports operations "),
    ],
)
def test_operations_a_resource_type_does_not_support_are_refused(
    server: ServerThread, resource: list[str], operation: str, message: str
) -> None:
    acl = ["--allow-principal", "User:bob", "--operation", operation, *resource]
    code, out = run(server, "acls", "add", *acl)
    assert code == 2 and message in out
    code, out = run(server, "acls", "list", *resource)
    assert code == 0 and "User:bob" not in out


@pytest.mark.parametrize(
    "resource", [["--group", "g2"], ["--cluster"], ["--transactional-id", "tx2"], ["--topic", "t2"]]
)
def test_all_and_supported_operations_are_accepted(
    server: ServerThread, resource: list[str]
) -> None:
    for operation in ("All", "Describe"):
        acl = ["--allow-principal", "User:carol", "--operation", operation, *resource]
        code, out = run(server, "acls", "add", *acl)
        assert code == 0, out
    code, out = run(server, "acls", "remove", "--allow-principal", "User:carol", *resource)
    assert code == 0, out
