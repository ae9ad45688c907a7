"""Text for the end of a test session's output (the conformance matrix's table), from the
process that made it: pytest's own or, under pytest-xdist, a worker's, which sends it to the
controller (tests/conftest.py prints it there)."""

from __future__ import annotations

import pytest

SUMMARIES: list[tuple[str, str]] = []  # (title, text), in this process


def add_summary(config: pytest.Config, title: str, text: str) -> None:
    if hasattr(config, "workeroutput"):  # a pytest-xdist worker
        config.workeroutput.setdefault("summaries", []).append((title, text))
    else:
        SUMMARIES.append((title, text))
