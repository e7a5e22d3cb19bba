"""Security benchmarks: one authorization decision with 10,000 ACLs in the image.

The authorizer (``highwater.security.authorizer``) answers every call of every service
when the ACL checks are on, so its cost is paid per request. The ACLs: 10,000 bindings
over 2,000 users and 4,000 topics, a tenth of them PREFIXED patterns of four lengths,
wildcard principals and hosts, some DENY; the questions: an allowed read of a topic with
literal ACLs, a write allowed by a prefixed ACL, and a refusal (no ACL for the caller).
Each figure is the mean of a tight loop of decisions (best of five runs), beside the
floor of one Python dict look-up measured the same way. The authorizer remembers its
decisions, so a loop asking the same question measures a remembered decision, as a
client's repeated requests get; each question is also asked from a different host every
time, on an authorizer that remembers nothing yet, for the cost of a decision made anew.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

from highwater.security import (
    AclAuthorizer,
    AclBinding,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
)

from bench.report import Report, Row, at_most

ACLS = 10_000
USERS = 2_000
TOPICS = 4_000
TARGET_US = 5.0
LOOPS = 50_000
SEED = 20261126


def _acls(rng: random.Random) -> list[AclBinding]:
    operations = [AclOperation.READ, AclOperation.WRITE, AclOperation.DESCRIBE, AclOperation.ALL]
    found: set[AclBinding] = set()
    while len(found) < ACLS:
        prefixed = rng.random() < 0.1
        topic = (
            f"team-{rng.randrange(TOPICS // 10)}-"[: rng.choice((5, 7, 8, 9))]
            if prefixed
            else f"topic-{rng.randrange(TOPICS)}"
        )
        found.add(
            AclBinding(
                ResourceType.TOPIC,
                topic,
                PatternType.PREFIXED if prefixed else PatternType.LITERAL,
                "User:*" if rng.random() < 0.02 else f"User:u{rng.randrange(USERS)}",
                "*" if rng.random() < 0.9 else f"10.0.0.{rng.randrange(255)}",
                rng.choice(operations),
                AclPermissionType.DENY if rng.random() < 0.05 else AclPermissionType.ALLOW,
            )
        )
    return sorted(found, key=repr)


def _mean_us(action: Callable[[], object], loops: int) -> float:
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        for _ in range(loops):
            action()
        best = min(best, (time.perf_counter() - started) / loops)
    return best * 1e6


def _mean_first_us(
    build: Callable[[], AclAuthorizer],
    ask: Callable[[AclAuthorizer, str], object],
    hosts: list[str],
) -> float:
    """The mean of a decision never asked before: each from another host, on an
    authorizer that remembers nothing (best of five runs, each on a fresh one)."""
    best = float("inf")
    for _ in range(5):
        authorizer = build()
        started = time.perf_counter()
        for host in hosts:
            ask(authorizer, host)
        best = min(best, (time.perf_counter() - started) / len(hosts))
    return best * 1e6


def run(report: Report) -> None:
    with report.suite("security", "Security (`highwater.security`)") as section:
        rng = random.Random(SEED)
        acls = _acls(rng)
        authorizer = AclAuthorizer(acls, super_users={"User:admin"})
        literal = next(
            a
            for a in acls
            if a.pattern_type is PatternType.LITERAL
            and a.permission is AclPermissionType.ALLOW
            and a.operation is AclOperation.READ
            and a.host == "*"
        )
        prefixed = next(
            a
            for a in acls
            if a.pattern_type is PatternType.PREFIXED
            and a.permission is AclPermissionType.ALLOW
            and a.operation in (AclOperation.WRITE, AclOperation.ALL)
            and a.host == "*"
        )
        loops = max(1_000, int(LOOPS * report.scale))
        table = {f"topic-{i}": i for i in range(TOPICS)}
        floor = _mean_us(lambda: table.get("topic-17"), loops)
        cases = [
            (
                "authorize, 10,000 ACLs: allowed by a literal ACL",
                literal.principal,
                AclOperation.READ,
                literal.resource_name,
            ),
            (
                "authorize, 10,000 ACLs: allowed by a prefixed ACL",
                prefixed.principal,
                AclOperation.WRITE,
                prefixed.resource_name + "orders",
            ),
            (
                "authorize, 10,000 ACLs: refused (no ACL for the caller)",
                "User:nobody",
                AclOperation.READ,
                literal.resource_name,
            ),
        ]
        hosts = [f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}" for i in range(loops)]
        for name, principal, operation, topic in cases:
            report.progress(f"security: {name}")
            decision = authorizer.authorize(
                principal, "10.1.2.3", operation, ResourceType.TOPIC, topic
            )
            mean = _mean_us(
                lambda p=principal, o=operation, t=topic: authorizer.authorize(
                    p, "10.1.2.3", o, ResourceType.TOPIC, t
                ),
                loops,
            )
            section.add(
                Row(
                    name,
                    mean,
                    "µs",
                    peer_name="one dict look-up",
                    peer_value=floor,
                    target=at_most(TARGET_US, "µs"),
                    extra=f"{decision.value}; mean of {loops:,} decisions, best of 5",
                )
            )
            first = _mean_first_us(
                lambda: AclAuthorizer(acls, super_users={"User:admin"}),
                lambda a, h, p=principal, o=operation, t=topic: a.authorize(
                    p, h, o, ResourceType.TOPIC, t
                ),
                hosts,
            )
            section.add(
                Row(
                    name.replace("10,000 ACLs:", "10,000 ACLs, first asked:"),
                    first,
                    "µs",
                    peer_name="one dict look-up",
                    peer_value=floor,
                    target=at_most(TARGET_US, "µs"),
                    extra=f"{decision.value}; mean of {loops:,} decisions from as many "
                    "hosts, best of 5",
                )
            )
        section.note(
            f"{ACLS:,} ACLs on {TOPICS:,} topics for {USERS:,} users (10% PREFIXED, 2% "
            "User:*, 10% host-specific, 5% DENY), indexed by resource type, literal name and "
            "prefix length; the host asked is 10.1.2.3 (for a first-asked decision, another "
            "host each time, on an authorizer remembering nothing). The decision is the "
            "authorizer's alone, as every call's check runs it: the interceptor adds the "
            "look-up of the call's principal."
        )
