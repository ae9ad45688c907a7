"""``torchjob run --to docker``: one container per node under podman-compose, for real.

Two node containers train like two local nodes (same world size, seed and data order: the
same numbers); an elastic job loses a node and gets it back; a killed node is started again,
a failed job never; a node killed again and again never stops the job; a user's script runs
from the working directory; a submitted run is a job (status, logs, cancel, list: docker:PROJECT,
the README's docker session); and every run leaves no container or network behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest
import yaml

from torchjob.jobs.backend import GRACE_S
from torchjob.jobs.backends.docker.render import compose_text, render_compose
from torchjob.jobs.load import loads
from torchjob.jobs.runs import LAUNCHER_LOG, RECORD, RECORD_DIR
from tests.procs import (ROOT, TORCHJOB, assert_bitwise_equal, env_for_tests, final_params,
                         last_step, torchjob, wait_for)
from tests.readme_sessions import run_session, sessions
from torchjob.trainer.contract import parse_log_prefix

pytestmark = [pytest.mark.integration, pytest.mark.containers]
EXAMPLES = ROOT / "jobs" / "examples"
HERE = Path(__file__).resolve().parent
PROJECT = re.compile(r"project (\S+), compose file")


def podman(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL, check=False)


def run_args(job: str, *sets: str, to: str = "docker") -> list[str]:
    """``torchjob run --to TO EXAMPLE --set ...``'s words after ``torchjob``."""
    return ["run", "--to", to, str(EXAMPLES / job), *[a for s in sets for a in ("--set", s)]]


def start(args: list[str], cwd: Path, log: IO[str]) -> subprocess.Popen[str]:
    """``torchjob ARGS`` in ``cwd`` (made if need be), its output to ``log``."""
    cwd.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen([*TORCHJOB, *args], cwd=cwd, env=env_for_tests(), stdout=log,
                            stderr=subprocess.STDOUT, text=True)


@contextlib.contextmanager
def running(args: list[str], cwd: Path, logfile: Path) -> Iterator[subprocess.Popen[str]]:
    """``start`` with its output in ``logfile``; stopped (SIGTERM: compose down) when the
    test leaves the block with it still running."""
    with open(logfile, "w+") as log:
        proc = start(args, cwd, log)
        try:
            yield proc
        finally:
            if proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=120)


def project_of(log: Path) -> str:
    """The compose project the launcher announced (its containers carry it as a label)."""
    def find() -> str | None:
        match = PROJECT.search(log.read_text())
        return match.group(1) if match else None
    return str(wait_for(find, 120, "the launcher's project line"))


def ended(tmp_path: Path, *sets: str) -> tuple[int, str, str]:
    """``torchjob run --to docker`` of the default example with ``sets`` (its run directory
    under ``tmp_path``), to its end: its exit code, its output and its compose project."""
    logfile = tmp_path / "run.log"
    with running(run_args("default.yaml", *sets, f"run_dir={tmp_path}/run"), tmp_path / "job",
                 logfile) as proc:
        project = project_of(logfile)
        code = proc.wait(timeout=300)
    return code, logfile.read_text(), project


def container(project: str, service: str) -> str:
    proc = podman("ps", "-a", "-q", "--filter", f"label=com.docker.compose.project={project}",
                  "--filter", f"label=com.docker.compose.service={service}")
    ids = proc.stdout.split()
    assert ids, f"no container for {service} of {project}"
    return ids[0]


def assert_nothing_left(project: str) -> None:
    """compose down removed every container and the network of the project."""
    left = podman("ps", "-a", "-q", "--filter", f"label=com.docker.compose.project={project}")
    assert left.stdout.split() == [], f"containers left behind: {left.stdout}"
    nets = podman("network", "ls", "-q", "--filter", f"label=io.podman.compose.project={project}")
    assert nets.stdout.split() == [], f"networks left behind: {nets.stdout}"


