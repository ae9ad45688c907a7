"""Hostile job specs through ``torchjob render --to`` every registered backend, in-process.

Two properties, each example bounded in time (a hang fails it):
1. Whatever the spec (wrong types, huge sizes, alias-like repetition, shell and YAML
   metacharacters, NUL, non-ASCII), every backend exits 0 or 2, and a 2 is one line on stderr,
   never a traceback.
2. A well-typed spec whose free strings are hostile either is refused (2) or renders (0) such
   that the node's process gets every user string unchanged: argv word for word and env value
   for value, after every expansion on the way (tests/jobs/arrival.py runs the shell lines in
   bash with harmless stubs, so a value that escapes its quoting would run a marker command).
"""

from __future__ import annotations

import io
import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from torchjob.jobs import backend as registry
from torchjob.jobs.backend import Context
from torchjob.jobs.cli import main
from torchjob.jobs.command import entry_args
from torchjob.jobs.load import load
from torchjob.jobs.values import MAX_TOTAL_BYTES, MAX_VALUE_BYTES
from tests.jobs.arrival import MARKER, arrival
from tests.jobs.test_jobs_fuzz import shaped
from torchjob.jobs.spec import JobSpec
from torchjob.k8s.validate import cel
from torchjob.trainer.contract import RUN_DIR_ENV, RUN_DIR_OPTION

# celpy raises the recursion limit when its environment is built: build it before hypothesis
# runs, which otherwise warns that the limit changed inside a test and will not be reset
cel.environment()

# Every registered backend family with the variants tested here (a new family fails
# test_every_registered_backend_is_covered until it is added).
BACKENDS = {"local": [""], "docker": [""], "slurm": ["", "sbatch"],
            "torchx": ["", "local_cwd", "slurm", "kubernetes"], "k8s": ["", "trainjob"]}
NAMES = [f"{family}:{variant}" if variant else family
         for family, variants in BACKENDS.items() for variant in variants]
EXAMPLE_S = 20  # one example, every backend: a hang ends here
HOSTILE = ["a'; echo x", f"$(touch {MARKER})", f"`touch {MARKER}`", "$$", "${app_id}",
           "$app_id", "$(HOME)", "${X}", "$$(X)", "${TORCHJOB_HOST_DIR:-.}", "${X:-y}",
           f"x\ntouch {MARKER}", f"'\"; touch {MARKER}; #", "\\", "%j %u %%", "a,b", "-x",
           f"--flag=$(touch {MARKER})", "!!", "*", "~", "caf\u00e9 \u65e5\u672c \U0001f600",
           "two words", "tab\there", "", " ", "key: value", "- item", "{a: 1}", "null", "yes",
           "1e3", "0x10", "&a", "*a", "!!binary", "# not a comment", "\r", "$", "$1", "$@"]
text = st.one_of(st.sampled_from(HOSTILE), st.text(max_size=12),
                 st.lists(st.sampled_from(HOSTILE), max_size=3).map("".join))
HUGE = ["x" * (MAX_VALUE_BYTES + 1), "y" * (MAX_TOTAL_BYTES + 1), "a\0b", "\ud800", "9" * 40,
        999999, 2**63, -1, 1e308, float("nan"), "/etc", "//etc/", "/usr/../etc", "/"]


@contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Fail (TimeoutError) instead of hanging: SIGALRM interrupts even a blocking open()."""
    def expire(signum: int, frame: object) -> None:
        raise TimeoutError(f"no answer within {seconds} s")
    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def cli(*argv: str) -> tuple[int, str]:
    """``torchjob ARGV`` in this process: (exit code, stderr)."""
    err = io.StringIO()
    with redirect_stdout(io.StringIO()), redirect_stderr(err):
        code = main(list(argv))
    return code, err.getvalue()


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Where the renders run: TorchX's Kubernetes scheduler needs its queue from here."""
    path = tmp_path_factory.mktemp("hostile")
    (path / ".torchxconfig").write_text("[kubernetes]\nqueue = default\n")
    (path / "tool.py").write_text("")  # the jobs' module: shipped to the image backends
    here = os.getcwd()
    os.chdir(path)
    try:
        yield path
    finally:
        os.chdir(here)


