"""``trainer.args``: its two forms (a mapping, or a list of words passed as written), the
command line it becomes, and for the built-in trainer the verdict of the trainer's own parser,
so that a mistake stops at the spec, naming the item."""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

from torchjob.jobs.values import (MAX_TOTAL_BYTES, MAX_VALUE_BYTES, FrozenMap, SpecError,
                                  at_most_bytes, bad, kind, scalar_text, show, size)

Scalar = str | bool | int | float
Args = Mapping[str, Scalar] | tuple[str, ...]
# set at the top level of the spec, never in args: the trainer's option -> the spec's field
TOP_LEVEL = {"run_dir": "run_dir", "checkpoint_dir": "checkpoint_dir",
             "pg_timeout": "collective_timeout", "stop_grace": "checkpoint_budget",
             "tensorboard": "tensorboard", "prometheus_dir": "prometheus_dir",
             "exporters": "exporters"}
# what a list of words would hold, for the message that moves an option to the top level
_WHAT = {"run_dir": "DIR", "checkpoint_dir": "DIR", "prometheus_dir": "DIR",
         "pg_timeout": "SECONDS", "stop_grace": "SECONDS", "tensorboard": "true",
         "exporters": "[pkg.module:Class]"}
_ARGS_FIX = ("write a mapping (grad_accum: 2) or a list of command-line words "
             "(['10', '--lr=0.1', 'model.depth=4'])")
_one_word = at_most_bytes(MAX_VALUE_BYTES, "per command-line word (MAX_VALUE_BYTES)")


def suggest(word: object, valid: list[str]) -> str:
    """``; valid keys: a, b (did you mean 'x'?)`` for an unknown key."""
    close = difflib.get_close_matches(word, valid, n=1, cutoff=0.5) \
        if isinstance(word, str) else []
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"; valid keys: {', '.join(valid)}{hint}"


def trainer_argv(args: Args) -> list[str]:
    """A list of words as it is; a mapping ``{grad_accum: 2, resume: False}`` ->
    ``--grad-accum 2 --resume false``, in order."""
    if isinstance(args, tuple):
        return list(args)
    out: list[str] = []
    for key, value in args.items():
        out += [f"--{key.replace('_', '-')}", scalar_text(value)]
    return out


def parse_args(raw: object, path: str) -> Args:
    """``trainer.args`` from YAML: a mapping of scalars (a value becomes its text: ``1e-3`` ->
    ``--lr 0.001``), or a list of words, each as written (``010``, ``1.10``, ``True``: the
    loader's ``texts``; else its text as a mapping's value)."""
    if isinstance(raw, list):
        texts = getattr(raw, "texts", None)
        texts = texts if texts and len(texts) == len(raw) else [None] * len(raw)
        words = []
        for i, item in enumerate(raw):
            _check_value(item, f"{path}[{i}]", word=True)
            words.append(scalar_text(item) if texts[i] is None else texts[i])
        return tuple(words)
    if isinstance(raw, dict):
        for key, value in raw.items():
            if not isinstance(key, str):
                raise bad(f"{path}.{key}", key, f"is {kind(key)}, but keys are strings")
            _check_value(value, f"{path}.{key}")
        return FrozenMap(raw)
    raise bad(path, raw, f"is {kind(raw)}: {_ARGS_FIX}")


def check_args(args: Args, *, builtin: bool) -> None:
    """Each item a bounded word or value, the whole within one command line, and with
    ``builtin`` (torchjob's own trainer) accepted by the trainer's parser."""
    if isinstance(args, tuple):
        for i, word in enumerate(args):
            _check_word(word, f"args[{i}]")
    else:
        for key, value in args.items():
            if not isinstance(key, str) or not re.fullmatch(r"[A-Za-z][A-Za-z0-9_-]{0,99}", key):
                raise bad(f"args.{key}", key, "is not an argument name (e.g. grad_accum)")
            _check_value(value, f"args.{key}")
    total = sum(size(word) for word in trainer_argv(args))
    if total > MAX_TOTAL_BYTES:
        raise SpecError("args", f"hold {total} bytes, more than {MAX_TOTAL_BYTES} bytes "
                        "(MAX_TOTAL_BYTES, what one command line carries): put large "
                        "data in a file and pass its path")
    if builtin:
        _check_for_trainer(args)


