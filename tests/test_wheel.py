"""The package works installed (DESIGN.md, "Rules of the house"): a wheel of this repository,
installed (not editable) into a fresh virtual environment and used from a directory outside
the repository, renders every backend and runs the default job in docker.

The environment gets the wheel alone (``--no-deps``); its dependencies come from the test's own
environment through a ``.pth`` file naming that environment's site-packages. A path added that
way is not scanned for ``.pth`` files itself, so an editable install of torchjob there (its
finder is started by a ``.pth`` line) stays inert, and the repository is on no path.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.procs import ROOT, require_setup

# Every backend and variant `torchjob render --to` takes; the base names must be the registry's.
TARGETS = ["local", "docker", "slurm", "slurm:sbatch", "torchx", "torchx:local_cwd", "k8s",
           "k8s:trainjob"]
# What a build does not need from a checkout (caches, environments, earlier builds, outputs).
NOT_SOURCES = shutil.ignore_patterns(".git", ".venv", "venv", "build", "dist", "runs", "tests",
                                     "bench", "*.egg-info", "__pycache__", ".*_cache",
                                     ".hypothesis")
# Launcher variables the test process may have inherited; PYTHONPATH would name the repository.
UNSET = ("PYTHONPATH", "PYTHONDONTWRITEBYTECODE", "RANK", "LOCAL_RANK", "WORLD_SIZE",
         "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK")
SCRATCH_IMAGE = "localhost/torchjob:wheel-test"  # built by the installed package, then removed
IMPORT_ALL = """\
import json, sys
import torchjob.jobs, torchjob.jobs.cli, torchjob.trainer
from torchjob.jobs import backend
for name in backend.names():
    backend.get(name)
print(json.dumps({"names": backend.names(), "files": sorted(
    str(getattr(m, "__file__", None)) for m in list(sys.modules.values())
    if getattr(m, "__file__", None)), "path": sys.path}))
"""


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items()
            if k not in UNSET and not k.startswith(("SLURM_", "TORCHELASTIC_", "PET_"))}


def run(argv: list[str], cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, env=clean_env(), capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=timeout, check=False)


@dataclass(frozen=True)
class Installed:
    venv: Path
    site: Path  # the venv's site-packages, where the wheel went
    deps: list[Path]  # the test environment's site-packages, named by a .pth in ``site``
    version: str  # the wheel's
    build_log: str
    work: Path  # a directory outside the repository to run from

    def from_repository(self, path: str) -> bool:
        """``path`` (relative: to ``work``) is in the checkout, not in an environment kept
        inside it."""
        resolved = (self.work / path).resolve()
        return resolved.is_relative_to(ROOT) and not any(
            resolved.is_relative_to(d) for d in self.deps)

    @property
    def torchjob(self) -> str:
        return str(self.venv / "bin" / "torchjob")

    @property
    def python(self) -> str:
        return str(self.venv / "bin" / "python")

    def examples(self) -> Path:
        proc = run([self.python, "-c", "import torchjob.jobs.examples, os; "
                    "print(os.path.dirname(torchjob.jobs.examples.__file__))"], self.work)
        assert proc.returncode == 0, proc.stderr
        return Path(proc.stdout.strip())


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """A wheel built from a copy of the repository's sources (the build writes build/ and
    *.egg-info, which stay out of the checkout), installed into a venv without pip."""
    base = tmp_path_factory.mktemp("wheel")
    src, dist, venv, work = base / "src", base / "dist", base / "venv", base / "work"
    shutil.copytree(ROOT, src, ignore=NOT_SOURCES, symlinks=True)
    work.mkdir()
    build = run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                 "--verbose", "-w", str(dist), str(src)], work, timeout=300)
    assert build.returncode == 0, (build.stdout + build.stderr)[-3000:]
    wheel = next(dist.glob("torchjob-*.whl"))
    made = run([sys.executable, "-m", "venv", "--without-pip", str(venv)], work)
    assert made.returncode == 0, made.stderr
    # pip of this environment, working on the new one (the .pth below is not there yet, so
    # pip cannot see an installed torchjob outside it).
    install = run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"),
                   "install", "--no-deps", "--no-index", str(wheel)], work)
    assert install.returncode == 0, install.stdout + install.stderr
    site = Path(run([str(venv / "bin" / "python"), "-c",
                     "import sysconfig; print(sysconfig.get_path('purelib'))"],
                    work).stdout.strip())
    deps = sorted({Path(sysconfig.get_path(k)).resolve() for k in ("purelib", "platlib")})
    assert ROOT not in deps
    (site / "zz-test-dependencies.pth").write_text("".join(f"{d}\n" for d in deps))
    version = wheel.name.split("-")[1]
    return Installed(venv, site, deps, version, build.stdout + build.stderr, work)


def test_build_prints_no_setuptools_warnings(installed: Installed) -> None:
    """Our pyproject gives setuptools nothing to warn about (package lists, data globs,
    license); pip shows these only with --verbose, a user who asks sees none of ours."""
    warnings = [line.strip() for line in installed.build_log.splitlines()
                if re.search(r"Warning\b|^\s*warning:", line)]
    assert warnings == [], "\n".join(warnings)


def test_nothing_is_imported_from_the_repository(installed: Installed) -> None:
    proc = run([installed.python, "-c", IMPORT_ALL], installed.work)
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout)
    assert sorted(seen["names"]) == sorted({t.split(":")[0] for t in TARGETS})
    ours = [f for f in seen["files"] if f.startswith(str(installed.site))]
    assert str(installed.site / "torchjob" / "jobs" / "__init__.py") in ours
    assert str(installed.site / "torchjob" / "trainer" / "__init__.py") in ours
    assert [f for f in seen["files"] if installed.from_repository(f)] == []
    assert [p for p in seen["path"] if installed.from_repository(p)] == []


def test_the_kit_installs_one_top_level_name(installed: Installed) -> None:
    """torchjob and nothing else: a user's own trainer.py, jobs/, slurm/ or k8s/ is theirs."""
    top = installed.site
    ours = {line.split(",")[0].split("/")[0] for line in
            next(top.glob("torchjob-*.dist-info/RECORD")).read_text().splitlines()}
    assert {name for name in ours if not name.endswith(".dist-info")} <= {"torchjob", "..",
                                                                         "__pycache__"}, ours
    assert sorted(p.name for p in (top / "torchjob").iterdir()) == ["jobs", "k8s", "slurm",
                                                                     "trainer"]