def open_to_the_image(folder: Path) -> None:
    """``folder`` readable by the image's user, as a working directory the containers mount
    must be (pytest's temporary directories are private)."""
    folder.chmod(0o755)
    for parent in folder.parents:
        if parent == Path("/tmp"):
            break
        parent.chmod(parent.stat().st_mode | 0o005)


def world_sizes(out: str) -> list[int]:
    """World size of each process group formed, in order (rank 0's ``joined`` line)."""
    return [int(m) for m in re.findall(r"\[rank 0/(\d+)\] joined:", out)]


def test_two_node_containers_train_like_two_local_nodes(container_image: str,
                                                        tmp_path: Path) -> None:
    """2 containers x 2 processes and 2 local agents x 2 processes: same world size, seed and
    data order, so the same result to the last bit (accuracy and loss compared exactly). Both
    finish quietly: node 0, which hosts the store, waits for node 1 to be done with it (a node
    that finds the store closed prints C++ stack traces)."""
    results = {}
    for to in ("local", "docker"):
        cwd = tmp_path / to
        with open(tmp_path / f"{to}.log", "w+") as log:
            proc = start(run_args("default.yaml", "nnodes=2", to=to), cwd, log)
            code = proc.wait(timeout=900)
            log.seek(0)
            out = log.read()
        assert code == 0, out[-4000:]
        assert "TCPStore.cpp" not in out and "failed to shutdown" not in out, out[-4000:]
        results[to] = json.loads((cwd / "runs" / "digits" / "summary.json").read_text())
        if to == "docker":  # every line names its node; a worker's also its rank and attempt
            assert all(line.startswith(("[node 0", "[node 1", "torchjob: "))
                       for line in out.splitlines()), out[-3000:]
            assert {prefix[:3] for prefix in map(parse_log_prefix, out.splitlines())
                    if prefix} == {(0, 0, 0), (0, 1, 0), (1, 2, 0), (1, 3, 0)}, out[-3000:]
            project = PROJECT.search(out).group(1)  # type: ignore[union-attr]
            record = cwd / "runs" / "digits" / ".torchjob" / project
            assert (record / "compose.yaml").is_file() and (record / "node-1.log").is_file()
            assert_nothing_left(project)
    local, docker = results["local"], results["docker"]
    assert docker["world_size"] == local["world_size"] == 4
    assert docker["steps"] == local["steps"]
    assert docker["accuracy"] == local["accuracy"] >= 0.95
    assert docker["final_loss"] == local["final_loss"]


def test_hostile_values_reach_the_container_unchanged(container_image: str,
                                                      tmp_path: Path) -> None:
    """Through YAML, compose's $-interpolation and podman: env values and arguments arrive
    exactly as written in the spec."""
    values = ["a'; touch /tmp/x", "${HOME} $USER $$", "$(id) `id`", "new\nline", "1e3",
              "caf\u00e9 \u65e5\u672c", "- dash", "key: value", " spaced "]
    spec = loads(yaml.safe_dump({"name": "hostile", "nnodes": 1,
                                 "env": {f"V{i}": v for i, v in enumerate(values)},
                                 "trainer": {"module": "x", "args": {"note": values[1]}}},
                                default_style='"'))
    doc = render_compose(spec, host_dir=str(tmp_path))
    service = doc["services"]["node0"]
    code = ("import json, os, sys; print(json.dumps([[os.environ.get(f'V{i}') for i in "
            f"range({len(values)})], sys.argv[1:]]))")
    service["command"] = ["python", "-c", code, *service["command"][-2:]]
    (tmp_path / "runs").mkdir()
    file = tmp_path / "compose.yaml"
    file.write_text(compose_text(doc))
    project = f"hostile-{os.getpid()}"
    try:
        up = subprocess.run(["podman-compose", "-p", project, "-f", str(file), "up", "-d"],
                            capture_output=True, text=True, timeout=300)
        assert up.returncode == 0, up.stdout + up.stderr
        cid = container(project, "node0")
        wait_for(lambda: podman("inspect", "-f", "{{.State.Status}}", cid).stdout.strip()
                 == "exited", 120, "the container to exit")
        logs = podman("logs", cid)
    finally:
        subprocess.run(["podman-compose", "-p", project, "-f", str(file), "down", "-t", "1"],
                       capture_output=True, timeout=300)
        nets = podman("network", "ls", "-q", "--filter",
                      f"label=io.podman.compose.project={project}").stdout.split()
        if nets:
            podman("network", "rm", "-f", *nets)
    env, argv = json.loads(logs.stdout.strip().splitlines()[-1])
    assert env == values
    assert argv == ["--note", values[1]]
    assert_nothing_left(project)