def _check_value(value: object, path: str, *, word: bool = False) -> None:
    """One argument value or word: a string, a finite number or true/false, without NUL."""
    if isinstance(value, (str, bool, int, float)):
        if isinstance(value, float) and not math.isfinite(value):
            raise bad(path, value, "is not a finite number (quote it to pass it as text)")
        if isinstance(value, str):
            _one_word(value, path)
        return
    if word:
        raise bad(path, value, f"is {kind(value)}, but each item is one command-line word: a "
                  "string, a number or true/false (write key=value, or quote an item that "
                  "holds ': ' or ', ', e.g. '--opt=a,b'; '' is an empty word)")
    raise bad(path, value, f"is {kind(value)}, but a single value (a string, a number or "
              "true/false) is expected (or write trainer.args as a list of words)")


def _check_word(word: object, path: str) -> None:
    if not isinstance(word, str):
        raise bad(path, word, f"is {kind(word)}, but each item is one command-line word: a "
                  "string (write a number or boolean as text, e.g. '10')")
    _check_value(word, path, word=True)


@dataclass(frozen=True)
class _Item:
    """One item of either form: where it is, what it holds, the option it names."""

    path: str  # args[3] or args.lr
    value: Scalar  # the word, or the mapping's value
    flag: str  # --lr; for a word, the word up to any '='
    key: str  # the trainer field it names: lr ('' for a word that names none)
    option: bool  # whether it is an option (a word such as '10' is not)


def _items(args: Args) -> list[_Item]:
    if isinstance(args, tuple):
        items = []
        for i, word in enumerate(args):
            flag = word.partition("=")[0]
            key = flag[2:].replace("-", "_") if flag.startswith("--") else ""
            option = word.startswith("-") and not _is_number(word)
            items.append(_Item(f"args[{i}]", word, flag, key, option))
        return items
    return [_Item(f"args.{key}", value, f"--{key.replace('_', '-')}", key, True)
            for key, value in args.items()]


def _check_for_trainer(args: Args) -> None:
    """Check args against the built-in trainer's own parser, so mistakes stop here, not on a
    cluster: each option's name (and a mapping's value types) first, then the whole."""
    # the trainer never imports jobs; jobs may import the trainer
    from torchjob.trainer import config

    words, types = isinstance(args, tuple), config.field_types()
    items = _items(args)
    for item in items:
        if not item.option:
            continue
        if item.key in TOP_LEVEL:
            what = _WHAT[item.key]
            where = f"{what} there, not in" if words else \
                f"{scalar_text(item.value)} there, not under"
            raise bad(item.path, item.value, f"belongs at the top level of the job spec: write "
                      f"{TOP_LEVEL[item.key]}: {where} trainer.args")
        if item.key not in types:
            raise _unknown(item, sorted(set(types) - set(TOP_LEVEL)), words)
        want = types[item.key]
        if not words and not _is_type(item.value, want):
            raise bad(item.path, item.value, f"is {kind(item.value)}, but {item.flag} takes "
                      f"{kind(want())} (see python -m torchjob.trainer --help)")
    argv = trainer_argv(args)
    try:
        config.parse_args(argv)
    except (config.ConfigError, SystemExit) as exc:
        blamed = _blamed(items, str(exc), words)
        if blamed is not None:
            raise bad(blamed.path, blamed.value, f"is rejected by the trainer: {exc}") from None
        raise SpecError("args", f"the trainer rejects {show(argv)}: {exc}") from None


def _unknown(item: _Item, valid: list[str], words: bool) -> SpecError:
    """An option the trainer does not have, with the closest one it has."""
    if not words:
        return SpecError(item.path, f"is not a trainer argument{suggest(item.key, valid)}")
    flags = sorted(f"--{name.replace('_', '-')}" for name in valid)
    close = difflib.get_close_matches(item.flag, flags, n=1, cutoff=0.5)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return bad(item.path, item.value, f"is not an option of the trainer{hint}: write "
               "--name VALUE or --name=VALUE (see python -m torchjob.trainer --help)")


def _blamed(items: list[_Item], message: str, words: bool) -> _Item | None:
    """The item the trainer's complaint is about: a stray word it did not recognise, or the
    option it names (the last of a list's repeats: argparse keeps an option's last value)."""
    unknown = re.search(r"unrecognized arguments: (\S+)", message) if words else None
    named = re.findall(r"--[a-z0-9-]+", message)
    if not words:  # a mapping: the first option named that the mapping sets
        named = [flag for flag in named if any(item.flag == flag for item in items)]
    for item in reversed(items):
        if (unknown and item.value == unknown[1]) or \
                (not unknown and named and item.flag == named[0]):
            return item
    return None


def _is_number(word: str) -> bool:
    try:
        float(word)
    except ValueError:
        return False
    return True


def _is_type(value: object, want: type) -> bool:
    if want is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if want is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, want)
