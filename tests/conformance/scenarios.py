"""The rows of the conformance matrix: one function per scenario, each given a ``Cell`` (one
backend, its own directory) and failing with what it saw. Every wait is for an event (a file
the worker writes at the gate, the run's end) with a deadline; none sleeps.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any, Callable

from tests.conformance.gate import GATE_ENV, GATE_STEP, RAISE_ENV
from tests.conformance.matrix import EVENT_TIMEOUT_S, HANDLE, Cell, Run
from tests.procs import ROOT, assert_bitwise_equal, final_params, torchjob
from torchjob.jobs.progress import from_logs
from torchjob.trainer.contract import HANG_LINE
from torchjob.jobs.report import read_json
from tests.recorded import wait_until

HERE = Path(__file__).resolve().parent
DEFAULT = ROOT / "jobs" / "examples" / "default.yaml"
TOPOLOGY = ("nnodes=2", "nproc_per_node=1", "max_restarts=2")  # world size 2, two agents
# The built-in trainer, a few steps of the digits task behind the cells' gate; the reference
# (tests/conformance/conftest.py) runs the same flags under plain torchrun.
TRAINER = {"task": "tests.conformance.gate:digits", "epochs": 12, "max_steps": 10,
           "checkpoint_every": 4, "log_every": 1, "eval_every": 0, "progress": "lines"}
TRAINER_SETS = (*TOPOLOGY, *(f"trainer.args.{k}={v}" for k, v in TRAINER.items()))
GATED = (*TRAINER_SETS, f"env.{GATE_ENV}=runs/gate")
SCRIPT_ARGS = ["2", "1", "data.name=a b", "--batch_size=8"]
RESTARTED = re.compile(r"\[node \d rank \d attempt 1\] ")


def trainer_flags() -> list[str]:
    return [w for k, v in TRAINER.items() for w in (f"--{k.replace('_', '-')}", str(v))]


def expect(ok: object, what: str, output: str) -> None:
    if not ok:
        tail = "\n".join(output.splitlines()[-60:])
        raise AssertionError(f"{what}; the run's output ends:\n{tail}")


def success(cell: Cell) -> None:
    """The same job ends with the same parameters, bit for bit, on every backend; `run`
    followed its logs to the end."""
    code, out = cell.run(DEFAULT, *TRAINER_SETS)
    expect(code == 0, f"exit code {code}, not 0", out)
    expect("[rank 0/2] done: steps 10, world_size 2" in out, "rank 0's last line missing", out)
    assert_bitwise_equal(final_params(cell.run_dir / "checkpoints"), cell.reference())


def user_exception(cell: Cell) -> None:
    """Rank 1's code raises: exit 1 at once, not retried (no worker nor node started again),
    the rank named in the run's last line with where the full logs are; every other node
    hears it (none waits for its hang timeout: a worker whose peer's container was gone once
    blocked in its exit until then)."""
    code, out = cell.run(DEFAULT, *TRAINER_SETS, f"env.{RAISE_ENV}=1")
    expect(code == 1, f"exit code {code}, not 1", out)
    expect(not RESTARTED.search(out) and "starting it again" not in out, "the job was retried",
           out)
    expect(HANG_LINE not in out, "a node hung instead of hearing the failure", out)
    last = out.strip().splitlines()[-1] if out.strip() else ""
    expect(re.match(rf"torchjob: the job failed: node \d rank 1 raised ValueError: conformance: "
                    rf"rank 1 raises at step {GATE_STEP}: not retried.*; full logs: ", last),
           f"rank 1 not named in the last line ({last!r})", out)


def configuration_error(cell: Cell) -> None:
    """A script's usage error is a configuration error: exit 2, never retried (not even with
    retry_on_error)."""
    code, out = cell.run(script_job(cell, ["2", "1", "--no-such-option"]), *TOPOLOGY,
                         "retry_on_error=true")
    expect(code == 2, f"exit code {code}, not 2", out)
    expect(not RESTARTED.search(out), "the job was retried", out)
    expect("unrecognized arguments: --no-such-option" in out, "argparse's message lost", out)
    expect("a configuration error is never retried" in out, "no closing line", out)


def kill_worker(cell: Cell) -> None:
    """kill -9 of a worker mid-run: the group restarts from the last checkpoint and ends
    bitwise where an uninterrupted run ends; ``torchjob status`` then shows the last step of
    all, the restart and the rank that died."""
    run = cell.start(DEFAULT, *GATED)
    workers = cell.at_gate(run)
    cell.column.kill(cell, workers[1])
    cell.open_gate()
    code = run.wait()
    out = run.text()
    expect(code == 0, f"exit code {code}, not 0", out)
    expect(RESTARTED.search(out), "no restart (attempt 1) seen", out)
    expect("resumed from step_00000004" in out, "not resumed from the step-4 checkpoint", out)
    assert_bitwise_equal(final_params(cell.run_dir / "checkpoints"), cell.reference())
    told = job_progress(cell, run)
    expect((told["step"], told["total_steps"], told["restarts"]) == (10, 10, 1)
           and "rank 1" in (told["culprit"] or ""), f"status' progress: {told}", out)


def job_progress(cell: Cell, run: Run) -> dict[str, Any]:
    """What ``torchjob status --json`` says of the cell's job: by the handle the run printed,
    else by its run directory in ``torchjob list``. Where nothing can be asked, the lines the
    run printed (as ``torchjob logs`` labels them), read as status reads a job's logs: on the
    pod emulator (no API server), and for TorchX's local_cwd (TorchX knows its apps only in
    the process that ran them)."""
    if cell.column.command or cell.column.backend == "torchx:local_cwd":
        told = from_logs(run.text().splitlines())
        assert told is not None, "no progress in the pods' logs"
        return told.as_json()
    found = HANDLE.search(run.text())
    handle = found[1] if found else ""
    if not handle:
        listed = torchjob("list", "--to", cell.column.backend, "--json", cwd=cell.workdir,
                          env=cell.env())
        assert listed.returncode == 0, listed.stdout + listed.stderr
        handle = next((job["handle"] for job in json.loads(listed.stdout)
                       if job["run_dir"] and Path(job["run_dir"]) == cell.run_dir), "")
        assert handle, f"the job of {cell.run_dir} is not listed: {listed.stdout}"
    shown = torchjob("status", "--json", handle, cwd=cell.workdir, env=cell.env())
    assert shown.returncode == 0, shown.stdout + shown.stderr
    told = json.loads(shown.stdout)
    assert isinstance(told, dict)
    return told


HANG_TIMEOUT_S = 20
DETECTED_WITHIN_S = 30  # from the SIGSTOP to the agent's line naming the rank
HUNG = re.compile(r"torchjob: node (\d) rank 1 hung \(last step (\d+), its process is stopped")


def hang(cell: Cell) -> None:
    """SIGSTOP of a worker mid-run (a hang: a stuck collective, a dead mount) with
    hang_timeout 20: detected within 30 s, the stacks written, rank 1 named, the group
    restarted from the last checkpoint; the job ends bitwise where an uninterrupted run ends."""
    run = cell.start(DEFAULT, *GATED, f"hang_timeout={HANG_TIMEOUT_S}",
                     f"checkpoint_budget={HANG_TIMEOUT_S // 2}")
    workers = cell.at_gate(run)
    cell.column.pause(cell, workers[1])
    stopped = time.monotonic()
    cell.open_gate()
    found = wait_until(lambda: HUNG.search(run.text()) or run.proc.poll() is not None,
                       DETECTED_WITHIN_S + 30, "the agent to name the hung rank 1", run.tail)
    detected = time.monotonic() - stopped
    expect(isinstance(found, re.Match), f"the run ended (exit {run.proc.poll()}) "
           f"{detected:.1f} s after the SIGSTOP without naming the hung rank 1", run.text())
    expect(detected <= DETECTED_WITHIN_S,
           f"hang named after {detected:.1f} s (within {DETECTED_WITHIN_S} s expected)",
           run.text())
    code = run.wait()
    out = run.text()
    expect(code == 0, f"exit code {code}, not 0", out)
    expect(len(HUNG.findall(out)) == 1 and RESTARTED.search(out), "not restarted once", out)
    expect("resumed from step_00000004" in out, "not resumed from the step-4 checkpoint", out)
    stacks = list((cell.run_dir / "hangs" / "attempt0").glob("node*-rank1.txt"))
    text = stacks[0].read_text() if stacks else ""
    expect("its process is stopped" in text and "at_gate" in text,
           f"no stack of the stopped rank 1 (found {stacks}): {text[:2000]}", out)
    expect(len(list((cell.run_dir / "hangs" / "attempt0").glob("node*-rank*.txt"))) == 2,
           "not every rank's stack written", out)
    assert_bitwise_equal(final_params(cell.run_dir / "checkpoints"), cell.reference())


def stop_and_resume(cell: Cell) -> None:
    """A stop (Ctrl-C, cancel, preemption) mid-run: a checkpoint, exit 143; the same command
    again resumes there and ends bitwise where an uninterrupted run ends."""
    run = cell.start(DEFAULT, *GATED)
    cell.at_gate(run)
    cell.column.stop(cell, run)
    wait_until(lambda: list(cell.gate.glob("stopping-*")) or run.proc.poll() is not None,
               EVENT_TIMEOUT_S, "a rank to see the stop", run.tail)
    cell.open_gate()  # a rank the signal missed learns of it from the others' vote
    code = run.wait()
    expect(code == 143, f"exit code {code}, not 143", run.text())
    stopped = sorted(p.name for p in (cell.run_dir / "checkpoints").glob("step_*"))
    expect(stopped and stopped[-1] < "step_00000010", f"no mid-run checkpoint: {stopped}",
           run.text())
    code, out = cell.run(DEFAULT, *GATED)
    expect(code == 0, f"the second run: exit code {code}, not 0", out)
    expect(f"resumed from {stopped[-1]}" in out, f"not resumed from {stopped[-1]}", out)
    assert_bitwise_equal(final_params(cell.run_dir / "checkpoints"), cell.reference())


def changed_config(cell: Cell) -> None:
    """A changed config over an old run directory is refused (exit 2, naming --fresh);
    ``--fresh`` then starts over, the old checkpoints moved aside. The old run directory is a
    copy of the success cell's (the same job and flags, so a run of its own would only repeat
    that run), or, where that cell did not run or did not finish, made by a run here."""
    finished = cell.sibling("success") / "runs" / "job"
    if read_json(finished / "summary.json").get("state") == "SUCCEEDED":
        cell.run_dir.parent.mkdir(parents=True, exist_ok=True)
        # cp -a: owners kept (a container's runs write there as the image's user)
        copied = subprocess.run(["cp", "-a", str(finished), str(cell.run_dir)],
                                capture_output=True, text=True, check=False)
        assert copied.returncode == 0, copied.stderr
    else:
        code, out = cell.run(DEFAULT, *TRAINER_SETS)
        expect(code == 0, f"the first run: exit code {code}, not 0", out)
    code, out = cell.run(DEFAULT, *TRAINER_SETS, "trainer.args.lr=0.002")
    expect(code == 2 and "--fresh" in out, f"changed config: exit code {code}, not 2", out)
    code, out = cell.run(DEFAULT, *TRAINER_SETS, "trainer.args.lr=0.002", options=("--fresh",))
    expect(code == 0 and "resumed from" not in out, f"--fresh: exit code {code}", out)
    aside = list(cell.run_dir.glob("checkpoints.old-*/step_*"))
    expect(bool(aside), "--fresh: the old checkpoints were not moved aside", out)


def third_party_script(cell: Cell) -> None:
    """pytorch/examples' kind of script: argv exactly as written, the launcher's environment
    the same on every backend (up to ports, ids and the host), its own directory first on
    sys.path, started in the job's directory."""
    code, out = cell.run(script_job(cell, SCRIPT_ARGS), *TOPOLOGY)
    expect(code == 0, f"exit code {code}, not 0", out)
    seen = {rank: json.loads((cell.run_dir / f"env-{rank}.json").read_text())
            for rank in (0, 1)}
    for rank, got in seen.items():
        assert got["argv"] == SCRIPT_ARGS, got["argv"]
        assert got["cwd"] == (cell.column.cwd or str(cell.workdir)), got["cwd"]
        assert got["parsed"] == {"total_epochs": 2, "save_every": 1, "batch_size": 8,
                                 "overrides": ["data.name=a b"]}, got["parsed"]
    assert {rank: launcher_view(got) for rank, got in seen.items()} == {
        rank: expected_view(rank) for rank in (0, 1)}
    assert (cell.run_dir / "checkpoints" / "snapshot.pt").is_file()