# the synthetic task, slowed while the world is below 4 (slow_alone.py says why), mounted
# from this folder the way a user brings their own task
ELASTIC = [f"mounts=[{{source: {HERE}, target: /opt/usertask, read_only: true}}]",
           "env.PYTHONPATH=/opt/usertask", "env.SLOW_ALONE_BELOW=4",
           "trainer.args.task=slow_alone:task", "trainer.args.batch_size=8",
           "trainer.args.epochs=2", "trainer.args.checkpoint_every=50",
           "trainer.args.log_every=10", "trainer.args.progress=lines",
           "trainer.args.eval_every=0", "collective_timeout=30", "hang_timeout=0"]


def test_elastic_node_stopped_and_started_again(container_image: str, tmp_path: Path) -> None:
    """nnodes 1:2: podman stop node1 mid-run: node0 goes on alone from the checkpoint (world
    4 -> 2); podman start node1: it joins the next rendezvous (2 -> 4); the job completes."""
    logfile = tmp_path / "run.log"
    run_dir = tmp_path / "runs" / "digits-elastic"
    with running(run_args("elastic.yaml", *ELASTIC), tmp_path, logfile) as proc:
        project = project_of(logfile)
        # both nodes in one group first (a node started late joins a later round)
        wait_for(lambda: (last_step(run_dir) >= 50 and world_sizes(logfile.read_text())[-1:]
                          == [4]) or proc.poll() is not None, 300, "training at world size 4")
        node1 = container(project, "node1")
        stop = podman("stop", "-t", "30", node1)
        assert stop.returncode == 0, stop.stderr
        # node0's workers lose their peers; its agent re-forms the group alone
        wait_for(lambda: world_sizes(logfile.read_text())[-1:] == [2]
                 or proc.poll() is not None, 300, "node0 going on alone")
        started = podman("start", node1)
        assert started.returncode == 0, started.stderr
        code = proc.wait(timeout=900)
    out = logfile.read_text()
    assert code == 0, out[-5000:]
    sizes = world_sizes(out)
    print(f"world sizes of the groups formed: {sizes}")
    assert 4 in sizes and sizes[-1] == 4, (sizes, out[-5000:])
    assert "world size changed from 4 to 2" in out and "world size changed from 2 to 4" in out
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["world_size"] == 4
    assert_nothing_left(project)


