"""Manifest YAML as kubectl reads it (sigs.k8s.io/yaml: go-yaml v2, a YAML 1.1 reader): the
one emitter of Kubernetes output, and the reader of manifests, rendered or hand-written."""

from __future__ import annotations

import math
import re
from typing import Any

import yaml

Obj = dict[str, Any]

# ------------------------------------------------------------------------------ writing
# go-yaml v2 resolves a plain (unquoted) scalar by its look: ``y``, ``N``, ``off`` are booleans,
# ``1e-05`` and ``.5`` floats, ``0o17``, ``0x1F``, ``017`` and ``1_000`` integers, ``2024-1-2`` a
# timestamp, ``~`` null, ``<<`` a merge key; PyYAML also reads ``1:30`` as 5400 and ``=`` as a
# value key. A string that any of these readers could take for anything but itself is written
# quoted, so every reader gets the same string back; other strings stay plain, and multi-line
# ones are ``|`` blocks where the emitter can keep them exact. PyYAML's own resolver already
# quotes most of them; GO_YAML_V2 adds the rest from go-yaml v2's ``resolve.go``. Over-quoting
# never changes a value: the patterns are a little wider than the readers' where that is simpler.

DIGITS = "0123456789"
SIGNED = "-+" + DIGITS
# (tag, pattern, first characters): plain scalars go-yaml v2 (or YAML 1.1) reads as non-strings
# and PyYAML's resolver does not.
GO_YAML_V2 = [
    ("tag:yaml.org,2002:bool", r"[yYnN]", "yYnN"),
    ("tag:yaml.org,2002:int", r"[-+]?[0-9_]*[0-9][0-9_]*", SIGNED),
    ("tag:yaml.org,2002:int", r"[-+]?0[xX][0-9a-fA-F_]*[0-9a-fA-F][0-9a-fA-F_]*", SIGNED),
    ("tag:yaml.org,2002:int", r"[-+]?0[oO][0-7_]*[0-7][0-7_]*", SIGNED),
    ("tag:yaml.org,2002:int", r"[-+]?0[bB][01_]*[01][01_]*", SIGNED),
    ("tag:yaml.org,2002:float",
     r"[-+]?(\.[0-9_]*[0-9][0-9_]*|[0-9_]*[0-9][0-9_]*(\.[0-9_]*)?)([eE][-+]?[0-9_]+)?",
     SIGNED + "."),
    ("tag:yaml.org,2002:float", r"[-+]?(\.inf|\.Inf|\.INF)|\.nan|\.NaN|\.NAN", "-+."),
    ("tag:yaml.org,2002:int", r"[-+]?[0-9][0-9_]*(:[0-9_]+)+(\.[0-9_]*)?", SIGNED),
    ("tag:yaml.org,2002:timestamp", r"[0-9]{4}-[0-9]{1,2}-[0-9]{1,2}([Tt ].*)?", DIGITS),
]


class Dumper(yaml.SafeDumper):
    """PyYAML's safe dumper with go-yaml v2's implicit types added to its resolver: the
    emitter quotes a string whenever a reader would resolve its plain form to another type."""


for _tag, _pattern, _first in GO_YAML_V2:
    Dumper.add_implicit_resolver(_tag, re.compile(rf"^(?:{_pattern})$", re.DOTALL),
                                 list(_first))


# YAML 1.1 line breaks besides \n: readers fold or normalise them inside plain, single-quoted and
# block scalars (and PyYAML's emitter writes them raw there), so such a string is written
# double-quoted, where they are escapes (\N, \L, \P).
OTHER_BREAKS = ("\x85", "\u2028", "\u2029")


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    """Multi-line strings as ``|`` blocks (the emitter falls back to quotes when a block
    would not keep the text exact); the rest plain unless the resolver says quote."""
    if any(c in value for c in OTHER_BREAKS):
        style: str | None = '"'
    else:
        style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


Dumper.add_representer(str, _str)


def quoted(text: str) -> bool:
    """Whether the emitter writes ``text`` quoted (a reader could take it for another type,
    or it holds YAML syntax)."""
    return dump(text).lstrip()[:1] in ("'", '"')


def dump(obj: Any) -> str:
    """One YAML document: keys in the order built, one line per value (no folding)."""
    return yaml.dump(obj, Dumper=Dumper, sort_keys=False, width=2**31 - 1,
                     allow_unicode=True)


def manifest_text(obj: Obj) -> str:
    """The manifest as YAML for ``kubectl apply -f -``."""
    return dump(obj)


def manifests_text(objs: list[Obj]) -> str:
    """Several manifests as one multi-document YAML (``---`` between them)."""
    return "---\n".join(manifest_text(obj) for obj in objs)


# ------------------------------------------------------------------------------ reading
# kubectl and the API server turn YAML into JSON with sigs.k8s.io/yaml, which decodes with its
# fork of go-yaml v2 into ``interface{}``. Unlike ``yaml.safe_load``: a timestamp-looking plain
# scalar stays a string, and so does ``1:20``; booleans are go-yaml's YAML 1.1 set, ``y`` and ``N``
# included; integers follow Go's ``strconv.ParseInt(s, 0, 64)`` without underscores (``017`` is
# octal), floats go-yaml's pattern (``1e3`` is one); JSON has no integral floats, so ``1.0``
# arrives as the integer 1 and ``.inf`` cannot arrive at all; keys are JSON strings (``y:`` is
# "true"); a key given twice is an error (strict field validation, the default since 1.27).

