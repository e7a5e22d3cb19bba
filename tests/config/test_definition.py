"""Tests of the config-definition machinery: types, validators, keys and ConfigDef."""

from __future__ import annotations

import math

import pytest
from highwater.config.definition import (
    INT_MAX,
    INT_MIN,
    LONG_MAX,
    LONG_MIN,
    NO_DEFAULT,
    ConfigDef,
    ConfigKey,
    ConfigType,
    Range,
    ValidList,
    ValidString,
    at_least,
    between,
    list_of,
    one_of,
)
from highwater.errors import InvalidConfigError
from highwater.v1.common_pb2 import ErrorCode
from hypothesis import given
from hypothesis import strategies as st


def key(type_: ConfigType, validator: object = None, default: object = NO_DEFAULT) -> ConfigKey:
    return ConfigKey("some.key", type_, default, validator, "doc")  # type: ignore[arg-type]


# --- Names -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "attr"),
    [
        ("segment.bytes", "segment_bytes"),
        ("unclean.leader.election.enable", "unclean_leader_election_enable"),
        ("preallocate", "preallocate"),
        ("some-dashed.name", "some_dashed_name"),
    ],
)
def test_attribute_name_is_derived_from_the_kafka_name(name: str, attr: str) -> None:
    assert ConfigKey(name, ConfigType.INT, 1).attr_name == attr


@pytest.mark.parametrize("name", ["", "Segment.bytes", "segment..bytes", ".x", "x.", "a b", "1.x"])
def test_bad_key_names_are_refused_at_definition(name: str) -> None:
    with pytest.raises(ValueError):
        ConfigKey(name, ConfigType.INT, 1)


# --- Types -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "parsed"),
    [("true", True), ("false", False), ("TRUE", True), (" False ", False), (True, True)],
)
def test_boolean_parsing(raw: object, parsed: bool) -> None:
    assert key(ConfigType.BOOLEAN).parse(raw) is parsed  # type: ignore[arg-type]


@pytest.mark.parametrize("raw", ["yes", "1", "", "t", 1, 0, 1.0, None, ["true"]])
def test_boolean_rejects(raw: object) -> None:
    with pytest.raises(InvalidConfigError, match=r"some\.key"):
        key(ConfigType.BOOLEAN).parse(raw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("raw", "parsed"),
    [
        ("42", 42),
        (" -7 ", -7),
        ("+3", 3),
        (42, 42),
        (str(INT_MAX), INT_MAX),
        (str(INT_MIN), INT_MIN),
    ],
)
def test_int_parsing(raw: object, parsed: int) -> None:
    assert key(ConfigType.INT).parse(raw) == parsed  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "raw",
    [
        "",
        "abc",
        "1.5",
        "1e3",
        "0x10",
        "1_000",
        "١٢",  # Arabic-Indic digits: int() would take them, Kafka would not
        "- 1",
        str(INT_MAX + 1),
        str(INT_MIN - 1),
        INT_MAX + 1,
        True,
        1.0,
        None,
    ],
)
def test_int_rejects(raw: object) -> None:
    with pytest.raises(InvalidConfigError, match=r"some\.key"):
        key(ConfigType.INT).parse(raw)  # type: ignore[arg-type]


def test_long_accepts_kafkas_unlimited_and_rejects_beyond() -> None:
    long_key = key(ConfigType.LONG)
    assert long_key.parse("9223372036854775807") == LONG_MAX
    assert long_key.parse(str(LONG_MIN)) == LONG_MIN
    assert long_key.parse("-1") == -1
    for bad in (str(LONG_MAX + 1), LONG_MAX + 1, str(LONG_MIN - 1)):
        with pytest.raises(InvalidConfigError, match="out of range"):
            long_key.parse(bad)


@pytest.mark.parametrize(
    ("raw", "parsed"),
    [("0.5", 0.5), ("1", 1.0), (".25", 0.25), ("1e-3", 0.001), ("1.0E-5", 1e-5), (1, 1.0)],
)
def test_double_parsing(raw: object, parsed: float) -> None:
    value = key(ConfigType.DOUBLE).parse(raw)  # type: ignore[arg-type]
    assert isinstance(value, float)
    assert value == parsed


@pytest.mark.parametrize(
    "raw", ["", "abc", "nan", "NaN", "inf", "-Infinity", "1e999", "1,5", math.nan, math.inf, True]
)
def test_double_rejects(raw: object) -> None:
    with pytest.raises(InvalidConfigError, match=r"some\.key"):
        key(ConfigType.DOUBLE).parse(raw)  # type: ignore[arg-type]


def test_string_is_trimmed_and_must_be_a_string() -> None:
    assert key(ConfigType.STRING).parse("  gzip ") == "gzip"
    with pytest.raises(InvalidConfigError, match="expected a string"):
        key(ConfigType.STRING).parse(5)


