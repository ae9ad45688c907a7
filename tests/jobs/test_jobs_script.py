"""``trainer.script``: a user's own script instead of a module, through every backend's one
agent command (the Slurm batch script's too), and for real through TorchX's own `torchx run`
of the component (through `torchjob run` on every backend: tests/conformance). A script's
argv is exactly its ``trainer.args``; its directories come in ``TORCHJOB_RUN_DIR`` and
``TORCHJOB_CHECKPOINT_DIR``."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Callable

import pytest

from torchjob.jobs.backends.docker.render import render_compose
from torchjob.jobs.backends.local.render import render_local
from torchjob.jobs.backends.torchx.render import render_appdef
from torchjob.jobs.command import agent_command
from torchjob.jobs.backends.torchx.components import train
from torchjob.jobs.load import build
from torchjob.jobs.spec import JobSpec
from torchjob.jobs.values import Nnodes, SpecError
from torchjob.k8s.pytorchjob import render_pytorchjob
from torchjob.k8s.trainjob import render_trainjob
from torchjob.trainer.agent import own_options
from torchjob.trainer.gpus import report
from torchjob.slurm.sbatch import render_sbatch
from tests.jobs.test_jobs_components import torchx_env
from tests.procs import ROOT, env_for_tests, torchjob

SCRIPT = "jobs/examples/ddp_script.py"
DIRS = ("--run-dir", "runs/s", "--checkpoint-dir", "runs/s/checkpoints")


def spec(**trainer: object):  # type: ignore[no-untyped-def]
    return build({"name": "s", "nproc_per_node": 2, "trainer": trainer}, source="test")


def test_script_replaces_the_module_right_after_the_agent_flags() -> None:
    command = agent_command(spec(script=SCRIPT, args={"steps": 5}), python="py",
                            rdzv_endpoint="h:1", run_id="r")
    at = command.index(SCRIPT)
    assert command[at - 2:at] == ("--monitor-interval", "0.1") and "-m" not in command[3:]
    assert command[at + 1:] == ("--steps", "5")  # nothing added to the script's own argv
    assert command[3:7] == DIRS  # the agent's: it exports them to the workers


def test_script_args_are_the_scripts_own() -> None:
    """Not the trainer's options: a script's arguments are not checked by the trainer."""
    assert spec(script=SCRIPT, args={"steps": 5}).trainer.args == {"steps": 5}
    with pytest.raises(SpecError, match="steps"):
        spec(args={"steps": 5})


@pytest.mark.parametrize("trainer, message", [
    ({"script": SCRIPT, "module": "mypkg.train"}, "both set"),
    ({"script": "-x.py"}, "starts with '-'"),
    ({"script": "a\nb.py"}, "single line"),
])
def test_bad_script_settings(trainer: dict, message: str) -> None:
    with pytest.raises(SpecError, match=message) as err:
        spec(**trainer)
    assert "trainer." in str(err.value)


def test_the_builtin_trainer_still_gets_its_directories_as_flags() -> None:
    command = agent_command(spec(args=["--epochs=2"]), python="py", rdzv_endpoint="h:1",
                            run_id="r")
    assert command[3:7] == DIRS
    assert command[command.index("torchjob.trainer", 4) + 1:] == (*DIRS, "--epochs=2")


WORDS = ["10", "5", "--batch_size=32", "model.depth=4", "--name", "a b'; echo x", "--", "-1"]


def script_argv(words: list[str]) -> list[str]:
    """What follows the script in one node's command."""
    return words[words.index("/app/train.py") + 1:]


def shell_words(text: str, start: str, end: str) -> list[str]:
    """The words of the line holding ``start``, from it up to ``end``, as bash reads them."""
    line = next(line for line in text.splitlines() if start in line)
    words = shlex.split(line[line.index(start):])
    return words[:words.index(end)] if end in words else words


RENDERS: dict[str, Callable[[JobSpec], list[str]]] = {
    "local": lambda s: list(render_local(s, port=1, python="py", run_id="r",
                                         cpu_count=2).commands[0]),
    "docker": lambda s: render_compose(s)["services"]["node0"]["command"],
    "torchx": lambda s: shlex.split(render_appdef(s).roles[0].args[1]),
    "slurm": lambda s: shell_words(render_sbatch(s, python="py", workdir="/w"), "py -m", "&"),
    "k8s": lambda s: next(iter(render_pytorchjob(s)["spec"]["pytorchReplicaSpecs"].values()))[
        "template"]["spec"]["containers"][0]["command"],
    # one node: a TrainJob of more needs k8s.pvc, which moves the directories under it
    "k8s:trainjob": lambda s: render_trainjob(replace(s, nnodes=Nnodes(1, 1), local=replace(
        s.local, nodes=1)))["spec"][
        "trainer"]["command"],
}


