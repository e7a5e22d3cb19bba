"""Authentication and ACLs on real processes: mutual TLS between every service with the
authorizer on, SCRAM-SHA-256, SCRAM-SHA-512 and OAUTHBEARER logins, each attack of
issue 16 refused with nothing written, and an ACL change applied on every broker within a
second.

One cluster for the module: a controller and two brokers with certificates of a throwaway
CA, ``--super-users`` naming the admin and the services' own certificates (as Kafka's
brokers are super users), every SASL mechanism enabled. This test process is the admin
(its channels present ``CN=admin``); the users' clients set Kafka's ``security.protocol``,
``ssl.*`` and ``sasl.*`` settings of their own (SASL_SSL with a certificate ``CN=app``
that no ACL names: the SASL user is the principal).
"""

from __future__ import annotations

import asyncio
import datetime
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import jwt
import pytest
from broker_processes import ProcessCluster, create_topic, process_cluster, wait_partition
from cryptography.hazmat.primitives.asymmetric import rsa
from highwater.client.admin import AdminClient, NewTopic
from highwater.client.consumer import OFFSET_BEGINNING, AsyncConsumer, TopicPartition
from highwater.client.producer import AsyncProducer, ProduceAuthorizationError
from highwater.controller_api import messages as m
from highwater.errors import SaslAuthenticationError
from highwater.internal.v1 import (
    controller_pb2,
    controller_pb2_grpc,
    raft_pb2,
    raft_pb2_grpc,
    replication_pb2,
    replication_pb2_grpc,
)
from highwater.rpc import tls
from highwater.security import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
)
from highwater.security.certificate_authority import CertificateAuthority
from highwater.security.sasl_client import SaslCredentials
from highwater.v1 import (
    admin_pb2,
    broker_pb2,
    broker_pb2_grpc,
    security_pb2,
    security_pb2_grpc,
)
from highwater.v1.common_pb2 import ErrorCode

pytestmark = pytest.mark.timeout(240)

BROKERS = (2, 3)  # the controller is node 1
TOPIC, SECRET = "orders", "secret"
ISSUER, AUDIENCE = "https://idp.example", "highwater"
PASSWORDS = {"alice": "alice-pw", "bob": "bob-pw", "carol": "carol-pw"}
MECHANISMS = {"alice": "SCRAM-SHA-256", "bob": "SCRAM-SHA-512", "carol": "SCRAM-SHA-256"}


