"""Where a client command finds the cluster: ``--bootstrap-server``, the environment, a profile.

Typing ``--bootstrap-server`` on every command gets old (rpk's profiles answer the same
itch), so every client command takes the bootstrap address from the first of:

1. ``--bootstrap-server HOST:PORT[,HOST:PORT...]`` on the command line;
2. ``$HIGHWATER_BOOTSTRAP_SERVERS`` (the same syntax);
3. the profile: a Java-properties file, ``$HIGHWATER_PROFILE`` if set (then it must
   exist), else ``$XDG_CONFIG_HOME/highwater/profile.properties`` (by default
   ``~/.config/highwater/profile.properties``) when there is one. Its
   ``bootstrap.servers`` is the address; its other keys are the client properties
   ``--command-config`` takes (``security.protocol``, ``ssl.*``, ``sasl.*``) and apply to the
   command unless ``--command-config`` is given (which then wins as a whole).

None of them: a usage error (exit 2) naming all three. A malformed address, an unreadable
profile or an unknown key in it is a usage error naming where it came from. A few
commands have a default of their own (``rolling`` asks the broker on its host), used
when none of the three gives an address.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final, TypeVar

import click
from click.core import ParameterSource

from highwater.cli.addresses import parse_addresses
from highwater.config.server import read_properties
from highwater.errors import InvalidConfigError
from highwater.rpc.client_auth import client_security_from_properties, configure_client_sasl
from highwater.rpc.tls import TlsConfigError, configure

__all__ = [
    "BOOTSTRAP_ENV",
    "PROFILE_ENV",
    "bootstrap_server_option",
    "default_profile_path",
    "resolve_bootstrap",
]

F = TypeVar("F", bound=Callable[..., Any])

BOOTSTRAP_ENV: Final = "HIGHWATER_BOOTSTRAP_SERVERS"
PROFILE_ENV: Final = "HIGHWATER_PROFILE"
BOOTSTRAP_KEY: Final = "bootstrap.servers"
MISSING_MESSAGE: Final = (
    "no bootstrap server: give --bootstrap-server HOST:PORT, set "
    f"${BOOTSTRAP_ENV}, or put {BOOTSTRAP_KEY} in the profile "
    f"(${PROFILE_ENV}, default ~/.config/highwater/profile.properties)"
)


def default_profile_path() -> Path:
    """``$XDG_CONFIG_HOME/highwater/profile.properties`` (``~/.config`` by default)."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "highwater" / "profile.properties"


def _profile() -> tuple[Path, dict[str, str]] | None:
    """The profile's path and properties; None when there is none to read."""
    named = os.environ.get(PROFILE_ENV)
    path = Path(named) if named else default_profile_path()
    if not named and not path.is_file():
        return None
    try:
        return path, read_properties(path)
    except InvalidConfigError as e:
        raise click.UsageError(f"the profile ${PROFILE_ENV}: {e}" if named else str(e)) from None


def _addresses(value: str, origin: str) -> str:
    try:
        return ",".join(parse_addresses(value))
    except click.BadParameter as e:
        raise click.UsageError(f"{origin}: {e.message}") from None


def resolve_bootstrap(
    ctx: click.Context, flag_value: str | None, default: str | None = None
) -> str:
    """The bootstrap address by the precedence above; the profile's client properties are
    applied on the way unless ``--command-config`` was given."""
    profile = _profile()
    if profile is not None:
        path, props = profile
        security = {k: v for k, v in props.items() if k != BOOTSTRAP_KEY}
        if security and ctx.get_parameter_source("command_config") in (
            None,
            ParameterSource.DEFAULT,
        ):
            try:
                client = client_security_from_properties(security)
            except (TlsConfigError, InvalidConfigError) as e:
                raise click.UsageError(f"the profile {path}: {e}") from None
            configure(server=None, client=client.tls)
            configure_client_sasl(client.sasl)
    if flag_value is not None:
        return _addresses(flag_value, "--bootstrap-server")
    from_env = os.environ.get(BOOTSTRAP_ENV, "").strip()
    if from_env:
        return _addresses(from_env, f"${BOOTSTRAP_ENV}")
    if profile is not None and props.get(BOOTSTRAP_KEY, "").strip():
        return _addresses(props[BOOTSTRAP_KEY], f"{BOOTSTRAP_KEY} in the profile {path}")
    if default is not None:
        return default
    raise click.UsageError(MISSING_MESSAGE, ctx=ctx)


def bootstrap_server_option(*, default: str | None = None) -> Callable[[F], F]:
    """``--bootstrap-server`` resolved as the module says, passed on as ``bootstrap_server``
    (a checked ``a:1,b:2`` string)."""

    def callback(ctx: click.Context, _param: click.Parameter, value: str | None) -> str:
        return resolve_bootstrap(ctx, value, default)

    shown = f" (default: {default})" if default is not None else ""
    return click.option(
        "--bootstrap-server",
        "bootstrap_server",
        default=None,
        callback=callback,
        metavar="HOST:PORT[,HOST:PORT...]",
        help="Brokers to connect to (in `highwater server`, its one port); else "
        f"${BOOTSTRAP_ENV}, else bootstrap.servers in the profile{shown}.",
    )
