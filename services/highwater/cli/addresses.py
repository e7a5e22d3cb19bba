"""Address lists on the command line: ``--bootstrap-server`` and ``--controllers`` values.

Both take ``HOST:PORT[,HOST:PORT...]``; each address is checked, blanks dropped, and a bad
one is a usage error naming it (click's ``BadParameter``).
"""

from __future__ import annotations

import click

from highwater.rpc.endpoints import parse_endpoint


def parse_addresses(value: str) -> list[str]:
    """``HOST:PORT[,HOST:PORT...]`` as a list; ``click.BadParameter`` if empty or malformed."""
    addresses = [part.strip() for part in value.split(",") if part.strip()]
    if not addresses:
        raise click.BadParameter("give at least one HOST:PORT")
    for address in addresses:
        try:
            parse_endpoint(address)
        except ValueError as e:
            raise click.BadParameter(str(e)) from None
    return addresses


def address_list(_ctx: click.Context, _param: click.Parameter, value: str) -> str:
    """A click callback: the checked list, joined again (``a:1,b:2``)."""
    return ",".join(parse_addresses(value))