@dataclass
class Secured:
    cluster: ProcessCluster
    ca: CertificateAuthority
    root: Path
    signing_key: Any

    @property
    def ca_file(self) -> Path:
        return self.root / "ca.crt"

    def files(self, name: str) -> tuple[Path, Path]:
        return self.root / f"{name}.crt", self.root / f"{name}.key"

    def issue(self, name: str, **kwargs: Any) -> tuple[Path, Path]:
        cert, key = self.files(name)
        self.ca.issue(name, hosts=["127.0.0.1", "localhost"], **kwargs).write(cert, key)
        return cert, key

    def credentials(self, name: str) -> grpc.ChannelCredentials:
        cert, key = self.files(name)
        return grpc.ssl_channel_credentials(
            self.ca_file.read_bytes(), key.read_bytes(), cert.read_bytes()
        )

    def client_config(self, **sasl: str) -> dict[str, str]:
        """A client's settings by Kafka's names: SASL_SSL as ``sasl`` says, over TLS with
        the ``CN=app`` certificate."""
        cert, key = self.files("app")
        return {
            "bootstrap.servers": self.cluster.bootstrap,
            "security.protocol": "SASL_SSL",
            "ssl.ca.location": str(self.ca_file),
            "ssl.certificate.location": str(cert),
            "ssl.key.location": str(key),
            **{f"sasl.{key}": value for key, value in sasl.items()},
        }

    def scram(self, user: str, password: str | None = None) -> dict[str, str]:
        return self.client_config(
            mechanism=MECHANISMS[user], username=user, password=password or PASSWORDS[user]
        )

    def jwt(self, subject: str, lifetime_s: float = 600) -> str:
        now = time.time()
        claims = {
            "iss": ISSUER,
            "aud": AUDIENCE,
            "sub": subject,
            "iat": now,
            "exp": now + lifetime_s,
        }
        return jwt.encode(claims, self.signing_key, algorithm="RS256", headers={"kid": "k1"})


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    root = tmp_path_factory.mktemp("auth")
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()))
    jwks = root / "jwks.json"
    jwks.write_text(json.dumps({"keys": [{**jwk, "kid": "k1"}]}))
    secured = Secured(None, CertificateAuthority(), root, key)  # type: ignore[arg-type]
    secured.ca_file.write_bytes(secured.ca.certificate_pem)
    for name in ("admin", "app", "rogue"):
        secured.issue(name)

    def args(name: str) -> tuple[str, ...]:
        cert, key_file = secured.issue(name)
        return (
            *("--tls-cert-file", str(cert), "--tls-key-file", str(key_file)),
            *("--tls-ca-file", str(secured.ca_file)),
            *("--super-users", "User:admin;User:controller-1;User:broker-2;User:broker-3"),
            *("--sasl-enabled-mechanisms", "SCRAM-SHA-256,SCRAM-SHA-512,OAUTHBEARER"),
            *("--oauthbearer-jwks-file", str(jwks)),
            *("--oauthbearer-issuer", ISSUER, "--oauthbearer-audience", AUDIENCE),
        )

    (root / "cluster").mkdir()
    secured.cluster = process_cluster(
        root / "cluster",
        BROKERS,
        controller_args=args("controller-1"),
        broker_args=lambda node_id: args(f"broker-{node_id}"),
    )
    cert, key_file = secured.files("admin")
    tls.configure(server=None, client=tls.ClientTls(secured.ca_file, cert, key_file))
    secured.cluster.start()
    try:
        asyncio.run(_prepare(secured))
        yield secured
    finally:
        secured.cluster.kill()
        tls.configure(server=None, client=None)


def acl(
    principal: str,
    operation: AclOperation,
    name: str = TOPIC,
    resource_type: ResourceType = ResourceType.TOPIC,
) -> AclBinding:
    return AclBinding(
        resource_type,
        name,
        PatternType.LITERAL,
        principal,
        "*",
        operation,
        AclPermissionType.ALLOW,
    )


async def _prepare(secured: Secured) -> None:
    """As the admin (a certificate, a super user): the topics, the users, their ACLs."""
    bootstrap = secured.cluster.bootstrap
    first = bootstrap.split(",")[0]
    await create_topic(first, NewTopic(TOPIC, replica_assignment={0: BROKERS}))
    await create_topic(first, NewTopic(SECRET, replica_assignment={0: BROKERS}))
    await wait_partition(
        secured.cluster.brokers.values(),
        TOPIC,
        lambda p: sorted(p.isr) == list(BROKERS),
        what="both brokers in the ISR over mutual TLS with the authorizer on",
    )
    async with AdminClient(bootstrap) as admin:
        outcome = await admin.alter_user_scram_credentials(
            [(user, MECHANISMS[user], password) for user, password in PASSWORDS.items()]
        )
        assert all(error is None for error in outcome.values()), outcome
        created = await admin.create_acls(
            [
                acl("User:alice", AclOperation.WRITE),
                acl("User:bob", AclOperation.READ),
                acl("User:svc", AclOperation.DESCRIBE),
            ]
        )
        assert created == [None, None, None]


async def read_all(config: dict[str, str], expected: int) -> list[bytes | None]:
    values: list[bytes | None] = []
    async with AsyncConsumer(config) as consumer:
        consumer.assign([TopicPartition(TOPIC, 0, OFFSET_BEGINNING)])
        async with asyncio.timeout(30):
            while len(values) < expected:
                message = await consumer.poll(1.0)
                if message is not None:
                    assert message.error() is None, message.error()
                    values.append(message.value())
    return values


async def end_offset(address: str) -> int:
    """The partition's log end offset, asked as the admin."""
    async with grpc.aio.secure_channel(address, _admin_credentials()) as channel:
        request = broker_pb2.ListOffsetsRequest()
        request.topics.add(topic=TOPIC).partitions.add(partition=0, timestamp=-1)
        reply = await broker_pb2_grpc.BrokerStub(channel).ListOffsets(request, timeout=10)
    (answer,) = reply.topics[0].partitions
    assert answer.error == ErrorCode.NONE
    return answer.offset


