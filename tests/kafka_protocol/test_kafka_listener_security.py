"""The Kafka listener as secure as the gRPC one, with real Kafka clients: SASL_SSL with
SCRAM-SHA-512 (confluent-kafka producing and consuming in a group, kcat) and OAUTHBEARER
(confluent-kafka's ``oauth_cb``), SSL with a client certificate as the principal
(kafka-python), a wrong password refused, a principal without WRITE refused
TOPIC_AUTHORIZATION_FAILED with nothing written, the ACL calls round trip (kafka-python's
admin client), a request before authentication closing the connection, and
re-authentication on a connection (KIP-368).

Two servers for the module, both with certificates of a throwaway CA and the ACL checks
on (``User:admin`` and the server's own ``User:server`` are super users): one with a
``SASL_SSL`` Kafka listener, one with an ``SSL`` one. The users, topics and ACLs are set
up over gRPC as the admin (a client certificate), as an operator would.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import ssl
import struct
import subprocess
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import jwt
import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from cryptography.hazmat.primitives.asymmetric import rsa
from highwater.broker.kafka_protocol.codec import (
    DescribeTopicPartitionsRequest,
    DescribeTopicPartitionsResponse,
)
from highwater.client.admin import AdminClient, NewTopic
from highwater.security import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
)
from highwater.security.certificate_authority import CertificateAuthority
from highwater.security.sasl_client import SaslCredentials
from highwater.v1 import broker_pb2, broker_pb2_grpc
from kafka import KafkaProducer
from kafka.admin import (
    ACL,
    ACLFilter,
    ACLOperation,
    ACLPermissionType,
    ACLResourcePatternType,
    KafkaAdminClient,
    ResourcePattern,
    ResourcePatternFilter,
)
from kafka.admin import ResourceType as KafkaResourceType
from kafka.errors import ClusterAuthorizationFailedError, TopicAuthorizationFailedError
from kafka.protocol.admin import DeleteTopicsRequest, DeleteTopicsResponse
from kafka.protocol.consumer import (
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
)
from kafka.protocol.metadata import ApiVersionsRequest, MetadataRequest, MetadataResponse
from kafka.protocol.sasl import (
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
)
from kafka_servers import KafkaServer, kafka_server, read_frame, request_frame

pytestmark = pytest.mark.timeout(180)

TOPIC, GROUP = "orders", "g-alice"
ISSUER, AUDIENCE = "https://idp.example", "highwater"
MECHANISM = "SCRAM-SHA-512"
PASSWORDS = {"admin": "admin-pw", "alice": "alice-pw", "bob": "bob-pw"}


@dataclass
class Pki:
    ca: CertificateAuthority
    root: Path
    signing_key: Any

    @property
    def ca_file(self) -> Path:
        return self.root / "ca.crt"

    def files(self, name: str) -> tuple[Path, Path]:
        return self.root / f"{name}.crt", self.root / f"{name}.key"

    def admin_config(self, address: str) -> dict[str, str]:
        cert, key = self.files("admin")
        return {
            "bootstrap.servers": address,
            "security.protocol": "SSL",
            "ssl.ca.location": str(self.ca_file),
            "ssl.certificate.location": str(cert),
            "ssl.key.location": str(key),
        }

    def jwt(self, subject: str) -> str:
        now = time.time()
        claims = {"iss": ISSUER, "aud": AUDIENCE, "sub": subject, "iat": now, "exp": now + 600}
        return jwt.encode(claims, self.signing_key, algorithm="RS256", headers={"kid": "k1"})


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    root = tmp_path_factory.mktemp("kafka-security")
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()))
    (root / "jwks.json").write_text(json.dumps({"keys": [{**jwk, "kid": "k1"}]}))
    pki = Pki(CertificateAuthority(), root, key)
    pki.ca_file.write_bytes(pki.ca.certificate_pem)
    pki.ca.issue("server", hosts=["127.0.0.1", "localhost"]).write(*pki.files("server"))
    for client in ("admin", "writer", "nobody"):
        pki.ca.issue(client, server=False).write(*pki.files(client))
    return pki


def _server_args(pki: Pki, *sasl: str) -> tuple[str, ...]:
    cert, key = pki.files("server")
    return (
        *("--tls-cert-file", str(cert), "--tls-key-file", str(key)),
        *("--tls-ca-file", str(pki.ca_file), "--super-users", "User:admin;User:server"),
        *sasl,
    )


def _admin_credentials(pki: Pki) -> grpc.ChannelCredentials:
    cert, key = pki.files("admin")
    return grpc.ssl_channel_credentials(
        pki.ca_file.read_bytes(), key.read_bytes(), cert.read_bytes()
    )


def acl(
    principal: str,
    operation: AclOperation,
    name: str = TOPIC,
    kind: ResourceType = ResourceType.TOPIC,
) -> AclBinding:
    return AclBinding(
        kind, name, PatternType.LITERAL, principal, "*", operation, AclPermissionType.ALLOW
    )


async def _prepare(pki: Pki, address: str, acls: list[AclBinding], users: bool) -> None:
    """As the admin over gRPC: the topic, the SCRAM users, the ACLs."""
    async with AdminClient(pki.admin_config(address)) as admin:
        created = await admin.create_topics([NewTopic(TOPIC, 1, 1)])
        assert created[TOPIC].error is None, created
        if users:
            outcome = await admin.alter_user_scram_credentials(
                [(user, MECHANISM, password) for user, password in PASSWORDS.items()]
            )
            assert all(error is None for error in outcome.values()), outcome
        assert await admin.create_acls(acls) == [None] * len(acls)


@pytest.fixture(scope="module")
def servers(pki: Pki) -> Iterator[tuple[KafkaServer, KafkaServer]]:
    """The ``SASL_SSL`` server and the ``SSL`` one, started side by side."""
    sasl_args = _server_args(
        pki,
        *("--sasl-enabled-mechanisms", f"{MECHANISM},OAUTHBEARER"),
        *("--oauthbearer-jwks-file", str(pki.root / "jwks.json")),
        *("--oauthbearer-issuer", ISSUER, "--oauthbearer-audience", AUDIENCE),
    )
    credentials = _admin_credentials(pki)
    starting = [
        kafka_server(
            pki.root / "sasl-ssl", *sasl_args, protocol="SASL_SSL", credentials=credentials
        ),
        kafka_server(pki.root / "ssl", *_server_args(pki), protocol="SSL", credentials=credentials),
    ]
    with ThreadPoolExecutor(2) as pool:
        entering = [pool.submit(server.__enter__) for server in starting]
    failures = [f.exception() for f in entering if f.exception() is not None]
    if failures:  # stop the one that did start
        for server, future in zip(starting, entering, strict=True):
            if future.exception() is None:
                server.__exit__(None, None, None)
        raise failures[0]
    try:
        sasl_ssl, ssl_listener = (future.result() for future in entering)
        sasl_acls = [
            acl("User:alice", AclOperation.WRITE),
            acl("User:alice", AclOperation.READ),
            acl("User:alice", AclOperation.READ, GROUP, ResourceType.GROUP),
            acl("User:bob", AclOperation.READ),
            acl("User:carol", AclOperation.WRITE),
        ]
        ssl_acls = [acl("User:writer", AclOperation.WRITE), acl("User:writer", AclOperation.READ)]

        async def prepare() -> None:
            await asyncio.gather(
                _prepare(pki, sasl_ssl.address, sasl_acls, users=True),
                _prepare(pki, ssl_listener.address, ssl_acls, users=False),
            )

        asyncio.run(prepare())
        yield sasl_ssl, ssl_listener
    finally:
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda server: server.__exit__(None, None, None), starting))


@pytest.fixture(scope="module")
def sasl_ssl(servers: tuple[KafkaServer, KafkaServer]) -> KafkaServer:
    return servers[0]


@pytest.fixture(scope="module")
def ssl_listener(servers: tuple[KafkaServer, KafkaServer]) -> KafkaServer:
    return servers[1]


def scram_config(pki: Pki, server: KafkaServer, user: str, password: str = "") -> dict[str, Any]:
    return {
        "bootstrap.servers": server.bootstrap,
        "security.protocol": "SASL_SSL",
        "ssl.ca.location": str(pki.ca_file),
        "sasl.mechanism": MECHANISM,
        "sasl.username": user,
        "sasl.password": password or PASSWORDS[user],
    }


def produce(config: dict[str, Any], values: list[bytes]) -> list[KafkaError | None]:
    """Each value's delivery outcome (``None``: delivered)."""
    producer = Producer({**config, "message.timeout.ms": 15000})
    outcomes: list[KafkaError | None] = []
    for value in values:
        producer.produce(TOPIC, value, on_delivery=lambda error, _m: outcomes.append(error))
    producer.flush(20)
    return outcomes