@pytest.mark.parametrize(
    ("raw", "parsed"),
    [
        ("a", ("a",)),
        ("a,b", ("a", "b")),
        (" a , b ", ("a", "b")),
        ("", ()),
        ("   ", ()),
        (["a", " b"], ("a", "b")),
        (("a",), ("a",)),
        ([], ()),
    ],
)
def test_list_parsing(raw: object, parsed: tuple[str, ...]) -> None:
    assert key(ConfigType.LIST).parse(raw) == parsed  # type: ignore[arg-type]


@pytest.mark.parametrize("raw", ["a,,b", "a,", ",a", ["a", ""], ["a,b"], [1], 5, None])
def test_list_rejects(raw: object) -> None:
    with pytest.raises(InvalidConfigError, match=r"some\.key"):
        key(ConfigType.LIST).parse(raw)  # type: ignore[arg-type]


# --- Validators ------------------------------------------------------------------------


def test_at_least() -> None:
    k = key(ConfigType.INT, at_least(14))
    assert k.parse("14") == 14
    with pytest.raises(InvalidConfigError) as info:
        k.parse("13")
    message = str(info.value)
    assert "some.key" in message
    assert "'13'" in message
    assert "at least 14" in message


def test_between_includes_both_ends() -> None:
    k = key(ConfigType.DOUBLE, between(0, 1))
    assert k.parse("0") == 0.0
    assert k.parse("1") == 1.0
    for bad in ("-0.001", "1.0001"):
        with pytest.raises(InvalidConfigError, match="between 0 and 1"):
            k.parse(bad)


def test_one_of_is_exact() -> None:
    k = key(ConfigType.STRING, one_of("CreateTime", "LogAppendTime"))
    assert k.parse("LogAppendTime") == "LogAppendTime"
    with pytest.raises(InvalidConfigError) as info:
        k.parse("createtime")
    assert "CreateTime, LogAppendTime" in str(info.value)
    assert "'createtime'" in str(info.value)


def test_list_of_choices() -> None:
    k = key(ConfigType.LIST, list_of("compact", "delete"))
    assert k.parse("compact,delete") == ("compact", "delete")
    with pytest.raises(InvalidConfigError, match="'truncate'"):
        k.parse("delete,truncate")
    with pytest.raises(InvalidConfigError, match="empty"):
        k.parse("")
    assert key(ConfigType.LIST, list_of("a", allow_empty=True)).parse("") == ()


@pytest.mark.parametrize(
    ("validator", "described"),
    [
        (at_least(14), "[14,...]"),
        (between(0, 1), "[0,...,1]"),
        (Range(max=5), "[...,5]"),
        (one_of("a", "b"), "[a, b]"),
        (list_of("compact", "delete"), "[compact, delete]"),
    ],
)
def test_validators_describe_themselves_as_kafka_docs_do(
    validator: Range | ValidString | ValidList, described: str
) -> None:
    assert validator.describe() == described


def test_bad_validator_construction() -> None:
    with pytest.raises(ValueError):
        Range()
    with pytest.raises(ValueError):
        between(2, 1)
    with pytest.raises(ValueError):
        one_of()
    with pytest.raises(ValueError):
        list_of()


@pytest.mark.parametrize(
    ("type_", "validator"),
    [
        (ConfigType.STRING, at_least(1)),
        (ConfigType.INT, one_of("a")),
        (ConfigType.STRING, list_of("a")),
        (ConfigType.BOOLEAN, at_least(0)),
    ],
)
def test_validator_must_fit_the_type(type_: ConfigType, validator: object) -> None:
    with pytest.raises(ValueError, match="does not apply"):
        key(type_, validator, None)


def test_defaults_are_parsed_and_validated_at_definition() -> None:
    assert key(ConfigType.LIST, None, "compact, delete").default == ("compact", "delete")
    assert key(ConfigType.DOUBLE, None, 1).default == 1.0
    with pytest.raises(ValueError, match="bad default"):
        key(ConfigType.INT, at_least(14), 5)
    with pytest.raises(ValueError, match="bad default"):
        key(ConfigType.INT, None, "lots")


def test_error_carries_the_kafka_code() -> None:
    with pytest.raises(InvalidConfigError) as info:
        key(ConfigType.INT).parse("x")
    assert info.value.code == ErrorCode.INVALID_CONFIG
    assert info.value.code_name == "INVALID_CONFIG"


def test_huge_values_are_shortened_in_messages() -> None:
    with pytest.raises(InvalidConfigError) as info:
        key(ConfigType.INT).parse("9" * 10_000)
    assert len(str(info.value)) < 400


# --- ConfigDef -------------------------------------------------------------------------


