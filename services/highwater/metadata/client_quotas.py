"""Client quotas in the metadata: entities, keys, the image, and KIP-55's precedence.

A quota entity is a user, a client id, or a user and a client id (Kafka's quota entity
types ``user`` and ``client-id``); either may be that type's *default* entity, written
:data:`DEFAULT_ENTITY` (``<default>``), which stands for every user (or client id) that has
no entity of its own. Each entity holds values for the keys of :data:`QUOTA_KEYS`:

* ``producer_byte_rate`` and ``consumer_byte_rate``: bytes per second, whole numbers
  (Kafka tolerates a fractional part of at most 1e-6, and so does this);
* ``request_percentage``: percent of one request handler's time per quota window.

A request from user ``U`` with client id ``C`` takes each key's value from the first of
these entities that sets it (Kafka's KIP-55 order, most specific first)::

    1. user U,         client-id C
    2. user U,         client-id <default>
    3. user U
    4. user <default>, client-id C
    5. user <default>, client-id <default>
    6. user <default>
    7. client-id C
    8. client-id <default>

and shares the quota with every request that the same entity governs: an entity that
names a user (or the default user) counts per user, one that names a client id (or the
default one) per client id, as Kafka's quota metric tags do (:class:`QuotaMatch`).
Unauthenticated callers are the user ``ANONYMOUS``.

``ClientQuotaRecord`` carries one key of one entity; :class:`ClientQuotasImage` holds them
and memoizes each lookup, since an image never changes.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

__all__ = [
    "CLIENT_ID",
    "CONSUMER_BYTE_RATE",
    "DEFAULT_ENTITY",
    "ENTITY_TYPES",
    "PRODUCER_BYTE_RATE",
    "QUOTA_KEYS",
    "REQUEST_PERCENTAGE",
    "USER",
    "ClientQuotaEntity",
    "ClientQuotasImage",
    "QuotaMatch",
    "check_quota_value",
    "precedence",
]

USER: Final = "user"
CLIENT_ID: Final = "client-id"
ENTITY_TYPES: Final = (USER, CLIENT_ID)
DEFAULT_ENTITY: Final = "<default>"
"""The name of a type's default entity (Kafka's null entity name, as its tools print it)."""

PRODUCER_BYTE_RATE: Final = "producer_byte_rate"
CONSUMER_BYTE_RATE: Final = "consumer_byte_rate"
REQUEST_PERCENTAGE: Final = "request_percentage"
QUOTA_KEYS: Final = (PRODUCER_BYTE_RATE, CONSUMER_BYTE_RATE, REQUEST_PERCENTAGE)
_WHOLE_KEYS: Final = frozenset({PRODUCER_BYTE_RATE, CONSUMER_BYTE_RATE})


_WHOLE_TOLERANCE: Final = 1e-6
"""How far above a whole number a byte rate may be (Kafka's
``getErrorForIntegralQuotaValue``: ``abs(value % 1.0) > 1e-6`` is refused)."""


def check_quota_value(key: str, value: float) -> None:
    """``ValueError`` naming ``key`` if it is not a quota key or ``value`` is not one of its
    values (a positive number; a whole number of bytes for the byte rates, give or take
    what Kafka tolerates: a fractional part of at most :data:`_WHOLE_TOLERANCE`)."""
    if key not in QUOTA_KEYS:
        raise ValueError(f"Unknown quota configuration {key!r} (known: {', '.join(QUOTA_KEYS)})")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"Invalid value {value:g} for quota {key}: it must be positive")
    if key in _WHOLE_KEYS and abs(math.fmod(value, 1.0)) > _WHOLE_TOLERANCE:
        raise ValueError(f"Invalid value {value:g} for quota {key}: it must be a whole number")


@dataclass(frozen=True, slots=True)
class ClientQuotaEntity:
    """A quota entity: a user and/or a client id (``None``: no such component;
    :data:`DEFAULT_ENTITY`: the type's default)."""

    user: str | None = None
    client_id: str | None = None

    def __post_init__(self) -> None:
        if self.user is None and self.client_id is None:
            raise ValueError("a quota entity names a user, a client id, or both")

    @classmethod
    def of(cls, components: Mapping[str, str | None]) -> ClientQuotaEntity:
        """The entity of ``{entity type: name}`` (a ``None`` name: the default); a
        ``ValueError`` for an unknown type, an empty or reserved name or no component.

        An empty name is refused as Kafka's ``ClientQuotaControlManager.validateEntity``
        refuses it ("Empty client-id not supported"): the default is a null name, never
        ``""``, so an entity named ``""`` would govern only callers with an empty name."""
        unknown = set(components) - set(ENTITY_TYPES)
        if unknown:
            raise ValueError(
                f"Unknown quota entity type {sorted(unknown)[0]!r} "
                f"(known: {', '.join(ENTITY_TYPES)})"
            )
        names: dict[str, str] = {}
        for entity_type, name in components.items():
            if name == "":
                raise ValueError(f"Empty {entity_type} not supported")
            if name == DEFAULT_ENTITY:
                raise ValueError(f"{DEFAULT_ENTITY} is reserved for the default {entity_type}")
            names[entity_type] = DEFAULT_ENTITY if name is None else name
        return cls(names.get(USER), names.get(CLIENT_ID))

    def components(self) -> dict[str, str | None]:
        """``{entity type: name}``, ``None`` for a default, in Kafka's order (user first)."""
        found: dict[str, str | None] = {}
        for entity_type, name in ((USER, self.user), (CLIENT_ID, self.client_id)):
            if name is not None:
                found[entity_type] = None if name == DEFAULT_ENTITY else name
        return found

    def __str__(self) -> str:
        parts = []
        for entity_type, name in ((USER, self.user), (CLIENT_ID, self.client_id)):
            if name is not None:
                parts.append(f"{entity_type} {name if name == DEFAULT_ENTITY else repr(name)}")
        return ", ".join(parts)


def precedence(user: str, client_id: str) -> tuple[ClientQuotaEntity, ...]:
    """The eight entities that may govern ``(user, client_id)``, in KIP-55's order."""
    d = DEFAULT_ENTITY
    return (
        ClientQuotaEntity(user, client_id),
        ClientQuotaEntity(user, d),
        ClientQuotaEntity(user, None),
        ClientQuotaEntity(d, client_id),
        ClientQuotaEntity(d, d),
        ClientQuotaEntity(d, None),
        ClientQuotaEntity(None, client_id),
        ClientQuotaEntity(None, d),
    )


@dataclass(frozen=True, slots=True)
class QuotaMatch:
    """The quota that governs a request, and who shares it.

    ``bound``: the key's value; ``entity``: the entity it came from; ``user`` and
    ``client_id``: Kafka's quota metric tags, the request's own names for the components
    the entity has (``""`` for the others), so that every request they equal shares one
    measured rate.
    """

    bound: float
    entity: ClientQuotaEntity
    user: str
    client_id: str


class ClientQuotasImage:
    """Every quota entity's values, by entity and key (see the module docstring)."""

    __slots__ = ("_matches", "entities")

    def __init__(self, entities: Mapping[ClientQuotaEntity, Mapping[str, float]] | None = None):
        self.entities: Mapping[ClientQuotaEntity, Mapping[str, float]] = MappingProxyType(
            {e: MappingProxyType(dict(v)) for e, v in (entities or {}).items() if v}
        )
        self._matches: dict[tuple[str, str, str], QuotaMatch | None] = {}

    def __len__(self) -> int:
        return len(self.entities)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ClientQuotasImage):
            return NotImplemented
        return {e: dict(v) for e, v in self.entities.items()} == {
            e: dict(v) for e, v in other.entities.items()
        }

    def __hash__(self) -> int:
        return hash(frozenset((e, frozenset(v.items())) for e, v in self.entities.items()))

    def __repr__(self) -> str:
        return f"ClientQuotasImage({ {e: dict(v) for e, v in self.entities.items()}!r})"

    def values(self, entity: ClientQuotaEntity) -> Mapping[str, float]:
        """The keys ``entity`` sets (empty: none)."""
        return self.entities.get(entity, MappingProxyType({}))

    def items(self) -> Iterator[tuple[ClientQuotaEntity, str, float]]:
        """Every ``(entity, key, value)``, sorted."""
        for entity in sorted(self.entities, key=_sort_key):
            for key, value in sorted(self.entities[entity].items()):
                yield entity, key, value

    def quota(self, user: str, client_id: str, key: str) -> QuotaMatch | None:
        """The quota on ``key`` for requests of ``user`` with ``client_id`` (``None``: none
        applies, the requests are not limited)."""
        if not self.entities:
            return None
        lookup = (user, client_id, key)
        try:
            return self._matches[lookup]
        except KeyError:
            pass
        found = None
        for entity in precedence(user, client_id):
            bound = self.entities.get(entity, {}).get(key)
            if bound is not None:
                found = QuotaMatch(
                    bound,
                    entity,
                    user if entity.user is not None else "",
                    client_id if entity.client_id is not None else "",
                )
                break
        if len(self._matches) < 100_000:  # callers are few; a flood of names is not kept
            self._matches[lookup] = found
        return found


def _sort_key(entity: ClientQuotaEntity) -> tuple[str, str]:
    return (entity.user or "", entity.client_id or "")
