"""A Kafka connection's SASL state, pure: the listener's declaration, requests gated until
authentication, SCRAM through SaslHandshake and SaslAuthenticate, a failure answered
SASL_AUTHENTICATION_FAILED and closing, KIP-368's session lifetime and re-authentication
(same mechanism and principal only), and requests after the session expired refused; with
``connections.max.reauth.ms`` 0 (Kafka's default) no session expires but one whose
credential does (an OAUTHBEARER token)."""

from __future__ import annotations

import json
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from highwater.broker.kafka_protocol.sasl import (
    ConnectionSecurity,
    KafkaListenerAddress,
    SecurityProtocol,
    kafka_session,
    parse_kafka_listener,
)
from highwater.security.authentication import AuthenticationSettings, Authenticator
from highwater.security.oauthbearer import JwtValidator
from highwater.security.sasl_client import SaslCredentials, oauthbearer_client_message
from highwater.security.scram import ScramCredential, make_credential
from highwater.v1.common_pb2 import ErrorCode

NOW = 1_800_000_000.0
HOST = "10.0.0.9"
METADATA, PRODUCE, API_VERSIONS = 3, 0, 18
MECHANISM = "SCRAM-SHA-512"
PASSWORDS = {"alice": "alice-pw", "bob": "bob-pw"}


@pytest.fixture(scope="module")
def credentials() -> dict[str, ScramCredential]:
    return {user: make_credential(MECHANISM, password) for user, password in PASSWORDS.items()}


@pytest.fixture
def authenticator(credentials: dict[str, ScramCredential]) -> Authenticator:
    settings = AuthenticationSettings(
        enabled_mechanisms=(MECHANISM,), max_reauth_s=60, failed_authentication_delay_ms=100
    )
    return Authenticator(settings, lambda user, mechanism: credentials.get(user))


def login(security: ConnectionSecurity, user: str, password: str, now: float = NOW) -> int:
    """Handshake and the SCRAM exchange; the last answer's error code."""
    assert security.handshake(MECHANISM).error_code == ErrorCode.NONE
    exchange = SaslCredentials(MECHANISM, user, password).exchange()
    answer = security.authenticate(exchange.first(), now)
    assert answer.error_code == ErrorCode.NONE and not answer.close
    final = exchange.respond(answer.auth_bytes)
    assert final is not None
    last = security.authenticate(final, now)
    if last.error_code == ErrorCode.NONE:
        assert exchange.respond(last.auth_bytes) is None  # the server's signature checks out
        assert last.session_lifetime_ms == 60_000
    return last.error_code


def test_the_listener_declares_its_security_protocol() -> None:
    assert parse_kafka_listener("SASL_SSL://0.0.0.0:9093") == KafkaListenerAddress(
        SecurityProtocol.SASL_SSL, "0.0.0.0", 9093
    )
    assert parse_kafka_listener("127.0.0.1:9092").protocol is SecurityProtocol.PLAINTEXT
    assert parse_kafka_listener("ssl://h:1").protocol is SecurityProtocol.SSL
    with pytest.raises(ValueError, match="not a security protocol"):
        parse_kafka_listener("TLS://h:1")


def test_requests_wait_for_authentication_and_run_as_the_proved_principal(
    authenticator: Authenticator,
) -> None:
    security = ConnectionSecurity(SecurityProtocol.SASL_SSL, HOST, authenticator)
    assert security.admit(API_VERSIONS, NOW) is None
    assert security.admit(METADATA, NOW) == "API 3 before SASL authentication"
    assert security.principal.principal == "User:ANONYMOUS"
    assert login(security, "alice", PASSWORDS["alice"]) == ErrorCode.NONE
    assert security.admit(METADATA, NOW) is None
    assert security.principal.principal == "User:alice"
    assert security.principal.authenticated_by == MECHANISM


def test_a_certificate_is_the_principal_on_ssl_but_not_on_sasl_ssl(
    authenticator: Authenticator,
) -> None:
    ssl = ConnectionSecurity(
        SecurityProtocol.SSL, HOST, authenticator, certificate_principal="User:writer"
    )
    assert ssl.principal.principal == "User:writer" and ssl.admit(PRODUCE, NOW) is None
    # No SASL on an SSL listener: a handshake is answered ILLEGAL_SASL_STATE.
    assert ssl.handshake(MECHANISM).error_code == ErrorCode.ILLEGAL_SASL_STATE
    sasl = ConnectionSecurity(
        SecurityProtocol.SASL_SSL, HOST, authenticator, certificate_principal="User:writer"
    )
    assert sasl.principal.principal == "User:ANONYMOUS"
    assert sasl.admit(PRODUCE, NOW) is not None


