"""The sbatch renderer: whole-script golden files, options, and hostile strings run through bash.

Golden files live in tests/slurm/golden/. After an intended change to the rendered script,
regenerate them with one flag and review the diff:

    TORCHJOB_REGEN_GOLDEN=1 .venv/bin/python -m pytest tests/slurm/test_sbatch_render.py
"""

from __future__ import annotations

import ast
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from jobs.load import load, loads
from jobs.spec import JobSpec
from slurm import sbatch
from slurm.sbatch import agent_command, render_sbatch
from tests.test_layering import IO_MODULES, imported_roots
from tests.procs import wait_for
from trainer.env import slurm_port

HERE = Path(__file__).resolve().parent
EXAMPLES = HERE.parents[1] / "jobs" / "examples"
FIXED = dict(python="/usr/bin/python3", workdir="/work/torchjob")
GPU = """\
name: big
nnodes: 4
nproc_per_node: 8
resources: {cpu: 63.5, memory: 500Gi, gpus: 8}
env: {NCCL_DEBUG: INFO, DATA: /data/set}
secrets: [{env: HF_TOKEN, secret: hf, key: token}]
slurm:
  partition: gpu
  account: team-a
  qos: high
  constraint: a100&ib
  time: '2-00:00:00'
  exclusive: true
  signal_delay: 300
  max_requeues: 5
  extra_flags: [--gres-flags=enforce-binding, --mail-type=END]
trainer: {args: {batch_size: 64, parallel: fsdp}}
"""
CONTAINERS = {
    "pyxis": "name: boxed\nnnodes: 2\nnproc_per_node: 2\nimage: nvcr.io#nvidia/pytorch:24.05-py3\n"
             "mounts: [{source: /scratch, target: /scratch}, "
             "{source: /datasets, target: /data, read_only: true}]\n"
             "slurm: {container: pyxis, time: 60}\n",
    "apptainer": "name: boxed\nnnodes: '1:3'\nnproc_per_node: 1\nresources: {gpus: 1}\n"
                 "mounts: [{source: /datasets, target: /data, read_only: true}]\n"
                 "slurm: {container: apptainer, container_image: /images/torchjob.sif, "
                 "signal_delay: 0}\n",
}
HOSTILE = ["a'; touch {marker}", 'b"; touch {marker}; "', "$(touch {marker})", "`touch {marker}`",
           "two words", "new\nline", "tab\there", "caf\u00e9 \u65e5\u672c \U0001f600", "", "--x",
           "semi;colon", "*", "~", "back\\slash", "!event", "${HOME}", "$SLURM_JOB_ID"]


def _specs() -> dict[str, JobSpec]:
    return {"default": load(EXAMPLES / "default.yaml"), "elastic": load(EXAMPLES / "elastic.yaml"),
            "gpu": loads(GPU), **{k: loads(v) for k, v in CONTAINERS.items()}}


@pytest.mark.parametrize("name", ["default", "elastic", "gpu", "pyxis", "apptainer"])
def test_golden(name: str) -> None:
    text = render_sbatch(_specs()[name], **FIXED)
    golden = HERE / "golden" / f"{name}.sbatch"
    if os.environ.get("TORCHJOB_REGEN_GOLDEN") == "1":
        golden.parent.mkdir(exist_ok=True)
        golden.write_text(text)
    assert text == golden.read_text(), f"regenerate with TORCHJOB_REGEN_GOLDEN=1 ({golden})"
    subprocess.run(["bash", "-n"], input=text, text=True, check=True)


def directives(text: str) -> list[str]:
    return [line.removeprefix("#SBATCH ") for line in text.splitlines()
            if line.startswith("#SBATCH ")]


