"""Read manifest YAML as kubectl and the API server do, not as PyYAML's defaults do.

Both turn YAML into JSON with sigs.k8s.io/yaml, which decodes with its fork of go-yaml v2
(YAML 1.1 plain scalars, decoded into ``interface{}``) and then encodes JSON. What differs from
``yaml.safe_load``, each followed here:

- A timestamp-looking plain scalar (``2024-01-01``) stays a string: go-yaml v2 keeps
  timestamps as strings when the target is ``interface{}`` (decode.go, "for backward
  compatibility"). PyYAML would make a ``date``, which no schema field accepts.
- Sexagesimal numbers (``1:20``) are strings; PyYAML reads ``1:20`` as 80.
- Booleans are the YAML 1.1 set go-yaml v2 resolves: ``y/Y/yes/Yes/YES/on/On/ON/true/...``
  and their negatives, ``n`` and ``N`` included (PyYAML leaves out ``y``/``n``). So an
  unquoted ``yes`` in a string field is a boolean there too, and the schema says so.
- Integers follow Go's ``strconv.ParseInt(s, 0, 64)`` after underscores are removed (``0x1F``,
  ``0o17``, ``0b11``, and ``017`` as octal); floats follow go-yaml's float pattern (``1e3`` is
  a float; PyYAML wants a dot), plus ``.inf``/``.nan``.
- JSON has no integral floats: ``1.0`` and ``1e3`` arrive at the server as ``1`` and
  ``1000``, integers, so they are integers here. ``.inf``/``.nan`` cannot be encoded as JSON:
  kubectl refuses the file.
- Keys are strings in JSON: a plain ``y``, ``no`` or ``1`` key becomes "true", "false", "1".
- A key given twice in one mapping is an error (kubectl's strict field validation, the
  default since Kubernetes 1.27, reports duplicate fields).
"""

from __future__ import annotations

import math
import re
from typing import Any

import yaml

BOOL_TRUE = ("y", "Y", "yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON")
BOOL_FALSE = ("n", "N", "no", "No", "NO", "false", "False", "FALSE", "off", "Off", "OFF")
BOOL = re.compile("^(?:" + "|".join(BOOL_TRUE + BOOL_FALSE) + ")$")
INT = re.compile(r"^[-+]?(?:0[xX][0-9a-fA-F_]+|0[oO][0-7_]+|0[bB][01_]+|[0-9][0-9_]*)$")
FLOAT = re.compile(r"^(?:[-+]?(?:\.[0-9]+|[0-9][0-9_]*(?:\.[0-9_]*)?)(?:[eE][-+]?[0-9]+)?"
                   r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$")
NULL = re.compile(r"^(?:~|null|Null|NULL|)$")


_PARSER: Any = getattr(yaml, "CParser", None)  # libyaml's parser when PyYAML has it (fast)


if _PARSER is not None:
    class KubeLoader(_PARSER, yaml.constructor.SafeConstructor, yaml.resolver.Resolver):
        """A safe loader with go-yaml v2's plain-scalar resolution (module docstring)."""

        def __init__(self, stream: Any) -> None:
            _PARSER.__init__(self, stream)
            yaml.constructor.SafeConstructor.__init__(self)
            yaml.resolver.Resolver.__init__(self)
else:  # pragma: no cover - PyYAML without libyaml
    class KubeLoader(yaml.SafeLoader):  # type: ignore[no-redef]
        """A safe loader with go-yaml v2's plain-scalar resolution (module docstring)."""


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
        return sign * int(digits, 8)  # Go's base 0: a leading 0 is octal
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
    return [doc for doc in yaml.load_all(text, Loader=KubeLoader) if doc is not None]
