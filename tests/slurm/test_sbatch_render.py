"""The sbatch renderer: whole-script golden files checked with shellcheck, options, sweeps, and
hostile strings and the stop path run through bash with stand-ins for Slurm's commands.

Golden files live in tests/slurm/golden/. After an intended change to the rendered script,
regenerate them with one flag and review the diff:

    TORCHJOB_REGEN_GOLDEN=1 .venv/bin/python -m pytest tests/slurm/test_sbatch_render.py
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from torchjob.jobs.load import load, loads
from torchjob.jobs.spec import JobSpec
from torchjob.jobs.values import SpecError
from torchjob.slurm import sbatch
from torchjob.jobs.sweep import sweep_specs
from torchjob.slurm.sbatch import agent_command, fill, render_sbatch
from tests.golden import assert_golden
from tests.procs import wait_for
from torchjob.trainer.contract import ATTEMPT_BASE_ENV
from torchjob.trainer.env import slurm_port

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


SWEEP = {"lr": ["1e-3", "3e-3"], "batch_size": ["16"]}
GOLDEN = ["default", "elastic", "gpu", "pyxis", "apptainer", "sweep"]


def _render(name: str) -> str:
    if name == "sweep":
        return render_sbatch(load(EXAMPLES / "default.yaml"), **FIXED, sweep=SWEEP)
    specs = {"default": load(EXAMPLES / "default.yaml"),
             "elastic": load(EXAMPLES / "elastic.yaml"), "gpu": loads(GPU),
             **{k: loads(v) for k, v in CONTAINERS.items()}}
    return render_sbatch(specs[name], **FIXED)


@pytest.mark.parametrize("name", GOLDEN)
def test_golden(name: str) -> None:
    text = _render(name)
    assert_golden(text, HERE / "golden" / f"{name}.sbatch")
    subprocess.run(["bash", "-n"], input=text, text=True, check=True)


def test_shellcheck_passes_the_template_and_every_rendered_script(shellcheck: str,
                                                                   tmp_path: Path) -> None:
    """The shell that reaches sbatch: the template as shipped, and each golden job filled in
    (including the hostile one, whose values are all quoted)."""
    scripts = [Path(sbatch.__file__).with_name("job.sh")]
    for name in GOLDEN:
        scripts.append(tmp_path / f"{name}.sbatch")
        scripts[-1].write_text(_render(name))
    proc = subprocess.run([shellcheck, "--shell=bash", "--severity=style", *map(str, scripts)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    hostile = tmp_path / "hostile.sbatch"
    hostile.write_text(render_sbatch(_hostile_spec(tmp_path / "m", tmp_path), **FIXED))
    # SC2016 says '$HOME' does not expand: for these values, that is the point
    proc = subprocess.run([shellcheck, "--shell=bash", "--severity=style", "--exclude=SC2016",
                           str(hostile)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_worker_lines_count_attempts_from_the_requeue() -> None:
    """The agent writes the one log prefix (tests/trainer/test_log_prefix.py); the script
    tells it which attempt of the job this is: Slurm's restart count, as the shell expands it
    in the third attempt."""
    lines = [line for line in sbatch.TEMPLATE.splitlines()
             if line.startswith(("attempt=", "export TORCHJOB_ATTEMPT_BASE="))]
    got = subprocess.run(["bash", "-c", "; ".join(lines) + '; printf %s "$TORCHJOB_ATTEMPT_BASE"'],
                         env={"SLURM_RESTART_COUNT": "2"}, capture_output=True, text=True,
                         check=True).stdout
    assert got == "2"
    assert ATTEMPT_BASE_ENV == "TORCHJOB_ATTEMPT_BASE"
    assert "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE" not in sbatch.TEMPLATE  # the agent's job


def test_fill_uses_every_placeholder_and_value() -> None:
    assert fill("a @x@ b\n  @block@\nc\n", {"x": "'1 2'", "block": "l1\nl2"}) == \
        "a '1 2' b\nl1\nl2\nc\n"
    assert fill("@gone@\nc\n", {"gone": ""}) == "c\n"
    with pytest.raises(KeyError):
        fill("@x@ @y@\n", {"x": ""})
    with pytest.raises(ValueError, match="not in the template"):
        fill("@x@\n", {"x": "", "y": ""})


def test_a_sweep_is_one_job_array_of_its_points() -> None:
    text = _render("sweep")
    assert "--array=0-1" in directives(text)
    assert "#SBATCH --output=/work/torchjob/runs/digits/slurm-%A_%a.out" in text.splitlines()
    assert "     point=(--run-dir 'runs/digits/lr=1e-3,batch_size=16' --checkpoint-dir " \
        "'runs/digits/lr=1e-3,batch_size=16/checkpoints' --epochs 12 --lr 0.001 " \
        "--batch-size 16) ;;" in text.splitlines()
    points = sweep_specs(load(EXAMPLES / "default.yaml"), SWEEP)
    assert [(s.run_dir, s.checkpoint_dir, s.trainer.args["lr"]) for s in points] == [
        ("runs/digits/lr=1e-3,batch_size=16", "runs/digits/lr=1e-3,batch_size=16/checkpoints",
         1e-3),
        ("runs/digits/lr=3e-3,batch_size=16", "runs/digits/lr=3e-3,batch_size=16/checkpoints",
         3e-3)]
    with pytest.raises(SpecError, match=r"sweep.lrr: is not a trainer argument"):
        render_sbatch(load(EXAMPLES / "default.yaml"), **FIXED, sweep={"lrr": ["1"]})
    with pytest.raises(SpecError, match=r"sweep.epochs: 'x' is not a int"):
        render_sbatch(load(EXAMPLES / "default.yaml"), **FIXED, sweep={"epochs": ["x"]})


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
    assert "--no-kill" not in gpu and "--array" not in " ".join(gpu)
    # the run directory is the job's working directory (logs are found from it), the comment
    # says it is torchjob's
    assert "--chdir=/work/torchjob/runs/big" in gpu and "--comment=torchjob" in gpu
    elastic = directives(render_sbatch(load(EXAMPLES / "elastic.yaml"), **FIXED))
    assert "--nodes=1-2" in elastic and "--no-kill" in elastic
    plain = render_sbatch(loads("name: a\nslurm: {signal_delay: 0}\nrun_dir: /r/x y"), **FIXED)
    assert not [d for d in directives(plain) if d.startswith(("--signal", "--mem", "--gpus"))]
    assert '--output="/r/x y/slurm-%j.out"' in directives(plain)
    assert "NCCL" not in plain and "TORCH_NCCL_ASYNC_ERROR_HANDLING=1" in render_sbatch(
        loads(GPU), **FIXED)


def test_a_script_in_a_pyxis_container_comes_from_the_submit_directory() -> None:
    """The built-in trainer is in the image; a script or module is on the shared file system,
    mounted where it is (apptainer binds the working directory by itself)."""
    boxed = "name: b\nslurm: {container: pyxis}\nmounts: [{source: /data, target: /data}]\n"
    builtin = render_sbatch(loads(boxed), **FIXED)
    workdir = FIXED["workdir"]
    assert "--container-mounts=/data:/data " in builtin and f"{workdir}:{workdir}" not in builtin
    script = render_sbatch(loads(boxed + "trainer: {script: train.py}\n"), **FIXED)
    assert f"'--container-mounts=/data:/data,{workdir}:{workdir}' " in script


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
                      "          open(os.environ['STUB_OUT'] + '/' + sys.argv[2] + '.json', 'w'))\n")
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
    seen = json.loads((out / "torchjob.trainer.agent.json").read_text())  # not the store's python
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


def port_block(text: str) -> str:
    """The batch shell's lines that choose the rendezvous port: ``port=`` to the line that
    says which port was taken."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("port="))
    end = next(i for i in range(start, len(lines)) if lines[i].startswith('if [ "$taken"'))
    return "\n".join(lines[start:end + 1])


