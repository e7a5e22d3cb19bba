"""Named listeners: Kafka's ``listeners``, ``advertised.listeners``, ``inter.broker.listener.name``.

A broker (and a group coordinator) may listen on several named listeners, each on a port
of its own: ``listeners=INTERNAL://0.0.0.0:9092,EXTERNAL://0.0.0.0:9094``. Each listener
is advertised (registered with the controller, named in Metadata and FindCoordinator
answers) at its ``advertised.listeners`` address, or at its bind address when that key
leaves it out: ``advertised.listeners=INTERNAL://pod.svc:9092,EXTERNAL://203.0.113.7:31001``.
A client is told, for every broker, the address on the listener its request arrived on
(Kafka's rule), so a client that bootstrapped through EXTERNAL never learns an INTERNAL
address. Followers, coordinators and the other brokers use ``inter.broker.listener.name``
(by default the first listener); a broker registers that listener first, so a peer that
knows no names takes the first endpoint of a registration.

Without ``listeners``, a role listens on its ``--listen`` address as the one listener
``PLAINTEXT`` (and ``--advertised-listener`` is that listener's advertised address), the
single-address behaviour from before named listeners.

Every listener shares the process's transport security (the ``--tls-*`` flags); Kafka's
``listener.security.protocol.map`` is not supported, so one listener cannot be plaintext
while another is TLS.

:func:`resolve_listeners` checks what spans keys and refuses, naming the key: a duplicate
listener name or address, an advertised listener whose name is not a listener, an
advertised address of ``0.0.0.0``, an ``inter.broker.listener.name`` that names no
listener, and ``--listen`` given together with ``listeners``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar, Final

from highwater.config.definition import ConfigType, ConfigValue, Validator
from highwater.errors import InvalidConfigError

__all__ = [
    "ADVERTISED_LISTENERS",
    "DEFAULT_LISTENER_NAME",
    "INTER_BROKER_LISTENER_NAME",
    "LISTENERS",
    "Listener",
    "ListenerList",
    "ListenerName",
    "Listeners",
    "parse_listener_list",
    "resolve_listeners",
]

LISTENERS: Final = "listeners"
ADVERTISED_LISTENERS: Final = "advertised.listeners"
INTER_BROKER_LISTENER_NAME: Final = "inter.broker.listener.name"

DEFAULT_LISTENER_NAME: Final = "PLAINTEXT"
"""The name of the one listener made from ``--listen``."""

_LISTENER = re.compile(
    r"(?P<name>[A-Za-z][A-Za-z0-9_-]*)://"
    r"(?:\[(?P<ipv6>[0-9A-Fa-f:.]+)\]|(?P<host>[A-Za-z0-9._-]+)):(?P<port>[0-9]+)"
)
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")
_WILDCARDS: Final = frozenset({"0.0.0.0", "::"})


@dataclass(frozen=True, slots=True)
class Listener:
    """One named address: ``NAME://HOST:PORT``. Names are upper-cased, as Kafka's are."""

    name: str
    host: str
    port: int

    @property
    def address(self) -> str:
        """``HOST:PORT`` (an IPv6 host in brackets)."""
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    def __str__(self) -> str:
        return f"{self.name}://{self.address}"


def parse_listener_list(text: str) -> tuple[Listener, ...]:
    """``NAME://HOST:PORT,...`` as listeners, in order; :class:`ValueError` naming the entry
    that is malformed or whose name appears twice."""
    listeners: list[Listener] = []
    for part in text.split(","):
        entry = part.strip()
        if not entry:
            continue
        match = _LISTENER.fullmatch(entry)
        if match is None:
            raise ValueError(f"{entry!r} is not NAME://HOST:PORT")
        port = int(match["port"])
        if port > 65535:
            raise ValueError(f"{entry!r}: port {port} is out of range")
        listener = Listener(match["name"].upper(), match["ipv6"] or match["host"], port)
        if any(existing.name == listener.name for existing in listeners):
            raise ValueError(f"the listener name {listener.name} appears twice")
        listeners.append(listener)
    return tuple(listeners)


@dataclass(frozen=True, slots=True)
class ListenerList(Validator):
    """A config value that must be a list of ``NAME://HOST:PORT`` with distinct names."""

    types: ClassVar[frozenset[ConfigType]] = frozenset({ConfigType.STRING})

    def __call__(self, value: ConfigValue) -> None:
        parse_listener_list(str(value))

    def allowed(self) -> str:
        return "a comma-separated list of NAME://HOST:PORT with distinct names"

    def describe(self) -> str:
        return "NAME://HOST:PORT,..."


@dataclass(frozen=True, slots=True)
class ListenerName(Validator):
    """A config value that is empty or a listener name."""

    types: ClassVar[frozenset[ConfigType]] = frozenset({ConfigType.STRING})

    def __call__(self, value: ConfigValue) -> None:
        if value and not _NAME.fullmatch(str(value)):
            raise ValueError("not a listener name")

    def allowed(self) -> str:
        return "a listener name (letters, digits, _ and -)"

    def describe(self) -> str:
        return "NAME"


