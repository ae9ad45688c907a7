"""Where a worker's main thread is, in words the hang watchdog can quote: whether it waits
inside torch.distributed and its innermost frame of user code; and ``after_import``, a call
made when a module is first imported, in the importing thread. Neither imports torch."""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import os
import sys
import sysconfig
from types import FrameType, ModuleType
from typing import Any, Callable, Sequence

KIT = os.path.dirname(os.path.abspath(__file__)) + os.sep  # torchjob's trainer
STDLIB = tuple({os.path.realpath(sysconfig.get_paths()[k]) + os.sep
                for k in ("stdlib", "platstdlib")})
INSTALLED = ("site-packages", "dist-packages")


def torch_dir() -> str | None:
    torch = sys.modules.get("torch")
    file = getattr(torch, "__file__", None)
    return os.path.dirname(os.path.realpath(file)) + os.sep if file else None


@functools.lru_cache(maxsize=4096)
def kind(filename: str, torch: str | None) -> str:
    """user, lib (an installed package), kit (torchjob's trainer), torch, dist
    (torch.distributed) or stdlib."""
    if filename.startswith("<"):  # frozen modules; code made by exec (dataclasses, ...)
        return "stdlib" if filename.startswith("<frozen") else "lib"
    path = os.path.realpath(filename)
    if torch and path.startswith(torch):
        return "dist" if path.startswith(torch + "distributed" + os.sep) else "torch"
    if path.startswith(KIT):
        return "kit"
    if any(f"{os.sep}{d}{os.sep}" in path for d in INSTALLED):
        return "lib"
    return "stdlib" if path.startswith(STDLIB) else "user"


Frame = tuple[str, int, str]  # (filename, line, function): read inside or from outside


def describe(frame: Frame, cwd: str) -> str:
    name, line, function = frame
    if name.startswith(cwd + os.sep):
        name = os.path.relpath(name, cwd)
    return f"{name}:{line} in {function}"


def where(top: FrameType | None) -> tuple[bool, str]:
    """``pick`` of this process's stack from its frame ``top``."""
    chain: list[Frame] = []
    frame = top
    while frame is not None and len(chain) < 200:
        chain.append((frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name))
        frame = frame.f_back
    return pick(chain, os.getcwd())


def pick(chain: Sequence[Frame], cwd: str) -> tuple[bool, str]:
    """Of a stack, innermost frame first (``cwd``: its process's directory): (waits inside
    torch.distributed: the innermost frame that is not the standard library's is
    torch.distributed's; the innermost user frame, else an installed package's, else the
    kit's, else any)."""
    torch = torch_dir()
    kinds = [(kind(frame[0], torch), frame) for frame in chain[:200]]
    inner = next((k for k, _ in kinds if k != "stdlib"), "")
    for wanted in ("user", "lib", "kit"):
        found = next((f for k, f in kinds if k == wanted), None)
        if found is not None:
            return inner == "dist", describe(found, cwd)
    return inner == "dist", describe(kinds[0][1], cwd) if kinds else ""


class _Then(importlib.abc.Loader):
    """A module's own loader, then a call with the module."""

    def __init__(self, loader: Any, then: Callable[[ModuleType], None]) -> None:
        self.loader, self.then = loader, then

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        module.__loader__ = self.loader  # as if never wrapped
        if module.__spec__ is not None:
            module.__spec__.loader = self.loader
        self.loader.exec_module(module)
        try:
            self.then(module)
        except Exception:  # an observer never breaks the import it watches
            pass


class _After(importlib.abc.MetaPathFinder):
    def __init__(self, name: str, then: Callable[[ModuleType], None]) -> None:
        self.name, self.then = name, then

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        for finder in sys.meta_path:
            spec = finder.find_spec(fullname, path, target) if hasattr(finder, "find_spec") \
                else None
            if spec is not None and spec.loader is not None:
                spec.loader = _Then(spec.loader, self.then)
                return spec
        return None


def after_import(name: str, then: Callable[[ModuleType], None]) -> None:
    """``then(module)`` now if ``name`` is imported, else right after its first import."""
    module = sys.modules.get(name)
    if module is not None:
        then(module)
    else:
        sys.meta_path.insert(0, _After(name, then))