@pytest.mark.parametrize("backend", sorted(RENDERS))
def test_every_backend_runs_the_script_with_exactly_its_args(backend: str) -> None:
    job = build({"name": "s", "nnodes": 2, "trainer": {"script": "/app/train.py",
                                                      "args": WORDS},
                 "k8s": {"checkpoints": "pod-local"}}, source="test")
    command = RENDERS[backend](job)
    assert script_argv(command) == WORDS
    assert "--run-dir" not in script_argv(command)
    assert command[command.index("torchjob.trainer.agent") + 1:][:4] == list(DIRS)


@pytest.mark.parametrize("words", [["--"], ["--", "--"], ["--", "x"], ["x", "--", "--"]])
@pytest.mark.parametrize("entry", [{"script": SCRIPT}, {"module": "mypkg.train"}])
def test_the_agent_gives_the_script_its_words_as_torchrun_does(words: list[str],
                                                                 entry: dict) -> None:
    """torchrun's parser, the agent's, takes a ``--`` right after the script or module for its
    own: a script's first word ``--`` reached it as nothing."""
    from torch.distributed.run import get_args_parser

    command = agent_command(spec(**entry, args=words), python="py", rdzv_endpoint="h:1",
                            run_id="r", extra_args=("y",))
    parser = get_args_parser()
    parser.allow_abbrev = False
    agent = parser.parse_args(own_options(list(command[3:]))[0])
    assert agent.training_script_args == [*words, "y"]
    alone = agent_command(spec(**entry), python="py", rdzv_endpoint="h:1", run_id="r",
                          extra_args=tuple(words))  # a TorchX component's script_args
    assert parser.parse_args(own_options(list(alone[3:]))[0]).training_script_args == words


def test_slurm_sweep_of_a_script_puts_its_directories_on_the_agent() -> None:
    from torchjob.jobs.sweep import parse_sweep

    job = spec(script="/app/train.py", args={"lr": 0.1})
    text = render_sbatch(job, python="py", workdir="/w", sweep=parse_sweep(["lr=1,2"]))
    assert "dirs=(--run-dir runs/s/lr=1 --checkpoint-dir runs/s/lr=1/checkpoints)" in text
    assert "point=(--lr 1.0) ;;" in text
    assert 'py -m torchjob.trainer.agent "${dirs[@]}" --hang-timeout 180 --nnodes' in text
    assert '/app/train.py "${point[@]}" &' in text


@pytest.mark.parametrize("name", ["TORCHJOB_RUN_DIR", "TORCHJOB_CHECKPOINT_DIR"])
def test_the_directories_variables_come_from_the_spec_only(name: str) -> None:
    with pytest.raises(SpecError, match=f"env.{name}: '{name}' is set by torchjob .* run_dir"):
        build({"name": "s", "env": {name: "/x"}}, source="test")


def test_component_takes_a_script_or_a_module() -> None:
    args = train("--steps", "5", script=SCRIPT, j="1x2").roles[0].args[1]
    assert args.endswith(f"--monitor-interval 0.1 {SCRIPT} --steps 5")
    assert train(m="mypkg.train").roles[0].args[1].endswith("0.1 -m mypkg.train")
    assert train().roles[0].args[1].endswith("-m torchjob.trainer --run-dir runs/torchjob "
                                             "--checkpoint-dir runs/torchjob/checkpoints")
    with pytest.raises(ValueError, match="give one"):
        train(m="trainer", script=SCRIPT)


def test_slurm_script_runs_the_script_under_each_nodes_agent() -> None:
    text = render_sbatch(spec(script=SCRIPT, args={"steps": 5}), python="py", workdir="/w")
    assert f"--monitor-interval 0.1 {SCRIPT} --steps 5 &" in text


def test_missing_script_is_a_user_error_and_nothing_starts(tmp_path: Path) -> None:
    out = torchjob("run", "jobs/examples/script.yaml", "--set", "trainer.script=nowhere/train.py",
                   "--set", f"run_dir={tmp_path}/run", env=env_for_tests())
    assert out.returncode == 2, out.stderr
    assert "'nowhere/train.py' is not a file" in out.stderr
    assert not (tmp_path / "run").exists()