def _admin_credentials() -> grpc.ChannelCredentials:
    client = tls.client_tls()
    assert client is not None
    return client.credentials()


async def session_token(
    address: str, credentials: grpc.ChannelCredentials, sasl: SaslCredentials
) -> str:
    """A session token of ``address`` for ``sasl`` (the Authenticate exchange by hand)."""
    exchange = sasl.exchange()
    message: bytes | None = exchange.first()
    exchange_id = ""
    async with grpc.aio.secure_channel(address, credentials) as channel:
        stub = security_pb2_grpc.AuthenticationStub(channel)
        while message is not None:
            answer = await stub.Authenticate(
                security_pb2.AuthenticateRequest(
                    mechanism=sasl.mechanism, auth_bytes=message, exchange_id=exchange_id
                ),
                timeout=10,
            )
            assert answer.error == ErrorCode.NONE, answer.error_message
            if answer.complete:
                return answer.session_token
            exchange_id = answer.exchange_id
            message = exchange.respond(answer.auth_bytes)
    raise AssertionError("the exchange did not complete")


async def metadata_topics(
    address: str, credentials: grpc.ChannelCredentials, token: str
) -> dict[str, int]:
    async with grpc.aio.secure_channel(address, credentials) as channel:
        reply = await broker_pb2_grpc.BrokerStub(channel).Metadata(
            broker_pb2.MetadataRequest(), metadata=(("highwater-session", token),), timeout=10
        )
    return {topic.name: topic.error for topic in reply.topics}


async def test_sasl_logins_over_mutual_tls_with_the_authorizer_on(secured: Secured) -> None:
    # SCRAM-SHA-256: alice writes (an idempotent producer: WRITE on the topic suffices).
    async with AsyncProducer({**secured.scram("alice"), "acks": "all"}) as producer:
        for i in range(10):
            await producer.send(TOPIC, f"m{i}".encode(), partition=0)
    # SCRAM-SHA-512: bob reads them.
    assert await read_all(secured.scram("bob"), 10) == [f"m{i}".encode() for i in range(10)]
    # OAUTHBEARER: svc may describe the topic, and sees only it; the session ends with the
    # token (its lifetime is the JWT's).
    token_file = secured.root / "svc.jwt"
    token_file.write_text(secured.jwt("svc", lifetime_s=300))
    leader = secured.cluster.brokers[BROKERS[0]].address
    app = secured.credentials("app")
    token = await session_token(
        leader,
        app,
        SaslCredentials("OAUTHBEARER", token_file=token_file),
    )
    seen = await metadata_topics(leader, app, token)
    assert seen == {TOPIC: ErrorCode.NONE}, seen  # not the secret topic
    async with AdminClient(
        secured.client_config(
            **{"mechanism": "OAUTHBEARER", "oauthbearer.token.file": str(token_file)}
        )
    ) as svc:
        listed = await svc.list_topics()
    assert {topic.name for topic in listed} == {TOPIC}