def end_offset(pki: Pki, server: KafkaServer) -> int:
    consumer = Consumer({**scram_config(pki, server, "alice"), "group.id": GROUP})
    try:
        return int(consumer.get_watermark_offsets(TopicPartition(TOPIC, 0), timeout=15)[1])
    finally:
        consumer.close()


# --- SASL_SSL ---------------------------------------------------------------------------


def test_scram_sha_512_over_sasl_ssl_produces_and_consumes_in_a_group(
    pki: Pki, sasl_ssl: KafkaServer
) -> None:
    values = [f"scram-{i}".encode() for i in range(5)]
    assert produce(scram_config(pki, sasl_ssl, "alice"), values) == [None] * 5
    consumer = Consumer(
        {
            **scram_config(pki, sasl_ssl, "alice"),
            "group.id": GROUP,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    try:
        consumer.subscribe([TOPIC])
        read: list[bytes] = []
        deadline = time.monotonic() + 30
        while not set(values) <= set(read) and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None:
                assert message.error() is None, message.error()
                read.append(message.value())
        assert set(values) <= set(read)
        committed = consumer.commit(asynchronous=False)
        assert committed is not None and all(tp.error is None for tp in committed)
    finally:
        consumer.close()


def test_oauthbearer_with_confluent_kafka(pki: Pki, sasl_ssl: KafkaServer) -> None:
    """``oauth_cb`` returns a token signed by the key of the server's JWKS: its subject
    ``carol`` is the principal, and the ACLs of ``User:carol`` let it write."""
    tokens: list[str] = []

    def oauth_cb(_config: str) -> tuple[str, float]:
        tokens.append(pki.jwt("carol"))
        return tokens[-1], time.time() + 600

    config = {
        "bootstrap.servers": sasl_ssl.bootstrap,
        "security.protocol": "SASL_SSL",
        "ssl.ca.location": str(pki.ca_file),
        "sasl.mechanism": "OAUTHBEARER",
        "oauth_cb": oauth_cb,
    }
    assert produce(config, [b"from carol"]) == [None]
    assert tokens


def test_a_principal_without_write_is_refused_and_nothing_is_written(
    pki: Pki, sasl_ssl: KafkaServer
) -> None:
    before = end_offset(pki, sasl_ssl)
    outcomes = produce(scram_config(pki, sasl_ssl, "bob"), [b"from bob", b"again"])
    assert [e.code() if e else None for e in outcomes] == [
        KafkaError.TOPIC_AUTHORIZATION_FAILED
    ] * 2
    assert end_offset(pki, sasl_ssl) == before


def test_acls_round_trip_through_kafka_pythons_admin_client(
    pki: Pki, sasl_ssl: KafkaServer
) -> None:
    admin = KafkaAdminClient(
        bootstrap_servers=sasl_ssl.bootstrap,
        security_protocol="SASL_SSL",
        ssl_cafile=str(pki.ca_file),
        sasl_mechanism=MECHANISM,
        sasl_plain_username="admin",
        sasl_plain_password=PASSWORDS["admin"],
    )
    try:
        topic = f"audit-{uuid.uuid4().hex[:6]}"
        granted = ACL(
            principal="User:dave",
            host="*",
            operation=ACLOperation.READ,
            permission_type=ACLPermissionType.ALLOW,
            resource_pattern=ResourcePattern(
                KafkaResourceType.TOPIC, topic, ACLResourcePatternType.PREFIXED
            ),
        )
        created = admin.create_acls([granted])
        assert created["failed"] == [] and created["succeeded"] == [granted]
        by_dave = ACLFilter(
            principal="User:dave",
            host=None,
            operation=ACLOperation.ANY,
            permission_type=ACLPermissionType.ANY,
            resource_pattern=ResourcePatternFilter(
                KafkaResourceType.ANY, None, ACLResourcePatternType.ANY
            ),
        )
        described, error = admin.describe_acls(by_dave)
        assert error.errno == 0 and described == [granted]
        ((_, deleted, error),) = admin.delete_acls([by_dave])
        assert error.errno == 0 and deleted == [granted]
        assert admin.describe_acls(by_dave)[0] == []
    finally:
        admin.close()
    # A SCRAM user that is no super user may not touch the ACLs.
    alice = KafkaAdminClient(
        bootstrap_servers=sasl_ssl.bootstrap,
        security_protocol="SASL_SSL",
        ssl_cafile=str(pki.ca_file),
        sasl_mechanism=MECHANISM,
        sasl_plain_username="alice",
        sasl_plain_password=PASSWORDS["alice"],
    )
    try:
        refused = alice.create_acls([granted])
        assert refused == {"succeeded": [], "failed": [ClusterAuthorizationFailedError]}
    finally:
        alice.close()


# --- the SASL exchange on a raw connection --------------------------------------------------


def _tls_socket(pki: Pki, server: KafkaServer) -> ssl.SSLSocket:
    host, port = server.bootstrap.rsplit(":", 1)
    context = ssl.create_default_context(cafile=str(pki.ca_file))
    raw = socket.create_connection((host, int(port)), timeout=10)
    return context.wrap_socket(raw, server_hostname=host)


def _closed(sock: ssl.SSLSocket) -> bool:
    try:
        return sock.recv(1) == b""
    except (ConnectionError, ssl.SSLError):
        return True


def _scram_login(sock: ssl.SSLSocket, user: str, password: str, correlation: int) -> Any:
    """SaslHandshake v1, then SaslAuthenticate v2 steps; the last answer."""
    sock.sendall(request_frame(SaslHandshakeRequest(mechanism=MECHANISM), 1, correlation))
    read_frame(sock)
    exchange = SaslCredentials(MECHANISM, user, password).exchange()
    message: bytes | None = exchange.first()
    answer: Any = None
    while message is not None:
        correlation += 1
        sock.sendall(request_frame(SaslAuthenticateRequest(auth_bytes=message), 2, correlation))
        answer = SaslAuthenticateResponse.decode(read_frame(sock)[5:], version=2)
        if answer.error_code:
            return answer
        message = exchange.respond(answer.auth_bytes)
        if message is None:
            return answer
    return answer


def test_a_request_before_authentication_closes_the_connection(
    pki: Pki, sasl_ssl: KafkaServer
) -> None:
    with _tls_socket(pki, sasl_ssl) as sock:
        sock.sendall(request_frame(ApiVersionsRequest(), 0, 1))  # served before SASL
        assert struct.unpack(">i", read_frame(sock)[:4]) == (1,)
        sock.sendall(request_frame(MetadataRequest(topics=None), 9, 2))
        assert _closed(sock)


def test_a_connection_reauthenticates_as_its_principal_only(
    pki: Pki, sasl_ssl: KafkaServer
) -> None:
    """KIP-368: the answer carries the session's lifetime, 0 with Kafka's default
    connections.max.reauth.ms (0: the session never expires, whatever the gRPC session
    tokens' lifetime); the same user authenticates again on the connection and goes on;
    another user's credentials are refused and the connection closed."""
    with _tls_socket(pki, sasl_ssl) as sock:
        first = _scram_login(sock, "alice", PASSWORDS["alice"], 1)
        assert (first.error_code, first.session_lifetime_ms) == (0, 0)
        again = _scram_login(sock, "alice", PASSWORDS["alice"], 10)
        assert again.error_code == 0
        sock.sendall(request_frame(MetadataRequest(topics=None), 9, 20))
        assert struct.unpack(">i", read_frame(sock)[:4]) == (20,)
        other = _scram_login(sock, "bob", PASSWORDS["bob"], 30)
        assert other.error_code == 58  # SASL_AUTHENTICATION_FAILED
        assert _closed(sock)


def test_an_offset_commit_to_a_group_not_allowed_answers_each_partition(
    pki: Pki, sasl_ssl: KafkaServer
) -> None:
    """Kafka answers a refused group in every partition of the OffsetCommit
    (GROUP_AUTHORIZATION_FAILED, 30): a client reads the partitions' errors, and one
    missing reads as an answer that lost it."""
    R = OffsetCommitRequest
    request = R(
        group_id=GROUP, generation_id_or_member_epoch=-1, member_id="", group_instance_id=None,
        retention_time_ms=-1,
        topics=[R.OffsetCommitRequestTopic(name=TOPIC, partitions=[
            R.OffsetCommitRequestTopic.OffsetCommitRequestPartition(
                partition_index=0, committed_offset=0, committed_leader_epoch=-1,
                committed_metadata="")])],
    )  # fmt: skip
    with _tls_socket(pki, sasl_ssl) as sock:
        assert _scram_login(sock, "bob", PASSWORDS["bob"], 1).error_code == 0
        sock.sendall(request_frame(request, 8, 10))
        answer = OffsetCommitResponse.decode(read_frame(sock)[5:], version=8)
    assert [(t.name, [(p.partition_index, p.error_code) for p in t.partitions])
            for t in answer.topics] == [(TOPIC, [(0, 30)])]  # fmt: skip


def test_an_offset_fetch_below_v2_answers_a_refused_group_in_each_partition(
    pki: Pki, sasl_ssl: KafkaServer
) -> None:
    """OffsetFetch v0 and v1 have no top-level error: Kafka puts the group's error
    (GROUP_AUTHORIZATION_FAILED, 30) in each partition asked, with offset -1, else a client
    reads "no committed offsets". A v1 request that names no partition has nowhere to put
    it (as in Kafka); v2 and later answer it at the top, with no partitions."""
    R = OffsetFetchRequest
    asked = [R.OffsetFetchRequestTopic(name=TOPIC, partition_indexes=[0, 1])]
    with _tls_socket(pki, sasl_ssl) as sock:
        assert _scram_login(sock, "bob", PASSWORDS["bob"], 1).error_code == 0
        sock.sendall(request_frame(R(group_id=GROUP, topics=asked), 1, 10))
        v1 = OffsetFetchResponse.decode(read_frame(sock)[4:], version=1)
        sock.sendall(request_frame(R(group_id=GROUP, topics=[]), 1, 11))
        v1_none = OffsetFetchResponse.decode(read_frame(sock)[4:], version=1)
        sock.sendall(request_frame(R(group_id=GROUP, topics=asked), 3, 12))
        v3 = OffsetFetchResponse.decode(read_frame(sock)[4:], version=3)
    assert [(t.name, [(p.partition_index, p.error_code, p.committed_offset, p.metadata)
                      for p in t.partitions]) for t in v1.topics] == [
        (TOPIC, [(0, 30, -1, ""), (1, 30, -1, "")])]  # fmt: skip
    assert v1_none.topics == []
    assert (v3.error_code, v3.topics) == (30, [])


def test_a_v0_handshake_takes_bare_tokens(pki: Pki, sasl_ssl: KafkaServer) -> None:
    """KIP-43's framing: after SaslHandshake v0 the SCRAM messages are bare frames both ways;
    then the connection is served as the user."""
    with _tls_socket(pki, sasl_ssl) as sock:
        sock.sendall(request_frame(SaslHandshakeRequest(mechanism=MECHANISM), 0, 1))
        read_frame(sock)
        exchange = SaslCredentials(MECHANISM, "alice", PASSWORDS["alice"]).exchange()
        message: bytes | None = exchange.first()
        while message is not None:
            sock.sendall(struct.pack(">i", len(message)) + message)
            message = exchange.respond(read_frame(sock))
        sock.sendall(request_frame(MetadataRequest(topics=None), 9, 2))
        assert struct.unpack(">i", read_frame(sock)[:4]) == (2,)


# --- SSL: the client certificate is the principal --------------------------------------------


def test_an_ssl_client_certificate_is_the_principal(pki: Pki, ssl_listener: KafkaServer) -> None:
    def producer(name: str) -> KafkaProducer:
        cert, key = pki.files(name)
        return KafkaProducer(
            bootstrap_servers=ssl_listener.bootstrap,
            security_protocol="SSL",
            ssl_cafile=str(pki.ca_file),
            ssl_certfile=str(cert),
            ssl_keyfile=str(key),
            retries=0,
        )

    writer = producer("writer")  # CN=writer: User:writer, allowed WRITE on the topic
    try:
        assert writer.send(TOPIC, b"from writer").get(timeout=30).offset >= 0
    finally:
        writer.close()
    nobody = producer("nobody")
    try:
        with pytest.raises(TopicAuthorizationFailedError):
            nobody.send(TOPIC, b"from nobody").get(timeout=30)
    finally:
        nobody.close()


def _kcat() -> str:
    kcat = shutil.which("kcat")
    assert kcat is not None, "kcat is installed by `make test` (Debian's kcat package)"
    return kcat


def _certificate_socket(pki: Pki, server: KafkaServer, client: str) -> ssl.SSLSocket:
    host, port = server.bootstrap.rsplit(":", 1)
    context = ssl.create_default_context(cafile=str(pki.ca_file))
    context.load_cert_chain(*pki.files(client))
    raw = socket.create_connection((host, int(port)), timeout=10)
    return context.wrap_socket(raw, server_hostname=host)


def _metadata_v12(sock: ssl.SSLSocket, topic: MetadataRequest.MetadataRequestTopic) -> Any:
    request = MetadataRequest(
        topics=[topic], allow_auto_topic_creation=False, include_topic_authorized_operations=False
    )
    sock.sendall(request_frame(request, 12, 40))
    return MetadataResponse.decode(read_frame(sock)[5:], version=12).topics[0]


def test_metadata_by_topic_id_names_no_topic_the_caller_may_not_describe(
    pki: Pki, ssl_listener: KafkaServer
) -> None:
    """Metadata v12 asked by topic id, as Kafka answers it: an unknown id is
    UNKNOWN_TOPIC_ID (100), and a topic the caller may not describe
    TOPIC_AUTHORIZATION_FAILED (29) with a null name (the id is not secret, the name is);
    both with no partitions."""
    T = MetadataRequest.MetadataRequestTopic
    with _certificate_socket(pki, ssl_listener, "writer") as sock:
        known = _metadata_v12(sock, T(topic_id=uuid.UUID(int=0), name=TOPIC))
    assert (known.error_code, known.name) == (0, TOPIC)
    unknown_id = uuid.uuid4()
    with _certificate_socket(pki, ssl_listener, "nobody") as sock:
        refused = _metadata_v12(sock, T(topic_id=known.topic_id, name=None))
        unknown = _metadata_v12(sock, T(topic_id=unknown_id, name=None))
    assert (refused.error_code, refused.name, refused.topic_id, refused.partitions) == (
        29,
        None,
        known.topic_id,
        [],
    )
    assert (unknown.error_code, unknown.name, unknown.topic_id, unknown.partitions) == (
        100, None, unknown_id, [])  # fmt: skip


def test_delete_topics_by_id_names_only_what_the_caller_may_describe(
    pki: Pki, ssl_listener: KafkaServer
) -> None:
    """DeleteTopics v6 by topic id, as Kafka's ControllerApis answers it: an id that names
    no topic is UNKNOWN_TOPIC_ID (100) to anyone (ids are not secret); a topic the caller
    may not delete is TOPIC_AUTHORIZATION_FAILED (29), with its name when the caller may
    describe it (User:writer may READ it) and a null one when not (User:nobody)."""
    T = MetadataRequest.MetadataRequestTopic
    with _certificate_socket(pki, ssl_listener, "writer") as sock:
        topic_id = _metadata_v12(sock, T(topic_id=uuid.UUID(int=0), name=TOPIC)).topic_id
    unknown_id = uuid.uuid4()
    R = DeleteTopicsRequest
    request = R(
        topics=[R.DeleteTopicState(name=None, topic_id=i) for i in (topic_id, unknown_id)],
        timeout_ms=10_000,
    )
    answers = {}
    for client in ("writer", "nobody"):
        with _certificate_socket(pki, ssl_listener, client) as sock:
            sock.sendall(request_frame(request, 6, 50))
            answer = DeleteTopicsResponse.decode(read_frame(sock)[5:], version=6)
        answers[client] = sorted(
            ((r.topic_id == topic_id, r.name, r.error_code) for r in answer.responses),
            key=lambda r: r[0],
        )
    assert answers == {
        "writer": [(False, None, 100), (True, TOPIC, 29)],
        "nobody": [(False, None, 100), (True, None, 29)],
    }


def test_kcat_over_ssl_with_a_client_certificate(pki: Pki, ssl_listener: KafkaServer) -> None:
    cert, key = pki.files("writer")
    base = [
        *(_kcat(), "-b", ssl_listener.bootstrap, "-t", TOPIC),
        *("-X", "security.protocol=SSL", "-X", f"ssl.ca.location={pki.ca_file}"),
        *("-X", f"ssl.certificate.location={cert}", "-X", f"ssl.key.location={key}"),
    ]
    produced = subprocess.run([*base, "-P"], input=b"from kcat\n", capture_output=True, timeout=30)
    assert produced.returncode == 0, produced.stderr
    consumed = subprocess.run(
        [*base, "-C", "-o", "-1", "-c", "1", "-e"], capture_output=True, timeout=30
    )
    assert consumed.returncode == 0, consumed.stderr
    assert consumed.stdout.strip() == b"from kcat"


def test_kcat_scram_over_sasl_ssl_is_refused_for_its_librdkafkas_nonce(
    pki: Pki, sasl_ssl: KafkaServer
) -> None:
    """Debian's kcat links librdkafka 2.0.2, whose SCRAM client-final message repeats the
    client nonce (librdkafka#4895, fixed in 2.6.1). Highwater checks the nonce as RFC 5802
    and Kafka 4 do (Kafka 3 let it pass), so that login is refused; confluent-kafka's
    librdkafka (above) and kafka-python log in. Near the end of the module: the failure
    counts towards this host's refusal."""
    base = [
        *(_kcat(), "-b", sasl_ssl.bootstrap, "-t", TOPIC, "-X", "security.protocol=SASL_SSL"),
        *("-X", f"ssl.ca.location={pki.ca_file}", "-X", f"sasl.mechanisms={MECHANISM}"),
        *("-X", "sasl.username=alice", "-X", f"sasl.password={PASSWORDS['alice']}"),
        *("-X", "reconnect.backoff.ms=10000", "-X", "reconnect.backoff.max.ms=10000"),
    ]
    refused = subprocess.run([*base, "-P"], input=b"x\n", capture_output=True, timeout=30)
    assert refused.returncode != 0
    assert b"SASL authentication error: authentication failed" in refused.stderr


def test_a_wrong_password_is_refused(pki: Pki, sasl_ssl: KafkaServer) -> None:
    """Last of the module: the failures from this host count towards its refusal (as over
    gRPC), so the client is stopped at its first one. confluent-kafka reports it as
    _AUTHENTICATION with the broker's words, which say no more than that it failed."""
    errors: list[KafkaError] = []
    producer = Producer(
        {
            **scram_config(pki, sasl_ssl, "alice", password="not-alice-pw"),
            "error_cb": errors.append,
            "reconnect.backoff.ms": 10_000,
            "reconnect.backoff.max.ms": 10_000,
        }
    )
    deadline = time.monotonic() + 20
    while not errors and time.monotonic() < deadline:
        producer.poll(0.1)
    assert errors and errors[0].code() == KafkaError._AUTHENTICATION, errors
    assert "authentication failed" in errors[0].str()
    producer.purge()


def test_a_duplicate_in_delete_topics_is_invalid_before_it_is_authorized(
    pki: Pki, ssl_listener: KafkaServer
) -> None:
    """Kafka's ControllerApis finds duplicates before it authorizes: a name or an id asked
    twice is INVALID_REQUEST (42) once, whoever asks, and nothing is deleted; each entry
    was refused TOPIC_AUTHORIZATION_FAILED instead."""
    T = MetadataRequest.MetadataRequestTopic
    with _certificate_socket(pki, ssl_listener, "writer") as sock:
        topic_id = _metadata_v12(sock, T(topic_id=uuid.UUID(int=0), name=TOPIC)).topic_id
    R = DeleteTopicsRequest
    zero = uuid.UUID(int=0)
    request = R(
        topics=[R.DeleteTopicState(name=TOPIC, topic_id=zero)] * 2
        + [R.DeleteTopicState(name=None, topic_id=topic_id)] * 2,
        timeout_ms=10_000,
    )
    with _certificate_socket(pki, ssl_listener, "nobody") as sock:
        sock.sendall(request_frame(request, 6, 51))
        answer = DeleteTopicsResponse.decode(read_frame(sock)[5:], version=6)
    assert sorted(((r.name, r.topic_id, r.error_code) for r in answer.responses), key=str) == (
        sorted([(TOPIC, None, 42), (None, topic_id, 42)], key=str)
    )
    with _certificate_socket(pki, ssl_listener, "writer") as sock:
        assert _metadata_v12(sock, T(topic_id=uuid.UUID(int=0), name=TOPIC)).error_code == 0


def _client_credentials(pki: Pki, name: str) -> grpc.ChannelCredentials:
    cert, key = pki.files(name)
    return grpc.ssl_channel_credentials(
        pki.ca_file.read_bytes(), key.read_bytes(), cert.read_bytes()
    )


def test_describe_topic_partitions_shows_only_what_the_caller_may_describe(
    pki: Pki, ssl_listener: KafkaServer
) -> None:
    """KIP-966's pages judge permission before they are cut, over gRPC and the Kafka
    listener alike: with every topic asked for, a topic the caller may not describe is
    left out; named, it is TOPIC_AUTHORIZATION_FAILED (29) at the end of the page, an
    unknown one too (its existence is not disclosed). User:writer may read the topic,
    User:nobody nothing."""

    def over_grpc(client: str, topics: list[str]) -> list[tuple[str, int, int]]:
        with grpc.secure_channel(ssl_listener.address, _client_credentials(pki, client)) as ch:
            page = broker_pb2_grpc.BrokerStub(ch).DescribeTopicPartitions(
                broker_pb2.DescribeTopicPartitionsRequest(topics=topics), timeout=10
            )
        return [(t.name, t.error, len(t.partitions)) for t in page.topics]

    def over_kafka(client: str, topics: list[str]) -> list[tuple[str, int, int]]:
        R = DescribeTopicPartitionsRequest
        request = R(topics=[R.TopicRequest(name=n) for n in topics], cursor=None)
        with _certificate_socket(pki, ssl_listener, client) as sock:
            sock.sendall(request_frame(request, 0, 70))
            page = DescribeTopicPartitionsResponse.decode(read_frame(sock)[5:], version=0)
        return [(t.name, t.error_code, len(t.partitions)) for t in page.topics]

    for describe in (over_grpc, over_kafka):
        assert describe("writer", []) == [(TOPIC, 0, 1)], describe
        assert describe("nobody", []) == [], describe
        assert describe("writer", [TOPIC, "secret"]) == [(TOPIC, 0, 1), ("secret", 29, 0)]
        assert describe("nobody", [TOPIC, "secret"]) == [("orders", 29, 0), ("secret", 29, 0)]
