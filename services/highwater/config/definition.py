"""Config-definition machinery: typed Kafka-style keys with defaults, validators and docs.

A :class:`ConfigKey` describes one setting (``segment.bytes``: an int, default 1 GiB, at
least 14); a :class:`ConfigDef` is the ordered set of keys of one scope (topic, broker,
producer...). ``ConfigDef.parse`` turns user input, whether strings from a properties
file, the command line or the environment or values that are already typed, into a dict
of typed values, and rejects unknown keys and bad values with
:class:`~highwater.errors.InvalidConfigError` naming the key, the value and what is allowed.

Types follow Kafka's ``ConfigDef.Type``: ``boolean``, ``string``, ``int`` (32-bit),
``long`` (64-bit; ``9223372036854775807``, Kafka's ``Long.MAX_VALUE``, means "unlimited"),
``double`` and ``list`` (comma-separated). A setting that takes one of a fixed set of
names (Kafka's enum-like settings, ``compression.type``) is a ``string`` key with a
:func:`one_of` validator, as in Kafka.
"""

from __future__ import annotations

import difflib
import enum
import keyword
import math
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Final, TypeAlias, TypeVar

from highwater.errors import InvalidConfigError

INT_MIN: Final = -(2**31)
INT_MAX: Final = 2**31 - 1
LONG_MIN: Final = -(2**63)
LONG_MAX: Final = 2**63 - 1
UNLIMITED: Final = LONG_MAX
"""Kafka's ``Long.MAX_VALUE``: the "no limit" value of long settings (``flush.ms``...)."""

ConfigValue: TypeAlias = bool | int | float | str | tuple[str, ...]
"""A parsed value: what :meth:`ConfigKey.parse` returns."""

RawValue: TypeAlias = str | int | float | bool | Sequence[str]
"""What a caller may pass: a Kafka string form, or an already-typed value."""

_Value = TypeVar("_Value", bound=RawValue | ConfigValue)
"""A value of a mapping :meth:`ConfigDef.valid_entries` filters, kept as given."""

_MAX_SHOWN_VALUE = 120
_NAME_RE = re.compile(r"[a-z0-9]+(?:[._-][a-z0-9]+)*", re.ASCII)
_INT_RE = re.compile(r"[+-]?[0-9]+", re.ASCII)
_DOUBLE_RE = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?", re.ASCII)


class ConfigType(enum.Enum):
    """The type of a setting, named as Kafka's ``ConfigDef.Type`` names them in its docs."""

    BOOLEAN = "boolean"
    STRING = "string"
    INT = "int"
    LONG = "long"
    DOUBLE = "double"
    LIST = "list"

    @property
    def phrase(self) -> str:
        """How an error message says what a value of this type looks like."""
        return _TYPE_PHRASES[self]


_TYPE_PHRASES: Final[dict[ConfigType, str]] = {
    ConfigType.BOOLEAN: "true or false",
    ConfigType.STRING: "a string",
    ConfigType.INT: "an int",
    ConfigType.LONG: "a long",
    ConfigType.DOUBLE: "a finite double",
    ConfigType.LIST: "a comma-separated list",
}
_NUMERIC: Final = frozenset({ConfigType.INT, ConfigType.LONG, ConfigType.DOUBLE})


class _NoDefault(enum.Enum):
    NO_DEFAULT = "NO_DEFAULT"

    def __repr__(self) -> str:
        return "NO_DEFAULT"


NO_DEFAULT: Final = _NoDefault.NO_DEFAULT
"""The default of a required key: ``parse`` rejects input that leaves it out."""


# --- Validators ------------------------------------------------------------------------


