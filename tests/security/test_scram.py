"""The server's side of SCRAM-SHA-256/512 against scramp's client: a right password
authenticates (and the client checks the server's signature), a wrong one or an unknown
user fails alike, and messages out of turn or malformed are refused."""

from __future__ import annotations

import time

import pytest
from highwater.controller_api import messages as m
from highwater.errors import (
    IllegalSaslStateError,
    SaslAuthenticationError,
    UnsupportedSaslMechanismError,
)
from highwater.metadata.records import UserScramCredentialRecord
from highwater.security.sasl_client import SaslCredentials
from highwater.security.scram import (
    SCRAM_MECHANISMS,
    ScramCredential,
    ScramExchange,
    credential_from_salted_password,
    make_credential,
    salted_password,
)
from scramp import ScramClient


def store(*users: tuple[str, str, str]) -> dict[tuple[str, str], ScramCredential]:
    return {(u, m): make_credential(m, password) for u, m, password in users}


def run(
    mechanism: str, credentials: dict[tuple[str, str], ScramCredential], user: str, password: str
) -> tuple[ScramExchange, ScramClient]:
    exchange = ScramExchange(mechanism, lambda u, m: credentials.get((u, m)))
    client = ScramClient([mechanism], user, password)
    server_first = exchange.respond(client.get_client_first().encode())
    client.set_server_first(server_first.decode())
    server_final = exchange.respond(client.get_client_final().encode())
    client.set_server_final(server_final.decode())  # raises if the signature is wrong
    return exchange, client


@pytest.mark.parametrize("mechanism", SCRAM_MECHANISMS)
def test_the_right_password_authenticates_the_user(mechanism: str) -> None:
    exchange, _ = run(mechanism, store(("alice", mechanism, "s3cret")), "alice", "s3cret")
    assert exchange.complete
    assert exchange.user == "alice"
    with pytest.raises(IllegalSaslStateError):
        exchange.respond(b"n,,n=alice,r=again")


@pytest.mark.parametrize("mechanism", SCRAM_MECHANISMS)
def test_a_wrong_password_and_an_unknown_user_fail_alike(mechanism: str) -> None:
    credentials = store(("alice", mechanism, "s3cret"))
    with pytest.raises(SaslAuthenticationError) as wrong:
        run(mechanism, credentials, "alice", "guess")
    with pytest.raises(SaslAuthenticationError) as unknown:
        run(mechanism, credentials, "mallory", "guess")
    assert str(wrong.value) == str(unknown.value)


def test_a_credential_of_the_other_mechanism_does_not_count() -> None:
    credentials = store(("alice", "SCRAM-SHA-512", "s3cret"))
    with pytest.raises(SaslAuthenticationError):
        run("SCRAM-SHA-256", credentials, "alice", "s3cret")


def test_an_unknown_users_salt_is_stable_like_a_real_one() -> None:
    def salt_of(user: str) -> str:
        exchange = ScramExchange("SCRAM-SHA-256", lambda u, m: None)
        client = ScramClient(["SCRAM-SHA-256"], user, "x")
        first = exchange.respond(client.get_client_first().encode()).decode()
        return dict(part.split("=", 1) for part in first.split(","))["s"]

    assert salt_of("mallory") == salt_of("mallory") != salt_of("eve")


@pytest.mark.parametrize("mechanism", SCRAM_MECHANISMS)
def test_an_unknown_user_is_answered_as_fast_as_a_known_one(mechanism: str) -> None:
    """The server-first message must not tell which names exist by its timing either: an
    unknown user's stand-in credential once ran PBKDF2 at every attempt, 40 times the CPU
    of a known user's look-up, measurable from afar. CPU time, known and unknown
    interleaved, so the machine's load weighs on both alike."""
    credentials = store(("alice", mechanism, "s3cret"))

    def server_first(user: str) -> float:
        exchange = ScramExchange(mechanism, lambda u, m: credentials.get((u, m)))
        started = time.process_time()
        exchange.respond(f"n,,n={user},r=fyko+d2lbbFgONRv9qkxdawL".encode())
        return time.process_time() - started

    server_first("alice"), server_first("warm-up")
    known = unknown = 0.0
    for attempt in range(50):
        known += server_first("alice")
        unknown += server_first(f"mallory-{attempt}")
    assert unknown < 3 * known, (unknown, known)


def test_malformed_and_out_of_turn_messages_are_refused() -> None:
    exchange = ScramExchange("SCRAM-SHA-256", lambda u, m: None)
    with pytest.raises(SaslAuthenticationError):
        exchange.respond(b"\xff\xfe not utf-8")
    with pytest.raises(IllegalSaslStateError):
        exchange.respond(b"n,,n=alice,r=abc")
    with pytest.raises(SaslAuthenticationError):
        ScramExchange("SCRAM-SHA-256", lambda u, m: None).respond(b"garbage")
    with pytest.raises(UnsupportedSaslMechanismError):
        ScramExchange("SCRAM-MD5", lambda u, m: None)


def test_credentials_keep_kafkas_bounds() -> None:
    with pytest.raises(ValueError, match="iterations"):
        make_credential("SCRAM-SHA-256", "pw", iterations=1000)
    with pytest.raises(ValueError, match="empty"):
        make_credential("SCRAM-SHA-256", "")
    credential = make_credential("SCRAM-SHA-512", "pw", salt=b"0123456789abcdef")
    assert credential == make_credential("SCRAM-SHA-512", "pw", salt=b"0123456789abcdef")
    assert credential.iterations == 4096 and credential.salt == b"0123456789abcdef"


@pytest.mark.parametrize("mechanism", SCRAM_MECHANISMS)
def test_a_salted_password_gives_the_credential_scramp_derives(mechanism: str) -> None:
    salt = b"0123456789abcdef"
    salted = salted_password(mechanism, "s3cret", salt, 4096)
    assert credential_from_salted_password(mechanism, salt, salted, 4096) == make_credential(
        mechanism, "s3cret", salt=salt
    )


def test_secrets_are_left_out_of_reprs() -> None:
    """What a log line or an error may print of a credential (a failed controller job is
    logged with its request's repr): never the password, the token, the salted password
    (a SCRAM login as good as the password) nor the stored and server keys."""
    credential = make_credential("SCRAM-SHA-256", "s3cret")
    salted = salted_password("SCRAM-SHA-256", "s3cret", credential.salt, 4096)
    secrets = [b"s3cret", salted, credential.stored_key, credential.server_key]
    shown = [
        SaslCredentials("SCRAM-SHA-256", username="alice", password="s3cret"),
        SaslCredentials("OAUTHBEARER", token="s3cret"),
        credential,
        UserScramCredentialRecord(
            "alice", 1, credential.salt, credential.stored_key, credential.server_key, 4096
        ),
        m.AlterUserScramCredentialsRequest(
            upsertions=(m.ScramCredentialUpsertion("alice", 1, 4096, credential.salt, salted),)
        ),
    ]
    for thing in shown:
        text = repr(thing)
        assert "alice" in text or "OAUTHBEARER" in text or "SCRAM-SHA-256" in text
        for secret in secrets:
            assert repr(secret)[2:-1] not in text and secret.decode("latin-1") not in text, text
