"""The Authenticate exchange's pure core: SCRAM and OAUTHBEARER logins end in a session
token bounded by the credential; wrong passwords and unknown users fail alike; replayed
exchanges, forged, foreign and expired tokens are refused; failures are rate-limited per
host; a broker speaks only for its own node id."""

from __future__ import annotations

import importlib
import json
import pkgutil
from pathlib import Path
from typing import Any

import highwater.internal.v1
import highwater.v1
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from highwater.errors import InvalidConfigError, SaslAuthenticationError
from highwater.security.acl import AclOperation
from highwater.security.authentication import (
    MAX_PENDING_EXCHANGES,
    AuthenticationSettings,
    Authenticator,
    SessionTokens,
    StepResult,
)
from highwater.security.node_identities import NodeIdentities
from highwater.security.oauthbearer import JwtValidator
from highwater.security.rpc_access import RPC_ACCESS, OnCluster, PerItem, access_of
from highwater.security.sasl_client import SaslCredentials
from highwater.security.scram import ScramCredential, make_credential
from highwater.v1.common_pb2 import ErrorCode

NOW = 1_800_000_000.0
HOST = "10.0.0.7"
ISSUER, AUDIENCE = "https://idp.example", "highwater"


@pytest.fixture(scope="module")
def credentials() -> dict[tuple[str, str], ScramCredential]:
    return {
        ("alice", mechanism): make_credential(mechanism, "alice-secret")
        for mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512")
    }


@pytest.fixture(scope="module")
def signing_key() -> Any:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@pytest.fixture(scope="module")
def validator(signing_key: Any, tmp_path_factory: pytest.TempPathFactory) -> JwtValidator:
    jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(signing_key.public_key()))
    path: Path = tmp_path_factory.mktemp("jwks") / "jwks.json"
    path.write_text(json.dumps({"keys": [{**jwk, "kid": "k1"}]}))
    return JwtValidator.from_file(path, issuer=ISSUER, audience=AUDIENCE)


@pytest.fixture
def authenticator(
    credentials: dict[tuple[str, str], ScramCredential], validator: JwtValidator
) -> Authenticator:
    settings = AuthenticationSettings(
        enabled_mechanisms=("SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"),
        jwt_validator=validator,
        max_session_s=600,
    )
    return Authenticator(settings, lambda user, mechanism: credentials.get((user, mechanism)))


def login(
    authenticator: Authenticator,
    credentials: SaslCredentials,
    *,
    host: str = HOST,
    now: float = NOW,
) -> StepResult:
    """Run a whole exchange as a client would; the last answer."""
    exchange = credentials.exchange()
    message: bytes | None = exchange.first()
    exchange_id = ""
    while True:
        assert message is not None
        answer = authenticator.step(host, credentials.mechanism, message, exchange_id, now)
        if answer.error or answer.complete:
            if answer.complete and answer.auth_bytes:
                assert exchange.respond(answer.auth_bytes) is None  # server signature checks
            return answer
        exchange_id = answer.exchange_id
        message = exchange.respond(answer.auth_bytes)


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_scram_login_gives_a_session_token(authenticator: Authenticator, mechanism: str) -> None:
    answer = login(authenticator, SaslCredentials(mechanism, "alice", "alice-secret"))
    assert answer.complete and answer.error == 0
    assert answer.principal == "User:alice"
    assert answer.session_lifetime_ms == 600_000
    session = authenticator.session(answer.session_token, NOW + 1)
    assert (session.principal, session.mechanism) == ("User:alice", mechanism)
    with pytest.raises(SaslAuthenticationError, match="expired"):
        authenticator.session(answer.session_token, NOW + 600)


def test_wrong_password_and_unknown_user_fail_alike(authenticator: Authenticator) -> None:
    wrong = login(authenticator, SaslCredentials("SCRAM-SHA-256", "alice", "guess"))
    unknown = login(authenticator, SaslCredentials("SCRAM-SHA-256", "nobody", "guess"))
    for answer in (wrong, unknown):
        assert answer.error == ErrorCode.SASL_AUTHENTICATION_FAILED
        assert answer.failed and not answer.session_token
    assert wrong.error_message == unknown.error_message


