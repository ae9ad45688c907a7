"""Value types and checks of the job spec: node ranges, quantities, names, the error type.

Each parser takes the raw YAML value and the field path and returns a typed value or raises
``SpecError`` naming the path, the value and the fix. ``jobs.load`` calls them; nothing here
reads files or the environment.
"""

from __future__ import annotations

import posixpath
import re
import reprlib
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any, Callable, TypeVar

from torchjob.trainer.contract import CHECKPOINT_DIR_ENV, RUN_DIR_ENV

K = TypeVar("K")
V = TypeVar("V")
Check = Callable[[Any, str], None]  # (typed value, field path) -> None, or a SpecError

_repr = reprlib.Repr()
_repr.maxstring = 80
_repr.maxother = 80
_repr.maxlevel = 3


def show(value: object) -> str:
    """A short repr of a user value for error messages (bounded even for huge inputs)."""
    return _repr.repr(value)


def _printable(text: str) -> str:
    """Control characters escaped (a YAML key may hold a newline; the error stays one line)."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


class UserError(Exception):
    """A user's mistake outside the spec (a backend, scheduler or handle that cannot be used):
    the command line prints it as one line and exits 2."""


class SpecError(ValueError):
    """A bad job spec. ``str()`` is the one line the command line prints before exiting 2."""

    def __init__(self, path: str, message: str, source: str = "") -> None:
        one_line = re.sub(r"\s*[\r\n]+\s*", " ", message)  # e.g. PyYAML's multi-line errors
        self.path, self.message, self.source = _printable(path), one_line, _printable(source)
        super().__init__(str(self))

    def __str__(self) -> str:
        where = f"{self.path}: " if self.path else ""
        return f"{self.source}: {where}{self.message}" if self.source else f"{where}{self.message}"

    def __reduce__(self) -> tuple[type, tuple[str, str, str]]:
        return (type(self), (self.path, self.message, self.source))

    def within(self, prefix: str) -> SpecError:
        """The same error seen from a parent section: ``prefix.path``."""
        path = f"{prefix}.{self.path}" if prefix and self.path else prefix or self.path
        return SpecError(path, self.message, self.source)

    def sourced(self, source: str) -> SpecError:
        return SpecError(self.path, self.message, source)


def bad(path: str, value: object, problem: str) -> SpecError:
    """``path: 'value' problem`` -- problem says what is wrong and, in parentheses, the fix."""
    return SpecError(path, f"{show(value)} {problem}")


def kind(value: object) -> str:
    """What a YAML value is, in YAML words: 'a string', 'a list', ..."""
    names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
             list: "a list", dict: "a mapping", type(None): "empty (null)"}
    # in order, bool before int; a subclass (the loader's Words) by its base
    return next((name for t, name in names.items() if isinstance(value, t)),
                f"a {type(value).__name__}")


class FrozenMap(dict[K, V]):
    """A read-only, hashable dict: the spec's mappings (env, trainer args) stay frozen."""

    def _readonly(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError("job spec mappings are read-only; use dataclasses.replace")

    __setitem__ = __delitem__ = update = pop = popitem = clear = setdefault = _readonly
    __ior__ = _readonly

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(frozenset(self.items()))

    def __repr__(self) -> str:
        return f"FrozenMap({dict.__repr__(self)})"

    def __reduce__(self) -> tuple[type, tuple[dict[K, V]]]:  # copy/pickle without __setitem__
        return (type(self), (dict(self),))


# The kit's image (Dockerfile): its working directory, where a relative run_dir lands, and its
# user, who must be able to write the run directory a container backend mounts from the host
IMAGE_WORKDIR = "/workspace"
IMAGE_UID = 1000


# ------------------------------------------------------------------------------- bounds

KiB = 1024
# One environment value or command-line word. Linux passes at most 128 KiB in one argument or
# variable (MAX_ARG_STRLEN); a value a quarter of that still fits after quoting.
MAX_VALUE_BYTES = 32 * KiB
# All of env, or all of trainer.args, together: TorchX runs the node command as one
# ``bash -c`` argument and its Slurm scheduler passes env as one ``srun --export`` argument.
MAX_TOTAL_BYTES = 64 * KiB
MAX_PATH_BYTES = 4096  # Linux PATH_MAX: run_dir, checkpoint_dir, a script, a mount's paths
# Nodes of one job: the largest training runs use some 2,000 nodes, and Kubernetes supports
# 5,000 nodes per cluster; beyond this a rendered request only grows (nnodes: 999999 once
# made a 375 MB dry run).
MAX_NNODES = 4096


def size(text: str) -> int:
    """Bytes of ``text`` in UTF-8 (what a command line, a file or the environment holds)."""
    return len(text.encode("utf-8", "surrogatepass"))


def at_most_bytes(limit: int, what: str) -> Check:
    """A check that a string holds no NUL and is at most ``limit`` bytes (``what`` says why)."""
    def check(value: Any, path: str) -> None:
        if value is None:
            return
        if "\0" in value:
            raise bad(path, value, "contains a NUL character, which no command line, "
                      "environment or file name carries: remove it")
        if size(value) > limit:
            raise bad(path, value, f"is {size(value)} bytes, more than {limit} bytes {what}: "
                      "shorten it (put large data in a file and pass its path)")
    return check


# ----------------------------------------------------------------------------- node range

_NNODES = re.compile(r"([0-9]+)(?::([0-9]+))?")
_NNODES_FIX = "(write N or MIN:MAX, e.g. 2 or 1:4)"
_COUNT_DIGITS = 18  # a count longer than this is too large whatever it says: int() never reads it


def _too_many(path: str, value: object) -> SpecError:
    return bad(path, value, f"asks for more than {MAX_NNODES} nodes, the most torchjob renders "
               "a job for (MAX_NNODES; the largest clusters have a few thousand): write a "
               "smaller count")


@dataclass(frozen=True)
class Nnodes:
    """torchrun's ``--nnodes``: a fixed count N, or an elastic range MIN:MAX."""

    min: int
    max: int

    def __post_init__(self) -> None:
        if not 1 <= self.min <= self.max:
            raise bad("nnodes", str(self), f"is not a node range: need 1 <= MIN <= MAX "
                      f"{_NNODES_FIX}")
        if self.max > MAX_NNODES:
            raise _too_many("nnodes", str(self))

    def __str__(self) -> str:
        return str(self.min) if self.min == self.max else f"{self.min}:{self.max}"

    @property
    def is_elastic(self) -> bool:
        return self.min != self.max

    @classmethod
    def parse(cls, raw: object, path: str) -> Nnodes:
        if isinstance(raw, bool) or not isinstance(raw, (int, str)):
            raise bad(path, raw, f"is {kind(raw)}, not a node count {_NNODES_FIX}")
        match = _NNODES.fullmatch(str(raw).strip())
        if not match:
            raise bad(path, raw, f"is not a node count {_NNODES_FIX}")
        if any(len(part.lstrip("0")) > _COUNT_DIGITS for part in match.groups("")):
            raise _too_many(path, raw)
        low = int(match[1])
        high = int(match[2]) if match[2] is not None else low
        if low < 1:
            raise bad(path, raw, f"is not a node range: MIN must be >= 1 {_NNODES_FIX}")
        if low > high:
            raise bad(path, raw, f"is not a node range: MIN must be <= MAX {_NNODES_FIX}")
        return cls(low, high)


# ------------------------------------------------------------------------------ quantity

_QUANTITY = re.compile(r"([0-9]{1,15}(?:\.[0-9]{1,9})?)(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?")
_UNITS = {None: 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15,
          "E": 10**18, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50,
          "Ei": 2**60}
_QUANTITY_FIX = "(write a Kubernetes quantity such as 512Mi, 4Gi, 1G or plain bytes)"


@dataclass(frozen=True)
class Quantity:
    """A Kubernetes byte quantity (``512Mi``, ``4Gi``, ``1G``, ``1073741824``), kept as written."""

    text: str
    bytes: int

    def __str__(self) -> str:
        return self.text

    @property
    def mib(self) -> int:
        """Whole MiB, rounded up (what ``docker --shm-size`` and Slurm ``--mem`` take)."""
        return -(-self.bytes // 2**20)

    @classmethod
    def parse(cls, raw: object, path: str) -> Quantity:
        if isinstance(raw, bool) or not isinstance(raw, (int, str)):
            raise bad(path, raw, f"is {kind(raw)}, not a byte quantity {_QUANTITY_FIX}")
        match = _QUANTITY.fullmatch(str(raw).strip())
        if not match:
            raise bad(path, raw, f"is not a byte quantity {_QUANTITY_FIX}")
        try:
            size = int(Decimal(match[1]) * _UNITS[match[2]])
        except InvalidOperation:  # pragma: no cover - the pattern admits only decimals
            raise bad(path, raw, f"is not a byte quantity {_QUANTITY_FIX}") from None
        if size < 1:
            raise bad(path, raw, f"is not a positive size {_QUANTITY_FIX}")
        return cls(str(raw).strip(), size)


# ------------------------------------------------------------------------- name checks

# Kubernetes names (k8s.io/apimachinery pkg/util/validation), for the spec and the k8s backend:
# a DNS-1123 label (a namespace), a DNS-1035 label (a label starting with a letter: a Service's
# name), a DNS-1123 subdomain (most objects' names), and a qualified name (a label or annotation
# key: an optional subdomain prefix and '/', then a name part, as a non-empty label value is).
DNS_LABEL_MAX = 63  # characters; also a qualified name's name part's and a label value's limit
DNS_SUBDOMAIN_MAX = 253
DNS_1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
DNS_1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
DNS_1123_SUBDOMAIN = re.compile(rf"{DNS_1123_LABEL.pattern}(\.{DNS_1123_LABEL.pattern})*")
QUALIFIED_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")  # the name part
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
SECRET_KEY = re.compile(r"[-._a-zA-Z0-9]+")
SLURM_TIME = re.compile(r"(?:([0-9]{1,3})-)?([0-9]{1,3}):([0-5][0-9]):([0-5][0-9])")
# Set by torchrun (or the operators) for each worker; a job spec must not override them.
LAUNCHER_ENV = frozenset({"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                          "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"})


def pattern(regex: re.Pattern[str], what: str, example: str, max_len: int = 253) -> Check:
    """A check that a string fully matches ``regex`` and is at most ``max_len`` long."""
    def check(value: Any, path: str) -> None:
        if len(value) > max_len or not regex.fullmatch(value):
            raise bad(path, value, f"is not {what}, at most {max_len} characters "
                      f"(e.g. {example})")
    return check


def subdomain_problem(value: str) -> str | None:
    """Why ``value`` is not a DNS-1123 subdomain; None when it is."""
    if len(value) > DNS_SUBDOMAIN_MAX:
        return f"must be no more than {DNS_SUBDOMAIN_MAX} characters"
    if not DNS_1123_SUBDOMAIN.fullmatch(value):
        return ("must be a lowercase RFC 1123 subdomain: lower case letters, digits, '-' and "
                "'.', starting and ending with a letter or digit")
    return None


def qualified_name_problem(key: str) -> str | None:
    """Why ``key`` is not a qualified name (``[prefix/]name``: a label or annotation key);
    None when it is."""
    prefix, slash, name = key.rpartition("/")
    if slash and not prefix:
        return "the prefix before '/' must not be empty"
    if slash and prefix.count("/"):
        return "may hold at most one '/'"
    if slash and subdomain_problem(prefix):
        return f"prefix {prefix!r} {subdomain_problem(prefix)}"
    if not name:
        return "the name part must not be empty"
    if len(name) > DNS_LABEL_MAX:
        return f"the name part must be no more than {DNS_LABEL_MAX} characters"
    if not QUALIFIED_NAME.fullmatch(name):
        return ("the name part must be letters, digits, '-', '_' or '.', starting and ending "
                "with a letter or digit")
    return None


def at_least(low: float) -> Check:
    def check(value: Any, path: str) -> None:
        if value is not None and value < low:
            raise bad(path, value, f"is too small: must be >= {low:g}")
    return check


def positive(value: Any, path: str) -> None:
    if value is not None and not value > 0:
        raise bad(path, value, "must be > 0 (e.g. 2 or 0.5)")


def between(low: int, high: int) -> Check:
    def check(value: Any, path: str) -> None:
        if not low <= value <= high:
            raise bad(path, value, f"is out of range: must be between {low} and {high}")
    return check


_one_value = at_most_bytes(MAX_VALUE_BYTES, "(MAX_VALUE_BYTES)")


def one_line(value: Any, path: str) -> None:
    """Free text that ends up in a script directive or a flag: no control characters."""
    if value is not None and (not value or any(ord(c) < 32 or c == "\x7f" for c in value)):
        raise bad(path, value, "must be a non-empty single line without control characters")
    _one_value(value, path)


_a_path = at_most_bytes(MAX_PATH_BYTES, "(PATH_MAX, MAX_PATH_BYTES)")


def path_line(value: Any, path: str) -> None:
    """A file system path: one line, at most PATH_MAX bytes."""
    one_line(value, path)
    _a_path(value, path)


# A machine's system directories: no job writes into one (run_dir, checkpoint_dir) or
# bind-mounts one (docker, Slurm containers, TorchX bind mounts: as root a container could
# overwrite the host's system), and no mount hides one inside a container. /lib* too.
SYSTEM_DIRS = frozenset({"/", "/etc", "/usr", "/bin", "/sbin", "/boot", "/dev", "/proc",
                         "/sys", "/var", "/run", "/root"})
_LIB = re.compile(r"/lib[^/]*")


def system_dir(path: str, workdir: str | None = None) -> str | None:
    """The system directory ``path`` names once normalised (``/etc/``, ``//etc``,
    ``/usr/../etc``), else None; a relative path counts from ``workdir`` when it is given."""
    if not path.startswith("/"):
        if workdir is None or not workdir.startswith("/"):
            return None
        path = posixpath.join(workdir, path)
    norm = posixpath.normpath("/" + path.lstrip("/"))
    return norm if norm in SYSTEM_DIRS or _LIB.fullmatch(norm) else None


def env_name(name: object, path: str) -> None:
    if not isinstance(name, str) or len(name) > 253 or not ENV_NAME.fullmatch(name):
        raise bad(path, name, "is not an environment variable name (letters, digits and _, "
                  "not starting with a digit, e.g. HF_TOKEN)")
    if name in LAUNCHER_ENV or name.startswith("TORCHELASTIC_"):
        raise bad(path, name, "is set by the launcher for each worker; choose another name")
    if name in (RUN_DIR_ENV, CHECKPOINT_DIR_ENV):
        raise bad(path, name, "is set by torchjob for each worker from run_dir and "
                  "checkpoint_dir: set those at the top level of the job spec instead")


def scalar_text(value: object) -> str:
    """How a scalar reaches a command line or the environment: bools as true/false."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


_env_value = at_most_bytes(MAX_VALUE_BYTES, "per environment value (MAX_VALUE_BYTES)")


def env_check(env: Any, path: str) -> None:
    """Names that are environment variable names; values without NUL, each and all together
    bounded (MAX_VALUE_BYTES, MAX_TOTAL_BYTES)."""
    total = 0
    for name, value in env.items():
        env_name(name, f"{path}.{name}")
        if not isinstance(value, str):
            raise bad(f"{path}.{name}", value, f"is {kind(value)}, but an environment value "
                      "is a string")
        _env_value(value, f"{path}.{name}")
        total += size(name) + size(value)
    if total > MAX_TOTAL_BYTES:
        raise SpecError(path, f"holds {total} bytes of names and values, more than "
                        f"{MAX_TOTAL_BYTES} bytes (MAX_TOTAL_BYTES, what one command line "
                        "carries): put large data in a file and pass its path")


def env_map(raw: object, path: str) -> FrozenMap[str, str]:
    """``env:`` -- names checked, scalar values stringified, lists and mappings refused."""
    if not isinstance(raw, dict):
        raise bad(path, raw, f"is {kind(raw)}, but a mapping NAME: value is expected")
    out: dict[str, str] = {}
    for name, value in raw.items():
        env_name(name, f"{path}.{name}")
        if value is None or not isinstance(value, (str, int, float, bool)):
            raise bad(f"{path}.{name}", value, f"is {kind(value)}, but an environment value "
                      "is a string or number (quote it; write '' for empty)")
        out[name] = scalar_text(value)
    env_check(out, path)
    return FrozenMap(out)


def slurm_time(raw: object, path: str) -> str | None:
    """Slurm ``--time``: minutes (int) or ``[D-]HH:MM:SS``; kept in Slurm's own spelling."""
    if raw is None:
        return None
    text = str(raw).strip() if isinstance(raw, (int, str)) and not isinstance(raw, bool) else ""
    if text.isascii() and text.isdigit() and 0 < len(text) < 8 and int(text) > 0:
        return str(int(text))
    match = SLURM_TIME.fullmatch(text)
    if match and any(int(part or 0) for part in match.groups()):
        return text
    raise bad(path, raw, "is not a Slurm time limit (write minutes, e.g. 90, or "
              "'HH:MM:SS', e.g. '12:00:00', quoted)")


# ------------------------------------------------------------------------- secrets

# A literal env value whose NAME ends in one of these words (after the last '_': HF_TOKEN,
# WANDB_API_KEY, AWS_SECRET_ACCESS_KEY, DB_PASSWORD) is refused on Kubernetes, where a
# manifest is readable by anyone who may read the job: use secrets: (secretKeyRef), or
# name the variable in k8s.allow_literal_env when its value is not a secret.
SECRET_NAME_ENDS = frozenset({"KEY", "APIKEY", "SECRET", "TOKEN", "PASSWORD", "PASSWD"})


def secret_like_name(name: str) -> bool:
    """Whether ``name`` reads as a secret's (its last ``_`` word is in SECRET_NAME_ENDS):
    ``HF_TOKEN`` yes, ``TOKEN_BUDGET`` and ``MAX_TOKENS`` no."""
    return name.upper().rsplit("_", 1)[-1] in SECRET_NAME_ENDS


def label_key(value: Any, path: str) -> None:
    """A node label's key, as Kueue's topology levels are."""
    if not isinstance(value, str) or qualified_name_problem(value):
        raise bad(path, value, "is not a node label key (an optional DNS prefix and '/', then "
                  f"at most {DNS_LABEL_MAX} letters, digits, '-', '_', '.', e.g. "
                  "cloud.provider.com/topology-rack)")
