"""The timeout hierarchy (torchjob.jobs.timeouts): every ordering refused with exit 2 naming both
values and the fix, ``render`` showing the resolved table on stderr with stdout unchanged, the
values reaching the agent, the trainer and the pods."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import yaml

from torchjob.jobs import timeouts
from torchjob.jobs.command import agent_command
from torchjob.jobs.load import SpecError, loads
from torchjob.k8s.pytorchjob import render_pytorchjob
from torchjob.k8s.trainjob import render_trainjob
from torchjob.trainer.agent import job_timeouts
from torchjob.trainer.config import ConfigError, parse_args
from torchjob.trainer.contract import NCCL_HEARTBEAT_ENV

from tests.procs import torchjob

EXAMPLE = str(Path(__file__).resolve().parents[2] / "jobs" / "examples" / "default.yaml")

# each ordering: the overrides that break it, the field path blamed, both values, the fix
BROKEN = {
    "hang-collective": (["hang_timeout=300"], "hang_timeout: 300 s is not below "
                        "collective_timeout 300 s", "set hang_timeout below 300 or "
                        "collective_timeout above 300"),
    "collective-lowered": (["collective_timeout=120"], "hang_timeout: 180 s is not below "
                           "collective_timeout 120 s", "set hang_timeout below 120"),
    "budget-hang": (["checkpoint_budget=100", "stop_grace=200", "slurm.signal_delay=200",
                     "hang_timeout=90"], "checkpoint_budget: 100 s is not below hang_timeout "
                    "90 s", "set checkpoint_budget below 90 or hang_timeout above 100"),
    "budget-grace": (["stop_grace=30"], "stop_grace: 30 s is not above checkpoint_budget 30 s",
                     "set stop_grace above 30 or checkpoint_budget below 30"),
    "budget-signal": (["slurm.signal_delay=20"], "slurm.signal_delay: 20 s is not above "
                      "checkpoint_budget 30 s", "set slurm.signal_delay above 30"),
    "last-call-join": (["rdzv.join_timeout=10", "rdzv.last_call_timeout=10"],
                       "rdzv.last_call_timeout: 10 s is not below rdzv.join_timeout 10 s",
                       "set rdzv.last_call_timeout below 10 or rdzv.join_timeout above 10"),
    "nccl-heartbeat": ([f"env.{NCCL_HEARTBEAT_ENV}=200"], f"env.{NCCL_HEARTBEAT_ENV}: 200 s is "
                       "not above collective_timeout 300 s", "or collective_timeout below 200"),
}


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_each_ordering_is_refused_naming_both_values_and_the_fix(name: str) -> None:
    sets, said, fix = BROKEN[name]
    with pytest.raises(SpecError) as caught:
        loads("name: x", sets)
    assert said in str(caught.value) and fix in str(caught.value)


def test_a_dump_lead_at_the_hang_timeout_is_refused() -> None:
    """Not reachable from a spec (hang_timeout is above the heartbeat loss, itself above the
    lead), but a rule of its own: checked on the resolved set."""
    found = timeouts.resolve(loads("name: x"))
    lead = dataclasses.replace(found.hang_dump_lead, seconds=found.hang.seconds)
    with pytest.raises(SpecError, match="hang_timeout: 180 s is not above the hang dump lead"):
        timeouts.check(dataclasses.replace(found, hang_dump_lead=lead))


def test_a_hang_timeout_below_the_heartbeat_loss_is_refused() -> None:
    """Not reachable from a spec either (hang_timeout's own minimum is the heartbeat loss,
    which it may equal: a stopped rank is then named at once): checked on the resolved set."""
    found = timeouts.resolve(loads("name: x", ["hang_timeout=5", "checkpoint_budget=4"]))
    timeouts.check(found)
    hang = dataclasses.replace(found.hang, seconds=4)
    with pytest.raises(SpecError, match="hang_timeout: 4 s is not at least the heartbeat lost "
                       "time, 5 s .fixed.: .*; set hang_timeout at least 5"):
        timeouts.check(dataclasses.replace(found, hang=hang))


def test_the_defaults_and_a_watchdog_turned_off_are_consistent() -> None:
    timeouts.check(timeouts.resolve(loads("name: x")))
    off = timeouts.resolve(loads("name: x", ["hang_timeout=0", "collective_timeout=20"]))
    assert off.hang.seconds == 0 and off.collective.seconds == 20
    unsignalled = loads("name: x", ["slurm.signal_delay=0"])
    assert timeouts.resolve(unsignalled).slurm_signal_lead.seconds == 0


@pytest.mark.parametrize("command", [["render"], ["render", "--to", "k8s"],
                                     ["run", "--dry-run"],
                                     ["submit", "--to", "k8s:trainjob", "--dry-run"]])
def test_the_command_line_refuses_an_inconsistent_set(command: list[str]) -> None:
    result = torchjob(*command, EXAMPLE, "--set", "hang_timeout=400")
    assert result.returncode == 2, result
    assert "Traceback" not in result.stderr and result.stdout == ""
    assert result.stderr.count("\n") == 1, result.stderr
    assert "hang_timeout: 400 s is not below collective_timeout 300 s" in result.stderr
    assert "set hang_timeout below 300 or collective_timeout above 400" in result.stderr


def test_validate_refuses_an_inconsistent_spec_file(tmp_path: Path) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text("name: x\nstop_grace: 10\n")
    result = torchjob("validate", str(spec))
    assert result.returncode == 2, result
    assert "stop_grace: 10 s is not above checkpoint_budget 30 s" in result.stderr


def test_run_grace_is_checked_by_the_same_rule() -> None:
    result = torchjob("run", "--dry-run", "--grace", "10", EXAMPLE)
    assert result.returncode == 2 and result.stdout == "", result
    assert "--grace: 10 s is not above checkpoint_budget 30 s" in result.stderr
    fine = torchjob("run", "--dry-run", "--grace", "45", EXAMPLE)
    assert fine.returncode == 0, fine
    assert "stop grace         45       --grace" in fine.stderr


@pytest.mark.parametrize("grace", [-1, 0, 0.5, math.nan, math.inf, -math.inf])
def test_run_grace_is_a_finite_number_of_seconds(grace: float) -> None:
    """As stop_grace (at least 1), so that the rule's fix is never 'checkpoint_budget below
    -1' nor 'below nan', and inf is no grace."""
    with pytest.raises(SpecError) as caught:
        timeouts.check(timeouts.resolve(loads("name: x"), grace=grace))
    assert str(caught.value) == (f"--grace: {grace:g} is not a time to wait for a stop's "
                                 "checkpoint before the kill: give a finite number of seconds "
                                 "above checkpoint_budget (30), e.g. 60")
    small = timeouts.resolve(loads("name: x", ["checkpoint_budget=0.2"]), grace=grace)
    with pytest.raises(SpecError, match=r"above checkpoint_budget \(0.2\) and at least 1, e"):
        timeouts.check(small)
    timeouts.check(timeouts.resolve(loads("name: x"), grace=30.5))