def example_script(cell: Cell) -> None:
    """jobs/examples/script.yaml as it ships, with fewer steps; the script calls nothing of
    torchjob's, and ``torchjob status`` shows its steps as its agents counted them (each
    worker's last word at exit), all of them."""
    example = cell.workdir / "jobs" / "examples"
    example.mkdir(parents=True)
    shutil.copy(ROOT / "jobs" / "examples" / "ddp_script.py", example)
    run = cell.start(ROOT / "jobs" / "examples" / "script.yaml", "trainer.args.steps=5")
    code = run.wait()
    out = run.text()
    expect(code == 0, f"exit code {code}, not 0", out)
    result = json.loads((cell.run_dir / "result.json").read_text())
    assert (result["world_size"], result["steps"]) == (2, 5), result
    told = job_progress(cell, run)
    expect((told["step"], told["total_steps"], told["restarts"]) == (5, None, 0),
           f"status' progress: {told}", out)


def script_job(cell: Cell, args: list[str]) -> Path:
    """A job running scripts/multigpu_torchrun.py (copied into the cell) with ``args``."""
    (cell.workdir / "scripts").mkdir(exist_ok=True)
    shutil.copy(HERE / "scripts" / "multigpu_torchrun.py", cell.workdir / "scripts")
    job = cell.workdir / "script.yaml"
    job.write_text(json.dumps({"name": "conformance-script", "trainer": {
        "script": "scripts/multigpu_torchrun.py", "args": args}}))
    return job