def test_pyproject_lists_every_package() -> None:
    """pyproject.toml names the packages one by one (package-dir maps each folder under
    torchjob); a folder with code or data that it leaves out would be missing from the wheel."""
    import tomllib
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "packages"])
    found = set()
    for folder in ("trainer", "jobs", "slurm", "k8s"):
        for path in [ROOT / folder, *(ROOT / folder).rglob("*")]:
            if path.is_dir() and path.name != "__pycache__" and any(
                    f.is_file() and not f.name.endswith(".pyc") for f in path.iterdir()):
                found.add(".".join(["torchjob", *path.relative_to(ROOT).parts]))
    assert listed == found, f"pyproject.toml's packages differ: missing " \
        f"{sorted(found - listed)}, not a folder {sorted(listed - found)}"


def test_version_and_render_every_backend(installed: Installed) -> None:
    version = run([installed.torchjob, "--version"], installed.work)
    assert version.returncode == 0, version.stderr
    assert version.stdout.strip() == f"torchjob {installed.version}"
    spec = installed.examples() / "default.yaml"
    assert spec.is_relative_to(installed.site)
    for target in TARGETS:
        proc = run([installed.torchjob, "render", "--to", target, str(spec)], installed.work)
        assert proc.returncode == 0, f"render --to {target}: {proc.stderr}"
        assert proc.stdout.strip(), f"render --to {target} printed nothing"


@pytest.mark.integration
@pytest.mark.containers
def test_installed_package_builds_the_image_and_runs_the_default_job_in_docker(
        installed: Installed) -> None:
    """The image is missing (a scratch tag): the installed package builds it from the
    Dockerfile and container-setup it carries (podman's layer cache makes that quick when
    the repository's image is there), then runs the default job, one epoch."""
    setup = ["bash", str(ROOT / "scripts" / "container-setup")]
    for step in ("engine", "base"):
        require_setup([*setup, step], timeout=1800, what=f"scripts/container-setup {step}")
    subprocess.run(["podman", "rmi", "-f", SCRATCH_IMAGE], capture_output=True, check=False)
    spec = installed.examples() / "default.yaml"
    try:
        proc = run([installed.torchjob, "run", "--to", "docker", str(spec), "--set",
                    "trainer.args.epochs=1", "--set", f"image={SCRATCH_IMAGE}"],
                   installed.work, timeout=1800)
    finally:
        subprocess.run(["podman", "rmi", SCRATCH_IMAGE], capture_output=True, check=False)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]
    assert f"image {SCRATCH_IMAGE} is missing; building it" in output
    summary = json.loads((installed.work / "runs" / "digits" / "summary.json").read_text())
    assert summary["world_size"] == 2