@pytest.mark.parametrize("to", ["local", "docker", "slurm", "k8s", "k8s:trainjob", "torchx"])
def test_render_prints_the_table_on_stderr_and_only_the_request_on_stdout(to: str) -> None:
    result = torchjob("render", "--to", to, EXAMPLE, "--set", "collective_timeout=400")
    assert result.returncode == 0, result
    assert "the job's timeouts" not in result.stdout and "checked:" not in result.stdout
    lines = result.stderr.splitlines()
    assert lines[0] == "torchjob: the job's timeouts (torchjob.jobs.timeouts):"
    for row in ("checkpoint budget  30       checkpoint_budget",
                "hang               180      hang_timeout",
                "collective         400      collective_timeout",
                "NCCL heartbeat     580      derived: collective_timeout + 180",
                "stop grace         60       stop_grace",
                "Slurm signal lead  90       slurm.signal_delay",
                "rdzv join          600      rdzv.join_timeout"):
        assert any(line.strip().startswith(row) for line in lines), (row, result.stderr)
    assert lines[-1].startswith("  checked: heartbeat lost <= hang; ")
    quiet = torchjob("render", "--to", to, EXAMPLE, "--set", "collective_timeout=400")
    assert quiet.stdout == result.stdout  # the request itself, the same every time


