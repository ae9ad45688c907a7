"""The CRDs' CEL rules (``x-kubernetes-validations``), evaluated as the API server does on
create.

The evaluator is cel-python (PyPI ``cel-python``, import ``celpy``): pure Python, it installs
with pip everywhere torchjob does, and it evaluates every rule of the vendored CRDs (a test runs
each one): ``self``, ``has()``, ``size()`` and ``.size()``, ``in``, ``matches`` (RE2, through
google-re2, the regular expression engine Kubernetes' CEL uses), ``all``, ``exists`` and
``filter``. The other candidates were bindings to native CEL runtimes (cel-expr-python,
common-expression-language); the rules here need nothing they add, and a pure-Python package
cannot lack a wheel for a platform.

Transition rules (those that reference ``oldSelf``) are skipped, which is what the API server
does on create: there is no old object. A rule that cannot be evaluated (a missing field it
reads without ``has()``) fails, as it does in the API server, with the evaluation error named.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from typing import Any

import celpy

CelProblem = tuple[str, str]  # (field path, message)
OLD_SELF = re.compile(r"\boldSelf\b")
_ENV = celpy.Environment()


@functools.lru_cache(maxsize=None)
def program(rule: str) -> Any:
    """The compiled program of one rule (cached: the CRDs repeat a few rules many times)."""
    return _ENV.program(_ENV.compile(rule))


def is_transition_rule(rule: str) -> bool:
    return bool(OLD_SELF.search(rule))


def holds(rule: str, value: Any) -> tuple[bool, str]:
    """Whether ``rule`` holds for ``self`` = ``value`` (JSON-like data); (False, why) when it
    does not or cannot be evaluated."""
    try:
        result = program(rule).evaluate({"self": celpy.json_to_cel(value)})
    except celpy.CELEvalError as exc:
        return False, f"cannot be evaluated ({exc.args[0] if exc.args else exc})"
    except celpy.CELParseError as exc:  # pragma: no cover - a CRD with a broken rule
        return False, f"is not CEL ({exc})"
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