@dataclass(frozen=True, slots=True)
class Listeners:
    """A role's listeners, resolved: ``bound`` (where it listens) and ``advertised``
    (where it is reached), in the same order, the inter-broker listener first."""

    bound: tuple[Listener, ...]
    advertised: tuple[Listener, ...]

    @property
    def inter_broker(self) -> Listener:
        """The bind address of the listener peers use."""
        return self.bound[0]

    @property
    def inter_broker_name(self) -> str:
        return self.bound[0].name

    def advertised_for(self, name: str) -> Listener | None:
        for listener in self.advertised:
            if listener.name == name:
                return listener
        return None

    @property
    def host_listener_name(self) -> str | None:
        """The name a process's gRPC host gives the inter-broker listener, so that its
        handlers know which listener a request came by: None with a single listener,
        where every answer names each peer's first listener (the inter-broker one) as
        before named listeners, and no call pays for telling."""
        return self.inter_broker_name if len(self.bound) > 1 else None

    @property
    def more_bound(self) -> tuple[tuple[str, str], ...]:
        """``(name, HOST:PORT)`` of every listener but the inter-broker one."""
        return tuple((listener.name, listener.address) for listener in self.bound[1:])


def _refuse(key: str, value: str, reason: str) -> InvalidConfigError:
    return InvalidConfigError(f"Invalid value {value!r} for configuration {key}: {reason}")


def resolve_listeners(
    *,
    listeners: str = "",
    advertised_listeners: str = "",
    inter_broker_listener_name: str = "",
    listen: str | None = None,
    advertised_listener: str | None = None,
) -> Listeners:
    """The listeners of a role from its config keys (``listeners``, ``advertised.listeners``,
    ``inter.broker.listener.name``) and its ``--listen``/``--advertised-listener`` flags
    (the one ``PLAINTEXT`` listener when ``listeners`` is empty); see the module docstring.

    Raises :class:`InvalidConfigError` naming the key at fault.
    """
    try:
        bound = parse_listener_list(listeners)
    except ValueError as e:
        raise _refuse(LISTENERS, listeners, str(e)) from None
    try:
        advertised = parse_listener_list(advertised_listeners)
    except ValueError as e:
        raise _refuse(ADVERTISED_LISTENERS, advertised_listeners, str(e)) from None
    if bound:
        if listen is not None:
            raise InvalidConfigError(
                f"--listen and the configuration {LISTENERS} are both given: use one of them"
            )
        if advertised_listener is not None:
            raise InvalidConfigError(
                f"--advertised-listener and the configuration {LISTENERS} are both given: "
                f"name the advertised addresses in {ADVERTISED_LISTENERS}"
            )
    else:
        if listen is None:
            raise InvalidConfigError(f"no address to listen on: give --listen or {LISTENERS}")
        bound = parse_listener_list(f"{DEFAULT_LISTENER_NAME}://{listen}")
        if advertised_listener is not None:
            if advertised:
                raise InvalidConfigError(
                    f"--advertised-listener and the configuration {ADVERTISED_LISTENERS} "
                    "are both given: use one of them"
                )
            advertised = parse_listener_list(f"{DEFAULT_LISTENER_NAME}://{advertised_listener}")
    addresses = [(listener.host, listener.port) for listener in bound]
    for listener in bound:
        if addresses.count((listener.host, listener.port)) > 1:
            raise _refuse(LISTENERS, listeners, f"{listener.address} is bound twice")
    names = [listener.name for listener in bound]
    for listener in advertised:
        if listener.name not in names:
            raise _refuse(
                ADVERTISED_LISTENERS,
                advertised_listeners,
                f"{listener.name} is not a listener (listeners: {', '.join(names)})",
            )
        if listener.host in _WILDCARDS:
            raise _refuse(
                ADVERTISED_LISTENERS,
                advertised_listeners,
                f"{listener} is not an address a client can connect to",
            )
    resolved = [
        next((a for a in advertised if a.name == listener.name), listener) for listener in bound
    ]
    for listener, given in zip(bound, resolved, strict=True):
        # --listen 0.0.0.0:P alone keeps its old meaning (advertised as given).
        if listeners and given is listener and listener.host in _WILDCARDS:
            raise _refuse(
                ADVERTISED_LISTENERS,
                advertised_listeners,
                f"the listener {listener} binds every interface and needs an advertised address",
            )
    inter = (inter_broker_listener_name or names[0]).upper()
    if inter not in names:
        raise _refuse(
            INTER_BROKER_LISTENER_NAME,
            inter_broker_listener_name,
            f"no listener is named {inter} (listeners: {', '.join(names)})",
        )
    order = sorted(range(len(bound)), key=lambda i: bound[i].name != inter)
    return Listeners(
        bound=tuple(bound[i] for i in order), advertised=tuple(resolved[i] for i in order)
    )