def test_options() -> None:
    gpu = directives(render_sbatch(loads(GPU), **FIXED))
    assert gpu[:6] == ["--job-name=big", "--nodes=4", "--ntasks-per-node=1",
                       "--cpus-per-task=64", "--mem=512000M", "--gpus-per-node=8"]
    for want in ("--time=2-00:00:00", "--partition=gpu", "--account=team-a", "--qos=high",
                 "--constraint=a100&ib", "--exclusive", "--signal=B:USR2@300", "--requeue",
                 "--open-mode=append", "--output=/work/torchjob/runs/big/slurm-%j.out",
                 "--error=/work/torchjob/runs/big/slurm-%j.err"):
        assert want in gpu
    assert gpu[-2:] == ["--gres-flags=enforce-binding", "--mail-type=END"]
    assert "--no-kill" not in gpu
    elastic = directives(render_sbatch(load(EXAMPLES / "elastic.yaml"), **FIXED))
    assert "--nodes=1-2" in elastic and "--no-kill" in elastic
    plain = render_sbatch(loads("name: a\nslurm: {signal_delay: 0}\nrun_dir: /r/x y"), **FIXED)
    assert not [d for d in directives(plain) if d.startswith(("--signal", "--mem", "--gpus"))]
    assert '--output="/r/x y/slurm-%j.out"' in directives(plain)
    assert "NCCL" not in plain and "TORCH_NCCL_ASYNC_ERROR_HANDLING=1" in render_sbatch(
        loads(GPU), **FIXED)


def test_user_env_overrides_defaults_and_secrets_stay_out() -> None:
    text = render_sbatch(loads(GPU), **FIXED)
    assert "export NCCL_DEBUG=INFO" in text and "NCCL_DEBUG=WARN" not in text
    assert "# secrets read from your environment (sbatch exports it): HF_TOKEN" in text
    assert "HF_TOKEN=" not in text


def test_unwritable_sbatch_values_are_refused() -> None:
    spec = load(EXAMPLES / "default.yaml")
    with pytest.raises(ValueError, match="newline"):
        render_sbatch(spec, python="python3", workdir="/tmp/a\ntouch /tmp/pwned")
    with pytest.raises(ValueError, match="absolute"):
        render_sbatch(spec, python="python3", workdir="relative")
    with pytest.raises(ValueError, match="cannot quote"):
        render_sbatch(loads('name: a\nrun_dir: "/x\\"y"'), **FIXED)


def test_renderer_is_pure() -> None:
    path = Path(sbatch.__file__)
    assert not imported_roots(path) & IO_MODULES
    names = {n.id for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Name)}
    assert not names & {"open", "environ"}


# -- hostile strings through bash, with stand-ins for srun, scontrol and python ---------------

STUB_SRUN = """#!/bin/bash
printf '%s\\0' "$@" > "$STUB_OUT/srun.argv"
while [ "${1#-}" != "$1" ]; do shift; done   # drop srun's options, run the task
exec "$@"
"""
STUB_SCONTROL = """#!/bin/bash
[ "$1 $2" = "show hostnames" ] && { echo n7; echo n8; exit 0; }
echo "unexpected scontrol $*" >&2; exit 1
"""


def _hostile_spec(marker: Path, tmp_path: Path) -> JobSpec:
    values = [h.replace("{marker}", str(marker)) for h in HOSTILE]
    quoted = [json.dumps(v, ensure_ascii=False) for v in values]  # YAML double-quoted scalars
    # paths go on #SBATCH lines too: one line, and no '"' (see test_unwritable_sbatch_values)
    paths = [v for v in values if "\n" not in v and '"' not in v and "\t" not in v]
    run_dir = json.dumps(str(tmp_path / "runs" / " ".join(paths)), ensure_ascii=False)
    spec = loads("name: job\nnnodes: '1:2'\ntrainer: {module: tool}\n",
                 [f"env.V{i}={q}" for i, q in enumerate(quoted)]
                 + [f"trainer.args.a{i}={q}" for i, q in enumerate(quoted)]
                 + [f"run_dir={run_dir}",
                    f"checkpoint_dir={json.dumps('ck ' + paths[0], ensure_ascii=False)}"])
    assert [spec.env[f"V{i}"] for i in range(len(values))] == values
    return spec