class Validator(ABC):
    """A rule a parsed value must satisfy, beyond its type.

    ``__call__`` raises :class:`ValueError` with a short reason ("out of range"); the key
    turns it into an :class:`InvalidConfigError` naming the key, the value and
    :meth:`allowed`.
    """

    types: ClassVar[frozenset[ConfigType]]
    """The key types this validator applies to; checked when a key is defined."""

    @abstractmethod
    def __call__(self, value: ConfigValue) -> None: ...

    @abstractmethod
    def allowed(self) -> str:
        """The allowed values in words, for error messages: ``at least 14``."""

    @abstractmethod
    def describe(self) -> str:
        """The allowed values as Kafka's docs print them: ``[14,...]``."""


@dataclass(frozen=True, slots=True)
class Range(Validator):
    """A numeric range, either end open (Kafka's ``Range.atLeast`` / ``Range.between``)."""

    min: int | float | None = None
    max: int | float | None = None

    types: ClassVar[frozenset[ConfigType]] = _NUMERIC

    def __post_init__(self) -> None:
        if self.min is None and self.max is None:
            raise ValueError("a Range needs a minimum, a maximum or both")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"empty range: {self.min} > {self.max}")

    def __call__(self, value: ConfigValue) -> None:
        assert isinstance(value, int | float) and not isinstance(value, bool)
        if (self.min is not None and value < self.min) or (
            self.max is not None and value > self.max
        ):
            raise ValueError("out of range")

    def allowed(self) -> str:
        if self.max is None:
            return f"at least {self.min}"
        if self.min is None:
            return f"at most {self.max}"
        return f"between {self.min} and {self.max}"

    def describe(self) -> str:
        if self.max is None:
            return f"[{self.min},...]"
        if self.min is None:
            return f"[...,{self.max}]"
        return f"[{self.min},...,{self.max}]"


@dataclass(frozen=True, slots=True)
class ValidString(Validator):
    """One of a fixed set of names, matched exactly (Kafka's ``ValidString.in``)."""

    choices: tuple[str, ...]

    types: ClassVar[frozenset[ConfigType]] = frozenset({ConfigType.STRING})

    def __post_init__(self) -> None:
        if not self.choices:
            raise ValueError("ValidString needs at least one choice")

    def __call__(self, value: ConfigValue) -> None:
        if value not in self.choices:
            raise ValueError("not one of the allowed values")

    def allowed(self) -> str:
        return "one of " + ", ".join(self.choices)

    def describe(self) -> str:
        return "[" + ", ".join(self.choices) + "]"


@dataclass(frozen=True, slots=True)
class ValidList(Validator):
    """A list whose every element is one of a fixed set of names (Kafka's ``ValidList.in``)."""

    choices: tuple[str, ...]
    allow_empty: bool = False

    types: ClassVar[frozenset[ConfigType]] = frozenset({ConfigType.LIST})

    def __post_init__(self) -> None:
        if not self.choices:
            raise ValueError("ValidList needs at least one choice")

    def __call__(self, value: ConfigValue) -> None:
        assert isinstance(value, tuple)
        if not value and not self.allow_empty:
            raise ValueError("empty list")
        bad = [element for element in value if element not in self.choices]
        if bad:
            raise ValueError(f"{bad[0]!r} is not one of the allowed values")

    def allowed(self) -> str:
        what = "a comma-separated list" if self.allow_empty else "a non-empty comma-separated list"
        return f"{what} of " + ", ".join(self.choices)

    def describe(self) -> str:
        return "[" + ", ".join(self.choices) + "]"


@dataclass(frozen=True, slots=True)
class DistinctList(Validator):
    """A non-empty list without repeated elements (``log.dirs``)."""

    types: ClassVar[frozenset[ConfigType]] = frozenset({ConfigType.LIST})

    def __call__(self, value: ConfigValue) -> None:
        assert isinstance(value, tuple)
        if not value:
            raise ValueError("empty list")
        repeated = [element for i, element in enumerate(value) if element in value[:i]]
        if repeated:
            raise ValueError(f"{repeated[0]!r} is listed twice")

    def allowed(self) -> str:
        return "a non-empty comma-separated list without repeats"

    def describe(self) -> str:
        return "[distinct,...]"


