"""``trainer.args``: a mapping (``grad_accum: 2`` -> ``--grad-accum 2``) or a list of words
passed exactly as written; either form checked by the trainer's own parser for the built-in
trainer, and bad items stopped with their field path."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from torchjob.jobs.invocation import finish_target, job_spec
from torchjob.jobs.load import build, loads, parse_yaml
from torchjob.jobs.parser import build_parser
from torchjob.jobs.spec import JobSpec, TrainerSection
from torchjob.jobs.sweep import sweep_specs
from torchjob.jobs.values import SpecError
from tests.procs import env_for_tests, torchjob


def spec(**trainer: object) -> JobSpec:
    return build({"name": "s", "nproc_per_node": 2, "trainer": trainer}, source="test")


def test_list_args_from_yaml_and_from_set() -> None:
    text = "name: s\ntrainer:\n  script: t.py\n  args: [10, 1e-3, true, --k=v, 'a.b=c', '']\n"
    assert loads(text).trainer.args == ("10", "1e-3", "true", "--k=v", "a.b=c", "")
    over = loads(text, ["trainer.args=[3, '--x=a,b', 'a.b=c', 010, 1.10, False, 0x1F, +5]"])
    assert over.trainer.args == ("3", "--x=a,b", "a.b=c", "010", "1.10", "False", "0x1F", "+5")
    # numbers as written, not as read (a version 1.10, a zero-padded 010); a mapping's values
    # become the option's value as read
    assert loads("name: s\ntrainer:\n  script: t.py\n  args: [.5, 1_0, -0, 3.0]\n"
                 ).trainer.args == (".5", "1_0", "-0", "3.0")
    assert loads("name: s\ntrainer:\n  script: t.py\n  args: {lr: 1e-3}\n").trainer.args \
        == {"lr": 0.001}


def test_a_saved_spec_keeps_the_words_as_written() -> None:
    """--save-spec writes the data it loaded: its numbers' own text comes back unchanged."""
    text = "name: s\ntrainer:\n  script: t.py\n  args: [1e-3, 010, 1.10, False, x, '7']\n"
    saved = yaml.safe_dump(parse_yaml(text, "job.yaml"), sort_keys=False)
    assert loads(saved).trainer.args == loads(text).trainer.args == (
        "1e-3", "010", "1.10", "False", "x", "7")
    assert loads("name: s\ntrainer: {script: t.py}", ["trainer.args.steps=3"]).trainer.args \
        == {"steps": 3}
    with pytest.raises(SpecError, match=r"trainer.args: .*\(set it whole, e.g. --set 'trainer"):
        loads(text, ["trainer.args.steps=3"])


@pytest.mark.parametrize("args, path, fragment", [
    ([{"a": "b"}], "trainer.args[0]", "is a mapping, but each item is one command-line word"),
    (["ok", ["x"]], "trainer.args[1]", "is a list, but each item"),
    (["ok", None], "trainer.args[1]", "is empty (null), but each item"),
    ([float("nan")], "trainer.args[0]", "is not a finite number"),
    (["a\0b"], "trainer.args[0]", "NUL"),
    ("--steps 5", "trainer.args", "is a string: write a mapping"),
    ({"steps": [1]}, "trainer.args.steps", "is a list, but a single value"),
])
def test_bad_list_items_name_the_item(args: object, path: str, fragment: str) -> None:
    with pytest.raises(SpecError) as err:
        build({"name": "s", "trainer": {"script": "t.py", "args": args}}, source="job.yaml")
    assert str(err.value).startswith(f"job.yaml: {path}: ") and fragment in str(err.value)


def test_list_args_built_in_python_are_checked_too() -> None:
    assert TrainerSection(script="t.py", args=("1", "--k=v")).args == ("1", "--k=v")
    with pytest.raises(SpecError, match=r"^args\[1\]: 2 is an integer, but each item"):
        TrainerSection(script="t.py", args=("1", 2))  # type: ignore[arg-type]
    with pytest.raises(SpecError, match=r"^args\[0\]: '--epoch' is not an option"):
        TrainerSection(args=("--epoch", "2"))


@pytest.mark.parametrize("words, path, fragment", [
    (["--epochs", "x"], "args[0]", "invalid int value: 'x'"),
    (["--epochs=2", "--epoch", "3"], "args[1]", "did you mean --epochs?"),
    (["--run-dir=/x"], "args[0]", "belongs at the top level"),
    (["--lr", "0.1", "stray"], "args[2]", "unrecognized arguments: stray"),
    (["-h"], "args[0]", "is not an option of the trainer"),
    (["--schedule", "linear"], "args[0]", "invalid choice"),
    (["--epochs", "0"], "args[0]", "--epochs must be >= 1"),
])
def test_list_args_for_the_builtin_trainer_are_parsed_by_its_parser(
        words: list[str], path: str, fragment: str) -> None:
    good = ["--epochs", "3", "--lr=1e-3", "--resume", "false"]
    assert spec(args=good).trainer.args == tuple(good)
    with pytest.raises(SpecError) as err:
        spec(args=words)
    assert f"trainer.{path}: " in str(err.value) and fragment in str(err.value), err.value


def test_bad_list_item_is_exit_2_with_the_field_path(tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text("name: s\ntrainer:\n  script: t.py\n  args: [--a=1, {model.depth: 4}]\n")
    out = torchjob("render", str(job), env=env_for_tests())
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert f"{job}: trainer.args[1]: {{'model.depth': 4}} is a mapping" in out.stderr
    assert "key=value" in out.stderr


# torchrun's words before and after its script, and the script's argv (measured with torchrun)
TORCHRUN_ARGV = [
    ([], ["--"], []), ([], ["--", "--"], ["--"]), ([], ["--", "--", "--"], ["--", "--"]),
    ([], ["--", "--", "x"], ["--", "x"]), ([], ["--", "x"], ["x"]),
    ([], ["x", "--", "y"], ["x", "--", "y"]), ([], ["--flag", "--", "--"], ["--flag", "--", "--"]),
    (["--"], ["a"], ["a"]), (["--"], ["--", "a"], ["--", "a"]), (["--"], ["--"], ["--"]),
]


@pytest.mark.parametrize("before, after, argv", TORCHRUN_ARGV)
def test_a_scripts_words_are_its_argv_as_torchrun_gives_them(
        tmp_path: Path, before: list[str], after: list[str], argv: list[str]) -> None:
    """``torchjob run [OPTIONS] s.py WORDS`` makes trainer.args the argv torchrun would give
    s.py, a ``--`` too; the saved spec holds the same."""
    saved = tmp_path / "job.yaml"
    line = ["run", "--nproc-per-node", "1", "--save-spec", str(saved), *before, "s.py", *after]
    args = build_parser().parse_args(line)
    finish_target(args, line)
    assert list(job_spec(args).trainer.args) == argv
    assert list(loads(saved.read_text()).trainer.args) == argv


def test_a_sweep_needs_the_mapping_form() -> None:
    with pytest.raises(SpecError, match="trainer.args: is a list of words, but a sweep"):
        sweep_specs(spec(script="t.py", args=["--lr=1"]), {"lr": ["1", "2"]})
