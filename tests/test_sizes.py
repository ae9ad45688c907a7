"""Small modules and short functions (STYLE.md 8): a product file past ``MAX_FILE_LINES``
has two jobs, and a function past ``MAX_FUNCTION_LINES`` (its docstring included) several
steps that want names of their own."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("trainer", "jobs", "slurm", "k8s")
MAX_FILE_LINES = 450
MAX_FUNCTION_LINES = 60


def product_files() -> list[Path]:
    return sorted(path for package in PACKAGES for path in (ROOT / package).rglob("*.py"))


def functions(tree: ast.AST, prefix: str = "") -> Iterator[tuple[str, int]]:
    """Every function and method (nested ones too): its dotted name and its lines, from
    ``def`` to its last line."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            assert node.end_lineno is not None
            yield f"{prefix}{node.name}", node.end_lineno - node.lineno + 1
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield from functions(node, f"{prefix}{node.name}.")
        else:
            yield from functions(node, prefix)


def oversized() -> list[str]:
    found = []
    for path in product_files():
        name = path.relative_to(ROOT).as_posix()
        text = path.read_text()
        lines = len(text.splitlines())
        if lines > MAX_FILE_LINES:
            found.append(f"{name}: {lines} lines (at most {MAX_FILE_LINES})")
        for function, size in functions(ast.parse(text, name)):
            if size > MAX_FUNCTION_LINES:
                found.append(f"{name}:{function}: {size} lines (at most {MAX_FUNCTION_LINES})")
    return found


def test_no_product_file_or_function_is_too_long() -> None:
    found = oversized()
    assert not found, "too long (split by job, or into named steps):\n" + "\n".join(found)


def test_the_count_is_real() -> None:
    """The walk finds every package's files, and a method nested in a class by its name."""
    assert {path.relative_to(ROOT).parts[0] for path in product_files()} == set(PACKAGES)
    tree = ast.parse("class A:\n    def f(self):\n        def g():\n            pass\n"
                     "        return 1\n")
    assert dict(functions(tree)) == {"A.f": 4, "A.f.g": 2}