def test_one_process_per_gpu_where_torch_sees_none_is_a_user_error_and_nothing_starts(
        tmp_path: Path) -> None:
    # no GPU for this run on any machine: the count is the one the nodes would make
    env = {**env_for_tests(), "CUDA_VISIBLE_DEVICES": ""}
    out = torchjob("run", "jobs/examples/script.yaml", "--set", "nproc_per_node=gpu",
                   "--set", f"run_dir={tmp_path}/run", env=env)
    assert out.returncode == 2, out.stderr
    version, gpu_build, _ = report()
    seen = "torch sees no CUDA GPU on this machine (CUDA_VISIBLE_DEVICES=)" if gpu_build \
        else f"torch {version} is built for the CPU alone"
    assert f"nproc_per_node: gpu starts one process per GPU, but {seen}: give a count " \
        "instead" in out.stderr, out.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("name", ["torchjob.py", "torchjob/__init__.py"])
@pytest.mark.parametrize("to", ["local", "slurm"])
def test_a_torchjob_module_where_the_nodes_start_is_refused(tmp_path: Path, name: str,
                                                             to: str) -> None:
    """Every node's ``python -m torchjob.trainer.agent`` would import it instead of the kit
    (and run a user's script named torchjob.py in the agent): exit 2 with the fix, nothing
    started or submitted."""
    (tmp_path / "train.py").write_text("print('ran')\n")
    (tmp_path / name).parent.mkdir(exist_ok=True)
    (tmp_path / name).write_text("raise SystemExit('imported instead of the kit')\n")
    # the console script, as a user types it (``python -m torchjob.jobs`` would import it too)
    out = subprocess.run([str(Path(sys.executable).parent / "torchjob"), "run", "--to", to,
                          "--nproc-per-node", "2", "train.py"], cwd=tmp_path, env=env_for_tests(),
                         capture_output=True, text=True, timeout=120, check=False,
                         stdin=subprocess.DEVNULL)
    assert out.returncode == 2, out.stderr
    assert f"{tmp_path / name}: every node would import this file instead of torchjob" in \
        out.stderr and "rename it" in out.stderr, out.stderr
    assert "ran" not in out.stdout and not (tmp_path / "runs").exists()


