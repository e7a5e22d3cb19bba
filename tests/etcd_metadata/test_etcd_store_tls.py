"""TLS to etcd in the store's address: ``https://`` parsed, the TLS files read at start, and
each bad input refused with an error naming it (no etcd needed)."""

from __future__ import annotations

from pathlib import Path

import pytest
from highwater.errors import InvalidConfigError
from highwater.etcd_metadata.endpoints import parse_metadata_store, with_client_tls
from highwater.rpc.tls import ClientTls
from highwater.security.certificate_authority import CertificateAuthority


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    root = tmp_path_factory.mktemp("pki")
    ca = CertificateAuthority()
    (root / "ca.crt").write_bytes(ca.certificate_pem)
    ca.issue("broker", hosts=["127.0.0.1"]).write(root / "broker.crt", root / "broker.key")
    return root / "ca.crt", root / "broker.crt", root / "broker.key"


def test_https_is_tls_to_etcd_and_members_may_repeat_the_scheme() -> None:
    address = parse_metadata_store("https://e1:2379,https://e2:2379/prod")
    assert address.endpoints == (("e1", 2379), ("e2", 2379))
    assert address.cluster == "prod"
    assert address.tls == ClientTls()  # the system's CAs until --etcd-ca-file says
    assert str(address) == "https://e1:2379,e2:2379/prod"
    assert parse_metadata_store("etcd://e1:2379").tls is None


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("http://e1:2379", "expected etcd://"),
        ("https://e1:2379,etcd://e2:2379", "all members use one scheme"),
        ("https://e1:2379/a,e2:2379", "/CLUSTER goes after the last member"),
    ],
)
def test_a_bad_tls_address_is_refused(value: str, problem: str) -> None:
    with pytest.raises(InvalidConfigError, match=problem):
        parse_metadata_store(value)


def test_the_tls_files_go_with_the_address(files: tuple[Path, Path, Path]) -> None:
    ca, cert, key = files
    address = with_client_tls(
        parse_metadata_store("https://e1:2379"), ca_file=ca, cert_file=cert, key_file=key
    )
    assert address.tls == ClientTls(ca_file=ca, cert_file=cert, key_file=key)
    plain = parse_metadata_store("etcd://e1:2379")
    assert with_client_tls(plain) is plain  # no files: unchanged


def test_bad_tls_files_are_refused_naming_them(
    files: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    ca, cert, key = files
    secured = parse_metadata_store("https://e1:2379")
    with pytest.raises(InvalidConfigError, match="need TLS to etcd: write the metadata store"):
        with_client_tls(parse_metadata_store("etcd://e1:2379"), ca_file=ca)
    missing = tmp_path / "missing.crt"
    with pytest.raises(InvalidConfigError, match=f"TLS CA {missing}: No such file"):
        with_client_tls(secured, ca_file=missing)
    garbage = tmp_path / "garbage.crt"
    garbage.write_text("not a certificate")
    with pytest.raises(InvalidConfigError, match=f"TLS CA {garbage}: not a PEM file"):
        with_client_tls(secured, ca_file=garbage)
    with pytest.raises(InvalidConfigError, match="a client certificate needs its key"):
        with_client_tls(secured, ca_file=ca, cert_file=cert)
    with pytest.raises(InvalidConfigError, match="and a key its certificate"):
        with_client_tls(secured, ca_file=ca, key_file=key)
