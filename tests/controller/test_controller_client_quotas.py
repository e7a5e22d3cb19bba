"""The controller's client-quota requests on the pure core: records, refusals naming the
key, Kafka's describe filters, and snapshots that keep the quotas."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from highwater.controller.client_quota_control import ClientQuotaControl
from highwater.controller_api.messages import (
    CLIENT_QUOTA_MATCH_DEFAULT,
    CLIENT_QUOTA_MATCH_EXACT,
    CLIENT_QUOTA_MATCH_SPECIFIED,
    AlterClientQuotasRequest,
    ClientQuotaAlteration,
    ClientQuotaEntityComponent,
    ClientQuotaFilterComponent,
    ClientQuotaOp,
    DescribeClientQuotasRequest,
)
from highwater.metadata.client_quotas import DEFAULT_ENTITY, ClientQuotaEntity
from highwater.metadata.delta import replay
from highwater.metadata.image import MetadataImage
from highwater.metadata.snapshot import load_snapshot, snapshot_records
from highwater.v1.common_pb2 import ErrorCode

USER, CLIENT = "user", "client-id"


def entity(**names: str | None) -> tuple[ClientQuotaEntityComponent, ...]:
    return tuple(
        ClientQuotaEntityComponent(USER if t == "user" else CLIENT, n) for t, n in names.items()
    )


def alteration(
    components: tuple[ClientQuotaEntityComponent, ...], ops: Mapping[str, float | None]
) -> ClientQuotaAlteration:
    return ClientQuotaAlteration(
        components,
        tuple(
            ClientQuotaOp(k, 0.0, True) if v is None else ClientQuotaOp(k, v)
            for k, v in ops.items()
        ),
    )


def alter(
    image: MetadataImage, *entries: ClientQuotaAlteration, validate_only: bool = False
) -> tuple[MetadataImage, list[tuple[int, str]]]:
    result = ClientQuotaControl().alter(
        image, AlterClientQuotasRequest(tuple(entries), validate_only)
    )
    after = replay(result.records, image.offset + 1 + len(result.records), image=image)
    return after, [(r.error, r.error_message) for r in result.response.results]


def describe(
    image: MetadataImage, *components: ClientQuotaFilterComponent, strict: bool = False
) -> dict[ClientQuotaEntity, dict[str, float]]:
    reply = (
        ClientQuotaControl()
        .describe(image, DescribeClientQuotasRequest(tuple(components), strict))
        .response
    )
    assert reply.error == ErrorCode.NONE, reply.error_message
    return {
        ClientQuotaEntity.of({c.entity_type: c.entity_name for c in e.entity}): dict(e.values)
        for e in reply.entries
    }


@pytest.fixture
def image() -> MetadataImage:
    start = MetadataImage.empty()
    image, results = alter(
        start,
        alteration(entity(client_id="app"), {"producer_byte_rate": 1024}),
        alteration(entity(user="alice"), {"consumer_byte_rate": 2048, "request_percentage": 50}),
        alteration(entity(user="alice", client_id=None), {"producer_byte_rate": 4096}),
        alteration(entity(user=None), {"producer_byte_rate": 512}),
        alteration(entity(client_id=None), {"consumer_byte_rate": 100}),
    )
    assert results == [(ErrorCode.NONE, "")] * 5
    return image


def test_alterations_become_image_entities(image: MetadataImage) -> None:
    assert describe(image) == {
        ClientQuotaEntity(None, "app"): {"producer_byte_rate": 1024.0},
        ClientQuotaEntity("alice", None): {
            "consumer_byte_rate": 2048.0,
            "request_percentage": 50.0,
        },
        ClientQuotaEntity("alice", DEFAULT_ENTITY): {"producer_byte_rate": 4096.0},
        ClientQuotaEntity(DEFAULT_ENTITY, None): {"producer_byte_rate": 512.0},
        ClientQuotaEntity(None, DEFAULT_ENTITY): {"consumer_byte_rate": 100.0},
    }
    assert image.client_quotas.quota("alice", "app", "producer_byte_rate").bound == 4096  # type: ignore[union-attr]


def test_a_removal_and_a_change_are_records_and_no_op_writes_none(image: MetadataImage) -> None:
    after, results = alter(
        image,
        alteration(entity(user="alice"), {"consumer_byte_rate": None, "request_percentage": 75}),
    )
    assert results == [(ErrorCode.NONE, "")]
    assert describe(after)[ClientQuotaEntity("alice", None)] == {"request_percentage": 75.0}
    result = ClientQuotaControl().alter(
        after,
        AlterClientQuotasRequest(
            (
                alteration(
                    entity(user="alice"), {"request_percentage": 75, "consumer_byte_rate": None}
                ),
            )
        ),
    )
    assert result.records == []
    emptied, _ = alter(after, alteration(entity(user="alice"), {"request_percentage": None}))
    assert ClientQuotaEntity("alice", None) not in describe(emptied)


@pytest.mark.parametrize(
    ("ops", "components", "named"),
    [
        ({"producer_byte_rate": -1}, entity(user="bob"), "producer_byte_rate"),
        ({"producer_byte_rate": 0}, entity(user="bob"), "producer_byte_rate"),
        ({"consumer_byte_rate": 10.5}, entity(user="bob"), "consumer_byte_rate"),
        ({"request_percentage": float("nan")}, entity(user="bob"), "request_percentage"),
        ({"producer_bytes_rate": 10}, entity(user="bob"), "producer_bytes_rate"),
        ({"controller_mutation_rate": 5}, entity(user="bob"), "controller_mutation_rate"),
        ({"producer_byte_rate": 10}, entity(user=""), "Empty user not supported"),
        ({"producer_byte_rate": 10}, entity(client_id=""), "Empty client-id not supported"),
        ({"producer_byte_rate": 10}, entity(user="bob", client_id=""), "Empty client-id"),
        ({"producer_byte_rate": 1023.9999}, entity(user="bob"), "producer_byte_rate"),
        ({"producer_byte_rate": 10}, (ClientQuotaEntityComponent("ip", "1.2.3.4"),), "ip"),
        ({"producer_byte_rate": 10}, entity(user=DEFAULT_ENTITY), DEFAULT_ENTITY),
        ({"producer_byte_rate": 10}, (), "names a user, a client id, or both"),
        ({"producer_byte_rate": 10}, entity(user="a") + entity(user="b"), "twice"),
    ],
)
def test_bad_alterations_are_refused_naming_what_and_change_nothing(
    image: MetadataImage,
    ops: dict[str, float | None],
    components: tuple[ClientQuotaEntityComponent, ...],
    named: str,
) -> None:
    after, results = alter(
        image,
        alteration(components, ops),
        alteration(entity(user="carol"), {"producer_byte_rate": 10}),
    )
    (code, message), ok = results
    assert code == ErrorCode.INVALID_REQUEST and named in message
    assert ok == (ErrorCode.NONE, "")
    assert describe(after) == {
        **describe(image),
        ClientQuotaEntity("carol", None): {"producer_byte_rate": 10.0},
    }


def test_validate_only_changes_nothing(image: MetadataImage) -> None:
    after, results = alter(
        image, alteration(entity(user="dave"), {"producer_byte_rate": 1}), validate_only=True
    )
    assert results == [(ErrorCode.NONE, "")]
    assert after.client_quotas == image.client_quotas


def test_describe_filters_as_kafka(image: MetadataImage) -> None:
    exact_alice = ClientQuotaFilterComponent(USER, CLIENT_QUOTA_MATCH_EXACT, "alice")
    assert set(describe(image, exact_alice)) == {
        ClientQuotaEntity("alice", None),
        ClientQuotaEntity("alice", DEFAULT_ENTITY),
    }
    assert set(describe(image, exact_alice, strict=True)) == {ClientQuotaEntity("alice", None)}
    default_user = ClientQuotaFilterComponent(USER, CLIENT_QUOTA_MATCH_DEFAULT)
    assert set(describe(image, default_user)) == {ClientQuotaEntity(DEFAULT_ENTITY, None)}
    any_client = ClientQuotaFilterComponent(CLIENT, CLIENT_QUOTA_MATCH_SPECIFIED)
    assert set(describe(image, any_client, strict=True)) == {
        ClientQuotaEntity(None, "app"),
        ClientQuotaEntity(None, DEFAULT_ENTITY),
    }
    reply = (
        ClientQuotaControl()
        .describe(image, DescribeClientQuotasRequest((ClientQuotaFilterComponent("ip", 0, "x"),)))
        .response
    )
    assert reply.error == ErrorCode.INVALID_REQUEST and "ip" in reply.error_message


def test_snapshots_keep_the_quotas(image: MetadataImage) -> None:
    loaded = load_snapshot(list(snapshot_records(image)), image.offset, image.epoch)
    assert loaded.client_quotas == image.client_quotas


def test_an_entity_altered_again_in_one_request_is_ignored_after_its_first_entry(
    image: MetadataImage,
) -> None:
    """Kafka's ``alterClientQuotas``: "Ignoring duplicate entity" for the repeat, whatever
    order its components come in; the first entry applies."""
    after, results = alter(
        image,
        alteration(entity(user="bob", client_id="app"), {"producer_byte_rate": 1000}),
        alteration(entity(client_id="app", user="bob"), {"consumer_byte_rate": 2000}),
        alteration(entity(user="bob", client_id="app"), {"producer_byte_rate": 3000}),
    )
    assert results[0] == (ErrorCode.NONE, "")
    for code, message in results[1:]:
        assert code == ErrorCode.INVALID_REQUEST and "Ignoring duplicate entity" in message
    assert describe(after)[ClientQuotaEntity("bob", "app")] == {"producer_byte_rate": 1000.0}


def test_a_refused_entity_named_again_is_still_a_duplicate(image: MetadataImage) -> None:
    after, results = alter(
        image,
        alteration(entity(user="bob"), {"producer_byte_rate": -1}),
        alteration(entity(user="bob"), {"producer_byte_rate": 10}),
    )
    assert [code for code, _ in results] == [ErrorCode.INVALID_REQUEST] * 2
    assert "Ignoring duplicate entity" in results[1][1]
    assert describe(after) == describe(image)


def test_removals_are_not_checked_and_unknown_keys_remove_nothing(image: MetadataImage) -> None:
    result = ClientQuotaControl().alter(
        image,
        AlterClientQuotasRequest(
            (alteration(entity(user="alice"), {"no_such_key": None, "request_percentage": None}),)
        ),
    )
    assert [(r.error, r.error_message) for r in result.response.results] == [(ErrorCode.NONE, "")]
    assert [r.key for r in result.records] == ["request_percentage"]  # type: ignore[attr-defined]


def test_a_byte_rate_within_a_millionth_above_a_whole_number_is_accepted(
    image: MetadataImage,
) -> None:
    """Kafka's ``getErrorForIntegralQuotaValue`` refuses ``abs(value % 1.0) > 1e-6``."""
    after, results = alter(
        image, alteration(entity(user="bob"), {"producer_byte_rate": 1024.0000000001})
    )
    assert results == [(ErrorCode.NONE, "")]
    assert describe(after)[ClientQuotaEntity("bob", None)] == {
        "producer_byte_rate": 1024.0000000001
    }
