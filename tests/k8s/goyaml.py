"""A YAML reader that resolves plain scalars as kubectl does: sigs.k8s.io/yaml decodes with
go-yaml v2 into ``interface{}``; this is a port of go-yaml v2's ``resolve.go`` (its map,
``resolve_table``, ``strconv.ParseInt(s, 0, 64)``/``ParseUint`` after removing ``_``,
``yamlStyleFloat``, ``parseTimestamp``), on top of PyYAML's parser. Where go-yaml keeps a value
a string for backward compatibility (a timestamp decoded into ``interface{}``, ``<<`` outside
a key), this reader does NOT: it is stricter than kubectl, never more lenient.

``load_all(text)`` reads with it; ``yaml.safe_load_all`` is the YAML 1.1 reader (PyYAML's
resolver: sexagesimal ``1:30``, ``=``, timestamps), which tests use as well.
"""

from __future__ import annotations

import math
import re
from typing import Any

import yaml

MAP: dict[str, Any] = {
    **dict.fromkeys(["y", "Y", "yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON"],
                    True),
    **dict.fromkeys(["n", "N", "no", "No", "NO", "false", "False", "FALSE", "off", "Off", "OFF"],
                    False),
    **dict.fromkeys(["", "~", "null", "Null", "NULL"], None),
    **dict.fromkeys([".nan", ".NaN", ".NAN"], math.nan),
    **dict.fromkeys([".inf", ".Inf", ".INF", "+.inf", "+.Inf", "+.INF"], math.inf),
    **dict.fromkeys(["-.inf", "-.Inf", "-.INF"], -math.inf),
    "<<": "<<merge>>",
}
YAML_STYLE_FLOAT = re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?")
TIMESTAMP = re.compile(r"[0-9]{4}-[0-9]{1,2}-[0-9]{1,2}"
                       r"([Tt][0-9]{1,2}:[0-9]{1,2}:[0-9]{1,2}(\.[0-9]*)?"
                       r"(Z|[-+][0-9]{2}:[0-9]{2})"
                       r"| [0-9]{1,2}:[0-9]{1,2}:[0-9]{1,2}(\.[0-9]*)?)?")
GO_FLOAT = re.compile(r"[-+]?(\.[0-9]+|[0-9]+\.?[0-9]*)([eE][-+]?[0-9]+)?"
                      r"|[-+]?0[xX][0-9a-fA-F.]+[pP][-+]?[0-9]+")


class Timestamp(str):
    """A timestamp as go-yaml resolves it (kubectl then keeps the text; this reader does not
    count it as a string)."""


def hint(text: str) -> str:
    """go-yaml v2's ``resolve_table`` of the first byte ('' when it names no type)."""
    if not text:
        return "N"
    c = text[0]
    if c in "+-":
        return "S"
    if c.isascii() and c.isdigit():
        return "D"
    if c in "yYnNtTfFoO~":
        return "M"
    return "." if c == "." else ""


def parse_int(text: str) -> int | None:
    """Go's ``strconv.ParseInt(text, 0, 64)``, then ``ParseUint(text, 0, 64)``."""
    sign, body = (text[0], text[1:]) if text[:1] in "+-" else ("", text)
    prefix = body[:2].lower()
    if prefix in ("0x", "0o", "0b"):
        base, digits = {"0x": 16, "0o": 8, "0b": 2}[prefix], body[2:]
    elif body[:1] == "0" and len(body) > 1:
        base, digits = 8, body[1:]
    else:
        base, digits = 10, body
    valid = "0123456789abcdef"[:base]
    if not digits or any(c.lower() not in valid for c in digits):
        return None
    value = int(digits, base) * (-1 if sign == "-" else 1)
    if -2**63 <= value < 2**63 or (not sign and value < 2**64):
        return value
    return None


def go_resolve(text: str) -> Any:
    """The value go-yaml v2 gives the plain scalar ``text``."""
    kind = hint(text)
    if not kind:
        return text
    if text in MAP:
        return MAP[text]
    if kind == "." and GO_FLOAT.fullmatch(text):
        return float(text)
    if kind in "DS":
        if TIMESTAMP.fullmatch(text):
            return Timestamp(text)
        plain = text.replace("_", "")
        if (value := parse_int(plain)) is not None:
            return value
        if YAML_STYLE_FLOAT.fullmatch(plain):
            return float(plain)
        for sign in ("", "-"):  # go-yaml's own 0b handling
            if plain.startswith(sign + "0b") and (value := parse_int("0b" + plain[len(sign) + 2:]
                                                                     )) is not None:
                return -value if sign else value
    return text


class GoYamlV2Loader(yaml.SafeLoader):
    """PyYAML's parser, go-yaml v2's resolution of plain scalars."""

    yaml_implicit_resolvers: dict[Any, Any] = {}

    def resolve(self, kind: Any, value: Any, implicit: Any) -> str:
        if kind is yaml.ScalarNode and implicit[0]:
            return "!go-plain"
        return str(super().resolve(kind, value, implicit))


GoYamlV2Loader.add_constructor("!go-plain",
                               lambda loader, node: go_resolve(str(node.value)))


def load_all(text: str) -> list[Any]:
    """The documents of ``text`` as kubectl's reader resolves them."""
    return list(yaml.load_all(text, Loader=GoYamlV2Loader))
