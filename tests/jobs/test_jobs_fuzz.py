"""Property-based fuzzing: whatever goes into the loader, only SpecError comes out.

Random YAML text, random nested data in the shape of a spec, and random ``--set`` strings;
a traceback from any of them would reach a user of ``torchjob`` as a crash.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from torchjob.jobs.load import SpecError, build, loads
from torchjob.jobs.spec import JobSpec, Section

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _field_names(cls: Any = JobSpec) -> list[str]:
    names: list[str] = []
    for f in dataclasses.fields(cls):
        names.append(f.name)
        if isinstance(f.default_factory, type) and issubclass(f.default_factory, Section):
            names += _field_names(f.default_factory)
    return names


NAMES = sorted(set(_field_names()) | {"value", "source", "target", "env", "secret", "key",
                                      "epochs", "lr", "schedule", "grad_accum", "resume"})
SPECIAL = ["1:2", "3:2", "0", "-1", "512Mi", "lots", "a'; rm -rf /", "", " ", "\n", "nan",
           "1e999", "12:00:00", "c10d", "trainer", "digits", "true", "yes", "~", "9" * 30]
scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70),
                    st.floats(allow_nan=True, allow_infinity=True),
                    st.text(max_size=30), st.sampled_from(SPECIAL), st.sampled_from(NAMES))
keys = st.one_of(st.sampled_from(NAMES), st.text(max_size=10), st.integers(), st.booleans())
data = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(keys, inner, max_size=5)), max_leaves=25)


def shaped(cls: Any) -> st.SearchStrategy[dict[str, Any]]:
    """Mappings shaped like a section: its own keys, each holding a plausible or random value."""
    hints = {f.name: f for f in dataclasses.fields(cls)}
    optional = {}
    for name, f in hints.items():
        inner = f.default_factory
        if isinstance(inner, type) and issubclass(inner, Section):
            optional[name] = st.one_of(shaped(inner), data)
        elif name in ("secrets", "mounts"):
            from torchjob.jobs.spec import Mount, SecretRef
            optional[name] = st.lists(shaped(SecretRef if name == "secrets" else Mount),
                                      max_size=2) | data
        else:
            optional[name] = st.one_of(scalars, data)
    return st.fixed_dictionaries({}, optional=optional)


specs = st.one_of(shaped(JobSpec), st.dictionaries(st.sampled_from(NAMES), data, max_size=8)
                  ).map(lambda d: {"name": "x", **d})


def only_spec_errors(call: Any, *args: Any) -> None:
    try:
        call(*args)
    except SpecError as exc:
        assert str(exc) and "\n" not in str(exc)  # the CLI prints exactly one line


@FUZZ
@given(specs)
def test_random_nested_data(raw: dict[Any, Any]) -> None:
    only_spec_errors(build, raw, "job.yaml")


@FUZZ
@given(specs)
def test_random_yaml_documents(raw: dict[Any, Any]) -> None:
    try:
        text = yaml.safe_dump(raw, allow_unicode=True)
    except yaml.YAMLError:
        return
    only_spec_errors(loads, text)


YAML_BITS = ["name: x\n", "nnodes: ", "1:2", "{", "}", "[", "]", ", ", ": ", "\n", "  ",
             "- ", "&a ", "*a", "<<: ", "!!binary ", "!!python/object ", "'", '"', "#", "---\n",
             "trainer:\n  args:\n    ", "epochs: ", "env:\n  A: ", "? ", "|\n  ", "\t",
             "%YAML 1.1\n"]


@FUZZ
@given(st.lists(st.one_of(st.sampled_from(YAML_BITS), st.text(max_size=8)), max_size=25))
def test_random_yaml_text(bits: list[str]) -> None:
    only_spec_errors(loads, "".join(bits))


paths = st.lists(st.one_of(st.sampled_from(NAMES), st.text(max_size=6)), max_size=4).map(
    ".".join)
values = st.one_of(st.sampled_from(SPECIAL + ["{a: 1}", "[1, 2]", "[", "{", "a=b"]),
                   st.text(max_size=20))


@FUZZ
@given(st.lists(st.one_of(st.builds(lambda p, v: f"{p}={v}", paths, values), st.text(max_size=20)),
                max_size=4))
def test_random_overrides(overrides: list[str]) -> None:
    only_spec_errors(loads, "name: x\ntrainer: {args: {epochs: 2}}\n", overrides)


def test_alias_bomb_is_refused_or_bounded() -> None:
    """Billion laughs: the error message must not expand the whole structure."""
    text = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 9)}]\n"
        for i in range(8)) + "name: x\n"
    try:
        loads(text)
    except SpecError as exc:
        assert len(str(exc)) < 2000
