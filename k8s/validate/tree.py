"""Lookups in a decoded manifest whose shape is not yet known to be right."""

from __future__ import annotations

from typing import Any


def get_in(obj: Any, *keys: str) -> Any:
    """``obj[k1][k2]...``, or None as soon as a level is missing or not a mapping."""
    for key in keys:
        obj = obj.get(key) if isinstance(obj, dict) else None
    return obj


def as_list(value: object) -> list[Any]:
    """``value`` when it is a list, else an empty one (a malformed field checks as absent)."""
    return value if isinstance(value, list) else []