@pytest.mark.integration
def test_torchx_local_cwd_runs_the_script(tmp_path: Path) -> None:
    out = subprocess.run([str(Path(sys.executable).parent / "torchx"), "run", "-s", "local_cwd",
                          f"{ROOT}/jobs/backends/torchx/components.py:train", "-j", "1x2", "--name", "sx",
                          "--script", f"{ROOT}/{SCRIPT}", "--", "--steps", "20"],
                         cwd=tmp_path, env=torchx_env(), capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads((tmp_path / "runs/sx/result.json").read_text())
    assert result == {**result, "world_size": 2, "steps": 20}


# words a script may take that abbreviate two options of torchjob's or torchrun's (argparse
# stops at those, bare torchrun included: --d, --log, --m, --n), and a word after --
AMBIGUOUS = ["--d", "$(echo x)", "--log", "--m=3", "--n", "3", "--s", "--", "--tail", "-h"]


@pytest.mark.integration
def test_a_scripts_words_that_abbreviate_launcher_options_reach_it(tmp_path: Path) -> None:
    (tmp_path / "argv.py").write_text(
        "import json, os, sys\n"
        "open(f\"argv{os.environ['RANK']}.json\", 'w').write(json.dumps(sys.argv[1:]))\n")
    out = torchjob("run", "--nproc-per-node", "2", "argv.py", *AMBIGUOUS, cwd=tmp_path,
                   env=env_for_tests())
    assert out.returncode == 0, out.stderr[-3000:]
    for rank in (0, 1):
        assert json.loads((tmp_path / f"argv{rank}.json").read_text()) == AMBIGUOUS


def test_torchjobs_own_options_are_spelled_in_full(tmp_path: Path) -> None:
    out = torchjob("run", "--nproc", "2", "argv.py", cwd=tmp_path, env=env_for_tests())
    assert out.returncode == 2
    assert "unrecognized arguments: --nproc" in out.stderr
    assert not (tmp_path / "runs").exists()


def test_a_script_is_any_file_of_python_as_torchrun_takes_it(tmp_path: Path) -> None:
    from torchjob.jobs.invocation import is_script
    files = {"tool": "#!/usr/bin/env python3\nprint('ran')\n", "plain": "import sys\nprint(1)\n",
             "job": "name: j\n", "broken": "name: [x\n", "n": "42\n", "empty": "",
             "list.txt": "[1, 2]\n", "train.yaml": "import sys\n"}
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    assert {name for name in [*files, "missing"] if is_script(str(tmp_path / name))} == \
        {"tool", "plain"}
    assert is_script("not/there.py")  # a missing script is the spec's error to give


@pytest.mark.integration
def test_a_script_without_py_runs_with_its_words(tmp_path: Path) -> None:
    (tmp_path / "train").write_text("#!/usr/bin/env python3\nimport json, sys\n"
                                    "open('argv.json', 'w').write(json.dumps(sys.argv[1:]))\n")
    out = torchjob("run", "train", "--x", "1", cwd=tmp_path, env=env_for_tests())
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads((tmp_path / "argv.json").read_text()) == ["--x", "1"]
    assert (tmp_path / "runs" / "train").is_dir()  # named after the script


UNENDED = """import os, sys, time
r = os.environ["RANK"]
print(f"R{r} in two", end="", flush=True)
time.sleep(0.5)  # its tail reads the first part alone
print(f" parts {r}", flush=True)
sys.stdout.buffer.write(b"R%s bytes \\xff not utf-8\\n" % r.encode())
print(f"R{r} long " + "x" * (1 << 21), flush=True)  # both ranks at once: many pipe writes
print(f"R{r} unended", end="")
"""


@pytest.mark.integration
def test_every_line_of_a_script_is_whole_under_its_own_rank(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    """A line written in two parts is one line; a last line without its newline gets one and
    never runs into another rank's, nor does a long line (2 MiB, written by both ranks at
    once) or one of bytes that are not UTF-8; ``logs(rank=R)`` finds each."""
    from torchjob.jobs.api import load, logs, submit, wait

    (tmp_path / "unended.py").write_text(UNENDED)
    (tmp_path / "job.yaml").write_text("name: unended\nnproc_per_node: 2\n"
                                       "trainer: {script: unended.py}\n")
    monkeypatch.chdir(tmp_path)
    handle = submit(load("job.yaml"), to="local")
    assert wait(handle, timeout=180).exit_code == 0
    for rank in (0, 1):
        said = [line.split("] ", 1)[-1] for line in logs(handle, rank=rank)
                if line.startswith(f"[node 0 rank {rank} ")]
        long = f"R{rank} long " + "x" * (1 << 21)
        assert said[:2] == [f"R{rank} in two parts {rank}", f"R{rank} bytes \ufffd not utf-8"]
        assert said[-1] == f"R{rank} unended", [line[:80] for line in said]
        assert "".join(said[2:-1]) == long, [line[:80] for line in said]  # whole, or in parts
    strays = [line[:80] for line in logs(handle) if not line.startswith("[node 0 rank ")
              and ("R0" in line or "R1" in line or "xxxx" in line)]
    assert not strays, strays


HELD = """import os, threading, time
import torch, torch.distributed as dist
def upload():
    time.sleep(3600)  # never ends, never joined
dist.init_process_group("gloo")
for _ in range(3):
    dist.all_reduce(torch.ones(1))
dist.destroy_process_group()
if os.environ["RANK"] == "1":
    threading.Thread(target=upload, name="uploader").start()
print("main done", flush=True)
"""


@pytest.mark.integration
def test_a_script_whose_exit_waits_for_its_own_thread_fails_naming_it(tmp_path: Path) -> None:
    """Its last line ran, but a thread that is not a daemon holds rank 1's exit: before, the
    job waited for ever (nothing waits in a collective, so no rule saw a hang); now the hang
    timeout names the rank, the thread and its line, and the job fails without a restart
    (one would end the same way)."""
    (tmp_path / "held.py").write_text(HELD)
    out = torchjob("run", "--nproc-per-node", "2", "--set", "hang_timeout=12", "--set",
                   "checkpoint_budget=5", "--set", "stop_grace=8", "held.py", cwd=tmp_path,
                   env=env_for_tests(), timeout=120)
    assert out.returncode == 1, out.stderr[-3000:]
    last = out.stderr.strip().splitlines()[-1]
    assert "the job failed: node 0 rank 1 hung" in last and "at held.py:4 in upload" in last \
        and "its script ended, but its exit waits for its thread 'uploader'" in last \
        and "not retried" in last, last
    assert "attempt 1" not in out.stdout + out.stderr