def test_a_wrong_password_fails_after_the_delay_and_closes(authenticator: Authenticator) -> None:
    security = ConnectionSecurity(SecurityProtocol.SASL_PLAINTEXT, HOST, authenticator)
    assert security.handshake(MECHANISM).error_code == ErrorCode.NONE
    exchange = SaslCredentials(MECHANISM, "alice", "wrong").exchange()
    first = security.authenticate(exchange.first(), NOW)
    final = exchange.respond(first.auth_bytes)
    assert final is not None
    answer = security.authenticate(final, NOW)
    assert answer.error_code == ErrorCode.SASL_AUTHENTICATION_FAILED
    assert answer.error_message == "authentication failed"  # no more said to the client
    assert answer.close and answer.delay_s == pytest.approx(0.1)
    assert "invalid credentials" in answer.log
    assert not security.authenticated


def test_unknown_mechanisms_and_steps_out_of_turn_close(authenticator: Authenticator) -> None:
    security = ConnectionSecurity(SecurityProtocol.SASL_SSL, HOST, authenticator)
    refused = security.handshake("PLAIN")
    assert (refused.error_code, refused.mechanisms, refused.close) == (
        ErrorCode.UNSUPPORTED_SASL_MECHANISM,
        (MECHANISM,),
        True,
    )
    early = ConnectionSecurity(SecurityProtocol.SASL_SSL, HOST, authenticator)
    answer = early.authenticate(b"n,,n=alice,r=abc", NOW)
    assert answer.error_code == ErrorCode.ILLEGAL_SASL_STATE and answer.close


def test_failures_are_rate_limited_per_host_as_over_grpc(authenticator: Authenticator) -> None:
    for _ in range(authenticator.settings.max_failures):
        security = ConnectionSecurity(SecurityProtocol.SASL_SSL, HOST, authenticator)
        assert login_fails(security, "bob", "nope")
    # Now even the right password is refused from that host, at once.
    security = ConnectionSecurity(SecurityProtocol.SASL_SSL, HOST, authenticator)
    assert security.handshake(MECHANISM).error_code == ErrorCode.NONE
    first = SaslCredentials(MECHANISM, "bob", PASSWORDS["bob"]).exchange().first()
    answer = security.authenticate(first, NOW)
    assert answer.error_code == ErrorCode.SASL_AUTHENTICATION_FAILED and answer.close
    assert "too many failed authentications" in answer.log


def login_fails(security: ConnectionSecurity, user: str, password: str) -> bool:
    security.handshake(MECHANISM)
    exchange = SaslCredentials(MECHANISM, user, password).exchange()
    final = exchange.respond(security.authenticate(exchange.first(), NOW).auth_bytes)
    assert final is not None
    return security.authenticate(final, NOW).error_code == ErrorCode.SASL_AUTHENTICATION_FAILED


def test_a_session_is_reauthenticated_by_its_principal_only_and_expires(
    authenticator: Authenticator,
) -> None:
    security = ConnectionSecurity(SecurityProtocol.SASL_SSL, HOST, authenticator)
    assert login(security, "alice", PASSWORDS["alice"]) == ErrorCode.NONE
    assert security.session_expires_at_s == NOW + 60
    # KIP-368: re-authenticating before the end extends the session, requests flowing.
    assert login(security, "alice", PASSWORDS["alice"], now=NOW + 50) == ErrorCode.NONE
    assert security.admit(PRODUCE, NOW + 100) is None
    assert security.admit(PRODUCE, NOW + 110) is not None  # past the new end
    assert security.admit(API_VERSIONS, NOW + 110) is None
    # Another user's credentials cannot take the connection over.
    other = ConnectionSecurity(SecurityProtocol.SASL_SSL, HOST, authenticator)
    assert login(other, "alice", PASSWORDS["alice"]) == ErrorCode.NONE
    assert login(other, "bob", PASSWORDS["bob"]) == ErrorCode.SASL_AUTHENTICATION_FAILED
    assert other.principal.principal == "User:alice"


def test_a_reauthentication_keeps_its_mechanism() -> None:
    """KIP-368 (Kafka's ``saslMechanismUnchanged``): a session is re-authenticated with the
    mechanism that opened it; another fails at its first token and closes the connection,
    even for the same user."""
    both = ("SCRAM-SHA-256", MECHANISM)
    known = {m: make_credential(m, PASSWORDS["alice"]) for m in both}
    settings = AuthenticationSettings(enabled_mechanisms=both, max_reauth_s=60)
    security = ConnectionSecurity(
        SecurityProtocol.SASL_SSL,
        HOST,
        Authenticator(settings, lambda user, mechanism: known[mechanism]),
    )
    assert login(security, "alice", PASSWORDS["alice"]) == ErrorCode.NONE
    assert security.handshake("SCRAM-SHA-256").error_code == ErrorCode.NONE
    first = SaslCredentials("SCRAM-SHA-256", "alice", PASSWORDS["alice"]).exchange().first()
    answer = security.authenticate(first, NOW + 10)
    assert (answer.error_code, answer.close) == (ErrorCode.SASL_AUTHENTICATION_FAILED, True)
    assert "mechanism" in answer.log


