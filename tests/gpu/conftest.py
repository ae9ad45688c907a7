"""The GPU tests (``pytest -m gpu``): one command, a few minutes on one GPU. Skipped with the
reason where no CUDA device is visible. ``TORCHJOB_TEST_DEVICE=cpu`` runs the same tests on
CPU (gloo, fp32): their code paths checked without a GPU."""

from __future__ import annotations

import os

import pytest

DEVICE = os.environ.get("TORCHJOB_TEST_DEVICE", "cuda")


@pytest.hookimpl(trylast=True)  # after ``-m`` deselected: CUDA is asked only for these tests
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu = [item for item in items if item.get_closest_marker("gpu")]  # the marker, not a word
    if DEVICE != "cuda" or not gpu:
        return
    import torch  # these tests start fresh interpreters: nothing here forks after this

    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="no CUDA device visible (TORCHJOB_TEST_DEVICE=cpu runs "
                                       "these tests on CPU)")
        for item in gpu:
            item.add_marker(skip)
