"""Code shipped to clusters (torchjob.jobs.workspace): a script or module job on a backend whose
nodes run an image gets an image built from the working directory, which ``render`` shows, or
is refused before anything is submitted, naming the fix. (The build and a run of a user's
script from the built image: tests/k8s/test_k8s_pod_contract.py.)"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from torchjob.jobs import workspace
from torchjob.jobs.load import loads
from torchjob.jobs.values import SpecError
from tests.jobs.test_jobs_cli import assert_user_error
from tests.procs import torchjob

IMAGE_BACKENDS = ["k8s", "k8s:trainjob", "torchx:kubernetes", "torchx:local_docker"]
HOST_BACKENDS = ["local", "docker", "slurm", "torchx:local_cwd", "torchx:slurm"]


def project(tmp_path: Path) -> Path:
    (tmp_path / ".torchxconfig").write_text("[kubernetes]\nqueue = default\n")
    (tmp_path / "train.py").write_text("import mylib\n")
    (tmp_path / "mylib").mkdir()
    (tmp_path / "mylib" / "__init__.py").write_text("X = 1\n")
    return tmp_path


def images(text: str) -> set[str]:
    return set(re.findall(r"(?:image: |\"image\": \"|--image[= ])([^\s\"',]+)", text)) | \
        set(re.findall(r"localhost/torchjob[\w./:-]*", text))


@pytest.mark.parametrize("to", IMAGE_BACKENDS)
def test_a_script_job_gets_an_image_of_the_working_directory(tmp_path: Path, to: str) -> None:
    folder = project(tmp_path)
    first = torchjob("render", "--to", to, "train.py", cwd=folder, timeout=60)
    assert first.returncode == 0, first.stderr
    tags = {i for i in images(first.stdout) if i.startswith("localhost/torchjob-workspace:")}
    assert len(tags) == 1 and re.fullmatch(r"localhost/torchjob-workspace:train-[0-9a-f]{12}",
                                           tags.pop()), first.stdout
    assert "localhost/torchjob:latest" not in first.stdout
    # what a run leaves (runs/, caches, .git) is not the workspace: the same image
    for ignored in ("runs/x/log.txt", ".git/HEAD", "mylib/__pycache__/a.pyc"):
        (folder / ignored).parent.mkdir(parents=True, exist_ok=True)
        (folder / ignored).write_text("new")
    def shown() -> set[str]:
        return images(torchjob("render", "--to", to, "train.py", cwd=folder, timeout=60).stdout)

    assert shown() == images(first.stdout)
    # a changed file is a new image; a module job ships the same way
    (folder / "mylib" / "__init__.py").write_text("X = 2\n")
    assert shown() != images(first.stdout)
    module = torchjob("render", "--to", to, "-m", "mylib", cwd=folder, timeout=60)
    assert module.returncode == 0 and "localhost/torchjob-workspace:mylib-" in module.stdout


@pytest.mark.parametrize("to", HOST_BACKENDS)
def test_backends_that_run_this_machines_files_ship_nothing(tmp_path: Path, to: str) -> None:
    folder = project(tmp_path)
    proc = torchjob("render", "--to", to, "train.py", cwd=folder, timeout=60)
    assert proc.returncode == 0 and "torchjob-workspace" not in proc.stdout, proc.stderr


def test_the_builtin_trainer_and_an_image_of_ones_own_ship_nothing(tmp_path: Path) -> None:
    folder = project(tmp_path)
    builtin = torchjob("render", "--to", "k8s", "-m", "torchjob.trainer", cwd=folder, timeout=60)
    assert builtin.returncode == 0 and "image: localhost/torchjob:latest" in builtin.stdout
    own = torchjob("render", "--to", "k8s", "--set", "image=reg.example/team/img:1", "-m",
                   "theirpkg.train", cwd=folder, timeout=60)  # not here: their image holds it
    assert own.returncode == 0 and "image: reg.example/team/img:1" in own.stdout


def test_a_registry_repo_is_where_the_image_is_pushed(tmp_path: Path) -> None:
    folder = project(tmp_path)
    spec = loads("name: train\ntrainer: {script: train.py}\n"
                 "workspace: {repo: reg.example:5000/team/train}\n")
    found = workspace.decide(spec, str(folder), "image")
    assert found is not None and found.push and found.base == "localhost/torchjob:latest"
    assert found.tag.startswith("reg.example:5000/team/train:train-")
    local = workspace.decide(loads("name: train\ntrainer: {script: train.py}\n"), str(folder),
                             "image")
    assert local is not None and not local.push


@pytest.mark.parametrize("args, fragments", [
    (["--to", "k8s", "nowhere.py"], ["image: 'localhost/torchjob:latest' is the kit's image",
                                     "'nowhere.py' is not in", "start torchjob where the code is"]),
    (["--to", "k8s", "/abs/train.py"], ["cannot be in it", "an image of your own"]),
    (["--to", "torchx:kubernetes", "--set", "workspace.ship=never", "train.py"],
     ["workspace.ship: is never", "set workspace.ship: auto"]),
    (["--to", "k8s", "-m", "notherepkg"], ["trainer.module 'notherepkg' is not in"]),
])
def test_code_no_node_could_reach_is_refused_before_submitting(
        tmp_path: Path, args: list[str], fragments: list[str]) -> None:
    folder = project(tmp_path)
    for command in (["render"], ["submit"], ["run"]):
        assert_user_error(torchjob(*command, *args, cwd=folder, timeout=60), *fragments)


def test_a_workspace_too_large_for_an_image_is_refused(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    folder = project(tmp_path)
    (folder / "data.bin").write_bytes(b"x" * 4096)
    monkeypatch.setattr(workspace, "MAX_WORKSPACE_BYTES", 1024)
    with pytest.raises(SpecError, match="more than 1024 bytes .* keep data in a volume"):
        workspace.decide(loads("name: t\ntrainer: {script: train.py}\n"), str(folder), "image")


@pytest.mark.parametrize("image, kit", [("localhost/torchjob:latest", True),
                                        ("reg.example/team/torchjob:2", True),
                                        ("torchjob", True), ("reg.example:5000/torchjob", True),
                                        ("reg.example/team/train:1", False),
                                        ("localhost/torchjob-workspace:x-1", False)])
def test_which_images_are_the_kits(image: str, kit: bool) -> None:
    assert workspace.is_kit_image(image) is kit


@pytest.mark.parametrize("to", [*IMAGE_BACKENDS, "docker"])
def test_a_script_outside_the_working_directory_is_refused_and_one_inside_is_made_relative(
        tmp_path: Path, to: str) -> None:
    """A container sees this machine's files only through the working directory (docker's
    mount of it, an image built from it): ``$PWD/train.py`` is ``train.py`` there; a file of
    this machine outside it is refused before anything starts, not left to fail in a node."""
    (tmp_path / "project").mkdir()
    folder = project(tmp_path / "project")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "train.py").write_text("print('outside')\n")
    for outside in (str(tmp_path / "other" / "train.py"), "../other/train.py"):
        for command in (["render"], ["submit"], ["run"]):
            assert_user_error(torchjob(*command, "--to", to, outside, cwd=folder, timeout=60),
                              f"trainer.script: {outside!r} is outside the working directory",
                              "start torchjob from a directory that holds the script")
    inside = torchjob("render", "--to", to, str(folder / "train.py"), cwd=folder, timeout=60)
    assert inside.returncode == 0, inside.stderr
    body = "".join(line for line in inside.stdout.splitlines(True)
                   if not line.lstrip().startswith("#"))  # not the comment naming the command
    assert str(folder / "train.py") not in body and re.search(r"\btrain\.py\b", body), body
    own = torchjob("render", "--to", to, "--set", "image=reg.example/team/img:1",
                   str(tmp_path / "other" / "train.py"), cwd=folder, timeout=60)
    assert own.returncode == 0, own.stderr  # an image of one's own may hold it there