def sample_def() -> ConfigDef:
    return (
        ConfigDef()
        .define("a.int", ConfigType.INT, 1, at_least(0), "An int.")
        .define("b.list", ConfigType.LIST, "x", list_of("x", "y"), "A list.")
        .define("c.required", ConfigType.STRING, doc="Required.")
        .define("d.flag", ConfigType.BOOLEAN, False, doc="A flag.")
    )


def test_parse_fills_defaults_in_definition_order() -> None:
    parsed = sample_def().parse({"d.flag": "true", "c.required": "v"})
    assert list(parsed) == ["a.int", "b.list", "c.required", "d.flag"]
    assert parsed == {"a.int": 1, "b.list": ("x",), "c.required": "v", "d.flag": True}


def test_parse_without_defaults_keeps_only_given_keys() -> None:
    assert sample_def().parse({"a.int": "3"}, with_defaults=False) == {"a.int": 3}


def test_missing_required_key() -> None:
    with pytest.raises(InvalidConfigError, match=r"c\.required"):
        sample_def().parse({})


def test_unknown_keys_are_all_named_with_suggestions() -> None:
    with pytest.raises(InvalidConfigError) as info:
        sample_def().parse({"a.ints": "1", "zzz": "2", "c.required": "v"})
    message = str(info.value)
    assert "'a.ints' (did you mean a.int?)" in message
    assert "'zzz'" in message
    assert "known: a.int, b.list, c.required, d.flag" in message


def test_first_bad_value_is_reported() -> None:
    with pytest.raises(InvalidConfigError, match=r"b\.list"):
        sample_def().parse({"b.list": "x,z", "c.required": "v"})


def test_duplicate_keys_are_refused() -> None:
    definition = sample_def()
    with pytest.raises(ValueError, match="twice"):
        definition.define("a.int", ConfigType.INT, 2)
    with pytest.raises(ValueError, match="clashes"):
        definition.define("a-int", ConfigType.INT, 2)


def test_lookup_helpers() -> None:
    definition = sample_def()
    assert len(definition) == 4
    assert "a.int" in definition
    assert "nope" not in definition
    assert definition.names() == ("a.int", "b.list", "c.required", "d.flag")
    assert [k.name for k in definition] == list(definition.names())
    assert definition["a.int"].type is ConfigType.INT
    assert definition.key("b.list").default == ("x",)
    with pytest.raises(InvalidConfigError, match="nope"):
        definition.key("nope")
    with pytest.raises(InvalidConfigError, match="nope"):
        definition.parse_value("nope", "1")
    assert definition.parse_value("a.int", " 7 ") == 7
    assert definition.defaults() == {"a.int": 1, "b.list": ("x",), "d.flag": False}
    assert definition.to_strings({"b.list": ("x", "y"), "d.flag": True}) == {
        "b.list": "x,y",
        "d.flag": "true",
    }


def test_describe() -> None:
    lines = sample_def().describe()
    assert [line.name for line in lines] == ["a.int", "b.list", "c.required", "d.flag"]
    a, b, c, d = lines
    assert (a.type, a.default, a.valid_values, a.documentation) == (
        "int",
        "1",
        "[0,...]",
        "An int.",
    )
    assert (b.type, b.default, b.valid_values) == ("list", "x", "[x, y]")
    assert (c.type, c.default, c.valid_values) == ("string", None, "")
    assert (d.type, d.default) == ("boolean", "false")


# --- Properties ------------------------------------------------------------------------


@given(st.integers(min_value=INT_MIN, max_value=INT_MAX))
def test_int_round_trips(n: int) -> None:
    k = key(ConfigType.INT)
    assert k.parse(str(n)) == n
    assert k.parse(k.to_string(n)) == n
    assert k.parse(n) == n


@given(st.integers(max_value=LONG_MIN - 1) | st.integers(min_value=LONG_MAX + 1))
def test_long_rejects_everything_outside_64_bits(n: int) -> None:
    with pytest.raises(InvalidConfigError, match=r"some\.key"):
        key(ConfigType.LONG).parse(str(n))


@given(st.floats(allow_nan=False, allow_infinity=False))
def test_double_round_trips(x: float) -> None:
    k = key(ConfigType.DOUBLE)
    assert k.parse(k.to_string(x)) == x


@given(st.lists(st.sampled_from(["compact", "delete"]), min_size=1))
def test_list_round_trips(values: list[str]) -> None:
    k = key(ConfigType.LIST, list_of("compact", "delete"))
    parsed = k.parse(values)
    assert parsed == tuple(values)
    assert k.parse(k.to_string(parsed)) == parsed


@pytest.mark.parametrize("type_", list(ConfigType))
@given(text=st.text(max_size=30))
def test_any_text_parses_or_fails_with_invalid_config(type_: ConfigType, text: str) -> None:
    k = key(type_)
    try:
        value = k.parse(text)
    except InvalidConfigError as e:
        assert "some.key" in str(e)
    else:
        assert k.parse(k.to_string(value)) == value