def test_the_timeouts_reach_the_agent_only_where_they_differ_from_the_defaults() -> None:
    words = agent_command(loads("name: x"), python="python", rdzv_endpoint="h:1", run_id="r")
    assert "--collective-timeout" not in words and "--checkpoint-budget" not in words
    spec = loads("name: x", ["collective_timeout=400.5", "checkpoint_budget=45"])
    words = agent_command(spec, python="python", rdzv_endpoint="h:1", run_id="r")
    assert " --collective-timeout 400.5 --checkpoint-budget 45 " in " ".join(words)


def test_the_trainer_takes_its_defaults_from_the_agent_and_its_flags_first() -> None:
    environ = {"TORCHJOB_COLLECTIVE_TIMEOUT": "42", "TORCHJOB_CHECKPOINT_BUDGET": "7"}
    cfg = parse_args([], environ)
    assert (cfg.pg_timeout, cfg.stop_grace) == (42.0, 7.0)
    assert parse_args(["--pg-timeout", "9"], environ).pg_timeout == 9.0
    assert parse_args([]).pg_timeout == 300.0  # no agent: the shared default
    with pytest.raises(ConfigError, match="TORCHJOB_COLLECTIVE_TIMEOUT='soon'"):
        parse_args([], {"TORCHJOB_COLLECTIVE_TIMEOUT": "soon"})


def test_the_agent_sets_nccls_heartbeat_above_the_collective_timeout() -> None:
    env = {"TORCHJOB_COLLECTIVE_TIMEOUT": "400.5"}
    job_timeouts(env, {})
    assert env[NCCL_HEARTBEAT_ENV] == "581"
    env = {}
    job_timeouts(env, {NCCL_HEARTBEAT_ENV: "900"})  # the job's env sets it: left alone
    assert NCCL_HEARTBEAT_ENV not in env
    job_timeouts(env, {})
    assert env[NCCL_HEARTBEAT_ENV] == "480"  # the default: torch's own
    with pytest.raises(ValueError, match="--checkpoint-budget '-1'"):
        job_timeouts({"TORCHJOB_CHECKPOINT_BUDGET": "-1"}, {})


@pytest.mark.parametrize("item,field", [("pg_timeout=30", "collective_timeout: 30"),
                                        ("stop_grace=5", "checkpoint_budget: 5")])
def test_the_trainers_own_timeout_options_belong_to_the_spec(item: str, field: str) -> None:
    with pytest.raises(SpecError, match=f"belongs at the top level of the job spec: write "
                       f"{field} there"):
        loads("name: x", [f"trainer.args.{item}"])


def test_every_pod_gets_the_stop_grace() -> None:
    spec = loads("name: x\nnnodes: 2\nk8s: {pvc: runs}", ["stop_grace=120"])
    job = render_pytorchjob(spec)
    for replica in job["spec"]["pytorchReplicaSpecs"].values():
        assert replica["template"]["spec"]["terminationGracePeriodSeconds"] == 120
    patch = render_trainjob(spec)["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]
    pod = patch["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] == 120


def test_the_rendered_manifests_carry_the_grace_and_validate() -> None:
    for to in ("k8s", "k8s:trainjob"):
        result = torchjob("render", "--to", to, EXAMPLE)
        docs = [doc for doc in yaml.safe_load_all(result.stdout) if doc]
        assert "terminationGracePeriodSeconds: 60" in result.stdout, to
        assert docs, result
        checked = torchjob("validate", "--to", to, "-", input=result.stdout)
        assert checked.returncode == 0, checked