def test_killed_node_is_started_again_and_the_run_ends_bitwise_equal(
        container_image: str, tmp_path: Path) -> None:
    """nnodes 2 (fixed): node1's agent dies (SIGKILL from the host, as the OOM killer would):
    the launcher starts the container again (exit 137: killed), it rejoins, the group resumes
    from the checkpoint at the same world size, and the final parameters are those of an
    uninterrupted run, bit for bit (a local run of the same job is the reference).

    One process per node: with two ranks an all-reduce sum does not depend on the order of
    its terms. With four, the first step after a resume can differ in the last bits (DDP
    reduces it in its initial bucket layout, an uninterrupted run in the rebuilt one)."""
    sets = ["nnodes=2", "nproc_per_node=1", "trainer.args.epochs=3", "trainer.args.batch_size=8",
            "trainer.args.checkpoint_every=10", "trainer.args.log_every=1",
            "trainer.args.progress=lines", "trainer.args.eval_every=0",
            "collective_timeout=30", "hang_timeout=0"]
    with open(tmp_path / "local.log", "w+") as log:
        ref = start(run_args("default.yaml", *sets, to="local"), tmp_path / "local", log)
        assert ref.wait(timeout=600) == 0, log.read()[-3000:]
    logfile = tmp_path / "docker.log"
    run_dir = tmp_path / "docker" / "runs" / "digits"
    with running(run_args("default.yaml", *sets), tmp_path / "docker", logfile) as proc:
        project = project_of(logfile)
        wait_for(lambda: last_step(run_dir) >= 40 or proc.poll() is not None, 300, "step 40")
        node1 = container(project, "node1")
        pid = int(podman("inspect", "-f", "{{.State.Pid}}", node1).stdout)
        os.kill(pid, signal.SIGKILL)  # the agent is the container's first process
        code = proc.wait(timeout=900)
    out = logfile.read_text()
    assert code == 0, out[-5000:]
    assert world_sizes(out)[0] == 2 and world_sizes(out)[-1] == 2, world_sizes(out)
    assert "node1 was killed (exit 137): starting it again (restart 1 of 3)" in out
    assert_bitwise_equal(final_params(run_dir / "checkpoints"),
                         final_params(tmp_path / "local" / "runs" / "digits" / "checkpoints"))
    assert_nothing_left(project)


RAISES_ON_RANK_1 = """\
import torch.distributed as dist

dist.init_process_group("gloo")
if dist.get_rank() == 1:
    raise ValueError("boom on rank 1")
dist.barrier()  # rank 0 loses its peer here: not a failure of its own
"""


def test_a_users_script_that_raises_is_not_retried(
        container_image: str, tmp_path: Path) -> None:
    """A script that raises on rank 1 of two node containers fails the job at once with exit
    1: no worker restart, no container restart, the last line names node 1 rank 1 and the
    exception. A working directory the image's user cannot read is refused with exit 2 before
    any container starts. (A script from the working directory, mounted at /workspace, writing
    its result there: the conformance matrix's script rows; the no-YAML form: the README's
    quickstart session.)"""
    cwd = tmp_path / "job"
    (cwd / "jobs" / "examples").mkdir(parents=True)
    (cwd / "jobs" / "examples" / "ddp_script.py").write_bytes(
        (EXAMPLES / "ddp_script.py").read_bytes())
    (cwd / "raises.py").write_text(RAISES_ON_RANK_1)
    cwd.chmod(0o700)
    nodes = ["nnodes=2", "nproc_per_node=1"]
    refused = torchjob(*run_args("script.yaml", *nodes), cwd=cwd, env=env_for_tests())
    assert refused.returncode == 2, refused.stderr
    assert f"chmod o+rx {cwd}" in refused.stderr and "Traceback" not in refused.stderr
    open_to_the_image(cwd)

    logfile = tmp_path / "fails.log"
    began = time.monotonic()
    with running(run_args("script.yaml", *nodes, "trainer.script=raises.py",
                          "trainer.args=[]"), cwd, logfile) as proc:
        project = project_of(logfile)
        code = proc.wait(timeout=600)
    out = logfile.read_text()
    print(f"a script that raises failed in {time.monotonic() - began:.1f} s")
    assert code == 1, out[-4000:]
    last = out.strip().splitlines()[-1]
    assert last.startswith("torchjob: the job failed: node 1 rank 1 raised ValueError: boom "
                           "on rank 1"), out[-4000:]
    assert "; full logs: " in last
    assert "attempt 1]" not in out and "starting it again" not in out, out[-4000:]
    assert_nothing_left(project)