def test_a_replayed_exchange_is_refused(authenticator: Authenticator) -> None:
    exchange = SaslCredentials("SCRAM-SHA-256", "alice", "alice-secret").exchange()
    first = exchange.first()
    server_first = authenticator.step(HOST, "SCRAM-SHA-256", first, "", NOW)
    final = exchange.respond(server_first.auth_bytes)
    assert final is not None
    done = authenticator.step(HOST, "SCRAM-SHA-256", final, server_first.exchange_id, NOW)
    assert done.complete
    # The same client-final again, under the same exchange: the exchange is over.
    again = authenticator.step(HOST, "SCRAM-SHA-256", final, server_first.exchange_id, NOW)
    assert again.error == ErrorCode.ILLEGAL_SASL_STATE and not again.session_token
    # The recorded client-first and client-final in a new exchange: a new server nonce.
    replay = authenticator.step(HOST, "SCRAM-SHA-256", first, "", NOW)
    refused = authenticator.step(HOST, "SCRAM-SHA-256", final, replay.exchange_id, NOW)
    assert refused.error == ErrorCode.SASL_AUTHENTICATION_FAILED and not refused.session_token


def test_an_exchange_belongs_to_its_host_and_expires(authenticator: Authenticator) -> None:
    exchange = SaslCredentials("SCRAM-SHA-512", "alice", "alice-secret").exchange()
    started = authenticator.step(HOST, "SCRAM-SHA-512", exchange.first(), "", NOW)
    final = exchange.respond(started.auth_bytes)
    assert final is not None
    elsewhere = authenticator.step("10.9.9.9", "SCRAM-SHA-512", final, started.exchange_id, NOW)
    assert elsewhere.error == ErrorCode.ILLEGAL_SASL_STATE
    late = SaslCredentials("SCRAM-SHA-512", "alice", "alice-secret").exchange()
    begun = authenticator.step(HOST, "SCRAM-SHA-512", late.first(), "", NOW)
    final = late.respond(begun.auth_bytes)
    assert final is not None
    expired = authenticator.step(HOST, "SCRAM-SHA-512", final, begun.exchange_id, NOW + 31)
    assert expired.error == ErrorCode.ILLEGAL_SASL_STATE


def test_one_host_s_flood_of_exchanges_does_not_evict_another_s(
    authenticator: Authenticator,
) -> None:
    """Exchanges waiting for their second step are bounded; one host that begins more than
    its share (client-first messages cost it nothing) drops its own oldest, not another
    host's exchange under way."""
    right = SaslCredentials("SCRAM-SHA-256", "alice", "alice-secret")
    exchange = right.exchange()
    first = authenticator.step(HOST, "SCRAM-SHA-256", exchange.first(), "", NOW)
    assert first.exchange_id
    flood = b"n,,n=mallory,r=0123456789abcdef"
    for _ in range(MAX_PENDING_EXCHANGES + 10):
        assert authenticator.step("10.6.6.6", "SCRAM-SHA-256", flood, "", NOW).exchange_id
    final = exchange.respond(first.auth_bytes)
    assert final is not None
    answer = authenticator.step(HOST, "SCRAM-SHA-256", final, first.exchange_id, NOW + 1)
    assert answer.complete, answer


def test_unsupported_mechanism(credentials: dict[tuple[str, str], ScramCredential]) -> None:
    only_512 = Authenticator(
        AuthenticationSettings(enabled_mechanisms=("SCRAM-SHA-512",)),
        lambda user, mechanism: credentials.get((user, mechanism)),
    )
    answer = login(only_512, SaslCredentials("SCRAM-SHA-256", "alice", "alice-secret"))
    assert answer.error == ErrorCode.UNSUPPORTED_SASL_MECHANISM
    assert not answer.failed  # not a failed authentication: not counted


