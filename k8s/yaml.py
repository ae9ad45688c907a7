"""The one YAML emitter of Kubernetes output (``render``, ``--dry-run`` and ``submit`` alike).

kubectl reads YAML with sigs.k8s.io/yaml, which is go-yaml v2: a YAML 1.1 reader that resolves
a plain (unquoted) scalar by its look. ``y``, ``N``, ``off`` become booleans, ``1e-05`` and
``.5`` floats, ``0o17``, ``0x1F``, ``017`` and ``1_000`` integers, ``2024-1-2`` a timestamp,
``~`` null, ``<<`` a merge key; other YAML 1.1 readers (PyYAML) also read ``1:30`` as 5400
(sexagesimal) and ``=`` as a value key. A string that any of these readers could take for
anything but itself is written quoted here, so every reader gets the same string back; other
strings stay plain, and multi-line ones are ``|`` blocks where the emitter can keep them exact.

The rules added to PyYAML's own resolver (which already quotes yes/no/on/off/true/false/null
in their three spellings, its ints, floats with a dot, sexagesimal numbers, timestamps, ``=``,
``<<``) are go-yaml v2's ``resolve.go``: its map (``y``/``Y``/``n``/``N`` besides the others),
``strconv.ParseInt(s, 0, 64)`` after removing ``_`` (``0x``, ``0o``, ``0b``, leading-zero
octal), its ``yamlStyleFloat`` (``1e5``, ``1.``, ``.5``) and its timestamp layouts
(``2006-1-2``, with a time after ``T``/``t``/space). Over-quoting never changes a value; the
patterns below are a little wider than the readers' where that kept them simple.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

Obj = dict[str, Any]

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


def read_manifests(text: str) -> list[Obj]:
    """The objects of a text made by ``manifests_text`` (PyYAML's safe loader; every string
    that a YAML 1.1 reader could mistake is quoted, so it reads them as kubectl does)."""
    return [obj for obj in yaml.safe_load_all(text) if obj is not None]
