"""The CRDs' CEL rules (``x-kubernetes-validations``), evaluated with cel-python as the API
server evaluates them on create, where transition rules (those reading ``oldSelf``) are skipped."""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from typing import Any

import celpy

CelProblem = tuple[str, str]  # (field path, message)
OLD_SELF = re.compile(r"\boldSelf\b")


@functools.lru_cache(maxsize=1)
def environment() -> Any:
    """Built on first use: a manifest without create-time rules never pays for it."""
    return celpy.Environment()


@functools.lru_cache(maxsize=None)
def program(rule: str) -> Any:
    """The compiled program of one rule (cached: the CRDs repeat a few rules many times)."""
    return environment().program(environment().compile(rule))


def is_transition_rule(rule: str) -> bool:
    return bool(OLD_SELF.search(rule))


def holds(rule: str, value: Any) -> tuple[bool, str]:
    """Whether ``rule`` holds for ``self`` = ``value`` (JSON-like data); (False, why) when it
    does not or cannot be evaluated (a field read without ``has()`` is missing), as in the API
    server."""
    try:
        result = program(rule).evaluate({"self": celpy.json_to_cel(value)})
    except celpy.CELEvalError as exc:
        return False, f"cannot be evaluated ({exc.args[0] if exc.args else exc})"
    except celpy.CELParseError as exc:  # pragma: no cover - a CRD with a broken rule
        return False, f"is not CEL ({exc})"
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        # cel-python raises these for some ill-typed values (a null where a list is read)
        return False, f"cannot be evaluated ({type(exc).__name__}: {exc})"
    if isinstance(result, celpy.CELEvalError):
        return False, f"cannot be evaluated ({result.args[0] if result.args else result})"
    return bool(result), ""


def rule_problems(value: Any, validations: list[dict[str, Any]], path: str,
                  ) -> Iterator[CelProblem]:
    """Every failed create-time rule of ``validations`` for ``value`` at ``path``."""
    for validation in validations:
        rule = str(validation.get("rule", ""))
        if not rule or is_transition_rule(rule):
            continue
        ok, why = holds(rule, value)
        if not ok:
            message = validation.get("message") or f"failed rule: {rule}"
            where = path + str(validation.get("fieldPath") or "")
            yield where.lstrip("."), f"{message} (CEL: {rule}){' ' + why if why else ''}"