def render_everywhere(raw: Any, workdir: Path) -> dict[str, int]:
    """The spec as a file, rendered by every backend: {backend: exit code}, each 0 or 2."""
    try:
        text = yaml.safe_dump(raw, allow_unicode=True)
    except (yaml.YAMLError, UnicodeEncodeError):
        text = repr(raw)
    (workdir / "job.yaml").write_text(text, encoding="utf-8", errors="surrogatepass")
    codes = {}
    with time_limit(EXAMPLE_S):
        for name in NAMES:
            code, err = cli("render", "--to", name, "job.yaml")
            assert code in (0, 2), (name, code, err)
            if code == 2:
                assert err.startswith("torchjob: ") and err.count("\n") == 1, (name, err)
            codes[name] = code
    assert not (workdir / MARKER).exists()
    return codes


def test_every_registered_backend_is_covered() -> None:
    assert sorted(BACKENDS) == registry.names()
    for name in NAMES:
        assert registry.get(name).name == name


wild = st.one_of(shaped(JobSpec), st.fixed_dictionaries({}, optional={
    "nnodes": st.sampled_from(HUGE + [1, "1:2", "1:5000", 64, 65]),
    "nproc_per_node": st.sampled_from(HUGE + [256, 257]),
    "env": st.dictionaries(st.sampled_from(["A", "B", "1X", "A B", "PATH", "RANK"]),
                           st.sampled_from(HUGE) | text, max_size=3),
    "run_dir": st.sampled_from(HUGE) | text, "checkpoint_dir": st.sampled_from(HUGE) | text,
    "mounts": st.lists(st.fixed_dictionaries({"source": st.sampled_from(HUGE) | text,
                                              "target": st.sampled_from(["/data", "/x"])}),
                       max_size=2),
    "trainer": st.fixed_dictionaries({"module": st.just("tool")}, optional={
        "args": st.lists(st.sampled_from(HUGE) | text, max_size=4)}),
    "slurm": st.fixed_dictionaries({}, optional={
        "container": st.sampled_from(["none", "pyxis", "apptainer"]),
        "partition": st.sampled_from(HUGE) | text}),
})).map(lambda d: {"name": "x", **d})


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(wild)
def test_every_backend_exits_0_or_2(workdir: Path, raw: dict[str, Any]) -> None:
    render_everywhere(raw, workdir)


def _path(parts: list[str]) -> str:
    return "/".join(["runs", *parts])


component = (st.sampled_from(HOSTILE) | st.text(max_size=8)).filter(
    lambda c: c.strip() not in ("", ".", "..") and "/" not in c and c.isprintable())
relative = st.lists(component, min_size=1, max_size=2).map(_path)
typed = st.fixed_dictionaries({
    "name": st.just("x"),
    "nnodes": st.sampled_from([1, 2, "1:2"]),
    "trainer": st.one_of(
        st.fixed_dictionaries({"module": st.just("tool"), "args": st.lists(text, max_size=4)}),
        st.fixed_dictionaries({"script": relative.map(lambda p: p + ".py"),
                               "args": st.dictionaries(st.sampled_from(["a", "lr", "b-c"]),
                                                       text, max_size=3)})),
    "env": st.dictionaries(st.sampled_from(["A", "B_2", "HOSTILE", "X"]), text, max_size=3),
}, optional={"run_dir": relative, "checkpoint_dir": relative})


def received(spec: JobSpec, name: str, workdir: Path) -> None:
    """The node's process gets the user's strings unchanged from backend ``name``."""
    context = Context(run_id="x", python="python", workdir=str(workdir))
    argv, env = arrival(registry.get(name).render(spec, context), workdir)
    tail = [*spec.trainer.entry, *entry_args(spec)]
    assert argv[-len(tail):] == tail, (name, argv, tail)
    run_dir = argv[argv.index(RUN_DIR_OPTION) + 1] if RUN_DIR_OPTION in argv \
        else env[RUN_DIR_ENV]
    assert run_dir == spec.run_dir, name
    assert {key: env.get(key) for key in spec.env} == dict(spec.env), name


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(typed)
def test_hostile_strings_arrive_unchanged_or_are_refused(workdir: Path,
                                                         raw: dict[str, Any]) -> None:
    codes = render_everywhere(raw, workdir)
    if set(codes.values()) == {2}:
        return
    spec = load(workdir / "job.yaml")
    with time_limit(EXAMPLE_S):
        for name, code in codes.items():
            if code == 0:
                received(spec, name, workdir)