def at_least(minimum: int | float) -> Range:
    """Values ``>= minimum``."""
    return Range(min=minimum)


def between(minimum: int | float, maximum: int | float) -> Range:
    """Values in ``[minimum, maximum]``, both ends included."""
    return Range(min=minimum, max=maximum)


def one_of(*choices: str) -> ValidString:
    """A string that is exactly one of ``choices`` (an enum-like setting)."""
    return ValidString(tuple(choices))


def list_of(*choices: str, allow_empty: bool = False) -> ValidList:
    """A list each of whose elements is one of ``choices``."""
    return ValidList(tuple(choices), allow_empty=allow_empty)


# --- Keys ------------------------------------------------------------------------------


class _Rejected(Exception):
    """A value of the wrong type or shape; the reason names what was wrong."""


@dataclass(frozen=True, slots=True)
class ConfigDescription:
    """One line of a config listing (docs, ``highwater ... --help-config``)."""

    name: str
    type: str
    default: str | None
    """The default in its Kafka string form; None for a required key."""
    valid_values: str
    documentation: str


@dataclass(frozen=True, slots=True)
class ConfigKey:
    """One setting: its Kafka name, type, default, validator and documentation.

    The default may be given in string or typed form; it is parsed and validated when the
    key is created, so a bad default fails at import time, not in production.
    """

    name: str
    type: ConfigType
    default: ConfigValue | _NoDefault = NO_DEFAULT
    validator: Validator | None = None
    doc: str = ""

    def __post_init__(self) -> None:
        if not _NAME_RE.fullmatch(self.name):
            raise ValueError(f"config name {self.name!r} is not of the form 'word.word'")
        attr = self.attr_name
        if not attr.isidentifier() or keyword.iskeyword(attr):
            raise ValueError(f"config name {self.name!r} gives no usable attribute name")
        if self.validator is not None and self.type not in self.validator.types:
            raise ValueError(
                f"{type(self.validator).__name__} does not apply to {self.name} "
                f"of type {self.type.value}"
            )
        if self.default is not NO_DEFAULT:
            try:
                parsed = self.parse(self.default)
            except InvalidConfigError as e:
                raise ValueError(f"bad default for {self.name}: {e}") from e
            object.__setattr__(self, "default", parsed)

    @property
    def attr_name(self) -> str:
        """The Python attribute name: ``segment.bytes`` -> ``segment_bytes``."""
        return self.name.replace(".", "_").replace("-", "_")

    @property
    def required(self) -> bool:
        return self.default is NO_DEFAULT

    def allowed(self) -> str:
        """What values this key accepts, in words."""
        if isinstance(self.validator, ValidString | ValidList):
            return self.validator.allowed()
        if self.validator is None:
            return self.type.phrase
        return f"{self.type.phrase}, {self.validator.allowed()}"

    def parse(self, value: RawValue | ConfigValue) -> Any:
        """Parse and validate one value, given as a Kafka string or already typed.

        Returns ``bool``, ``int``, ``float``, ``str`` or ``tuple[str, ...]`` by type.
        Raises :class:`InvalidConfigError` naming this key, the value and what is allowed.
        """
        try:
            parsed = _PARSERS[self.type](value)
            if self.validator is not None:
                self.validator(parsed)
        except (_Rejected, ValueError) as e:
            raise InvalidConfigError(
                f"Invalid value {_show(value)} for configuration {self.name}: {e}; "
                f"allowed: {self.allowed()}"
            ) from None
        return parsed

    def to_string(self, value: ConfigValue) -> str:
        """The Kafka string form of a parsed value, which :meth:`parse` reads back."""
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, tuple):
            return ",".join(value)
        if isinstance(value, float):
            return repr(value)
        return str(value)

    def describe(self) -> ConfigDescription:
        default = None
        if not isinstance(self.default, _NoDefault):
            default = self.to_string(self.default)
        return ConfigDescription(
            name=self.name,
            type=self.type.value,
            default=default,
            valid_values=self.validator.describe() if self.validator is not None else "",
            documentation=self.doc,
        )