def test_gpus_the_engine_did_not_give_stop_the_job_with_the_fix(container_image: str,
                                                                 tmp_path: Path) -> None:
    """resources.gpus reserves NVIDIA GPUs in compose; an engine without them (this host's
    podman: no GPU, no CDI spec) starts the container anyway, and the job trained on the CPU.
    Now each node's agent finds fewer GPUs than asked: exit 2, the fix, no worker started. The
    kit's image carries a CPU build of torch, which no engine's GPUs would help: said first."""
    code, out, project = ended(tmp_path, "resources.gpus=1", "nproc_per_node=1")
    assert code == 2, out[-4000:]
    assert re.match(r"torchjob: the job failed: the job asks for 1 GPU\(s\) per node "
                    r"\(resources.gpus\), but torch \S+ on node0 is built for the CPU alone",
                    out.strip().splitlines()[-1]), out[-4000:]
    assert "joined:" not in out
    assert_nothing_left(project)


def test_a_container_that_cannot_start_ends_the_run_with_the_engines_error(
        container_image: str, tmp_path: Path) -> None:
    """An image without ``python`` (the kit's debootstrap base: python3 alone): podman-compose
    ends 0 with the container left created, and the run waited for it for ever, past Ctrl-C.
    Now: exit 2 with the engine's own error, nothing left."""
    code, out, project = ended(tmp_path, "image=localhost/torchjob-base:bookworm")
    assert code == 2, out[-4000:]
    assert re.search(r"torchjob: node0's container could not start: .*\"python\": executable "
                     r"file not found in \$PATH.* \(image localhost/torchjob-base:bookworm\)",
                     out), out[-4000:]
    assert_nothing_left(project)


def test_the_readme_docker_quickstart(container_image: str, tmp_path: Path) -> None:
    """The quickstart's script in two node containers, no YAML: the working directory (a copy
    of jobs/examples, which the containers see mounted) readable by the image's user."""
    open_to_the_image(tmp_path)
    run_session(sessions()["quick-docker"], tmp_path, copy=True)


def test_the_readme_docker_session(container_image: str, tmp_path: Path) -> None:
    """The README's docker session, for real: a short run in the foreground; a long one
    submitted and cancelled at once, STOPPED with 143 within the grace period (the SIGTERM
    lands before, while or after its containers start: none is left to the engine's
    SIGKILL); both listed. Then no container or network of either is left."""
    run_session(sessions()["docker"], tmp_path)
    records = {path.parent.name: json.loads(path.read_text())
               for path in tmp_path.glob(f"runs/*/{RECORD_DIR}/*/{RECORD}")}
    assert sorted(r["name"] for r in records.values()) == ["digits", "digits-long"], records
    for project, record in records.items():
        assert_nothing_left(project)
        if record["name"] == "digits-long":
            said = (tmp_path / "runs" / "digits-long" / RECORD_DIR / project
                    / LAUNCHER_LOG).read_text()
            assert record["ended"] - record["started"] < GRACE_S, said
            assert "exit code 137" not in said, said  # killed after the grace: not stopped


# -- no single point of failure: the node the rendezvous endpoint used to point at may go too --

TRIALS = int(os.environ.get("TORCHJOB_TRIALS", "1"))  # by hand: TORCHJOB_TRIALS=5
# node0, where the endpoint used to point; node1 is lost (stopped) and comes back in
# test_elastic_node_stopped_and_started_again. By hand: TORCHJOB_VICTIMS=node0,node1
VICTIMS = os.environ.get("TORCHJOB_VICTIMS", "node0").split(",")