def chosen_port(block: str, job_id: int) -> tuple[int, str]:
    done = subprocess.run(["bash", "-c", f"set -euo pipefail; SLURM_JOB_ID={job_id}; "
                           f"rdzv_host=127.0.0.1\n{block}\necho $port"],
                          capture_output=True, text=True, check=True, timeout=60)
    return int(done.stdout), done.stderr


def test_port_formula_matches_trainer_env() -> None:
    text = render_sbatch(load(EXAMPLES / "default.yaml"), **FIXED)
    block = port_block(text)
    for job_id in (1, 19999, 20000, 123456789):
        assert chosen_port(block, job_id) == (slurm_port(job_id), "")
    assert re.search(r"--rdzv-endpoint \"\$rdzv_host:\$port\"", text)


def test_a_port_the_node_already_serves_is_stepped_over() -> None:
    """A port derived from the job id that something on the first node listens on (a slurmd,
    another service) would leave the store unbound and the agents talking to that service:
    the batch shell takes the next port where nothing answers, and says so."""
    block = port_block(render_sbatch(load(EXAMPLES / "default.yaml"), **FIXED))
    job_id = 19998  # ports 31998 and 31999 taken: the search wraps round to 12000
    with contextlib.ExitStack() as stack:
        for port in (slurm_port(job_id), slurm_port(job_id) + 1):
            listener = stack.enter_context(socket.socket())
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # past a TIME_WAIT
            try:
                listener.bind(("127.0.0.1", port))
            except OSError as err:
                pytest.fail(f"port {port}, which this test needs, is in use here: {err}")
            listener.listen()
        port, said = chosen_port(block, job_id)
    free = next(p for p in range(12000, 32000) if not serves(p))  # 12000, unless a job's there
    assert port == free, said
    assert said == (f"torchjob: {2 + free - 12000} port(s) from {slurm_port(job_id)} on "
                    f"127.0.0.1 were in use: the rendezvous is on port {free}\n")


