"""Client quotas: AlterClientQuotas and DescribeClientQuotas as records (Kafka's
ClientQuotaControlManager).

Each key set or removed is a ``ClientQuotaRecord`` of its entity (a user, a client id, or
both; see :mod:`highwater.metadata.client_quotas`), which every broker replays into its
image and enforces. An entry of an alteration is checked as a whole: an unknown entity
type, a type named twice, an empty name (Kafka: "Empty client-id not supported"; the
default entity has no name, not an empty one), the reserved name ``<default>``, a key
named twice, a value that is not positive (or not whole, for the byte rates) or of an
unknown key makes that entry INVALID_REQUEST, naming the key or entity, and it changes
nothing; the other entries of the request are applied. An entity named again in the same
request is INVALID_REQUEST ("Ignoring duplicate entity", as Kafka's
``alterClientQuotas``), only the first of its entries counting. Setting a key to the
value it has, or removing one that is not set, writes no record; a removal is not
checked further (as in Kafka), so removing an unknown key is a success that writes
nothing.

Describing follows Kafka's filter: each component matches one entity type EXACT (that
name), DEFAULT (the type's default entity) or SPECIFIED (any entity of the type, the
default included); every component must match, and ``strict`` leaves out entities with
components the filter does not name.
"""

from __future__ import annotations

from highwater.controller.results import ControllerResult
from highwater.controller_api.messages import (
    CLIENT_QUOTA_MATCH_DEFAULT,
    CLIENT_QUOTA_MATCH_EXACT,
    CLIENT_QUOTA_MATCH_SPECIFIED,
    AlterClientQuotasRequest,
    AlterClientQuotasResponse,
    AlterClientQuotasResult,
    ClientQuotaAlteration,
    ClientQuotaEntityComponent,
    ClientQuotaFilterComponent,
    DescribeClientQuotasRequest,
    DescribeClientQuotasResponse,
    DescribedClientQuota,
)
from highwater.metadata.client_quotas import (
    DEFAULT_ENTITY,
    ENTITY_TYPES,
    ClientQuotaEntity,
    check_quota_value,
)
from highwater.metadata.delta import MetadataDelta
from highwater.metadata.image import MetadataImage
from highwater.metadata.records import ClientQuotaRecord, MetadataRecord
from highwater.v1.common_pb2 import ErrorCode

__all__ = [
    "ClientQuotaControl",
    "check_filter",
    "entity_components",
    "entity_of",
    "filter_matches",
]


def entity_of(components: tuple[ClientQuotaEntityComponent, ...]) -> ClientQuotaEntity:
    """The entity the components name; ``ValueError`` saying what is wrong with them."""
    named: dict[str, str | None] = {}
    for component in components:
        if component.entity_type in named:
            raise ValueError(f"entity type {component.entity_type!r} is named twice")
        named[component.entity_type] = component.entity_name
    return ClientQuotaEntity.of(named)


def entity_components(entity: ClientQuotaEntity) -> tuple[ClientQuotaEntityComponent, ...]:
    """The wire components of ``entity`` (user first; a default has no name)."""
    return tuple(ClientQuotaEntityComponent(t, n) for t, n in entity.components().items())


def check_filter(components: tuple[ClientQuotaFilterComponent, ...]) -> None:
    """``ValueError`` for an unknown entity type or match type, or a type named twice."""
    seen: set[str] = set()
    for component in components:
        if component.entity_type not in ENTITY_TYPES:
            raise ValueError(
                f"Unknown quota entity type {component.entity_type!r} "
                f"(known: {', '.join(ENTITY_TYPES)})"
            )
        if component.entity_type in seen:
            raise ValueError(f"entity type {component.entity_type!r} is filtered twice")
        seen.add(component.entity_type)
        if component.match_type not in (
            CLIENT_QUOTA_MATCH_EXACT,
            CLIENT_QUOTA_MATCH_DEFAULT,
            CLIENT_QUOTA_MATCH_SPECIFIED,
        ):
            raise ValueError(f"unknown match type {component.match_type}")


def filter_matches(
    components: tuple[ClientQuotaFilterComponent, ...], strict: bool, entity: ClientQuotaEntity
) -> bool:
    """Whether ``entity`` is one the (checked) filter describes."""
    names = {"user": entity.user, "client-id": entity.client_id}
    for component in components:
        name = names[component.entity_type]
        if name is None:
            return False
        if component.match_type == CLIENT_QUOTA_MATCH_EXACT and (
            name == DEFAULT_ENTITY or name != component.match
        ):
            return False
        if component.match_type == CLIENT_QUOTA_MATCH_DEFAULT and name != DEFAULT_ENTITY:
            return False
    if strict:
        filtered = {c.entity_type for c in components}
        return all(t in filtered for t, n in names.items() if n is not None)
    return True


class ClientQuotaControl:
    """The controller's client-quota requests (see the module docstring)."""

    def alter(
        self, image: MetadataImage, request: AlterClientQuotasRequest
    ) -> ControllerResult[AlterClientQuotasResponse]:
        delta = MetadataDelta(image)
        records: list[MetadataRecord] = []
        results: list[AlterClientQuotasResult] = []
        seen: set[frozenset[tuple[str, str | None]]] = set()
        for entry in request.entries:
            named = frozenset((c.entity_type, c.entity_name) for c in entry.entity)
            if named in seen:
                results.append(
                    AlterClientQuotasResult(
                        ErrorCode.INVALID_REQUEST,
                        "Ignoring duplicate entity: it is altered earlier in the request",
                        entry.entity,
                    )
                )
                continue
            seen.add(named)
            try:
                entity, changes = _checked(entry)
            except ValueError as e:
                results.append(
                    AlterClientQuotasResult(ErrorCode.INVALID_REQUEST, str(e), entry.entity)
                )
                continue
            current = delta.client_quota_values(entity)
            for key, value in changes.items():
                if current.get(key) == value:
                    continue
                record = ClientQuotaRecord(entity.user, entity.client_id, key, value)
                delta.replay(record)
                records.append(record)
            results.append(AlterClientQuotasResult(entity=entry.entity))
        if request.validate_only:
            records = []
        return ControllerResult(records, AlterClientQuotasResponse(results=tuple(results)))

    def describe(
        self, image: MetadataImage, request: DescribeClientQuotasRequest
    ) -> ControllerResult[DescribeClientQuotasResponse]:
        try:
            check_filter(request.components)
        except ValueError as e:
            return ControllerResult(
                [],
                DescribeClientQuotasResponse(error=ErrorCode.INVALID_REQUEST, error_message=str(e)),
            )
        quotas = image.client_quotas
        entries = tuple(
            DescribedClientQuota(entity_components(entity), quotas.values(entity))
            for entity in sorted(quotas.entities, key=lambda e: (e.user or "", e.client_id or ""))
            if filter_matches(request.components, request.strict, entity)
        )
        return ControllerResult([], DescribeClientQuotasResponse(entries=entries))


def _checked(entry: ClientQuotaAlteration) -> tuple[ClientQuotaEntity, dict[str, float | None]]:
    """The entity of ``entry`` and its changes by key (``None``: removed), checked."""
    entity = entity_of(entry.entity)
    changes: dict[str, float | None] = {}
    for op in entry.ops:
        if op.key in changes:
            raise ValueError(f"quota {op.key} is altered twice for {entity}")
        if op.remove:
            changes[op.key] = None
        else:
            check_quota_value(op.key, op.value)
            changes[op.key] = float(op.value)
    return entity, changes
