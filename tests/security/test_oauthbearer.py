"""OAUTHBEARER tokens checked against a JWKS: a valid token names its principal; an
expired, early, forged, foreign or malformed one is refused with the reason."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from highwater.errors import SaslAuthenticationError
from highwater.security.oauthbearer import ClientMessage, JwtValidator, parse_client_message

ISSUER = "https://idp.example"
AUDIENCE = "highwater"
NOW = 1_800_000_000.0


@pytest.fixture(scope="module")
def keys() -> dict[str, Any]:
    return {
        "rsa": rsa.generate_private_key(public_exponent=65537, key_size=2048),
        "ec": ec.generate_private_key(ec.SECP256R1()),
        "other": rsa.generate_private_key(public_exponent=65537, key_size=2048),
    }


@pytest.fixture(scope="module")
def validator(keys: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> JwtValidator:
    jwks = {
        "keys": [
            {
                **json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(keys["rsa"].public_key())),
                "kid": "rsa-1",
                "use": "sig",
            },
            {
                **json.loads(jwt.algorithms.ECAlgorithm.to_jwk(keys["ec"].public_key())),
                "kid": "ec-1",
                "use": "sig",
            },
        ]
    }
    path = tmp_path_factory.mktemp("jwks") / "jwks.json"
    path.write_text(json.dumps(jwks))
    return JwtValidator.from_file(path, issuer=ISSUER, audience=AUDIENCE)


def token(key: Any, kid: str, algorithm: str = "RS256", **claims: Any) -> str:
    payload = {
        "iss": ISSUER,
        "aud": AUDIENCE,
        "sub": "alice",
        "iat": NOW - 60,
        "exp": NOW + 600,
        **claims,
    }
    payload = {k: v for k, v in payload.items() if v is not None}
    return jwt.encode(payload, key, algorithm=algorithm, headers={"kid": kid})


def test_a_valid_token_names_its_principal(keys: dict[str, Any], validator: JwtValidator) -> None:
    checked = validator.validate(token(keys["rsa"], "rsa-1"), NOW)
    assert (checked.principal, checked.expires_at_s) == ("User:alice", NOW + 600)
    checked = validator.validate(token(keys["ec"], "ec-1", "ES256", sub="svc"), NOW)
    assert checked.principal == "User:svc"


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (lambda k: token(k["rsa"], "rsa-1", exp=NOW - 60), "expired"),
        (lambda k: token(k["rsa"], "rsa-1", nbf=NOW + 600), "not valid yet"),
        (lambda k: token(k["rsa"], "rsa-1", iss="https://evil.example"), "(?i)issuer"),
        (lambda k: token(k["rsa"], "rsa-1", aud="someone-else"), "(?i)audience"),
        (lambda k: token(k["other"], "rsa-1"), "Signature"),
        (lambda k: token(k["rsa"], "nope"), "no key"),
        (lambda k: token(k["rsa"], "rsa-1", sub=None), "sub"),
        (lambda k: token(k["rsa"], "rsa-1", exp=None), "exp"),
        (lambda k: token("secret-key-of-32-bytes-or-more!!", "rsa-1", "HS256"), "HS256"),
        (lambda k: "not.a.jwt", "not a JWT"),
        # An algorithm that does not fit the named key, or times that are not numbers:
        # refused as any bad token, not an error escaping the check.
        (lambda k: token(k["ec"], "rsa-1", "ES256"), "ES256 does not fit"),
        (lambda k: token(k["rsa"], "ec-1", "PS256"), "PS256 does not fit"),
        (lambda k: token(k["rsa"], "rsa-1", exp="soon"), "exp"),
        (lambda k: token(k["rsa"], "rsa-1", nbf=[NOW]), "nbf"),
        (lambda k: token(k["rsa"], "rsa-1", exp=10**400), "exp"),
        # Kafka requires an issued-at time, not a negative one, and a subject that is
        # more than blanks.
        (lambda k: token(k["rsa"], "rsa-1", iat=None), "iat"),
        (lambda k: token(k["rsa"], "rsa-1", iat=-5), "iat claim is negative"),
        (lambda k: token(k["rsa"], "rsa-1", iat="then"), "iat"),
        (lambda k: token(k["rsa"], "rsa-1", sub="   "), "sub claim is empty"),
        (lambda k: token(k["rsa"], "rsa-1", sub=""), "sub claim is empty"),
        (lambda k: token(k["rsa"], "rsa-1", sub=7), "(?i)subject"),
    ],
)
def test_bad_tokens_are_refused_with_the_reason(
    keys: dict[str, Any], validator: JwtValidator, make: Any, reason: str
) -> None:
    with pytest.raises(SaslAuthenticationError, match=reason):
        validator.validate(make(keys), NOW)


def test_the_subject_is_trimmed(keys: dict[str, Any], validator: JwtValidator) -> None:
    checked = validator.validate(token(keys["rsa"], "rsa-1", sub=" admin\t"), NOW)
    assert checked.principal == "User:admin"


def test_an_unsigned_token_is_refused(validator: JwtValidator) -> None:
    unsigned = jwt.encode(
        {"iss": ISSUER, "aud": AUDIENCE, "sub": "alice", "iat": NOW, "exp": NOW + 600},
        None,
        algorithm="none",
        headers={"kid": "rsa-1"},
    )
    with pytest.raises(SaslAuthenticationError, match="'none'"):
        validator.validate(unsigned, NOW)


def test_the_client_message_carries_the_token_and_authzid() -> None:
    assert parse_client_message(b"n,,\x01auth=Bearer abc.def.ghi\x01\x01") == ClientMessage(
        "abc.def.ghi"
    )
    assert parse_client_message(b"n,a=alice,\x01host=h\x01auth=bearer t\x01\x01") == (
        ClientMessage("t", "alice")
    )
    assert parse_client_message(b"n,a=a=2Cb=3Dc,\x01auth=Bearer t\x01\x01").authzid == "a,b=c"
    for bad in (
        b"auth=Bearer t",
        b"n,,\x01auth=Basic t\x01\x01",
        b"n,,\x01\x01",
        b"\xff",
        b"n,alice,\x01auth=Bearer t\x01\x01",
        b"n,a=,\x01auth=Bearer t\x01\x01",
        b"n,a=x=y,\x01auth=Bearer t\x01\x01",
    ):
        with pytest.raises(SaslAuthenticationError):
            parse_client_message(bad)


def test_a_token_acts_only_for_its_own_principal(
    keys: dict[str, Any], validator: JwtValidator
) -> None:
    alice = token(keys["rsa"], "rsa-1")
    assert validator.authenticate(ClientMessage(alice), NOW).principal == "User:alice"
    assert validator.authenticate(ClientMessage(alice, "alice"), NOW).principal == "User:alice"
    with pytest.raises(SaslAuthenticationError, match="act as 'admin'"):
        validator.authenticate(ClientMessage(alice, "admin"), NOW)
    # The authzid is compared with the principal name as trimmed.
    padded = token(keys["rsa"], "rsa-1", sub=" alice ")
    assert validator.authenticate(ClientMessage(padded, "alice"), NOW).subject == "alice"


def test_an_unusable_jwks_file_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "jwks.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="not a JWKS"):
        JwtValidator.from_file(bad, issuer=ISSUER, audience=AUDIENCE)