def _show(value: object) -> str:
    shown = repr(value)
    if len(shown) > _MAX_SHOWN_VALUE:
        shown = shown[: _MAX_SHOWN_VALUE - 3] + "..."
    return shown


def _type_name(value: object) -> str:
    return type(value).__name__


def _parse_boolean(value: object) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        text = value.strip().lower()
        if text == "true":
            return True
        if text == "false":
            return False
        raise _Rejected("not a boolean")
    raise _Rejected(f"expected a boolean, got {_type_name(value)}")


def _parse_integer(value: object, low: int, high: int, what: str) -> int:
    if isinstance(value, bool):
        raise _Rejected("expected a number, got bool")
    if isinstance(value, str):
        text = value.strip()
        if not _INT_RE.fullmatch(text):
            raise _Rejected("not an integer")
        number = int(text)
    elif isinstance(value, int):
        number = value
    else:
        raise _Rejected(f"expected an integer, got {_type_name(value)}")
    if not low <= number <= high:
        raise _Rejected(f"out of range for {what} ({low} to {high})")
    return number


def _parse_int(value: object) -> int:
    return _parse_integer(value, INT_MIN, INT_MAX, "a 32-bit int")


def _parse_long(value: object) -> int:
    return _parse_integer(value, LONG_MIN, LONG_MAX, "a 64-bit long")


def _parse_double(value: object) -> float:
    if isinstance(value, bool):
        raise _Rejected("expected a number, got bool")
    if isinstance(value, str):
        text = value.strip()
        if not _DOUBLE_RE.fullmatch(text):
            raise _Rejected("not a number")
        number = float(text)
    elif isinstance(value, int | float):
        try:
            number = float(value)
        except OverflowError:
            raise _Rejected("out of range") from None
    else:
        raise _Rejected(f"expected a number, got {_type_name(value)}")
    if not math.isfinite(number):
        raise _Rejected("not a finite number")
    return number


def _parse_string(value: object) -> str:
    if isinstance(value, str):
        return value.strip()
    raise _Rejected(f"expected a string, got {_type_name(value)}")


def _parse_list(value: object) -> tuple[str, ...]:
    if isinstance(value, str):
        text = value.strip()
        elements: Sequence[object] = text.split(",") if text else ()
    elif isinstance(value, list | tuple):
        elements = value
    else:
        raise _Rejected(f"expected a comma-separated list, got {_type_name(value)}")
    parsed: list[str] = []
    for element in elements:
        if not isinstance(element, str):
            raise _Rejected(f"list element {element!r} is not a string")
        item = element.strip()
        if not item:
            raise _Rejected("the list has an empty element")
        if "," in item:
            raise _Rejected(f"list element {item!r} contains a comma")
        parsed.append(item)
    return tuple(parsed)


_PARSERS: Final[dict[ConfigType, Callable[[object], ConfigValue]]] = {
    ConfigType.BOOLEAN: _parse_boolean,
    ConfigType.STRING: _parse_string,
    ConfigType.INT: _parse_int,
    ConfigType.LONG: _parse_long,
    ConfigType.DOUBLE: _parse_double,
    ConfigType.LIST: _parse_list,
}


# --- Definitions -----------------------------------------------------------------------


