"""Small modules and short functions (STYLE.md 8): a product file past ``MAX_FILE_LINES``
has two jobs, and a function past ``MAX_FUNCTION_LINES`` (its docstring included) several
steps that want names of their own. Short docstrings (STYLE.md 11): one past
``MAX_DOCSTRING_LINES`` tells more than what its module, class or function is and does."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("trainer", "jobs", "slurm", "k8s")
MAX_FILE_LINES = 450
MAX_FUNCTION_LINES = 60
MAX_DOCSTRING_LINES = 8
# kept whole, since a tool prints them as help: TorchX parses a component's docstring into
# ``torchx run ...:train --help``, one line per argument
HELP_DOCSTRINGS = {"jobs/backends/torchx/components.py:train"}
DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
Documented = ast.Module | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef


def product_files() -> list[Path]:
    return sorted(path for package in PACKAGES for path in (ROOT / package).rglob("*.py"))


def functions(tree: ast.AST, prefix: str = "") -> Iterator[tuple[str, int]]:
    """Every function and method (nested ones too): its dotted name and its lines, from
    ``def`` to its last line."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            assert node.end_lineno is not None
            yield f"{prefix}{node.name}", node.end_lineno - node.lineno + 1
        if isinstance(node, DEFINITIONS):
            yield from functions(node, f"{prefix}{node.name}.")
        else:
            yield from functions(node, prefix)


def docstring_lines(node: Documented) -> int:
    """The lines of ``node``'s docstring, from its opening quotes to its closing ones; 0 when
    it has none."""
    first = node.body[0] if node.body else None
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
            and isinstance(first.value.value, str):
        assert first.end_lineno is not None
        return first.end_lineno - first.lineno + 1
    return 0


def docstrings(tree: ast.AST, prefix: str = "") -> Iterator[tuple[str, int]]:
    """Every class and function (nested ones too) with a docstring: its dotted name and the
    docstring's lines."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, DEFINITIONS):
            if lines := docstring_lines(node):
                yield f"{prefix}{node.name}", lines
            yield from docstrings(node, f"{prefix}{node.name}.")
        else:
            yield from docstrings(node, prefix)


def long_docstrings() -> list[str]:
    found = []
    for path in product_files():
        name = path.relative_to(ROOT).as_posix()
        tree = ast.parse(path.read_text(), name)
        for owner, lines in [("", docstring_lines(tree)), *docstrings(tree)]:
            where = f"{name}:{owner}" if owner else name
            if lines > MAX_DOCSTRING_LINES and where not in HELP_DOCSTRINGS:
                found.append(f"{where}: {lines} lines (at most {MAX_DOCSTRING_LINES})")
    return found


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


def test_no_docstring_is_too_long() -> None:
    found = long_docstrings()
    assert not found, ("docstrings too long (say what it is and does; the why goes to "
                       "docs/internals.md, the history to a commit message):\n" + "\n".join(found))


def test_the_count_is_real() -> None:
    """The walk finds every package's files, a method nested in a class by its name, each
    docstring with its lines, and every exempt help docstring where it is named."""
    assert {path.relative_to(ROOT).parts[0] for path in product_files()} == set(PACKAGES)
    tree = ast.parse("class A:\n    def f(self):\n        def g():\n            pass\n"
                     "        return 1\n")
    assert dict(functions(tree)) == {"A.f": 4, "A.f.g": 2}
    tree = ast.parse('"""One.\n\nTwo."""\nclass A:\n    """A."""\n    def f(self):\n'
                     '        """F.\n        """\n')
    assert docstring_lines(tree) == 3
    assert dict(docstrings(tree)) == {"A": 1, "A.f": 2}
    assert set(HELP_DOCSTRINGS) <= {f"{path.relative_to(ROOT).as_posix()}:{name}"
                                    for path in product_files()
                                    for name, _ in docstrings(ast.parse(path.read_text()))}