def serves(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


# -- a sweep's array task picks its point ----------------------------------------------------

def test_an_array_task_runs_its_point(tmp_path: Path) -> None:
    bin_dir, out = tmp_path / "bin", tmp_path / "out"
    bin_dir.mkdir()
    out.mkdir()
    python = bin_dir / "python"
    python.write_text(f"#!{sys.executable}\nimport json, os, sys\n"
                      "json.dump(sys.argv[1:], open(os.environ['STUB_OUT'] + '/argv.json', 'w'))\n")
    (bin_dir / "srun").write_text(STUB_SRUN)
    (bin_dir / "scontrol").write_text(STUB_SCONTROL)
    for stub in bin_dir.iterdir():
        stub.chmod(0o755)
    spec = load(EXAMPLES / "default.yaml")
    text = render_sbatch(spec, python=str(python), workdir=str(tmp_path), sweep=SWEEP)
    env = {"PATH": f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}", "STUB_OUT": str(out),
           "SLURM_JOB_ID": "41", "SLURM_JOB_NODELIST": "n[7-8]", "SLURM_JOB_NUM_NODES": "1",
           "SLURM_ARRAY_JOB_ID": "40"}
    proc = subprocess.run(["bash", "-c", text], env={**env, "SLURM_ARRAY_TASK_ID": "1"},
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "torchjob: digits job 40_1 attempt 0 on 1 node(s)" in proc.stdout
    assert "torchjob: sweep point 1: lr=3e-3,batch_size=16" in proc.stdout
    want = list(agent_command(sweep_specs(spec, SWEEP)[1], python=str(python))[1:])
    want[want.index("--rdzv-endpoint") + 1] = f"n7:{slurm_port(41)}"
    want[want.index("--rdzv-id") + 1] = "41"
    assert json.loads((out / "argv.json").read_text()) == want
    proc = subprocess.run(["bash", "-c", text], env={**env, "SLURM_ARRAY_TASK_ID": "2"},
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "a job array of sweep points 0-1; SLURM_ARRAY_TASK_ID is " \
        "'2'" in proc.stderr, proc.stderr


# -- the stop path with stand-ins: batch shell -> scancel URG -> wrapper -> TERM to the agent

FAKE_AGENT = """#!/bin/bash
# as torchrun's agent: exit 1 after a forwarded stop; or 0, when the work had just ended
trap 'echo TERM >> "$STUB_OUT/agent.signals"; exit "${FAKE_AGENT_EXIT:-1}"' TERM
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


def stop_with_stand_ins(tmp_path: Path, signals: list[signal.Signals], *, restarts: str = "",
                        agent_exit: str = "1") -> tuple[int, str, Path]:
    """Run the script of a job with slurm.max_requeues 2 against stand-ins; once the fake
    agent runs, send ``signals`` to the batch shell. (exit code, output, the stand-ins' dir)."""
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
           "SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "n1", "SLURM_JOB_NUM_NODES": "1",
           "FAKE_AGENT_EXIT": agent_exit}
    if restarts:
        env["SLURM_RESTART_COUNT"] = restarts
    proc = subprocess.Popen(["bash", "-c", text], env=env, cwd=tmp_path, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        if signals:
            wait_for(lambda: (out / "agent.ready").exists(), 30, "the fake agent")
        for i, sig in enumerate(signals):
            if i:  # bash may drop a trap when two signals land within a moment
                wait_for(lambda: (out / "scancel.calls").exists(), 30, "the first stop")
            proc.send_signal(sig)
        stdout, stderr = proc.communicate(timeout=30)
    finally:
        proc.kill()
    return proc.returncode, stdout + stderr, out


@pytest.mark.parametrize("restarts, requeued", [("", True), ("1", True), ("2", False)])
def test_usr2_stops_the_agent_once_and_requeues(tmp_path: Path, restarts: str,
                                                requeued: bool) -> None:
    """The time limit's USR2: one stop signal reaches the agent; the job is requeued while
    slurm.max_requeues allows."""
    code, output, out = stop_with_stand_ins(tmp_path, [signal.SIGUSR2], restarts=restarts)
    assert code == 143, output
    assert (out / "agent.signals").read_text() == "TERM\n"  # one stop signal, no URG
    assert (out / "scancel.calls").read_text() == "--signal=URG 77\n"
    assert ("step exit 143" in output) if requeued else ("after 2 requeues" in output)
    assert (out / "requeued").exists() == requeued


def test_cancel_stops_for_good_and_a_second_signal_sends_nothing(tmp_path: Path) -> None:
    """`torchjob cancel` (USR1), then the time limit's USR2 while the workers stop: one stop
    signal reaches the agent, and the job is not requeued."""
    code, output, out = stop_with_stand_ins(tmp_path, [signal.SIGUSR1, signal.SIGUSR2])
    assert code == 143, output
    assert (out / "agent.signals").read_text() == "TERM\n"
    assert (out / "scancel.calls").read_text() == "--signal=URG 77\n"
    assert "stopped by torchjob cancel after a checkpoint" in output
    assert not (out / "requeued").exists()


def test_a_late_usr2_does_not_requeue_a_finished_job(tmp_path: Path) -> None:
    """The stop lands as the work ends: the agent exits 0, so the job is done (exit 0), not
    requeued."""
    code, output, out = stop_with_stand_ins(tmp_path, [signal.SIGUSR2], agent_exit="0")
    assert code == 0, output
    assert (out / "agent.signals").read_text() == "TERM\n"
    assert not (out / "requeued").exists() and "requeueing" not in output


def test_requeues_by_slurm_itself_are_bounded_too(tmp_path: Path) -> None:
    """Preemption or `scontrol requeue` past slurm.max_requeues (attempt 3 of at most 2
    requeues): the attempt stops at once with 143, before srun."""
    code, output, out = stop_with_stand_ins(tmp_path, [], restarts="3")
    assert code == 143, output
    assert "requeued more often than slurm.max_requeues=2 allows" in output
    assert not (out / "task.pid").exists()