async def test_attacks_are_refused_and_nothing_is_written(secured: Secured) -> None:
    cluster = secured.cluster
    leader = cluster.brokers[BROKERS[0]].address
    follower = cluster.brokers[BROKERS[1]].address
    before = await end_offset(leader)

    # Transport: plaintext, another CA's certificate, an expired certificate.
    other = CertificateAuthority("another CA").issue("mallory", server=False)
    past = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=2)
    expired_cert, expired_key = secured.issue(
        "expired", not_before=past, not_after=past + datetime.timedelta(days=1)
    )
    for credentials in (
        None,
        grpc.ssl_channel_credentials(
            secured.ca.certificate_pem, other.key_pem, other.certificate_pem
        ),
        grpc.ssl_channel_credentials(
            secured.ca.certificate_pem, expired_key.read_bytes(), expired_cert.read_bytes()
        ),
    ):
        channel = (
            grpc.aio.insecure_channel(leader)
            if credentials is None
            else grpc.aio.secure_channel(leader, credentials)
        )
        async with channel:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await broker_pb2_grpc.BrokerStub(channel).Metadata(
                    broker_pb2.MetadataRequest(), timeout=5
                )
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE

    # A wrong SCRAM password: SASL_AUTHENTICATION_FAILED, typed, and nothing written.
    async with AsyncProducer(
        {
            **secured.scram("alice", password="guess"),
            "acks": "all",
            "delivery.timeout.ms": 5000,
            "request.timeout.ms": 2000,
            "linger.ms": 0,
        }
    ) as impostor:
        with pytest.raises(SaslAuthenticationError):
            await impostor.send(TOPIC, b"forged", partition=0)

    # Forged, expired, and foreign session tokens: UNAUTHENTICATED.
    app = secured.credentials("app")
    alice = SaslCredentials("SCRAM-SHA-256", "alice", PASSWORDS["alice"])
    token = await session_token(leader, app, alice)
    payload, _, signature = token.partition(".")
    tampered = payload[:-1] + ("A" if payload[-1] != "A" else "B") + "." + signature
    foreign = await session_token(follower, app, alice)  # the other broker's
    for bad in (tampered, "not-a-token", foreign):
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await metadata_topics(leader, app, bad)
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    # An expired OAUTHBEARER token does not log in.
    async with grpc.aio.secure_channel(leader, app) as channel:
        answer = await security_pb2_grpc.AuthenticationStub(channel).Authenticate(
            security_pb2.AuthenticateRequest(
                mechanism="OAUTHBEARER",
                auth_bytes=SaslCredentials("OAUTHBEARER", token=secured.jwt("svc", -120))
                .exchange()
                .first(),
            ),
            timeout=10,
        )
    assert answer.error == ErrorCode.SASL_AUTHENTICATION_FAILED and not answer.session_token

    # A principal without the ACL: bob may read, not write, create, delete nor alter ACLs.
    async with AsyncProducer(
        {**secured.scram("bob"), "acks": "all", "enable.idempotence": "false", "linger.ms": 0}
    ) as bob_producer:
        with pytest.raises(ProduceAuthorizationError) as denied:
            await bob_producer.send(TOPIC, b"not bob's", partition=0)
    assert denied.value.code == ErrorCode.TOPIC_AUTHORIZATION_FAILED
    async with AsyncProducer({**secured.scram("carol"), "acks": "all"}) as carol:
        with pytest.raises(ProduceAuthorizationError) as denied:
            await carol.send(TOPIC, b"no ACL at all", partition=0)
    assert denied.value.code == ErrorCode.TOPIC_AUTHORIZATION_FAILED  # from Metadata
    async with AsyncProducer({**secured.scram("bob"), "acks": "all"}) as idempotent_bob:
        with pytest.raises(ProduceAuthorizationError) as denied:
            await idempotent_bob.send(TOPIC, b"idempotent, no WRITE", partition=0)
    assert denied.value.code == ErrorCode.CLUSTER_AUTHORIZATION_FAILED  # InitProducerId
    bob_token = await session_token(
        leader, app, SaslCredentials("SCRAM-SHA-512", "bob", PASSWORDS["bob"])
    )
    as_bob = (("highwater-session", bob_token),)
    async with grpc.aio.secure_channel(leader, app) as channel:
        broker = broker_pb2_grpc.BrokerStub(channel)
        created = await broker.CreateTopics(
            admin_pb2.CreateTopicsRequest(topics=[admin_pb2.CreatableTopic(name="bobs")]),
            metadata=as_bob,
            timeout=10,
        )
        assert [t.error for t in created.topics] == [ErrorCode.TOPIC_AUTHORIZATION_FAILED]
        deleted = await broker.DeleteTopics(
            admin_pb2.DeleteTopicsRequest(names=[TOPIC]), metadata=as_bob, timeout=10
        )
        assert [t.error for t in deleted.topics] == [ErrorCode.TOPIC_AUTHORIZATION_FAILED]
        acls = await broker.CreateAcls(
            admin_pb2.CreateAclsRequest(
                creations=[
                    admin_pb2.AclEntry(
                        resource_type=2,
                        resource_name=TOPIC,
                        pattern_type=3,
                        principal="User:bob",
                        host="*",
                        operation=4,
                        permission_type=3,
                    )
                ]
            ),
            metadata=as_bob,
            timeout=10,
        )
        assert acls.error == ErrorCode.CLUSTER_AUTHORIZATION_FAILED
        seen = await metadata_topics(leader, app, bob_token)
        assert seen == {TOPIC: ErrorCode.NONE}

    # A forged broker id: "rogue" may CLUSTER_ACTION, but speaks for nodes not its own.
    async with AdminClient(cluster.bootstrap) as admin:
        assert await admin.create_acls(
            [acl("User:rogue", AclOperation.CLUSTER_ACTION, "kafka-cluster", ResourceType.CLUSTER)]
        ) == [None]
    rogue = secured.credentials("rogue")
    async with grpc.aio.secure_channel(cluster.controller.address, rogue) as channel:
        controller = controller_pb2_grpc.ControllerStub(channel)
        heartbeat = await controller.BrokerHeartbeat(
            controller_pb2.BrokerHeartbeatRequest(broker_id=BROKERS[0], broker_epoch=0),
            timeout=10,
        )
        assert heartbeat.error == ErrorCode.CLUSTER_AUTHORIZATION_FAILED
    fetch = replication_pb2.ReplicaFetchRequest(replica_id=BROKERS[1], replica_epoch=0)
    fetch.topics.add(topic=TOPIC).partitions.add(partition=0, fetch_offset=0)
    async with grpc.aio.secure_channel(leader, rogue) as channel:
        call = replication_pb2_grpc.ReplicaFetchServiceStub(channel).ReplicaFetch(timeout=10)
        await call.write(fetch)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await call.read()
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert f"fetch as broker {BROKERS[1]}" in (refused.value.details() or "")
    # Without CLUSTER_ACTION at all, the inter-service calls are refused whole, before any
    # request is read (a request written meanwhile may meet the ended call: not sent).
    async with grpc.aio.secure_channel(leader, app) as channel:
        call = replication_pb2_grpc.ReplicaFetchServiceStub(channel).ReplicaFetch(timeout=10)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await call.read()
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "CLUSTER_ACTION" in (refused.value.details() or "")
    async with grpc.aio.secure_channel(cluster.controller.address, app) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await raft_pb2_grpc.RaftStub(channel).Vote(raft_pb2.VoteRequest(), timeout=10)
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
        unregister = await controller_pb2_grpc.ControllerStub(channel).UnregisterBroker(
            admin_pb2.UnregisterBrokerRequest(broker_id=BROKERS[1]), timeout=10
        )
        assert unregister.error == ErrorCode.CLUSTER_AUTHORIZATION_FAILED

    # Nothing was written, nothing created, nothing deleted; the refusals were logged.
    assert await end_offset(leader) == before
    async with AdminClient(cluster.bootstrap) as admin:
        assert {t.name for t in await admin.list_topics()} == {TOPIC, SECRET}
    log = cluster.brokers[BROKERS[0]].log_text()
    assert "refused: principal User:bob" in log and "Topic:orders" in log


