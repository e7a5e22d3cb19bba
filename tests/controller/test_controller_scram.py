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
        MetadataImage.empty(),
        upsertions=(upsert("alice", "pw-a"), upsert("alice", "pw-a", SHA512), upsert("bob", "b")),
    )
    assert errors == {"alice": ErrorCode.NONE, "bob": ErrorCode.NONE}
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
            upsert("alice", "new"),  # alice's mechanism named twice: DUPLICATE_RESOURCE
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
