"""The architecture, guarded (DESIGN.md, "Layers"): imports only point down, no module or
layer imports in a cycle, a backend never imports another backend, the trainer image needs
trainer/ alone, and renderers do no I/O.

Layers, lowest first: the trainer; the core (spec, loading, the shared semantics, the Backend
protocol and registry); the backends, each its own component; the command line. Every import
counts, also those inside functions.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("trainer", "jobs", "k8s", "slurm")  # folders; installed as torchjob.trainer, ...
CORE = {"torchjob.jobs"} | {f"torchjob.jobs.{m}" for m in (
    "spec", "checks", "trainer_args", "load", "values", "command", "hosts", "backend", "sweep",
    "examples", "runs", "launcher", "preflight", "workspace", "stops", "timeouts", "report",
    "report_setup", "charts", "progress", "images")}
# the edge: the command line and the Python API it is a thin layer over (torchjob.jobs.api)
CLI = {"torchjob.jobs.cli", "torchjob.jobs.__main__", "torchjob.jobs.invocation",
       "torchjob.jobs.parser", "torchjob.jobs.api"}
BACKENDS = {"torchjob.jobs.backends.local": "local", "torchjob.jobs.backends.docker": "docker",
            "torchjob.jobs.backends.torchx": "torchx",
            "torchjob.jobs.backends": "backends", "torchjob.slurm": "slurm",
            "torchjob.k8s": "k8s"}
LEVEL = {"trainer": 0, "core": 1, "cli": 3}  # every backend is level 2
# modules a pure renderer may not import: processes, network, clocks, environment
IO_MODULES = {"subprocess", "socket", "time", "urllib", "http", "requests", "shutil",
              "kubernetes", "submitit", "multiprocessing", "asyncio", "datetime", "random", "os"}
# no paths either (validation and the manifests command read files; these do not)
NO_PATHS = {"k8s/pytorchjob.py", "k8s/trainjob.py", "k8s/pod.py"}
RENDERERS = ["jobs/command.py", "jobs/hosts.py", "jobs/sweep.py",
             "jobs/backends/local/render.py", "jobs/backends/docker/render.py",
             "jobs/backends/torchx/render.py",
             "slurm/sbatch.py", "k8s/pytorchjob.py", "k8s/trainjob.py", "k8s/pod.py"]


def modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(["torchjob", *parts])] = path
    return out


def imports(path: Path, name: str, known: dict[str, Path]) -> Iterator[str]:
    """The project modules ``path`` imports (relative imports resolved)."""
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = name.split(".")[: len(name.split(".")) - node.level + is_package]
                base = ".".join(parent + ([base] if base else []))
            targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                yield target


def component(module: str) -> str:
    if module.split(".")[1] == "trainer" or module.startswith("torchjob.jobs.examples."):
        return "trainer"  # the trainer and example user scripts: what runs inside the job
    if module in CLI:
        return "cli"
    if module in CORE:
        return "core"
    for prefix, backend in sorted(BACKENDS.items(), key=lambda kv: -len(kv[0])):
        if module == prefix or module.startswith(prefix + "."):
            return f"backend:{backend}"
    raise AssertionError(f"{module}: which layer is it in? add it to tests/test_layering.py")


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: set(imports(path, name, known)) for name, path in known.items()}


def test_every_module_has_a_layer() -> None:
    for name in modules():
        component(name)


def test_imports_point_down_and_backends_stay_apart() -> None:
    bad = []
    for module, targets in graph().items():
        mine = component(module)
        for target in targets:
            theirs = component(target)
            if mine == theirs:
                continue
            down = LEVEL.get(theirs.split(":")[0], 2) < LEVEL.get(mine.split(":")[0], 2)
            if not down:
                bad.append(f"{module} ({mine}) imports {target} ({theirs})")
    assert not bad, "imports against the layer order:\n" + "\n".join(sorted(bad))


def test_backends_import_only_the_core_and_the_core_no_backend() -> None:
    """Said outright (the layer order implies it): a backend's imports of ours are its own
    package, the core and the trainer's contract side; the core's are the core and the
    trainer."""
    bad = []
    for module, targets in graph().items():
        mine = component(module)
        allowed = {mine, "core", "trainer"} if mine.startswith("backend:") else \
            {"core", "trainer"} if mine == "core" else None
        if allowed is not None:
            bad += [f"{module} ({mine}) imports {t} ({component(t)})" for t in targets
                    if component(t) not in allowed]
    assert not bad, "\n".join(sorted(bad))


def test_no_import_cycles() -> None:
    edges = graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in edges.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                top = stack.pop()
                group.append(top)
                if top == node:
                    break
            if len(group) > 1:
                cycles.append(sorted(group))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    assert not cycles, f"modules that import each other in a cycle: {cycles}"


def test_no_package_imports_another_in_a_cycle() -> None:
    """Top-level packages too: ``jobs`` (core, CLI, three backends) reaches ``k8s`` and
    ``slurm`` only through the registry's entry points, never by import."""
    edges: dict[str, set[str]] = {}
    for module, targets in graph().items():
        edges.setdefault(module.split(".")[1], set()).update(
            t.split(".")[1] for t in targets if t.split(".")[1] != module.split(".")[1])
    reach = {package: set(targets) for package, targets in edges.items()}
    for _ in edges:  # transitive closure, a handful of packages
        for package in reach:
            reach[package] |= {far for near in reach[package] for far in reach.get(near, ())}
    cycles = sorted(package for package in reach if package in reach[package])
    assert not cycles, f"packages that import each other in a cycle: {cycles} ({edges})"


def test_trainer_imports_nothing_from_the_launcher_side() -> None:
    for module, targets in graph().items():
        if component(module) == "trainer":
            assert all(component(t) == "trainer" for t in targets), (module, targets)


def imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


def test_renderers_do_no_io() -> None:
    for name in RENDERERS:
        path = ROOT / name
        assert path.exists(), path
        bad = imported_roots(path) & (IO_MODULES | ({"pathlib"} if name in NO_PATHS else set()))
        assert not bad, f"{name} (a pure renderer) imports {sorted(bad)}"
        tree = ast.parse(path.read_text())
        calls = {n.func.attr for n in ast.walk(tree)
                 if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)}
        names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        assert not calls & {"getenv", "system", "popen", "urlopen"}, path
        assert not names & {"open", "environ"}, f"{name} reads files or env"


def test_the_checker_sees_a_violation(tmp_path: Path) -> None:
    """The graph is real: a backend importing another one is found."""
    path = tmp_path / "backend.py"
    path.write_text("from torchjob.slurm.sbatch import render_sbatch\n"
                    "import torchjob.k8s.pod as pod\n")
    found = set(imports(path, "torchjob.jobs.backends.local.backend", modules()))
    assert found == {"torchjob.slurm.sbatch", "torchjob.k8s.pod"}
    assert component("torchjob.slurm.sbatch") != component("torchjob.jobs.backends.local.backend")
