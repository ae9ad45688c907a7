"""The spec's metrics export fields (tensorboard, prometheus_dir, exporters) reach the built-in
trainer as its options on every backend (jobs.command.entry_args), and only when set."""

from __future__ import annotations

import pytest

from torchjob.jobs.command import agent_command, entry_args
from torchjob.jobs.load import loads
from torchjob.jobs.values import SpecError

BASE = "name: digits\n"


def test_defaults_add_nothing() -> None:
    assert entry_args(loads(BASE)) == ("--run-dir", "runs/digits",
                                       "--checkpoint-dir", "runs/digits/checkpoints")


def test_each_field_becomes_the_trainers_option() -> None:
    spec = loads(BASE, ["tensorboard=true", "prometheus_dir=/var/lib/node_exporter",
                        "exporters=[a.b:C, d:E]", "trainer.args.epochs=2"])
    argv = agent_command(spec, python="python", rdzv_endpoint="h:1", run_id="x")
    tail = argv[argv.index("torchjob.trainer") + 1:]
    assert tail == ("--run-dir", "runs/digits", "--checkpoint-dir", "runs/digits/checkpoints",
                    "--tensorboard", "true", "--prometheus-dir", "/var/lib/node_exporter",
                    "--exporters", "a.b:C,d:E", "--epochs", "2")


@pytest.mark.parametrize("override, why", [
    ("trainer.args.tensorboard=true", "belongs at the top level"),
    ("trainer.args.prometheus_dir=/x", "belongs at the top level"),
    ("exporters=[not-a-path]", "is not 'pkg.module:Class'"),
    ("prometheus_dir=/etc", "system directory"),
])
def test_mistakes_stop_at_the_spec(override: str, why: str) -> None:
    with pytest.raises(SpecError, match=why):
        loads(BASE, [override])


def test_a_script_job_exports_its_own_metrics() -> None:
    with pytest.raises(SpecError, match="setting of the built-in trainer"):
        loads(BASE + "trainer: {script: train.py}\n", ["tensorboard=true"])