def test_sasl_requests_where_no_authentication_is_under_way_are_answered_not_closed(
    authenticator: Authenticator,
) -> None:
    """Kafka answers these in ``KafkaApis`` (its SASL authenticator is done or absent):
    SaslHandshake on a listener without SASL, and SaslAuthenticate without a handshake
    on a connection already authenticated, are ILLEGAL_SASL_STATE, and the connection
    goes on."""
    plain = ConnectionSecurity(SecurityProtocol.PLAINTEXT, HOST, authenticator)
    handshake = plain.handshake(MECHANISM)
    assert (handshake.error_code, handshake.close) == (ErrorCode.ILLEGAL_SASL_STATE, False)
    answer = plain.authenticate(b"n,,n=alice,r=abc", NOW)
    assert (answer.error_code, answer.close) == (ErrorCode.ILLEGAL_SASL_STATE, False)
    assert plain.admit(PRODUCE, NOW) is None
    sasl = ConnectionSecurity(SecurityProtocol.SASL_SSL, HOST, authenticator)
    assert login(sasl, "alice", PASSWORDS["alice"]) == ErrorCode.NONE
    answer = sasl.authenticate(b"n,,n=alice,r=abc", NOW)
    assert (answer.error_code, answer.close) == (ErrorCode.ILLEGAL_SASL_STATE, False)
    assert sasl.principal.principal == "User:alice" and sasl.admit(PRODUCE, NOW) is None


@pytest.mark.parametrize(
    ("max_reauth_s", "credential_expires_s", "answered"),
    [
        (0, None, (0, None)),  # Kafka's default: no re-authentication, no expiry
        (60, None, (60_000, NOW + 60)),
        (0, NOW + 30, (30_000, NOW + 30)),  # the token's expiry bounds the session anyway
        (60, NOW + 30, (30_000, NOW + 30)),
        (20, NOW + 30, (20_000, NOW + 20)),
    ],
)
def test_the_session_is_the_shorter_of_connections_max_reauth_ms_and_the_credential(
    max_reauth_s: float, credential_expires_s: float | None, answered: tuple[int, float | None]
) -> None:
    """Kafka's SaslServerAuthenticator.calcCompletionTimesAndReturnSessionLifetimeMs."""
    assert kafka_session(max_reauth_s, credential_expires_s, NOW) == answered


def test_with_connections_max_reauth_ms_0_a_scram_session_never_expires(
    credentials: dict[str, ScramCredential],
) -> None:
    """Kafka's default (0): the answer's session_lifetime_ms is 0, so a client without
    KIP-368 (kafka-python, aiokafka) is never cut off; the gRPC session tokens keep their
    own lifetime. Every session expired after ``connections.max.reauth.ms`` (1 hour)."""
    settings = AuthenticationSettings(enabled_mechanisms=(MECHANISM,))
    assert (settings.max_reauth_s, settings.max_session_s) == (0, 3600)
    security = ConnectionSecurity(
        SecurityProtocol.SASL_SSL,
        HOST,
        Authenticator(settings, lambda user, mechanism: credentials.get(user)),
    )
    assert security.handshake(MECHANISM).error_code == ErrorCode.NONE
    exchange = SaslCredentials(MECHANISM, "alice", PASSWORDS["alice"]).exchange()
    final = exchange.respond(security.authenticate(exchange.first(), NOW).auth_bytes)
    assert final is not None
    last = security.authenticate(final, NOW)
    assert (last.error_code, last.session_lifetime_ms) == (ErrorCode.NONE, 0)
    assert security.session_expires_at_s is None
    assert security.admit(PRODUCE, NOW + 30 * 86_400) is None


def test_with_connections_max_reauth_ms_0_an_oauthbearer_session_ends_with_its_token() -> None:
    key: Any = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()))
    validator = JwtValidator({"keys": [{**jwk, "kid": "k1"}]}, issuer="idp", audience="hw")
    settings = AuthenticationSettings(enabled_mechanisms=("OAUTHBEARER",), jwt_validator=validator)
    security = ConnectionSecurity(
        SecurityProtocol.SASL_SSL, HOST, Authenticator(settings, lambda user, mechanism: None)
    )
    token = jwt.encode(
        {"iss": "idp", "aud": "hw", "sub": "svc", "iat": NOW, "exp": NOW + 120},
        key,
        algorithm="RS256",
        headers={"kid": "k1"},
    )
    assert security.handshake("OAUTHBEARER").error_code == ErrorCode.NONE
    answer = security.authenticate(oauthbearer_client_message(token), NOW)
    assert (answer.error_code, answer.session_lifetime_ms) == (ErrorCode.NONE, 120_000)
    assert security.admit(PRODUCE, NOW + 119) is None
    assert security.admit(PRODUCE, NOW + 120) is not None