class ConfigDef:
    """The ordered set of keys of one configuration scope."""

    def __init__(self, keys: Iterable[ConfigKey] = ()) -> None:
        self._keys: dict[str, ConfigKey] = {}
        self._attrs: set[str] = set()
        for key in keys:
            self.add(key)

    def add(self, key: ConfigKey) -> ConfigDef:
        """Add a key; returns ``self`` so definitions chain."""
        if key.name in self._keys:
            raise ValueError(f"configuration {key.name} is defined twice")
        if key.attr_name in self._attrs:
            raise ValueError(f"configuration {key.name} clashes with attribute {key.attr_name}")
        self._keys[key.name] = key
        self._attrs.add(key.attr_name)
        return self

    def define(
        self,
        name: str,
        type: ConfigType,
        default: ConfigValue | _NoDefault = NO_DEFAULT,
        validator: Validator | None = None,
        doc: str = "",
    ) -> ConfigDef:
        """Define a key in place (Kafka's ``ConfigDef.define``); returns ``self``."""
        return self.add(ConfigKey(name, type, default, validator, doc))

    def __getitem__(self, name: str) -> ConfigKey:
        return self._keys[name]

    def __contains__(self, name: object) -> bool:
        return name in self._keys

    def __iter__(self) -> Iterator[ConfigKey]:
        return iter(self._keys.values())

    def __len__(self) -> int:
        return len(self._keys)

    def key(self, name: str) -> ConfigKey:
        """The key named ``name``; :class:`InvalidConfigError` if there is none."""
        self._check_known((name,))
        return self._keys[name]

    def names(self) -> tuple[str, ...]:
        return tuple(self._keys)

    def defaults(self) -> dict[str, Any]:
        """The default of every key that has one, by name."""
        return {
            key.name: key.default for key in self._keys.values() if key.default is not NO_DEFAULT
        }

    def parse(
        self, props: Mapping[str, RawValue | ConfigValue], *, with_defaults: bool = True
    ) -> dict[str, Any]:
        """Parse and validate ``props`` into typed values keyed by config name.

        With ``with_defaults`` (the default) the result holds every key, in definition
        order, defaults filled in, and a missing required key is an error; without, it
        holds only the keys given (for applying overrides on top of a parsed config).

        Raises :class:`InvalidConfigError` for unknown keys (all of them named, with the
        nearest known names) and for the first bad value.
        """
        self._check_known(props)
        parsed: dict[str, Any] = {}
        for key in self._keys.values():
            if key.name in props:
                parsed[key.name] = key.parse(props[key.name])
            elif with_defaults:
                if isinstance(key.default, _NoDefault):
                    raise InvalidConfigError(
                        f"Missing required configuration {key.name}, which has no default "
                        f"value; allowed: {key.allowed()}"
                    )
                parsed[key.name] = key.default
        return parsed

    def valid_entries(self, props: Mapping[str, _Value], errors: list[str]) -> dict[str, _Value]:
        """The entries of ``props`` that :meth:`parse` takes, each on its own; the error of
        every other one (an unknown key, a bad value) appended to ``errors``. For values
        stored by an earlier release, which a later one may validate more strictly: what
        reads them leaves such an entry out and says so, rather than refusing them all."""
        valid: dict[str, _Value] = {}
        for name, value in props.items():
            try:
                self.key(name).parse(value)
            except InvalidConfigError as error:
                errors.append(str(error))
            else:
                valid[name] = value
        return valid

    def parse_value(self, name: str, value: RawValue | ConfigValue) -> Any:
        """Parse one value of the key ``name``."""
        return self.key(name).parse(value)

    def to_strings(self, values: Mapping[str, Any]) -> dict[str, str]:
        """The Kafka string forms of parsed ``values``, keyed by config name."""
        self._check_known(values)
        return {name: self._keys[name].to_string(value) for name, value in values.items()}

    def describe(self) -> tuple[ConfigDescription, ...]:
        """Every key as a listing line, in definition order."""
        return tuple(key.describe() for key in self._keys.values())

    def _check_known(self, names: Iterable[object]) -> None:
        unknown = [name for name in names if name not in self._keys]
        if not unknown:
            return
        parts = []
        for name in unknown:
            close = (
                difflib.get_close_matches(name, self._keys, n=1) if isinstance(name, str) else []
            )
            hint = f" (did you mean {close[0]}?)" if close else ""
            parts.append(f"{name!r}{hint}")
        noun = "configuration" if len(unknown) == 1 else "configurations"
        raise InvalidConfigError(
            f"Unknown {noun} {', '.join(parts)}; known: {', '.join(self._keys)}"
        )
