"""ssl.principal.mapping.rules: Kafka's rule syntax, Highwater's DEFAULT (the common name)."""

from __future__ import annotations

import datetime

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from highwater.errors import SaslAuthenticationError
from highwater.security.principal import SslPrincipalMapper, subject_name


def certificate(*attributes: tuple[x509.ObjectIdentifier, str]) -> x509.Certificate:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(oid, value) for oid, value in attributes])
    now = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )


ALICE = certificate(
    (NameOID.ORGANIZATION_NAME, "example"),
    (NameOID.ORGANIZATIONAL_UNIT_NAME, "ops"),
    (NameOID.COMMON_NAME, "alice"),
)


def test_the_subject_is_written_most_specific_first() -> None:
    assert subject_name(ALICE) == "CN=alice,OU=ops,O=example"


def test_by_default_the_principal_is_the_common_name() -> None:
    assert SslPrincipalMapper().principal(ALICE) == "User:alice"
    no_cn = certificate((NameOID.ORGANIZATION_NAME, "example"))
    assert SslPrincipalMapper().principal(no_cn) == "User:O=example"


def test_rules_apply_in_order_with_groups_and_case() -> None:
    mapper = SslPrincipalMapper(
        r"RULE:^CN=(.*?),OU=ServiceUsers.*$/svc-$1/, "
        r"RULE:^CN=(.*?),OU=(.*?),O=(.*?)$/$1@$2/U,"
        "DEFAULT"
    )
    assert mapper.principal_name("CN=kafka,OU=ServiceUsers,O=x") == "svc-kafka"
    assert mapper.principal_name("CN=alice,OU=ops,O=example") == "ALICE@OPS"
    assert mapper.principal_name("CN=bob,O=example") == "bob"  # DEFAULT
    lower = SslPrincipalMapper(r"RULE:^CN=([^,]*)\/x.*$/$1/L")
    assert lower.principal_name("CN=Carol/x") == "carol"


def test_a_name_no_rule_matches_authenticates_no_one() -> None:
    mapper = SslPrincipalMapper(r"RULE:^CN=(.*),OU=ServiceUsers$/$1/")
    with pytest.raises(SaslAuthenticationError, match=r"no ssl\.principal\.mapping\.rules"):
        mapper.principal_name("CN=alice,OU=ops")


@pytest.mark.parametrize("rules", ["", "RULE:abc", "DEFAULTX", "RULE:(/x/", "DEFAULT DEFAULT"])
def test_bad_rules_are_refused(rules: str) -> None:
    with pytest.raises(ValueError, match=r"ssl\.principal\.mapping\.rules"):
        SslPrincipalMapper(rules)
