"""The principal a client certificate authenticates: ``ssl.principal.mapping.rules``.

The certificate's subject is taken as an RFC 4514 distinguished name (``CN=alice,OU=ops,
O=example``, most specific first, as Java's ``X500Principal.getName()`` writes it too)
and mapped by the rules, in order, as Kafka's ``SslPrincipalMapper`` does:

- ``RULE:pattern/replacement/`` (``/L`` or ``/U`` to lower- or upper-case the result):
  when the Java-style regular expression ``pattern`` matches the whole name, the result is
  ``replacement`` with ``$1``..``$9`` replaced by its groups; ``/`` in either part is
  written ``\\/``;
- ``DEFAULT``: the subject's common name (its first ``CN``), or the whole name if it has
  none. Here Highwater differs from Kafka, whose DEFAULT is the whole name: a certificate
  with subject ``CN=alice`` is ``User:alice`` without any rule;
- rules are separated by commas; the default rules are ``DEFAULT``. A name no rule
  matches authenticates no one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from cryptography import x509
from cryptography.x509.oid import NameOID

from highwater.errors import SaslAuthenticationError

__all__ = ["DEFAULT_RULES", "SslPrincipalMapper", "subject_name"]

DEFAULT_RULES: Final = "DEFAULT"


@dataclass(frozen=True, slots=True)
class _Rule:
    pattern: re.Pattern[str] | None  # None: DEFAULT
    replacement: str = ""
    case: str = ""


class SslPrincipalMapper:
    """``ssl.principal.mapping.rules``, parsed (``ValueError`` naming the bad rule)."""

    def __init__(self, rules: str = DEFAULT_RULES) -> None:
        self.rules = rules
        self._rules = _parse(rules)

    def principal_name(self, distinguished_name: str) -> str:
        """The principal's name (without ``User:``) for a subject's distinguished name.
        Raises :class:`~highwater.errors.SaslAuthenticationError` if no rule applies."""
        for rule in self._rules:
            if rule.pattern is None:
                return _common_name(distinguished_name) or distinguished_name
            match = rule.pattern.fullmatch(distinguished_name)
            if match is None:
                continue
            result = _substitute(rule.replacement, match)
            if rule.case == "L":
                result = result.lower()
            elif rule.case == "U":
                result = result.upper()
            return result
        raise SaslAuthenticationError(
            f"no ssl.principal.mapping.rules apply to {distinguished_name}"
        )

    def principal(self, certificate: x509.Certificate) -> str:
        """``User:<name>`` for a client certificate."""
        return f"User:{self.principal_name(subject_name(certificate))}"


def _substitute(replacement: str, match: re.Match[str]) -> str:
    """``replacement`` with ``$1``..``$9`` replaced by the groups of ``match``."""
    return re.sub(r"\$(\d)", lambda m: match.group(int(m.group(1))) or "", replacement)


def subject_name(certificate: x509.Certificate) -> str:
    """The certificate's subject as an RFC 4514 string (``CN=alice,O=example``)."""
    return certificate.subject.rfc4514_string()


def _common_name(distinguished_name: str) -> str | None:
    try:
        name = x509.Name.from_rfc4514_string(distinguished_name)
    except ValueError:
        return None
    names = name.get_attributes_for_oid(NameOID.COMMON_NAME)
    if not names:
        return None
    value = names[-1].value  # RFC 4514 lists the most specific RDN first: parsed last
    return value if isinstance(value, str) else value.decode()


_RULE: Final = re.compile(
    r"RULE:(?P<pattern>(?:\\.|[^\\/])*)/(?P<replacement>(?:\\.|[^\\/])*)/(?P<case>[LU]?)"
)


def _parse(rules: str) -> list[_Rule]:
    parsed: list[_Rule] = []
    text = rules.strip()
    position = 0
    while position < len(text):
        rest = text[position:]
        if rest.startswith("DEFAULT"):
            parsed.append(_Rule(None))
            position += len("DEFAULT")
        else:
            match = _RULE.match(rest)
            if match is None:
                raise ValueError(f"ssl.principal.mapping.rules: cannot parse {rest!r}")
            pattern = match.group("pattern").replace("\\/", "/")
            try:
                compiled = re.compile(pattern)
            except re.error as e:
                raise ValueError(
                    f"ssl.principal.mapping.rules: bad pattern {pattern!r}: {e}"
                ) from None
            replacement = match.group("replacement").replace("\\/", "/")
            parsed.append(_Rule(compiled, replacement, match.group("case")))
            position += match.end()
        separator = re.compile(r"\s*,\s*|\s*$").match(text, position)
        if separator is None or (separator.end() == position and position < len(text)):
            raise ValueError(
                f"ssl.principal.mapping.rules: expected a comma after a rule at {text[position:]!r}"
            )
        position = separator.end()
    if not parsed:
        raise ValueError("ssl.principal.mapping.rules is empty")
    return parsed
