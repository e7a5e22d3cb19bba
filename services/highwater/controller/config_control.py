"""Dynamic configs (Kafka's ``ConfigurationControlManager``): incremental changes and descriptions.

Topic configs are validated with ``LogConfig.DEFINITION`` and stored in their Kafka
string form as ConfigRecords; broker configs with the broker definition the controller
is given (without one, the controller refuses them). Changes are Kafka's incremental
operations: SET, DELETE, and APPEND / SUBTRACT for list settings.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from highwater.config.definition import ConfigDef, ConfigKey, ConfigType
from highwater.config.server import CLUSTER_DEFAULT_KEYS, topic_defaults
from highwater.config.topic import LogConfig
from highwater.controller.config import ControllerConfig
from highwater.controller.results import ControllerApiError, ControllerResult, error_of, refuse
from highwater.controller_api.messages import (
    AlterConfigOp,
    AlterConfigsRequest,
    AlterConfigsResource,
    AlterConfigsResourceResult,
    AlterConfigsResponse,
    ConfigSource,
    DescribeConfigsRequest,
    DescribeConfigsResource,
    DescribeConfigsResponse,
    DescribeConfigsResult,
    DescribedConfig,
)
from highwater.errors import InvalidConfigError, InvalidTopicError
from highwater.metadata.delta import MetadataDelta
from highwater.metadata.image import (
    ConfigResource,
    MetadataImage,
)
from highwater.metadata.records import (
    ConfigRecord,
    ConfigResourceType,
    MetadataRecord,
)
from highwater.storage.topic_partition import validate_topic_name
from highwater.v1.common_pb2 import ErrorCode

_TOPIC_DEFINITION: ConfigDef = LogConfig.DEFINITION
_RESOURCE_TYPES: Mapping[int, ConfigResourceType] = {t.value: t for t in ConfigResourceType}
"""Each resource type by its number: a dict lookup, not an enum call, per request."""

UNCLEAN_LEADER_ELECTION_ENABLE = "unclean.leader.election.enable"
MIN_INSYNC_REPLICAS = "min.insync.replicas"


def validate_topic_configs(configs: Mapping[str, str | None]) -> dict[str, str]:
    """The topic config overrides in Kafka string form; ``None`` values are left out.

    Raises :class:`~highwater.errors.InvalidConfigError` naming the first bad key.
    """
    given = {key: value for key, value in configs.items() if value is not None}
    definition = LogConfig.DEFINITION
    parsed = definition.parse(given, with_defaults=False)
    return definition.to_strings(parsed)


class ConfigurationControl:
    """Config decisions over a :class:`MetadataDelta` or image."""

    def __init__(self, config: ControllerConfig) -> None:
        self.config = config

    def alter_configs(
        self, base: MetadataImage | MetadataDelta, request: AlterConfigsRequest
    ) -> ControllerResult[AlterConfigsResponse]:
        """Incremental config changes (SET, DELETE, APPEND, SUBTRACT) of topics and
        brokers, validated against their definitions; each resource on its own.

        ``base`` is the state to decide on: an image, or a delta over one (the controller
        store's staged records, read and never replayed into): nothing is replayed and no
        image is built to decide a request.

        A resource given more than once is refused at each of its entries, INVALID_REQUEST
        (Kafka's ``ConfigAdminManager.preprocess``: which change would win is not the
        client's to guess), so no resource of a request sees another's changes."""
        view = base if isinstance(base, MetadataDelta) else MetadataDelta(base)
        records: list[MetadataRecord] = []
        results: list[AlterConfigsResourceResult] = []
        given = Counter((r.resource_type, r.resource_name) for r in request.resources)
        for resource in request.resources:
            if given[resource.resource_type, resource.resource_name] > 1:
                results.append(
                    AlterConfigsResourceResult(
                        resource.resource_type,
                        resource.resource_name,
                        ErrorCode.INVALID_REQUEST,
                        "Each resource must appear at most once.",
                    )
                )
                continue
            try:
                resource_records = self._alter_resource(view, resource)
            except ControllerApiError as e:
                results.append(
                    AlterConfigsResourceResult(
                        resource.resource_type, resource.resource_name, e.code, e.message
                    )
                )
                continue
            except InvalidConfigError as e:
                code, message = error_of(e)
                results.append(
                    AlterConfigsResourceResult(
                        resource.resource_type, resource.resource_name, code, message
                    )
                )
                continue
            results.append(
                AlterConfigsResourceResult(resource.resource_type, resource.resource_name)
            )
            if not request.validate_only:
                records.extend(resource_records)
        return ControllerResult(records, AlterConfigsResponse(resources=tuple(results)))

    def _definition(self, delta: MetadataDelta, resource_type: int, name: str) -> ConfigDef:
        """The definition ``name``'s configs are checked against. A topic resource must be
        a name a topic can have (INVALID_TOPIC_EXCEPTION; Kafka's ``Topic.validate``), then
        an existing topic (UNKNOWN_TOPIC_OR_PARTITION)."""
        if resource_type == ConfigResourceType.TOPIC:
            try:
                validate_topic_name(name)
            except InvalidTopicError as e:
                raise refuse(*error_of(e)) from e
            if delta.topic_id(name) is None:
                raise refuse(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"No topic {name!r}")
            return _TOPIC_DEFINITION
        if resource_type == ConfigResourceType.BROKER:
            if name and not name.isdigit():
                raise refuse(
                    ErrorCode.INVALID_REQUEST,
                    f"A broker config resource is a broker id or '' (the cluster), not {name!r}",
                )
            definition = self.config.broker_config_definition
            if definition is None:
                raise refuse(
                    ErrorCode.INVALID_REQUEST, "Dynamic broker configs are not supported yet"
                )
            return definition
        raise refuse(ErrorCode.INVALID_REQUEST, f"Unknown config resource type {resource_type}")

    def _alter_resource(
        self,
        delta: MetadataDelta,
        resource: AlterConfigsResource,
    ) -> list[MetadataRecord]:
        """The records that make the change of ``resource``'s overrides."""
        resource_type = resource.resource_type
        definition = self._definition(delta, resource_type, resource.resource_name)
        target = ConfigResource(_RESOURCE_TYPES[resource_type], resource.resource_name)
        current = delta.config(target)
        updated = dict(current)
        configs = resource.configs
        repeated: set[str] = set()
        if len(configs) > 1:
            names = [change.name for change in configs]
            if len(set(names)) != len(names):
                repeated = {name for name in names if names.count(name) > 1}
        broker_override = resource_type == ConfigResourceType.BROKER and resource.resource_name
        for change in configs:
            if change.name in repeated:
                raise refuse(
                    ErrorCode.INVALID_REQUEST, f"Configuration {change.name} is changed twice"
                )
            op = change.op
            if op == AlterConfigOp.DELETE and change.name not in definition:
                # Kafka accepts removing an override no definition knows: nothing to do.
                continue
            key = definition.key(change.name)
            if broker_override and key.name in CLUSTER_DEFAULT_KEYS:
                raise refuse(
                    ErrorCode.INVALID_REQUEST,
                    f"Configuration {key.name} is cluster-wide: alter it on the default "
                    "broker resource (--entity-default), not on broker "
                    f"{resource.resource_name}",
                )
            if op == AlterConfigOp.SET:
                if change.value is None:
                    raise refuse(ErrorCode.INVALID_REQUEST, f"SET of {change.name} needs a value")
                updated[key.name] = key.to_string(key.parse(change.value))
            elif op == AlterConfigOp.DELETE:
                updated.pop(key.name, None)
            elif op in (AlterConfigOp.APPEND, AlterConfigOp.SUBTRACT):
                updated[key.name] = self._list_change(key, updated.get(key.name), op, change.value)
            else:
                raise refuse(ErrorCode.INVALID_REQUEST, f"Unknown config operation {op}")
        if resource_type == ConfigResourceType.TOPIC:
            self._check_topic_min_insync(delta, resource.resource_name, updated)
        records: list[MetadataRecord] = [
            ConfigRecord(target.type, target.name, name, updated.get(name))
            for name in sorted(current.keys() | updated.keys())
            if current.get(name) != updated.get(name)
        ]
        return records

    @staticmethod
    def _check_topic_min_insync(
        delta: MetadataDelta, topic: str, configs: Mapping[str, str]
    ) -> None:
        """A topic's ``min.insync.replicas`` may not pass its replication factor."""
        value = configs.get(MIN_INSYNC_REPLICAS)
        topic_id = delta.topic_id(topic)
        if value is None or topic_id is None:
            return
        registration = delta.partition(topic_id, 0)
        factor = len(registration.replicas) if registration is not None else 0
        if factor and int(value) > factor:
            raise InvalidConfigError(
                f"Invalid value {value} for configuration {MIN_INSYNC_REPLICAS}: it is above "
                f"the replication factor {factor} of topic {topic}, so no acks=all produce "
                "could succeed"
            )

    def sync_static_defaults(self, delta: MetadataDelta) -> list[MetadataRecord]:
        """The records that make the metadata's static cluster defaults equal to this
        controller's (``ControllerConfig.cluster_defaults``), replayed on ``delta``; none
        when they already are. Every controller then reads the same defaults."""
        target = ConfigResource(ConfigResourceType.STATIC_CLUSTER_DEFAULT, "")
        current = delta.config(target)
        wanted = dict(self.config.cluster_defaults)
        if current == wanted:
            return []  # every tick asks; they differ only after a config or leader change
        records: list[MetadataRecord] = [
            ConfigRecord(target.type, target.name, name, wanted.get(name))
            for name in sorted(set(current) | set(wanted))
            if current.get(name) != wanted.get(name)
        ]
        delta.replay_all(records)
        return records

    @staticmethod
    def _list_change(key: ConfigKey, current: str | None, op: int, value: str | None) -> str:
        if key.type is not ConfigType.LIST:
            raise InvalidConfigError(
                f"Configuration {key.name} is not a list; APPEND and SUBTRACT apply to lists"
            )
        if value is None:
            raise refuse(
                ErrorCode.INVALID_REQUEST, f"APPEND or SUBTRACT of {key.name} needs a value"
            )
        if current is None:
            current = key.describe().default or ""  # the default in its string form
        base: tuple[str, ...] = key.parse(current)
        given: tuple[str, ...] = key.parse(value) if value.strip() else ()
        if op == AlterConfigOp.APPEND:
            result = base + tuple(v for v in given if v not in base)
        else:
            result = tuple(v for v in base if v not in given)
        return key.to_string(key.parse(result))

    def describe_configs(
        self, image: MetadataImage, request: DescribeConfigsRequest
    ) -> ControllerResult[DescribeConfigsResponse]:
        """Every config of each resource (or the named ones): its value and its source."""
        delta = MetadataDelta(image)
        results: list[DescribeConfigsResult] = []
        for resource in request.resources:
            try:
                configs = self._describe_resource(delta, resource)
            except ControllerApiError as e:
                results.append(
                    DescribeConfigsResult(
                        resource.resource_type, resource.resource_name, e.code, e.message
                    )
                )
                continue
            results.append(
                DescribeConfigsResult(
                    resource.resource_type, resource.resource_name, configs=tuple(configs)
                )
            )
        return ControllerResult([], DescribeConfigsResponse(results=tuple(results)))

    def _layers(
        self,
        delta: MetadataDelta,
        resource_type: int,
        name: str,
        overrides: Mapping[str, str],
    ) -> list[tuple[ConfigSource, Mapping[str, str]]]:
        """Where a described value comes from, highest precedence first (Kafka's order:
        the resource's own, the dynamic cluster default, the static one), above the
        definition's default."""
        static = delta.config(ConfigResource(ConfigResourceType.STATIC_CLUSTER_DEFAULT, ""))
        dynamic_default = delta.config(ConfigResource(ConfigResourceType.BROKER, ""))
        if resource_type == ConfigResourceType.TOPIC:
            static_topic = topic_defaults(static)
            if (
                UNCLEAN_LEADER_ELECTION_ENABLE not in static_topic
                and self.config.unclean_leader_election_enable
            ):
                static_topic[UNCLEAN_LEADER_ELECTION_ENABLE] = "true"
            return [
                (ConfigSource.DYNAMIC_TOPIC_CONFIG, overrides),
                (ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG, topic_defaults(dynamic_default)),
                (ConfigSource.STATIC_BROKER_CONFIG, static_topic),
            ]
        layers: list[tuple[ConfigSource, Mapping[str, str]]] = []
        if name:
            layers.append((ConfigSource.DYNAMIC_BROKER_CONFIG, overrides))
        layers.append((ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG, dynamic_default))
        layers.append((ConfigSource.STATIC_BROKER_CONFIG, static))
        return layers

    def _describe_resource(
        self, delta: MetadataDelta, resource: DescribeConfigsResource
    ) -> list[DescribedConfig]:
        wanted = set(resource.config_names)
        target = ConfigResource(ConfigResourceType(resource.resource_type), resource.resource_name)
        overrides = delta.config(target)
        if resource.resource_type == ConfigResourceType.BROKER and (
            self.config.broker_config_definition is None
        ):
            source = (
                ConfigSource.DYNAMIC_BROKER_CONFIG
                if resource.resource_name
                else ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG
            )
            return [
                DescribedConfig(name, value, source)
                for name, value in sorted(overrides.items())
                if not wanted or name in wanted
            ]
        definition = self._definition(delta, resource.resource_type, resource.resource_name)
        layers = self._layers(delta, resource.resource_type, resource.resource_name, overrides)
        described = []
        for key in definition:
            if wanted and key.name not in wanted:
                continue
            value: str | None = key.describe().default
            source = ConfigSource.DEFAULT_CONFIG
            for layer_source, values in layers:
                if key.name in values:
                    value, source = values[key.name], layer_source
                    break
            described.append(
                DescribedConfig(
                    key.name,
                    value,
                    source,
                    type=key.type.value,
                    documentation=key.doc,
                )
            )
        return described
