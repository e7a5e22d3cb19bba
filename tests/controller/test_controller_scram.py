"""The controller's SCRAM credential requests on the pure core, down to an exchange that
authenticates against the credential the image holds."""

from __future__ import annotations

import pytest
from highwater.controller.scram_control import ScramControl
from highwater.controller_api.messages import (
    AlterUserScramCredentialsRequest,
    DescribeUserScramCredentialsRequest,
    ScramCredentialDeletion,
    ScramCredentialUpsertion,
)
from highwater.errors import SaslAuthenticationError
from highwater.metadata.delta import replay
from highwater.metadata.image import MetadataImage
from highwater.metadata.snapshot import load_snapshot, snapshot_records
from highwater.security.scram import ScramExchange, salted_password
from highwater.v1.common_pb2 import ErrorCode
from scramp import ScramClient

SHA256, SHA512 = 1, 2
SALT = b"salt-of-16-bytes"


def upsert(
    name: str, password: str, mechanism: int = SHA256, iterations: int = 4096
) -> ScramCredentialUpsertion:
    names = {SHA256: "SCRAM-SHA-256", SHA512: "SCRAM-SHA-512"}
    salted = salted_password(names.get(mechanism, "SCRAM-SHA-256"), password, SALT, 4096)
    return ScramCredentialUpsertion(name, mechanism, iterations, SALT, salted)


def alter(image: MetadataImage, **kw: object) -> tuple[MetadataImage, dict[str, int]]:
    result = ScramControl().alter(image, AlterUserScramCredentialsRequest(**kw))  # type: ignore[arg-type]
    after = replay(result.records, image.offset + 1 + len(result.records), image=image)
    return after, {r.user: r.error for r in result.response.results}


def authenticate(image: MetadataImage, user: str, password: str, mechanism: str) -> str:
    exchange = ScramExchange(mechanism, image.scram.credential)
    client = ScramClient([mechanism], user, password)
    client.set_server_first(exchange.respond(client.get_client_first().encode()).decode())
    client.set_server_final(exchange.respond(client.get_client_final().encode()).decode())
    return exchange.user


def test_a_credential_set_through_the_controller_authenticates() -> None:
    image, errors = alter(
        MetadataImage.empty(), upsertions=(upsert("alice", "pw-a"), upsert("bob", "b"))
    )
    assert errors == {"alice": ErrorCode.NONE, "bob": ErrorCode.NONE}
    # A user is altered once per request: the second mechanism comes in a second one.
    image, errors = alter(image, upsertions=(upsert("alice", "pw-a", SHA512),))
    assert errors == {"alice": ErrorCode.NONE}
    assert authenticate(image, "alice", "pw-a", "SCRAM-SHA-512") == "alice"
    with pytest.raises(SaslAuthenticationError):
        authenticate(image, "bob", "wrong", "SCRAM-SHA-256")
    described = ScramControl().describe(image, DescribeUserScramCredentialsRequest()).response
    assert [
        (r.user, [(c.mechanism, c.iterations) for c in r.credentials]) for r in described.results
    ] == [
        ("alice", [(SHA256, 4096), (SHA512, 4096)]),
        ("bob", [(SHA256, 4096)]),
    ]
    # A snapshot keeps them.
    loaded = load_snapshot(list(snapshot_records(image)), image.offset, image.epoch)
    assert authenticate(loaded, "alice", "pw-a", "SCRAM-SHA-256") == "alice"


def test_refusals_keep_the_users_other_changes_out() -> None:
    image, _ = alter(MetadataImage.empty(), upsertions=(upsert("alice", "old"),))
    after, errors = alter(
        image,
        deletions=(
            ScramCredentialDeletion("alice", SHA256),
            ScramCredentialDeletion("eve", SHA256),
        ),
        upsertions=(
            upsert("alice", "new"),  # alice altered twice: DUPLICATE_RESOURCE
            upsert("carol", "c", mechanism=9),
            upsert("dave", "d", iterations=100),
        ),
    )
    assert errors == {
        "alice": ErrorCode.DUPLICATE_RESOURCE,
        "eve": ErrorCode.RESOURCE_NOT_FOUND,
        "carol": ErrorCode.UNSUPPORTED_SASL_MECHANISM,
        "dave": ErrorCode.UNACCEPTABLE_CREDENTIAL,
    }
    assert authenticate(after, "alice", "old", "SCRAM-SHA-256") == "alice"  # unchanged
    gone, errors = alter(after, deletions=(ScramCredentialDeletion("alice", SHA256),))
    assert errors == {"alice": ErrorCode.NONE}
    assert gone.scram.credential("alice", "SCRAM-SHA-256") is None
    described = (
        ScramControl()
        .describe(gone, DescribeUserScramCredentialsRequest(users=("alice",)))
        .response
    )
    assert described.results[0].error == ErrorCode.RESOURCE_NOT_FOUND


@pytest.mark.parametrize(
    "alterations",
    [
        # Two mechanisms of one user, a deletion and an upsertion, two deletions: each
        # alters the user twice in one request (Kafka keys the check on the user name).
        {"upsertions": (upsert("alice", "new"), upsert("alice", "new", SHA512))},
        {
            "deletions": (ScramCredentialDeletion("alice", SHA256),),
            "upsertions": (upsert("alice", "new", SHA512),),
        },
        {
            "deletions": (
                ScramCredentialDeletion("alice", SHA256),
                ScramCredentialDeletion("alice", SHA512),
            )
        },
    ],
)
def test_a_user_altered_twice_in_one_request_is_a_duplicate_and_keeps_its_credentials(
    alterations: dict[str, object],
) -> None:
    image, _ = alter(MetadataImage.empty(), upsertions=(upsert("alice", "old"),))
    image, _ = alter(image, upsertions=(upsert("alice", "old", SHA512),))
    deletions: tuple[ScramCredentialDeletion, ...] = alterations.get("deletions", ())  # type: ignore[assignment]
    upsertions: tuple[ScramCredentialUpsertion, ...] = alterations.get("upsertions", ())  # type: ignore[assignment]
    result = ScramControl().alter(
        image,
        AlterUserScramCredentialsRequest(deletions, (*upsertions, upsert("bob", "b"))),
    )
    assert [(r.user, r.error) for r in result.response.results] == [
        ("alice", ErrorCode.DUPLICATE_RESOURCE),
        ("bob", ErrorCode.NONE),
    ]
    assert [r.name for r in result.records] == ["bob"]  # type: ignore[attr-defined]


def test_a_refused_first_alteration_decides_the_user_s_answer() -> None:
    _, errors = alter(
        MetadataImage.empty(),
        upsertions=(upsert("alice", "a", iterations=100), upsert("alice", "a")),
    )
    assert errors == {"alice": ErrorCode.UNACCEPTABLE_CREDENTIAL}


@pytest.mark.parametrize(
    "alterations",
    [
        {"deletions": (ScramCredentialDeletion("", SHA256),)},
        {"deletions": (ScramCredentialDeletion("", 9),)},
        {"upsertions": (upsert("", "pw"),)},
        {"upsertions": (upsert("", "pw", mechanism=9),)},
    ],
)
def test_an_empty_user_name_is_refused_before_the_mechanism(
    alterations: dict[str, object],
) -> None:
    result = ScramControl().alter(
        MetadataImage.empty(),
        AlterUserScramCredentialsRequest(**alterations),  # type: ignore[arg-type]
    )
    assert [(r.user, r.error, r.error_message) for r in result.response.results] == [
        ("", ErrorCode.UNACCEPTABLE_CREDENTIAL, "Username must not be empty")
    ]
    assert result.records == []
