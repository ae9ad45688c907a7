"""The one loader of job specs: YAML file < ``--set`` overrides, onto the JobSpec defaults.

The dataclass tree in ``torchjob.jobs.spec`` drives everything: the loader walks its fields and type
hints, so a new field needs no code here. YAML is read with YAML 1.2 scalars (``yes``, ``no``,
``on`` stay strings; ``1:4`` is not a base-60 integer; ``1e-3`` is a float) and duplicate keys
are errors. Every problem becomes one ``SpecError`` naming the file, the field path, the bad
value and the fix. Nothing else in the project reads YAML.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import stat
import types
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

import yaml

from torchjob.jobs.spec import JobSpec, Section
from torchjob.jobs.trainer_args import suggest
from torchjob.jobs.values import FrozenMap, SpecError, bad, kind, show

__all__ = ["SpecError", "build", "load", "load_data", "loads", "parse_yaml", "with_overrides"]

# A job spec file, and a spec with its YAML aliases expanded: a few KiB in practice. Bounded so
# that a wrong path (/dev/zero, a log file) or an alias bomb ends in an error, not in memory.
MAX_SPEC_BYTES = 2**20
# Levels of nesting in a spec: a few (trainer.args, mounts[0].source); more is a mistake, and a
# YAML alias inside itself (a: &a [*a]) is infinitely deep.
MAX_DEPTH = 64

_INT, _FLOAT, _BOOL = (f"tag:yaml.org,2002:{t}" for t in ("int", "float", "bool"))
_TIMESTAMP = "tag:yaml.org,2002:timestamp"


class Words(list[Any]):
    """A YAML sequence that also keeps how each of its numbers and booleans was written
    (``texts``; None for any other item): ``trainer.args`` passes ``010`` or ``1.10`` on as
    written, not as the number it reads as."""

    texts: list[str | None] = []


def _represent_words(dumper: yaml.SafeDumper, words: Words) -> yaml.Node:
    """Words as they were written (--save-spec): a number's own text, with its tag where
    another reader would read that text otherwise."""
    node = dumper.represent_list(words)
    if len(words.texts) == len(words):
        node.value = [item if text is None else yaml.ScalarNode(item.tag, text)
                      for item, text in zip(node.value, words.texts)]
    return node


yaml.SafeDumper.add_representer(Words, _represent_words)


class _Loader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 core-schema scalars, duplicate keys refused, and sequences
    that keep their numbers' text (``Words``)."""

    def construct_words(self, node: yaml.SequenceNode) -> Iterator[Words]:
        words = Words()
        words.texts = [item.value if isinstance(item, yaml.ScalarNode) and item.tag in (
            _INT, _FLOAT, _BOOL) else None for item in node.value]
        yield words
        words.extend(self.construct_sequence(node))

    yaml_implicit_resolvers = {
        first: [(tag, rx) for tag, rx in resolvers if tag not in (_INT, _FLOAT, _BOOL, _TIMESTAMP)]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                duplicate = key in seen
                seen.add(key)
            except TypeError:  # unhashable: the base class reports it
                continue
            if duplicate:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {show(key)}: each key may appear once",
                    key_node.start_mark)
        return super().construct_mapping(node, deep)