@pytest.mark.parametrize("victim", VICTIMS)
def test_an_elastic_job_survives_losing_any_node(request: pytest.FixtureRequest,
                                                 tmp_path: Path, victim: str) -> None:
    """nnodes 1:2, the rendezvous store in its own service: podman kill of ``victim`` (node0,
    where the endpoint pointed before the store had a service of its own, or node1) mid-run,
    never started again (docker.restart=no: the node is lost): the store keeps serving, the
    other node finishes alone from the newest checkpoint, the run exits 0 and leaves nothing
    behind. TORCHJOB_TRIALS times (5 by hand; TORCHJOB_TEST_IMAGE: an image of your own
    instead of building the shared one)."""
    image = os.environ.get("TORCHJOB_TEST_IMAGE") or request.getfixturevalue("container_image")
    failures = []
    for trial in range(TRIALS):
        cwd = tmp_path / f"trial{trial}"
        logfile = tmp_path / f"trial{trial}.log"
        run_dir = cwd / "runs" / "digits-elastic"
        began = time.monotonic()
        argv = run_args("elastic.yaml", f"image={image}", "docker.restart=no",
                        "trainer.args.epochs=3", "trainer.args.batch_size=8",
                        "trainer.args.checkpoint_every=10", "trainer.args.log_every=1",
                        "trainer.args.progress=lines", "collective_timeout=30",
                        "hang_timeout=0")
        with running(argv, cwd, logfile) as proc:
            project = project_of(logfile)
            wait_for(lambda: last_step(run_dir) >= 30 or proc.poll() is not None, 300,
                     "step 30")
            store = container(project, "rendezvous")
            killed = podman("kill", container(project, victim))
            code = proc.wait(timeout=600)
        out = logfile.read_text()
        problem = None
        if killed.returncode != 0:
            problem = f"podman kill failed: {killed.stderr}"
        elif code != 0:
            problem = f"exit {code}"
        elif world_sizes(out)[-1:] != [2]:
            problem = f"the survivor did not go on alone (world sizes {world_sizes(out)})"
        elif json.loads((run_dir / "summary.json").read_text())["world_size"] != 2:
            problem = "no summary at world size 2"
        else:
            try:
                assert_nothing_left(project)
            except AssertionError as exc:
                problem = str(exc)
        print(f"trial {trial}: podman kill {victim} at step >= 30 (store {store[:12]}): "
              f"{problem or 'ok'} (world sizes {world_sizes(out)}) in "
              f"{time.monotonic() - began:.1f}s")
        if problem:
            failures.append(f"trial {trial}: {problem}\n{out[-3000:]}")
    assert not failures, f"{len(failures)}/{TRIALS} trials failed:\n" + "\n".join(failures)


SAVES_ON_SIGTERM = """\
import os, signal, sys, time
import torch.distributed as dist
dist.init_process_group("gloo")
def saved(*_):
    open(os.path.join(os.environ["TORCHJOB_RUN_DIR"], f"saved-{dist.get_rank()}"), "w").close()
    sys.exit(143)
signal.signal(signal.SIGTERM, saved)
print(f"rank {dist.get_rank()} in its loop", flush=True)
while True:
    time.sleep(0.1)
"""


def test_a_launcher_killed_outright_leaves_no_container_and_its_workers_save(
        container_image: str, tmp_path: Path) -> None:
    """kill -9 of ``torchjob run --to docker``: no handler of its runs, and its containers ran
    on for ever with nobody following them. Its watch (a process of its own session whose
    stdin was the launcher's pipe) stops them as a Ctrl-C does, then removes them."""
    (tmp_path / "saves.py").write_text(SAVES_ON_SIGTERM)
    open_to_the_image(tmp_path)
    logfile = tmp_path / "run.log"
    with running(["run", "--to", "docker", "--nnodes", "2", "saves.py"], tmp_path,
                 logfile) as proc:
        project = project_of(logfile)
        wait_for(lambda: logfile.read_text().count(" in its loop") == 2
                 or proc.poll() is not None, 300, "both ranks in their loop")
        proc.kill()
        proc.wait(timeout=60)
    run_dir = tmp_path / "runs" / "saves"
    def left() -> str:  # the containers, then the network: removed last
        return (podman("ps", "-a", "-q", "--filter", f"label=com.docker.compose.project="
                       f"{project}").stdout + podman("network", "ls", "-q", "--filter",
                       f"label=io.podman.compose.project={project}").stdout).strip()
    wait_for(lambda: not left(), 180, f"no container or network of {project} left")
    assert (run_dir / "saved-0").exists() and (run_dir / "saved-1").exists(), \
        "\n".join(p.read_text() for p in run_dir.rglob("reaper.log"))
