"""``SocketTls``: the process's TLS files as an ``ssl.SSLContext`` for a listener that is not
gRPC's (the Kafka listener). Handshakes run in memory (``ssl.MemoryBIO``): a rotated
certificate is served from the next refresh, a half-rotated pair (a certificate without
its key yet) keeps the old one, client certificates are required, asked for, or not, as
``ssl.client.auth`` says."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.oid import NameOID
from highwater.rpc.tls import ClientAuth, ServerTls, SocketTls, TlsConfigError
from highwater.security.certificate_authority import CertificateAuthority


@pytest.fixture(scope="module")
def ca() -> CertificateAuthority:
    return CertificateAuthority()


def files(ca: CertificateAuthority, root: Path) -> tuple[Path, Path, Path]:
    (root / "ca.crt").write_bytes(ca.certificate_pem)
    ca.issue("first", hosts=["localhost"]).write(root / "tls.crt", root / "tls.key")
    return root / "tls.crt", root / "tls.key", root / "ca.crt"


def handshake(
    server: ssl.SSLContext, ca_file: Path, client_cert: tuple[Path, Path] | None = None
) -> tuple[str, dict[str, object] | None]:
    """The server certificate's CN the client sees, and the client certificate the server
    got (``None``: none)."""
    client = ssl.create_default_context(cafile=str(ca_file))
    if client_cert is not None:
        client.load_cert_chain(*client_cert)
    c_in, c_out, s_in, s_out = (ssl.MemoryBIO() for _ in range(4))
    client_side = client.wrap_bio(c_in, c_out, server_hostname="localhost")
    server_side = server.wrap_bio(s_in, s_out, server_side=True)
    done = {"client": False, "server": False}
    for _ in range(20):
        for name, side, out, peer_in in (
            ("client", client_side, c_out, s_in),
            ("server", server_side, s_out, c_in),
        ):
            if not done[name]:
                try:
                    side.do_handshake()
                    done[name] = True
                except ssl.SSLWantReadError:
                    pass
            peer_in.write(out.read())
        if all(done.values()):
            break
    der = client_side.getpeercert(binary_form=True)
    assert der is not None
    subject = x509.load_der_x509_certificate(der).subject
    (cn,) = subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return str(cn.value), server_side.getpeercert() or None


def test_a_rotated_certificate_is_served_after_a_refresh(
    ca: CertificateAuthority, tmp_path: Path
) -> None:
    cert, key, ca_file = files(ca, tmp_path)
    tls = SocketTls(ServerTls(cert, key, ca_file), ClientAuth.NONE)
    assert handshake(tls.context, ca_file)[0] == "first"
    # Half rotated: a new certificate whose key is not there yet: the old pair stays.
    rotated = ca.issue("second", hosts=["localhost"])
    cert.write_bytes(rotated.certificate_pem)
    tls.refresh()
    assert handshake(tls.context, ca_file)[0] == "first"
    key.write_bytes(rotated.key_pem)
    tls.refresh()
    assert handshake(tls.context, ca_file)[0] == "second"


def test_client_certificates_as_ssl_client_auth_says(
    ca: CertificateAuthority, tmp_path: Path
) -> None:
    cert, key, ca_file = files(ca, tmp_path)
    ca.issue("alice", server=False).write(tmp_path / "alice.crt", tmp_path / "alice.key")
    alice = (tmp_path / "alice.crt", tmp_path / "alice.key")
    server = ServerTls(cert, key, ca_file)  # a CA file: required by default
    required = SocketTls(server)
    assert required.client_auth is ClientAuth.REQUIRED
    _, presented = handshake(required.context, ca_file, alice)
    assert presented is not None and ("commonName", "alice") in presented["subject"][0]
    with pytest.raises(ssl.SSLError):
        handshake(required.context, ca_file)
    requested = SocketTls(server, ClientAuth.REQUESTED)
    assert handshake(requested.context, ca_file)[1] is None
    assert handshake(requested.context, ca_file, alice)[1] is not None
    assert handshake(SocketTls(server, ClientAuth.NONE).context, ca_file, alice)[1] is None
    with pytest.raises(TlsConfigError, match="needs --tls-ca-file"):
        SocketTls(ServerTls(cert, key, client_auth=ClientAuth.NONE), ClientAuth.REQUESTED)


def test_a_ca_taken_out_of_the_file_is_no_longer_trusted_after_a_refresh(
    ca: CertificateAuthority, tmp_path: Path
) -> None:
    """A CA file rewritten without a CA (rotated away from it, or it leaked) stops the
    listener trusting that CA from the next refresh, as the gRPC servers do."""
    cert, key, ca_file = files(ca, tmp_path)
    ca.issue("alice", server=False).write(tmp_path / "alice.crt", tmp_path / "alice.key")
    alice = (tmp_path / "alice.crt", tmp_path / "alice.key")
    successor = CertificateAuthority("successor")
    successor.issue("bob", server=False).write(tmp_path / "bob.crt", tmp_path / "bob.key")
    bob = (tmp_path / "bob.crt", tmp_path / "bob.key")
    server_ca = tmp_path / "server-ca.crt"  # what the clients trust the server by
    server_ca.write_bytes(ca.certificate_pem)
    tls = SocketTls(ServerTls(cert, key, ca_file))
    assert handshake(tls.context, server_ca, alice)[1] is not None
    # Both CAs while clients move over, then the successor alone.
    ca_file.write_bytes(ca.certificate_pem + successor.certificate_pem)
    tls.refresh()
    assert handshake(tls.context, server_ca, alice)[1] is not None
    assert handshake(tls.context, server_ca, bob)[1] is not None
    ca_file.write_bytes(successor.certificate_pem)
    tls.refresh()
    with pytest.raises(ssl.SSLError):
        handshake(tls.context, server_ca, alice)
    assert handshake(tls.context, server_ca, bob)[1] is not None