BOOL_TRUE = ("y", "Y", "yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON")
BOOL_FALSE = ("n", "N", "no", "No", "NO", "false", "False", "FALSE", "off", "Off", "OFF")
BOOL = re.compile("^(?:" + "|".join(BOOL_TRUE + BOOL_FALSE) + ")$")
INT = re.compile(r"^[-+]?(?:0[xX]_*[0-9a-fA-F][0-9a-fA-F_]*|0[oO]_*[0-7][0-7_]*|0[bB]_*[01][01_]*"
                 r"|[0-9][0-9_]*)$")  # a prefix needs a digit: Go's ParseInt refuses "0o"
FLOAT = re.compile(r"^(?:[-+]?(?:\.[0-9]+|[0-9][0-9_]*(?:\.[0-9_]*)?)(?:[eE][-+]?[0-9]+)?"
                   r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$")
NULL = re.compile(r"^(?:~|null|Null|NULL|)$")


_PARSER: Any = getattr(yaml, "CParser", None)  # libyaml's parser when PyYAML has it (fast)


if _PARSER is not None:
    class KubeLoader(_PARSER, yaml.constructor.SafeConstructor, yaml.resolver.Resolver):
        """A safe loader that resolves plain scalars as go-yaml v2 does (see "reading")."""

        def __init__(self, stream: Any) -> None:
            _PARSER.__init__(self, stream)
            yaml.constructor.SafeConstructor.__init__(self)
            yaml.resolver.Resolver.__init__(self)
else:  # pragma: no cover - PyYAML without libyaml
    class KubeLoader(yaml.SafeLoader):  # type: ignore[no-redef]
        """A safe loader that resolves plain scalars as go-yaml v2 does (see "reading")."""


# Start from no implicit resolvers, then add go-yaml v2's; the first characters are hints.
KubeLoader.yaml_implicit_resolvers = {}
KubeLoader.add_implicit_resolver("tag:yaml.org,2002:bool", BOOL, list("yYnNtTfFoO"))
KubeLoader.add_implicit_resolver("tag:yaml.org,2002:int", INT, list("-+0123456789"))
KubeLoader.add_implicit_resolver("tag:yaml.org,2002:float", FLOAT, list("-+0123456789."))
KubeLoader.add_implicit_resolver("tag:yaml.org,2002:null", NULL, ["~", "n", "N", ""])
KubeLoader.add_implicit_resolver("tag:yaml.org,2002:merge", re.compile(r"^<<$"), ["<"])


class YamlProblem(ValueError):
    """The text is not YAML kubectl would send (message names the line)."""


def _bool(loader: Any, node: yaml.ScalarNode) -> bool:
    return str(loader.construct_scalar(node)) in BOOL_TRUE


def _int(loader: Any, node: yaml.ScalarNode) -> int:
    text = str(loader.construct_scalar(node)).replace("_", "")
    sign = -1 if text.startswith("-") else 1
    digits = text.lstrip("+-")
    if len(digits) > 1 and digits[0] == "0" and digits[1] in "0123456789":
        if digits.isdigit() and set(digits) <= set("01234567"):
            return sign * int(digits, 8)  # Go's base 0: a leading 0 is octal
        return sign * int(digits)  # not octal (08): go-yaml reads it as the float 8, JSON's 8
    return sign * int(digits, 0)


def _float(loader: Any, node: yaml.ScalarNode) -> float | int:
    text = str(loader.construct_scalar(node)).replace("_", "")
    value = float(text.lower().replace(".inf", "inf").replace(".nan", "nan"))
    if math.isinf(value) or math.isnan(value):
        raise YamlProblem(f"line {node.start_mark.line + 1}: {text} is not a number JSON can "
                          "carry (kubectl refuses it); quote it if it is a string")
    return int(value) if value.is_integer() and abs(value) < 2**63 else value


def _key_text(key: object) -> str:
    """A key as sigs.k8s.io/yaml writes it into JSON: ``y:`` is the key "true", ``1:`` "1"."""
    if isinstance(key, bool):
        return "true" if key else "false"
    if key is None:
        return "null"
    return repr(key) if isinstance(key, float) else str(key)


def _mapping(loader: Any, node: yaml.MappingNode) -> dict[str, Any]:
    loader.flatten_mapping(node)
    seen: dict[str, Any] = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        if not isinstance(key, (str, int, float, bool)) and key is not None:
            raise YamlProblem(f"line {key_node.start_mark.line + 1}: a mapping key must be a "
                              "scalar")
        key = _key_text(key)
        if key in seen:
            raise YamlProblem(f"line {key_node.start_mark.line + 1}: duplicate key {key!r} "
                              "(the API server's strict field validation refuses it)")
        seen[key] = loader.construct_object(value_node, deep=True)
    return seen


KubeLoader.add_constructor("tag:yaml.org,2002:bool", _bool)
KubeLoader.add_constructor("tag:yaml.org,2002:int", _int)
KubeLoader.add_constructor("tag:yaml.org,2002:float", _float)
KubeLoader.add_constructor("tag:yaml.org,2002:map", _mapping)


def load_all(text: str) -> list[Any]:
    """Every non-empty document of ``text``, read as kubectl reads it. Raises YamlProblem or
    yaml.YAMLError on text kubectl would refuse."""
    try:
        return [doc for doc in yaml.load_all(text, Loader=KubeLoader) if doc is not None]
    except RecursionError:  # a few thousand open brackets: past the parser's stack
        raise YamlProblem("it is nested too deeply to be read (thousands of levels)") from None


def read_manifests(text: str) -> list[Obj]:
    """The objects of a text made by ``manifests_text``, read as kubectl reads them (what
    ``torchjob submit`` sends is what ``kubectl apply`` of the same text would send)."""
    return load_all(text)
