"""``highwater users create|delete|list``: SCRAM credentials (kafka-configs' users entity).

::

    highwater users create --bootstrap-server B --user alice [--mechanism SCRAM-SHA-512] \\
        [--password-file F | --password P] [--iterations 8192]
    highwater users delete --bootstrap-server B --user alice [--mechanism SCRAM-SHA-512]
    highwater users list --bootstrap-server B [--user alice]

The password is read from ``--password-file`` (its first line), ``--password``, or asked
for on the terminal; it never leaves this process: the command sends a fresh salt and the
salted password (docs/security.md). ``create`` replaces an existing credential of the same
mechanism. ``delete`` without ``--mechanism`` removes the user's credentials of both.
"""

from __future__ import annotations

from pathlib import Path

import click

from highwater.cli.tables import Column, format_option, print_table
from highwater.cli.topics import Connection, connection_options, run_admin
from highwater.client.admin import AdminClient
from highwater.client.errors import AdminError
from highwater.security.scram import DEFAULT_ITERATIONS, SCRAM_MECHANISMS

__all__ = ["users"]


@click.group("users")
def users() -> None:
    """Create, delete and list users' SCRAM credentials."""


def _report(outcomes: dict[str, AdminError | None], done: str) -> None:
    failed = False
    for user, error in outcomes.items():
        if error is None:
            click.echo(f"{done} {user}.")
        else:
            failed = True
            click.echo(f"Error: {user}: {error}", err=True)
    if failed:
        raise SystemExit(1)


@users.command("create")
@connection_options
@click.option("--user", required=True, help="The user's name (its principal is User:NAME).")
@click.option(
    "--mechanism",
    type=click.Choice(SCRAM_MECHANISMS, case_sensitive=False),
    default="SCRAM-SHA-256",
    show_default=True,
)
@click.option("--password", default=None, help="The password (else --password-file or a prompt).")
@click.option(
    "--password-file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="A file whose first line is the password.",
)
@click.option(
    "--iterations",
    type=click.IntRange(4096, 16384),
    default=DEFAULT_ITERATIONS,
    show_default=True,
)
def create(
    conn: Connection,
    user: str,
    mechanism: str,
    password: str | None,
    password_file: Path | None,
    iterations: int,
) -> None:
    """Set the user's credential for the mechanism."""
    if password is not None and password_file is not None:
        raise click.UsageError("--password and --password-file exclude each other")
    if password_file is not None:
        lines = password_file.read_text().splitlines()
        password = lines[0] if lines else ""
    if password is None:
        password = click.prompt(f"Password for {user}", hide_input=True, confirmation_prompt=True)
    if not password:
        raise click.UsageError("the password is empty")
    credential = (user, mechanism.upper(), password)

    async def work(admin: AdminClient) -> dict[str, AdminError | None]:
        return await admin.alter_user_scram_credentials([credential], iterations=iterations)

    _report(run_admin(conn, work), f"Set the {mechanism.upper()} credential of")


@users.command("delete")
@connection_options
@click.option("--user", required=True)
@click.option(
    "--mechanism",
    type=click.Choice(SCRAM_MECHANISMS, case_sensitive=False),
    default=None,
    help="The mechanism whose credential goes (default: every one the user has).",
)
def delete(conn: Connection, user: str, mechanism: str | None) -> None:
    """Remove the user's credential(s)."""

    async def work(admin: AdminClient) -> dict[str, AdminError | None]:
        if mechanism is not None:
            mechanisms = [mechanism.upper()]
        else:
            described = await admin.describe_user_scram_credentials([user])
            mechanisms = [name for name, _ in described.get(user, [])]
        # One request per mechanism: the controller refuses a user altered twice in one
        # request (DUPLICATE_RESOURCE), as Kafka's does.
        outcome: dict[str, AdminError | None] = {}
        for name in mechanisms:
            answer = await admin.alter_user_scram_credentials(deletions=[(user, name)])
            for who, error in answer.items():
                if outcome.get(who) is None:
                    outcome[who] = error
        if not mechanisms:
            outcome = await admin.alter_user_scram_credentials(deletions=[])
        return outcome

    _report(run_admin(conn, work), "Removed the credentials of")


@users.command("list")
@connection_options
@click.option("--user", "names", multiple=True, help="Only these users (repeatable).")
@format_option
def list_(conn: Connection, names: tuple[str, ...], output_format: str) -> None:
    """Each user with its SCRAM mechanisms and iteration counts."""

    async def work(admin: AdminClient) -> dict[str, list[tuple[str, int]]]:
        return await admin.describe_user_scram_credentials(names)

    found = run_admin(conn, work)
    if output_format == "json":
        rows = [(user, name, count) for user, creds in found.items() for name, count in creds]
        print_table((Column("USER"), Column("MECHANISM"), Column("ITERATIONS")), rows, "json")
        return
    for user, credentials in found.items():
        described = ", ".join(f"{name} (iterations={count})" for name, count in credentials)
        click.echo(f"{user}: {described}")