def test_failures_are_rate_limited_per_host(authenticator: Authenticator) -> None:
    wrong = SaslCredentials("SCRAM-SHA-256", "alice", "guess")
    right = SaslCredentials("SCRAM-SHA-256", "alice", "alice-secret")
    for attempt in range(5):
        assert login(authenticator, wrong, now=NOW + attempt).failed
    refused = login(authenticator, right, now=NOW + 5)
    assert refused.error == ErrorCode.SASL_AUTHENTICATION_FAILED
    assert "too many failed authentications" in refused.error_message
    assert login(authenticator, right, host="10.1.1.1", now=NOW + 5).complete  # other hosts
    assert login(authenticator, right, now=NOW + 11).complete  # the window has passed


def test_a_login_between_guesses_does_not_clear_the_host_s_failures(
    credentials: dict[tuple[str, str], ScramCredential], validator: JwtValidator
) -> None:
    """An attacker with an account of its own cannot lift the limit on guessing another's
    password by logging in as itself between guesses: the failures count until their
    window has passed, whatever succeeds meanwhile from that host."""
    authenticator = Authenticator(
        AuthenticationSettings(enabled_mechanisms=("SCRAM-SHA-256",)),
        lambda user, mechanism: {
            **credentials,
            ("mallory", mechanism): make_credential(mechanism, "mallory-secret"),
        }.get((user, mechanism)),
    )
    guess = SaslCredentials("SCRAM-SHA-256", "alice", "guess")
    own = SaslCredentials("SCRAM-SHA-256", "mallory", "mallory-secret")
    for attempt in range(5):
        assert login(authenticator, guess, now=NOW + attempt).failed
        if attempt < 4:
            assert login(authenticator, own, now=NOW + attempt).complete
    refused = login(authenticator, guess, now=NOW + 5)
    assert "too many failed authentications" in refused.error_message


def token_for(key: Any, **claims: Any) -> str:
    payload = {"iss": ISSUER, "aud": AUDIENCE, "sub": "svc", "iat": NOW, "exp": NOW + 120}
    return jwt.encode({**payload, **claims}, key, algorithm="RS256", headers={"kid": "k1"})


def test_oauthbearer_session_ends_with_the_token(
    authenticator: Authenticator, signing_key: Any
) -> None:
    answer = login(authenticator, SaslCredentials("OAUTHBEARER", token=token_for(signing_key)))
    assert answer.complete and answer.principal == "User:svc"
    assert answer.session_lifetime_ms == 120_000  # the JWT's exp, not the 600 s maximum
    expired = login(
        authenticator, SaslCredentials("OAUTHBEARER", token=token_for(signing_key, exp=NOW - 60))
    )
    assert expired.error == ErrorCode.SASL_AUTHENTICATION_FAILED
    forged_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    forged = login(authenticator, SaslCredentials("OAUTHBEARER", token=token_for(forged_key)))
    assert forged.error == ErrorCode.SASL_AUTHENTICATION_FAILED


def test_an_oauthbearer_client_acts_only_as_its_token_principal(
    authenticator: Authenticator, signing_key: Any
) -> None:
    def message(authzid: str) -> bytes:
        return f"n,{authzid},\x01auth=Bearer {token_for(signing_key)}\x01\x01".encode()

    own = authenticator.step(HOST, "OAUTHBEARER", message("a=svc"), "", NOW)
    assert own.complete and own.principal == "User:svc"
    other = authenticator.step(HOST, "OAUTHBEARER", message("a=admin"), "", NOW)
    assert other.error == ErrorCode.SASL_AUTHENTICATION_FAILED and not other.complete
    assert "act as 'admin'" in other.error_message


def test_session_tokens_are_good_only_where_issued() -> None:
    here, there = SessionTokens(), SessionTokens()
    token = here.issue("User:alice", "SCRAM-SHA-256", NOW + 60)
    assert here.verify(token, NOW).principal == "User:alice"
    with pytest.raises(SaslAuthenticationError, match="not valid here"):
        there.verify(token, NOW)
    payload, _, signature = token.partition(".")
    altered = payload[:-2] + ("A" if payload[-2] != "A" else "B") + payload[-1] + "." + signature
    for forged in (altered, "garbage", token + "x", "é.é"):
        with pytest.raises(SaslAuthenticationError):
            here.verify(forged, NOW)