def launcher_view(seen: dict[str, Any]) -> dict[str, Any]:
    """What a script saw, with what may differ between runs made comparable: the rendezvous
    host, port and id replaced by what they are, paths made relative to the job's cwd."""
    env, cwd = dict(seen["env"]), seen["cwd"]
    marks = {"MASTER_ADDR": "<host>", "MASTER_PORT": "<port>", "TORCHELASTIC_RUN_ID": "<id>"}
    for key, mark in marks.items():
        if env.get(key) and (key != "MASTER_PORT" or env[key].isdigit()):
            env[key] = mark
    for key in ("TORCHJOB_RUN_DIR", "TORCHJOB_CHECKPOINT_DIR"):
        if env.get(key):
            env[key] = os.path.relpath(Path(cwd, env[key]), cwd)
    return {"env": env, "path0": os.path.relpath(seen["path0"], cwd)}


def expected_view(rank: int) -> dict[str, Any]:
    r = str(rank)
    return {"path0": "scripts", "env": {
        "RANK": r, "LOCAL_RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "1",
        "GROUP_RANK": r, "ROLE_RANK": r, "ROLE_WORLD_SIZE": "2", "MASTER_ADDR": "<host>",
        "MASTER_PORT": "<port>", "TORCHELASTIC_RUN_ID": "<id>",
        "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "2",
        "TORCHJOB_RUN_DIR": "runs/job", "TORCHJOB_CHECKPOINT_DIR": "runs/job/checkpoints"}}


SCENARIOS: dict[str, Callable[[Cell], None]] = {
    "success": success, "user exception": user_exception,
    "configuration error": configuration_error, "kill -9 of a worker": kill_worker,
    "hang": hang,
    "stop and resume": stop_and_resume, "changed config": changed_config,
    "third-party script": third_party_script, "examples/script.yaml": example_script,
}