def _construct_int(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> int:
    text = str(loader.construct_scalar(node))
    sign, digits = (-1, text[1:]) if text[0] == "-" else (1, text.lstrip("+"))
    if digits[:2] in ("0o", "0x"):
        return sign * int(digits[2:], 8 if digits[1] == "o" else 16)
    return sign * int(digits, 10)


_Loader.add_implicit_resolver(_BOOL, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
                              list("tTfF"))
_Loader.add_implicit_resolver(_INT, re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$"),
                              list("-+0123456789"))
_Loader.add_implicit_resolver(_FLOAT, re.compile(
    r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
    r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"), list("-+0123456789."))
_Loader.add_constructor(_INT, _construct_int)
_Loader.add_constructor("tag:yaml.org,2002:seq", _Loader.construct_words)


def parse_yaml(text: str, source: str) -> Any:
    """YAML text -> Python data, or SpecError("source: ...")."""
    try:
        return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        what = ", ".join(str(p) for p in (exc.context, exc.problem) if p)
        raise SpecError("", f"is not valid YAML: {what}{where}", source) from None
    except (yaml.YAMLError, ValueError, RecursionError) as exc:
        raise SpecError("", f"is not valid YAML: {exc or type(exc).__name__}", source) from None


# --------------------------------------------------------------------- generic builder

def _path(parent: str, key: object) -> str:
    return f"{parent}.{key}" if parent else str(key)


def _expect(hint: Any) -> str:
    names = {bool: "true or false", int: "an integer (e.g. 2)", float: "a number (e.g. 0.5)",
             str: "a string"}
    if hint in names:
        return names[hint]
    if get_origin(hint) is tuple:
        return "a list"
    return "a mapping"


def _scalar(hint: type, raw: object, path: str) -> Any:
    if hint is float and isinstance(raw, str):
        try:
            raw = float(raw.strip())
        except ValueError:
            pass
    if hint is float and isinstance(raw, (int, float)) and not isinstance(raw, bool):
        if not math.isfinite(raw):
            raise bad(path, raw, "is not a finite number")
        return float(raw) if isinstance(raw, float) else raw
    if isinstance(raw, hint) and not (hint is int and isinstance(raw, bool)):
        return raw
    fix = " (quote it)" if hint is str and isinstance(raw, (int, float, bool)) else ""
    raise bad(path, raw, f"is {kind(raw)}, but {_expect(hint)} is expected{fix}")


def _convert(hint: Any, raw: object, path: str, parse: Any = None) -> Any:
    """Raw YAML data -> the value of a field typed ``hint`` (recursing into sections)."""
    origin, args = get_origin(hint), get_args(hint)
    if origin in (Union, types.UnionType):
        arms = [a for a in args if a is not type(None)]
        if raw is None and len(arms) < len(args):
            return None
        if parse is None and len(arms) > 1:
            for arm in arms:
                try:
                    return _convert(arm, raw, path)
                except SpecError:
                    pass
            raise bad(path, raw, f"is {kind(raw)}, but a single value (a string, a number "
                      "or true/false) is expected")
        hint, origin, args = arms[0], get_origin(arms[0]), get_args(arms[0])
    if parse is not None:
        return parse(raw, path)
    if origin is Literal:
        if isinstance(raw, str) and raw in args:
            return raw
        raise bad(path, raw, f"must be one of {', '.join(map(repr, args))}")
    if origin is tuple:
        if not isinstance(raw, list):
            raise bad(path, raw, f"is {kind(raw)}, but a list is expected (- item per line)")
        return tuple(_convert(args[0], item, f"{path}[{i}]") for i, item in enumerate(raw))
    if origin is Mapping:
        if not isinstance(raw, dict):
            raise bad(path, raw, f"is {kind(raw)}, but a mapping (key: value) is expected")
        for key in raw:
            if not isinstance(key, str):
                raise bad(_path(path, key), key, f"is {kind(key)}, but keys are strings")
        return FrozenMap({k: _convert(args[1], v, _path(path, k)) for k, v in raw.items()})
    if dataclasses.is_dataclass(hint):
        return _section(hint, raw, path)
    return _scalar(hint, raw, path)


def _section(cls: Any, raw: object, path: str) -> Any:
    """Build one dataclass section from a mapping: unknown, missing and forbidden keys."""
    if not isinstance(raw, dict):
        raise bad(path, raw, f"is {kind(raw)}, but a mapping (key: value) is expected")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key in raw:
        if isinstance(key, str) and key in getattr(cls, "forbidden", {}):
            raise SpecError(_path(path, key), cls.forbidden[key])
        if key not in fields:
            raise SpecError(_path(path, key), f"unknown key{suggest(key, list(fields))}")
    for name, f in fields.items():
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if required and name not in raw:
            raise SpecError(_path(path, name), f"is missing: add it ({f.metadata['help']})")
    hints = get_type_hints(cls)
    kwargs = {name: _convert(hints[name], raw[name], _path(path, name), f.metadata.get("parse"))
              for name, f in fields.items() if name in raw}
    try:
        return cls(**kwargs)
    except SpecError as exc:
        raise exc.within(path) from None


def _bounded(data: object) -> None:
    """The data, with YAML aliases expanded, is at most MAX_SPEC_BYTES of text (an alias used
    a million times is refused before anything walks it) and every string is Unicode that
    UTF-8 can write (no lone surrogate such as "\\ud800")."""
    budget = MAX_SPEC_BYTES
    todo: list[tuple[str, object, int]] = [("", data, 0)]
    while todo:
        path, item, depth = todo.pop()
        budget -= 1
        if depth > MAX_DEPTH:  # a spec nests a few levels; a recursive alias never ends
            raise SpecError(path.partition("[")[0].partition(".")[0], f"nests deeper than "
                            f"{MAX_DEPTH} levels (MAX_DEPTH): a YAML alias inside itself, such "
                            "as a: &a [*a]? write the value out")
        if isinstance(item, str):
            try:
                budget -= len(item.encode("utf-8"))
            except UnicodeEncodeError:
                raise bad(path, item, "is not valid Unicode text (it holds a lone surrogate "
                          "such as \\ud800): write the character itself") from None
        elif isinstance(item, dict):
            todo += [(_path(path, key), key, depth + 1) for key in item]
            todo += [(_path(path, key), value, depth + 1) for key, value in item.items()]
        elif isinstance(item, list):
            todo += [(f"{path}[{i}]", value, depth + 1) for i, value in enumerate(item)]
        if budget < 0:
            raise SpecError("", f"is more than {MAX_SPEC_BYTES} bytes with its YAML aliases "
                            "expanded (MAX_SPEC_BYTES): a job spec is a few KiB; use fewer "
                            "aliases or put large data in files")


def build(data: object, source: str = "") -> JobSpec:
    """Python data (as YAML gives it) -> JobSpec; errors carry ``source``."""
    try:
        _bounded(data)
    except SpecError as exc:
        raise exc.sourced(source) from None
    if data is None:
        raise SpecError("", "is empty: a job spec is a mapping with at least 'name:'", source)
    if not isinstance(data, dict):
        raise bad("", data, "is not a job spec: the top level must be a mapping "
                  "(name: ..., nnodes: ...)").sourced(source)
    try:
        spec: JobSpec = _section(JobSpec, data, "")
    except SpecError as exc:
        raise exc.sourced(source) from None
    return spec


# -------------------------------------------------------------------------- overrides

def _check_override_path(parts: list[str]) -> None:
    """``--set a.b.c=...``: the path must name a field (or a key of env / trainer.args)."""
    hint: Any = JobSpec
    for i, part in enumerate(parts):
        here = ".".join(parts[:i])
        if not part:
            raise SpecError(here, f"empty key in {'.'.join(parts)!r} (write --set "
                            "key=value or a.b=value, e.g. --set trainer.args.epochs=3)", "--set")
        if get_origin(hint) is Mapping:
            hint = get_args(hint)[1]
            continue
        if not (isinstance(hint, type) and issubclass(hint, Section)):
            what = (f"a list; set it whole, e.g. --set '{here}=[...]'" if get_origin(hint) is
                    tuple else f"a single value; set it with --set {here}=VALUE")
            raise SpecError(here, f"has no keys inside: it is {what}", "--set")
        names = [f.name for f in dataclasses.fields(hint)]  # type: ignore[arg-type]
        if part not in names:
            raise SpecError(_path(here, part), f"unknown key{suggest(part, names)}", "--set")
        hint = get_type_hints(hint)[part]
        arms = [a for a in get_args(hint) if a is not type(None)]
        if get_origin(hint) in (Union, types.UnionType):  # a mapping (trainer.args) has keys
            maps = [a for a in arms if get_origin(a) is Mapping]
            hint = maps[0] if maps else arms[0] if len(arms) == 1 else hint


def apply_override(data: dict[Any, Any], override: str) -> str:
    """Apply ``a.b=value`` (value parsed as YAML) to raw data in place; returns the path."""
    key, eq, text = override.partition("=")
    if not eq:
        raise SpecError("", f"{show(override)} has no '=': write --set key=value "
                        "(e.g. --set nnodes=2)", "--set")
    parts = key.strip().split(".")
    _check_override_path(parts)
    value = parse_yaml(text, f"--set {key.strip()}")
    node = data
    for i, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            child = {}
        if not isinstance(child, dict):
            here = ".".join(parts[:i + 1])
            whole = f" (set it whole, e.g. --set '{here}=[...]')" if isinstance(child, list) \
                else ""
            raise bad(here, child, f"is not a mapping, so --set cannot set a key inside it{whole}")
        node[part] = node = dict(child)  # copy on write: YAML aliases may share this dict
    node[parts[-1]] = value
    return ".".join(parts)


# ------------------------------------------------------------------------------ entry

def loads(text: str, overrides: Iterable[str] = (), *, source: str = "<string>") -> JobSpec:
    """A job spec from YAML text plus ``key=value`` overrides (defaults < text < overrides)."""
    if len(text) > MAX_SPEC_BYTES or len(text.encode("utf-8", "surrogatepass")) > MAX_SPEC_BYTES:
        raise SpecError("", f"is more than {MAX_SPEC_BYTES} bytes (MAX_SPEC_BYTES): a job spec "
                        "is a few KiB; put large data in files", source)
    return load_data(parse_yaml(text, source), overrides, source=source)


def load_data(data: Any, overrides: Iterable[str] = (), *, source: str = "<data>") -> JobSpec:
    """A job spec from data already parsed (a YAML file's, or the command line's) plus
    ``key=value`` overrides. ``data`` is not changed."""
    return with_overrides(data, overrides, source=source)[1]


def with_overrides(data: Any, overrides: Iterable[str | tuple[str, str]] = (), *,
                   source: str = "<data>") -> tuple[Any, JobSpec]:
    """``data`` with ``key=value`` overrides applied (a copy, what ``--save-spec`` writes) and
    the job spec it makes. An override is ``key=value`` (from ``--set``) or ``(key=value,
    option)`` where another option set it (``--nproc-per-node``): an error names that option."""
    pairs = [(o, "--set") if isinstance(o, str) else o for o in overrides]
    if pairs and data is None:
        data = {}
    touched: list[tuple[str, str]] = []
    if isinstance(data, dict):
        data = dict(data)
        for override, option in pairs:
            try:
                touched.append((apply_override(data, override), option))
            except SpecError as exc:
                raise exc if exc.source else exc.sourced(source) from None
    try:
        return data, build(data, source)
    except SpecError as exc:
        for path, option in reversed(touched):  # the last one to set it
            if exc.path == path or exc.path.startswith((path + ".", path + "[")):
                raise exc.sourced(option) from None
        raise


def read_spec(path: Path) -> str:
    """The text of a spec file: a regular file of at most MAX_SPEC_BYTES, in UTF-8. Checked
    with stat before it is opened, and opened without blocking, so that a FIFO or a device
    (/dev/zero) is refused at once; never more than MAX_SPEC_BYTES + 1 bytes are read."""
    where = str(path)
    try:
        info = os.stat(path)
        if stat.S_ISDIR(info.st_mode):
            raise SpecError("", "is a directory, not a job spec file (name the YAML file in "
                            "it, e.g. jobs/examples/default.yaml)", where)
        if not stat.S_ISREG(info.st_mode):
            raise SpecError("", "is not a regular file (a FIFO, device or socket): write the "
                            "job spec to a file and name that", where)
        if info.st_size > MAX_SPEC_BYTES:
            raise SpecError("", f"is {info.st_size} bytes, more than {MAX_SPEC_BYTES} bytes "
                            "(MAX_SPEC_BYTES): is it the job spec? a spec is a few KiB", where)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as file:
            if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):  # replaced after the stat
                raise SpecError("", "is not a regular file: write the job spec to a file",
                                where)
            data = file.read(MAX_SPEC_BYTES + 1)
    except (FileNotFoundError, NotADirectoryError):
        raise SpecError("", "no such file (check the path; examples are in jobs/examples/)",
                        where) from None
    except OSError as exc:
        raise SpecError("", f"cannot be read: {exc.strerror or exc}", where) from None
    if len(data) > MAX_SPEC_BYTES:  # it grew after the stat
        raise SpecError("", f"is more than {MAX_SPEC_BYTES} bytes (MAX_SPEC_BYTES): is it the "
                        "job spec? a spec is a few KiB", where)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise SpecError("", "is not UTF-8 text", where) from None


def load(path_or_text: str | os.PathLike[str], overrides: Iterable[str] = ()) -> JobSpec:
    """A job spec from a file path (or, if it is YAML text with 'key: value', from text)."""
    if isinstance(path_or_text, str) and ("\n" in path_or_text or ": " in path_or_text
                                          or path_or_text.lstrip().startswith("{")):
        return loads(path_or_text, overrides)
    path = Path(path_or_text)
    return loads(read_spec(path), overrides, source=str(path))