def test_client_credentials_are_checked() -> None:
    with pytest.raises(ValueError, match=r"needs sasl\.username and sasl\.password"):
        SaslCredentials("SCRAM-SHA-256", "alice")
    with pytest.raises(ValueError, match=r"sasl\.oauthbearer\.token"):
        SaslCredentials("OAUTHBEARER")
    with pytest.raises(ValueError, match="not one of"):
        SaslCredentials("PLAIN", "a", "b")


def test_a_node_id_belongs_to_the_principal_that_first_spoke_for_it() -> None:
    nodes = NodeIdentities()
    assert nodes.claim(2, "User:broker-2")
    assert nodes.claim(2, "User:broker-2")
    assert not nodes.claim(2, "User:broker-3")
    assert nodes.claim(3, "User:broker-3")
    nodes.release(2, "")
    assert nodes.claim(2, "User:broker-3")


def test_every_rpc_of_every_service_is_in_the_access_table() -> None:
    """Every service of every generated module, the internal ones too (a followers'
    ReplicaFetch, the etcd mode's UpdateMetadata push): one left out is refused to every
    caller, the services' own included, as soon as the authorizer is on."""
    modules = [
        importlib.import_module(f"{package.__name__}.{info.name}")
        for package in (highwater.v1, highwater.internal.v1)
        for info in pkgutil.iter_modules(package.__path__)
        if info.name.endswith("_pb2")
    ]
    services = [
        service for module in modules for service in module.DESCRIPTOR.services_by_name.values()
    ]
    assert {s.full_name for s in services} >= {
        "highwater.internal.v1.ReplicaFetchService",
        "highwater.internal.v1.BrokerMetadata",
    }
    for service in services:
        for method in service.methods:
            access = access_of(f"/{service.full_name}/{method.name}")
            assert access is not None, f"{service.full_name}/{method.name} has no ACL rule"
    assert RPC_ACCESS["/highwater.internal.v1.BrokerMetadata/UpdateMetadata"] == OnCluster(
        AclOperation.CLUSTER_ACTION
    )
    assert isinstance(RPC_ACCESS["/highwater.internal.v1.Raft/Vote"], OnCluster)
    assert isinstance(RPC_ACCESS["/highwater.v1.Broker/Produce"], PerItem)
    assert access_of("/grpc.health.v1.Health/Check") is not None
    assert access_of("/highwater.v1.Broker/NotARealCall") is None


@pytest.mark.parametrize(
    ("given", "kafka_reauth_s", "grpc_token_s"),
    [
        ({}, 0, 3600),  # Kafka's default on the Kafka listener; the tokens' own hour
        ({"connections.max.reauth.ms": "60000"}, 60, 60),  # one positive value sets both
        ({"connections.max.reauth.ms": "60000", "grpc.session.token.lifetime.ms": "7200000"},
         60, 7200),
        ({"grpc.session.token.lifetime.ms": "120000"}, 0, 120),
    ],
)  # fmt: skip
def test_connections_max_reauth_ms_is_kafkas_and_the_grpc_tokens_have_their_own_lifetime(
    given: dict[str, str], kafka_reauth_s: float, grpc_token_s: float
) -> None:
    """``connections.max.reauth.ms`` means on the Kafka listener what it means in Kafka
    (0 by default: no re-authentication); the gRPC session tokens need a positive lifetime,
    ``grpc.session.token.lifetime.ms``, which a positive ``connections.max.reauth.ms`` still
    sets when it is not given. Kafka's default 0 was refused."""
    from highwater.cli.serving import server_security_from_config
    from highwater.config.server import ServerConfig

    settings = server_security_from_config(ServerConfig(given)).authentication
    assert (settings.max_reauth_s, settings.max_session_s) == (kafka_reauth_s, grpc_token_s)


def test_connections_max_reauth_ms_0_is_accepted_and_negative_refused() -> None:
    from highwater.config.server import ServerConfig

    assert ServerConfig({"connections.max.reauth.ms": "0"}).get("connections.max.reauth.ms") == 0
    with pytest.raises(InvalidConfigError, match=r"connections\.max\.reauth\.ms"):
        ServerConfig({"connections.max.reauth.ms": "-1"})
