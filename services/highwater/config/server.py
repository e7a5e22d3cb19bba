"""Server configuration (Kafka's ``server.properties``): the keys every role's ``--config`` takes.

One :data:`SERVER_CONFIG_DEF` holds every server-level key Highwater acts on, with
Kafka's names, types and defaults. A role reads a Java-properties file and ``--override
KEY=VALUE`` pairs (:func:`load_server_config`; precedence as Kafka's: an override beats
the file, the file beats the defaults) and refuses an unknown key or a bad value with an
:class:`~highwater.errors.InvalidConfigError` naming it, before it starts.

The keys fall in three groups:

* *cluster defaults* (:data:`CLUSTER_DEFAULT_KEYS`): ``num.partitions``,
  ``default.replication.factor`` and the broker-level defaults of topic settings
  (``min.insync.replicas``, ``log.retention.hours``...). The controllers' (or ``highwater
  server``'s) values go into the metadata log, so that every controller and broker
  agrees on them; ``highwater configs --entity-type brokers --entity-default --alter``
  changes them at run time (Kafka's default-broker-config resource), and a dynamic value
  beats the file's. :func:`topic_defaults` turns them into topic-level names
  (``log.retention.hours`` -> ``retention.ms``).
* *controller settings*: session timeouts, leader rebalancing, the shape of
  ``__consumer_offsets``, the metadata snapshot interval; read at start by controllers.
* *broker and coordinator settings*: ``log.dirs``, ``broker.rack``, ``replica.lag.time.max.ms``,
  ``initial.broker.registration.timeout.ms``,
  ``quota.window.num``, ``quota.window.size.seconds``, ``connections.max.idle.ms``,
  ``max.request.partition.size.limit``, ``group.initial.rebalance.delay.ms``,
  the listeners (``listeners``, ``advertised.listeners``, ``inter.broker.listener.name``:
  :mod:`highwater.config.listeners`); read at start by their role.

Every role accepts every key (one file may serve them all, as Kafka's ``server.properties``
does) and uses those of its own groups.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from highwater.config.definition import (
    NO_DEFAULT,
    ConfigDef,
    ConfigKey,
    ConfigType,
    ConfigValue,
    DistinctList,
    at_least,
    between,
    list_of,
    one_of,
)
from highwater.config.limits import BATCH_MAX_BYTES
from highwater.config.listeners import (
    ADVERTISED_LISTENERS,
    INTER_BROKER_LISTENER_NAME,
    LISTENERS,
    ListenerList,
    ListenerName,
)
from highwater.config.topic import (
    CLEANUP_POLICY_COMPACT,
    CLEANUP_POLICY_DELETE,
    COMPRESSION_TYPES,
    TIMESTAMP_TYPE_CREATE_TIME,
    TIMESTAMP_TYPE_LOG_APPEND_TIME,
)
from highwater.errors import InvalidConfigError

__all__ = [
    "BROKER_DYNAMIC_CONFIG_DEF",
    "CLUSTER_DEFAULT_KEYS",
    "GRPC_SESSION_TOKEN_LIFETIME_MS",
    "SERVER_CONFIG_DEF",
    "ServerConfig",
    "load_server_config",
    "merge_cluster_defaults",
    "parse_override",
    "read_properties",
    "topic_defaults",
]

GRPC_SESSION_TOKEN_LIFETIME_MS: Final = "grpc.session.token.lifetime.ms"

_INT = ConfigType.INT
_LONG = ConfigType.LONG
_BOOLEAN = ConfigType.BOOLEAN
_STRING = ConfigType.STRING

_CLUSTER_DEFAULTS: Final = [
    ConfigKey(
        "num.partitions",
        _INT,
        1,
        at_least(1),
        "The partitions of a topic created without a partition count.",
    ),
    ConfigKey(
        "default.replication.factor",
        _INT,
        1,
        at_least(1),
        "The replication factor of a topic created without one.",
    ),
    ConfigKey(
        "min.insync.replicas",
        _INT,
        1,
        at_least(1),
        "The default of the topic setting: the fewest in-sync replicas that must have a "
        "batch before an acks=all produce succeeds. A topic whose replication factor is "
        "below it is refused at creation.",
    ),
    ConfigKey(
        "unclean.leader.election.enable",
        _BOOLEAN,
        False,
        None,
        "The default of the topic setting: whether a replica outside the ISR may become "
        "leader when no ISR member is alive, at the risk of losing records.",
    ),
    ConfigKey(
        "eligible.leader.replicas.enable",
        _BOOLEAN,
        True,
        None,
        "Whether the controller keeps eligible leader replicas (KIP-966): replicas that "
        "left the ISR while it was below min.insync.replicas, which hold every committed "
        "record and may be elected cleanly when no ISR member is alive.",
    ),
    ConfigKey(
        "unclean.recovery.strategy",
        _STRING,
        "Balanced",
        one_of("None", "Balanced", "Aggressive"),
        "How the controller recovers a partition with no ISR or ELR member left (KIP-966): "
        "it asks the replicas of the last known ELR for their log ends and elects the "
        "longest log, once all of them answered (Balanced) or the first answered "
        "(Aggressive); None waits for an operator's unclean election.",
    ),
    ConfigKey(
        "log.retention.hours",
        _INT,
        168,
        None,
        "How long to keep a segment, in hours (topic setting retention.ms); "
        "log.retention.minutes and log.retention.ms win over it.",
    ),
    ConfigKey(
        "log.retention.minutes",
        _INT,
        NO_DEFAULT,
        None,
        "How long to keep a segment, in minutes; log.retention.ms wins over it.",
    ),
    ConfigKey(
        "log.retention.ms",
        _LONG,
        NO_DEFAULT,
        at_least(-1),
        "How long to keep a segment, in milliseconds; -1 keeps data forever.",
    ),
    ConfigKey(
        "log.retention.bytes",
        _LONG,
        -1,
        None,
        "The largest size of a partition before old segments are deleted (topic setting "
        "retention.bytes); -1 means no size limit.",
    ),
    ConfigKey(
        "log.segment.bytes",
        _INT,
        1073741824,
        at_least(14),
        "The size at which a segment is rolled (topic setting segment.bytes).",
    ),
    ConfigKey(
        "log.roll.hours",
        _INT,
        168,
        at_least(1),
        "Roll the active segment after this many hours (topic setting segment.ms); "
        "log.roll.ms wins over it.",
    ),
    ConfigKey(
        "log.roll.ms",
        _LONG,
        NO_DEFAULT,
        at_least(1),
        "Roll the active segment after this many milliseconds.",
    ),
    ConfigKey(
        "log.cleanup.policy",
        ConfigType.LIST,
        CLEANUP_POLICY_DELETE,
        list_of(CLEANUP_POLICY_COMPACT, CLEANUP_POLICY_DELETE),
        "The default cleanup policy of topics (topic setting cleanup.policy).",
    ),
    ConfigKey(
        "log.cleaner.delete.retention.ms",
        _LONG,
        86400000,
        at_least(0),
        "How long compacted topics keep delete tombstones (topic setting delete.retention.ms).",
    ),
    ConfigKey(
        "log.index.interval.bytes",
        _INT,
        4096,
        at_least(0),
        "Bytes between two offset index entries (topic setting index.interval.bytes).",
    ),
    ConfigKey(
        "log.segment.delete.delay.ms",
        _LONG,
        60000,
        at_least(0),
        "How long a deleted segment stays on disk (topic setting file.delete.delay.ms).",
    ),
    ConfigKey(
        "log.flush.interval.messages",
        _LONG,
        2**63 - 1,
        at_least(1),
        "Force an fsync after this many messages (topic setting flush.messages).",
    ),
    ConfigKey(
        "log.flush.interval.ms",
        _LONG,
        NO_DEFAULT,
        at_least(0),
        "Force an fsync after this many milliseconds (topic setting flush.ms).",
    ),
    ConfigKey(
        "log.preallocate",
        _BOOLEAN,
        False,
        None,
        "Whether to preallocate new segment files (topic setting preallocate).",
    ),
    ConfigKey(
        "log.message.timestamp.type",
        _STRING,
        TIMESTAMP_TYPE_CREATE_TIME,
        one_of(TIMESTAMP_TYPE_CREATE_TIME, TIMESTAMP_TYPE_LOG_APPEND_TIME),
        "Producer's or broker's timestamps (topic setting message.timestamp.type).",
    ),
    ConfigKey(
        "message.max.bytes",
        _INT,
        1048588,
        between(0, BATCH_MAX_BYTES),
        "The largest record batch a topic accepts (topic setting max.message.bytes; at "
        "most 63 MiB).",
    ),
    ConfigKey(
        "compression.type",
        _STRING,
        "producer",
        one_of(*COMPRESSION_TYPES),
        "The compression of stored batches (topic setting compression.type).",
    ),
]

_CONTROLLER_SETTINGS: Final = [
    ConfigKey(
        "broker.session.timeout.ms",
        _INT,
        9000,
        at_least(1),
        "How long a broker may go without a heartbeat before the controller fences it "
        "and moves its leaderships away.",
    ),
    ConfigKey(
        "broker.heartbeat.interval.ms",
        _INT,
        2000,
        at_least(1),
        "How often a registered, unfenced broker heartbeats to the active controller; "
        "below broker.session.timeout.ms.",
    ),
    ConfigKey(
        "auto.leader.rebalance.enable",
        _BOOLEAN,
        True,
        None,
        "Whether the controller moves leadership back to preferred leaders when a "
        "broker's leader imbalance passes leader.imbalance.per.broker.percentage.",
    ),
    ConfigKey(
        "leader.imbalance.per.broker.percentage",
        _INT,
        10,
        between(0, 100),
        "The share of a broker's preferred-leader partitions it may not lead before the "
        "controller triggers preferred leader elections.",
    ),
    ConfigKey(
        "leader.imbalance.check.interval.seconds",
        _LONG,
        300,
        at_least(1),
        "How often the controller checks leader imbalance.",
    ),
    ConfigKey(
        "offsets.topic.num.partitions",
        _INT,
        50,
        at_least(1),
        "The partitions of __consumer_offsets, each owned by one group coordinator.",
    ),
    ConfigKey(
        "offsets.topic.replication.factor",
        _INT,
        3,
        at_least(1),
        "The replication factor of __consumer_offsets; the controller creates it once "
        "this many brokers are active.",
    ),
    ConfigKey(
        "offsets.topic.segment.bytes",
        _INT,
        100 * 1024 * 1024,
        at_least(1),
        "The segment size of __consumer_offsets: small, so that compaction and log "
        "loading stay fast.",
    ),
    ConfigKey(
        "coordinator.session.timeout.ms",
        _INT,
        9000,
        at_least(1),
        "How long a group coordinator may go without a heartbeat before the controller "
        "unregisters it and gives its __consumer_offsets partitions to the others.",
    ),
    ConfigKey(
        "coordinator.heartbeat.interval.ms",
        _INT,
        2000,
        at_least(1),
        "How often a group coordinator heartbeats to the active controller; below "
        "coordinator.session.timeout.ms.",
    ),
    ConfigKey(
        "metadata.log.max.record.bytes.between.snapshots",
        _LONG,
        20 * 1024 * 1024,
        at_least(1),
        "Write a snapshot of the metadata image after this many bytes of committed log.",
    ),
    ConfigKey(
        "controller.quorum.auto.join.enable",
        _BOOLEAN,
        False,
        None,
        "A controller of a dynamic quorum that is not a voter asks the leader to add it "
        "once it follows, first removing the voter its node id had before its disk was "
        "wiped; once it has been a voter it asks no more until it restarts.",
    ),
    ConfigKey(
        "controller.quorum.bootstrap.timeout.ms",
        _INT,
        30000,
        at_least(1),
        "How long a controller started with --bootstrap-controllers, with no quorum in its "
        "data directory yet, looks for one before it exits.",
    ),
]

_ROLE_SETTINGS: Final = [
    ConfigKey(
        "log.dirs",
        ConfigType.LIST,
        NO_DEFAULT,
        DistinctList(),
        "The broker's log directories, comma-separated (JBOD: one per disk). New partitions "
        "go to the one with the fewest; a failed one takes only its partitions offline. "
        "Unset: <data dir>/logs (highwater broker) or <data dir>/broker (highwater server).",
    ),
    ConfigKey(
        "broker.rack",
        _STRING,
        "",
        None,
        "The broker's rack: replicas of a partition are spread over racks first.",
    ),
    ConfigKey(
        "initial.broker.registration.timeout.ms",
        _INT,
        60000,
        at_least(1),
        "How long a starting broker or coordinator tries to register with the controllers "
        "before it gives up and exits (controllers still electing a leader are waited for).",
    ),
    ConfigKey(
        "connections.max.idle.ms",
        _LONG,
        600000,
        at_least(-1),
        "A Kafka-listener connection with no request in flight and no bytes moving for "
        "this long is closed; -1: never.",
    ),
    ConfigKey(
        "max.request.partition.size.limit",
        _INT,
        2000,
        at_least(1),
        "The most partitions one DescribeTopicPartitions answer holds, whatever the request "
        "asks; the rest are asked for again from the answer's cursor.",
    ),
    ConfigKey(
        "replica.lag.time.max.ms",
        _LONG,
        30000,
        at_least(1),
        "A follower not caught up with its leader for this long leaves the ISR.",
    ),
    ConfigKey(
        "group.initial.rebalance.delay.ms",
        _INT,
        3000,
        at_least(0),
        "How long a group coordinator's first rebalance of an empty group waits for more members.",
    ),
    ConfigKey(
        "quota.window.num",
        _INT,
        11,
        at_least(1),
        "The number of samples a client quota's rate is measured over (brokers).",
    ),
    ConfigKey(
        "quota.window.size.seconds",
        _INT,
        1,
        at_least(1),
        "The time span of each sample of a client quota's rate (brokers).",
    ),
    ConfigKey(
        "auto.create.topics.enable",
        _STRING,
        "false",
        one_of("false"),
        "Highwater never creates a topic because a client asked for its metadata (Kafka's "
        "default is true): only false is accepted, so that a file that asks for it fails "
        "loudly instead of being ignored.",
    ),
]

_SECURITY_SETTINGS: Final = [
    # The flags of every role stand for these (docs/security.md) and beat them when given.
    ConfigKey(
        "authorizer.class.name",
        _STRING,
        "none",
        one_of("acl", "none"),
        "acl checks every call against the ACLs (--authorizer); none checks nothing.",
    ),
    ConfigKey(
        "super.users",
        _STRING,
        "",
        None,
        "Principals allowed everything, separated by ';' (User:admin;User:broker); "
        "giving any turns the ACL checks on.",
    ),
    ConfigKey(
        "allow.everyone.if.no.acl.found",
        _BOOLEAN,
        False,
        None,
        "With the ACL checks on, allow a call on a resource that no ACL covers.",
    ),
    ConfigKey(
        "sasl.enabled.mechanisms",
        _STRING,
        "",
        None,
        "SASL mechanisms the Authenticate call accepts, comma-separated: SCRAM-SHA-256, "
        "SCRAM-SHA-512, OAUTHBEARER (empty: no SASL).",
    ),
    ConfigKey(
        "sasl.oauthbearer.jwks.endpoint.url",
        _STRING,
        "",
        None,
        "The JWKS that signs OAUTHBEARER tokens, as a file:// URL.",
    ),
    ConfigKey(
        "sasl.oauthbearer.expected.issuer",
        _STRING,
        "",
        None,
        "The iss claim an OAUTHBEARER token must carry.",
    ),
    ConfigKey(
        "sasl.oauthbearer.expected.audience",
        _STRING,
        "",
        None,
        "The aud claim an OAUTHBEARER token must carry.",
    ),
    ConfigKey(
        "ssl.principal.mapping.rules",
        _STRING,
        "DEFAULT",
        None,
        "How a client certificate's subject maps to a principal's name (Kafka's syntax; "
        "DEFAULT: the common name).",
    ),
    ConfigKey(
        "connections.max.reauth.ms",
        _LONG,
        0,
        at_least(0),
        "As in Kafka, on the Kafka listener: the longest a connection's SASL session lasts "
        "before the client must re-authenticate (KIP-368); 0: no limit (an OAUTHBEARER "
        "token's expiry still ends it). A positive value is also the gRPC session tokens' "
        "lifetime unless grpc.session.token.lifetime.ms is set.",
    ),
    ConfigKey(
        GRPC_SESSION_TOKEN_LIFETIME_MS,
        _LONG,
        3_600_000,
        at_least(1000),
        "The longest a gRPC session token (from the Authenticate call) lasts before the "
        "client must authenticate again (an OAUTHBEARER token's expiry may end it sooner); "
        "when not set, a positive connections.max.reauth.ms, else one hour.",
    ),
    ConfigKey(
        "connection.failed.authentication.delay.ms",
        _INT,
        100,
        at_least(0),
        "How long the answer to a failed authentication waits.",
    ),
]

_LISTENER_SETTINGS: Final = [
    ConfigKey(
        LISTENERS,
        _STRING,
        "",
        ListenerList(),
        "Named listeners, each on a port of its own: NAME://HOST:PORT,... (empty: the one "
        "listener PLAINTEXT on --listen); docs/configuration.md.",
    ),
    ConfigKey(
        ADVERTISED_LISTENERS,
        _STRING,
        "",
        ListenerList(),
        "Where clients reach each listener, NAME://HOST:PORT,... (a listener left out is "
        "advertised at its bind address).",
    ),
    ConfigKey(
        INTER_BROKER_LISTENER_NAME,
        _STRING,
        "",
        ListenerName(),
        "The listener brokers, followers and coordinators use (empty: the first listener).",
    ),
]

SERVER_CONFIG_DEF: Final = ConfigDef(
    [
        *_CLUSTER_DEFAULTS,
        *_CONTROLLER_SETTINGS,
        *_ROLE_SETTINGS,
        *_SECURITY_SETTINGS,
        *_LISTENER_SETTINGS,
    ]
)
"""Every key a ``--config`` file or ``--override`` may name."""

CLUSTER_DEFAULT_KEYS: Final = tuple(key.name for key in _CLUSTER_DEFAULTS)
"""The keys kept in the metadata as cluster-wide defaults (see the module docstring)."""

BROKER_DYNAMIC_CONFIG_DEF: Final = ConfigDef(_CLUSTER_DEFAULTS)
"""What ``highwater configs --entity-type brokers --alter`` may change: the cluster defaults."""

_TOPIC_NAMES: Final = {
    "min.insync.replicas": "min.insync.replicas",
    "unclean.leader.election.enable": "unclean.leader.election.enable",
    "log.retention.bytes": "retention.bytes",
    "log.segment.bytes": "segment.bytes",
    "log.cleanup.policy": "cleanup.policy",
    "log.cleaner.delete.retention.ms": "delete.retention.ms",
    "log.index.interval.bytes": "index.interval.bytes",
    "log.segment.delete.delay.ms": "file.delete.delay.ms",
    "log.flush.interval.messages": "flush.messages",
    "log.flush.interval.ms": "flush.ms",
    "log.preallocate": "preallocate",
    "log.message.timestamp.type": "message.timestamp.type",
    "message.max.bytes": "max.message.bytes",
    "compression.type": "compression.type",
}
"""Server key -> the topic setting it is the default of (retention and roll apart)."""


def merge_cluster_defaults(static: Mapping[str, str], dynamic: Mapping[str, str]) -> dict[str, str]:
    """The cluster defaults in force: the dynamic ones (``configs --entity-default``) over
    the static ones (the controllers' file), both as the metadata keeps them."""
    return {**static, **dynamic}


def topic_defaults(cluster_defaults: Mapping[str, str]) -> dict[str, str]:
    """The topic settings (topic names, string forms) that ``cluster_defaults`` set.

    ``log.retention.ms`` wins over ``log.retention.minutes``, which wins over
    ``log.retention.hours``; ``log.roll.ms`` over ``log.roll.hours`` (Kafka's order).
    Keys without a topic counterpart (``num.partitions``...) are left out.
    """
    values = {
        name: SERVER_CONFIG_DEF[name].parse(value)
        for name, value in cluster_defaults.items()
        if name in SERVER_CONFIG_DEF
    }
    topic: dict[str, str] = {}
    for name, value in values.items():
        if name in _TOPIC_NAMES:
            topic[_TOPIC_NAMES[name]] = SERVER_CONFIG_DEF[name].to_string(value)
    if "log.retention.ms" in values:
        topic["retention.ms"] = str(values["log.retention.ms"])
    elif "log.retention.minutes" in values:
        topic["retention.ms"] = str(_minutes_to_ms(values["log.retention.minutes"]))
    elif "log.retention.hours" in values:
        topic["retention.ms"] = str(_minutes_to_ms(values["log.retention.hours"] * 60))
    if "log.roll.ms" in values:
        topic["segment.ms"] = str(values["log.roll.ms"])
    elif "log.roll.hours" in values:
        topic["segment.ms"] = str(values["log.roll.hours"] * 3_600_000)
    return topic


def _minutes_to_ms(minutes: int) -> int:
    return -1 if minutes < 0 else minutes * 60_000


# --- Reading a configuration ------------------------------------------------------------

_ESCAPES: Final = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}
_KEY_END: Final = re.compile(r"(?<!\\)(?:\\\\)*[=:\s]")


