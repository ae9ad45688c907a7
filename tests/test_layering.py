"""The architecture, guarded: the trainer image needs trainer/ alone, and renderers do no I/O."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAUNCHER_SIDE = {"jobs", "k8s", "slurm"}
# modules a pure renderer may not import: processes, network, clocks, environment
IO_MODULES = {"subprocess", "socket", "time", "urllib", "http", "requests", "shutil",
              "kubernetes", "submitit", "multiprocessing", "asyncio", "datetime", "random"}
RENDERERS = [ROOT / "jobs" / "local.py", ROOT / "jobs" / "command.py", ROOT / "slurm" / "sbatch.py",
             ROOT / "k8s" / "pytorchjob.py", ROOT / "k8s" / "trainjob.py"]


def imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


def test_trainer_imports_nothing_from_the_launcher_side() -> None:
    files = sorted((ROOT / "trainer").rglob("*.py"))
    assert files
    for path in files:
        bad = imported_roots(path) & LAUNCHER_SIDE
        assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


def test_renderers_do_no_io() -> None:
    for path in RENDERERS:
        assert path.exists(), path
        bad = imported_roots(path) & IO_MODULES
        assert not bad, f"{path.relative_to(ROOT)} (a pure renderer) imports {sorted(bad)}"
        tree = ast.parse(path.read_text())
        calls = {n.func.attr for n in ast.walk(tree)
                 if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)}
        names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        assert not calls & {"getenv", "system", "popen", "urlopen"}, path
        assert not names & {"open", "environ"}, f"{path.relative_to(ROOT)} reads files or env"
