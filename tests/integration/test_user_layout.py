"""Any project layout works: a user's own ``trainer.py``, ``jobs/``, ``slurm.py`` and ``k8s/``
next to their script neither break the kit nor are replaced by it. The kit's packages are
``torchjob.trainer``, ``torchjob.jobs``, ``torchjob.slurm`` and ``torchjob.k8s`` (one top-level
name), so the user's ``import trainer`` is theirs and the kit's ``python -m torchjob.trainer.agent``
is the kit's, whichever directory the job starts in.

Real processes: ``torchjob run`` (two workers over gloo) from the user's project directory, with
no PYTHONPATH (the kit found as a user's install finds it, not through this repository)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.procs import env_for_tests, torchjob

pytestmark = pytest.mark.integration
KIT_NAMES = ("trainer", "jobs", "slurm", "k8s")

# Each of the user's modules notes who imported it: only the user's own script may.
NOTE = """\
import os, sys
WHO = "user"
top = os.path.dirname(os.path.abspath(__file__))
top = os.path.dirname(top) if __file__.endswith("__init__.py") else top
with open(os.path.join(top, "imported-by"), "a") as f:
    f.write(os.path.basename(sys.argv[0]) + "\\n")
"""
TRAIN = """\
import json, os, sys
import torch, torch.distributed as dist
import trainer, jobs, slurm, k8s
here = os.path.dirname(os.path.abspath(__file__))
found = {m.__name__: m.WHO for m in (trainer, jobs, slurm, k8s)}
files = {m.__name__: os.path.abspath(m.__file__).startswith(here) for m in (trainer, jobs, slurm, k8s)}
dist.init_process_group("gloo")
total = torch.ones(1)
dist.all_reduce(total)
os.chdir(os.path.join(here, f"elsewhere-{dist.get_rank()}"))  # as Hydra's job.chdir does
with open(os.path.join(os.environ["TORCHJOB_RUN_DIR"], f"seen-{dist.get_rank()}.json"), "w") as f:
    json.dump({"who": found, "mine": files, "sum": total.item(), "argv": sys.argv[1:],
               "file": __file__, "argv0": sys.argv[0]}, f)
dist.destroy_process_group()
"""


def project(folder: Path) -> Path:
    """A user's project whose module names are the kit's folder names."""
    folder.mkdir()
    (folder / "trainer.py").write_text(NOTE)
    (folder / "slurm.py").write_text(NOTE)
    for package in ("jobs", "k8s"):
        (folder / package).mkdir()
        (folder / package / "__init__.py").write_text(NOTE)
    (folder / "train.py").write_text(TRAIN)
    for rank in (0, 1):  # where the script moves to: the kit's directories still lead home
        (folder / f"elsewhere-{rank}").mkdir()
    return folder


def as_installed() -> dict[str, str]:
    """The test environment without PYTHONPATH: the kit as installed; this repository is not on
    the path."""
    env = env_for_tests()
    del env["PYTHONPATH"]
    return env


def test_a_users_trainer_py_and_packages_next_to_the_script(tmp_path: Path) -> None:
    folder = project(tmp_path / "project")
    # torchrun's form, no YAML: torchjob run [OPTIONS] SCRIPT.py [ARGS...]
    proc = torchjob("run", "--nproc-per-node", "2", "train.py", "a", "--b=1", cwd=folder,
                    env=as_installed(), timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for rank in (0, 1):
        seen = json.loads((folder / "runs" / "train" / f"seen-{rank}.json").read_text())
        assert seen == {"who": dict.fromkeys(KIT_NAMES, "user"),
                        "mine": dict.fromkeys(KIT_NAMES, True),
                        "sum": 2.0, "argv": ["a", "--b=1"], "argv0": "train.py",
                        # absolute, as under python and torchrun; argv[0] as given
                        "file": str(folder.resolve() / "train.py")}
    # the user's modules were imported by their script alone (4 modules x 2 ranks), never by
    # the kit's agent, store or launcher
    assert (folder / "imported-by").read_text().split() == ["train.py"] * 8


def test_the_builtin_trainer_from_a_project_with_those_names(tmp_path: Path) -> None:
    folder = project(tmp_path / "project")
    proc = torchjob("run", str(Path(__file__).parents[2] / "jobs/examples/default.yaml"),
                    "--set", "trainer.args.epochs=1", "--set", "run_dir=runs/builtin",
                    cwd=folder, env=as_installed(), timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((folder / "runs" / "builtin" / "summary.json").read_text())
    assert summary["world_size"] == 2
    assert not (folder / "imported-by").exists()  # the kit imported none of the user's modules