def test_hostile_strings_never_execute_and_round_trip(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    bin_dir, out = tmp_path / "bin", tmp_path / "out"
    bin_dir.mkdir()
    out.mkdir()
    python = bin_dir / "py \u00fc'; touch x"
    python.write_text(f"#!{sys.executable}\nimport json, os, sys\n"
                      "env = {k: v for k, v in os.environ.items() if k[:1] == 'V'}\n"
                      "json.dump({'argv': sys.argv[1:], 'env': env, 'cwd': os.getcwd()},\n"
                      "          open(os.environ['STUB_OUT'] + '/python.json', 'w'))\n")
    (bin_dir / "srun").write_text(STUB_SRUN)
    (bin_dir / "scontrol").write_text(STUB_SCONTROL)
    for stub in bin_dir.iterdir():
        stub.chmod(0o755)
    workdir = tmp_path / "work a'; touch {marker} \u00e9".replace("{marker}", str(marker))
    workdir.mkdir(parents=True)
    spec = _hostile_spec(marker, tmp_path)
    text = render_sbatch(spec, python=str(python), workdir=str(workdir))
    subprocess.run(["bash", "-n"], input=text, text=True, check=True)
    env = {"PATH": f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}", "STUB_OUT": str(out),
           "SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "n[7-8]", "SLURM_JOB_NUM_NODES": "2"}
    proc = subprocess.run(["bash", "-c", text], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert not marker.exists()
    seen = json.loads((out / "python.json").read_text())
    want = list(agent_command(spec, python=str(python))[1:])
    want[want.index("--rdzv-endpoint") + 1] = f"n7:{slurm_port(4242)}"
    want[want.index("--rdzv-id") + 1] = "4242"
    assert seen["argv"] == want
    assert seen["env"] == dict(spec.env)
    assert seen["cwd"] == str(workdir)
    srun = (out / "srun.argv").read_bytes().decode().split("\0")[:-1]
    assert srun[:5] == ["--kill-on-bad-exit=0", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1",
                        "--cpus-per-task=1"]
    assert srun[srun.index("torchjob-node") + 1] == str(python)


def test_port_formula_matches_trainer_env() -> None:
    text = render_sbatch(load(EXAMPLES / "default.yaml"), **FIXED)
    line = next(line for line in text.splitlines() if line.startswith("port="))
    for job_id in (0, 1, 19999, 20000, 123456789):
        got = subprocess.run(["bash", "-c", f"SLURM_JOB_ID={job_id}; {line}; echo $port"],
                             capture_output=True, text=True, check=True).stdout
        assert int(got) == slurm_port(job_id)
    assert re.search(r"--rdzv-endpoint \"\$rdzv_host:\$port\"", text)


# -- the stop path with stand-ins: batch shell -> scancel URG -> wrapper -> TERM to the agent

FAKE_AGENT = """#!/bin/bash
trap 'echo TERM >> "$STUB_OUT/agent.signals"; exit 1' TERM  # as torchrun's agent: exit 1
touch "$STUB_OUT/agent.ready"
while :; do sleep 0.05; done
"""
STUB_SRUN_PID = """#!/bin/bash
echo $$ > "$STUB_OUT/task.pid"
while [ "${1#-}" != "$1" ]; do shift; done
exec "$@"
"""
STUB_SCANCEL = """#!/bin/bash
echo "$*" >> "$STUB_OUT/scancel.calls"
task=$(cat "$STUB_OUT/task.pid")  # Slurm signals every process of the step
kill -URG "$task"; pkill -URG -P "$task" || true
"""
STUB_SCONTROL_REQUEUE = """#!/bin/bash
case "$1" in
  show) echo n1 ;;
  requeue) echo "$2" >> "$STUB_OUT/requeued" ;;
esac
"""


@pytest.mark.parametrize("restarts, requeued", [("", True), ("2", False)])
def test_usr2_stops_the_agent_once_and_requeues(tmp_path: Path, restarts: str,
                                                requeued: bool) -> None:
    bin_dir, out = tmp_path / "bin", tmp_path / "out"
    bin_dir.mkdir()
    out.mkdir()
    for name, text in (("srun", STUB_SRUN_PID), ("scancel", STUB_SCANCEL),
                       ("scontrol", STUB_SCONTROL_REQUEUE), ("agent", FAKE_AGENT)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    spec = loads("name: job\nslurm: {max_requeues: 2}")
    text = render_sbatch(spec, python=str(bin_dir / "agent"), workdir=str(tmp_path))
    env = {"PATH": f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}", "STUB_OUT": str(out),
           "SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "n1", "SLURM_JOB_NUM_NODES": "1"}
    if restarts:
        env["SLURM_RESTART_COUNT"] = restarts
    proc = subprocess.Popen(["bash", "-c", text], env=env, cwd=tmp_path, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: (out / "agent.ready").exists(), 30, "the fake agent")
        proc.send_signal(signal.SIGUSR2)
        stdout, stderr = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 143, stdout + stderr
    assert (out / "agent.signals").read_text() == "TERM\n"  # one stop signal, no URG
    assert (out / "scancel.calls").read_text() == "--signal=URG 77\n"
    assert "step exit 143" in stdout if requeued else "after 2 requeues" in stderr
    assert (out / "requeued").exists() == requeued