async def test_an_acl_change_applies_on_every_broker_within_a_second(secured: Secured) -> None:
    app = secured.credentials("app")
    carol = SaslCredentials("SCRAM-SHA-256", "carol", PASSWORDS["carol"])
    addresses = [b.address for b in secured.cluster.brokers.values()]
    tokens = {address: await session_token(address, app, carol) for address in addresses}

    async def sees_orders() -> dict[str, bool]:
        return {
            address: TOPIC in await metadata_topics(address, app, tokens[address])
            for address in addresses
        }

    assert await sees_orders() == dict.fromkeys(addresses, False)
    grant = acl("User:carol", AclOperation.DESCRIBE)
    async with AdminClient(secured.cluster.bootstrap) as admin:
        assert await admin.create_acls([grant]) == [None]
        granted = time.monotonic()
        while not all((await sees_orders()).values()):
            assert time.monotonic() - granted < 1.0, "the ACL did not reach every broker in 1 s"
            await asyncio.sleep(0.02)
        removed = await admin.delete_acls([m.AclFilter(principal="User:carol")])
        assert removed == [[grant]]
        revoked = time.monotonic()
        while any((await sees_orders()).values()):
            assert time.monotonic() - revoked < 1.0, "the removal did not reach every broker"
            await asyncio.sleep(0.02)