def read_properties(path: Path) -> dict[str, str]:
    """The key-value pairs of a Java-properties file, as ``java.util.Properties`` reads it.

    ``#`` and ``!`` start comment lines; a key ends at the first unescaped ``=``, ``:`` or
    blank; a line ending in an odd number of backslashes continues on the next; ``\\t``,
    ``\\n``, ``\\uXXXX``... are unescaped. A later line wins over an earlier one for the
    same key. Raises :class:`InvalidConfigError` naming the file if it cannot be read.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise InvalidConfigError(f"Cannot read the config file {path}: {e}") from None
    props: dict[str, str] = {}
    for line in _logical_lines(text.splitlines()):
        match = _KEY_END.search(line)
        if match is None:
            key, rest = line, ""
        else:
            end = match.end() - 1
            key, rest = line[:end], line[end:].lstrip(" \t\f")
            if rest[:1] in ("=", ":"):
                rest = rest[1:].lstrip(" \t\f")
        try:
            props[_unescape(key)] = _unescape(rest)
        except ValueError as e:
            raise InvalidConfigError(f"{path}: {e} in line {line!r}") from None
    return props


def _logical_lines(lines: Iterable[str]) -> Iterable[str]:
    pending = ""
    continuing = False
    for raw in lines:
        line = raw.lstrip(" \t\f")
        if not continuing and (not line or line[0] in "#!"):
            continue
        trailing = len(line) - len(line.rstrip("\\"))
        if trailing % 2 == 1:
            pending += line[:-1]
            continuing = True
            continue
        yield pending + line
        pending, continuing = "", False
    if pending:
        yield pending


def _unescape(text: str) -> str:
    out: list[str] = []
    index = 0
    while index < len(text):
        char = text[index]
        if char != "\\" or index + 1 == len(text):
            out.append(char)
            index += 1
            continue
        escaped = text[index + 1]
        if escaped == "u":
            digits = text[index + 2 : index + 6]
            if len(digits) != 4 or not all(c in "0123456789abcdefABCDEF" for c in digits):
                raise ValueError("malformed \\uXXXX escape")
            out.append(chr(int(digits, 16)))
            index += 6
            continue
        out.append(_ESCAPES.get(escaped, escaped))
        index += 2
    return "".join(out)


def parse_override(pair: str) -> tuple[str, str]:
    """``KEY=VALUE`` (the value may hold ``=``); :class:`InvalidConfigError` if malformed."""
    key, equals, value = pair.partition("=")
    if not equals or not key.strip():
        raise InvalidConfigError(f"Override {pair!r} is not KEY=VALUE")
    return key.strip(), value.strip()


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """A role's parsed server configuration: the keys given (file, overrides, explicit
    flags), typed, and the defaults for the rest."""

    given: Mapping[str, Any] = field(default_factory=dict)
    """The keys set explicitly, parsed, by name."""

    def __post_init__(self) -> None:
        for name in self.given:
            if name not in SERVER_CONFIG_DEF:
                # Named alone, with the nearest key: the full list of keys would drown it.
                close = difflib.get_close_matches(name, SERVER_CONFIG_DEF.names(), n=1)
                hint = f" (did you mean {close[0]}?)" if close else ""
                raise InvalidConfigError(f"Unknown configuration {name!r}{hint}")
        object.__setattr__(self, "given", SERVER_CONFIG_DEF.parse(self.given, with_defaults=False))
        if self.get("broker.heartbeat.interval.ms") >= self.get("broker.session.timeout.ms"):
            # Kafka's KafkaConfig refuses it too: the controller would fence a live broker.
            raise InvalidConfigError(
                "broker.heartbeat.interval.ms "
                f"({self.get('broker.heartbeat.interval.ms')}) must be less than "
                f"broker.session.timeout.ms ({self.get('broker.session.timeout.ms')})"
            )
        interval, session = (
            self.get("coordinator.heartbeat.interval.ms"),
            self.get("coordinator.session.timeout.ms"),
        )
        if interval >= session:
            # The same rule for group coordinators' sessions with the controller.
            raise InvalidConfigError(
                f"coordinator.heartbeat.interval.ms ({interval}) must be less than "
                f"coordinator.session.timeout.ms ({session})"
            )

    def get(self, name: str) -> Any:
        """The value of ``name``: given, else its default (None for a key without one)."""
        key = SERVER_CONFIG_DEF.key(name)
        if name in self.given:
            return self.given[name]
        return None if key.required else key.default

    def is_given(self, name: str) -> bool:
        return name in self.given

    def with_values(self, values: Mapping[str, ConfigValue]) -> ServerConfig:
        """This config with ``values`` set explicitly (an explicit command-line flag)."""
        return ServerConfig({**self.given, **values})

    def cluster_defaults(self) -> dict[str, str]:
        """The cluster defaults given, in Kafka string form (what goes into the metadata)."""
        return {
            name: SERVER_CONFIG_DEF[name].to_string(value)
            for name, value in self.given.items()
            if name in CLUSTER_DEFAULT_KEYS
        }

    def grpc_session_token_lifetime_ms(self) -> int:
        """The gRPC session tokens' lifetime: ``grpc.session.token.lifetime.ms`` if set,
        else ``connections.max.reauth.ms`` if positive (so one positive value still sets
        both), else the former's default (one hour)."""
        reauth_ms = int(self.get("connections.max.reauth.ms"))
        if self.is_given(GRPC_SESSION_TOKEN_LIFETIME_MS) or reauth_ms <= 0:
            return int(self.get(GRPC_SESSION_TOKEN_LIFETIME_MS))
        return reauth_ms

    def subset(self, names: Iterable[str]) -> dict[str, Any]:
        """The values (given or default) of ``names``, by name."""
        return {name: self.get(name) for name in names}


def load_server_config(
    config_file: Path | None = None, overrides: Iterable[str] = ()
) -> ServerConfig:
    """Read ``config_file`` (if any) and apply ``overrides`` (``KEY=VALUE``) on top.

    Raises :class:`InvalidConfigError` naming the first unknown key (with the nearest
    known one) or bad value, or the file if it cannot be read.
    """
    given: dict[str, str] = {}
    if config_file is not None:
        given.update(read_properties(config_file))
    for pair in overrides:
        key, value = parse_override(pair)
        given[key] = value
    return ServerConfig(given)
